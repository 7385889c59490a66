"""Membership inference on the final global model: was this sample in the federation's training data?

Two observers of the released model (``Surface.PRIVACY``, ``observes = "model"``); each returns one
score per candidate, higher = more likely a member, and the engine scores them against the hidden
truth (:mod:`redteam.privacy.membership`: AUC, TPR at low FPR). Neither changes the run.

**``loss_threshold_mia``** — Yeom, Giacomelli, Fredrikson & Jha, "Privacy Risk in Machine Learning:
Analyzing the Connection to Overfitting", IEEE CSF 2018 (their attack predicts "member" when the
sample's loss is below a threshold, the model's average training loss). The score is the
candidate's loss under the released model, negated (the workload's own loss, one candidate at a
time); the threshold is not fixed here: the ROC metrics sweep every threshold. No calibration:
it is the baseline LiRA is measured against.

**``lira``**, offline — Carlini, Chien, Nasr, Song, Terzis & Tramèr, "Membership Inference Attacks
From First Principles", IEEE S&P 2022 (arXiv:2112.03570; released code: github.com/tensorflow/privacy,
``research/mi_lira_2021``: ``score.py`` for the statistic, ``plot.py`` for the offline fit):

1. train ``shadows`` OUT models with the federation's own procedure (``obs.train``), each on a
   random subset of ``obs.train_size`` samples (``shadow_size``) of the attacker's population data,
   which never holds a candidate: every shadow is OUT for every candidate;
2. for each candidate (x, y) and model f, the logit-scaled confidence of the true class,
   φ = log(p_y / (1 − p_y)) with p = softmax(f(x)), in the paper's stable form
   φ = log p_y − log Σ_{k≠y} p_k = z_y − logsumexp_{k≠y} z_k on the logits z (no softmax is
   rounded to 1, so confident members stay apart);
3. fit N(μ_out, σ²_out) per candidate to its shadows' φ: μ_out the median (the released code's
   ``np.median``; the paper writes the mean), σ_out their standard deviation (ddof 0), or with
   ``fixed_variance`` one σ for every candidate, the standard deviation of all the shadows' φ
   pooled (the released code's ``np.std`` over the whole array) — what the paper and its code
   recommend when shadows are few (the authors' 16-model demo scores best with it);
4. ``test = "one_sided"`` (default, the paper's offline test): Λ = 1 − Pr[Z > φ_target],
   Z ~ N(μ_out, σ²_out) — a target confidence high relative to the OUT models' is evidence of
   membership. The score is log Λ = log Φ((φ_target − μ_out)/σ_out) (``torch.special.log_ndtr``:
   the same order as Λ, without Λ rounding to 1.0 for the most exposed candidates).
   ``test = "two_sided"``: the released code's offline score, −log N(φ_target; μ_out, σ²_out)
   (``generate_ours_offline`` returns the log-density and ``sweep`` negates it): far from the OUT
   models in either direction counts as membership.

With ``fixed_variance`` and the one-sided test the order is that of φ_target − μ_out alone (σ is one
number), i.e. the loss attack calibrated per sample by the shadows' median.

**Where the offline variant departs from the paper's online LiRA.** Online LiRA also trains IN
models, each on a random half of a pool that contains the candidates, fits N(μ_in, σ²_in) too, and
scores the likelihood ratio N(φ; μ_in, σ²_in) / N(φ; μ_out, σ²_out): twice the models per run (the
paper's 256, half IN and half OUT for each sample) and shadows retrained for every new candidate
set. The offline test needs neither, at some loss of power at low FPR (the paper's comparison of
the two; the authors' README demo: offline AUC 0.55 against online 0.67 with 16 models). Also not
reproduced: the paper queries each model on augmented copies of the candidate
(mirror and shifts) and averages over them; here each candidate is queried once (no augmentations).

**Defaults.** ``shadows = 4``, for CI (each shadow is one full training run of the federation's
model); the paper's main experiments train 256 shadow models (and study how the attack degrades
with fewer), the authors' released demo 16. ``fixed_variance = True`` (few shadows). Cost: ``shadows`` calls of
``obs.train`` plus ``shadows + 1`` batched forward passes over the candidates
(``benchmarks/bench_membership.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, ModelObservation, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["LossThresholdMIA", "LiRA", "logit_confidence", "candidate_losses", "offline_lira_scores",
           "CANDIDATE_CHUNK"]

#: candidates per forward pass (bounds the memory of one batch of outputs; not a loop per candidate)
CANDIDATE_CHUNK = 4096

TESTS = ("one_sided", "two_sided")


def _outputs(obs: ModelObservation, flat: "torch.Tensor") -> "torch.Tensor":
    """The model ``flat``'s outputs on every candidate, in chunks of :data:`CANDIDATE_CHUNK`."""
    import torch

    x = obs.candidates_x
    with torch.no_grad():
        parts = [obs.model.forward(flat, x[i:i + CANDIDATE_CHUNK]) for i in range(0, int(x.shape[0]), CANDIDATE_CHUNK)]
    return torch.cat(parts, 0)


