"""Attacks that exploit staleness on an asynchronous server (the ``[async]`` regime,
:mod:`redteam.federation.asyncrun`).

An asynchronous server (FedBuff, Nguyen et al., AISTATS 2022; asynchronous DiLoCo, Liu et al.
2024) merges each update with a weight s(τ) that falls with its staleness τ (server steps since
the model version it was computed from), drops updates staler than a bound, and steps once every K
arrivals. Each attack here uses one of those three facts. Their rows are ``Surface.UPDATES``
(``craft_updates``, so they also run, as plain update attacks, in the synchronous regime); the
timing and the claimed base version are ``Surface.ASYNC`` (:meth:`~redteam.types.Attack.async_send`).

* :class:`StaleReplay` — resends an old pseudo-gradient as if it were fresh: each attacker keeps
  its own honest updates and sends, instead of its current one, ``boost`` × the one it computed
  ``lag`` versions before its current base (``lag = 0``: the first it ever computed, the update of
  the untrained model), claiming the current version so that the server weighs it s(0) = 1 and never
  drops it as stale. Replayed again and again, one old direction drifts the model along it.
* :class:`VersionLie` — claims a fresher base version than it trained from (the current one,
  τ = 0), so that its (sign-flipped, × ``scale``) update gets weight 1 where an honest update of
  the same age gets s(τ) < 1. A server that records which version it served each client
  (``[async] trust_claims = false``) is not fooled.
* :class:`TimedDelay` — holds its (sign-flipped, × ``scale``) update back until ``gather``
  attackers (default all) hold one, and releases them together right after a server step, so
  that they land in the same buffer of K rows, where they are a larger share (up to all f of K)
  than of the clients (f of n): a robust rule's breakdown point is per buffer. With
  ``target_version`` they wait for that version as well. Claims are truthful; an update about to
  exceed ``[async] max_staleness`` is released at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.types import Attack, AsyncContext, AsyncSend, AttackContext, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["StaleReplay", "VersionLie", "TimedDelay"]


def _check_scale(obj: object, name: str, v: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise param_error(obj, name, v, "must be a finite number > 0")


@dataclass(frozen=True, slots=True)
class StaleReplay(Attack):
    """Resend ``boost`` × an old own update (``lag`` versions back; 0: the first), claimed fresh."""

    lag: int = 0
    boost: float = 1.0
    claim_fresh: bool = True
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES, Surface.ASYNC)
    summary: ClassVar[str] = "async: replay an old pseudo-gradient inside the staleness window, claimed as fresh"
    reference: ClassVar[str] = "staleness of FedBuff (Nguyen et al., AISTATS 2022); replay as in Zeno++'s threat model"

    def validate_lag(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "lag", v, "must be an integer ≥ 0 (0: the first update it computed)")

    def validate_boost(self, v: float) -> None:
        _check_scale(self, "boost", v)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        memory = ctx.attack_state.setdefault("stale_replay", {})
        out = torch.empty_like(ctx.own_updates)
        for k, c in enumerate(ctx.malicious):
            kept = memory.setdefault(int(c), [])  # [(round, row)], oldest first
            kept.append((int(ctx.round), ctx.own_updates[k].detach().clone()))
            if self.lag == 0:
                del kept[1:-1]  # the first and the latest are all it needs
                old = kept[0][1]
            else:
                want = int(ctx.round) - self.lag
                fit = [row for r, row in kept if r <= want]
                old = fit[-1] if fit else kept[0][1]
                while len(kept) > 1 and kept[1][0] <= want:
                    kept.pop(0)
            out[k] = self.boost * old.to(out.dtype)
        return out

    def async_send(self, ctx: AsyncContext) -> AsyncSend | None:
        return AsyncSend(claimed_version=ctx.version) if self.claim_fresh else None


@dataclass(frozen=True, slots=True)
class VersionLie(Attack):
    """Send −``scale`` × its update (``flip``; else × ``scale``), claiming the current version (τ = 0)."""

    scale: float = 1.0
    flip: bool = True
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES, Surface.ASYNC)
    summary: ClassVar[str] = "async: claim a fresher base version than it trained from (staleness weight 1)"
    reference: ClassVar[str] = "staleness weighting of FedBuff (Nguyen et al., AISTATS 2022)"

    def validate_scale(self, v: float) -> None:
        _check_scale(self, "scale", v)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        return (-self.scale if self.flip else self.scale) * ctx.own_updates

    def async_send(self, ctx: AsyncContext) -> AsyncSend | None:
        return AsyncSend(claimed_version=ctx.version)


@dataclass(frozen=True, slots=True)
class TimedDelay(Attack):
    """Hold −``scale`` × its update until ``gather`` attackers hold one, then land together
    right after a server step (and at ``target_version`` or later when set)."""

    scale: float = 1.0
    flip: bool = True
    gather: int = 0
    target_version: int | None = None
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES, Surface.ASYNC)
    summary: ClassVar[str] = "async: colluders hold their updates to land together in one buffer of K"
    reference: ClassVar[str] = "buffered aggregation of FedBuff (Nguyen et al., AISTATS 2022)"

    def validate_scale(self, v: float) -> None:
        _check_scale(self, "scale", v)

    def validate_gather(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "gather", v, "must be an integer ≥ 0 (0: every attacker)")

    def validate_target_version(self, v: int | None) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise param_error(self, "target_version", v, "must be an integer ≥ 0 (or unset)")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        return (-self.scale if self.flip else self.scale) * ctx.own_updates

    def async_send(self, ctx: AsyncContext) -> AsyncSend | None:
        if ctx.max_staleness is not None and ctx.version - ctx.trained_from >= ctx.max_staleness:
            return None  # any later and the server drops it as stale
        if ctx.state.get("timed_delay.release") == ctx.version:
            return None  # the colluders go together: the first of them opened this version's release
        need = self.gather or len(ctx.attackers)
        ready = len(ctx.holding) >= min(need, len(ctx.attackers))
        if ready and ctx.buffered == 0 and (self.target_version is None or ctx.version >= self.target_version):
            ctx.state["timed_delay.release"] = ctx.version
            return None
        return AsyncSend(hold=True)
