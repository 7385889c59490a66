"""Per-node robust rules of serverless gossip (the ``[gossip]`` regime, :mod:`redteam.federation.gossip`).

In the gossip regime an honest node i merges what its neighbours sent it. It calls its defense
with rows **centred on its own model**: row j is x_j − x_i (the node's own row, a zero row, is
included with its self-weight W_ii, at position ``ServerContext.own_row``), the weights are its row
of the mixing matrix W, and the aggregate is the node's move: x_i ← x_i + aggregate. Plain gossip
is the weighted mean (``mean``): x_i + Σ_j W_ij (x_j − x_i). Today's rules apply unchanged to a
neighbourhood (``median``, ``trimmed_mean`` …: translation-equivariant rules give the same model
as on the raw neighbour models). The rules here are the decentralised ones:

* :class:`ClippedGossip` — self-centred clipping (He, Karimireddy & Jaggi, "Byzantine-Robust
  Decentralized Learning via ClippedGossip", arXiv 2202.01545; code
  ``epfml/byzantine-robust-decentralized-optimizer``): x_i ← x_i + Σ_j W_ij CLIP(x_j − x_i, τ_i),
  CLIP(v, τ) = v · min(1, τ / ‖v‖). The centre is the node's own model. The radius τ_i:
  ``tau`` when set; else ``tau_rule = "he"`` — the paper's choice τ_i² = (1/δ_i) Σ_{j honest}
  W_ij ‖x_j − x_i‖², with δ_i the Byzantine weight, where a node that does not know who is
  honest takes for the honest set its nearest rows holding weight 1 − δ_i (δ_i = b × its
  largest neighbour weight); or ``"second_largest"`` — the authors' release's practical choice,
  the second-largest neighbour distance.
* :class:`CSPlus` — CS+ of Gaucher, Dieuleveut & Hendrikx ("Unified Breakdown Analysis for
  Byzantine Robust Gossip", ICML 2025, arXiv 2410.10418; code
  ``renaudgaucher/Byzantine-Robust-Gossip``): the same clipped sum, with τ_i set so that the
  farthest rows carrying weight at least 2δ_i are clipped: τ_i is the largest distance among
  the nearest rows whose cumulative weight stays ≤ (total − 2δ_i) — 0 when no row fits (a node
  that cannot outweigh its Byzantine neighbours keeps its model), ∞ when δ_i = 0. With unit
  weights and b Byzantine neighbours: the 2b farthest neighbours are clipped to the distance of
  the nearest unclipped one. (CS+–RG steps by η Σ_j w_ij CLIP(x_j − x_i, τ_i); here the weights
  are W's, whose row sums to 1, so η = 1.)
* :class:`IOS` — Iterative Outlier Scissors (Wu, Chen & Ling, "Byzantine-Resilient Decentralized
  Stochastic Optimization With Robust Aggregation Rules", IEEE TSP 2023), as Gaucher et al.
  compare it: b times, drop the remaining row (never the node's own) farthest from the weighted
  mean of the remaining rows; the aggregate is the weighted mean of what is left.

``b`` is the number of Byzantine neighbours a node tolerates; in a scenario it defaults to the
attackers' count ([gossip] attackers). A non-finite row is rejected with its reason and the rule
runs on the rest. Outside the gossip regime (a server's rows, no ``own_row``) the centre is the
server's current model: the rows are updates, as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error, sample_weights

from ._common import check_choice, check_count, check_number, finite_rows

if TYPE_CHECKING:
    import torch

__all__ = ["BatchDecision", "ClippedGossip", "CSPlus", "IOS", "clip_radius_cs_plus", "clip_radius_he"]

_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """Every merging node's :class:`~redteam.types.Decision` at once (``decide_batch``): the
    aggregates ``(m, d)``, ``accepted`` ``(m, K)`` (padding slots: False), ``reasons`` keyed by
    (node row, slot) for the rejected rows, and each node's ``Decision.state``. ``undecided``:
    node rows the batched form leaves to the rule itself (the step calls the rule on that node's
    rows; their entries here are ignored)."""

    aggregate: "torch.Tensor"
    accepted: "torch.Tensor"
    reasons: dict[tuple[int, int], str] = field(default_factory=dict)
    states: list[dict[str, Any]] = field(default_factory=list)
    undecided: frozenset[int] = frozenset()


def _screen_batch(rows: "torch.Tensor", weights: "torch.Tensor", valid: "torch.Tensor"
                  ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", dict[tuple[int, int], str]]:
    """:func:`_screen` for padded neighbourhoods ``(m, K, d)``: (float64 weights normalised per node
    over its finite rows, 0 elsewhere; the finite mask; the rows, in their dtype, with every
    non-finite row — padding included — set to 0 (a copy then; else the rows themselves); reasons).
    The rows stay in their dtype: the per-node rules convert a node's rows to float64, which here
    would copy every neighbourhood into a tensor twice its size (and several times slower than
    the rule itself on CPU); the batched rules take norms and weighted sums in the rows' dtype and
    only the per-row figures (weights, distances, radii) in float64. With float32 rows that moves
    the result by a few float32 ulps (relative 1e-7), which ``tests/test_gossip_batched.py``
    bounds."""
    import torch

    fin = torch.isfinite(rows.sum(-1))
    if not bool(fin.all()):  # a row sum can overflow on finite entries: check those entry by entry
        fin = torch.isfinite(rows).all(-1)
        if not bool(fin.all()):
            rows = rows.clone()
            rows[~fin] = 0
    ok = valid & fin
    w = weights.to(torch.float64).clamp_min(0) * ok.to(torch.float64)
    total = w.sum(1, keepdim=True)
    w = torch.where(total > 0, w / torch.where(total > 0, total, torch.ones_like(total)), w)
    bad = (valid & ~ok).nonzero().tolist()
    return w, ok, rows, {(r, k): "non-finite update" for r, k in bad}


def _weighted_rows(c: "torch.Tensor", rows: "torch.Tensor") -> "torch.Tensor":
    """Σ_k c[:, k] rows[:, k] per node, ``(m, d)`` in the rows' dtype."""
    import torch

    return torch.bmm(c.to(rows.dtype)[:, None, :], rows)[:, 0]


