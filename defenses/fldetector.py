"""FLDetector: flag clients whose updates are inconsistent with their own history.

Zhang, Cao, Jia & Gong, "FLDetector: Defending Federated Learning Against Model
Poisoning Attacks via Detecting Malicious Clients", KDD 2022. In round t, with w_t
the global model, gᵢᵗ client i's update and gᵗ the round's aggregated update:

1. the server approximates the Hessian-vector product Ĥᵗ(w_t − w_{t−1}) with
   L-BFGS over the last N pairs (Δw_k, Δg_k) = (w_k − w_{k−1}, g^k − g^{k−1});
2. it predicts every client's update from its previous one,
   ĝᵢᵗ = gᵢ^{t−1} + Ĥᵗ(w_t − w_{t−1}), and measures dᵢ = ‖ĝᵢᵗ − gᵢᵗ‖₂;
3. the distances are normalised over the round's clients, dᵢ ← dᵢ/Σⱼdⱼ, and the
   suspicious score sᵢ is the mean of client i's last N normalised distances;
4. the gap statistic (Tibshirani, Walther & Hastie 2001) decides whether the scores
   form more than one cluster; if so, k-means with k = 2 splits them and the cluster
   with the larger mean score is flagged as malicious.

The L-BFGS product uses the compact representation of Byrd, Nocedal & Schnabel
(1994, eq. 2.17): with S = [Δw…], Y = [Δg…] (one column per pair, oldest first),
A = SᵀY, D = diag(A), L the strictly lower triangle of A and σ = yₘᵀsₘ / sₘᵀsₘ,

    Ĥv = σv − [σS  Y]·M⁻¹·[σSᵀv; Yᵀv],   M = [[σSᵀS, L], [Lᵀ, −D]].

In delta space gᵢ is −η times a gradient, so Ĥ approximates −η times the Hessian;
the product is linear in Y, so the prediction is the same.

Conventions (named parameters): ``window`` is N (paper 10). Distances are measured
from the first round with a stored pair on (L-BFGS over the up to N latest pairs), and a
client's score enters the detection once it holds N distances: the released code tests
only once it has 10 rounds of distances (``malicious_score.shape[0] >= 11``, a zero row
included) and sums the last 10, so the first test reads full windows, not one round's
distances (the paper's warm-up; ``Decision.state["decided"]`` lists the ids whose
full-window scores entered the test). ``score_window = "available"`` instead tests each client on
the mean of the up to N distances it holds (with every client in every round the two agree from the
N-th round with distances on; they differ before it, and under partial participation, where a client
that missed rounds has fewer). Checked against the release at 18bdb0f: ``train_cifar.py`` and
``train_femnist.py`` stack one row of normalised distances per round on a zero row and test the sum
of the last 10 rows once there are 11 (the sum is N times our mean: the same split and the same
gap); ``train_mnist.py`` records the distances (from ``e > 50``) and tests nothing in its loop
(they are written to ``score1.csv``). ``start_after`` delays the first distance as the release does
(``e > 20`` CIFAR-10, ``e > 50`` MNIST / FEMNIST; default 0). The gap statistic compares k = 1 with
k = 2 only (its choice of k̂ > 1 depends on nothing else), with
``gap_references`` uniform reference sets over [min s, max s] drawn from
``ctx.generator``; k-means in one dimension is solved exactly (the best split of the
sorted scores; the release calls scikit-learn's ``KMeans``, whose restarts find the same split on
one-dimensional scores). The reference sets' dispersions are averaged as Tibshirani et al. define
the gap (``gap_reference = "mean_of_logs"``, the mean of log W*); the release's ``detection1``
takes the log of the mean of W* (``"log_of_mean"``; its range normalisation to [0, 1] changes
neither). After detection the accepted updates are averaged FedAvg-style
(sample-weighted), the paper's base rule; FLDetector is a filter, so
``Pipeline((FLDetector(), Median()))`` uses another aggregation rule.

After a detection. The authors detect once: their released code
(github.com/zaixizhang/FLDetector, ``train_cifar.py`` / ``train_femnist.py``) runs
``detection(...)`` and ``break``s out of training the first round the gap statistic
finds more than one cluster, and the paper then removes the detected clients and
trains again from a saved model. Restarting training from a checkpoint is out of a
defense's reach here (the trainer and the server optimizer own the global model; a
defense only returns a round's aggregate), so with ``detect_once`` (default) the
clients flagged in the first round that flags anyone are excluded from then on, training
goes on from the current model, and nobody is scored again (``Decision.state``:
``detected_round``). ``persistent`` (default True): a flagged client id stays rejected
in later rounds (``False``: flagged in its round only).

``detect_once=False`` keeps detecting on the remaining clients every round. **Warning:**
then bans compound: each round's 2-means split of the survivors' scores can flag more,
and nobody is ever readmitted. On the quadratic problem of the tests (10 clients, 3
sending noise) 6 of the 7 honest clients were banned after the attackers by round 30
(with no attacker, 9 of 10); on IID digits (20 clients, 4 sign-flipping ×4) the
former per-round detection had banned 15 of the 16 honest clients by round 40.

Known weakness (a property of the published rule): 2-means puts the largest scores in
the flagged cluster, so one sacrificial client far more inconsistent than the rest is
flagged alone and keeps FLDetector from flagging the others (with ``detect_once`` for
good: on Dirichlet(0.5) digits with 4 of 20 clients sign-flipping ×4, the first
detection flags one of the four, and the other three stay in). The attack
``fldetector_sacrifice`` (attacks/steer.py) does it on purpose; scenarios/weaknesses.toml.

Everything FLDetector remembers is explicit state keyed by client id (not row):
``Decision.state`` holds the ids, their last updates, their recent normalised
distances, the flagged ids, and the global-model and aggregate history. The global
model comes from ``ctx.global_params`` and gᵗ⁻¹ from ``ctx.previous_update``;
without them no pair can be formed and nobody is scored. Non-finite updates are
rejected and not remembered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from redteam.errors import InvalidParameter
from redteam.pipeline import Filter, FilterResult
from redteam.types import Decision, ServerContext

from ._common import check_count, finite_rows, generator_of, gram64
from ._stats import filtered_mean_decision

if TYPE_CHECKING:
    import torch

__all__ = ["FLDetector", "lbfgs_hvp", "gap_says_clusters", "two_means_split", "GAP_REFERENCES", "SCORE_WINDOWS"]

#: which clients' scores enter the test (``FLDetector.score_window``)
SCORE_WINDOWS = ("full", "available")

_BLOCK = 1 << 12  # columns per block of the residual norms (temporaries stay in cache)


def lbfgs_hvp(s: "torch.Tensor", y: "torch.Tensor", v: "torch.Tensor") -> "torch.Tensor":
    """Ĥv from the compact L-BFGS form (module docstring). ``s``, ``y``: ``(m, d)``
    pairs, oldest first (rows, not columns); ``v``: ``(d,)``. Float64 small algebra;
    returns ``v``'s dtype. A degenerate history (σ undefined) gives zeros."""
    import torch

    m = s.shape[0]
    if m == 0:
        return torch.zeros_like(v)
    g = gram64(torch.cat([s, y, v[None, :].to(s.dtype)]))
    ss, sy = g[:m, :m], g[:m, m:2 * m]
    sv, yv = g[:m, 2 * m], g[m:2 * m, 2 * m]
    last_ss = float(ss[m - 1, m - 1])
    if not last_ss > 0 or not math.isfinite(last_ss) or not bool(torch.isfinite(g).all()):
        return torch.zeros_like(v)
    sigma = float(sy[m - 1, m - 1]) / last_ss  # yₘᵀsₘ / sₘᵀsₘ (sy[i, j] = sᵢᵀyⱼ)
    low = torch.tril(sy, diagonal=-1)  # Lᵢⱼ = sᵢᵀyⱼ for i > j
    mid = torch.cat([torch.cat([sigma * ss, low], dim=1),
                     torch.cat([low.T, -torch.diag(torch.diagonal(sy))], dim=1)])
    rhs = torch.cat([sigma * sv, yv])
    p = torch.linalg.pinv(mid) @ rhs
    if not bool(torch.isfinite(p).all()):
        return torch.zeros_like(v)
    coef_s = (sigma * p[:m]).to(s.dtype)
    coef_y = p[m:].to(s.dtype)
    out = sigma * v.to(torch.float64) - (coef_s @ s + coef_y @ y).to(torch.float64)
    return out.to(v.dtype) if bool(torch.isfinite(out).all()) else torch.zeros_like(v)


