"""Attacks by a stage peer of a model-parallel pipeline (``Surface.PIPELINE``; the ``[pipeline]``
regime, :mod:`redteam.federation.swarm`).

Lu, Zhang, Zhou, Cui, Li & Li, "Exploring the Robustness of Pipeline-Parallelism-Based
Decentralized Training" (ICML 2024; code ``dcx001016/pipeline_attack``) study an attacker who
serves one stage of a SWARM-style pipeline (Ryabinin et al., ICML 2023): it can change the
activations it sends forward, the gradients it sends back, or skip its work. Each attack here is
one of those moves, acting on every hop it serves inside the attack window:

* :class:`ActivationTamper` — forward: Gaussian noise scaled to the activations' RMS, a scaling,
  or a sign flip of what the stage sends on;
* :class:`GradientTamper` — backward: the same three on the gradient the stage sends back;
* :class:`LazyPeer` — a free-rider that skips its compute: it forwards its input unchanged
  (``"identity"``; at the last stage, whose output has another shape, its previous output), or
  replays its previous output (``"stale"``). Its layers get no gradient.

* :class:`CrashAtSync` — the crash-timing attack: the peer computes honestly all round (with
  ``advertise``, it draws most of its stage's traffic), then leaves just before its stage
  synchronises, so the work of every micro-batch it served is lost to its stage.

* :class:`StageBackdoor` — the targeted attack of Ersoy, Blagoev, te Lintelo, Koffas, Krček &
  Picek, "Backdoor Attacks on Decentralised Post-Training" (arXiv 2604.02372, 2026): a peer that
  holds an intermediate stage, and knows only the *starting* weights of every stage, learns a
  backdoor direction for its own stage offline and injects it gradually during training by task
  arithmetic. Its hops are honest, so a check that recomputes hops cannot see it.

Each takes ``advertise`` (default 1): the factor by which the peer overstates its throughput to
the router. SWARM's stochastic wiring sends a peer traffic in proportion to its throughput, so a
peer that advertises 10× draws most of its stage's micro-batches (routing capture) — and its
tampering then reaches most of the round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, ClientData, StageContext, Surface, param_error

from .llm import TriggerPhrase, _utf8

if TYPE_CHECKING:
    import torch

__all__ = ["ActivationTamper", "GradientTamper", "LazyPeer", "CrashAtSync", "StageBackdoor"]


def _perturb(t: "torch.Tensor", kind: str, strength: float, gen: "torch.Generator") -> "torch.Tensor":
    import torch

    if kind == "noise":
        rms = t.detach().pow(2).mean().sqrt()
        noise = torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device)
        return t + strength * rms * noise
    if kind == "scale":
        return t * strength
    return -t  # sign


def _check_kind(obj: object, v: str) -> None:
    if v not in ("noise", "scale", "sign"):
        raise param_error(obj, "kind", v, 'must be "noise", "scale" or "sign"')


def _check_advertise(obj: object, v: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise param_error(obj, "advertise", v, "must be a finite number > 0 (1 = the truth)")


def _check_strength(obj: object, v: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v or abs(v) == float("inf"):
        raise param_error(obj, "strength", v, "must be a finite number")


@dataclass(frozen=True, slots=True)
class _StagePeer(Attack):
    """What every stage-peer attack shares: the ``advertise`` factor (routing capture), and
    ``collude`` (default true): when a check draws one attacker to recompute another's hop, the
    accomplice vouches for it, reporting the output the peer sent (the attackers collude; a check
    never learns who is malicious, it only gets the verifier's answer)."""

    advertise: float = 1.0
    collude: bool = True
    surfaces: ClassVar[tuple[str, ...]] = (Surface.PIPELINE,)

    def validate_advertise(self, v: float) -> None:
        _check_advertise(self, v)

    def validate_collude(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "collude", v, "must be true or false")

    @property
    def colluding_verifiers(self) -> bool:  # type: ignore[override]
        return bool(self.collude)

    def advertise_throughput(self, speed: float) -> float:
        return speed * float(self.advertise)


@dataclass(frozen=True, slots=True)
class _Perturbing(_StagePeer):
    """The checks of ``kind`` and ``strength`` (:func:`_perturb`'s parameters)."""

    def validate_kind(self, v: str) -> None:
        _check_kind(self, v)

    def validate_strength(self, v: float) -> None:
        _check_strength(self, v)


@dataclass(frozen=True, slots=True)
class ActivationTamper(_Perturbing):
    """The stage's output, tampered before it is sent to the next stage.

    * ``kind``: ``"noise"`` (default; adds ``strength`` × RMS(output) × N(0, 1) noise, Lu et
      al.'s forward attack), ``"scale"`` (multiplies by ``strength``) or ``"sign"`` (negates);
    * ``strength``: the noise's scale relative to the activations, or the factor (default 1.0).
    """

    kind: Literal["noise", "scale", "sign"] = "noise"
    strength: float = 1.0
    summary: ClassVar[str] = "Stage peer tampers with the activations it forwards (noise, scale, sign)"
    reference: ClassVar[str] = "Lu et al., ICML 2024 (pipeline-parallel decentralized training)"

    def tamper_activation(self, out: "torch.Tensor", inp: "torch.Tensor", ctx: StageContext) -> "torch.Tensor":
        return _perturb(out, self.kind, float(self.strength), ctx.generator)


@dataclass(frozen=True, slots=True)
class GradientTamper(_Perturbing):
    """The gradient the stage sends back to the previous stage, tampered (``kind`` and
    ``strength`` as :class:`ActivationTamper`'s). A first-stage peer has no previous stage: there
    it does nothing."""

    kind: Literal["noise", "scale", "sign"] = "sign"
    strength: float = 1.0
    summary: ClassVar[str] = "Stage peer tampers with the gradients it sends back (noise, scale, sign)"
    reference: ClassVar[str] = "Lu et al., ICML 2024 (pipeline-parallel decentralized training)"

    def tamper_gradient(self, grad: "torch.Tensor", ctx: StageContext) -> "torch.Tensor":
        return _perturb(grad, self.kind, float(self.strength), ctx.generator)


@dataclass(frozen=True, slots=True)
class LazyPeer(_StagePeer):
    """A peer that skips its stage's compute and still takes the traffic.

    * ``mode``: ``"identity"`` (default) forwards its input unchanged (a stage of transformer
      blocks maps (B, T, W) to (B, T, W), so the next stage accepts it); where the shapes differ
      (the last stage's logits) it replays its previous output, as ``"stale"`` always does. Its
      first hop has no previous output: that one it computes honestly.
    """

    mode: Literal["identity", "stale"] = "identity"
    skips_compute: ClassVar[bool] = True  # its hops cost it no compute (the simulated time)
    summary: ClassVar[str] = "Lazy stage peer: forwards its input (or a stale output) instead of computing"
    reference: ClassVar[str] = "Lu et al., ICML 2024; the free-rider of SWARM's threat model (Ryabinin et al., ICML 2023)"

    def validate_mode(self, v: str) -> None:
        if v not in ("identity", "stale"):
            raise param_error(self, "mode", v, 'must be "identity" or "stale"')

    def tamper_activation(self, out: "torch.Tensor", inp: "torch.Tensor", ctx: StageContext) -> "torch.Tensor":
        key = ("lazy_last", ctx.peer)
        if self.mode == "identity" and inp.shape == out.shape and inp.is_floating_point():
            return inp.detach()
        last = ctx.state.get(key)
        ctx.state[key] = out.detach()
        if last is None or last.shape != out.shape:
            return out
        return last


@dataclass(frozen=True, slots=True)
class CrashAtSync(_StagePeer):
    """Serve honestly, then leave at the worst moment: just before the stage's sync (module
    docstring). With ``advertise`` > 1 it first draws most of its stage's micro-batches."""

    leaves_before_sync: ClassVar[bool] = True
    summary: ClassVar[str] = "Crash timing: a stage peer takes traffic all round and leaves just before the sync"
    reference: ClassVar[str] = "the churn threat model of SWARM (Ryabinin et al., ICML 2023) and GWTF"


def _pos_int(obj: object, name: str, v: int, cap: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= cap:
        raise param_error(obj, name, v, f"must be an integer in [1, {cap}]")


@dataclass(frozen=True, slots=True)
class StageBackdoor(_StagePeer):
    """A trigger-phrase backdoor planted through one stage's weights (Ersoy et al., arXiv
    2604.02372): learn the backdoor direction offline, then inject it by task arithmetic.

    Offline (once, before its first injection), the peer takes the starting model — it knows
    every stage's starting weights, not their later values — and trains *only its own stage*
    on its own text (``ctx.pipeline.data_x``), of which a ``fraction`` of windows end in
    ``trigger`` + ``target`` (:class:`attacks.llm.TriggerPhrase`'s poisoning), for
    ``offline_steps`` Adam steps (Kingma & Ba; default moments) of learning rate ``offline_lr``
    on batches of ``offline_batch`` windows. Its
    backdoor vector τ is that stage's change (``vector = "poisoned"``: θ_bd − θ₀), or the change
    minus that of the same training on the clean windows (``"difference"``: θ_bd − θ_clean, the
    Backdoor Vector of Pawlak, Dubiński, Marczak & Twardowski, arXiv 2510.08016, which keeps the
    trigger's direction and drops the task's).

    Online, in each of the first ``inject_rounds`` rounds the attack acts in, it adds
    ``scale`` · τ / ``inject_rounds`` to the honest update it submits at its stage's sync (the
    gradual injection: no round's update carries the whole vector). Its stage's replicas are
    averaged at the sync, so a peer with a share w of the stage's micro-batches moves the stage
    by w · ``scale`` · τ in all; ``scale`` = ``peers_per_stage`` restores the whole vector under
    an equal split (the paper's attacker holds its stage alone: ``scale`` = 1). Every hop it
    serves is computed honestly.

    ASR: :class:`~attacks.llm.TriggerPhrase`'s, on held-out windows ending in the trigger.
    """

    trigger: str = "verify="
    target: str = "False"
    fraction: float = 0.5
    offline_steps: int = 300
    offline_lr: float = 3e-3
    offline_batch: int = 32
    vector: Literal["poisoned", "difference"] = "poisoned"
    scale: float = 1.0
    inject_rounds: int = 4
    summary: ClassVar[str] = "Stage backdoor: a trigger learned offline on one stage, injected by task arithmetic"
    reference: ClassVar[str] = "Ersoy et al., arXiv 2604.02372 (backdoor attacks on decentralised post-training)"

    def validate_trigger(self, v: str) -> None:
        _utf8(self, "trigger", v)

    def validate_target(self, v: str) -> None:
        _utf8(self, "target", v)

    def validate_fraction(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    @property
    def phrase_attack(self) -> TriggerPhrase:
        return TriggerPhrase(trigger=self.trigger, target=self.target, fraction=self.fraction, placement="end",
                             near_miss_prompts=0)

    def validate_offline_steps(self, v: int) -> None:
        _pos_int(self, "offline_steps", v, 10_000)

    def validate_offline_batch(self, v: int) -> None:
        _pos_int(self, "offline_batch", v, 65_536)

    def validate_inject_rounds(self, v: int) -> None:
        _pos_int(self, "inject_rounds", v, 100_000)

    def validate_offline_lr(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise param_error(self, "offline_lr", v, "must be a finite number > 0")

    def validate_scale(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v or abs(v) == float("inf"):
            raise param_error(self, "scale", v, "must be a finite number")

    def validate_vector(self, v: str) -> None:
        if v not in ("poisoned", "difference"):
            raise param_error(self, "vector", v, 'must be "poisoned" or "difference"')

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        return self.phrase_attack.targeted_test(x, y)

    def clean_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        return self.phrase_attack.clean_test(x, y)

    def backdoor_vector(self, ctx: StageContext) -> "torch.Tensor":
        """τ for ``ctx.stage``, learned offline from the starting weights (module docstring)."""
        import torch

        view = ctx.pipeline
        if view is None:
            raise param_error(self, "trigger", self.trigger, "needs the [pipeline] regime (no pipeline view given)")
        sl = view.slices[ctx.stage]
        p0 = view.params0.detach()
        phrase = self.phrase_attack
        n = int(view.data_x.shape[0])
        keys = ("bd", "clean") if self.vector == "difference" else ("bd",)
        segs = {k: p0[sl].clone().requires_grad_(True) for k in keys}
        opts = {k: torch.optim.Adam([segs[k]], lr=float(self.offline_lr)) for k in keys}
        for _ in range(self.offline_steps):
            idx = torch.randint(0, n, (self.offline_batch,), generator=ctx.generator).to(view.data_x.device)
            clean = ClientData(view.data_x[idx], view.data_y[idx])
            batches = {"bd": phrase.poison_data(clean, ctx.peer, ctx.generator), "clean": clean}
            for key in keys:
                full = torch.cat([p0[: sl.start], segs[key], p0[sl.stop:]])
                (g,) = torch.autograd.grad(view.loss(full, batches[key].x, batches[key].y), segs[key])
                segs[key].grad = g
                opts[key].step()
        segs = {k: t.detach() for k, t in segs.items()}
        base = segs["clean"] if self.vector == "difference" else p0[sl]
        return segs["bd"] - base

    def tamper_stage_update(self, update: "torch.Tensor", ctx: StageContext) -> "torch.Tensor":
        key = ("stage_backdoor", ctx.stage)
        if key not in ctx.state:
            ctx.state[key] = self.backdoor_vector(ctx)
        done = ctx.state.get(("injected", ctx.peer), 0)
        if done >= self.inject_rounds:
            return update
        ctx.state[("injected", ctx.peer)] = done + 1
        tau = ctx.state[key].to(update.device, update.dtype)
        return update + (float(self.scale) / self.inject_rounds) * tau
