"""Gaussian noise on the aggregate ("weak" differential privacy).

* Sun, Kairouz, Suresh & McMahan, "Can You Really Backdoor Federated Learning?",
  arXiv:1911.07963 (2019): after norm bounding, add N(0, σ²I) to the aggregate; a
  small σ already blunts backdoors ("weak DP": no privacy accounting is claimed).
* McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent
  Language Models", ICLR 2018 (DP-FedAvg): the same Gaussian mechanism on the
  clipped average, with σ set from the clipping bound and a privacy budget.

Here σ is given directly, as a standard deviation on the scale of the aggregate.
Combine with ``clip`` or ``norm_bound`` for the DP-FedAvg shape:
``Pipeline((Clip(bound=S), Mean(), DPNoise(sigma=z*S/n)))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.pipeline import PostProcessor
from redteam.types import Decision, Defense, ServerContext, param_error

from ._common import check_number, combine, finite_rows, generator_of
from .clipping import Clip

if TYPE_CHECKING:
    import torch

__all__ = ["DPNoise", "DPFedAvg"]


@dataclass(frozen=True, slots=True)
class DPNoise(PostProcessor):
    """Add i.i.d. Gaussian noise N(0, σ²) to every coordinate of the aggregate.

    * ``sigma``: the standard deviation σ ≥ 0 (0 adds nothing). The default 0.025 is
      the order of noise Sun et al. (2019) evaluated on EMNIST.

    The noise is drawn on the CPU from ``ctx.generator`` (seeded 0 when the context
    has none) in float32 or wider, then moved to the aggregate's device and dtype, so
    a seed gives the same noise on every device.
    """

    sigma: float = 0.025
    screens_nonfinite: ClassVar[bool] = False  # rows pass through: put `sanity` (or a rule that screens) first
    unanimity: ClassVar[bool] = False  # identical rows do not give back that row: noise is added
    needs_client_rows: ClassVar[bool] = False  # noise on the mean: the sum is enough
    summary: ClassVar[str] = "Gaussian noise N(0, σ²) on the aggregate (weak DP / DP-FedAvg)"
    reference: ClassVar[str] = "Sun et al., arXiv:1911.07963, 2019; McMahan et al., ICLR 2018"

    def validate_sigma(self, v: float) -> None:
        check_number(self, "sigma", v, low=0.0)

    def post(self, aggregate: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor":
        import torch

        if self.sigma == 0:
            return aggregate.clone()
        dtype = torch.float64 if aggregate.dtype == torch.float64 else torch.float32
        noise = torch.randn(aggregate.shape, generator=generator_of(ctx), dtype=dtype, device="cpu")
        noise = noise.to(device=aggregate.device)
        return (aggregate.to(dtype) + self.sigma * noise).to(aggregate.dtype)


@dataclass(frozen=True, slots=True)
class DPFedAvg(Defense):
    """Client-level differentially private federated averaging (DP-FedAvg).

    McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent Language Models",
    ICLR 2018, Algorithm 1 with uniform client weights: each client's update is clipped to L2 norm
    S (``clip``), the clipped updates are summed, Gaussian noise N(0, (zS)²I) is added to the sum
    (z: ``noise_multiplier``) and the result is divided by the number of clients m (the paper's
    fixed-denominator estimator with w_k = 1 and every drawn client reporting). The run reports the
    ε this gives at ``[privacy] delta`` over its rounds, from ``dp-accounting``
    (:mod:`redteam.privacy.accountant`; ``sampling`` names the analysis, see there).

    Under secure aggregation each client clips its own row (:meth:`client_side`) and the server,
    which reads only sums, adds the noise to them (``ServerContext.summed``). Sample counts do
    not weight the mean: a client's weight would be part of its sensitivity.

    * ``clip``: S > 0; ``noise_multiplier``: z ≥ 0 (0: clipping alone, ε infinite);
    * ``sampling``: ``"without_replacement"`` (default: how the harness draws K of N clients) or
      ``"poisson"`` (the paper's analysis).
    """

    clip: float = 1.0
    noise_multiplier: float = 1.0
    sampling: str = "without_replacement"
    unanimity: ClassVar[bool] = False
    needs_client_rows: ClassVar[bool] = False
    accounts_privacy: ClassVar[bool] = True
    summary: ClassVar[str] = "DP-FedAvg: clip each client to S, noise N(0, (zS)²) on the sum, ε from dp-accounting"
    reference: ClassVar[str] = "McMahan, Ramage, Talwar & Zhang, ICLR 2018"

    def validate_clip(self, v: float) -> None:
        check_number(self, "clip", v, low=0.0, low_open=True)

    def validate_noise_multiplier(self, v: float) -> None:
        check_number(self, "noise_multiplier", v, low=0.0)

    def validate_sampling(self, v: str) -> None:
        if v not in ("without_replacement", "poisson"):
            raise param_error(self, "sampling", v, 'must be "without_replacement" or "poisson"')

    def client_side(self, rows: "torch.Tensor") -> "torch.Tensor":
        # the same clipping as `clip` (Sun et al.): rows with a non-finite entry pass unchanged
        return Clip(bound=self.clip).transform(rows, rows.new_ones(rows.shape[0]), ServerContext.default(rows))[0]

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n = int(updates.shape[0])
        counts = torch.as_tensor(ctx.summed if ctx.summed is not None else [1] * n, dtype=torch.float64,
                                 device=updates.device)
        finite = finite_rows(updates)
        # a sum's mean has norm ≤ S when its clients clipped: clipping it again changes nothing;
        # a non-finite row is rejected and weighs 0 (combine keeps 0·NaN out of the sum)
        weights = torch.where(finite, counts, torch.zeros_like(counts))
        total = combine(weights, self.client_side(updates), finite).to(torch.float64)
        if self.noise_multiplier:
            noise = torch.randn(total.shape, generator=generator_of(ctx), dtype=torch.float64, device="cpu")
            total = total + self.noise_multiplier * self.clip * noise.to(total.device)
        agg = total / max(float(weights.sum()), 1.0)
        reasons = {int(i): "non-finite update" for i in torch.nonzero(~finite).flatten().tolist()}
        return Decision(aggregate=agg.to(updates.dtype), accepted=finite, reasons=reasons)

    def dp_mechanism(self, population: int, per_round: int, rounds: int) -> Any:
        from redteam.privacy.accountant import ClientLevelDP

        return ClientLevelDP(self.noise_multiplier, population, per_round, rounds, self.sampling)
