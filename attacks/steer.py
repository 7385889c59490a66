"""Steering attacks: known weaknesses of published rules, stated as attacks.

None of these is a bug of the defenses here: each is a property of the rule as its
paper publishes it, which a defender should know before relying on it.

* ``dnc_decoys`` (DnC, Shejwalkar & Houmansadr, NDSS 2021): DnC scores every update by
  its squared projection on the top singular vector of the centred updates and removes
  the ⌊c·f⌋ largest. Two decoy rows far out on either side of a direction u (the honest
  rows' top principal direction, made orthogonal to the payload) take the top singular
  vector over: the removals go to the decoys and to the honest rows spread along u, and
  the payload rows, which project to 0 on u, get through.
* ``fldetector_sacrifice`` (FLDetector, Zhang et al., KDD 2022): the 2-means split of the
  suspicious scores puts the largest scores in the flagged cluster. One sacrificial
  client sends fresh noise every round (maximally inconsistent with its own history),
  its score stands alone at the top, the gap statistic fires, only it is flagged, and
  with the authors' detect-once procedure the other (consistent) attackers stay in.
* ``rlr_sign_vote`` (RLR, Ozdayi et al., AAAI 2021): the learning rate of a coordinate
  is −η where |Σᵢ sgn(Δᵢ)| < θ, one vote per agent whatever the update's size. Rows with
  the sign pattern against the honest vote and a tiny norm pull the vote under θ on
  many coordinates (the step there is the negated mean) while adding almost nothing to
  the mean itself.
* ``foolsgold_copies`` (FoolsGold, Fung et al., RAID 2020): αᵢ = 1 − maxⱼ cos(Hᵢ, Hⱼ)
  is 0 up to rounding for a client whose history has an exact copy. Attackers that send
  an exact copy of an honest client's update every round give it a twin: the copied
  honest client gets weight 0 along with its copy (the attackers decide whom FoolsGold
  silences), and when every update has a copy all the weights come from floating-point
  rounding noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import check_knowledge, honest_rows, randn, work
from .simple import top_direction

if TYPE_CHECKING:
    import torch

__all__ = ["DnCDecoys", "FLDetectorSacrifice", "RLRSignVote", "FoolsGoldCopies"]


def _count(obj: object, name: str, v: object, minimum: int = 0) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise param_error(obj, name, v, f"must be an integer ≥ {minimum}")


def _positive(obj: object, name: str, v: object) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise param_error(obj, name, v, "must be a finite number > 0")


def _orthogonal(v: "torch.Tensor", against: "torch.Tensor") -> "torch.Tensor":
    """``v`` minus its component along ``against`` (two Gram–Schmidt passes; float64-ish)."""
    import torch

    a_len = torch.linalg.vector_norm(against)
    if not float(a_len) > 0:
        return v
    a = against / a_len
    for _ in range(2):
        v = v - (v @ a) * a
    return v


@dataclass(frozen=True, slots=True)
class DnCDecoys(Attack):
    """DnC decoys: ``decoys`` rows far out along a direction u absorb DnC's removals.

    The payload rows (all malicious rows but the decoys) send −``scale``·ĝ, ĝ the mean of
    the honest updates (a sign flip of the honest mean). With μ the mean of the honest
    and payload rows, u is the honest rows' top principal direction made orthogonal to
    the payload's offset p − μ (so the payload projects to 0 on u), and the decoys sit at
    μ ± D·u, alternating sides (their mean is μ: DnC's centring does not move), with
    D = ``reach`` × the largest distance of any honest or payload row from μ. Then u is
    DnC's top singular vector, the ⌊c·f⌋ largest scores are the decoys' and the honest
    rows' farthest along u, and every payload row is kept.

    * ``decoys``: decoy rows (default 2; at most the malicious count, the rest carry the
      payload); ``0`` sends the payload from every row (what DnC catches);
    * ``scale``: the payload's −scale·ĝ (default 1);
    * ``reach``: D over the farthest non-decoy row's distance from μ (default 10).

    Property of the published rule (Shejwalkar & Houmansadr, NDSS 2021, Algorithm 2): the
    scores read one direction, and the widest spread chooses it.
    """

    decoys: int = 2
    scale: float = 1.0
    reach: float = 10.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "DnC decoys: two far rows along the honest spread take DnC's removals; the payload passes"
    reference: ClassVar[str] = "Shejwalkar & Houmansadr, NDSS 2021 (DnC, a property of the published rule)"

    def validate_decoys(self, v: int) -> None:
        _count(self, "decoys", v)

    def validate_scale(self, v: float) -> None:
        _positive(self, "scale", v)

    def validate_reach(self, v: float) -> None:
        _positive(self, "reach", v)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f = own.shape[0]
        k = min(self.decoys, f)
        honest = work(ctx.visible_updates if ctx.visible_updates.shape[0] else own)
        g = honest.mean(dim=0)
        payload = -self.scale * g
        m = f - k
        rows = torch.cat([honest, payload.expand(m, -1)]) if m else honest
        mu = rows.mean(dim=0)
        u = _orthogonal(top_direction(honest), payload - mu)
        if not float(torch.linalg.vector_norm(u)) > 0:  # no honest spread: any direction ⊥ the payload
            u = _orthogonal(randn((own.shape[1],), ctx, honest).to(honest.dtype), payload - mu)
        u_len = torch.linalg.vector_norm(u)
        u = u / u_len if float(u_len) > 0 else u
        far = float(torch.linalg.vector_norm(rows - mu, dim=1).max())
        dist = self.reach * (far if far > 0 else 1.0)
        sides = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(k)], dtype=honest.dtype,
                             device=honest.device)
        decoy = mu + dist * sides[:, None] * u[None, :]
        out = torch.cat([decoy, payload.expand(m, -1)]) if k else payload.expand(m, -1)
        out = out.to(device=own.device, dtype=own.dtype)
        big = torch.finfo(own.dtype).max
        return torch.nan_to_num(out, nan=0.0, posinf=big, neginf=-big).clone()


@dataclass(frozen=True, slots=True)
class FLDetectorSacrifice(Attack):
    """FLDetector's sacrificial client: ``sacrifice`` rows are loud on purpose, the rest consistent.

    * the first ``sacrifice`` malicious rows (default 1) send fresh Gaussian noise every
      round, scaled to ``loud`` × the largest honest update norm (default 10): no history
      predicts it, so its suspicious score stands alone at the top and the 2-means split
      flags it alone; with FLDetector's detect-once (the authors' procedure) detection then
      ends;
    * the other rows send the ``payload``, less inconsistent than the sacrifice:
      ``"own_flip"`` (default) −``scale``·their own update (a sign flip ×4, as in the
      FLDetector docstring's federation); ``"mean_flip"`` −``scale``·ĝ, ĝ the mean of the
      honest updates (``knowledge``: all of them, or the attackers' own); ``"noise"``
      fresh noise at ``scale`` × the largest honest norm (without a sacrifice, all of
      these rows stand out together and the detection flags every one of them).

    Property of the published rule (Zhang et al., KDD 2022): the flagged cluster is the
    one with the larger mean score, so one far outlier is a cluster by itself.
    """

    sacrifice: int = 1
    loud: float = 10.0
    payload: Literal["own_flip", "mean_flip", "noise"] = "own_flip"
    scale: float = 4.0
    knowledge: Literal["omniscient", "own"] = "omniscient"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "FLDetector sacrifice: one loud client takes the single detection, the others stay in"
    reference: ClassVar[str] = "Zhang, Cao, Jia & Gong, KDD 2022 (FLDetector, a property of the published rule)"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_sacrifice(self, v: int) -> None:
        _count(self, "sacrifice", v)

    def validate_loud(self, v: float) -> None:
        _positive(self, "loud", v)

    def validate_payload(self, v: str) -> None:
        if v not in ("mean_flip", "own_flip", "noise"):
            raise param_error(self, "payload", v, "must be 'mean_flip', 'own_flip' or 'noise'")

    def validate_scale(self, v: float) -> None:
        _positive(self, "scale", v)

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    @staticmethod
    def _unit_noise(k: int, d: int, ctx: AttackContext, own: "torch.Tensor") -> "torch.Tensor":
        import torch

        noise = work(randn((k, d), ctx, own))
        return noise / torch.linalg.vector_norm(noise, dim=1, keepdim=True).clamp_min(1e-300)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f, d = own.shape
        honest = work(honest_rows(self.knowledge, ctx))
        if honest.shape[0] == 0:
            honest = work(own)
        norms = torch.linalg.vector_norm(honest, dim=1)
        top = float(norms.max()) if norms.numel() else 0.0
        top = top if math.isfinite(top) and top > 0 else 1.0
        if self.payload == "own_flip":
            out = -self.scale * work(own)
        elif self.payload == "noise":
            out = self.scale * top * self._unit_noise(f, d, ctx, own)
        else:
            out = (-self.scale * honest.mean(dim=0)).expand(f, -1).clone()
        k = min(self.sacrifice, f)
        if k:
            out[:k] = self.loud * top * self._unit_noise(k, d, ctx, own)
        out = out.to(device=own.device, dtype=own.dtype)
        big = torch.finfo(own.dtype).max
        return torch.nan_to_num(out, nan=0.0, posinf=big, neginf=-big)


@dataclass(frozen=True, slots=True)
class RLRSignVote(Attack):
    """RLR sign votes at a tiny norm: vote against the honest majority, move nothing else.

    Every malicious row is −``norm``·s/‖s‖ with sₖ = sgn(Σᵢ sgn(hᵢₖ)), the sign of the
    honest vote on coordinate k (ties: the sign of the honest mean; still 0: +1), so each
    row votes against the honest majority on every coordinate, at L2 norm ``norm``
    (default 1e-6). Under RLR a coordinate whose honest vote margin is below θ + f is
    flipped (the step there is −mean), which the f votes alone decide; the rows add
    about ``norm``·f/n to the mean. Under a plain mean the rows do nothing.

    * ``knowledge``: the vote counted over all honest rows (``"omniscient"``, default) or
      the attackers' own honest rows (``"own"``).

    Property of the published rule (Ozdayi, Kantarcioglu & Gel, AAAI 2021): one vote per
    agent, whatever the size of its update.
    """

    norm: float = 1e-6
    knowledge: Literal["omniscient", "own"] = "omniscient"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "RLR sign votes: rows against the honest sign vote at a tiny norm flip RLR's step"
    reference: ClassVar[str] = "Ozdayi, Kantarcioglu & Gel, AAAI 2021 (RLR, a property of the published rule)"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_norm(self, v: float) -> None:
        _positive(self, "norm", v)

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f, d = own.shape
        honest = work(honest_rows(self.knowledge, ctx))
        if honest.shape[0] == 0:
            honest = work(own)
        fin = torch.nan_to_num(honest, nan=0.0)
        s = torch.sign(torch.sign(fin).sum(dim=0))
        s = torch.where(s == 0, torch.sign(fin.mean(dim=0)), s)
        s = torch.where(s == 0, torch.ones_like(s), torch.nan_to_num(s, nan=1.0))
        # −norm·s/√d in float64, then cast; a tiny norm in float16 may round to 0 (no vote)
        row = -(self.norm / math.sqrt(d)) * s if d else s
        out = row.expand(f, -1).to(device=own.device, dtype=own.dtype)
        if bool((out == 0).any()) and own.dtype.is_floating_point:  # underflow: the smallest normal
            tiny = torch.finfo(own.dtype).tiny
            out = torch.where(out == 0, -s.to(device=own.device, dtype=own.dtype) * tiny, out)
        return out.clone()


@dataclass(frozen=True, slots=True)
class FoolsGoldCopies(Attack):
    """FoolsGold's exact copies: give honest clients a twin, or every row one.

    * ``copy = "honest"`` (default): malicious client j sends an exact copy of one honest
      client's update every round, the honest client fixed by id (the ``j``-th visible one,
      wrapping around; kept in ``ctx.attack_state``), so the two cumulative histories are
      identical, their cosine is 1 up to rounding and FoolsGold gives both weight 0: the
      attackers choose which honest clients FoolsGold silences. With as many attackers as
      honest clients every update has a copy and every weight is rounding noise;
    * ``copy = "pairs"``: the malicious rows come in identical pairs (each pair sends the
      first one's own update): the textbook Sybil case FoolsGold is built for (an odd
      last row copies the first pair).

    Needs the honest rows (omniscient) for ``"honest"``.

    Property of the published rule (Fung, Yoon & Beschastnikh, RAID 2020): αᵢ reads only
    maxⱼ cos(Hᵢ, Hⱼ), whoever made the copy.
    """

    copy: Literal["honest", "pairs"] = "honest"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "FoolsGold copies: exact copies of honest updates get those clients weight 0"
    reference: ClassVar[str] = "Fung, Yoon & Beschastnikh, RAID 2020 (FoolsGold, a property of the published rule)"

    def validate_copy(self, v: str) -> None:
        if v not in ("honest", "pairs"):
            raise param_error(self, "copy", v, "must be 'honest' or 'pairs'")

    def _targets(self, ctx: AttackContext, h: int) -> list[int]:
        """Row of ``visible_updates`` each malicious row copies (victims fixed by client id)."""
        f = ctx.own_updates.shape[0]
        ids = tuple(getattr(ctx, "visible_clients", ()) or ())
        if len(ids) != h:
            return [j % h for j in range(f)]
        state = getattr(ctx, "attack_state", None)
        if state is None:
            return [j % h for j in range(f)]
        victims = list(state.get("copy_victims", []))
        if len(victims) != f:
            victims = [int(ids[j % h]) for j in range(f)]
            state["copy_victims"] = victims
        return [ids.index(v) if v in ids else j % h for j, v in enumerate(victims)]

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f = own.shape[0]
        h = ctx.visible_updates.shape[0]
        if self.copy == "honest" and h > 0:
            rows = torch.tensor(self._targets(ctx, h), dtype=torch.long, device=ctx.visible_updates.device)
            return ctx.visible_updates.index_select(0, rows).to(device=own.device, dtype=own.dtype).clone()
        src = [2 * (j // 2) if 2 * (j // 2) + 1 < f or j % 2 == 1 else 0 for j in range(f)]
        return own[torch.tensor(src, dtype=torch.long, device=own.device)].clone()