def candidate_losses(obs: ModelObservation, flat: "torch.Tensor") -> "torch.Tensor":
    """``(m,)`` float64: the workload's loss of each candidate alone under the model ``flat``.

    One forward pass over all candidates, then ``obs.model.loss`` applied to each (output, label)
    pair through ``torch.func.vmap`` (a batch of one per candidate, so a mean loss is that
    candidate's loss; a token model's is the mean over its tokens). The outputs are cast to float64
    first: a float32 cross-entropy rounds every loss below ~1e-8 to exactly 0, which ties the most
    confidently fitted candidates (a tenth of them on the digits world) and blinds the threshold
    sweep at low FPR."""
    import torch

    out = _outputs(obs, flat).to(torch.float64)
    loss = obs.model.loss
    per = torch.func.vmap(lambda o, t: loss(o.unsqueeze(0), t.unsqueeze(0)))(out, obs.candidates_y)
    return per.to(torch.float64).reshape(-1)


def logit_confidence(logits: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
    """φ = log p_y − log Σ_{k≠y} p_k of each row of ``logits`` ``(m, C)`` for labels ``y`` ``(m,)``,
    float64, computed as z_y − logsumexp_{k≠y} z_k (exact: the softmax's normaliser cancels)."""
    import torch

    z = logits.to(torch.float64)
    idx = y.to(device=z.device, dtype=torch.int64).reshape(-1, 1)
    true = z.gather(1, idx).squeeze(1)
    others = z.scatter(1, idx, -math.inf).logsumexp(1)
    return true - others


def offline_lira_scores(phi_target: "torch.Tensor", phi_out: "torch.Tensor", *, fixed_variance: bool,
                        test: str = "one_sided") -> "torch.Tensor":
    """The offline LiRA score of each candidate (float64 ``(m,)``, higher = more likely a member).

    ``phi_target`` ``(m,)``: the released model's φ; ``phi_out`` ``(s, m)``: the OUT shadows'. μ is
    the median over the shadows (mean of the two middle values when ``s`` is even), σ their
    standard deviation (ddof 0) per candidate, or of all ``s·m`` values when ``fixed_variance``;
    σ is floored at 1e-30 as in the released code. ``"one_sided"``: log Φ((φ − μ)/σ);
    ``"two_sided"``: −log N(φ; μ, σ²) (see the module)."""
    import torch

    t = phi_target.to(torch.float64)
    out = phi_out.to(device=t.device, dtype=torch.float64)
    ranked = out.sort(dim=0).values  # np.median: the two middle values averaged (torch.quantile caps the size)
    s = int(ranked.shape[0])
    mu = (ranked[(s - 1) // 2] + ranked[s // 2]) / 2.0
    sigma = out.std(unbiased=False) if fixed_variance else out.std(dim=0, unbiased=False)
    sigma = sigma + 1e-30
    z = (t - mu) / sigma
    if test == "one_sided":
        return torch.special.log_ndtr(z)
    if test == "two_sided":
        return 0.5 * z * z + torch.log(sigma) + 0.5 * math.log(2.0 * math.pi)
    raise ValueError(f"test = {test!r}: must be one of {TESTS}")


def _check_observation(attack: Attack, obs: ModelObservation, *, classifier: bool) -> int:
    """The number of candidates, after checking the observation's shapes (clear errors, named)."""
    name = type(attack).__name__
    m = int(obs.candidates_x.shape[0]) if getattr(obs.candidates_x, "ndim", 0) else -1
    if m < 1 or getattr(obs.candidates_y, "shape", (None,))[0] != m:
        raise ValueError(f"{name}: candidates_x and candidates_y must hold the same number (≥ 1) of candidates, "
                         f"got shapes {tuple(getattr(obs.candidates_x, 'shape', ()))} and "
                         f"{tuple(getattr(obs.candidates_y, 'shape', ()))}")
    if classifier:
        c = int(obs.model.num_classes)
        y = obs.candidates_y
        if c < 2 or y.ndim != 1:
            raise ValueError(f"{name}: scores a classifier's candidates (labels (m,), num_classes ≥ 2), got "
                             f"num_classes = {c} and labels of shape {tuple(y.shape)}")
        if bool(((y < 0) | (y >= c)).any()):
            raise ValueError(f"{name}: candidate labels must lie in [0, {c}), got {int(y.min())}..{int(y.max())}")
    return m


@dataclass(frozen=True, slots=True)
class LossThresholdMIA(Attack):
    """Score = −(the candidate's loss under the released model): Yeom et al., IEEE CSF 2018."""

    surfaces: ClassVar[tuple[str, ...]] = (Surface.PRIVACY,)
    observes: ClassVar[str] = "model"
    summary: ClassVar[str] = "Loss-threshold membership inference: a low loss under the final model means member"
    reference: ClassVar[str] = "Yeom, Giacomelli, Fredrikson & Jha, IEEE CSF 2018"

    def membership_scores(self, obs: ModelObservation) -> "torch.Tensor":
        _check_observation(self, obs, classifier=False)
        return -candidate_losses(obs, obs.params)


@dataclass(frozen=True, slots=True)
class LiRA(Attack):
    """Offline LiRA (Carlini et al., IEEE S&P 2022): the target's logit-scaled confidence against a
    Gaussian fitted to OUT shadow models' (see the module).

    Parameters: ``shadows`` (OUT shadow models, ≥ 1; ≥ 2 without ``fixed_variance``),
    ``fixed_variance`` (one σ for every candidate), ``test`` (``"one_sided"``: the paper's;
    ``"two_sided"``: the released code's), ``shadow_size`` (samples per shadow; ``None``: the target's
    ``train_size``)."""

    shadows: int = 4
    fixed_variance: bool = True
    test: Literal["one_sided", "two_sided"] = "one_sided"
    shadow_size: int | None = None
    surfaces: ClassVar[tuple[str, ...]] = (Surface.PRIVACY,)
    observes: ClassVar[str] = "model"
    summary: ClassVar[str] = "Offline LiRA: the candidate's confidence against Gaussian fits to OUT shadow models"
    reference: ClassVar[str] = "Carlini, Chien, Nasr, Song, Terzis & Tramèr, IEEE S&P 2022"

    def validate_shadows(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "shadows", v, "must be an integer ≥ 1 (OUT shadow models to train)")

    def validate_fixed_variance(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "fixed_variance", v, "must be true or false")
        if not v and self.shadows < 2:
            raise param_error(self, "shadows", self.shadows,
                              "must be ≥ 2 when fixed_variance is false (a per-candidate σ needs two OUT models)")

    def validate_test(self, v: str) -> None:
        if v not in TESTS:
            raise param_error(self, "test", v, "must be 'one_sided' (the paper's offline test) or 'two_sided' "
                                               "(the authors' released offline score)")

    def validate_shadow_size(self, v: int | None) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise param_error(self, "shadow_size", v, "must be an integer ≥ 1 or None (the target's train_size)")

    def shadow_confidences(self, obs: ModelObservation) -> "torch.Tensor":
        """``(shadows, m)``: φ of every candidate under each OUT model, trained by ``obs.train`` on a fresh
        random subset of the population (drawn without replacement from ``obs.generator``) and
        evaluated at once (one model's parameters held at a time)."""
        import torch

        n = int(obs.population_y.shape[0])
        size = int(obs.train_size) if self.shadow_size is None else self.shadow_size
        if size < 1 or size > n:
            raise param_error(self, "shadow_size", self.shadow_size,
                              f"each shadow trains on {size} samples (train_size = {obs.train_size} when unset), "
                              f"which the attacker's population of {n} cannot supply: set shadow_size ≤ {n}")
        g = obs.generator
        rows = []
        for k in range(self.shadows):
            idx = torch.randperm(n, generator=g, device=g.device)[:size].to(obs.population_y.device)
            flat = obs.train(obs.population_x[idx], obs.population_y[idx], g)
            if tuple(flat.shape) != tuple(obs.params.shape):
                raise ValueError(f"LiRA: obs.train returned shadow {k} of shape {tuple(flat.shape)}, "
                                 f"expected the model's {tuple(obs.params.shape)}")
            rows.append(self.confidences(obs, flat.detach()))
        return torch.stack(rows)

    def confidences(self, obs: ModelObservation, flat: "torch.Tensor") -> "torch.Tensor":
        """``(m,)`` φ of every candidate under the model ``flat`` (one batched forward)."""
        out = _outputs(obs, flat)
        if out.ndim != 2 or out.shape[1] != int(obs.model.num_classes):
            raise ValueError(f"LiRA: the model's outputs must be (candidates, num_classes = "
                             f"{obs.model.num_classes}) logits, got shape {tuple(out.shape)}")
        return logit_confidence(out, obs.candidates_y)

    def membership_scores(self, obs: ModelObservation) -> "torch.Tensor":
        _check_observation(self, obs, classifier=True)
        phi_target = self.confidences(obs, obs.params)
        phi_out = self.shadow_confidences(obs)
        return offline_lira_scores(phi_target, phi_out, fixed_variance=self.fixed_variance, test=self.test)
