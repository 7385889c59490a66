"""ε of a run's Gaussian mechanism, computed by Google's ``dp-accounting`` library.

Why that library and that accountant: ``dp-accounting`` is the accountant maintained with
TensorFlow Privacy and used by TensorFlow Federated's DP-FedAvg; it installs without torch (Opacus'
accountants would pin a torch of their own), and its Rényi-DP accountant (Mironov, CSF 2017) is
the one of its accountants that analyses *sampling without replacement* of a fixed-size batch
(Wang, Balle & Kasiviswanathan, AISTATS 2019), which is how this harness draws K of N clients per
round. Its PLD accountant is tighter but analyses Poisson sampling only; ``sampling = "poisson"``
asks for McMahan et al.'s analysis (each client joins a round independently with q = K/N), which
the RDP accountant also computes.

Sensitivity. DP-FedAvg clips each client's update to L2 norm S and adds N(0, (zS)²) to their sum
(McMahan, Ramage, Talwar & Zhang, ICLR 2018). Adding or removing one client changes that sum by at
most S (noise multiplier z relative to the sensitivity); replacing one client changes it by up to
2S, so under the replace-one relation that sampling without replacement needs, the event's noise
multiplier is z/2. Both are as ``dp-accounting`` defines ``GaussianDpEvent.noise_multiplier``
(noise std over L2 sensitivity).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from ..errors import InvalidParameter

__all__ = ["ClientLevelDP", "ExampleLevelDP", "epsilon"]


@dataclass(frozen=True, slots=True)
class ClientLevelDP:
    """A client-level Gaussian mechanism run for ``rounds`` rounds over ``population`` clients,
    ``per_round`` of them drawn each round (uniformly, without replacement), each clipped to S and
    the sum noised with standard deviation ``noise_multiplier``·S."""

    noise_multiplier: float
    population: int
    per_round: int
    rounds: int
    sampling: Literal["without_replacement", "poisson"] = "without_replacement"

    def event(self) -> object:
        """The ``dp_accounting.DpEvent`` of the whole run."""
        import dp_accounting as dpa

        z = float(self.noise_multiplier)
        if self.per_round >= self.population:  # every client in every round: no amplification
            one: object = dpa.GaussianDpEvent(z)
        elif self.sampling == "poisson":
            one = dpa.PoissonSampledDpEvent(self.per_round / self.population, dpa.GaussianDpEvent(z))
        else:  # replace-one: the sum's sensitivity is 2S
            one = dpa.SampledWithoutReplacementDpEvent(self.population, self.per_round, dpa.GaussianDpEvent(z / 2))
        return dpa.SelfComposedDpEvent(one, int(self.rounds))

    def relation(self) -> object:
        import dp_accounting as dpa

        if self.per_round < self.population and self.sampling == "without_replacement":
            return dpa.NeighboringRelation.REPLACE_ONE
        return dpa.NeighboringRelation.ADD_OR_REMOVE_ONE


@dataclass(frozen=True, slots=True)
class ExampleLevelDP:
    """DP-SGD on a client (Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar & Zhang, CCS 2016):
    ``steps`` noisy steps, each on a batch drawn at rate ``sample_rate`` = B/n of the client's n
    examples, each example clipped to C, noise multiplier σ on the sum. Accounted as Poisson
    sampling at that rate with the add-or-remove relation, the convention Opacus and TensorFlow
    Privacy report for fixed-size batches (the harness draws fixed-size batches; the figure is that
    convention's, not a proof for its sampler). The run takes the client with the fewest examples
    (the largest rate) and counts every round as one it trained in (client sampling's amplification
    is left out): an upper bound over its clients."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    sampling: str = "poisson"

    def event(self) -> object:
        import dp_accounting as dpa

        q = min(1.0, float(self.sample_rate))
        one = (dpa.GaussianDpEvent(float(self.noise_multiplier)) if q >= 1.0 else
               dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(float(self.noise_multiplier))))
        return dpa.SelfComposedDpEvent(one, int(self.steps))

    def relation(self) -> object:
        import dp_accounting as dpa

        return dpa.NeighboringRelation.ADD_OR_REMOVE_ONE

    @property
    def rounds(self) -> int:
        return int(self.steps)

    @property
    def population(self) -> int:
        return 1

    @property
    def per_round(self) -> int:
        return 1


def epsilon(mech: "ClientLevelDP | ExampleLevelDP", delta: float) -> float:
    """ε at ``delta`` of ``mech`` from ``dp-accounting``'s RDP accountant (``inf`` with no noise)."""
    if not 0 < delta < 1:
        raise InvalidParameter(f"epsilon: delta = {delta!r}: must be in (0, 1)")
    if mech.noise_multiplier < 0 or mech.rounds < 0 or mech.population < 1 or mech.per_round < 1:
        raise InvalidParameter(f"epsilon: {mech!r}: noise_multiplier and rounds must be ≥ 0, population and "
                               "per_round ≥ 1")
    if mech.noise_multiplier == 0:
        return float("inf")
    if mech.rounds == 0:
        return 0.0
    try:
        from dp_accounting import rdp
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise InvalidParameter("ε needs the dp-accounting package (pip install dp-accounting)") from exc
    absl = logging.getLogger("absl")  # its accountant warns for every RDP order it drops
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        acc = rdp.RdpAccountant(neighboring_relation=mech.relation())
        acc.compose(mech.event())
        return float(acc.get_epsilon(delta))
    finally:
        absl.setLevel(level)