def _byzantine_weight_batch(b: int, w: "torch.Tensor", own_row: int | None) -> "torch.Tensor":
    others = w.clone()
    if own_row is not None and 0 <= own_row < others.shape[1]:
        others[:, own_row] = 0
    return float(b) * others.max(1).values


def _weight_within_batch(dist: "torch.Tensor", w: "torch.Tensor") -> "torch.Tensor":
    return ((dist[:, None, :] <= dist[:, :, None]).to(w.dtype) * w[:, None, :]).sum(2)


def _screen(updates: "torch.Tensor", ctx: ServerContext) -> tuple["torch.Tensor", "torch.Tensor", dict[int, str]]:
    """(weights normalised to sum 1 over the finite rows, with 0 on the others; the finite mask; reasons)."""
    import torch

    n = updates.shape[0]
    ok = finite_rows(updates)
    w = sample_weights(ctx, n, updates).to(torch.float64).clamp_min(0) * ok.to(torch.float64)
    total = w.sum()
    w = w / total if float(total) > 0 else w
    reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
    return w, ok, reasons


def _byzantine_weight(b: int, w: "torch.Tensor", own_row: int | None) -> float:
    """δ = b × the largest weight of a row other than the node's own."""
    import torch

    others = w.clone()
    if own_row is not None and 0 <= own_row < others.shape[0]:
        others[own_row] = 0
    return float(b) * float(others.max()) if others.numel() else 0.0


def _weight_within(dist: "torch.Tensor", w: "torch.Tensor") -> "torch.Tensor":
    """For each row, the weight of the rows at most as far as it (ties counted together, so the
    radius does not depend on the rows' order)."""
    return ((dist[None, :] <= dist[:, None]).to(w.dtype) * w[None, :]).sum(1)


def clip_radius_cs_plus(dist: "torch.Tensor", w: "torch.Tensor", delta: float) -> float:
    """CS+'s radius: the largest distance d whose rows at most d away weigh ≤ Σw − 2δ (0 when
    none does; ∞ when δ = 0)."""
    if delta <= 0:
        return float("inf")
    fits = _weight_within(dist, w) <= float(w.sum()) - 2.0 * delta + _TOL
    return float(dist[fits].max()) if bool(fits.any()) else 0.0


