"""Composition: several attacks acting together, each on its own surface.

Many published attacks are two techniques at once: model replacement (Bagdasaryan et
al., AISTATS 2020) boosts an update trained on *backdoored data*; constrain-and-scale
scales a poisoned update to just inside a norm bound (Sun et al. 2019; Wang et al.,
"Attack of the Tails", NeurIPS 2020). ``compose`` lets a scenario say exactly that::

    [attack]
    name = "compose"
    attacks = [ { name = "backdoor", target = 0 }, { name = "model_replacement" } ]

Hooks run in the order given: ``poison_data`` chains the data attacks, ``craft_updates``
feeds each update attack the rows the previous one produced (as ``own_updates``), and the
transport, provenance and hierarchy hooks chain likewise; at most one part may shape the
local training (``training_hook``, e.g. ``neurotoxin`` after a ``backdoor`` data part). The composite is omniscient,
adaptive or targeted if any part is, is given the model (``needs_model``) if any part asks for
it, and re-reads its trigger before every evaluation if any part re-optimises one
(``dynamic_trigger``: A3FL and IBA, boosted by ``model_replacement`` for instance); ASR comes
from the first part that defines ``targeted_test``.

**State.** The parts are built once per composition (on first use) and the same objects
serve every hook of the run, so an attack that remembers something keeps it exactly as it
would alone: ``dba`` its client id → local trigger assignment, ``mimic`` its victim. Each
part gets its own memory in ``ctx.attack_state`` (a sub-dict of the run's, under
``"compose.part<i>"``), so two parts never overwrite each other's keys, and the
composition asks the engine for the longest traffic history any part needs
(``history_rounds``: ``replay``, ``mix_and_match``). A composition of one part therefore
behaves exactly as that part alone, round for round.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.errors import RedteamError
from redteam.types import Attack, AttackContext, ClientData, param_error

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class Compose(Attack):
    """Run several attacks together (see the module docstring).

    ``attacks``: the parts, as tables with a ``name`` (default: just ``none``).
    """

    attacks: tuple[Any, ...] = ({"name": "none"},)
    #: the parts, built once (``"parts"``): the memory of stateful parts lives in them
    _built: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    summary: ClassVar[str] = "Several attacks at once, each on its surface (e.g. backdoor + model replacement)"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020 (backdoor + boosting)"

    def validate_attacks(self, v: tuple[Any, ...]) -> None:
        if not isinstance(v, tuple) or not v:
            raise param_error(self, "attacks", v, "must be a non-empty list of attack tables")
        for i, a in enumerate(v):
            if isinstance(a, Attack):
                continue
            if not (isinstance(a, dict) and isinstance(a.get("name"), str)):
                raise param_error(self, f"attacks[{i}]", a, "must be a table with a 'name' (or an Attack)")
            if a["name"] == "compose":
                raise param_error(self, f"attacks[{i}]", a, "compose cannot contain compose")
        try:
            self.parts
        except RedteamError as exc:
            raise param_error(self, "attacks", v, str(exc)) from None

    def __hash__(self) -> int:
        return hash(tuple(repr(a) for a in self.attacks))

    @property
    def parts(self) -> tuple[Attack, ...]:
        """The part attacks, built on first use and the same objects afterwards."""
        parts = self._built.get("parts")
        if parts is None:
            from redteam.registry import ATTACKS

            parts = tuple(
                a if isinstance(a, Attack) else ATTACKS.create(a["name"], {k: x for k, x in a.items() if k != "name"})
                for a in self.attacks
            )
            self._built["parts"] = parts
        return parts

    def _ctx(self, ctx: AttackContext, i: int, **changes: Any) -> AttackContext:
        """``ctx`` as part ``i`` sees it: its own memory (a sub-dict of ``attack_state``)."""
        state = getattr(ctx, "attack_state", None)
        if state is None:  # no context, or an engine that keeps no attack memory
            return dataclasses.replace(ctx, **changes) if changes else ctx
        mine = state.get(f"compose.part{i}")
        if not isinstance(mine, dict):
            mine = state[f"compose.part{i}"] = {}
        return dataclasses.replace(ctx, attack_state=mine, **changes)

    @property
    def history_rounds(self) -> int:  # type: ignore[override]
        """The most rounds of recorded traffic any part needs (``replay``'s ``lag``)."""
        return max((int(p.history_rounds or 0) for p in self.parts), default=0)

    @property
    def surfaces(self) -> tuple[str, ...]:  # type: ignore[override]
        seen: list[str] = []
        for p in self.parts:
            for s in p.surfaces:
                if s not in seen:
                    seen.append(s)
        return tuple(seen)

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return any(p.omniscient for p in self.parts)

    @property
    def capabilities(self) -> tuple[str, ...]:  # type: ignore[override]
        """What the parts hold (enrolled keys, the log key), for provenance attacks."""
        caps: list[str] = []
        for p in self.parts:
            caps.extend(c for c in p.capabilities if c not in caps)
        return tuple(caps)

    @property
    def adaptive(self) -> bool:  # type: ignore[override]
        return any(p.adaptive for p in self.parts)

    @property
    def produces_nonfinite(self) -> bool:  # type: ignore[override]
        return any(p.produces_nonfinite for p in self.parts)

    @property
    def validator_seats(self) -> int:  # type: ignore[override]
        """The seats of the part that holds validator seats (at most one may)."""
        return max((int(p.validator_seats or 0) for p in self.parts), default=0)

    @property
    def skips_compute(self) -> bool:  # type: ignore[override]
        return any(p.skips_compute for p in self.parts)

    @property
    def leaves_before_sync(self) -> bool:  # type: ignore[override]
        return any(p.leaves_before_sync for p in self.parts)

    @property
    def colluding_verifiers(self) -> bool:  # type: ignore[override]
        return any(p.colluding_verifiers for p in self.parts)

    @property
    def needs_model(self) -> bool:  # type: ignore[override]
        """The context carries the model and the attackers' own data when any part asks for them
        (A3FL, IBA, Chameleon, 3DFed search against the model they are sent)."""
        return any(p.needs_model for p in self.parts)

    @property
    def dynamic_trigger(self) -> bool:  # type: ignore[override]
        """``targeted_test`` is asked again before every evaluation when any part re-optimises its
        trigger (for a static part that answers first, asking again gives the same trigger)."""
        return any(p.dynamic_trigger for p in self.parts)

    def report_scores(self, peers: tuple[int, ...], scores: "torch.Tensor", own: tuple[int, ...]) -> "torch.Tensor":
        for p in self.parts:
            if int(p.validator_seats or 0) > 0:
                return p.report_scores(peers, scores, own)
        return super(Compose, self).report_scores(peers, scores, own)

    def _first(self, method: str, x: "torch.Tensor", y: "torch.Tensor") -> Any:
        for p in self.parts:
            got = getattr(p, method)(x, y)
            if got is not None:
                return got
        return None

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> Any:
        """The first targeted part's test inputs (``None`` when no part is targeted)."""
        return self._first("targeted_test", x, y)

    def clean_test(self, x: "torch.Tensor", y: "torch.Tensor") -> Any:
        return self._first("clean_test", x, y)

    def near_miss_test(self, x: "torch.Tensor", y: "torch.Tensor") -> Any:
        return self._first("near_miss_test", x, y)

    def targeted_parts(self, x: "torch.Tensor", y: "torch.Tensor") -> Any:
        return self._first("targeted_parts", x, y)

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        for p in self.parts:
            data = p.poison_data(data, client, generator)
        return data

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        rows = ctx.own_updates
        for i, p in enumerate(self.parts):
            if "updates" in p.surfaces:
                rows = p.craft_updates(self._ctx(ctx, i, own_updates=rows))
        return rows

    def tamper_chunks(self, deliveries: list, ctx: AttackContext) -> list:
        for i, p in enumerate(self.parts):
            deliveries = p.tamper_chunks(deliveries, self._ctx(ctx, i))
        return deliveries

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        for i, p in enumerate(self.parts):
            manifest = p.forge_provenance(manifest, self._ctx(ctx, i))
        return manifest

    def choose_identity(self, client: int, n_groups: int) -> str:
        for p in self.parts:
            if "hierarchy" in p.surfaces:
                return p.choose_identity(client, n_groups)
        return str(client)

    def training_hook(self, ctx: AttackContext) -> Any:
        """The hook of the part acting on the training surface (at most one may)."""
        shaping = [(i, p) for i, p in enumerate(self.parts) if "training" in p.surfaces]
        if len(shaping) > 1:
            raise param_error(self, "attacks", tuple(type(p).__name__ for _, p in shaping),
                              "at most one part may shape the local training (Surface.TRAINING)")
        if not shaping:
            return None
        i, p = shaping[0]
        return p.training_hook(self._ctx(ctx, i))

    def tamper_subaggregate(self, aggregate: "torch.Tensor", group: int, members: tuple[int, ...],
                            ctx: AttackContext) -> "torch.Tensor":
        for i, p in enumerate(self.parts):
            aggregate = p.tamper_subaggregate(aggregate, group, members, self._ctx(ctx, i))
        return aggregate
