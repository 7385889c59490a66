"""Every metric, defined once. The scorer reads only :class:`~redteam.types.RoundRecord` lists.

Definitions (also in docs/reports.md, "Metrics"):

* ``final_accuracy`` / ``final_loss``: clean test accuracy and loss after the last round.
* ``final_accuracy_last_k``: the mean clean accuracy of the last k evaluations (rounds),
  k = ``[federation] last_k`` (default 1: the final accuracy), as the robustness papers'
  tables report it (e.g. Karimireddy, He & Jaggi, ICLR 2022).
* ``accuracy_drop``: baseline final accuracy − attacked final accuracy (same seed and
  settings, attack ``none``); positive = the attack hurt.
* ``rounds_to_target``: the first round (1-based) whose accuracy reaches the target;
  ``None`` if never. ``slowdown``: attacked rounds_to_target − baseline's (``None``
  if either never reaches it).
* detection, counted over (round, client) pairs whose update was *judged*: the client
  took part and its update reached a check (a defense, a chunk-digest or decoding
  check); stragglers and churned clients are not judged. A judged update is *flagged*
  when it was not accepted. Positives are malicious clients. ``precision`` =
  TP/(TP+FP), ``recall`` = TP/(TP+FN), ``f1``, ``fpr`` = FP/(FP+TN). Undefined ratios
  (0/0) are ``None``.
* ``bytes_on_wire``: every byte transmitted in all rounds (payloads, retries, manifests).
* ``dropped_updates``: updates that never reached aggregation (any reason).
* ``wall_time_per_round_s``, ``defense_time_per_round_s``, ``sim_time_s``.
* language models (:func:`language_model`): ``final_bits_per_byte`` = final loss / ln 2
  (the loss is the mean cross-entropy in nats per token; per byte for the byte-level
  ``text`` workload), ``final_perplexity`` = e^loss, their increases over the baseline
  (attacked − baseline, like ``accuracy_drop`` but positive = worse), and
  ``rounds_to_target_loss``: the first round (1-based) whose loss is ≤ the target loss —
  by default the baseline's final loss, so it counts the rounds the attacked run needs to
  get as far as the clean run did (``None``: never). ``false_trigger_rate``: a
  trigger-phrase backdoor's share of clean held-out prompts continued with its target;
  ``near_miss_trigger_rate``: its share of held-out *near-miss* prompts — ending in a
  proper prefix, a proper suffix or the last character of the trigger, never the whole
  trigger — continued with its target (pooled over the kinds; the per-kind rates are in
  the round record's ``extra["near_miss_trigger_by_kind"]``). "Continued with the target"
  for both (and the ASR): the model's argmax next byte is the target's byte at every
  target position (:mod:`attacks.llm`).
  These (:data:`LANGUAGE_MODEL_METRICS`; not ``rounds_to_target_loss``, which any loss
  has) are functions of the loss that mean nothing for a classifier: :func:`summarize`
  leaves them out when told the workload is not a language model.
* durability of a backdoor after an attack window (:func:`durability`; Neurotoxin, Zhang
  et al., ICML 2022, Sec. 4: how long the backdoor lasts once the attackers stop): with
  ``[attack] window``, the rounds the attack acted in are marked in the records
  (``extra["attack_active"]``) and E is the last of them. A round counts as one the attack
  acted in only when the window is open in it *and* at least one attacker takes part (is drawn
  and not banned): with K of N clients a window round that drew no attacker is not marked, so
  it is never E. The mark reads who the attackers are, not the attack, so a run's no-attack
  baseline (same draws) marks the same rounds. ``asr_at_end_of_window`` /
  ``accuracy_at_end_of_window``: ASR and clean accuracy after round E;
  ``asr_after_k``: the ASR after round E + k (k = ``[attack] after_k``; ``None`` when the
  run ends sooner); ``backdoor_lifespan``: the number of rounds after E whose ASR stays ≥
  the threshold (``[attack] lifespan_threshold``) before the first that falls below it — 0
  when the ASR is already below it in round E + 1 (or at E); when it never falls below it
  before the run ends, the rounds observed (a lower bound) and ``lifespan_censored`` = 1.
  Without a window E is the last round, so ``asr_at_end_of_window`` is the final ASR and
  the others are ``None``. Untargeted runs have no ASR: all ``None``.
* the ``[pipeline]`` regime (:func:`pipeline_metrics`; the peers are the clients):
  ``detection_latency``: for each tampering peer that was banned, the micro-batches it served
  while the attack acted before the ban, averaged; ``undetected_attackers``: tampering peers
  never banned; ``check_overhead``: stage forwards recomputed by the checks per hop (each hop is
  a stage forward and backward, about three forwards); ``lost_micro_batches``: micro-batches
  lost with a crashed peer; ``lost_work``: the share of hops whose work was lost because their
  peer crashed or left before its stage's sync; ``pipeline_throughput``: micro-batches that went
  through every stage per simulated second (a hop takes ``[pipeline] hop_time_s`` / the peer's
  speed, a recomputation a third of that; peers work in parallel and a round lasts as long as
  its busiest peer); ``idle_share``: the working peers' mean idle share of a round. ``None`` for
  data-parallel runs.
* the ``[gossip]`` regime (:func:`gossip_metrics`; the nodes are the clients, and ``accuracy`` /
  ``loss`` are the honest nodes' means): ``worst_honest_accuracy`` / ``worst_honest_loss``: the
  worst honest node's test accuracy / loss after the last round; ``consensus_distance``: the mean
  squared distance of the honest models to their mean after the last round;
  ``spectral_gap``: 1 − the second-largest eigenvalue modulus of the mixing matrix, averaged over
  the rounds (a time-varying graph has one per round). ``None`` for the other regimes.
* spot-check replay (:func:`verification_metrics`; defenses/spot_check.py):
  ``verification_cost`` (replayed peer trainings ÷ peer trainings), ``rounds_to_catch`` (rounds a
  caught cheat took part in up to its catch, averaged) and ``uncaught_cheats``. ``None`` without
  spot checks.

Undefined metrics (issue 22 §2). A metric that cannot be computed for a run is ``None``,
never a crash and never NaN/inf: :func:`summarize` computes each metric (or group of
metrics) on its own, and one whose arithmetic fails (``OverflowError``,
``ZeroDivisionError``, ``FloatingPointError``, a math-domain ``ValueError``) or whose value
is NaN or ±inf (a simulated time past float64's range, from a legal ``latency_ms = 1e308``)
becomes ``None`` with the reason under ``summary["undefined"][metric]``; the other metrics
of the run are kept. The store keeps those reasons with the run's metrics and ``redteam
report`` prints them under the tables (:func:`undefined_reasons` gathers them per cell).
Metrics that are ``None`` by definition (0/0 ratios, ASR of an untargeted attack) carry no
reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .types import RoundRecord

__all__ = [
    "METRICS",
    "LANGUAGE_MODEL_METRICS",
    "HIGHER_IS_BETTER",
    "metric_direction",
    "METRIC_RANGES",
    "metric_range",
    "attack_success_rate",
    "envelope",
    "mean_ci",
    "breakdown_fraction",
    "final_accuracy",
    "final_accuracy_last_k",
    "final_loss",
    "accuracy_drop",
    "rounds_to_target",
    "detection",
    "Detection",
    "summarize",
    "language_model",
    "rounds_to_target_loss",
    "durability",
    "pipeline_metrics",
    "gossip_metrics",
    "verification_metrics",
    "privacy_metrics",
    "PRIVACY_METRICS",
    "UNDEFINED",
    "undefined_reasons",
]

#: The key of :func:`summarize`'s result that maps each metric that could not be computed
#: for the run to the reason (module docstring); ``{}`` when every metric could be.
UNDEFINED = "undefined"

#: What a metric's arithmetic raises on legal but extreme values: overflow, division by
#: zero, floating-point traps (ArithmeticError), and math-domain errors (ValueError).
_ARITHMETIC_ERRORS = (ArithmeticError, ValueError)


def final_accuracy(records: Sequence[RoundRecord]) -> float:
    return records[-1].accuracy if records else float("nan")


def final_accuracy_last_k(records: Sequence[RoundRecord], k: int = 1) -> float:
    """Mean accuracy of the last ``k`` rounds (all rounds when there are fewer)."""
    if k < 1:
        raise ValueError(f"final_accuracy_last_k: k = {k}: must be ≥ 1")
    tail = list(records)[-k:]
    return sum(r.accuracy for r in tail) / len(tail) if tail else float("nan")


def final_loss(records: Sequence[RoundRecord]) -> float:
    return records[-1].loss if records else float("nan")


def accuracy_drop(attacked: Sequence[RoundRecord], baseline: Sequence[RoundRecord]) -> float:
    return final_accuracy(baseline) - final_accuracy(attacked)


def rounds_to_target(records: Sequence[RoundRecord], target: float) -> int | None:
    for r in records:
        if r.accuracy >= target:
            return r.round + 1
    return None


def rounds_to_target_loss(records: Sequence[RoundRecord], target: float | None) -> int | None:
    """First round (1-based) whose loss is ≤ ``target``; ``None`` if never (or no target)."""
    if target is None or not math.isfinite(target):
        return None
    for r in records:
        if r.loss <= target:
            return r.round + 1
    return None


def _bits(loss: float | None) -> float | None:
    return None if loss is None or not math.isfinite(loss) else loss / math.log(2)


def _perplexity(loss: float | None) -> float | None:
    if loss is None or not math.isfinite(loss):
        return None
    return math.exp(loss) if loss < 700 else None  # e^700 overflows float64 soon after


def language_model(
    records: Sequence[RoundRecord],
    baseline: Sequence[RoundRecord] | None = None,
    *,
    target_loss: float | None = None,
) -> dict[str, Any]:
    """Bits per byte, perplexity, their increase over the baseline, rounds to the target
    loss (default: the baseline's final loss), the false-trigger and near-miss trigger rates
    (module docstring)."""
    loss = final_loss(records) if records else None
    out: dict[str, Any] = {
        "final_bits_per_byte": _bits(loss),
        "final_perplexity": _perplexity(loss),
        "false_trigger_rate": (float(records[-1].extra["false_trigger"])
                               if records and "false_trigger" in records[-1].extra else None),
        "near_miss_trigger_rate": (float(records[-1].extra["near_miss_trigger"])
                                   if records and "near_miss_trigger" in records[-1].extra else None),
    }
    b_loss = final_loss(baseline) if baseline else None
    if target_loss is None:
        target_loss = b_loss
    out["rounds_to_target_loss"] = rounds_to_target_loss(records, target_loss)
    if baseline is not None:
        a_bits, b_bits = out["final_bits_per_byte"], _bits(b_loss)
        a_ppl, b_ppl = out["final_perplexity"], _perplexity(b_loss)
        out["bits_per_byte_increase"] = a_bits - b_bits if a_bits is not None and b_bits is not None else None
        out["perplexity_increase"] = a_ppl - b_ppl if a_ppl is not None and b_ppl is not None else None
    return out


@dataclass(frozen=True, slots=True)
class Detection:
    tp: int
    fp: int
    tn: int
    fn: int

    @staticmethod
    def _ratio(a: int, b: int) -> float | None:
        return a / b if b else None

    @property
    def precision(self) -> float | None:
        return self._ratio(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float | None:
        return self._ratio(self.tp, self.tp + self.fn)

    @property
    def fpr(self) -> float | None:
        return self._ratio(self.fp, self.fp + self.tn)

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if p is None or r is None or p + r == 0:
            return None if (p is None or r is None) else 0.0
        return 2 * p * r / (p + r)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp, "fp": self.fp, "tn": self.tn, "fn": self.fn,
            "precision": self.precision, "recall": self.recall, "f1": self.f1, "fpr": self.fpr,
        }


def detection(records: Sequence[RoundRecord]) -> Detection:
    tp = fp = tn = fn = 0
    for r in records:
        for i, (part, mal, acc) in enumerate(zip(r.participating, r.malicious, r.accepted)):
            if not part:
                continue
            judged = acc or i in r.rejected
            if not judged:
                continue
            flagged = not acc
            if mal and flagged:
                tp += 1
            elif mal:
                fn += 1
            elif flagged:
                fp += 1
            else:
                tn += 1
    return Detection(tp, fp, tn, fn)


def _finite_or_none(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return x


def attack_success_rate(records: Sequence[RoundRecord]) -> float | None:
    """Final-round ASR of a targeted/backdoor attack: the fraction of triggered test
    samples (true class ≠ target) classified as the target; ``None`` for untargeted runs."""
    if not records or "asr" not in records[-1].extra:
        return None
    return float(records[-1].extra["asr"])


def durability(records: Sequence[RoundRecord], after_k: int = 10, threshold: float = 0.5) -> dict[str, Any]:
    """ASR and accuracy at the end of the attack window, ASR k rounds after it, and the
    backdoor's lifespan (module docstring)."""
    out: dict[str, Any] = {"asr_at_end_of_window": None, "accuracy_at_end_of_window": None, "asr_after_k": None,
                           "backdoor_lifespan": None, "lifespan_censored": None}
    if not records:
        return out
    marked = [i for i, r in enumerate(records) if r.extra.get("attack_active")]
    windowed = any("attack_active" in r.extra for r in records)
    if windowed and not marked:  # a window that never opened in this run (the baseline's is the same)
        return out
    end = marked[-1] if windowed else len(records) - 1
    out["accuracy_at_end_of_window"] = records[end].accuracy
    if "asr" not in records[end].extra:
        return out
    out["asr_at_end_of_window"] = float(records[end].extra["asr"])
    if not windowed:
        return out
    if end + after_k < len(records) and "asr" in records[end + after_k].extra:
        out["asr_after_k"] = float(records[end + after_k].extra["asr"])
    after = [float(r.extra.get("asr", float("nan"))) for r in records[end + 1:]]
    if out["asr_at_end_of_window"] < threshold:
        out["backdoor_lifespan"], out["lifespan_censored"] = 0, 0
        return out
    below = next((i for i, a in enumerate(after) if not a >= threshold), None)
    if below is None:
        out["backdoor_lifespan"], out["lifespan_censored"] = len(after), 1
    else:
        out["backdoor_lifespan"], out["lifespan_censored"] = below, 0
    return out


def pipeline_metrics(records: Sequence[RoundRecord]) -> dict[str, Any]:
    """The ``[pipeline]`` regime's detection latency and check overhead (module docstring);
    all ``None`` for a data-parallel run."""
    out: dict[str, Any] = {"detection_latency": None, "undetected_attackers": None, "check_overhead": None,
                           "lost_micro_batches": None, "lost_work": None, "pipeline_throughput": None,
                           "idle_share": None}
    info = [r.extra["pipeline"] for r in records if isinstance(r.extra.get("pipeline"), dict)]
    if not info:
        return out
    acted: dict[Any, int] = {}
    banned: set[Any] = set()
    hops = recomputed = 0
    for i in info:
        for p, k in i.get("acted", {}).items():
            acted[p] = acted.get(p, 0) + int(k)
        banned.update(i.get("banned_at", {}))
        hops += int(i.get("hops", 0))
        recomputed += int(i.get("recomputed_hops", 0))
    caught = [k for p, k in acted.items() if p in banned]
    out["detection_latency"] = sum(caught) / len(caught) if caught else None
    out["undetected_attackers"] = sum(1 for p in acted if p not in banned) if acted else None
    out["check_overhead"] = recomputed / hops if hops else None
    out["lost_micro_batches"] = sum(int(i.get("lost_micro_batches", 0)) for i in info)
    out["lost_work"] = sum(int(i.get("lost_hops", 0)) for i in info) / hops if hops else None
    sim = sum(float(i.get("sim_time_s") or 0.0) for i in info)
    completed = sum(int(i.get("completed", 0)) for i in info)
    out["pipeline_throughput"] = completed / sim if sim > 0 and completed else None
    idle = [float(i["idle_share"]) for i in info if i.get("idle_share") is not None]
    out["idle_share"] = sum(idle) / len(idle) if idle else None
    return out


def gossip_metrics(records: Sequence[RoundRecord]) -> dict[str, Any]:
    """The ``[gossip]`` regime's worst honest node, consensus distance and spectral gap (module
    docstring); all ``None`` for the other regimes."""
    out: dict[str, Any] = {"worst_honest_accuracy": None, "worst_honest_loss": None, "consensus_distance": None,
                           "spectral_gap": None}
    info = [r.extra["gossip"] for r in records if isinstance(r.extra.get("gossip"), dict)]
    if not info:
        return out
    last = info[-1]
    out["worst_honest_accuracy"] = last.get("worst_accuracy")
    out["worst_honest_loss"] = last.get("worst_loss")
    out["consensus_distance"] = last.get("consensus_distance")
    gaps = [float(i["spectral_gap"]) for i in info if i.get("spectral_gap") is not None]
    out["spectral_gap"] = sum(gaps) / len(gaps) if gaps else None
    return out


def reward_metrics(records: Sequence[RoundRecord]) -> dict[str, float | None]:
    """A rewarding validator's pay (defenses/gauntlet.py, ``RoundRecord.extra["rewards"]``:
    client → share of the round's reward pool).

    * ``reward_share``: the malicious peers' summed share of the pool, averaged over the rounds
      that paid rewards;
    * ``cheat_reward_ratio``: ``reward_share`` ÷ the malicious peers' share of the participating
      peers (averaged over the same rounds): 1 = paid like an average peer, 0 = paid nothing.

    ``None`` without rewards, or without a malicious participant."""
    paid = [r for r in records if isinstance(r.extra.get("rewards"), dict) and r.extra["rewards"]]
    if not paid:
        return {"reward_share": None, "cheat_reward_ratio": None}
    shares, fair = [], []
    for r in paid:
        rw = r.extra["rewards"]
        shares.append(sum(float(v) for c, v in rw.items() if 0 <= int(c) < len(r.malicious) and r.malicious[int(c)]))
        part = [c for c, p in enumerate(r.participating) if p]
        fair.append(sum(1 for c in part if r.malicious[c]) / len(part) if part else 0.0)
    share = sum(shares) / len(shares)
    f = sum(fair) / len(fair)
    return {"reward_share": share, "cheat_reward_ratio": share / f if f > 0 else None}


def verification_metrics(records: Sequence[RoundRecord]) -> dict[str, float | None]:
    """A spot-check verifier's cost and catches (defenses/spot_check.py,
    ``RoundRecord.extra["spot_check"]``: the round's checked client ids, its row count, and the
    clients caught so far with the round each was caught in).

    * ``verification_cost``: replayed peer trainings ÷ peer trainings, over the run (the
      verifier's extra compute as a share of the training; about the checked fraction p);
    * ``rounds_to_catch``: for each malicious client caught, the rounds it took part in as an
      attacker up to and including the round it was caught in, averaged (a geometric count with
      mean 1/p when each round checks it with probability p and every check catches it);
    * ``uncaught_cheats``: malicious clients that took part as attackers and were never caught.

    All ``None`` without spot checks."""
    info = [r for r in records if isinstance(r.extra.get("spot_check"), dict)]
    out: dict[str, float | None] = {"verification_cost": None, "rounds_to_catch": None, "uncaught_cheats": None}
    if not info:
        return out
    checked = sum(len(r.extra["spot_check"].get("checked", ())) for r in info)
    rows = sum(int(r.extra["spot_check"].get("rows", 0)) for r in info)
    out["verification_cost"] = checked / rows if rows else None
    caught: dict[int, int] = {}
    for r in info:
        for c, at in dict(r.extra["spot_check"].get("caught") or {}).items():
            caught[int(c)] = min(int(at), caught.get(int(c), int(at)))
    acted: dict[int, list[int]] = {}
    for r in records:
        for c, (bad, part) in enumerate(zip(r.malicious, r.participating)):
            if bad and part:
                acted.setdefault(c, []).append(int(r.round))
    took = [sum(1 for t in rounds if t <= caught[c]) for c, rounds in acted.items() if c in caught]
    out["rounds_to_catch"] = sum(took) / len(took) if took else None
    out["uncaught_cheats"] = sum(1 for c in acted if c not in caught) if acted else None
    return out


def envelope(records: Sequence[RoundRecord]) -> dict[str, float | None]:
    """Envelope utilisation: how close *accepted malicious* updates came
    to the validation bounds, over all rounds.

    * ``envelope_norm``: max ‖u‖ / M over accepted malicious updates u (M = the norm
      bound in force for u); 1.0 means an update sat exactly on the bound.
    * ``envelope_cos``: min cos(u, r) over accepted malicious updates (r = the cosine
      filter's reference); ``envelope_cos_margin`` = that minus the threshold c (0 = on
      the bound).
    """
    norm_util: float | None = None
    min_cos: float | None = None
    margin: float | None = None
    for r in records:
        norms = r.extra.get("norms", {})
        bounds = r.extra.get("norm_bounds", {})
        cosines = r.extra.get("cosines", {})
        c = r.extra.get("cos_threshold")
        for i, (mal, acc) in enumerate(zip(r.malicious, r.accepted)):
            if not (mal and acc):
                continue
            if i in bounds and i in norms and bounds[i] > 0:
                u = norms[i] / bounds[i]
                norm_util = u if norm_util is None else max(norm_util, u)
            if i in cosines:
                min_cos = cosines[i] if min_cos is None else min(min_cos, cosines[i])
                if c is not None:
                    m = cosines[i] - c
                    margin = m if margin is None else min(margin, m)
    return {"envelope_norm": norm_util, "envelope_cos": min_cos, "envelope_cos_margin": margin}


#: The ``[privacy]`` metrics (:func:`privacy_metrics`), present only in a run that declares ``[privacy]``.
PRIVACY_METRICS: tuple[str, ...] = ("reconstruction_psnr", "reconstruction_ssim", "label_recovery", "mia_auc",
                                    "mia_tpr_at_0.1pct_fpr", "mia_tpr_at_1pct_fpr", "epsilon", "example_epsilon")


def privacy_metrics(records: Sequence[RoundRecord]) -> dict[str, float | None]:
    """The ``[privacy]`` observers' scores (:mod:`redteam.privacy.observe`) and the run's ε, from
    the rounds' ``extra["privacy"]``; each ``None`` when no round carries any (no ``[privacy]``)."""
    inversion: dict[str, Any] = {}
    member: dict[str, Any] = {}
    dp: dict[str, Any] | None = None
    seen = False
    for r in records:
        got = r.extra.get("privacy")
        if not isinstance(got, dict):
            continue
        seen = True
        inversion = got.get("inversion", inversion) or inversion
        member = got.get("membership", member) or member
        dp = got.get("dp", dp)
    if not seen:
        return dict.fromkeys(PRIVACY_METRICS)
    return {"reconstruction_psnr": inversion.get("psnr"), "reconstruction_ssim": inversion.get("ssim"),
            "label_recovery": inversion.get("label_recovery"), "mia_auc": member.get("auc"),
            "mia_tpr_at_0.1pct_fpr": member.get("tpr_at_0.1pct_fpr"),
            "mia_tpr_at_1pct_fpr": member.get("tpr_at_1pct_fpr"),
            "epsilon": (dp or {}).get("epsilon"), "example_epsilon": (dp or {}).get("example_epsilon")}


#: Every scalar metric a cell has, with a one-line definition (for reports and --help).
METRICS: dict[str, str] = {
    "final_accuracy": "clean test accuracy after the last round",
    "final_accuracy_last_k": "mean clean test accuracy of the last k rounds ([federation] last_k)",
    "final_loss": "clean test loss after the last round",
    "accuracy_drop": "baseline final accuracy − attacked final accuracy (same seed)",
    "rounds_to_target": "first round (1-based) reaching target_accuracy (null: never)",
    "slowdown_rounds": "attacked rounds_to_target − baseline rounds_to_target",
    "asr": "attack success rate on triggered test samples whose true class is not the target",
    "precision": "flagged malicious / all flagged (judged updates)",
    "recall": "flagged malicious / all malicious (judged updates)",
    "f1": "harmonic mean of precision and recall",
    "fpr": "flagged honest / all honest (judged updates)",
    "bytes_on_wire": "bytes sent in all rounds (payloads, retries, manifests)",
    "dropped_updates": "updates that never reached aggregation",
    "rejected_updates": "updates flagged by a check (defense, digest, decoding)",
    "envelope_norm": "max accepted malicious norm / norm bound",
    "envelope_cos": "min cosine of an accepted malicious update to the filter's reference",
    "envelope_cos_margin": "envelope_cos − cosine threshold",
    "wall_time_per_round_s": "wall-clock seconds per round",
    "defense_time_per_round_s": "seconds per round spent in the defense (merge)",
    "sim_time_s": "simulated network time of all rounds",
    "final_bits_per_byte": "final loss in bits per token (per byte for the byte-level text workload)",
    "final_perplexity": "e^(final loss): perplexity per token",
    "bits_per_byte_increase": "attacked − baseline final bits per byte (same seed)",
    "perplexity_increase": "attacked − baseline final perplexity (same seed)",
    "rounds_to_target_loss": "first round (1-based) whose loss ≤ the baseline's final loss (null: never)",
    "false_trigger_rate": "trigger-phrase backdoor: share of clean held-out prompts continued with the target",
    "near_miss_trigger_rate": "trigger-phrase backdoor: share of held-out prompts ending in a partial trigger "
                              "(proper prefix, proper suffix, last character) continued with the target",
    "asr_at_end_of_window": "ASR after the last round of the attack window (the final ASR without a window)",
    "accuracy_at_end_of_window": "clean accuracy after the last round of the attack window",
    "asr_after_k": "ASR k rounds after the attack window closed ([attack] after_k)",
    "backdoor_lifespan": "rounds after the window whose ASR stays ≥ [attack] lifespan_threshold "
                         "(a lower bound when lifespan_censored = 1)",
    "lifespan_censored": "1 when the backdoor outlived the run (backdoor_lifespan is then a lower bound)",
    "detection_latency": "[pipeline]: micro-batches a tampering peer served, while the attack acted, before its ban "
                         "(mean over the banned ones)",
    "undetected_attackers": "[pipeline]: tampering peers never banned",
    "check_overhead": "[pipeline]: recomputed stage forwards per hop (the checks' extra compute)",
    "lost_micro_batches": "[pipeline]: micro-batches lost with a crashed peer (no crash tolerance, or its stage empty)",
    "lost_work": "[pipeline]: share of the hops whose work was lost (their peer crashed or left before the sync)",
    "pipeline_throughput": "[pipeline]: micro-batches through every stage per simulated second",
    "idle_share": "[pipeline]: mean share of the working peers' time idle in a round (the busiest sets its length)",
    "worst_honest_accuracy": "[gossip]: the worst honest node's test accuracy after the last round",
    "worst_honest_loss": "[gossip]: the worst honest node's test loss after the last round",
    "consensus_distance": "[gossip]: mean squared distance of the honest models to their mean after the last round",
    "spectral_gap": "[gossip]: 1 − second-largest eigenvalue modulus of the mixing matrix (mean over rounds)",
    "reward_share": "rewarding validator: the malicious peers' share of the round's reward pool (mean over rounds)",
    "cheat_reward_ratio": "rewarding validator: reward_share ÷ the malicious peers' share of the participants "
                          "(1: paid like an average peer)",
    "verification_cost": "spot-check: replayed peer trainings ÷ peer trainings (the verifier's extra compute)",
    "rounds_to_catch": "spot-check: rounds a caught cheat took part in, up to the one it was caught in (mean)",
    "uncaught_cheats": "spot-check: malicious peers that took part and were never caught",
    "reconstruction_psnr": "[privacy]: PSNR (dB) of the inversion's reconstructions against the samples they match",
    "reconstruction_ssim": "[privacy]: SSIM of the inversion's reconstructions against the samples they match",
    "label_recovery": "[privacy]: share of the observed samples' labels the inversion names",
    "mia_auc": "[privacy]: ROC AUC of the membership observer on members vs non-members of the final model",
    "mia_tpr_at_0.1pct_fpr": "[privacy]: the membership observer's true-positive rate at 0.1 % false positives",
    "mia_tpr_at_1pct_fpr": "[privacy]: the membership observer's true-positive rate at 1 % false positives",
    "epsilon": "[privacy]: client-level ε at [privacy] delta of DP-FedAvg (dp-accounting's RDP accountant)",
    "example_epsilon": "[privacy]: example-level ε at [privacy] delta of the clients' DP-SGD (its smallest client)",
}


#: Metrics defined only for language models (workload ``input_kind == "tokens"``).
LANGUAGE_MODEL_METRICS: frozenset[str] = frozenset({
    "final_bits_per_byte", "final_perplexity", "bits_per_byte_increase", "perplexity_increase",
    "false_trigger_rate", "near_miss_trigger_rate",
})


#: Which way is better for a metric, for rows that compare cells (``[[expect]]``
#: ``better_than`` / ``at_least_as_bad_as``): ``True`` = higher is better, ``False`` = lower
#: is better. A metric not listed (``bytes_on_wire``, the envelope metrics, …) has no
#: direction: neither way is better in general.
HIGHER_IS_BETTER: dict[str, bool] = {
    **dict.fromkeys(("final_accuracy", "final_accuracy_last_k", "recall", "precision", "f1", "tn", "tp",
                     "accuracy_at_end_of_window", "pipeline_throughput", "worst_honest_accuracy"), True),
    **dict.fromkeys(("accuracy_drop", "asr", "fpr", "fp", "fn", "final_loss", "final_bits_per_byte",
                     "final_perplexity", "bits_per_byte_increase", "perplexity_increase", "false_trigger_rate",
                     "near_miss_trigger_rate", "asr_at_end_of_window", "asr_after_k", "backdoor_lifespan",
                     "detection_latency", "undetected_attackers", "check_overhead", "lost_micro_batches", "lost_work", "idle_share",
                     "worst_honest_loss", "consensus_distance", "reward_share", "cheat_reward_ratio",
                     "verification_cost", "rounds_to_catch", "uncaught_cheats", "reconstruction_psnr",
                     "reconstruction_ssim", "label_recovery", "mia_auc", "mia_tpr_at_0.1pct_fpr",
                     "mia_tpr_at_1pct_fpr", "epsilon", "example_epsilon",
                     "rounds_to_target", "rounds_to_target_loss", "slowdown_rounds", "rejected_updates",
                     "dropped_updates", "wall_time_per_round_s", "defense_time_per_round_s", "sim_time_s"), False),
}


#: The values a metric can take, ``(low, high)`` (``None``: unbounded on that side), so that a
#: seed interval is clamped to what the metric can be (a recall's t-interval over 3 seeds can
#: reach [-1.5, 2.9]; the mean cannot). Metrics not listed are unbounded.
METRIC_RANGES: dict[str, tuple[float | None, float | None]] = {
    **dict.fromkeys(("final_accuracy", "final_accuracy_last_k", "asr", "precision", "recall", "f1", "fpr",
                     "false_trigger_rate", "near_miss_trigger_rate", "asr_at_end_of_window",
                     "accuracy_at_end_of_window", "asr_after_k", "lifespan_censored", "lost_work", "idle_share",
                     "worst_honest_accuracy", "spectral_gap", "reward_share", "verification_cost",
                     "label_recovery", "mia_auc", "mia_tpr_at_0.1pct_fpr", "mia_tpr_at_1pct_fpr"), (0.0, 1.0)),
    "reconstruction_ssim": (-1.0, 1.0),
    "epsilon": (0.0, None),
    "example_epsilon": (0.0, None),
    "rounds_to_catch": (1.0, None),
    "uncaught_cheats": (0.0, None),
    "cheat_reward_ratio": (0.0, None),
    "accuracy_drop": (-1.0, 1.0),
    "envelope_cos": (-1.0, 1.0),
    "final_perplexity": (1.0, None),
    **dict.fromkeys(("tp", "fp", "tn", "fn", "bytes_on_wire", "dropped_updates", "rejected_updates",
                     "rounds_to_target", "rounds_to_target_loss", "backdoor_lifespan", "detection_latency",
                     "undetected_attackers", "check_overhead", "lost_micro_batches", "pipeline_throughput",
                     "wall_time_per_round_s", "defense_time_per_round_s", "sim_time_s", "final_loss",
                     "final_bits_per_byte", "worst_honest_loss", "consensus_distance", "envelope_norm"), (0.0, None)),
}


def metric_range(name: str) -> tuple[float | None, float | None]:
    """``(low, high)`` of the values ``name`` can take (:data:`METRIC_RANGES`; ``(None, None)``: any)."""
    return METRIC_RANGES.get(name, (None, None))


def metric_direction(name: str) -> str | None:
    """``"higher"`` or ``"lower"`` (which values of ``name`` are better), or ``None``: no direction."""
    better = HIGHER_IS_BETTER.get(name)
    return None if better is None else "higher" if better else "lower"


def summarize(
    records: Sequence[RoundRecord],
    baseline: Sequence[RoundRecord] | None = None,
    *,
    target_accuracy: float = 0.9,
    last_k: int = 1,
    is_language_model: bool | None = None,
    after_k: int = 10,
    lifespan_threshold: float = 0.5,
) -> dict[str, Any]:
    """The metrics of one run (and its comparison with a baseline run, if given).

    Keys are those of :data:`METRICS` (flat), plus the detection counts
    ``tp``, ``fp``, ``tn``, ``fn`` and ``target_accuracy``. ``is_language_model=False``
    (a classifier workload) leaves out :data:`LANGUAGE_MODEL_METRICS`; ``True`` or
    ``None`` (the kind is not known) keeps them. ``after_k`` and ``lifespan_threshold``
    parametrise :func:`durability` (``[attack] after_k`` / ``lifespan_threshold``).

    ``summary["undefined"]`` (:data:`UNDEFINED`) maps every metric that could not be
    computed for this run (an arithmetic error, or a NaN/inf value) to the reason; such a
    metric is ``None``. Nothing here raises on the run's values.
    """
    if last_k < 1:  # a bad argument, not a run whose metric cannot be computed
        raise ValueError(f"final_accuracy_last_k: k = {last_k}: must be ≥ 1")
    n = max(len(records), 1)
    out: dict[str, Any] = {}
    undefined: dict[str, str] = {}

    def put(keys: Sequence[str], compute: Any) -> None:
        """``compute()`` → one value (one key) or a dict of them; an arithmetic error makes
        every key of the group undefined, with the reason."""
        try:
            got = compute()
        except _ARITHMETIC_ERRORS as exc:
            why = f"could not be computed: {type(exc).__name__}: {exc}"
            for k in keys:
                out[k] = None
                undefined[k] = why
            return
        if isinstance(got, dict):
            out.update(got)
        else:
            out[keys[0]] = got

    def det_dict() -> dict[str, Any]:
        det = detection(records)
        return {"precision": det.precision, "recall": det.recall, "f1": det.f1, "fpr": det.fpr,
                "tp": det.tp, "fp": det.fp, "tn": det.tn, "fn": det.fn}

    put(("final_accuracy",), lambda: final_accuracy(records))
    put(("final_accuracy_last_k",), lambda: final_accuracy_last_k(records, last_k))
    put(("final_loss",), lambda: _finite_or_none(final_loss(records)))
    put(("rounds_to_target",), lambda: rounds_to_target(records, target_accuracy))
    out["target_accuracy"] = target_accuracy
    put(("asr",), lambda: attack_success_rate(records))
    put(("precision", "recall", "f1", "fpr", "tp", "fp", "tn", "fn"), det_dict)
    put(("bytes_on_wire",), lambda: sum(r.bytes_on_wire for r in records))
    put(("dropped_updates",), lambda: sum(len(r.dropped) for r in records))
    put(("rejected_updates",), lambda: sum(len(r.rejected) for r in records))
    put(("envelope_norm", "envelope_cos", "envelope_cos_margin"), lambda: envelope(records))
    put(("wall_time_per_round_s",), lambda: sum(r.wall_time_s for r in records) / n)
    put(("defense_time_per_round_s",), lambda: sum(r.defense_time_s for r in records) / n)
    put(("sim_time_s",), lambda: sum(r.sim_time_s for r in records))
    lm_keys = ["final_bits_per_byte", "final_perplexity", "false_trigger_rate", "near_miss_trigger_rate",
               "rounds_to_target_loss"] + (["bits_per_byte_increase", "perplexity_increase"] if baseline is not None
                                           else [])
    put(lm_keys, lambda: language_model(records, baseline))
    put(("asr_at_end_of_window", "accuracy_at_end_of_window", "asr_after_k", "backdoor_lifespan",
         "lifespan_censored"), lambda: durability(records, after_k, lifespan_threshold))
    put(("detection_latency", "undetected_attackers", "check_overhead", "lost_micro_batches", "lost_work",
         "pipeline_throughput", "idle_share"), lambda: pipeline_metrics(records))
    put(("worst_honest_accuracy", "worst_honest_loss", "consensus_distance", "spectral_gap"),
        lambda: gossip_metrics(records))
    put(("reward_share", "cheat_reward_ratio"), lambda: reward_metrics(records))
    put(("verification_cost", "rounds_to_catch", "uncaught_cheats"), lambda: verification_metrics(records))
    put(PRIVACY_METRICS, lambda: privacy_metrics(records))
    if baseline is not None:
        put(("accuracy_drop",), lambda: accuracy_drop(records, baseline))

        def slowdown() -> int | None:
            rtt, b_rtt = out.get("rounds_to_target"), rounds_to_target(baseline, target_accuracy)
            return (rtt - b_rtt) if (rtt is not None and b_rtt is not None) else None

        put(("slowdown_rounds",), slowdown)
    for k, v in out.items():  # NaN and ±inf are undefined too: JSON has neither, and a mean over them means nothing
        if isinstance(v, float) and not math.isfinite(v) and k != "target_accuracy":
            out[k] = None
            undefined.setdefault(k, f"not a finite number ({v!r}): "
                                    + ("no round was recorded" if not records and math.isnan(v) else
                                       "its value left float64's range" if math.isinf(v) else
                                       "its arithmetic gave NaN"))
    if is_language_model is False:
        for key in LANGUAGE_MODEL_METRICS:
            out.pop(key, None)
            undefined.pop(key, None)
    out[UNDEFINED] = undefined
    return out


def undefined_reasons(metrics: Any) -> dict[str, str]:
    """The reasons a run's stored metrics give for undefined values (``{}`` when none, or for
    a store written before they were kept)."""
    if not isinstance(metrics, dict):
        return {}
    got = metrics.get(UNDEFINED)
    if not isinstance(got, dict):
        return {}
    return {str(k): str(v) for k, v in got.items() if isinstance(v, str)}


def mean_ci(values: Sequence[float | None], confidence: float = 0.95, *,
            bounds: tuple[float | None, float | None] | None = None) -> dict[str, Any]:
    """Mean over seeds with a two-sided Student-t interval; ``None`` values are skipped.

    One value gives an interval of zero width around it (reported, not hidden: ``n = 1``).
    An interval whose ends leave float64's range (values near ±1.8e308) has ``lo`` and ``hi``
    ``None``, with the reason under ``"undefined"``; the mean is always finite.
    ``bounds`` (``(low, high)``, e.g. :func:`metric_range`): the values the metric can take;
    the interval's ends are clamped to them (a recall's interval never leaves [0, 1]).
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    n = len(xs)
    m = sum(x / n for x in xs)  # divided first: values near float64's range do not overflow the sum
    if n == 1:
        return {"mean": m, "lo": m, "hi": m, "n": 1}
    # the deviations scaled by the largest one before squaring (1e300 ** 2 overflows float64)
    scale = max(abs(x - m) for x in xs)
    if math.isinf(scale):  # values on both sides of ±9e307: x − m itself overflows; scale first (exact)
        p2 = math.ldexp(1.0, -math.frexp(max(abs(x) for x in xs))[1])
        devs = [x * p2 - m * p2 for x in xs]
        top = max(abs(v) for v in devs)
        sd_over_scale = math.sqrt(sum((v / top) ** 2 for v in devs) / (n - 1))
        scale = top / p2  # may be inf: the interval is then past float64's range
    else:
        sd_over_scale = math.sqrt(sum(((x - m) / scale) ** 2 for x in xs) / (n - 1)) if scale > 0 else 0.0
    half = _t_quantile(0.5 + confidence / 2, n - 1) * (scale * (sd_over_scale / math.sqrt(n)))
    lo, hi = m - half, m + half
    if not (math.isfinite(lo) and math.isfinite(hi)):  # the ends, not the mean, leave float64's range
        return {"mean": m, "lo": None, "hi": None, "n": n,
                "undefined": "the interval's ends are past float64's range"}
    if bounds is not None:
        low, high = bounds
        lo = lo if low is None else min(max(lo, low), m)
        hi = hi if high is None else max(min(hi, high), m)
    return {"mean": m, "lo": lo, "hi": hi, "n": n}


# two-sided 95 % Student-t critical values t_{0.975, ν} for ν = 1..30 (standard tables)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def _t_quantile(p: float, dof: int) -> float:
    """t_{p, ν}: exact table values for p = 0.975, ν ≤ 30; otherwise the normal quantile
    with the first two Cornish-Fisher terms (accurate to ~1e-3 for ν > 30)."""
    from statistics import NormalDist

    if abs(p - 0.975) < 1e-12 and dof <= 30:
        return _T975[dof - 1]
    z = NormalDist().inv_cdf(p)
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def breakdown_fraction(
    points: Sequence[tuple[float, float | None, float | None]],
    *,
    accuracy_margin: float = 0.05,
    asr_level: float = 0.5,
) -> float | None:
    """The smallest malicious fraction at which the attack "breaks" the defense.

    ``points`` are (malicious fraction, accuracy drop, ASR) over a malicious-fraction
    axis (one cell each, seeds averaged). Broken = accuracy drop > ``accuracy_margin``
    or ASR > ``asr_level``. ``None`` if it never breaks on the axis.
    """
    for frac, drop, asr in sorted(points, key=lambda p: p[0]):
        if (drop is not None and drop > accuracy_margin) or (asr is not None and asr > asr_level):
            return frac
    return None
