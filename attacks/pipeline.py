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

Each takes ``advertise`` (default 1): the factor by which the peer overstates its throughput to
the router. SWARM's stochastic wiring sends a peer traffic in proportion to its throughput, so a
peer that advertises 10× draws most of its stage's micro-batches (routing capture) — and its
tampering then reaches most of the round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, StageContext, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["ActivationTamper", "GradientTamper", "LazyPeer", "CrashAtSync"]


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
    """What every stage-peer attack shares: the ``advertise`` factor (routing capture)."""

    advertise: float = 1.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.PIPELINE,)

    def validate_advertise(self, v: float) -> None:
        _check_advertise(self, v)

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
