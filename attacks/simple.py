"""Simple misbehaviours: mimic, free riding, Sybil collusion.

* Mimic: Karimireddy, He & Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets
  via Bucketing", ICLR 2022. Every malicious client copies one honest client i*, chosen
  during a warm-up (default: the first round the attack sees) as the client maximising
  ⟨x_i, z⟩, z the top principal direction of the honest updates' heterogeneity, and then
  kept for the rest of the run by client id, as the authors' code does. Harmless under
  IID data; under non-IID data it over-weights one client's distribution, and no
  distance- or norm-based rule can tell the copies apart.
* Free rider: Fraboni, Vidal & Lorenzi, "Free-rider Attacks on Model Aggregation in
  Federated Learning", AISTATS 2021 (also Lin, Du & Liu, arXiv:1911.12560). A client
  that trains nothing sends a zero update (plain free rider) or the last global update
  it received (stale), optionally disguised with Gaussian noise of std σ·(t + 1)^(−γ).
* Sybil: Fung, Yoon & Beschastnikh, "The Limitations of Federated Learning in Sybil
  Settings", RAID 2020 (FoolsGold): many identities, one objective. Every malicious
  client sends the same update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import broadcast, randn, work

if TYPE_CHECKING:
    import torch

__all__ = ["Mimic", "FreeRider", "Sybil", "mimic_target", "top_direction"]


def top_direction(honest: "torch.Tensor") -> "torch.Tensor":
    """Unit top principal direction z (``work`` precision, (d,)) of the centred honest rows.

    Computed from the small (h, h) Gram matrix: if v is its leading eigenvector (eigenvalue
    λ), z = Cᵀv/√λ with C the centred rows. The sign of an eigenvector is arbitrary; it is
    fixed so that the row farthest along ±z has a positive projection (the paper's
    argmax ⟨x_i, z⟩ then picks the extreme client). Zero when the rows do not vary.
    """
    import torch

    x = work(honest)
    c = x - x.mean(dim=0, keepdim=True)
    if x.shape[0] < 2:
        return torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    top = float(c.abs().max())
    if top > 1e150:  # the Gram would overflow: z is scale-free, so rescale by an exact power of two
        c = c * math.ldexp(1.0, -math.frexp(top)[1])
    gram = (c @ c.T).to(torch.float64)
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    lam = float(evals[-1])
    if lam <= 0:
        return torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    v = evecs[:, -1]
    far = int(torch.argmax(v.abs()))  # lowest index among ties
    if float(v[far]) < 0:
        v = -v
    return (c.T @ v.to(c.dtype)) / math.sqrt(lam)


def mimic_target(honest: "torch.Tensor", z: "torch.Tensor | None" = None) -> int:
    """Index of the honest row maximising ⟨x_i − μ, z⟩ (the same argmax as ⟨x_i, z⟩).

    ``z`` defaults to :func:`top_direction` of these rows (then the row farthest along the
    top principal direction, either way). Ties go to the lowest index.
    """
    import torch

    x = work(honest)
    if x.shape[0] == 1:
        return 0
    if z is None:
        z = top_direction(x)
    proj = ((x - x.mean(dim=0, keepdim=True)) @ z.to(device=x.device, dtype=x.dtype)).to(torch.float64)
    return int(torch.argmax(proj))


@dataclass(frozen=True, slots=True)
class Mimic(Attack):
    """Every malicious client sends a copy of one honest client's update.

    * ``target``: an explicit index into the honest rows the attacker sees
      (``ctx.visible_updates``), used every round; ``None`` (default) picks the victim by
      the paper's rule, below.
    * ``warmup``: rounds of warm-up (default 1, the authors' default). In each warm-up
      round the attacker updates its running estimate z̄ of the top principal direction
      (z̄ ← (t·z̄ + z_t)/(t + 1), z_t the round's top direction with its sign aligned to
      z̄) and re-picks i* = argmax_i ⟨x_i − μ_t, z̄⟩ over that round's honest rows. After
      the warm-up i* is fixed **by client id** (kept in ``ctx.attack_state``) and copied
      every round, whatever the others send.

    The authors' code (``MimicVariantAttacker``) estimates z with one power-iteration
    step per round from a seeded random start and picks argmax ⟨g_i, z⟩, re-picking in
    every warm-up round and then fixing the worker; here z_t is the exact top eigenvector
    (the power iteration's limit), whose arbitrary sign is fixed so that the farthest
    row projects positively (the authors' sign comes from their random start). If the victim does not take part in a
    later round (churn), that round copies the rule's pick among the visible rows and the
    stored victim is kept. Without ``ctx.attack_state`` (an engine that keeps no attack
    memory) the pick is recomputed each round.
    """

    target: int | None = None
    warmup: int = 1
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "Mimic: all malicious clients copy one honest client, chosen in a warm-up"
    reference: ClassVar[str] = "Karimireddy, He & Jaggi, ICLR 2022"

    def validate_target(self, v: int | None) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise param_error(self, "target", v, "must be an integer ≥ 0 (an honest row index) or unset")

    def validate_warmup(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "warmup", v, "must be an integer ≥ 1 (rounds before the victim is fixed)")

    @staticmethod
    def _visible_ids(ctx: AttackContext, h: int) -> tuple[int, ...]:
        ids = tuple(getattr(ctx, "visible_clients", ()) or ())
        if len(ids) == h:
            return ids
        # engines without visible_clients: honest clients in ascending id under full participation
        honest = tuple(c for c in range(ctx.n_clients) if c not in set(ctx.malicious))
        return honest if len(honest) == h else tuple(range(h))

    def victim_row(self, ctx: AttackContext) -> int:
        """The row of ``ctx.visible_updates`` copied this round (updates the warm-up state)."""
        honest = ctx.visible_updates
        h = honest.shape[0]
        state = getattr(ctx, "attack_state", None)
        if state is None:
            return mimic_target(honest)
        ids = self._visible_ids(ctx, h)
        seen = int(state.get("mimic_rounds", 0))
        if seen >= self.warmup and "mimic_victim" in state:
            victim = int(state["mimic_victim"])
            if victim in ids:
                return ids.index(victim)
            return mimic_target(honest, state.get("mimic_z"))
        z_t = top_direction(honest)
        z_bar = state.get("mimic_z")
        if z_bar is None or z_bar.shape != z_t.shape:
            z_bar = z_t
        else:
            z_bar = z_bar.to(device=z_t.device, dtype=z_t.dtype)
            if float(z_t @ z_bar) < 0:
                z_t = -z_t
            z_bar = (seen * z_bar + z_t) / (seen + 1)
        row = mimic_target(honest, z_bar)
        state["mimic_z"] = z_bar.detach().clone()
        state["mimic_rounds"] = seen + 1
        state["mimic_victim"] = int(ids[row])
        return row

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        honest = ctx.visible_updates
        h = honest.shape[0]
        if h == 0:
            raise param_error(self, "target", self.target, "no honest updates are visible to copy")
        if self.target is None:
            i = self.victim_row(ctx)
        elif self.target >= h:
            raise param_error(self, "target", self.target, f"must be < {h} (number of honest updates)")
        else:
            i = self.target
        return broadcast(honest[i], ctx)


@dataclass(frozen=True, slots=True)
class FreeRider(Attack):
    """Send no real work: a zero update or the previous global update, maybe disguised.

    * ``mode``: ``"zero"`` (plain free rider: Δ = 0) or ``"stale"`` (Δ = the previous
      round's global update ``ctx.previous_update``; zero in the first round);
    * ``noise_std`` σ and ``noise_decay`` γ: disguise with N(0, (σ·(t + 1)^(−γ))²·I) per
      client, t the round (Fraboni et al.'s disguised free rider; σ = 0 disables).
    """

    mode: Literal["zero", "stale"] = "zero"
    noise_std: float = 0.0
    noise_decay: float = 0.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Free rider: zero or stale update, optionally disguised with noise"
    reference: ClassVar[str] = "Fraboni, Vidal & Lorenzi, AISTATS 2021"

    def validate_mode(self, v: str) -> None:
        if v not in ("zero", "stale"):
            raise param_error(self, "mode", v, "must be 'zero' or 'stale'")

    def validate_noise_std(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise param_error(self, "noise_std", v, "must be a finite number ≥ 0")

    def validate_noise_decay(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise param_error(self, "noise_decay", v, "must be a finite number ≥ 0")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        if self.mode == "stale" and ctx.previous_update is not None:
            out = broadcast(ctx.previous_update, ctx)
        else:
            out = torch.zeros_like(own)
        if self.noise_std > 0:
            sigma = self.noise_std * (ctx.round + 1) ** (-self.noise_decay)
            out = out + sigma * randn(tuple(own.shape), ctx, own)
        return out


@dataclass(frozen=True, slots=True)
class Sybil(Attack):
    """Every malicious identity sends one shared update.

    * ``source``: ``"mean"`` (default: the mean of the malicious clients' own updates;
      when the scenario also poisons their data these are poisoned updates, so the
      Sybils push one poisoned objective) or ``"first"`` (the first malicious client's
      update, copied to every other identity);
    * ``jitter``: std of independent Gaussian noise added per identity (0 = exact copies,
      the FoolsGold setting; a small jitter evades exact-duplicate checks).
    """

    source: Literal["mean", "first"] = "mean"
    jitter: float = 0.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Sybil collusion: many identities, one (possibly poisoned) update"
    reference: ClassVar[str] = "Fung, Yoon & Beschastnikh, RAID 2020"

    def validate_source(self, v: str) -> None:
        if v not in ("mean", "first"):
            raise param_error(self, "source", v, "must be 'mean' or 'first'")

    def validate_jitter(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise param_error(self, "jitter", v, "must be a finite number ≥ 0")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":

        own = ctx.own_updates
        if own.shape[0] == 0:
            return own.clone()
        shared = work(own).mean(dim=0) if self.source == "mean" else own[0]
        out = broadcast(shared, ctx)
        if self.jitter > 0:
            out = out + self.jitter * randn(tuple(own.shape), ctx, own)
        return out
