"""The defender's summary: which defense to deploy, and at what cost (issue 11 §1, issue 18 §1–2).

A defender reads the first lines and picks a rule, so the summary ranks by what a deployment
lives with, in the workload's own metric, and says when the data cannot tell defenses apart.
Per settings group (a matrix with ``[matrix.settings]`` axes has several) and per defense:

* **quality**: the workload's own measure, with its direction: test accuracy for a classifier
  (higher is better; the mean of the last k evaluations when ``[federation] last_k`` > 1, as the
  robustness papers report it), **bits per byte** for a language model (lower is better);
* **clean**: the quality of its no-attack baseline runs (same defense, settings and seeds), mean
  over seeds with its interval; **cost vs mean**: what it pays against plain ``mean`` when
  nobody attacks (positive = worse), in the same unit;
* **worst quality under attack**: the worst seed-mean quality over the matrix's attacks (the
  no-attack cells excluded, whatever their label), and which attack; beside it the worst
  **drop** from its own baseline (accuracy drop, or bits-per-byte increase) for reference only;
* **worst ASR**: the largest seed-mean attack success rate over the targeted attacks;
* **detection** (only where the rule can reject): the smallest recall and largest FPR.

**Harm** (what the ranking uses) is the larger of two shares in [0, 1]:

* the quality the worst attack takes away, in absolute terms: (best clean quality in the group
  − the defense's worst quality under attack) / (best clean quality − the untrained level),
  where the *untrained level* is the better of the untrained model and the majority-class rate
  (for a loss: the better of the untrained model's loss and the unigram rate, predicting every
  target by its training frequency; every regime evaluates them once per run); 0 = as good as
  the best clean model, 1 = no better than a model that never trained;
* the worst ASR.

A defense whose model an attack destroyed (a non-finite loss, a refused step) has harm 1 there.
Because harm is measured from the best *clean* quality, not from the defense's own baseline, a
rule that never learns cannot win by "losing nothing", and because ASR is a co-equal term, a rule
that leaks a backdoor as badly as plain averaging cannot be the pick against a matrix with one.

**Does not train here**: a defense whose clean quality closes less than
:data:`TRAIN_SHARE` of the gap the best clean defense closes above the untrained level is
listed apart and not ranked. Without an untrained evaluation in the store (stores made before
it), the flag is not applied and a note says so.

**Ranking** (:data:`RANK_RULE`): trained defenses by harm, smallest first (3 decimals); ties by the
mean recall over the attacked cells (a gate that stops more attacks first; 0 for rules that do
not reject), then by clean quality; defenses still tied share a rank (never matrix order). A
defense with unfinished attacked cells ranks after the complete ones. **Noise**: with ≥ 2 seeds,
every defense whose harm interval (95 %, Student t, from the cell that sets its harm) overlaps
the leader's is marked ``≈1``: the data cannot tell it from the leader. With one seed the first
line says that nothing is tested against noise, and the rule compares its figures (harm or the
declared metric, mean recall, clean quality) in steps of :data:`ONE_SEED_STEP` instead of at 3
decimals: defenses whose figures fall in the same steps share a rank, so no rank rests on a
difference one seed cannot show (0.443 against 0.442 mean recall). The **Pareto set** over (worst quality under
attack, worst ASR, clean quality) is named in the notes.

**A declared defender metric** (``[matrix] defender_metric``, e.g. ``cheat_reward_ratio`` for a
rewarding validator whose cheats want payment, not damage): the scenario says which figure its
defender lives with, so the ranking follows it instead of harm. Per defense, its **worst seed mean
of that metric over the attacks** (the direction, from :data:`redteam.scoring.HIGHER_IS_BETTER`,
says which end is worst: the largest of a lower-is-better metric), with the 95 % interval of that
cell and the attack; trained defenses ranked by it, best first (3 decimals), ties by mean recall
then clean quality as above; ``≈1`` when that interval overlaps the leader's. Harm, clean quality
and the other worst cases stay in the table as context, and a defense that does not train here
is still listed apart, unranked. A group where the metric is undefined in every attacked cell
is ranked by harm, and its headline says so.

**Headline**: the first lines name the pick, those indistinguishable from it, the defenses that
do not train, the attacks no defense here stops (every trained defense leaves an ASR ≥
``asr_level`` or loses at least half the learnable quality), and destroyed models.

**Which rules can reject** is decided from the data: a defense none of whose runs (every
attack, settings group and seed, the baselines included) flagged a single update does not
reject, and its detection figures read ``n/a (does not reject)``; one that flagged anything
anywhere keeps its figures everywhere (a recall of 0 is then a miss).

Everything is computed once, from the store's rows, by :func:`defender_summary`; the writers
(terminal, Markdown, HTML, JSON) only format it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from ..scoring import HIGHER_IS_BETTER, mean_ci
from .aggregate import DETECTION_RATES, CellSummary, Stat, _num, _settings, rejects

__all__ = [
    "RANK_RULE",
    "HARM_RULE",
    "REJECT_RULE",
    "NO_REJECT",
    "TRAIN_SHARE",
    "Quality",
    "DefenderRow",
    "DefenderGroup",
    "DefenderSummary",
    "DETECTION_RATES",
    "defender_summary",
    "declared_metric",
    "declared_rank_rule",
    "defender_headline",
    "reference_label",
    "no_attack_labels",
    "rejects",
    "na_note",
    "defender_columns",
    "defender_notes",
    "defenders_dict",
    "print_defenders",
]

Settings = tuple[tuple[str, Any], ...]

RANK_RULE = ("ranked by harm (smallest first): the larger of the worst attack's share of the learnable quality "
             "lost, measured from the best clean defense, and the worst ASR; ties by mean recall, then clean "
             "quality; still tied = same rank")
HARM_RULE = ("harm = max((best clean − worst under attack) / (best clean − untrained level), worst ASR); "
             "0 = as good as the best clean model and no backdoor, 1 = no better than an untrained model or a "
             "backdoor that always fires")
REJECT_RULE = ("n/a (does not reject): no run of that defense in this matrix flagged any update (tp + fp = 0 "
               "everywhere, baselines included), as for aggregators that weigh every update by design")
NO_REJECT = "n/a (does not reject)"
#: Rates that read "n/a" for a defense that does not reject (the tp/fp/tn/fn counts stay as they are).
#: A defense trains here when its clean quality closes at least this share of the best clean
#: defense's gap above the untrained level.
TRAIN_SHARE = 0.2
#: An attack is "stopped" by a defense that keeps its ASR below this and loses under half the quality.
STOP_ASR = 0.5
#: With one seed, the ranking's figures are compared in steps of this size (at 3 decimals with more)
ONE_SEED_STEP = 0.05
#: Bits per byte of a uniform guess over 256 byte values: the floor of an older store's language model.
UNIFORM_BYTE_BITS = 8.0


@dataclass(frozen=True, slots=True)
class Quality:
    """The workload's own measure: which metric, its unit and direction."""

    metric: str  # the attacked run's metric (final_accuracy_last_k or final_bits_per_byte)
    drop_metric: str  # the drop from the defense's own baseline (accuracy_drop or bits_per_byte_increase)
    label: str  # "accuracy" / "bits per byte"
    higher_is_better: bool

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher_is_better else a < b

    @property
    def arrow(self) -> str:
        return "↑" if self.higher_is_better else "↓"


