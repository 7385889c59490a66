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
from typing import TYPE_CHECKING, ClassVar

from redteam.pipeline import PostProcessor
from redteam.types import ServerContext

from ._common import check_number, generator_of

if TYPE_CHECKING:
    import torch

__all__ = ["DPNoise"]


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