def _split_costs(x: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """For sorted rows ``x`` ``(B, m)``: W₁ ``(B,)`` and the within-cluster sums of squares
    of every split into x[:j] and x[j:], j = 1 … m − 1 ``(B, m − 1)``."""
    import torch

    m = x.shape[1]
    x = x - x.mean(dim=1, keepdim=True)  # centred: the running sums below do not cancel
    c1 = torch.cumsum(x, dim=1)
    c2 = torch.cumsum(x * x, dim=1)
    tot1, tot2 = c1[:, -1:], c2[:, -1:]
    w1 = (tot2 - tot1 * tot1 / m).squeeze(1).clamp_min(0.0)
    j = torch.arange(1, m, dtype=x.dtype, device=x.device)
    left = c2[:, :-1] - c1[:, :-1] ** 2 / j
    right = (tot2 - c2[:, :-1]) - (tot1 - c1[:, :-1]) ** 2 / (m - j)
    return w1, (left + right).clamp_min(0.0)


def two_means_split(scores: "torch.Tensor") -> "torch.Tensor":
    """Exact 1-D k-means with k = 2: bool mask of the upper cluster (the larger mean)."""
    import torch

    x = scores.to(torch.float64)
    order = torch.argsort(x, stable=True)
    _, costs = _split_costs(x[order][None, :])
    j = int(torch.argmin(costs[0])) + 1  # the first j of minimal cost
    upper = torch.zeros_like(x, dtype=torch.bool)
    upper[order[j:]] = True
    return upper


#: how the gap statistic averages the reference sets' dispersions (``FLDetector.gap_reference``)
GAP_REFERENCES = ("mean_of_logs", "log_of_mean")


def gap_says_clusters(scores: "torch.Tensor", references: int, generator: "torch.Generator",
                      reference: str = "mean_of_logs") -> tuple[bool, dict]:
    """Gap statistic, k = 1 against k = 2: True when k̂ > 1, i.e. Gap(1) < Gap(2) − s₂.

    Gap(k) = mean_b log W*_kb − log W_k (``reference = "mean_of_logs"``, Tibshirani, Walther &
    Hastie 2001, eq. 3) or log(mean_b W*_kb) − log W_k (``"log_of_mean"``, the FLDetector
    release's ``detection1``), with W_k the within-cluster sum of squares of the optimal
    k-means, W*_kb that of the b-th uniform reference set over the data's range, and in both
    s_k = sd_b(log W*_kb)·√(1 + 1/B)."""
    import torch

    x = scores.to(torch.float64).cpu()
    m = x.shape[0]
    lo, hi = float(x.min()), float(x.max())
    if m < 3 or not hi - lo > 1e-9 * max(abs(hi), abs(lo)):  # equal up to rounding: one cluster
        return False, {}
    xs = torch.sort(x).values[None, :]
    w1, costs = _split_costs(xs)
    ref = lo + (hi - lo) * torch.rand(references, m, generator=generator, dtype=torch.float64)
    r1, rcosts = _split_costs(torch.sort(ref, dim=1).values)
    log_w1, log_w2 = math.log(float(w1[0])), math.log(max(float(costs.min()), 1e-300))
    lr1, lr2 = r1.clamp_min(1e-300).log(), rcosts.min(dim=1).values.clamp_min(1e-300).log()
    if reference == "log_of_mean":
        gap1 = math.log(max(float(r1.mean()), 1e-300)) - log_w1
        gap2 = math.log(max(float(rcosts.min(dim=1).values.mean()), 1e-300)) - log_w2
    else:
        gap1 = float(lr1.mean()) - log_w1
        gap2 = float(lr2.mean()) - log_w2
    s2 = float(lr2.std(unbiased=False)) * math.sqrt(1.0 + 1.0 / references)
    return gap1 < gap2 - s2, {"gap1": gap1, "gap2": gap2, "s2": s2}


def _residual_norms(prev: "torch.Tensor", src: "torch.Tensor", hv: "torch.Tensor", cur: "torch.Tensor",
                    sel: "torch.Tensor") -> "torch.Tensor":
    """‖prev[srcᵢ] + hv − cur[selᵢ]‖₂ per pair (float64), over column blocks: rows are
    gathered block by block (no (n, d) temporary). float32 blocks use the fast float32
    norm; a block whose norm may have overflowed or underflowed is redone in float64."""
    import torch

    ident_src = src.shape[0] == prev.shape[0] and bool((src == torch.arange(src.shape[0], device=src.device)).all())
    ident_sel = sel.shape[0] == cur.shape[0] and bool((sel == torch.arange(sel.shape[0], device=sel.device)).all())
    acc = torch.zeros(sel.shape[0], dtype=torch.float64, device=cur.device)
    for start in range(0, cur.shape[1], _BLOCK):
        a = prev[:, start:start + _BLOCK]
        b = cur[:, start:start + _BLOCK]
        a = a if ident_src else a.index_select(0, src)
        b = b if ident_sel else b.index_select(0, sel)
        h = hv[start:start + _BLOCK]
        if cur.dtype == torch.float32:
            part = torch.linalg.vector_norm(a - b + h, dim=1).to(torch.float64)
            redo = ~torch.isfinite(part) | (part >= 1e18) | (part < 1e-15)
            if bool(redo.any()):
                rows = redo.nonzero().flatten()
                blk = a.index_select(0, rows).to(torch.float64) - b.index_select(0, rows).to(torch.float64)
                part[rows] = torch.linalg.vector_norm(blk + h.to(torch.float64), dim=1)
        else:
            part = torch.linalg.vector_norm((a.to(torch.float64) - b.to(torch.float64)) + h.to(torch.float64), dim=1)
        acc += part * part
    return acc.sqrt()


def _tensor(state: Mapping[str, Any], key: str, shape: tuple[int, ...] | None, like: "torch.Tensor"):
    import torch

    v = state.get(key)
    if v is None:
        return None
    t = torch.as_tensor(v).to(device=like.device, dtype=like.dtype)
    if shape is not None and tuple(t.shape) != shape:
        raise InvalidParameter(f"FLDetector: ctx.state[{key!r}] has shape {tuple(t.shape)}, expected {shape}")
    return t


@dataclass(frozen=True, slots=True)
class FLDetector(Filter):
    """FLDetector (Zhang et al., KDD 2022): L-BFGS prediction of each client's update,
    suspicious scores over a window, gap statistic + 2-means.

    * ``window``: N, the L-BFGS history and the score window (paper 10);
    * ``gap_references``: uniform reference sets of the gap statistic (B = 10);
    * ``persistent``: a flagged client stays rejected in later rounds (default True);
    * ``detect_once``: stop detecting after the first round that flags anyone (default
      True, the authors' procedure); ``False`` detects every round and its bans compound
      (module docstring: a warning);
    * ``score_window``: ``"full"`` (default) — a client's score (the mean of its last N
      normalised distances) enters the test only once it holds N distances, as the release tests
      only on 10 full rows (``train_cifar.py`` / ``train_femnist.py``: ``malicious_score.shape[0]
      >= 11`` with a zero first row, every client scored every round); ``"available"`` — the mean of
      the up to N distances a client has, from its first (a client that took part in fewer rounds,
      under partial participation, is tested on fewer);
    * ``gap_reference``: ``"mean_of_logs"`` (default, Tibshirani et al.'s gap statistic, which the
      paper cites) or ``"log_of_mean"`` (the release's ``detection1``), see
      :func:`gap_says_clusters`;
    * ``start_after``: distances are recorded only in rounds > ``start_after`` (default 0: from the
      first round with an L-BFGS pair); the release records from ``e > 20`` (CIFAR-10,
      ``train_cifar.py``) or ``e > 50`` (FEMNIST, MNIST), after its model has settled.
    """

    window: int = 10
    gap_references: int = 10
    persistent: bool = True
    detect_once: bool = True
    score_window: str = "full"
    gap_reference: str = "mean_of_logs"
    start_after: int = 0
    summary: ClassVar[str] = "FLDetector: L-BFGS-predicted updates, suspicious scores, gap statistic + 2-means"
    reference: ClassVar[str] = "Zhang, Cao, Jia & Gong, KDD 2022"

    def validate_window(self, v: int) -> None:
        check_count(self, "window", v, allow_none=False, minimum=1)

    def validate_gap_references(self, v: int) -> None:
        check_count(self, "gap_references", v, allow_none=False, minimum=2)

    def validate_score_window(self, v: str) -> None:
        if v not in SCORE_WINDOWS:
            raise InvalidParameter(f"FLDetector.score_window = {v!r}: must be one of {', '.join(SCORE_WINDOWS)}")

    def validate_gap_reference(self, v: str) -> None:
        if v not in GAP_REFERENCES:
            raise InvalidParameter(f"FLDetector.gap_reference = {v!r}: must be one of {', '.join(GAP_REFERENCES)}")

    def validate_start_after(self, v: int) -> None:
        check_count(self, "start_after", v, allow_none=False, minimum=0)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        n, d = updates.shape
        ids = [int(c) for c in ctx.client_ids] if ctx.client_ids else list(range(n))
        if len(ids) != n or len(set(ids)) != n:
            raise InvalidParameter(f"FLDetector: ctx.client_ids must name each of the {n} updates once, got {ids!r}")
        st = dict(ctx.state or {})
        ok = finite_rows(updates)
        # -- the (Δw, Δg) history ------------------------------------------------------
        s_hist = _tensor(st, "s", None, updates)
        y_hist = _tensor(st, "y", None, updates)
        if s_hist is None or y_hist is None:
            s_hist = y_hist = updates.new_zeros((0, d))
        elif s_hist.ndim != 2 or s_hist.shape[1] != d or y_hist.shape != s_hist.shape:
            raise InvalidParameter(f"FLDetector: ctx.state['s'] and ['y'] have shapes {tuple(s_hist.shape)} and "
                                   f"{tuple(y_hist.shape)}, expected two equal (m, {d})")
        w_now = ctx.global_params
        g_prev = ctx.previous_update
        w_last = _tensor(st, "w_last", (d,), updates)
        pending = _tensor(st, "pending_dw", (d,), updates)
        g_last = _tensor(st, "g_last", (d,), updates)
        if w_now is not None:
            w_now = w_now.to(device=updates.device, dtype=updates.dtype)
        if pending is not None and g_last is not None and g_prev is not None:
            dy = g_prev.to(device=updates.device, dtype=updates.dtype) - g_last
            if bool(torch.isfinite(dy).all()) and bool(torch.isfinite(pending).all()) and float(pending.abs().max()) > 0:
                s_hist = torch.cat([s_hist, pending[None, :]])[-self.window:]
                y_hist = torch.cat([y_hist, dy[None, :]])[-self.window:]
        v = (w_now - w_last) if (w_now is not None and w_last is not None) else None
        # -- per-client memory ---------------------------------------------------------
        old_ids = [int(c) for c in st.get("ids", [])]
        old_rows = _tensor(st, "rows", (len(old_ids), d), updates) if old_ids else None
        where = {c: j for j, c in enumerate(old_ids)}
        dists: dict[int, list[float]] = {int(k): list(v_) for k, v_ in dict(st.get("distances", {})).items()}
        flagged: dict[int, int] = {int(k): int(v_) for k, v_ in dict(st.get("flagged", {})).items()}
        banned = torch.tensor([self.persistent and c in flagged for c in ids], dtype=torch.bool,
                              device=updates.device)
        detected = st.get("detected_round")
        stopped = self.detect_once and detected is not None
        scored = [i for i in range(n) if bool(ok[i]) and not bool(banned[i]) and ids[i] in where]
        ready = (not stopped and v is not None and s_hist.shape[0] >= 1 and len(scored) > 0
                 and int(ctx.round) > self.start_after)
        info: dict[str, Any] = {"pairs": int(s_hist.shape[0]), "scored": [ids[i] for i in scored] if ready else []}
        newly = torch.zeros(n, dtype=torch.bool, device=updates.device)
        if ready:
            hv = lbfgs_hvp(s_hist, y_hist, v)
            sel = torch.tensor(scored, dtype=torch.long, device=updates.device)
            src = torch.tensor([where[ids[i]] for i in scored], dtype=torch.long, device=updates.device)
            raw = _residual_norms(old_rows, src, hv, updates, sel)
            total = float(raw.sum())
            norm = raw / total if total > 0 and math.isfinite(total) else torch.zeros_like(raw)
            for j, i in enumerate(scored):
                dists[ids[i]] = (dists.get(ids[i], []) + [float(norm[j])])[-self.window:]
            # a full window of N distances, or (score_window = "available") whatever the client has
            need = self.window if self.score_window == "full" else 1
            full = [i for i in scored if len(dists[ids[i]]) >= need]
            info["decided"] = [ids[i] for i in full]
            if full:
                score = torch.tensor([sum(dists[ids[i]]) / len(dists[ids[i]]) for i in full], dtype=torch.float64)
                many, gap = gap_says_clusters(score, self.gap_references, generator_of(ctx), self.gap_reference)
                info.update(gap, scores=score.tolist(), clusters=2 if many else 1)
                if many:
                    upper = two_means_split(score)
                    for j in upper.nonzero().flatten().tolist():
                        newly[full[j]] = True
                        flagged.setdefault(ids[full[j]], int(ctx.round))
                    if detected is None and bool(upper.any()):
                        detected = int(ctx.round)
        accepted = ok & ~banned & ~newly
        reasons: dict[int, str] = {}
        for i in (~accepted).nonzero().flatten().tolist():
            if not bool(ok[i]):
                reasons[i] = "non-finite update"
            elif bool(newly[i]):
                reasons[i] = ("FLDetector: in the high-score cluster of suspicious scores "
                              f"(score {sum(dists[ids[i]]) / len(dists[ids[i]]):.6g})")
            else:
                reasons[i] = f"FLDetector: flagged in round {flagged[ids[i]]} and removed"
        # -- the new state -------------------------------------------------------------
        keep_old = [j for j, c in enumerate(old_ids) if c not in set(ids)] if old_ids else []
        fin = ok.nonzero().flatten()
        new_ids = [old_ids[j] for j in keep_old] + [ids[i] for i in fin.tolist()]
        parts = []
        if keep_old:
            parts.append(old_rows.index_select(0, torch.tensor(keep_old, dtype=torch.long, device=updates.device)))
        # a copy either way: the state never aliases the input
        parts.append(updates.clone() if fin.numel() == n else updates.index_select(0, fin))
        # a non-finite update this round: that client's last finite update stays remembered
        for i in (~ok).nonzero().flatten().tolist():
            if ids[i] in where:
                new_ids.append(ids[i])
                parts.append(old_rows[where[ids[i]]][None, :])
        state = {
            "ids": new_ids,
            # one entry per id (rows) or keyed by id; "s"/"y" are node-level (m, d) history
            "per_client": ["rows", "distances", "flagged"],
            "rows": parts[0] if len(parts) == 1 else torch.cat(parts),
            "distances": dists,
            "flagged": flagged,
            "detected_round": detected,
            "s": s_hist,
            "y": y_hist,
            "w_last": None if w_now is None else w_now.clone(),
            "pending_dw": None if v is None else v,
            "g_last": None if g_prev is None else g_prev.to(device=updates.device, dtype=updates.dtype).clone(),
            **info,
        }
        return FilterResult(updates=updates, accepted=accepted, reasons=reasons, state=state)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        return filtered_mean_decision(self.filter(updates, ctx), updates, ctx)
