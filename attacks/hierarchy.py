"""Hierarchy attacks: a compromised sub-aggregator, and identity grinding into one merge group.

Our analysis of the Byzantine fraction per merge group: with clients in
groups of size g, the Byzantine count per group is hypergeometric, and

* a sub-aggregator (group leader) chosen from the clients is Byzantine with probability
  about F/N, and can then replace its group's whole partial aggregate — ``rogue_aggregator``;
* if group assignment is *predictable* (e.g. a hash of the node id), a Sybil attacker
  tries identities until many land in one group — ``group_grinding``, which turns a minority
  overall into a majority inside one group, where an in-group robust rule then works
  for the attacker. The defenses are a robust rule again at the top
  (f_top ≈ the expected number of compromised groups) and commit-reveal or VRF-seeded
  assignment per round; the Sybil-identity precedent is Douceur, "The Sybil Attack",
  IPTPS 2002.

Both act through ``Surface.HIERARCHY`` (``tamper_subaggregate``, ``choose_identity``); the
trainer's leader rule and hash grouping are documented in :mod:`redteam.merge`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["RogueAggregator", "GroupGrinding"]


@dataclass(frozen=True, slots=True)
class RogueAggregator(Attack):
    """A compromised sub-aggregator replaces the partial aggregate it passes up.

    It controls bottom group ``group`` (an outside aggregator server it compromised) or,
    with ``group`` unset, every bottom group whose leader — its member with the lowest
    client id (:mod:`redteam.merge`) — is a malicious client. The replacement:

    * ``mode="flip"``: −``scale`` × the honest partial aggregate;
    * ``mode="noise"``: the aggregate plus N(0, ``scale``²) per coordinate;
    * ``mode="zero"``: nothing (the group's clients silently lose their vote).

    With the mean at the top, one rogue group moves the global update by its weight
    share times the change; a robust upper defense (median over groups, a norm bound)
    limits that, and rejects the group if it stands out.

    * ``scale``: strength of flip / noise (> 0; default 10, a replacement well outside
      the honest groups' spread);
    * ``group``: the compromised bottom group's index, or unset (leader rule).
    """

    mode: Literal["flip", "noise", "zero"] = "flip"
    scale: float = 10.0
    group: int | None = None
    surfaces: ClassVar[tuple[str, ...]] = (Surface.HIERARCHY,)
    summary: ClassVar[str] = "Compromised sub-aggregator replaces its group's partial aggregate"
    reference: ClassVar[str] = "Lamport, Shostak & Pease, ACM TOPLAS 1982 (a Byzantine merge node)"

    def validate_mode(self, v: str) -> None:
        if v not in ("flip", "noise", "zero"):
            raise param_error(self, "mode", v, "must be 'flip', 'noise' or 'zero'")

    def validate_scale(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "scale", v, "must be a finite number > 0")

    def validate_group(self, v: int | None) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise param_error(self, "group", v,
                              "must be a group index ≥ 0 (or unset: the groups a malicious client leads)")

    def controls(self, group: int, members: tuple[int, ...], ctx: AttackContext) -> bool:
        """Does the attacker hold this group's sub-aggregator?"""
        if self.group is not None:
            return group == self.group
        return bool(members) and min(members) in ctx.malicious

    def tamper_subaggregate(self, aggregate: "torch.Tensor", group: int, members: tuple[int, ...],
                            ctx: AttackContext) -> "torch.Tensor":
        import torch

        if not self.controls(group, members, ctx):
            return aggregate
        if self.mode == "flip":
            return -self.scale * aggregate
        if self.mode == "zero":
            return torch.zeros_like(aggregate)
        g = ctx.generator
        noise = torch.randn(aggregate.shape, generator=g, device=g.device, dtype=torch.float32)
        return aggregate + self.scale * noise.to(device=aggregate.device, dtype=aggregate.dtype)


@dataclass(frozen=True, slots=True)
class GroupGrinding(Attack):
    """Sybil identity grinding into one merge group under predictable (hash) grouping.

    Each malicious client enrolls under the first identity ``"<id>:<j>"`` (j = 0, 1, …)
    whose group, SHA-256(identity) mod groups (:func:`redteam.merge.group_of_identity`),
    is ``target``: an expected ``groups`` hash evaluations each. Under ``grouping="hash"``
    all of them then sit in one group; under ``random`` or ``region`` grouping the
    identity is not read and the grinding buys nothing. What the concentrated clients send
    is the sign-flip attack (−``scale`` × own update; ``scale = 0`` sends honest updates,
    to measure the placement alone).

    * ``target``: the group to concentrate in (taken mod the number of groups);
    * ``scale``: ≥ 0, the sign-flip factor of the updates they send;
    * ``max_tries``: give up (keep the plain id) after this many identities.
    """

    target: int = 0
    scale: float = 1.0
    max_tries: int = 1_000_000
    surfaces: ClassVar[tuple[str, ...]] = (Surface.HIERARCHY, Surface.UPDATES)
    summary: ClassVar[str] = "Grind Sybil identities so hash grouping puts every attacker in one group"
    reference: ClassVar[str] = "Douceur, IPTPS 2002 (Sybil identities); placement grinding against hash-based grouping"

    def validate_target(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "target", v, "must be a group index ≥ 0")

    def validate_scale(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise param_error(self, "scale", v, "must be a finite number ≥ 0")

    def validate_max_tries(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "max_tries", v, "must be an integer ≥ 1")

    def choose_identity(self, client: int, n_groups: int) -> str:
        from redteam.merge import group_of_identity

        if n_groups < 2:
            return str(client)
        want = self.target % n_groups
        for j in range(self.max_tries):
            name = f"{client}:{j}"
            if group_of_identity(name, n_groups) == want:
                return name
        return str(client)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        if self.scale == 0:
            return ctx.own_updates.clone()
        return -self.scale * ctx.own_updates
