"""CRFL: certifiably robust federated learning by clipping and smoothing the global model.

Xie, Chen, Chen & Li, "CRFL: Certifiably Robust Federated Learning against Backdoor Attacks",
ICML 2021 (PMLR 139). Authors' code: github.com/AI-secure/CRFL (commit
549eb5305bb738cc45c60bc77e1fc2fea38084fe: ``main.py``, ``utils/helper.py``, ``configs/*.yaml``,
``smooth_mnist.py``, ``certify_mnist.py``; read for this implementation, none of it copied).

**Training** (:class:`CRFL`, the server's rule). After the clients' updates are averaged into the
global model, the server clips the *parameters of the global model* to norm ρₜ and perturbs them
with Gaussian noise:

    wₜ = clip(wₜ₋₁ + mean(Δ), ρₜ) + N(0, σ²I),   clip(w, ρ) = w·min(1, ρ/‖w‖₂),

with the schedule ρₜ = min(ρ, ρ₀ + a·t) (t = 1, 2, … the round; the authors: MNIST ρ = 15,
ρ₀ = 2, a = 0.1; EMNIST 100, 4, 0.25; LOAN 5, 2, 0.025) and σ = 0.01 in all three configs. As a
:class:`~redteam.types.Defense` the aggregate is the delta that produces that model:
clip(G + mean) + σ·z − G with G = ``ctx.global_params`` and z drawn from ``ctx.generator``; the
server's plain FedAvg step with learning rate 1 (the engine's default) then makes the new model
exactly the paper's (another server optimiser or learning rate moves the model by its own rule).

**Testing** (:func:`certify`). The smoothed classifier votes over M noisy copies w + N(0, σ_T²I) of
the trained model; its prediction on x is certified against any backdoor of magnitude ‖δ‖ below the
paper's radius (:func:`certified_radius`), computed from Hoeffding bounds on the top two classes'
vote shares: p_A ≥ p̂_A − √(ln(1/α)/2M) and p_B ≤ p̂_B + √(ln(1/α)/2M).

Conventions, and where the implementations differ:

* ``weighting``: the authors average the updates with equal weights (the sum over the round's
  clients divided by their number, ``average_models_params``): ``"uniform"`` (default);
  ``"samples"`` weighs by the clients' sample counts (FedAvg).
* The authors clip with coefficient ρ/(‖w‖ + 10⁻⁶) only when ‖w‖ > ρ; here the coefficient is
  exactly ρ/‖w‖, so a clipped model has norm ρ and one on the threshold is unchanged.
* The authors evaluate the clipped model *before* adding the round's noise (the noise then moves
  the model the next round trains from); the engine evaluates the model after the aggregate, i.e.
  with the noise. Clean accuracy reported here is therefore that of one noisy model, not of the
  smoothed classifier (use :func:`certify` for that).
* Non-finite updates are rejected (the authors do not screen); the mean is over the finite ones.
* The rows are the model's parameters as the engine flattens them (the authors clip
  ``named_parameters`` but add the noise to every ``state_dict`` entry, buffers included).
* The Snowball authors' baseline (github.com/zhenqincn/Snowball, ``fl_core/anti_poison/crfl.py``)
  clips the averaged *update* to 15 and adds σ = 0.01 noise to it, and votes over 20 noisy models.
  BackFed (github.com/thinh-dao/BackFed, ``backfed/servers/robust_aggregation/crfl_server.py``)
  builds CRFL on its weak-DP server: each client *update* clipped to 5.0, noise σ = 0.025 on the
  averaged update, server learning rate 0.1, and a smoothed evaluation (σ_T = 0.01, M = 1000) in the
  last round only. Neither clips the global model's parameters as the paper and its authors do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Sequence

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ModelView, ServerContext, param_error, sample_weights

from ._common import check_choice, check_count, check_number, combine, finite_rows, generator_of
from ._stats import safe_norms, saturate

if TYPE_CHECKING:
    import torch

__all__ = ["CRFL", "CertifySetting", "Certificate", "certify", "certified_radius", "clip_threshold"]


def clip_threshold(t: int, rho: float, rho_start: float, rho_growth: float) -> float:
    """ρₜ = min(ρ, ρ₀ + a·t): the clipping threshold of round t (t ≥ 1)."""
    return min(float(rho), float(rho_start) + float(rho_growth) * float(t))


@dataclass(frozen=True, slots=True)
class CRFL(Aggregator):
    """CRFL (Xie et al., ICML 2021), training side: the averaged global model is clipped to norm ρₜ
    and perturbed with N(0, σ²I).

    * ``rho``: the cap ρ of the clipping schedule (authors' MNIST config: 15);
    * ``rho_start`` / ``rho_growth``: ρₜ = min(ρ, ρ₀ + a·t), t = round + 1 (MNIST: 2 and 0.1; a
      constant threshold: ``rho_growth = 0`` and ``rho_start = rho``);
    * ``sigma``: the noise σ ≥ 0 on the parameters (0.01);
    * ``weighting``: ``"uniform"`` (authors) or ``"samples"``.

    Needs ``ctx.global_params``. ``Decision.state``: ρₜ, σ, the norm of the averaged model before
    clipping and the clipping factor.
    """

    rho: float = 15.0
    rho_start: float = 2.0
    rho_growth: float = 0.1
    sigma: float = 0.01
    weighting: Literal["uniform", "samples"] = "uniform"
    unanimity: ClassVar[bool] = False  # the model is clipped and noise is added
    summary: ClassVar[str] = "CRFL: clip the global model's parameters to ρₜ, add N(0, σ²) (smoothing)"
    reference: ClassVar[str] = "Xie, Chen, Chen & Li, ICML 2021"

    def validate_rho(self, v: float) -> None:
        check_number(self, "rho", v, low=0.0, low_open=True)

    def validate_rho_start(self, v: float) -> None:
        check_number(self, "rho_start", v, low=0.0, low_open=True)

    def validate_rho_growth(self, v: float) -> None:
        check_number(self, "rho_growth", v, low=0.0)

    def validate_sigma(self, v: float) -> None:
        check_number(self, "sigma", v, low=0.0)

    def validate_weighting(self, v: str) -> None:
        check_choice(self, "weighting", v, ("uniform", "samples"))

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        if ctx.global_params is None:
            raise InvalidParameter("CRFL: ctx.global_params is needed (the global model's parameters are clipped)")
        glob = ctx.global_params.to(device=updates.device, dtype=torch.float64)
        if tuple(glob.shape) != (d,):
            raise InvalidParameter(f"CRFL: ctx.global_params has shape {tuple(glob.shape)}, expected ({d},)")
        ok = finite_rows(updates)
        base = torch.ones(n, dtype=torch.float64, device=updates.device) if self.weighting == "uniform" \
            else sample_weights(ctx, n, updates).to(torch.float64)
        w = torch.where(ok, base, torch.zeros_like(base))
        total = float(w.sum())
        w = w / total if total > 0 else w
        mean = combine(w.to(updates.dtype), updates, ok, convex=True).to(torch.float64) if total > 0 \
            else torch.zeros(d, dtype=torch.float64, device=updates.device)
        model = glob + mean
        norm = float(safe_norms(model[None, :], torch.ones(1, dtype=torch.bool, device=updates.device))[0])
        rho_t = clip_threshold(int(ctx.round) + 1, self.rho, self.rho_start, self.rho_growth)
        scale = rho_t / norm if norm > rho_t else 1.0
        new = model * scale
        if self.sigma > 0:
            dt = torch.float64 if updates.dtype == torch.float64 else torch.float32
            noise = torch.randn(d, generator=generator_of(ctx), dtype=dt, device="cpu").to(updates.device)
            new = new + self.sigma * noise.to(torch.float64)
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        return Decision(aggregate=saturate(new - glob, updates.dtype), accepted=ok,
                        weights=(w * scale).to(updates.dtype), reasons=reasons,
                        state={"rho_t": rho_t, "sigma": self.sigma, "norm_before": norm, "clip_factor": scale})


# ---------------------------------------------------------------------------- certification
@dataclass(frozen=True, slots=True)
class CertifySetting:
    """What the certified radius depends on besides p_A and p_B: the training run and the attack it
    certifies against (the paper's notation; defaults: the authors' ``configs/mnist_params.yaml``).

    * ``rounds``: T, the round whose model is certified; ``attack_round``: t_adv, the round of the
      attack (MNIST config: 100 and 70);
    * ``attackers``: R (2); ``agg_weights``: each attacker's aggregation weight pᵢ (``None``: 1/N each,
      N = ``clients`` = 20);
    * ``scale``: γ, the attackers' scaling factor (100); ``lr``: η, the local learning rate (0.001);
    * ``local_steps``: τ, local iterations per round (the authors: 60000/N/n_B = 30);
    * ``poison_per_batch`` / ``batch_size``: q_B / n_B (5 / 100);
    * ``lipschitz``: L_Z (the authors: √(2 + 2ρ + ρ²) with ρ = 3, i.e. √17);
    * ``sigma_train``: σ of the training noise (0.01); ``rho``, ``rho_start``, ``rho_growth``: the
      clipping schedule of :class:`CRFL` (15, 2, 0.1).
    """

    rounds: int = 100
    attack_round: int = 70
    attackers: int = 2
    clients: int = 20
    agg_weights: "tuple[float, ...] | None" = None
    scale: float = 100.0
    lr: float = 0.001
    local_steps: float = 30.0
    poison_per_batch: int = 5
    batch_size: int = 100
    lipschitz: float = math.sqrt(17.0)
    sigma_train: float = 0.01
    rho: float = 15.0
    rho_start: float = 2.0
    rho_growth: float = 0.1

    def __post_init__(self) -> None:
        for name in ("rounds", "attackers", "clients", "batch_size"):
            check_count(self, name, getattr(self, name), allow_none=False, minimum=1)
        check_count(self, "attack_round", self.attack_round, allow_none=False, minimum=0)
        if self.attack_round >= self.rounds:
            raise param_error(self, "attack_round", self.attack_round, f"must be below rounds = {self.rounds}")
        check_count(self, "poison_per_batch", self.poison_per_batch, allow_none=False, minimum=1)
        if self.poison_per_batch > self.batch_size:
            raise param_error(self, "poison_per_batch", self.poison_per_batch,
                              f"must be at most batch_size = {self.batch_size}")
        for name in ("scale", "lr", "local_steps", "lipschitz", "sigma_train", "rho", "rho_start"):
            check_number(self, name, getattr(self, name), low=0.0, low_open=True)
        check_number(self, "rho_growth", self.rho_growth, low=0.0)
        if self.agg_weights is not None:
            ws = tuple(self.agg_weights)
            if len(ws) != self.attackers or not all(isinstance(x, (int, float)) and math.isfinite(x) and 0 < x <= 1
                                                    for x in ws):
                raise param_error(self, "agg_weights", self.agg_weights,
                                  f"must be {self.attackers} weights in (0, 1], one per attacker, or None")

    def weights(self) -> "tuple[float, ...]":
        return tuple(self.agg_weights) if self.agg_weights is not None else (1.0 / self.clients,) * self.attackers


def certified_radius(p_a: Any, p_b: Any, sigma_test: float, setting: CertifySetting = CertifySetting()) -> "torch.Tensor":
    """The radius RAD (on the backdoor magnitude ‖δ‖) up to which the smoothed model's prediction is
    certified, per sample (float64), from a lower bound ``p_a`` on the top class's probability and an
    upper bound ``p_b`` on the runner-up's:

        RAD² = −ln(1 − (√p_A − √p_B)²)·σ² / (2·R·(Σᵢ pᵢ²)·γ²·τ²·η²·L_Z²·(q_B/n_B)²·Π),
        Π = Πₜ₌ₜₐ_ᵥ₊₁^{T−1} (2Φ(ρₜ/σ) − 1) · (2Φ(ρ_T/σ_T) − 1),

    σ the training noise, σ_T = ``sigma_test``, Φ the standard normal CDF, as the authors'
    ``certify_mnist.py`` computes it. 0 where p_A ≤ p_B (no certificate; the authors' formula, being
    symmetric in p_A and p_B, would return a radius there too) and +∞ where p_A = 1."""
    import torch

    if not (isinstance(sigma_test, (int, float)) and math.isfinite(sigma_test) and sigma_test > 0):
        raise InvalidParameter(f"certified_radius: sigma_test = {sigma_test!r}: must be a finite number > 0")
    pa = torch.as_tensor(p_a, dtype=torch.float64)
    pb = torch.as_tensor(p_b, dtype=torch.float64)
    s = setting
    contract = 1.0
    for t in range(s.attack_round + 1, s.rounds):
        rho_t = clip_threshold(t, s.rho, s.rho_start, s.rho_growth)
        contract *= 2.0 * _phi(rho_t / s.sigma_train) - 1.0
    contract *= 2.0 * _phi(clip_threshold(s.rounds, s.rho, s.rho_start, s.rho_growth) / sigma_test) - 1.0
    denom = (2.0 * s.attackers * sum(w * w for w in s.weights()) * s.scale ** 2 * s.local_steps ** 2 * s.lr ** 2
             * s.lipschitz ** 2 * (s.poison_per_batch / s.batch_size) ** 2 * contract)
    gap = (pa.clamp(0.0, 1.0).sqrt() - pb.clamp(0.0, 1.0).sqrt()).square()
    num = -torch.log1p(-gap) * s.sigma_train ** 2
    rad = (num / denom).sqrt() if denom > 0 else torch.full_like(num, math.inf)
    rad = torch.where(pa >= 1.0, torch.full_like(rad, math.inf), rad)
    return torch.where(pa > pb, rad, torch.zeros_like(rad))


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True, slots=True)
class Certificate:
    """What :func:`certify` returns, one entry per input: ``predictions`` (the smoothed model's
    class c_A; ties between classes go to the lower one), ``p_a`` / ``p_b`` (the Hoeffding bounds on
    the top and runner-up vote shares), ``radius`` (:func:`certified_radius`; 0: not certified),
    ``correct`` (prediction == label) and ``counts`` ``(N, classes)`` (the votes)."""

    predictions: "torch.Tensor"
    p_a: "torch.Tensor"
    p_b: "torch.Tensor"
    radius: "torch.Tensor"
    correct: "torch.Tensor"
    counts: "torch.Tensor" = field(repr=False)

    def certified_accuracy(self, r: float = 0.0) -> float:
        """The share of inputs predicted correctly with a certified radius ≥ r (> 0 at r = 0)."""
        ok = self.correct & ((self.radius >= r) if r > 0 else (self.radius > 0))
        return float(ok.to(float).mean()) if ok.numel() else 0.0


def certify(view: ModelView, flat: "torch.Tensor", x: "torch.Tensor", y: "torch.Tensor", sigma: float = 0.01,
            M: int = 1000, alpha: float = 0.001, *, setting: CertifySetting = CertifySetting(),
            generator: "torch.Generator | None" = None, chunk: int = 4096) -> Certificate:
    """Parameter smoothing at test time: M copies ``flat`` + N(0, σ²I) of the model vote on every
    input of ``x``; the top class's share p̂_A and the runner-up's p̂_B give the Hoeffding bounds
    p_A = max(10⁻⁸, p̂_A − h), p_B = min(1 − 10⁻⁸, p̂_B + h), h = √(ln(1/α)/(2M)), and the certified
    radius :func:`certified_radius` (authors' defaults: σ = 0.01, M = 1000, α = 0.001).

    Worked example (tests/test_defenses_snowball_crfl.py): a model whose margin dwarfs σ wins all M
    votes, so p̂_A = 1, p̂_B = 0; with M = 1000, α = 0.001, h = √(ln 1000/2000) = 0.05877, p_A =
    0.94123, p_B = 0.05877 and −ln(1 − (√p_A − √p_B)²) = 0.75420; with the default setting (σ = σ_T =
    0.01, ρₜ ≥ 9.1 ≫ σ so Π = 1, R = 2, pᵢ = 1/20, γ = 100, τ = 30, η = 0.001, L_Z = √17,
    q_B/n_B = 0.05) the denominator is 2·2·(2/400)·10⁴·900·10⁻⁶·17·0.0025 = 0.00765 and
    RAD = √(0.75420·10⁻⁴/0.00765) = 0.09929::

        from defenses.crfl import certify, CertifySetting
        cert = certify(view, flat, x_test, y_test, sigma=0.01, M=1000, alpha=0.001,
                       setting=CertifySetting(rounds=30, attack_round=10),
                       generator=torch.Generator().manual_seed(0))
        cert.certified_accuracy(0.1), cert.radius.median()

    ``view``: the model as functions of a flat row (e.g. a federation's ``ModelView``); ``flat``:
    the trained model's parameters; ``y``: the true labels (``correct``). The noise is drawn from
    ``generator`` (seeded 0 when none) on the CPU; a loop over the M copies, ``chunk`` inputs at a time.
    """
    import torch

    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise InvalidParameter(f"certify: sigma = {sigma!r}: must be a finite number > 0")
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise InvalidParameter(f"certify: M = {M!r}: must be an integer ≥ 1")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise InvalidParameter(f"certify: alpha = {alpha!r}: must be a number in (0, 1)")
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    n = int(x.shape[0])
    classes = max(int(view.num_classes), 2)
    counts = torch.zeros(n, classes, dtype=torch.long)
    base = flat.detach()
    with torch.no_grad():
        for _ in range(M):
            noisy = base + sigma * torch.randn(base.shape, generator=g, dtype=torch.float32).to(base)
            for s in range(0, n, chunk):
                pred = view.forward(noisy, x[s:s + chunk]).argmax(-1).to("cpu")
                counts[torch.arange(s, s + pred.shape[0]), pred] += 1
    top2 = torch.topk(counts, 2, dim=1, sorted=True)
    # topk on ties returns any of them: the prediction is the lowest class with the top count
    best = counts.max(dim=1).values
    pred = (counts == best[:, None]).to(torch.int8).argmax(dim=1)
    h = math.sqrt(math.log(1.0 / alpha) / (2.0 * M))
    pa = (top2.values[:, 0].to(torch.float64) / M - h).clamp_min(1e-8)
    pb = (top2.values[:, 1].to(torch.float64) / M + h).clamp_max(1.0 - 1e-8)
    radius = certified_radius(pa, pb, float(sigma), setting)
    correct = pred == y.detach().to("cpu").long()
    return Certificate(predictions=pred, p_a=pa, p_b=pb, radius=radius, correct=correct, counts=counts)