ACCURACY = Quality("final_accuracy_last_k", "accuracy_drop", "accuracy", True)
BITS = Quality("final_bits_per_byte", "bits_per_byte_increase", "bits per byte", False)


@dataclass(frozen=True, slots=True)
class DefenderRow:
    """One defense in one settings group (``None``: undefined or not run yet)."""

    rank: int | None  # 1 = best by :data:`RANK_RULE`; None = not ranked (does not train here)
    defense: str
    clean: Stat  # quality of the no-attack baselines, over seeds
    cost: float | None  # what it pays against the reference with no attack (positive = worse); None without one
    worst_quality: Stat | None  # the worst seed-mean quality under attack (its cell's interval)
    worst_quality_attack: str | None
    worst_drop: float | None  # the largest drop from its own baseline (accuracy drop / bpb increase)
    worst_drop_attack: str | None
    worst_asr: float | None
    worst_asr_attack: str | None
    rejects: bool  # some run of this defense flagged an update (see the module doc)
    worst_recall: float | None
    worst_recall_attack: str | None
    worst_fpr: float | None
    worst_fpr_attack: str | None
    attacked: int  # attacked cells (attack ≠ none) with at least one finished seed
    pending: int  # attacked cells with some seed not finished
    harm: float | None = None  # see :data:`HARM_RULE`
    harm_lo: float | None = None
    harm_hi: float | None = None
    mean_recall: float | None = None  # over the attacked cells (None: does not reject)
    trains: bool | None = None  # False: does not train here; None: cannot be told
    destroyed: tuple[str, ...] = ()  # attacks under which some seed's model was destroyed
    pareto: bool = False
    tied_with_leader: bool = False  # its harm interval overlaps the leader's (≥ 2 seeds)
    caught: int = 0  # attacked cells whose seed-mean recall is ≥ 0.5 (a rule that rejects)
    #: per attacked cell: (attack, quality share lost or None, ASR or None, destroyed)
    by_attack: tuple[tuple[str, float | None, float | None, bool], ...] = ()
    #: the declared defender metric's worst seed mean over the attacks (that cell's interval), and its attack
    declared: Stat | None = None
    declared_attack: str | None = None

    @property
    def rank_text(self) -> str:
        if self.rank is None:
            return "—"
        return "≈1" if self.tied_with_leader and self.rank != 1 else str(self.rank)


@dataclass(frozen=True, slots=True)
class DefenderGroup:
    settings: Settings  # empty for a matrix without settings axes
    attacks: tuple[str, ...]  # the matrix's attacks in this group, no-attack cells excluded
    targeted: tuple[str, ...]  # those with a defined ASR in some cell
    reference: str | None  # the reference defense label if it is in this group
    rows: tuple[DefenderRow, ...]  # ranked rows first, in rank order; then the unranked
    quality: Quality = ACCURACY
    untrained: float | None = None  # the untrained level in the quality's unit (None: not in the store)
    seeds: int = 0  # the most seeds any cell of the group has finished
    headline: tuple[str, ...] = ()  # the summary's first lines (see :func:`defender_headline`)
    #: the declared defender metric this group is ranked by (None: ranked by harm)
    ranked_by: str | None = None
    #: the scenario declared a metric but this group cannot be ranked by it (why, one line)
    declared_note: str | None = None

    @property
    def higher_is_better(self) -> bool:
        """The direction of :attr:`ranked_by` (from :data:`redteam.scoring.HIGHER_IS_BETTER`)."""
        return bool(self.ranked_by is not None and HIGHER_IS_BETTER[self.ranked_by])

    @property
    def rank_rule(self) -> str:
        return declared_rank_rule(self.ranked_by, self.quality) if self.ranked_by is not None else RANK_RULE


@dataclass(frozen=True, slots=True)
class DefenderSummary:
    reference: str  # the defense the cost is measured against ("mean")
    groups: tuple[DefenderGroup, ...]
    non_rejecting: frozenset[str] = field(default_factory=frozenset)
    #: the scenario's ``[matrix] defender_metric`` (None: not declared, or not a metric with a direction)
    metric: str | None = None

    def rejects(self, defense: str) -> bool:
        """Whether detection figures of ``defense`` mean anything (see the module doc)."""
        return defense not in self.non_rejecting


def na_note(report: Any, metric: str) -> str | None:
    """The one-line legend of ``n/a`` in a ``metric`` grid, when some entry of it reads so."""
    summary = getattr(report, "defenders", None)
    if metric not in DETECTION_RATES or summary is None or not summary.non_rejecting:
        return None
    return f"n/a = the defense does not reject: {', '.join(sorted(summary.non_rejecting))} (see the defender's summary)"


# ------------------------------------------------------------------- computing


def _ordered(rounds: Any) -> list[Mapping[str, Any]]:
    recs = [r for r in rounds if isinstance(r, Mapping)] if isinstance(rounds, list) else []
    return sorted(recs, key=lambda r: r.get("round", 0))


def _baseline_quality(rounds: Any, quality: Quality, last_k: int) -> float | None:
    """The baseline run's quality from its rounds (``nan``: its model broke; None: no rounds)."""
    recs = _ordered(rounds)
    if not recs:
        return None
    if quality.higher_is_better:
        tail = [_num(r.get("accuracy")) for r in recs[-max(1, last_k):]]
        vals = [v for v in tail if v is not None]
        return sum(vals) / len(vals) if vals else math.nan
    loss = _num(recs[-1].get("loss"))
    return loss / math.log(2) if loss is not None else math.nan


def _untrained_of(rounds: Any, quality: Quality) -> float | None:
    """The untrained level a run recorded in its first round (None: the store predates it)."""
    recs = _ordered(rounds)
    extra = recs[0].get("extra") if recs else None
    ref = extra.get("untrained") if isinstance(extra, Mapping) else None
    if not isinstance(ref, Mapping):
        return None
    if quality.higher_is_better:
        vals = [v for v in (_num(ref.get("accuracy")), _num(ref.get("chance_accuracy"))) if v is not None]
        return max(vals) if vals else None
    # the better of the untrained model and the unigram rate (a language model that does not beat
    # predicting each byte by its frequency has learned nothing of the context)
    vals = [v for v in (_num(ref.get("loss")), _num(ref.get("unigram_loss"))) if v is not None]
    return min(vals) / math.log(2) if vals else None


def _rounds_flagged(rounds: Any) -> bool:
    """Some participating client was rejected (flagged) in some round."""
    if not isinstance(rounds, list):
        return False
    for r in rounds:
        if not isinstance(r, Mapping) or not r.get("rejected"):
            continue
        part = r.get("participating") or []
        acc = r.get("accepted") or []
        for key in r["rejected"]:
            i = int(key) if str(key).lstrip("-").isdigit() else -1
            if 0 <= i < len(acc) and not acc[i] and (i >= len(part) or part[i]):
                return True
    return False


