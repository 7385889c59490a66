"""Envelope attacks: know the validation rules and stay just inside them.

These measure how wide the security envelope of the delta-validation rules is
(our analysis of norm-bound and cosine rules, after the norm-bounded attackers of Sun
et al., arXiv:1911.07963, and Wang et al., "Attack of the Tails", NeurIPS 2020): every
malicious row is built to pass a norm bound ‖Δ‖ ≤ M and/or a cosine filter
cos(Δ, r) ≥ c, and does as much harm as it can from there.

* ``norm_hug`` [ours]: u = −M·ĝ/‖ĝ‖, ĝ the mean of the honest
  updates the attacker sees: exactly on the norm bound, pointing straight back. The
  worst case for norm-only validation; any cosine threshold c > 0 against a good
  reference blocks it.
* ``norm_evasion``: the *scale* step alone of Bagdasaryan et al.'s constrain-and-scale
  (AISTATS 2020), and the norm-bounded attacker of Sun et al. (arXiv:1911.07963): rescale
  the malicious client's own (possibly backdoored) update to ``margin``·M, as large as
  the bound allows. It does not train with the anomaly loss (the *constrain* step):
  the full attack is ``constrain_and_scale`` (``attacks.training``).
* ``cosine_evasion`` [ours]: the update closest in direction to a target v among those
  the cosine filter accepts, at the largest allowed norm (derivation in the class).
* ``adaptive``: wraps any attack and line-searches its strength against the server's
  actual defense (a white-box adversary), keeping the malicious rows accepted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.errors import InvalidParameter, UnknownPlugin
from redteam.types import (
    Attack,
    AttackContext,
    ClientData,
    ServerContext,
    Surface,
    param_error,
)

from ._common import check_knowledge, fit_norm, honest_rows, randn, work

if TYPE_CHECKING:
    import torch

__all__ = ["NormHug", "NormEvasion", "CosineEvasion", "Adaptive", "cone_direction"]


def _positive(obj: Any, name: str, v: Any) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise param_error(obj, name, v, "must be a finite number > 0")


@dataclass(frozen=True, slots=True)
class NormHug(Attack):
    """Every malicious client sends −M·ĝ/‖ĝ‖: norm exactly M, cosine −1 to ĝ.

    * ``bound``: the norm bound M the validator enforces;
    * ``knowledge``: ĝ is the mean of every honest update (``"omniscient"``, default)
      or of the attackers' own honest updates (``"own"``).

    When ĝ = 0 there is no direction to reverse and the rows are zero. The rows are
    cast so that their norm, measured as the norm rule measures it
    (:func:`defenses.norm.l2_norms`), never exceeds M (see ``attacks._common.fit_norm``):
    ``norm_bound`` with the same M accepts every one of them.
    """

    bound: float = 1.0
    knowledge: Literal["omniscient", "own"] = "omniscient"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Norm-hug: −M·ĝ/‖ĝ‖, the reversed honest mean exactly at the norm bound"
    reference: ClassVar[str] = "Sun et al., arXiv:1911.07963 (norm bounding); Bagdasaryan et al., AISTATS 2020"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_bound(self, v: float) -> None:
        _positive(self, "bound", v)

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        g = work(honest_rows(self.knowledge, ctx)).mean(dim=0)
        direction = (-g).unsqueeze(0).expand(own.shape[0], -1)
        return fit_norm(direction, float(self.bound), own)


@dataclass(frozen=True, slots=True)
class NormEvasion(Attack):
    """Norm evasion: each malicious row is its own update rescaled to ``margin``·M.

    The scale step of constrain-and-scale only (no anomaly-loss training; for the full
    attack use ``constrain_and_scale``).

    * ``bound``: the norm bound M;
    * ``margin``: fraction of M to land on, in (0, 1] (default 0.99, just under).

    Both directions: a small poisoned update is scaled up (the boosting of model
    replacement, limited by the bound), a large one down. Zero rows stay zero.
    Combine with a data attack so that the own update is the poisoned one.
    """

    bound: float = 1.0
    margin: float = 0.99
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Norm evasion: the own (poisoned) update rescaled to just under the norm bound"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020; Sun et al., arXiv:1911.07963"

    def validate_bound(self, v: float) -> None:
        _positive(self, "bound", v)

    def validate_margin(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "margin", v, "must be in (0, 1]")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        own = ctx.own_updates
        return fit_norm(own, float(self.bound) * float(self.margin), own)


def cone_direction(target: "torch.Tensor", ref: "torch.Tensor", c: float,
                   fallback: "torch.Tensor | None" = None) -> "torch.Tensor":
    """Unit rows û maximising ⟨û, v̂ₖ⟩ subject to ⟨û, r̂⟩ ≥ c (in ``work`` precision).

    ``target`` is (k, d), ``ref`` (d,), ``c`` in (−1, 1). ``fallback`` (d,) is used as
    the orthogonal direction when a target is exactly parallel to −r̂ (any direction ⊥ r̂
    is then optimal). See :class:`CosineEvasion` for the derivation.
    """
    import torch

    v = work(target)
    r = ref.to(v.dtype)
    r_hat = r / torch.linalg.vector_norm(r)
    v_len = torch.linalg.vector_norm(v, dim=1, keepdim=True)
    v_hat = torch.where(v_len > 0, v / v_len.clamp_min(1e-300), torch.zeros_like(v))
    alpha = v_hat @ r_hat  # cos(v, r)
    w = v_hat - alpha[:, None] * r_hat[None, :]  # component of v̂ orthogonal to r̂
    w = w - (w @ r_hat)[:, None] * r_hat[None, :]  # second Gram–Schmidt pass: rounding
    w_len = torch.linalg.vector_norm(w, dim=1, keepdim=True)
    degenerate = w_len <= 64 * torch.finfo(v.dtype).eps  # v̂ = −r̂ up to rounding
    if fallback is None:
        fallback = torch.zeros_like(r)
    fb = fallback.to(v.dtype)
    fb = fb - (fb @ r_hat) * r_hat
    fb = fb - (fb @ r_hat) * r_hat
    fb_len = torch.linalg.vector_norm(fb)
    fb = fb / fb_len if float(fb_len) > 0 else fb
    w_hat = torch.where(degenerate, fb[None, :].expand_as(w), w / w_len.clamp_min(1e-300))
    on_cone = c * r_hat[None, :] + math.sqrt(max(0.0, 1.0 - c * c)) * w_hat
    inside = (alpha >= c) & (v_len[:, 0] > 0)
    return torch.where(inside[:, None], v_hat, on_cone)


@dataclass(frozen=True, slots=True)
class CosineEvasion(Attack):
    """Project the target direction onto the cone the cosine filter accepts.

    The filter accepts u iff cos(u, r) ≥ c. Write r̂ = r/‖r‖, v̂ = v/‖v‖ for the target,
    α = ⟨v̂, r̂⟩ and v̂ = α·r̂ + w with w ⊥ r̂. Any unit u with ⟨u, r̂⟩ = t has
    ⟨u, v̂⟩ = t·α + ⟨u − t·r̂, w⟩ ≤ t·α + √(1 − t²)·‖w‖, with equality for
    u = t·r̂ + √(1 − t²)·ŵ. Writing α = cos θ_v, ‖w‖ = sin θ_v and t = cos θ, the bound is
    cos(θ − θ_v): it grows as θ approaches θ_v. So if α ≥ c, v̂ itself is accepted and
    optimal; otherwise the best feasible t is the boundary t = c:

        û = c·r̂ + √(1 − c²)·w/‖w‖,

    the direction on the cone's surface in the plane of r and v. When v is exactly
    −r̂ (``target="reverse"``), w = 0 and every direction ⊥ r̂ is optimal: one is drawn
    from ``ctx.generator`` per round (shared by all malicious clients, so their
    orthogonal pushes add up). The row is û·L, L = ``bound`` M when set (the largest
    norm a norm bound allows), else ‖v‖.

    * ``threshold``: c in (−1, 1) (default 0.0);
    * ``against``: the attacker's estimate of the filter's reference r:
      ``"median"`` (coordinate median of the honest updates, default), ``"mean"``, or
      ``"previous"`` (``ctx.previous_update``; falls back to the median in round 0);
    * ``target``: ``"reverse"`` (v = −r, the most damaging accepted direction,
      default) or ``"own"`` (v = the client's own, possibly poisoned, update);
    * ``bound``: M, or unset to keep ‖v‖;
    * ``slack``: aim at cos = c + slack (default 1e-6) so float32 rounding never lands
      below c.
    """

    threshold: float = 0.0
    against: Literal["median", "mean", "previous"] = "median"
    target: Literal["reverse", "own"] = "reverse"
    bound: float | None = None
    slack: float = 1e-6
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "Cosine evasion: closest direction to a target inside the accepted cosine cone"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020 (evading detection); Cao et al., NDSS 2021"

    def validate_threshold(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and -1 < v < 1):
            raise param_error(self, "threshold", v, "must be in (−1, 1)")

    def validate_against(self, v: str) -> None:
        if v not in ("median", "mean", "previous"):
            raise param_error(self, "against", v, "must be 'median', 'mean' or 'previous'")

    def validate_target(self, v: str) -> None:
        if v not in ("reverse", "own"):
            raise param_error(self, "target", v, "must be 'reverse' or 'own'")

    def validate_bound(self, v: float | None) -> None:
        if v is not None:
            _positive(self, "bound", v)

    def validate_slack(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e-2):
            raise param_error(self, "slack", v, "must be in [0, 0.01)")

    def ref_vector(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        if self.against == "previous" and ctx.previous_update is not None:
            return work(ctx.previous_update)
        x = work(ctx.visible_updates)
        if self.against == "mean":
            return x.mean(dim=0)
        return x.median(dim=0).values  # lower median, as torch defines it

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f = own.shape[0]
        r = self.ref_vector(ctx).to(own.device)
        c = min(self.threshold + self.slack, 1.0 - 1e-12)
        if self.target == "own":
            v = work(own)
        else:
            v = (-r).unsqueeze(0).expand(f, -1)
        lengths = torch.linalg.vector_norm(v, dim=1)
        if float(torch.linalg.vector_norm(r)) == 0:
            unit = v / lengths.clamp_min(1e-300)[:, None]  # no reference: nothing to evade
        else:
            fallback = randn((own.shape[1],), ctx, r)
            unit = cone_direction(v, r, c, fallback)
        if self.bound is not None:
            return fit_norm(unit, float(self.bound), own)
        return (unit * lengths[:, None]).to(own.dtype)


@dataclass(frozen=True, slots=True)
class Adaptive(Attack):
    """Line-search the strength of another attack against the server's own defense.

    * ``attack``: the registry name of the wrapped attack (default ``"sign_flip"``);
    * ``params``: its parameters (a table in the scenario file);
    * ``anchor``: strength s interpolates the rows as A + s·(B − A), B the wrapped
      attack's rows and A = 0 (``"zero"``, default: plain scaling s·B) or the own honest
      updates (``"own"``, s = 0 is honest behaviour);
    * ``max_scale``: the largest strength tried (default 1000);
    * ``steps``: bisection steps (default 30; relative precision ≈ 2⁻³⁰).

    The search (white-box: ``adaptive = True`` makes the trainer put the server's defense
    in ``ctx.defense``; the attack sees every honest update of the round): build the
    round's full ``(n, d)`` matrix with the candidate rows at the malicious clients'
    positions, call the defense, and call the strength *accepted* when every malicious
    row is in ``Decision.accepted``. If s = 1 is accepted, double s until a rejection
    or ``max_scale``; otherwise search in [0, 1]. Then bisect ``steps`` times between
    the largest accepted and the smallest rejected strength, and send the largest
    accepted one. If no strength tried is accepted the anchor rows (s = 0) are sent;
    without a defense (``ctx.defense is None``) the wrapped attack is sent unchanged.
    The defense runs with a generator seeded once per round from ``ctx.generator``, so
    every probe sees the same randomness. What is simulated is the flat defense on the
    uncompressed rows: compression and hierarchical grouping are not replayed, the
    defense's carried state is unknown to the attacker (empty), and the malicious rows
    sit at their client ids (the true positions under full participation; otherwise
    appended after the honest rows), which only matters for order-dependent rules.
    Acceptance is the criterion, so a clipping norm bound (which accepts everything)
    gives no signal: use ``mode="reject"``.
    ``poison_data`` is delegated to the wrapped attack (identity for update attacks),
    so wrapping ``backdoor`` scales the backdoored update.
    """

    attack: str = "sign_flip"
    params: dict = field(default_factory=dict)
    anchor: Literal["zero", "own"] = "zero"
    max_scale: float = 1000.0
    steps: int = 30
    #: the wrapped attack, built once (``"inner"``): a stateful one (``dba``) keeps its memory
    _built: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    adaptive: ClassVar[bool] = True
    omniscient: ClassVar[bool] = True
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA, Surface.UPDATES)
    summary: ClassVar[str] = "Adaptive: line-search another attack's strength to stay accepted by the defense"
    reference: ClassVar[str] = "Fang et al., USENIX Security 2020; Shejwalkar & Houmansadr, NDSS 2021"

    def __hash__(self) -> int:  # ``params`` is a dict; hash its sorted items instead
        items = tuple(sorted((str(k), repr(v)) for k, v in self.params.items()))
        return hash((type(self).__name__, self.attack, items, self.anchor, self.max_scale, self.steps))

    def validate_attack(self, v: str) -> None:
        if not isinstance(v, str) or not v:
            raise param_error(self, "attack", v, "must be the name of a registered attack")

    def validate_params(self, v: dict) -> None:
        if not isinstance(v, dict):
            raise param_error(self, "params", v, "must be a table of the wrapped attack's parameters")
        try:
            self.inner()
        except (UnknownPlugin, InvalidParameter) as exc:
            raise param_error(self, "params" if isinstance(exc, InvalidParameter) else "attack",
                              v if isinstance(exc, InvalidParameter) else self.attack, str(exc)) from None

    def validate_anchor(self, v: str) -> None:
        if v not in ("zero", "own"):
            raise param_error(self, "anchor", v, "must be 'zero' or 'own'")

    def validate_max_scale(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 1):
            raise param_error(self, "max_scale", v, "must be a finite number ≥ 1")

    def validate_steps(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 200:
            raise param_error(self, "steps", v, "must be an integer in [1, 200]")

    def inner(self) -> Attack:
        """The wrapped attack, built from the registry on first use and the same object
        afterwards (so a stateful one, e.g. ``dba``'s trigger assignment, keeps its memory)."""
        inner = self._built.get("inner")
        if inner is None:
            from redteam.registry import ATTACKS

            inner = self._built["inner"] = ATTACKS.create(self.attack, self.params)
        return inner

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        return self.inner().poison_data(data, client, generator)

    # -- the search -------------------------------------------------------------------
    def _layout(self, ctx: AttackContext) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """(honest rows, indices of honest rows, indices of malicious rows) in the round matrix."""
        import torch

        honest = ctx.visible_updates
        n, f, h = ctx.n_clients, ctx.n_malicious, honest.shape[0]
        dev = honest.device
        rows = ctx.rows
        if h + f == n and all(0 <= i < n for i in rows) and len(set(rows)) == f:
            mal = torch.tensor(rows, dtype=torch.int64, device=dev)
            is_mal = torch.zeros(n, dtype=torch.bool, device=dev)
            is_mal[mal] = True
            return honest, (~is_mal).nonzero().flatten(), mal
        return (honest, torch.arange(h, device=dev), torch.arange(h, h + f, device=dev))

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        inner = self.inner()
        inner_ctx = ctx if getattr(inner, "omniscient", False) else dataclasses.replace(
            ctx, visible_updates=ctx.own_updates)
        crafted = inner.craft_updates(inner_ctx)
        if ctx.defense is None or own.shape[0] == 0:
            return crafted
        anchor = torch.zeros_like(own) if self.anchor == "zero" else own
        a64 = work(anchor)
        step64 = work(crafted).to(a64.dtype) - a64

        honest, h_idx, m_idx = self._layout(ctx)
        n = int(h_idx.shape[0] + m_idx.shape[0])
        base = torch.empty((n, own.shape[1]), dtype=own.dtype, device=own.device)
        base[h_idx] = honest.to(own.dtype)
        weights = ctx.weights if (ctx.weights is not None and ctx.weights.shape[0] == n) else None
        client_ids = tuple(range(n))  # positions; equal to client ids under full participation
        seed = int(torch.randint(0, 2**62, (1,), generator=ctx.generator, device=ctx.generator.device))

        def rows(s: float) -> "torch.Tensor":
            return (a64 + s * step64).to(own.dtype)

        def accepted(s: float) -> bool:
            full = base.clone()
            full[m_idx] = rows(s)
            sctx = ServerContext.default(
                full,
                round=ctx.round,
                client_ids=client_ids,
                global_params=ctx.global_params,
                previous_update=ctx.previous_update,
                generator=torch.Generator(device=ctx.generator.device).manual_seed(seed),
                **({"weights": weights} if weights is not None else {}),
            )
            dec = ctx.defense(full, sctx)
            return bool(dec.accepted[m_idx].all())

        if accepted(1.0):
            lo, hi = 1.0, None
            s = 1.0
            while s < self.max_scale:
                s = min(2.0 * s, float(self.max_scale))
                if accepted(s):
                    lo = s
                else:
                    hi = s
                    break
            if hi is None:
                return rows(lo)
        else:
            lo, hi = 0.0, 1.0
        for _ in range(self.steps):
            mid = 0.5 * (lo + hi)
            if accepted(mid):
                lo = mid
            else:
                hi = mid
        return rows(lo)
