"""Spot-check replay inside the round: recompute a sampled fraction of the peers' work.

Proof-of-learning (Jia et al., "Proof-of-Learning: Definitions and Practice", IEEE S&P 2021)
and Verde (Arun et al., arXiv:2502.19405, 2025) make a peer's training reproducible from what
it committed to, so that a verifier can redo it: the start (here the round's global model
w, which every peer received), the seed of its batch stream and its data assignment (the data
it was dealt, which a permissionless trainer publishes). A verifier that replays a sampled
fraction p of the peers each round catches a peer that does not do the assigned work — fewer
steps scaled up (``lazy_scaled``), training on other data (``score_gaming``, data poisoning),
a copy of another peer's update (``copy_noise``), any crafted update — in the first round it
samples that peer: after a geometric number of rounds, 1/p on average.

The rule, stated exactly (``SpotCheck``, a filter):

1. Each client is checked this round with probability ``fraction`` (independent Bernoulli
   draws from the defense's stream, one per client in increasing client id, so the choice does
   not depend on the order the rows arrived in).
2. For a checked client c the engine recomputes its update honestly
   (``ServerContext.replay_work``: its local procedure from w on its assigned data with its
   round's batch draws, :meth:`redteam.federation.training.BatchedTrainer.replay`), r_c, and
   the row x_c is rejected when ‖x_c − r_c‖ > ``tol`` · max(‖r_c‖, 1e-30) (a relative
   distance; the reason gives the figure).
3. ``ban = true`` (default: a caught peer is slashed, as a staking protocol does): a client
   caught once is rejected in every later round without a replay.

The tolerance: a replay runs the same float32 operations on the same batches, but batched over
the k replayed rows instead of all the round's rows, which may change the last bits of the
batched products. Measured on ``digits`` (20 clients, 3 rounds, every peer replayed): 60 of 60
honest replays bitwise equal to the peers' updates at 1 and at 2 threads (``tol = 0`` passes);
``tests/test_spot_check.py`` bounds the gap at 1e-6 of the update on a model trained from random
inputs, across thread counts and with FedProx, weight decay and ``local_epochs``. The default
``tol`` = 1e-4 leaves a margin for other hardware, while every cheat above is off by far more. A cheat that stays inside the band is the tolerance's price (see
``redteam.federation.replay`` for the PoL version of that budget).

``Decision.state``: ``caught`` (client id → the round it was caught in, kept across rounds)
and ``spot_check`` (this round's ``checked`` client ids and its ``rows`` count); the engine
copies them into ``RoundRecord.extra["spot_check"]``, from which scoring computes
``verification_cost`` (replayed peer trainings ÷ peer trainings), ``rounds_to_catch`` and
``uncaught_cheats``.

The engine can replay only a stateless local procedure (SGD, batches with replacement, no
client momentum) sent through a lossless codec, in the server's synchronous round; it refuses
other scenarios by name when the run is built. The verifier's compute is the
``verification_cost`` share of the peers' training (about ``fraction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.errors import InvalidParameter
from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext, param_error

from ._common import check_number, finite_rows

if TYPE_CHECKING:
    import torch

__all__ = ["SpotCheck"]


@dataclass(frozen=True, slots=True)
class SpotCheck(Filter):
    """Replay a random fraction of the peers' local training and reject the rows that differ.

    * ``fraction``: the probability p that a peer is checked in a round (0 < p ≤ 1);
    * ``tol``: the relative distance ‖x − r‖ / ‖r‖ a row may differ from its replay r;
    * ``ban``: a peer caught once is rejected in every later round.
    """

    fraction: float = 0.1
    tol: float = 1e-4
    ban: bool = True
    replays_work: ClassVar[bool] = True
    summary: ClassVar[str] = "Spot-check replay: redo a sampled fraction of the peers' local training, reject mismatches"
    reference: ClassVar[str] = "Jia et al., IEEE S&P 2021 (Proof-of-Learning); Arun et al., arXiv:2502.19405 (Verde)"

    def validate_fraction(self, v: float) -> None:
        check_number(self, "fraction", v, low=0.0, low_open=True, high=1.0)

    def validate_tol(self, v: float) -> None:
        check_number(self, "tol", v, low=0.0)

    def validate_ban(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "ban", v, "must be true or false")

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        if ctx.replay_work is None:
            raise InvalidParameter(
                "SpotCheck needs ctx.replay_work (the engine's replay of a peer's local training), but it is None: "
                "it runs in the server's synchronous round with SGD, batches drawn with replacement, no client "
                "momentum and a lossless codec")
        n = int(updates.shape[0])
        ids = tuple(int(c) for c in ctx.client_ids)
        if len(ids) != n:
            raise InvalidParameter(
                f"SpotCheck checks clients' rows, but this node's {n} rows carry {len(ids)} client ids (an upper "
                "node of a [hierarchy] merges sub-aggregates, which cannot be replayed): use it as the bottom "
                "[defense], not as upper_defense")
        caught: dict[int, int] = {int(k): int(v) for k, v in dict(ctx.state.get("caught", {})).items()}
        ok = finite_rows(updates)
        reasons: dict[int, str] = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        if self.ban:
            for i, c in enumerate(ids):
                if c in caught and bool(ok[i]):
                    ok[i] = False
                    reasons[i] = f"caught by spot-check in round {caught[c]} (banned)"
        # one draw per client, in the order of the client ids (not of the rows): who is checked does
        # not depend on the order the rows arrived in, and a client's copies are checked together
        g = ctx.generator
        clients = sorted(set(ids))
        draw = torch.rand(len(clients), generator=g, dtype=torch.float64,
                          device=g.device if g is not None else "cpu").tolist()
        chosen = {c for c, u in zip(clients, draw) if u < self.fraction}
        pick = [i for i in range(n) if ids[i] in chosen and bool(ok[i])]
        checked: list[int] = []
        if pick:
            want = tuple(dict.fromkeys(ids[i] for i in pick))  # a client's copies share one replay
            replayed = torch.as_tensor(ctx.replay_work(want))
            if tuple(replayed.shape) != (len(want), int(updates.shape[1])):
                raise InvalidParameter(f"SpotCheck: ctx.replay_work returned shape {tuple(replayed.shape)} for "
                                       f"{len(want)} clients; expected ({len(want)}, {int(updates.shape[1])})")
            ref = {c: replayed[k] for k, c in enumerate(want)}
            for i in pick:
                c = ids[i]
                r = ref[c].to(device=updates.device, dtype=torch.float64)
                x = updates[i].to(torch.float64)
                rel = float(torch.linalg.vector_norm(x - r)) / max(float(torch.linalg.vector_norm(r)), 1e-30)
                checked.append(c)
                if not rel <= self.tol:
                    ok[i] = False
                    reasons[i] = (f"spot-check: its update differs from its replay by {rel:.3g} of the replay's "
                                  f"norm (tolerance {self.tol:g})")
                    caught.setdefault(c, int(ctx.round))
        state: dict[str, Any] = {"caught": caught, "spot_check": {"checked": sorted(set(checked)), "rows": n}}
        return FilterResult(updates=updates, accepted=ok, reasons=reasons, state=state)