#: the ASR the verdict reads: at the end of the attack window (issue 20), which is the final
#: ASR when the attack acts in every round; a backdoor that faded after its window was still
#: in the model the defense let through, so the final ASR alone would understate the harm
_ASR_KEY = "asr_at_end_of_window"


def _asr(c: CellSummary) -> float | None:
    v = c.value(_ASR_KEY)
    return v if v is not None else c.value("asr")


def _flagged(metrics: Any) -> bool:
    """A run's metrics show at least one flagged update (tp + fp > 0; recall or FPR above 0 and
    a defined precision imply it too, for rows that carry only the rates)."""
    if not isinstance(metrics, Mapping):
        return False
    count = (_num(metrics.get("tp")) or 0) + (_num(metrics.get("fp")) or 0)
    rates = (_num(metrics.get("recall")) or 0) + (_num(metrics.get("fpr")) or 0)
    return count > 0 or rates > 0 or _num(metrics.get("precision")) is not None


def _flagging_defenses(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """The defenses some run of which (attacked or baseline) flagged an update."""
    seen: set[str] = set()
    for r in rows:
        if ((r.get("finished") and _flagged(r.get("metrics"))) or _rounds_flagged(r.get("rounds"))
                or _rounds_flagged(r.get("baseline_rounds"))):
            seen.add(str(r["defense"]))
    return seen


def _extreme(cells: Sequence[CellSummary], metric: str, worst: Callable[[float, float], bool]) -> tuple[
        float | None, str | None]:
    """The worst seed mean of ``metric`` over ``cells`` and its attack (first in matrix order on ties)."""
    best: tuple[float | None, str | None] = (None, None)
    for c in cells:
        v = c.value(metric)
        if v is not None and (best[0] is None or worst(v, best[0])):
            best = (v, c.attack)
    return best


def reference_label(defenses: Sequence[str], scenario_doc: Any, name: str = "mean") -> str:
    """The matrix label of plugin ``name`` with its default parameters: ``name`` itself when a
    defense is labelled so, else the ``label`` of a ``[matrix].defenses`` entry ``{ name = "mean",
    label = "fedavg" }`` (no other parameter) found in ``defenses``; else ``name``."""
    if name in defenses:
        return name
    matrix = scenario_doc.get("matrix") if isinstance(scenario_doc, Mapping) else None
    entries = matrix.get("defenses") if isinstance(matrix, Mapping) else None
    for e in entries if isinstance(entries, list) else []:
        if (isinstance(e, Mapping) and e.get("name") == name and set(e) <= {"name", "label"}
                and e.get("label") in defenses):
            return str(e["label"])
    return name


def no_attack_labels(scenario_doc: Any) -> frozenset[str]:
    """Matrix attack labels that run no attack: ``none`` itself, and any entry of plugin ``none``
    under another label (``{ name = "none", label = "clean" }``)."""
    out = {"none"}
    matrix = scenario_doc.get("matrix") if isinstance(scenario_doc, Mapping) else None
    entries = matrix.get("attacks") if isinstance(matrix, Mapping) else None
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, Mapping) and e.get("name") == "none" and isinstance(e.get("label"), str):
            out.add(e["label"])
    return frozenset(out)


def _last_k(scenario_doc: Any, settings: Settings) -> int:
    s = dict(settings)
    k = s.get("federation.last_k")
    if k is None and isinstance(scenario_doc, Mapping):
        fed = scenario_doc.get("federation")
        k = fed.get("last_k") if isinstance(fed, Mapping) else None
    return int(k) if isinstance(k, int) and not isinstance(k, bool) and k > 0 else 1


def _quality_for(scenario_doc: Any, settings: Settings, cells: Sequence[CellSummary]) -> Quality:
    """Bits per byte for a language-model workload; accuracy otherwise (or when unknown)."""
    from .applicable import language_model, store_workloads

    lm = language_model(store_workloads(scenario_doc, [settings]))
    if lm is None:  # kind unknown: bits per byte only if the cells carry nothing else meaningful
        lm = False
    return BITS if lm and any(c.value(BITS.metric) is not None for c in cells) else ACCURACY


def _q_stat(c: CellSummary, q: Quality) -> Stat | None:
    """A cell's quality under attack (rows without the last-k mean fall back to the final accuracy)."""
    s = c.metrics.get(q.metric)
    if (s is None or s.mean is None) and q.higher_is_better:
        s = c.metrics.get("final_accuracy")
    return s if s is not None and s.mean is not None else None


def _stat(values: Sequence[float], confidence: float) -> Stat:
    ci = mean_ci(list(values), confidence)
    return Stat(ci["mean"], ci["lo"], ci["hi"], ci["n"])


def _harm_of(q: Quality, stat: Stat | None, best: float | None, floor: float | None) -> tuple[
        float | None, float | None, float | None]:
    """(harm, lo, hi) of a quality under attack: the share of the learnable quality it lost."""
    if stat is None or stat.mean is None or best is None or floor is None:
        return None, None, None
    span = (best - floor) if q.higher_is_better else (floor - best)
    if not span > 0:
        return None, None, None

    def h(v: float | None) -> float | None:
        if v is None:
            return None
        lost = (best - v) if q.higher_is_better else (v - best)
        return min(1.0, max(0.0, lost / span))

    lo, hi = (stat.hi, stat.lo) if q.higher_is_better else (stat.lo, stat.hi)
    m = h(stat.mean)
    return m, h(lo) if lo is not None else m, h(hi) if hi is not None else m


def declared_metric(scenario_doc: Any) -> tuple[str | None, str | None]:
    """The scenario's ``[matrix] defender_metric`` as stored: ``(metric, None)``, ``(None, None)``
    when none is declared, or ``(None, why)`` when the stored value is not a metric with a
    direction (a store made by hand or by another version: the file itself is checked when it
    loads, :func:`redteam.matrix.check_defender_metric`)."""
    matrix = scenario_doc.get("matrix") if isinstance(scenario_doc, Mapping) else None
    if not isinstance(matrix, Mapping) or "defender_metric" not in matrix:
        return None, None
    from ..errors import InvalidScenario
    from ..matrix import check_defender_metric

    try:
        return check_defender_metric(matrix["defender_metric"], "the stored scenario"), None
    except InvalidScenario:
        from ..scenario_limits import shown

        return None, (f"The stored scenario's [matrix] defender_metric = {shown(matrix['defender_metric'])} is not a "
                      "metric with a direction: ranked by harm.")


def declared_rank_rule(metric: str, q: Quality | None = None) -> str:
    """The ranking rule when the scenario declares ``metric`` as its defender metric."""
    higher = HIGHER_IS_BETTER[metric]
    label = q.label if q is not None else "quality"
    better, worst = ("higher", "smallest") if higher else ("lower", "largest")
    return (f"ranked by {metric}, the metric this scenario declares its defender cares about ([matrix] "
            f"defender_metric), not by harm: per defense its worst seed mean over the attacks ({better} "
            f"is better, so the {worst}), best first; ties by mean recall, then clean "
            f"{label}; still tied = same rank; a defense that does not train here is not ranked; harm and the "
            "worst cases are shown for context")