def clip_radius_he(dist: "torch.Tensor", w: "torch.Tensor", delta: float) -> float:
    """He et al.'s radius with the honest set taken as the nearest rows holding weight Σw − δ
    (the rows whose distance d has rows at most d away weighing ≤ Σw − δ):
    √(Σ_{those} w_j d_j² / δ) (∞ when δ = 0)."""
    import torch

    if delta <= 0:
        return float("inf")
    keep = _weight_within(dist, w) <= float(w.sum()) - delta + _TOL
    d = torch.where(keep, dist, torch.zeros_like(dist))
    return float(torch.sqrt((w * keep.to(w.dtype) * d ** 2).sum() / delta))


def _clipped_sum(rows: "torch.Tensor", w: "torch.Tensor", tau: float) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Σ_j w_j CLIP(row_j, τ) in float64 (rows with weight 0 contribute nothing), and each row's scale."""
    import torch

    x = torch.where(w[:, None] > 0, rows.to(torch.float64), torch.zeros((), dtype=torch.float64, device=rows.device))
    dist = x.norm(dim=1)
    scale = torch.ones_like(dist)
    if tau != float("inf"):
        scale = torch.where(dist > tau, tau / dist.clamp_min(1e-300), scale)
    return (w * scale) @ x, scale


@dataclass(frozen=True, slots=True)
class _Clipped(Aggregator):
    b: int | None = None
    from_malicious_count: ClassVar[tuple[str, ...]] = ("b",)
    # a neighbourhood too small to outweigh b Byzantine neighbours does not move (radius 0)
    unanimity: ClassVar[bool] = False

    def validate_b(self, v: int | None) -> None:
        check_count(self, "b", v)

    def _b(self) -> int:
        if self.b is None:
            raise param_error(self, "b", None, "is unset: give the number of Byzantine neighbours to tolerate; "
                                               "in a scenario it defaults to [gossip] attackers")
        return self.b

    def radius(self, dist: "torch.Tensor", w: "torch.Tensor", delta: float, own_row: int | None) -> float:
        raise NotImplementedError  # pragma: no cover

    def radius_batch(self, dist: "torch.Tensor", w: "torch.Tensor", delta: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None) -> "torch.Tensor":
        raise NotImplementedError  # pragma: no cover

    def batch_ready(self) -> bool:
        """Whether :meth:`decide_batch` can run (``b`` is set)."""
        return self.b is not None

    def decide_batch(self, rows: "torch.Tensor", weights: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None = 0) -> BatchDecision:
        """:meth:`decide` on every node's neighbourhood at once: ``rows`` ``(m, K, d)`` (each
        node's rows, padded), ``weights`` ``(m, K)``, ``valid`` ``(m, K)`` (False on padding);
        the same radius and clipped sum per node, up to the summation order."""
        import torch

        b = self._b()
        w, ok, x, reasons = _screen_batch(rows, weights, valid)
        delta = _byzantine_weight_batch(b, w, own_row)
        dist = torch.linalg.vector_norm(x, dim=2).to(torch.float64)
        dist = torch.where(ok, dist, torch.full_like(dist, float("inf")))
        tau = self.radius_batch(dist, w, delta, valid, own_row)
        tau = torch.where(ok.any(1), tau, torch.zeros_like(tau))
        # the clipped sum: rows of weight 0 (and the non-finite ones, zeroed) contribute nothing
        norm = torch.where(w > 0, dist, torch.zeros_like(dist))
        scale = torch.where(norm > tau[:, None], tau[:, None] / norm.clamp_min(1e-300), torch.ones_like(norm))
        agg = _weighted_rows(w * scale, x)
        states = [{"tau": t, "byzantine_weight": dl} for t, dl in zip(tau.tolist(), delta.tolist())]
        return BatchDecision(aggregate=agg.to(rows.dtype), accepted=ok, reasons=reasons, states=states)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        b = self._b()
        w, ok, reasons = _screen(updates, ctx)
        rows = torch.where(ok[:, None], updates.to(torch.float64), torch.zeros((), dtype=torch.float64,
                                                                              device=updates.device))
        delta = _byzantine_weight(b, w, ctx.own_row)
        dist = rows.norm(dim=1)
        dist = torch.where(ok, dist, torch.full_like(dist, float("inf")))
        tau = self.radius(dist, w, delta, ctx.own_row) if bool(ok.any()) else 0.0
        agg, scale = _clipped_sum(rows, w, tau)
        return Decision(aggregate=agg.to(updates.dtype), accepted=ok, weights=(w * scale).to(updates.dtype),
                        reasons=reasons, state={"tau": tau, "byzantine_weight": delta})


