"""Secure aggregation as a round stage: what the server reads when the clients mask their rows.

With ``[privacy] secure_aggregation = true`` the round's decoded rows go through the pairwise-masking
protocol of Bonawitz et al. (ACM CCS 2017; :mod:`redteam.transport.secagg`) before the defense sees
anything: each client first applies what every defense stage asks of it (:meth:`~redteam.types.
Defense.client_side`, e.g. DP-FedAvg's clipping), then the clients are dealt at random into
``secagg_buckets`` buckets and each bucket runs the protocol, so the server reads one sum per bucket
(and, per client, only a masked row). A client drops after the key exchange with probability
``secagg_dropout``: its masks are removed from the survivors' Shamir shares and its row is not in
the sum (recorded as dropped).

What the defense then sees: one row per bucket, the unweighted mean of its members' rows
(``ServerContext.summed`` holds how many; ``weights`` their summed sample weights; no client ids),
since masks hide any per-client weight the server would apply. A stage that
``needs_client_rows`` runs on those means when there are several buckets (robust aggregation over
securely summed buckets: Velicheti, Xia & Koyejo, "Secure Byzantine-Robust Distributed
Learning via Clustering" (SHARE), arXiv:2110.02940, 2021; the bucketing of Karimireddy, He &
Jaggi, ICLR 2022) and is refused by name with a single bucket. A bucket's verdict is its members'
verdict: a bucket rejected rejects every client in it (an honest client in a poisoned bucket is a
false positive, which is the cost the detection metrics then show).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InvalidParameter
from .stages import Received, RowView

__all__ = ["SecureView", "check_secure_aggregation", "secure_aggregate"]


@dataclass
class SecureView:
    """The server's view of a securely aggregated round: ``received`` (one row per bucket, each
    bucket's first member standing for it), ``members`` (representative → the bucket's clients),
    ``counts`` (clients summed per row), ``masked`` (client → the masked row the server read for it)
    and telemetry for the record."""

    received: Received
    members: dict[int, list[int]] = field(default_factory=dict)
    counts: tuple[int, ...] = ()
    masked: dict[int, torch.Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def check_secure_aggregation(spec: Any, defense: Any) -> None:
    """Refuse, by name, a defense stage that reads each client's row when the server reads one sum."""
    if spec is None or not spec.secure_aggregation or spec.secagg_buckets > 1:
        return
    for st in defense.parts():
        if st.needs_client_rows and st.acts_at == "aggregate":
            raise InvalidParameter(
                f"[defense]: {type(st).__name__} reads each client's row, and under [privacy] secure_aggregation "
                "the server reads only their sum; set [privacy] secagg_buckets > 1 to run it on bucket sums "
                "(robust aggregation over secure buckets), or use a rule that needs only the sum (mean, "
                "dp_fedavg, dp_noise)")


def secure_aggregate(fed: Any, rnd: int, rec: Received) -> SecureView:
    """The round's decoded rows ``rec`` as the server reads them under secure aggregation."""
    from ..transport.secagg import SecAggAborted, secure_sum

    spec = fed.scenario.privacy
    if not len(rec.rows):
        return SecureView(rec)
    rows = rec.matrix if rec.matrix is not None else torch.stack(list(rec.rows))
    clients = list(rec.clients)
    for st in fed.defense.parts():  # what each client does to its own row before masking it
        rows = st.client_side(rows)
    rng = fed.rng["privacy"]
    drop = rng.random(len(clients)) < spec.secagg_dropout
    # every bucket holds two clients at least: a bucket of one would publish its row
    n_b = max(1, min(int(spec.secagg_buckets), len(clients) // 2))
    order = rng.permutation(len(clients))
    buckets = [sorted(order[b::n_b].tolist()) for b in range(n_b)]
    out = Received(dropped=dict(rec.dropped), rejected=dict(rec.rejected), banned=dict(rec.banned),
                   extra=dict(rec.extra))
    means: list[torch.Tensor] = []
    reps: list[int] = []
    view = SecureView(out)
    counts: list[int] = []
    seed = hashlib.sha256(f"{fed.scenario.seed}/{rnd}".encode()).digest()
    clipped = shares = up = aborted = 0
    for b, pos in enumerate(buckets):
        ids = [clients[p] for p in pos]
        dropouts = [clients[p] for p in pos if drop[p]]
        try:
            res = secure_sum(rows[pos], ids, round=rnd, seed=seed, dropouts=dropouts, clip=spec.secagg_clip,
                             frac_bits=spec.secagg_frac_bits, modulus_bits=spec.secagg_modulus_bits,
                             context=f"bucket-{b}".encode())
        except SecAggAborted as exc:  # too few survivors to unmask: the bucket's round has no result
            for c in ids:
                out.dropped[int(c)] = f"secure aggregation aborted in its bucket: {exc}"
            aborted += 1
            continue
        survivors = [int(c) for c in res.survivors]
        for c in dropouts:
            out.dropped[int(c)] = "dropped out of secure aggregation after the key exchange"
        for c, row in zip(survivors, res.masked):
            view.masked[c] = row
        clipped += int(res.clipped)
        shares += int(res.shares_reconstructed)
        up += int(res.bytes_up)
        if not survivors:
            continue
        means.append((res.total / len(survivors)).to(rows.dtype).to(rows.device))
        reps.append(survivors[0])
        view.members[survivors[0]] = survivors
        counts.append(len(survivors))
    if means:
        out.matrix = torch.stack(means)
        out.rows = RowView(out.matrix)
        out.clients = reps
    view.counts = tuple(counts)
    view.extra = {"secure_aggregation": {"buckets": len(counts), "summed": list(counts), "clipped": clipped,
                                         "shares_reconstructed": shares, "bytes_up": up,
                                         "dropouts": int(drop.sum()), "aborted_buckets": aborted}}
    return view


def bucket_weights(fed: Any, rin: Any, view: SecureView) -> torch.Tensor:
    """The round's sample weights with each bucket's representative holding its bucket's sum."""
    w = rin.weights.clone()
    for rep, members in view.members.items():
        w[rep] = rin.weights[torch.as_tensor(members, dtype=torch.long, device=w.device)].sum()
    return w


def expand_verdicts(view: SecureView, accepted: dict[int, bool], rejected: dict[int, str]
                    ) -> tuple[dict[int, bool], dict[int, str]]:
    """A bucket's verdict given to each of its members."""
    acc: dict[int, bool] = {}
    rej: dict[int, str] = {}
    for rep, members in view.members.items():
        ok = bool(accepted.get(rep, False))
        for c in members:
            acc[c] = ok
            if not ok:
                rej[c] = f"in a rejected secure-aggregation bucket: {rejected.get(rep, 'rejected')}"
    return acc, rej