def _declared_worst(cells: Sequence[CellSummary], metric: str) -> tuple[Stat | None, str | None]:
    """The worst seed mean of ``metric`` over ``cells`` (direction-aware) with its cell's interval,
    and its attack (first in matrix order on ties)."""
    higher = HIGHER_IS_BETTER[metric]
    worst: Stat | None = None
    attack: str | None = None
    for c in cells:
        s = c.metrics.get(metric)
        if s is None or s.mean is None:
            continue
        if worst is None or (s.mean < worst.mean if higher else s.mean > worst.mean):  # type: ignore[operator]
            worst, attack = s, c.attack
    return worst, attack


def defender_summary(
    rows: Sequence[Mapping[str, Any]],
    cells: Sequence[CellSummary],
    *,
    reference: str = "mean",
    confidence: float = 0.95,
    scenario_doc: Any = None,
    asr_level: float = STOP_ASR,
) -> DefenderSummary:
    """The summary from the store's rows (``ResultsStore.results(with_rounds=True)``, for the
    baselines) and the aggregated cells (:func:`~redteam.report.aggregate.aggregate_cells`).
    ``reference`` is the plugin the cost is measured against; its label in the matrix is
    found with :func:`reference_label` (``scenario_doc``: the scenario as stored)."""
    reference = reference_label(list(dict.fromkeys(c.defense for c in cells)), scenario_doc, reference)
    declared, declared_problem = declared_metric(scenario_doc)
    idle = no_attack_labels(scenario_doc)
    flagging = _flagging_defenses(rows)
    defenses_all = list(dict.fromkeys(c.defense for c in cells))
    non_rejecting = frozenset(d for d in defenses_all if d not in flagging)

    by_group: dict[Settings, list[CellSummary]] = {}
    for c in cells:
        by_group.setdefault(c.settings, []).append(c)
    rows_by_group: dict[Settings, list[Mapping[str, Any]]] = {}
    for r in rows:
        rows_by_group.setdefault(_settings(r["settings"]), []).append(r)

    groups = []
    for settings, cs in by_group.items():
        q = _quality_for(scenario_doc, settings, cs)
        k = _last_k(scenario_doc, settings)
        grows = rows_by_group.get(settings, [])
        defenses = list(dict.fromkeys(c.defense for c in cs))
        attacks = tuple(dict.fromkeys(c.attack for c in cs if c.attack not in idle))
        targeted = tuple(dict.fromkeys(c.attack for c in cs if c.attack not in idle and _asr(c) is not None))
        seeds = max((c.finished for c in cs), default=0)

        # clean quality per defense (one value per seed: the baseline is shared by the attacks)
        clean_vals: dict[str, dict[Any, float]] = {}
        broken_clean: set[str] = set()
        floors: list[float] = []
        for r in grows:
            d = str(r["defense"])
            seed = r.get("replicate", r.get("seed"))
            v = _baseline_quality(r.get("baseline_rounds"), q, k)
            if v is None and r.get("finished") and isinstance(r.get("metrics"), Mapping):
                a, drop = _num(r["metrics"].get(q.metric)), _num(r["metrics"].get(q.drop_metric))
                v = (a + drop if q.higher_is_better else a - drop) if a is not None and drop is not None else None
            if v is not None and math.isnan(v):
                broken_clean.add(d)
            elif v is not None:
                clean_vals.setdefault(d, {}).setdefault(seed, v)
            u = _untrained_of(r.get("baseline_rounds"), q)
            if u is not None:
                floors.append(u)
        untrained = sum(floors) / len(floors) if floors else None
        clean = {d: _stat(list(clean_vals.get(d, {}).values()), confidence) for d in defenses}

        better = q.better
        known = [clean[d].mean for d in defenses if clean[d].mean is not None]
        best_clean = (max(known) if q.higher_is_better else min(known)) if known else None
        trains: dict[str, bool | None] = {}
        for d in defenses:
            own = clean[d].mean
            if d in broken_clean and own is None:
                trains[d] = False
            elif untrained is None or best_clean is None or own is None:
                trains[d] = None
            else:
                gap = (best_clean - untrained) if q.higher_is_better else (untrained - best_clean)
                got = (own - untrained) if q.higher_is_better else (untrained - own)
                trains[d] = not (gap > 0 and got < TRAIN_SHARE * gap)
        # harm's floor: the untrained level; without one (an older store), accuracy 0 or, in bits
        # per byte, a uniform guess over 256 byte values (8 bits) or the worst seen if that is worse
        floor = untrained
        if floor is None:
            seen = [v.mean for c in cs if c.attack not in idle and (v := _q_stat(c, q)) is not None] + known
            floor = 0.0 if q.higher_is_better else max([UNIFORM_BYTE_BITS, *seen])
        best_trained = [clean[d].mean for d in defenses if trains[d] is not False and clean[d].mean is not None]
        best = (max(best_trained) if q.higher_is_better else min(best_trained)) if best_trained else best_clean

        ref = reference if reference in defenses else None
        ref_clean = clean[ref].mean if ref is not None else None
        rows_out: list[DefenderRow] = []
        for d in defenses:
            mine = [c for c in cs if c.defense == d]
            hit = [c for c in mine if c.attack not in idle and c.finished > 0]
            destroyed = tuple(c.attack for c in hit if c.broken)
            wq_cell, wq = None, None
            for c in hit:
                st_ = _q_stat(c, q)
                if c.broken or st_ is None:
                    continue
                if wq is None or better(wq.mean, st_.mean):
                    wq_cell, wq = c, st_
            drop, drop_a = _extreme(hit, q.drop_metric, lambda v, b: v > b)
            asr_cell = None
            for c in hit:
                v = _asr(c)
                if v is not None and (asr_cell is None or v > _asr(asr_cell)):
                    asr_cell = c
            asr = _asr(asr_cell) if asr_cell is not None else None
            done = [c for c in mine if c.finished > 0]
            rec, rec_a = _extreme(done, "recall", lambda v, b: v < b)
            fpr, fpr_a = _extreme(done, "fpr", lambda v, b: v > b)
            fpr_a = fpr_a if fpr else None  # no honest update flagged anywhere: no attack to name
            own = clean[d].mean
            cost = None
            if ref_clean is not None and own is not None:
                cost = (ref_clean - own) if q.higher_is_better else (own - ref_clean)
            can_reject = d not in non_rejecting
            recalls = [v for c in hit if (v := c.value("recall")) is not None]
            mean_recall = (sum(recalls) / len(recalls) if recalls else 0.0) if can_reject else None
            # harm: the larger of the quality share lost and the ASR, with the interval of the cell that sets it
            h_q = _harm_of(q, wq, best, floor)
            parts = [h_q] if h_q[0] is not None else []
            if asr_cell is not None:
                a = asr_cell.metrics[_ASR_KEY] if _ASR_KEY in asr_cell.metrics and \
                    asr_cell.metrics[_ASR_KEY].mean is not None else asr_cell.metrics["asr"]
                parts.append((a.mean, max(0.0, a.lo if a.lo is not None else a.mean),
                              min(1.0, a.hi if a.hi is not None else a.mean)))
            if destroyed:
                parts.append((1.0, 1.0, 1.0))
            by_attack = tuple((c.attack, None if c.broken else _harm_of(q, _q_stat(c, q), best, floor)[0],
                               _asr(c), bool(c.broken)) for c in hit)
            harm = max(p[0] for p in parts) if parts else None
            harm_lo = max(p[1] for p in parts) if parts else None
            harm_hi = max(p[2] for p in parts) if parts else None
            dm, dm_a = _declared_worst(hit, declared) if declared is not None else (None, None)
            rows_out.append(DefenderRow(
                None, d, clean[d], cost, wq, wq_cell.attack if wq_cell is not None else None, drop, drop_a,
                asr, asr_cell.attack if asr_cell is not None else None, can_reject,
                rec if can_reject else None, rec_a if can_reject else None,
                fpr if can_reject else None, fpr_a if can_reject else None,
                len(hit), sum(1 for c in mine if c.attack not in idle and c.finished < c.planned),
                harm, harm_lo, harm_hi, mean_recall, trains[d], destroyed, by_attack=by_attack,
                caught=sum(1 for v in recalls if v >= 0.5) if can_reject else 0,
                declared=dm, declared_attack=dm_a))

        by, note = declared, declared_problem
        if declared is not None and attacks and not any(r.declared is not None for r in rows_out
                                                        if r.trains is not False):
            by, note = None, (f"{declared} (this scenario's defender metric, [matrix] defender_metric) is undefined "
                              "in every attacked cell here: ranked by harm instead.")
        ranked, unranked = _rank(rows_out, q, bool(attacks), by, seeds)
        ranked = _mark_pareto(ranked, q)
        ranked = _mark_ties(ranked, seeds, by)
        group = DefenderGroup(settings, attacks, targeted, ref, tuple(ranked + unranked), q,
                              untrained, seeds, ranked_by=by if attacks else None, declared_note=note)
        groups.append(replace(group, headline=tuple(defender_headline(group, asr_level=asr_level))))
    return DefenderSummary(reference, tuple(groups), non_rejecting, declared)