@dataclass(frozen=True, slots=True)
class ClippedGossip(_Clipped):
    """Self-centred clipping (He, Karimireddy & Jaggi 2022): x_i + Σ_j W_ij CLIP(x_j − x_i, τ_i)
    (module docstring). ``tau``: a fixed radius; unset, ``tau_rule`` chooses it per node and round."""

    tau: float | None = None
    tau_rule: Literal["he", "second_largest"] = "he"
    summary: ClassVar[str] = "gossip: self-centred clipping of neighbour differences (ClippedGossip)"
    reference: ClassVar[str] = "He, Karimireddy & Jaggi, arXiv 2202.01545 (2022)"

    def validate_tau(self, v: float | None) -> None:
        check_number(self, "tau", v, low=0.0, allow_none=True)

    def validate_tau_rule(self, v: str) -> None:
        check_choice(self, "tau_rule", v, ("he", "second_largest"))

    def radius(self, dist: "torch.Tensor", w: "torch.Tensor", delta: float, own_row: int | None) -> float:
        import torch

        if self.tau is not None:
            return float(self.tau)
        if self.tau_rule == "second_largest":
            d = dist.clone()
            if own_row is not None:
                d[own_row] = -1.0
            d = d[(w > 0) & (d >= 0)]
            if d.numel() == 0:
                return 0.0
            top = torch.sort(d, descending=True).values
            return float(top[1] if top.numel() >= 2 else top[0])
        return clip_radius_he(dist, w, delta)

    def radius_batch(self, dist: "torch.Tensor", w: "torch.Tensor", delta: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None) -> "torch.Tensor":
        import torch

        inf = torch.full_like(delta, float("inf"))
        if self.tau is not None:
            return torch.full_like(delta, float(self.tau))
        if self.tau_rule == "second_largest":
            cand = (w > 0) & valid
            if own_row is not None:
                cand[:, own_row] = False
            d = torch.where(cand, dist, torch.full_like(dist, -float("inf")))
            top = torch.topk(d, min(2, d.shape[1]), dim=1).values
            count = cand.sum(1)
            second = top[:, 1] if top.shape[1] >= 2 else top[:, 0]
            return torch.where(count >= 2, second, torch.where(count == 1, top[:, 0], torch.zeros_like(delta)))
        # He et al.: the honest set taken as the nearest rows holding weight Σw − δ
        keep = (_weight_within_batch(dist, w) <= (w.sum(1) - delta + _TOL)[:, None]) & valid
        d = torch.where(keep, dist, torch.zeros_like(dist))
        tau = torch.sqrt((w * keep.to(w.dtype) * d ** 2).sum(1) / torch.where(delta > 0, delta, 1.0))
        return torch.where(delta > 0, tau, inf)


@dataclass(frozen=True, slots=True)
class CSPlus(_Clipped):
    """CS+ (Gaucher, Dieuleveut & Hendrikx, ICML 2025): clip the farthest neighbours of weight
    ≥ 2δ to the distance of the nearest unclipped one (module docstring)."""

    summary: ClassVar[str] = "gossip: CS+ — clip the farthest 2b (by weight) neighbour differences"
    reference: ClassVar[str] = "Gaucher, Dieuleveut & Hendrikx, ICML 2025 (arXiv 2410.10418)"

    def radius(self, dist: "torch.Tensor", w: "torch.Tensor", delta: float, own_row: int | None) -> float:
        return clip_radius_cs_plus(dist, w, delta)

    def radius_batch(self, dist: "torch.Tensor", w: "torch.Tensor", delta: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None) -> "torch.Tensor":
        import torch

        fits = (_weight_within_batch(dist, w) <= (w.sum(1) - 2.0 * delta + _TOL)[:, None]) & valid
        tau = torch.where(fits, dist, torch.full_like(dist, -float("inf"))).max(1).values
        tau = torch.where(fits.any(1), tau, torch.zeros_like(tau))
        return torch.where(delta > 0, tau, torch.full_like(tau, float("inf")))


