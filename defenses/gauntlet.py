"""Gauntlet-style validation of work: score each peer by what its update does to the loss.

After Templar's Gauntlet validator (Lidin, Sarfi, et al., "Incentivizing Permissionless
Distributed Learning of LLMs", arXiv:2505.21684, 2025): a validator applies each peer's
update to the current model and measures the loss before − after on data it chooses, keeps a
rating of every peer over rounds, aggregates only the best-rated peers and pays rewards by
rating. Two scoring rules, ``scoring``:

**``"templar"``** (default), as Templar's released validator scores a window (neurons/validator.py of
tplr-ai/templar; hparams ``binary_score_ma_alpha = 0.05``):

* relative improvements on the peer's *assigned* batch and on the validator's *random* batch,
  ownᵢ = (L_Aᵢ(w) − L_Aᵢ(w + Δᵢ)) / L_Aᵢ(w) and randᵢ = (L_R(w) − L_R(w + Δᵢ)) / L_R(w);
* the window's gradient score gᵢ = randᵢ, fed as the score of a one-peer team to an OpenSkill
  Plackett–Luce rating (Weng & Lin, JMLR 2011; the ``openskill`` package, default μ = 25,
  σ = 25/3), whose ordinal is μ − 3σ;
* the binary indicator bᵢ = +1 when ownᵢ > randᵢ (the peer improved the data it was assigned
  more than data it never saw: evidence that it trained on its assignment), −1 otherwise,
  smoothed as Bᵢ ← (1 − β)·Bᵢ + β·bᵢ (β = ``bma_alpha``);
* the final score fᵢ = ordinalᵢ · max(0, Bᵢ); the top G by fᵢ > 0 are aggregated and paid in
  proportion to fᵢ.

What it rewards: improving the held-out data (the rating) *and* improving one's own assigned
data more than held-out data (the indicator). A copy of another peer's update improves the
copier's assigned batch no more than random data, so its indicator is −1 and its pay falls to 0
as its B turns negative; an update trained on the assigned batch alone (score gaming) earns +1
indicators — Templar's signal rewards exactly that gap.

**``"min"``** (our own rendering, the earlier default, kept as a named option):

1. **Scores.** For peer i with update Δᵢ and global model w:

   * sᴬᵢ = L_Aᵢ(w) − L_Aᵢ(w + Δᵢ) on peer i's *assigned* batch Aᵢ (the data a
     permissionless trainer publicly assigns the peer; ``ctx.evaluate_loss_assigned``);
   * sᴿᵢ = L_R(w) − L_R(w + Δᵢ) on the validator's *random* batch R (its held-out sample,
     which no peer has seen; ``ctx.evaluate_loss``);
   * the round score sᵢ = min(sᴬᵢ, sᴿᵢ) (``random_batch = true``, default): an update must
     improve both; training on the assigned batch only improves sᴬ but not sᴿ (score
     gaming). With ``random_batch = false`` sᵢ = sᴬᵢ (the ablation the cheat beats).

   **Consensus of validators** (``validators`` = V > 1; Templar's validators set weights on a
   Bittensor subnet, whose Yuma consensus keeps, per peer, the largest weight that validators
   holding more than a κ share of the stake support): V validator seats of equal stake score the
   round; the peer's round score is the largest value v such that more than κ·V seats report a
   score ≥ v (κ = ``kappa``, default 0.5: the lower median for even V). The honest seats all
   compute the scores of step 1 (they hold the same data here); an attacker's seats report what
   it likes (``ServerContext.validator_reports``; attacks/verification.py ``validator_seats``),
   so colluders move the consensus only when they hold more than κ of the seats (all of them
   when V = 1).

2. **Rating** (documented stand-in for OpenSkill): the round's scores are normalised by the
   largest |sⱼ| of the round, ŝᵢ = sᵢ / maxⱼ|sⱼ| ∈ [−1, 1], and each rating is an
   exponential moving average rᵢ ← (1 − α)·rᵢ + α·ŝᵢ (α = ``alpha``; a new peer starts at 0).
   A peer flagged by commit-reveal gets ŝᵢ = −1. Ratings are kept by client id across rounds
   (``Decision.state``: ``ids`` and ``rating``).

3. **Aggregate the top G** (``top_g``): the G peers with the highest rating among those
   with rᵢ > 0 and not flagged (ties: lower row first); their sample-weighted mean is the
   aggregate. The others are rejected, with the reason.

   What it rewards: improving *both* batches; an update that improves its assigned batch more
   than held-out data is held to the smaller figure, the opposite of Templar's indicator.

4. **Rewards.** A round's reward pool (1) is split among the top G in proportion to their
   ratings: rewardᵢ = rᵢ / Σ_top rⱼ; everyone else gets 0. ``Decision.state["rewards"]``
   (client id → share) is copied into ``RoundRecord.extra["rewards"]``; scoring's
   ``reward_share`` and ``cheat_reward_ratio`` read it.

5. **Commit-reveal** (``commit_reveal = true``): every peer commits the SHA-256 of the row
   it will reveal before the commit window closes (``ctx.commits``: client → (digest,
   time), the window closing at 1.0), and reveals open only then. A row is flagged when its
   commit is missing, late (time > 1.0: a copy of another peer's update can only be made
   after that update is revealed), its digest does not match the revealed row, or its
   digest equals another peer's (Sybils sharing one computation commit one digest). The
   engine writes the commitments into ``RoundRecord.extra["commitments"]`` and
   :func:`redteam.federation.commitments.write_commitment_ledger` logs them in a signed
   RFC 6962 ledger, so a late copy is provable afterwards by anyone holding the ledger.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Mapping

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, sample_weights

from ._common import check_count, check_number, combine, finite_rows

if TYPE_CHECKING:
    import torch

__all__ = ["Gauntlet", "round_scores", "consensus_scores", "update_ratings", "top_g_rewards", "row_digest",
           "commit_flags", "relative_improvement", "templar_indicator", "openskill_update"]


def relative_improvement(before: "torch.Tensor | float", after: "torch.Tensor") -> "torch.Tensor":
    """(L(w) − L(w + Δ)) / L(w) per row (0 where L(w) ≤ 0, as Templar's validator; −inf where a
    loss is not finite). float64."""
    import torch

    b = torch.as_tensor(before, dtype=torch.float64).expand_as(after.to(torch.float64))
    a = after.to(torch.float64)
    rel = torch.where(b > 0, (b - a) / torch.where(b > 0, b, torch.ones_like(b)), torch.zeros_like(b))
    return torch.where(torch.isfinite(rel), rel, torch.full_like(rel, -float("inf")))


def templar_indicator(own: "torch.Tensor", rand: "torch.Tensor") -> "torch.Tensor":
    """bᵢ = +1 where ownᵢ > randᵢ (finite), −1 otherwise. float64."""
    import torch

    better = (own > rand) & torch.isfinite(own) & torch.isfinite(rand)
    return torch.where(better, torch.ones_like(own, dtype=torch.float64), -torch.ones_like(own, dtype=torch.float64))


def openskill_update(ratings: Mapping[int, tuple[float, float]], ids: list[int], scores: "torch.Tensor"
                     ) -> dict[int, tuple[float, float]]:
    """One Plackett–Luce rating game between the peers ``ids`` (one-peer teams; a higher score is a
    better place), from their (μ, σ) (a new peer starts at the model's defaults). Non-finite
    scores take the last place. Peers absent keep theirs. Needs the ``openskill`` package."""
    from openskill.models import PlackettLuce

    model = PlackettLuce()
    out = dict(ratings)
    vals = [float(v) for v in scores.tolist()]
    finite = [v for v in vals if v == v and abs(v) != float("inf")]
    floor = (min(finite) if finite else 0.0) - 1.0
    vals = [v if (v == v and abs(v) != float("inf")) else floor for v in vals]
    if len(ids) < 2:  # no game with one player: a new peer gets the model's starting rating
        for c in ids:
            if c not in out:
                first = model.rating()
                out[c] = (float(first.mu), float(first.sigma))
        return out
    teams = [[model.rating(mu=ratings[c][0], sigma=ratings[c][1]) if c in ratings else model.rating()] for c in ids]
    rated = model.rate(teams, scores=vals)
    for c, team in zip(ids, rated):
        out[c] = (float(team[0].mu), float(team[0].sigma))
    return out


def consensus_scores(reports: "torch.Tensor", kappa: float = 0.5) -> "torch.Tensor":
    """Per peer (column of ``reports``, ``(V, n)``, one row per equal-stake validator seat), the
    largest reported value v such that more than ``kappa``·V seats report a score ≥ v. float64."""
    import torch

    r = reports.to(torch.float64)
    v = int(r.shape[0])
    ranked = torch.sort(r, dim=0, descending=True).values  # (V, n)
    support = (r[None, :, :] >= ranked[:, None, :]).sum(dim=1)  # seats at or above each ranked value
    first = torch.argmax((support > kappa * v).to(torch.int8), dim=0)  # the highest supported value
    return ranked.gather(0, first[None, :])[0]


def row_digest(row: "torch.Tensor") -> str:
    """SHA-256 (hex) of a row's float32 little-endian bytes: what a peer commits to."""
    import torch

    arr = row.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
    return hashlib.sha256(arr.tobytes()).hexdigest()


def round_scores(before_a: "torch.Tensor", after_a: "torch.Tensor", before_r: float | None,
                 after_r: "torch.Tensor | None") -> "torch.Tensor":
    """sᵢ = min(L_A(w) − L_A(w+Δᵢ), L_R(w) − L_R(w+Δᵢ)); the assigned term alone when
    ``after_r`` is None. Non-finite losses give −inf. float64, ``(n,)``."""
    import torch

    s = before_a.to(torch.float64) - after_a.to(torch.float64)
    if after_r is not None:
        s = torch.minimum(s, float(before_r) - after_r.to(torch.float64))  # type: ignore[arg-type]
    return torch.where(torch.isfinite(s), s, torch.full_like(s, -float("inf")))


def update_ratings(old: Mapping[int, float], ids: list[int], scores: "torch.Tensor", alpha: float,
                   flagged: set[int] = frozenset()) -> dict[int, float]:
    """rᵢ ← (1 − α)·rᵢ + α·ŝᵢ with ŝᵢ = sᵢ / maxⱼ|sⱼ| (finite scores; −inf and flagged → −1).

    Peers absent this round keep their rating. Returns the new ratings (all peers)."""
    vals = [float(x) for x in scores.tolist()]
    finite = [abs(v) for v, c in zip(vals, ids) if v != -float("inf") and c not in flagged]
    scale = max(finite) if finite and max(finite) > 0 else 1.0
    out = dict(old)
    for c, v in zip(ids, vals):
        s_hat = -1.0 if (c in flagged or v == -float("inf")) else max(-1.0, min(1.0, v / scale))
        out[c] = (1.0 - alpha) * float(old.get(c, 0.0)) + alpha * s_hat
    return out


def top_g_rewards(ratings: Mapping[int, float], ids: list[int], g: int,
                  flagged: set[int] = frozenset()) -> tuple[list[int], dict[int, float]]:
    """The rows (positions in ``ids``) of the top ``g`` peers by rating with rᵢ > 0 and not
    flagged (ties: lower row first), and each present peer's reward share (∝ rating among the
    top g; 0 elsewhere; all 0 when nobody qualifies)."""
    eligible = [k for k, c in enumerate(ids) if c not in flagged and ratings.get(c, 0.0) > 0]
    eligible.sort(key=lambda k: (-ratings[ids[k]], k))
    top = sorted(eligible[:g])
    total = sum(ratings[ids[k]] for k in top)
    rewards = {c: 0.0 for c in ids}
    for k in top:
        rewards[ids[k]] = ratings[ids[k]] / total
    return top, rewards


def commit_flags(updates: "torch.Tensor", ids: list[int],
                 commits: Mapping[int, tuple[str, float]], close: float = 1.0) -> dict[int, str]:
    """Row position → why its commitment fails: missing, late (time > ``close``), digest ≠
    the revealed row's, or a digest shared with another peer's commitment."""
    out: dict[int, str] = {}
    shared: dict[str, list[int]] = {}
    for k, c in enumerate(ids):
        got = commits.get(c)
        if got is None:
            out[k] = "commit-reveal: no commitment before the reveal"
            continue
        digest, t = got
        shared.setdefault(digest, []).append(k)
        if float(t) > close:
            out[k] = f"commit-reveal: committed at {float(t):.3g}, after the commit window closed at {close:g}"
        elif digest != row_digest(updates[k]):
            out[k] = "commit-reveal: revealed row does not match its committed digest"
    for digest, rows in shared.items():
        if len(rows) > 1:
            for k in rows:
                out.setdefault(k, f"commit-reveal: digest shared by {len(rows)} peers (one computation, "
                                  "several identities)")
    return out


@dataclass(frozen=True, slots=True)
class Gauntlet(Aggregator):
    """Gauntlet-style scoring, rating, top-G aggregation and rewards (module docstring).

    * ``top_g``: how many peers are aggregated and paid (G ≥ 1; default 5);
    * ``scoring``: ``"templar"`` (default: Templar's indicator and OpenSkill rating) or ``"min"``
      (min of the two improvements, an EMA rating);
    * ``alpha``: the ``"min"`` rating's EMA weight α ∈ (0, 1] (default 0.3);
    * ``bma_alpha``: the ``"templar"`` indicator's EMA weight β ∈ (0, 1] (default 0.05, Templar's);
    * ``random_batch``: also score on the validator's random batch (default ``True``);
    * ``commit_reveal``: flag peers whose commitment fails (default ``False``);
    * ``validators``: V validator seats of equal stake whose consensus scores the round
      (default 1: one validator); ``kappa``: the consensus's stake share κ ∈ [0, 1) (default 0.5).

    Needs the server's held-out data (``ctx.evaluate_loss``) and the peers' assigned batches
    (``ctx.evaluate_loss_assigned``; without it the random batch alone is scored).
    """

    top_g: int = 5
    scoring: Literal["templar", "min"] = "templar"
    alpha: float = 0.3
    bma_alpha: float = 0.05
    random_batch: bool = True
    commit_reveal: bool = False
    validators: int = 1
    kappa: float = 0.5
    uses_server_data: ClassVar[bool] = True
    summary: ClassVar[str] = "Gauntlet: loss-improvement scores, a rating over rounds, top-G aggregation, rewards"
    reference: ClassVar[str] = "Templar Gauntlet, arXiv:2505.21684"

    def validate_top_g(self, v: int) -> None:
        check_count(self, "top_g", v, allow_none=False, minimum=1)

    def validate_alpha(self, v: float) -> None:
        check_number(self, "alpha", v, low=0.0, low_open=True, high=1.0)

    @property
    def unanimity(self) -> bool:  # type: ignore[override]
        """Templar's scoring aggregates only peers whose indicator average is positive: n copies
        of one update give no such evidence (their own and random improvements tie, b = −1), so
        it aggregates nothing rather than x. The ``"min"`` rule keeps unanimity."""
        return self.scoring != "templar"

    def validate_bma_alpha(self, v: float) -> None:
        check_number(self, "bma_alpha", v, low=0.0, low_open=True, high=1.0)

    def validate_scoring(self, v: str) -> None:
        if v not in ("templar", "min"):
            raise InvalidParameter(f"Gauntlet.scoring = {v!r}: must be 'templar' or 'min'")

    def validate_validators(self, v: int) -> None:
        check_count(self, "validators", v, allow_none=False, minimum=1)

    def validate_kappa(self, v: float) -> None:
        check_number(self, "kappa", v, low=0.0, high=0.999999)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        ids = list(ctx.client_ids) if ctx.client_ids else list(range(n))
        if len(ids) != n:
            raise InvalidParameter(f"Gauntlet: ctx.client_ids names {len(ids)} peers for {n} updates")
        if ctx.evaluate_loss is None and ctx.evaluate_loss_assigned is None:
            raise InvalidParameter("Gauntlet needs ctx.evaluate_loss (server-held data) or "
                                   "ctx.evaluate_loss_assigned (the peers' assigned batches); both are None")
        if self.scoring == "templar" and ctx.evaluate_loss_assigned is None:
            raise InvalidParameter("Gauntlet(scoring='templar') compares each peer's improvement on its assigned batch "
                                   "with the random batch's, and ctx.evaluate_loss_assigned is None (the engine offers "
                                   "no assignment here); use scoring = 'min'")
        ok = finite_rows(updates)
        safe = torch.where(ok[:, None], updates, torch.zeros_like(updates))
        zeros = torch.zeros_like(safe)
        after_r = before_r = None
        if ctx.evaluate_loss is not None and (self.random_batch or ctx.evaluate_loss_assigned is None):
            lr_ = torch.as_tensor(ctx.evaluate_loss(torch.cat([zeros[:1], safe]))).cpu()
            before_r, after_r = float(lr_[0]), lr_[1:]
        if ctx.evaluate_loss_assigned is not None:
            la = torch.as_tensor(ctx.evaluate_loss_assigned(torch.cat([zeros, safe]), tuple(ids + ids))).cpu()
            before_a, after_a = la[:n], la[n:]
        else:  # no assignment: the random batch stands for both
            before_a, after_a = torch.full((n,), before_r, dtype=torch.float64), after_r
        indicator = None
        if self.scoring == "templar":
            own = relative_improvement(before_a, after_a)
            rand = relative_improvement(before_r, after_r) if (after_r is not None and self.random_batch) else None
            scores = rand if rand is not None else own
            # without a random batch the indicator compares the own improvement with none
            indicator = templar_indicator(own, rand if rand is not None else torch.zeros_like(own))
        else:
            scores = round_scores(before_a, after_a, before_r, after_r if self.random_batch else None)
        scores = torch.where(ok.cpu(), scores, torch.full_like(scores, -float("inf")))
        if ctx.validator_reports is not None or self.validators > 1:
            # the seats an attacker holds report what it likes; the others report the scores above
            bad = torch.zeros((0, n), dtype=torch.float64)
            if ctx.validator_reports is not None:
                bad = torch.as_tensor(ctx.validator_reports(tuple(ids), scores.clone())).to("cpu", torch.float64)
                if bad.ndim != 2 or int(bad.shape[1]) != n:
                    raise InvalidParameter(f"Gauntlet: ctx.validator_reports returned shape {tuple(bad.shape)}; "
                                           f"expected (seats, {n})")
                bad = bad[:self.validators]
            honest = scores[None, :].expand(self.validators - int(bad.shape[0]), n)
            scores = consensus_scores(torch.cat([honest, bad]), self.kappa)
        flags: dict[int, str] = {}
        if self.commit_reveal:
            if ctx.commits is None:
                raise InvalidParameter("Gauntlet(commit_reveal=true) needs ctx.commits: the engine ran no commit phase")
            flags = commit_flags(updates, ids, ctx.commits)
        flagged = {ids[k] for k in flags}
        state = ctx.state or {}
        extra_state: dict[str, Any] = {}
        if indicator is not None:  # Templar: OpenSkill on the scores, times the indicator's moving average
            flagged_rows = torch.as_tensor([c in flagged for c in ids], dtype=torch.bool)
            scores = torch.where(flagged_rows, torch.full_like(scores, -float("inf")), scores)
            indicator = torch.where(flagged_rows | ~ok.cpu(), -torch.ones_like(indicator), indicator)
            skill = openskill_update(_pairs_of(state, "skill"), ids, scores)
            bma = {int(c): float(v) for c, v in (state.get("bma") or {}).items()}
            for c, b in zip(ids, indicator.tolist()):
                bma[c] = (1.0 - self.bma_alpha) * bma.get(c, 0.0) + self.bma_alpha * float(b)
            ratings = {c: (mu - 3.0 * sig) * max(0.0, bma.get(c, 0.0)) for c, (mu, sig) in skill.items()}
            extra_state = {"skill": {c: [mu, sig] for c, (mu, sig) in skill.items()}, "bma": bma,
                           "indicator": {c: float(b) for c, b in zip(ids, indicator.tolist())}}
        else:
            ratings = update_ratings(_ratings_of(state), ids, scores, self.alpha, flagged)
        top, rewards = top_g_rewards(ratings, ids, self.top_g, flagged)
        accepted = torch.zeros(n, dtype=torch.bool, device=updates.device)
        if top:
            accepted[torch.as_tensor(top, device=updates.device)] = True
        accepted &= ok
        w_all = sample_weights(ctx, n, updates)
        w = torch.where(accepted, w_all, torch.zeros_like(w_all))
        total = float(w.sum())
        w = w / total if total > 0 else w
        agg = combine(w.to(updates.dtype), updates) if total > 0 else torch.zeros(d, dtype=updates.dtype,
                                                                                  device=updates.device)
        reasons: dict[int, str] = {}
        for k in range(n):
            if bool(accepted[k]):
                continue
            if not bool(ok[k]):
                reasons[k] = "non-finite update"
            elif k in flags:
                reasons[k] = flags[k]
            else:
                reasons[k] = (f"Gauntlet: rating {ratings[ids[k]]:.4g} (round score {float(scores[k]):.4g}) "
                              f"not among the top {self.top_g} positive ratings")
        known = sorted(ratings)
        per_client = ["rating", *(["skill", "bma"] if indicator is not None else [])]
        return Decision(aggregate=agg, accepted=accepted, weights=w, reasons=reasons, state={
            "ids": known, "per_client": per_client, "rating": {c: ratings[c] for c in known},
            "scores": {c: float(s) for c, s in zip(ids, scores.tolist())},
            "rewards": rewards, "flags": {ids[k]: why for k, why in flags.items()}, **extra_state,
        })


def _ratings_of(state: Mapping[str, Any]) -> dict[int, float]:
    r = state.get("rating")
    return {int(c): float(v) for c, v in r.items()} if isinstance(r, Mapping) else {}


def _pairs_of(state: Mapping[str, Any], key: str) -> dict[int, tuple[float, float]]:
    r = state.get(key)
    return {int(c): (float(v[0]), float(v[1])) for c, v in r.items()} if isinstance(r, Mapping) else {}
