"""What each regime supports, declared once: the scenario keys it reads, the attack surfaces and
defense capabilities it wires, and the one rule that refuses the rest.

Four topologies run one round shape (:mod:`redteam.federation.regimes`): data-parallel with a
server (or a tree of sub-aggregators), serverless gossip, an asynchronous buffered server, and a
model-parallel pipeline; a fifth regime runs a user's own Flower app in Flower. They differ in who trains each step, whose rows each merging party sees
and how the merged result moves the model(s) — and so in what they can honour. Each declares that
here (:class:`Support`); the scenario parser (:func:`check_keys`) and the run setup
(:func:`check_plugins`) ask the declaration, so an attack or defense built for one regime is
refused in another by name, in one line, instead of running silently and scoring a threat the
regime never modelled. This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InvalidParameter, InvalidScenario
from .types import Surface

__all__ = ["Support", "DATA_PARALLEL", "GOSSIP", "ASYNC", "PIPELINE", "FLOWER", "REGIMES", "support_of", "regime_section",
           "check_keys", "check_plugins"]


@dataclass(frozen=True, slots=True)
class Support:
    """A regime's declaration.

    * ``name`` / ``section``: how it is named, and the scenario section that selects it (``None``:
      the default, data-parallel);
    * ``surfaces``: the attack surfaces (:class:`~redteam.types.Surface`) it calls; an attack acting
      on another is refused, naming the regime that has it;
    * ``acts_at``: where its defenses may act (``"aggregate"``: a merge party's rows; ``"transport"``,
      ``"admission"``; ``"pipeline"``: a pipeline's hops);
    * ``server_data``: a server holding a root sample (``uses_server_data`` rules);
    * ``model_view``: the round hands the model to the plugins that read it (an attack's
      ``needs_model``, a defense's ``inspects_models``);
    * ``replays_work``, ``commits``, ``validator_reports``: the round offers spot-check replay, a
      commit phase, validator seats;
    * ``broadcast``: one server sends every client of a round the same model before local training,
      and asks the defense for it (a defense's ``prepares_broadcast``, :meth:`~redteam.types.Defense.broadcast`);
    * ``privacy``: ``[privacy]`` (observers of a client's update or of the model, secure aggregation)
      runs in this regime;
    * ``warmup``: ``[scenario] warmup_rounds`` can be computed in this regime;
    * ``fixed``: scenario keys that must keep their default here, with why;
    * ``workloads``: the workloads it can cut (``()``: any).
    """

    name: str
    section: str | None
    surfaces: frozenset[str]
    acts_at: frozenset[str] = frozenset({"aggregate"})
    server_data: bool = False
    model_view: bool = False
    replays_work: bool = False
    commits: bool = False
    validator_reports: bool = False
    broadcast: bool = False
    privacy: bool = False
    warmup: bool = True
    fixed: tuple[tuple[str, Any, str], ...] = ()
    workloads: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"[{self.section}]" if self.section else "data-parallel"


_SAMPLING_FIXED = (("federation.clients_per_round", None, "{why}"),
                   ("federation.attacker_selection", "random", "{why}"))

DATA_PARALLEL = Support(
    "data-parallel", None,
    frozenset({Surface.DATA, Surface.UPDATES, Surface.TRANSPORT, Surface.PROVENANCE, Surface.HIERARCHY,
               Surface.TRAINING}),
    acts_at=frozenset({"aggregate", "transport", "admission"}), server_data=True, replays_work=True, commits=True,
    validator_reports=True, model_view=True, broadcast=True, privacy=True)

GOSSIP = Support(
    "gossip", "gossip", frozenset({Surface.UPDATES, Surface.DATA, Surface.GOSSIP}), warmup=False,
    fixed=(("federation.clients_per_round", None, "every node trains and gossips in every round"),
           ("federation.attacker_selection", "random", "every node trains and gossips in every round"),
           ("federation.malicious_fraction", 0.0, "its attackers are [gossip] attackers (with their placement)"),
           ("scenario.warmup_rounds", 0, "a warm-up is a data-parallel run; every node starts from the workload's "
                                         "model (or [scenario] start_from)")))

ASYNC = Support(
    "async", "async", frozenset({Surface.UPDATES, Surface.DATA, Surface.TRAINING, Surface.ASYNC}), server_data=True,
    model_view=True,
    fixed=(("federation.clients_per_round", None, "every client trains again as soon as it has sent"),
           ("federation.attacker_selection", "random", "every client trains again as soon as it has sent"),
           ("hierarchy.depth", 1, "one server merges"),
           ("transport.codec", "none", "updates travel uncompressed; their upload time comes from the link draws")))

PIPELINE = Support(
    "pipeline", "pipeline", frozenset({Surface.PIPELINE}), acts_at=frozenset({"aggregate", "pipeline"}),
    fixed=(("federation.clients_per_round", None, "its peers take micro-batches by routing"),
           ("federation.attacker_selection", "random", "its peers take micro-batches by routing"),
           ("federation.batching", "auto", "its stages train by their own forward and backward passes, not the "
                                           "clients' batched trainer")),
    workloads=("text",))

#: a user's own Flower app (:mod:`redteam.integrations.flower.run`): its ClientApps train, a Flower
#: strategy aggregates; redteam reaches the clients through mods (update and data attacks) and the
#: server through the strategy (a defense acting at aggregation, on the replies alone). Which
#: [scenario] and [federation] keys it reads is checked with the section
#: (:func:`redteam.integrations.flower.spec.check_document`).
FLOWER = Support("flower", "flower", frozenset({Surface.UPDATES, Surface.DATA}), warmup=False)

#: every regime, the default first
REGIMES: tuple[Support, ...] = (DATA_PARALLEL, GOSSIP, ASYNC, PIPELINE, FLOWER)

def support_of(scenario: Any) -> Support:
    """The regime a parsed :class:`~redteam.scenario.Scenario` runs under."""
    if getattr(scenario, "flower", None) is not None:
        return FLOWER
    if scenario.pipeline is not None:
        return PIPELINE
    if scenario.gossip is not None:
        return GOSSIP
    if scenario.asynchronous is not None:
        return ASYNC
    return DATA_PARALLEL


def regime_section(sections: Mapping[str, Any] | Any) -> Support:
    """The regime a document's sections select (``[gossip]``, ``[async]``, ``[pipeline]``, ``[flower]`` or none);
    two of them in one scenario are refused."""
    named = [s for s in REGIMES[1:] if s.section in sections]
    if len(named) > 1:
        raise InvalidScenario(f"[{named[0].section}] and [{named[1].section}] are two regimes; a scenario takes one")
    return named[0] if named else DATA_PARALLEL


def check_keys(support: Support, values: Mapping[str, Any], file: str) -> None:
    """Refuse, in one line, a scenario key the regime does not read (``values``: dotted path → the
    parsed value; a path not present is at its default)."""
    for path, default, why in support.fixed:
        if path not in values:
            continue
        v = values[path]
        same = v == default if not isinstance(default, float) else (isinstance(v, (int, float)) and float(v) == default)
        if not same:
            section, _, key = path.partition(".")
            want = "unset" if default is None else repr(default)
            raise InvalidScenario(f"{file}: [{section}].{key} = {v!r} does not apply to {support.label} ({why}); "
                                  f"leave it {want}")
    if support.workloads and "workload.name" in values and values["workload.name"] not in support.workloads:
        raise InvalidScenario(f"{file}: [workload].name = {values['workload.name']!r}: the {support.label} regime "
                              f"cuts the {' or '.join(map(repr, support.workloads))} transformer into stages; "
                              "use that workload")


def check_plugins(support: Support, attack_name: str, attack: Any, defense: Any, *,
                  defense_label: str = "") -> None:
    """The one rule: refuse an attack whose surfaces, or a defense whose capabilities, the regime
    does not wire — by name, saying which regime does. ``attack`` and ``defense`` are built plugins
    (their declared capabilities are read, never probed)."""
    if Surface.PRIVACY in attack.surfaces:
        raise InvalidParameter(f"attack {attack_name!r} is a passive privacy observer (it changes nothing in the "
                               "run): name it in [privacy] observers, beside the attack the matrix varies")
    extra = [s for s in attack.surfaces if s not in support.surfaces]
    if extra:
        homes = [r for r in REGIMES if all(s in r.surfaces for s in extra)]
        need = (f"; it needs a [{homes[0].section}] section" if len(homes) == 1 and homes[0].section else
                f"; it runs in {' or '.join(r.label for r in homes)}" if homes else "")
        raise InvalidParameter(f"attack {attack_name!r} acts on {', '.join(extra)}, which the {support.label} regime "
                               f"does not model (it takes {', '.join(sorted(support.surfaces))} attacks){need}")
    homes_of_view = " or ".join(r.label for r in REGIMES if r.model_view)
    if attack.needs_model and not support.model_view:
        raise InvalidParameter(f"attack {attack_name!r} optimises against the model it is sent (needs_model), which "
                               f"the {support.label} regime does not hand to an attack; it runs in {homes_of_view}")
    seats = int(attack.validator_seats or 0)
    for st in defense.parts():
        name = type(st).__name__
        if st.acts_at not in support.acts_at:
            homes = " or ".join(s.label for s in REGIMES if st.acts_at in s.acts_at)
            hint = "; it needs a [pipeline] section" if st.acts_at == "pipeline" else ""
            raise InvalidParameter(f"[defense]: {name} acts at {st.acts_at}, which the {support.label} regime does "
                                   f"not model (it runs in {homes}){hint}")
        if st.prepares_broadcast and not support.broadcast:
            homes = " or ".join(r.label for r in REGIMES if r.broadcast)
            raise InvalidParameter(f"[defense] {defense_label or name}: {name} prepares the model the server sends "
                                   f"each round's clients (prepares_broadcast), and the {support.label} regime has "
                                   f"no such broadcast; it runs in the {homes} regime")
        if st.uses_server_data and not support.server_data:
            raise InvalidParameter(f"[defense] {defense_label or name}: {name} needs server-held data (a root "
                                   f"dataset), and the {support.label} regime has no server holding any; use a rule "
                                   "without server data")
        if st.inspects_models and not support.model_view:
            raise InvalidParameter(f"[defense] {defense_label or name}: {name} inspects the clients' models "
                                   f"(ctx.model), which the {support.label} regime does not offer; it runs in "
                                   f"{homes_of_view}")
        if st.replays_work and not support.replays_work:
            raise InvalidParameter(f"[defense]: {name} replays peers' local training from the round's inputs, which "
                                   f"the {support.label} regime does not record; it runs in the server's synchronous "
                                   "round (no [gossip], [async] or [pipeline] section)")
        if st.commit_reveal and not support.commits:
            raise InvalidParameter(f"[defense]: {name}(commit_reveal = true) needs a commit phase, which the "
                                   f"{support.label} regime does not run")
    if seats > 0:
        validators = max((int(st.validators or 0) for st in defense.parts()), default=0)
        if not support.validator_reports or validators < 1:
            raise InvalidParameter(f"attack {attack_name!r}: validator_seats = {seats} needs validators to sit among "
                                   "(a [defense] gauntlet, in the data-parallel regime); this run has none")
        if seats > validators:
            raise InvalidParameter(f"attack {attack_name!r}: validator_seats = {seats} is more than the defense's "
                                   f"validators = {validators}")