def _resolution(seeds: int) -> Callable[[float], float]:
    """How the ranking compares a figure: at 3 decimals, or with one seed (or none finished) in
    steps of :data:`ONE_SEED_STEP` (the step's index)."""
    if seeds >= 2:
        return lambda v: round(v, 3)
    return lambda v: float(round(v / ONE_SEED_STEP))


def _rank(rows: list[DefenderRow], q: Quality, attacked: bool, by: str | None = None, seeds: int = 2) -> tuple[
        list[DefenderRow], list[DefenderRow]]:
    """Trained defenses ranked by :data:`RANK_RULE`, or by the declared metric ``by``
    (:func:`declared_rank_rule`; ties share a rank; figures compared as :func:`_resolution`
    says for ``seeds``); the rest unranked."""
    unranked = sorted((r for r in rows if r.trains is False), key=lambda r: r.defense)
    res = _resolution(seeds)

    def key(r: DefenderRow) -> tuple[Any, ...]:
        if not attacked:  # only baselines: clean quality decides
            tier, harm = 0, 0.0
        elif by is not None:  # the declared metric's worst case, best first
            v = r.declared.mean if r.declared is not None else None
            tier = 2 if v is None else (1 if r.pending else 0)
            harm = 0.0 if v is None else (-res(v) if HIGHER_IS_BETTER[by] else res(v))
        else:
            tier = 2 if r.harm is None else (1 if r.pending else 0)
            harm = res(r.harm) if r.harm is not None else 0.0
        recall = -res(r.mean_recall) if r.mean_recall is not None else 0.0
        c = r.clean.mean
        clean_key = (-res(c) if q.higher_is_better else res(c)) if c is not None else math.inf
        return (tier, harm, recall, clean_key)

    trained = sorted((r for r in rows if r.trains is not False), key=lambda r: (key(r), r.defense))
    out: list[DefenderRow] = []
    for i, r in enumerate(trained):
        rank = out[-1].rank if out and key(trained[i - 1]) == key(r) else i + 1
        out.append(replace(r, rank=rank))
    return out, [replace(r, rank=None) for r in unranked]


def _mark_pareto(rows: list[DefenderRow], q: Quality) -> list[DefenderRow]:
    """Mark the defenses no other dominates on (worst quality under attack, worst ASR, clean)."""
    def axes(r: DefenderRow) -> tuple[float, float, float] | None:
        wq = r.worst_quality.mean if r.worst_quality is not None else None
        if r.destroyed:
            wq = -math.inf if q.higher_is_better else math.inf
        if wq is None or r.clean.mean is None:
            return None
        sign = 1.0 if q.higher_is_better else -1.0  # larger is better on every axis
        return (sign * wq, -(r.worst_asr or 0.0), sign * r.clean.mean)

    pts = {r.defense: axes(r) for r in rows}
    out = []
    for r in rows:
        p = pts[r.defense]
        dominated = p is None or any(
            o is not None and o != p and all(a >= b for a, b in zip(o, p)) for o in pts.values())
        out.append(replace(r, pareto=not dominated))
    return out


def _interval(r: DefenderRow, by: str | None) -> tuple[float | None, float | None]:
    """The interval the ranking reads: harm's, or the declared metric's worst cell's."""
    if by is None:
        return r.harm_lo, r.harm_hi
    s = r.declared
    return (None, None) if s is None or s.mean is None else (s.lo, s.hi)


def _mark_ties(rows: list[DefenderRow], seeds: int, by: str | None = None) -> list[DefenderRow]:
    """With ≥ 2 seeds, mark the defenses whose interval (harm's, or the declared metric's
    ``by``) overlaps the leader's."""
    lead_lo, lead_hi = _interval(rows[0], by) if rows else (None, None)
    if seeds < 2 or not rows or lead_lo is None or lead_hi is None:
        return rows
    out = [rows[0]]
    for r in rows[1:]:
        lo, hi = _interval(r, by)
        tied = lo is not None and hi is not None and not r.pending and lo <= lead_hi and lead_lo <= hi
        out.append(replace(r, tied_with_leader=tied))
    return out