@dataclass(frozen=True, slots=True)
class IOS(Aggregator):
    """Iterative Outlier Scissors (Wu, Chen & Ling 2023): b times, drop the remaining row (never
    ``own_row``) farthest from the weighted mean of the remaining rows; average what is left."""

    b: int | None = None
    from_malicious_count: ClassVar[tuple[str, ...]] = ("b",)
    symmetric: ClassVar[bool] = False  # the node's own row is never dropped
    summary: ClassVar[str] = "gossip: iterative outlier scissors over the neighbourhood"
    reference: ClassVar[str] = "Wu, Chen & Ling, IEEE TSP 2023"

    def validate_b(self, v: int | None) -> None:
        check_count(self, "b", v)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        if self.b is None:
            raise param_error(self, "b", None, "is unset: give the number of rows to drop; in a scenario it "
                                               "defaults to [gossip] attackers")
        w, ok, reasons = _screen(updates, ctx)
        rows = torch.where(ok[:, None], updates.to(torch.float64), torch.zeros((), dtype=torch.float64,
                                                                              device=updates.device))
        keep = ok & (w > 0)
        dropped: list[int] = []
        for _ in range(self.b):
            cand = keep.clone()
            if ctx.own_row is not None and 0 <= ctx.own_row < cand.shape[0]:
                cand[ctx.own_row] = False
            if not bool(cand.any()):
                break
            wk = w * keep.to(w.dtype)
            mean = (wk @ rows) / wk.sum()
            dist = (rows - mean).norm(dim=1)
            dist = torch.where(cand, dist, torch.full_like(dist, -1.0))
            j = int(torch.argmax(dist))
            keep[j] = False
            dropped.append(j)
        wk = w * keep.to(w.dtype)
        total = wk.sum()
        agg = (wk @ rows) / total if float(total) > 0 else torch.zeros_like(rows[0])
        for j in dropped:
            reasons[j] = "dropped by IOS (farthest from the neighbourhood's mean)"
        accepted = keep | (ok & (w == 0))
        accepted[dropped] = False if dropped else accepted[dropped]
        return Decision(aggregate=agg.to(updates.dtype), accepted=accepted, weights=(wk / total if float(total) > 0
                                                                                       else wk).to(updates.dtype),
                        reasons=reasons, state={"dropped": dropped})

    def batch_ready(self) -> bool:
        """Whether :meth:`decide_batch` can run (``b`` is set)."""
        return self.b is not None

    def decide_batch(self, rows: "torch.Tensor", weights: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None = 0) -> BatchDecision:
        """:meth:`decide` on every node's neighbourhood at once (``rows`` ``(m, K, d)`` padded,
        ``weights`` / ``valid`` ``(m, K)``): the same b rounds of scissors, each on every node that
        still has a row to drop, up to the summation order of the means."""
        import torch

        if self.b is None:
            raise param_error(self, "b", None, "is unset: give the number of rows to drop; in a scenario it "
                                               "defaults to [gossip] attackers")
        w, ok, x, reasons = _screen_batch(rows, weights, valid)
        m = x.shape[0]
        keep = ok & (w > 0)
        dropped: list[list[int]] = [[] for _ in range(m)]
        drop_mask = torch.zeros_like(keep)
        nodes = torch.arange(m, device=x.device)
        buf = None
        for _ in range(self.b):
            cand = keep.clone()
            if own_row is not None and 0 <= own_row < cand.shape[1]:
                cand[:, own_row] = False
            active = cand.any(1)  # keep only shrinks: a node without a candidate has none later either
            if not bool(active.any()):
                break
            wk = w * keep.to(w.dtype)
            total = wk.sum(1)
            mean = _weighted_rows(wk / torch.where(total > 0, total, 1.0)[:, None], x)
            if buf is None:  # one buffer for every round's differences (a fresh one each time costs more)
                buf = torch.empty_like(x)
            dist = torch.linalg.vector_norm(torch.sub(x, mean[:, None, :], out=buf), dim=2).to(torch.float64)
            dist = torch.where(cand, dist, torch.full_like(dist, -1.0))
            j = torch.argmax(dist, dim=1)
            rows_on = nodes[active]
            keep[rows_on, j[active]] = False
            drop_mask[rows_on, j[active]] = True
            for r, k in zip(rows_on.tolist(), j[active].tolist()):
                dropped[r].append(k)
        wk = w * keep.to(w.dtype)
        total = wk.sum(1)
        agg = _weighted_rows(wk / torch.where(total > 0, total, 1.0)[:, None], x)
        for r, ks in enumerate(dropped):
            for k in ks:
                reasons[(r, k)] = "dropped by IOS (farthest from the neighbourhood's mean)"
        accepted = (keep | (ok & (w == 0))) & ~drop_mask
        return BatchDecision(aggregate=agg.to(rows.dtype), accepted=accepted, reasons=reasons,
                             states=[{"dropped": ks} for ks in dropped])