def _fmt_q(q: Quality, v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def _declared_text(s: Stat | None, attack: str | None = None, stacked: bool = False, star: str = "") -> str:
    """A declared metric's worst case: ``0.880 [0.512, 1.248] (sybil_jitter)`` (the interval
    when ≥ 2 seeds had a value and it has a width; ``star`` right after the mean)."""
    if s is None or s.mean is None:
        return "—"
    text = f"{s.mean:.3f}{star}"
    if s.n >= 2 and s.lo is not None and s.hi is not None and s.hi > s.lo:
        text += ("\n" if stacked else " ") + f"[{s.lo:.3f}, {s.hi:.3f}]"
    if attack is None:
        return text
    from ..runner.outputs import terminal_safe

    attack = terminal_safe(attack)
    return f"{text}\n{attack}" if stacked else f"{text} ({attack})"


def _declared_pick(group: DefenderGroup, ranked: Sequence[DefenderRow], by: str) -> list[str]:
    """The pick and what cannot be told from it, by the scenario's declared metric ``by``."""
    q = group.quality
    res = _resolution(group.seeds)
    lead = ranked[0]
    same = [r.defense for r in ranked if r.rank == lead.rank and r is not lead]
    head = lead.defense + (f" (tied: {', '.join(same)})" if same else "")
    better = "higher" if group.higher_is_better else "lower"
    context = []
    if lead.harm is not None:
        context.append(f"harm {lead.harm:.2f}" + (" (over half the learnable quality or a backdoor: it does not "
                                                  "hold the model)" if lead.harm >= 0.5 else ""))
    if lead.worst_quality is not None:
        context.append(f"worst {q.label} under attack {_fmt_q(q, lead.worst_quality.mean)}"
                       + (f" ({lead.worst_quality_attack})" if lead.worst_quality_attack else ""))
    if lead.worst_asr is not None:
        context.append(f"worst ASR {lead.worst_asr:.3f} ({lead.worst_asr_attack})")
    context.append(f"clean {_fmt_q(q, lead.clean.mean)}")
    if lead.rejects and lead.caught:
        context.append(f"flags the attackers in {lead.caught} of {lead.attacked} attacks (recall ≥ 0.5)")
    nxt = next((r for r in ranked if r.rank != lead.rank), None)
    if (nxt is not None and nxt.declared is not None and nxt.declared.mean is not None
            and lead.declared is not None and lead.declared.mean is not None
            and res(nxt.declared.mean) == res(lead.declared.mean)):
        mine, theirs = lead.mean_recall or 0.0, nxt.mean_recall or 0.0
        context.append(f"ahead of {nxt.defense} at equal {by} on mean recall ({mine:.3f} vs {theirs:.3f})"
                       if res(mine) != res(theirs) else f"ahead of {nxt.defense} at equal {by} on clean "
                       f"{q.label}")
    lines = [f"Pick: {head}, worst {by} {_declared_text(lead.declared, lead.declared_attack)}: ranked by {by} "
             f"({better} is better) because this scenario declares it its defender metric ([matrix] "
             f"defender_metric), not by harm; for context: {'; '.join(context)}."]
    close = [r.defense for r in ranked if r.tied_with_leader]
    if close:
        lines.append(f"Indistinguishable from {lead.defense} in {by} at 95 % over {group.seeds} seeds: "
                     f"{', '.join(close)}.")
    return lines


def defender_headline(group: DefenderGroup, *, asr_level: float = STOP_ASR) -> list[str]:
    """The summary's first lines: the pick (or that nothing holds), what cannot be told from it,
    what does not train, what nothing stops, destroyed models, and the seed count."""
    q = group.quality
    lines: list[str] = []
    if group.seeds <= 1:
        lines.append(f"One seed: no difference here is tested against noise, so ranks compare harm, mean recall and "
                     f"clean quality in steps of {ONE_SEED_STEP:g} only (defenses in the same steps share a rank); "
                     "run seeds ≥ 3 before choosing.")
    ranked = [r for r in group.rows if r.rank is not None]
    if group.declared_note:
        lines.append(group.declared_note)
    by = group.ranked_by
    if group.attacks and ranked and by is not None and ranked[0].declared is not None:
        lines += _declared_pick(group, ranked, by)
    elif group.attacks and ranked and ranked[0].harm is not None:
        lead = ranked[0]
        facts = [f"worst {q.label} under attack {_fmt_q(q, lead.worst_quality.mean if lead.worst_quality else None)}"
                 + (f" ({lead.worst_quality_attack})" if lead.worst_quality_attack else "")]
        if lead.worst_asr is not None:
            facts.append(f"worst ASR {lead.worst_asr:.3f} ({lead.worst_asr_attack})")
        facts.append(f"clean {_fmt_q(q, lead.clean.mean)}")
        same = [r.defense for r in ranked if r.rank == lead.rank and r is not lead]
        head = lead.defense + (f" (tied: {', '.join(same)})" if same else "")
        if lead.rejects and lead.caught:
            facts.append(f"flags the attackers in {lead.caught} of {lead.attacked} attacks (recall ≥ 0.5)")
        nxt = next((r for r in ranked if r.rank != lead.rank), None)
        res = _resolution(group.seeds)
        if nxt is not None and nxt.harm is not None and res(nxt.harm) == res(lead.harm):
            mine, theirs = lead.mean_recall or 0.0, nxt.mean_recall or 0.0
            step = "" if group.seeds >= 2 else f" in steps of {ONE_SEED_STEP:g}"
            facts.append(f"ahead of {nxt.defense} at equal harm{step} on mean recall ({mine:.3f} vs {theirs:.3f})"
                         if res(mine) != res(theirs) else f"ahead of {nxt.defense} at equal harm on clean "
                         f"{q.label}")
        if lead.harm >= 0.5:
            lines.append(f"No defense here holds against this matrix: the least harmed, {head}, has harm "
                         f"{lead.harm:.2f} ({'; '.join(facts)}).")
        else:
            lines.append(f"Pick: {head}, harm {lead.harm:.2f} ({'; '.join(facts)}).")
        close = [r.defense for r in ranked if r.tied_with_leader]
        if close:
            lines.append(f"Indistinguishable from {lead.defense} at 95 % over {group.seeds} seeds: {', '.join(close)}.")
    elif ranked:
        lines.append(f"No attack in this matrix: best clean {q.label}: {ranked[0].defense} "
                     f"({_fmt_q(q, ranked[0].clean.mean)}).")
    idle = [r for r in group.rows if r.trains is False]
    if idle:
        what = "; ".join(f"{r.defense} (clean {_fmt_q(q, r.clean.mean)})" for r in idle)
        lines.append(f"Does not train here (its clean {q.label} closes under {TRAIN_SHARE:.0%} of the best defense's "
                     f"gain over the untrained {_fmt_q(q, group.untrained)}), not ranked: {what}.")
    for attack in group.attacks:
        best: tuple[float, str, str] | None = None  # (harm, defense, what it leaves)
        stopped = False
        for r in ranked:
            for a, share, asr, broke in r.by_attack:
                if a != attack:
                    continue
                if broke:
                    h, what = 1.0, "loses its model (non-finite)"
                else:
                    share_q = share if share is not None else 0.0
                    stopped = stopped or (share is not None and share < 0.5 and (asr is None or asr < asr_level))
                    if asr is not None and asr >= share_q:
                        h, what = asr, f"leaves ASR {asr:.3f}"
                    else:
                        h, what = share_q, f"loses {share_q:.0%} of the learnable {q.label}"
                if best is None or h < best[0]:
                    best = (h, r.defense, what)
        if not stopped and best is not None:
            lines.append(f"No defense here stops {attack}: the best, {best[1]}, {best[2]}.")
    wrecked = [f"{r.defense} under {', '.join(r.destroyed)}" for r in group.rows if r.destroyed]
    if wrecked:
        lines.append(f"Model destroyed (non-finite loss or a refused step) in some seed: {'; '.join(wrecked)}.")
    return lines


# ------------------------------------------------------------------- rendering


def _v(v: float | None, attack: str | None = None, signed: bool = False, stacked: bool = False,
       star: str = "") -> str:
    if v is None:
        return "—"
    text = f"{v:+.3f}" if signed else f"{v:.3f}"
    if text in ("-0.000", "+0.000"):  # rounds to zero: no sign (a cost of −0.0002 is no gain worth a sign)
        text = "0.000"
    text += star
    if attack is None:
        return text
    from ..runner.outputs import terminal_safe

    attack = terminal_safe(attack)  # control characters as escapes: the only line break is the stacked one
    return f"{text}\n{attack}" if stacked else f"{text} ({attack})"


def _clean_text(s: Stat) -> str:
    if s.mean is None:
        return "…"
    h = s.half_width
    return f"{s.mean:.3f}" + (f" ± {h:.3f}" if h is not None else "")


def _harm_text(r: DefenderRow, stacked: bool = False) -> str:
    if r.harm is None:
        return "—"
    if r.harm_lo is not None and r.harm_hi is not None and r.harm_hi > r.harm_lo:
        return f"{r.harm:.2f}" + ("\n" if stacked else " ") + f"[{r.harm_lo:.2f}, {r.harm_hi:.2f}]"
    return f"{r.harm:.2f}"


def defender_columns(group: DefenderGroup, summary: DefenderSummary, *, stacked: bool = False) -> tuple[
        list[str], list[list[str]]]:
    """Header and plain-text rows of one group's table, in the workload's own metric (its
    direction as an arrow). Columns the group has no data for (no ``mean``, no attack, no
    targeted attack, no defense that rejects) are left out; :func:`defender_notes` says why in
    one line each. A worst case reads ``0.276 (sign_flip)``, or with ``stacked`` (narrow
    terminals) the attack on a line of its own. Labels are raw text: each writer escapes."""
    q = group.quality
    any_rejects = any(r.rejects for r in group.rows)
    header = ["#", "defense"]
    by = group.ranked_by
    if by is not None:
        header.append(f"worst {by} {'↑' if group.higher_is_better else '↓'}")
    if group.attacks:
        header.append("harm ↓")
    header.append(f"clean {q.label} {q.arrow}")
    if group.reference is not None:
        header.append(f"cost vs {summary.reference}")
    if group.attacks:
        header.append(f"worst under attack {q.arrow}")
        if not stacked:  # the drop from its own baseline is for reference only: narrow terminals leave it out
            header.append("worst drop" if q.higher_is_better else "worst increase")
    if group.targeted:
        header.append("worst ASR ↓")
    if any_rejects:
        header += ["worst recall ↑", "worst FPR ↓"]
    body = []
    for r in group.rows:
        line = [r.rank_text, r.defense]
        if by is not None:
            star = "*" if r.pending and r.attacked else ""
            line.append("… (not run yet)" if not r.attacked
                        else _declared_text(r.declared, r.declared_attack, stacked, star))
        if group.attacks:
            line.append("does not train" if r.trains is False else _harm_text(r, stacked))
        line.append(_clean_text(r.clean))
        if group.reference is not None:
            line.append("reference" if r.defense == group.reference else _v(r.cost, signed=True))
        if group.attacks:
            star = "*" if r.pending and r.attacked else ""
            if not r.attacked:
                line.append("… (not run yet)")
            elif r.worst_quality is None and r.destroyed:
                line.append("model destroyed" + (f" ({r.destroyed[0]})" if not stacked else f"\n{r.destroyed[0]}"))
            else:
                wq = r.worst_quality.mean if r.worst_quality is not None else None
                text = _v(wq, r.worst_quality_attack, stacked=stacked, star=star)
                if r.destroyed:
                    text += "; destroyed under " + ", ".join(r.destroyed)
                line.append(text)
            if not stacked:
                line.append(_v(r.worst_drop, r.worst_drop_attack, signed=True) if r.attacked else "…")
        if group.targeted:
            line.append(_v(r.worst_asr, r.worst_asr_attack, stacked=stacked))
        if any_rejects:
            line += ([_v(r.worst_recall, r.worst_recall_attack, stacked=stacked),
                      _v(r.worst_fpr, r.worst_fpr_attack, stacked=stacked)] if r.rejects else [NO_REJECT, NO_REJECT])
        body.append(line)
    return header, body


def defender_notes(group: DefenderGroup, summary: DefenderSummary, *, stacked: bool = False) -> list[str]:
    """One line per fact the table needs: the ranking rule, harm, the cost's sign, the columns left
    out (``stacked``: the narrow layout of :func:`defender_columns`, without the worst drop)."""
    q = group.quality
    k_note = " (the mean of the last k evaluations when [federation] last_k > 1)" if q.higher_is_better else ""
    rule = group.rank_rule
    drop = "drop" if q.higher_is_better else "increase"
    if not group.attacks:
        drop_note = ""
    elif stacked:
        drop_note = (f"; the worst {drop} from the defense's own baseline (for reference, not ranked on) is left "
                     "out at this width: a wider terminal, or --format md, json or html, shows it")
    else:
        drop_note = f"; 'worst {drop}' is from the defense's own baseline (for reference, not ranked on)"
    notes = [f"Quality here: {q.label}{k_note}, {'higher' if q.higher_is_better else 'lower'} is better; "
             f"'worst under attack' is the worst seed-mean {q.label} over the attacks{drop_note}.",
             f"{rule[0].upper()}{rule[1:]}."]
    if group.ranked_by is not None:
        notes.append(f"worst {group.ranked_by} = its worst seed mean over the attacks, the 95 % interval of that "
                     "cell in brackets, and the attack.")
    if group.attacks:
        notes.append(HARM_RULE + ".")
        if group.untrained is not None:
            notes.append(f"Untrained level here: {group.untrained:.3f} {q.label} (the initial model, or the majority "
                         "class if better); a defense closing less than "
                         f"{TRAIN_SHARE:.0%} of the best clean defense's gain over it does not train here.")
        else:
            floor = "accuracy 0" if q.higher_is_better else f"{UNIFORM_BYTE_BITS:g} bits per byte (a uniform byte)"
            notes.append(f"Untrained level: not in this store (made before it was recorded): harm is measured from "
                         f"{floor}, and no defense is flagged as not training.")
    if group.seeds >= 2:
        what = group.ranked_by if group.ranked_by is not None else "harm"
        notes.append(f"≈1 = its {what} interval (95 %, {group.seeds} seeds) overlaps the leader's: the data cannot "
                     "tell it from the pick.")
    pareto = [r.defense for r in group.rows if r.pareto]
    if group.attacks and pareto:
        notes.append(f"Pareto set over (worst {q.label} under attack, worst ASR, clean {q.label}): "
                     f"{', '.join(pareto)}.")
    if group.reference is None:
        notes.append(f"cost vs {summary.reference}: n/a ({summary.reference} not in the matrix).")
    else:
        notes.append(f"cost vs {summary.reference} = what the defense pays in clean {q.label} against "
                     f"{summary.reference} when nobody attacks (positive: worse).")
    if any(r.pending for r in group.rows):
        notes.append("* = some attacked cells of that defense have not finished: its worst case is over the "
                     "finished ones (ranked after the complete defenses).")
    if not group.attacks:
        notes.append("worst case: n/a (no attack in the matrix, only the no-attack baseline).")
    if not group.targeted:
        notes.append("worst ASR: n/a (no targeted attack in the matrix).")
    if not any(r.rejects for r in group.rows):
        notes.append("detection: n/a (no defense in the matrix rejects updates).")
    elif any(not r.rejects for r in group.rows):
        notes.append(REJECT_RULE + ".")
    return notes


def _shown(header: list[str], body: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The text as the terminal shows it (control characters as escapes, so widths are right);
    the only line breaks left are the stacked layout's own (labels were made safe there)."""
    from ..runner.outputs import terminal_safe

    def safe(i: int, x: str) -> str:
        return terminal_safe(x) if i == 1 else "\n".join(terminal_safe(p) for p in x.split("\n"))

    return [terminal_safe(h) for h in header], [[safe(i, x) for i, x in enumerate(line)] for line in body]


def _fit_widths(header: Sequence[str], body: Sequence[Sequence[str]], room: int) -> list[int]:
    """Column widths within ``room`` characters: each column starts at its longest line and the
    widest one gives up a character at a time, down to its longest word (labels over 24
    characters may fold). The sum exceeds ``room`` only when the longest words do."""
    cells = [[h, *(line[i] for line in body)] for i, h in enumerate(header)]
    lines = [[ln for c in col for ln in c.split("\n")] for col in cells]
    widths = [max(len(ln) for ln in col) for col in lines]
    floor = [min(max(len(w) for ln in col for w in (ln.split() or [""])), 24) for col in lines]
    while sum(widths) > room:
        slack = [w - f for w, f in zip(widths, floor)]
        i = max(range(len(widths)), key=lambda j: (slack[j] > 0, widths[j]))
        if slack[i] <= 0:
            break
        widths[i] -= 1
    return widths


def _stat_dict(s: Stat | None) -> dict[str, Any] | None:
    return None if s is None else {"mean": s.mean, "lo": s.lo, "hi": s.hi, "n": s.n}


def defenders_dict(summary: DefenderSummary | None) -> dict[str, Any] | None:
    """The JSON form (``null`` values for undefined; ``rejects`` false = detection n/a; ``rank``
    null = not ranked because the defense does not train here)."""
    if summary is None:
        return None
    return {
        "reference": summary.reference,
        "defender_metric": ({"metric": summary.metric, "higher_is_better": HIGHER_IS_BETTER[summary.metric],
                             "declared_by": "[matrix] defender_metric"} if summary.metric is not None else None),
        "rank_rule": declared_rank_rule(summary.metric) if summary.metric is not None else RANK_RULE,
        "harm_rule": HARM_RULE,
        "reject_rule": REJECT_RULE,
        "train_share": TRAIN_SHARE,
        "groups": [
            {
                "settings": dict(g.settings),
                "headline": list(g.headline),
                "ranked_by": g.ranked_by or ("harm" if g.attacks else "clean quality"),
                "rank_rule": g.rank_rule,
                "quality": {"metric": g.quality.metric, "label": g.quality.label,
                            "higher_is_better": g.quality.higher_is_better, "drop_metric": g.quality.drop_metric},
                "untrained_level": g.untrained,
                "seeds": g.seeds,
                "reference_in_matrix": g.reference is not None,
                "attacks": list(g.attacks),
                "targeted_attacks": list(g.targeted),
                "defenses": [
                    {
                        "rank": r.rank, "rank_text": r.rank_text, "defense": r.defense,
                        "trains": r.trains, "pareto": r.pareto, "indistinguishable_from_leader": r.tied_with_leader,
                        "harm": {"value": r.harm, "lo": r.harm_lo, "hi": r.harm_hi},
                        "defender_metric": ({**(_stat_dict(r.declared) or {"mean": None}),
                                             "attack": r.declared_attack} if summary.metric is not None else None),
                        "clean": _stat_dict(r.clean),
                        "cost_vs_reference": r.cost,
                        "worst_under_attack": {**(_stat_dict(r.worst_quality) or {"mean": None}),
                                               "attack": r.worst_quality_attack},
                        "worst_drop": {"value": r.worst_drop, "attack": r.worst_drop_attack},
                        "worst_asr": {"value": r.worst_asr, "attack": r.worst_asr_attack},
                        "model_destroyed_under": list(r.destroyed),
                        "rejects": r.rejects,
                        "mean_recall": r.mean_recall,
                        "worst_recall": ({"value": r.worst_recall, "attack": r.worst_recall_attack}
                                         if r.rejects else None),
                        "worst_fpr": {"value": r.worst_fpr, "attack": r.worst_fpr_attack} if r.rejects else None,
                        "attacked_cells": r.attacked, "pending_cells": r.pending,
                    }
                    for r in g.rows
                ],
            }
            for g in summary.groups
        ],
    }


def print_defenders(console: Any, summary: DefenderSummary | None, escape: Callable[[object], str]) -> None:
    """The summary on a rich console: per settings group a title, the headline, a table, and its
    notes. Long entries wrap inside their column (nothing is cut off). On a terminal narrower
    than the table the attacks go under their figures and the worst drop is left out (the notes
    say so); a file or a pipe has no screen to fit, so every column is printed at full width."""
    if summary is None or not summary.groups:
        return
    from .labels import group_title

    width = getattr(console, "width", 200) or 200
    for g in summary.groups:
        title = "Defender's summary" + (f" · {group_title(g.settings)}" if g.settings else "")
        header, body = _shown(*defender_columns(g, summary))
        wide = sum(_fit_widths(header, body, 10_000)) + len(header) - 1
        stacked = wide > width and bool(getattr(console, "is_terminal", False))
        if stacked:
            header, body = _shown(*defender_columns(g, summary, stacked=True))
        room = wide if wide > width and not stacked else width
        if room > width:  # not a terminal: widen the console for this table only
            console.width = room
        try:
            _print_group(console, g, summary, title, header, body, escape, room, stacked)
        finally:
            if room > width:
                console.width = width


def _print_group(console: Any, g: DefenderGroup, summary: DefenderSummary, title: str, header: list[str],
                 body: list[list[str]], escape: Callable[[object], str], width: int, stacked: bool) -> None:
    """One group of :func:`print_defenders`, its table fitted to ``width`` characters."""
    from rich import box
    from rich.table import Table

    from ..runner.outputs import terminal_safe

    # light rules, one space between columns, widths fitted here (rich's own fitting would
    # cut the last column off at 80 characters): text wraps between words, never inside one
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)
    for i, (h, w) in enumerate(zip(header, _fit_widths(header, body, width - len(header) + 1))):
        t.add_column(escape(h), justify="left" if i == 1 else "right", overflow="fold", width=w)
    for line in body:
        t.add_row(*["\n".join(escape(part) for part in x.split("\n")) for x in line])
    console.print(f"[bold]{escape(title)}[/bold]")
    for h in g.headline:
        console.print(f"[bold]{escape(terminal_safe(h))}[/bold]")
    console.print(t)
    for n in defender_notes(g, summary, stacked=stacked):
        console.print(f"[dim]{escape(terminal_safe(n))}[/dim]")
