"""Partition a training pool among clients: IID, Dirichlet label skew, shards, quantity skew,
label-sorted contiguous shards.

All partitioners are deterministic functions of ``(labels, n_clients, parameters,
rng)`` where ``rng`` is a ``numpy.random.Generator``; they return one sorted index
array per client, disjoint, and every client gets at least ``min_samples`` samples.

* ``iid``: a random permutation cut into equal parts.
* ``dirichlet``: for each class c draw p_c ~ Dir(α·1_n) and split that class's samples
  among clients by p_c (Hsu, Qi & Brown, "Measuring the Effects of Non-Identical Data
  Distribution for Federated Visual Classification", 2019). Small α = strong skew.
  As in common practice, a draw that leaves a client with fewer than ``min_samples``
  samples is redrawn (at most 1,000 times).
* ``shards``: sort by label, cut into ``n·shards_per_client`` contiguous shards and deal
  ``shards_per_client`` random shards to each client (McMahan et al., AISTATS 2017).
* ``quantity``: IID labels, client sizes proportional to a Dirichlet(β) draw
  (quantity skew; Li et al., "Federated Learning on Non-IID Data Silos", ICDE 2022).
* ``label_sorted``: sort by label (stable) and cut into ``n`` contiguous, equal shards,
  client i getting shard i — each client holds one or two classes (Karimireddy, He &
  Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing", ICLR 2022,
  their non-IID setting). Deterministic: no randomness is drawn.
* ``by_group``: the labels are *group* ids (the text workload passes each window's
  package, ``Dataset.groups``) and every group goes whole to one client: groups in
  decreasing size (ties in a random order) each to the client holding the fewest samples
  so far (longest-processing-time greedy), so clients get whole packages and similar
  amounts of data. Needs at least as many groups as clients.
* ``natural``: the dataset's own partition — LEAF's FEMNIST by writer, Shakespeare by
  speaking role (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018): the
  ``by_group`` deal on the workload's groups, so with as many clients as writers each client
  is one writer, and with fewer each client holds whole writers. A workload without groups
  is refused.

:func:`deal` says how the malicious clients get their data (``malicious_data``):
``"partition"`` deals them their parts of the same partition as everyone (which takes
those parts away from the honest clients); ``"iid_overlap"`` partitions the pool among the
honest clients only and gives each malicious client an IID sample, without replacement,
of ⌊pool/n⌋ items of the whole pool (overlapping the honest data), as the bucketing
paper's code does.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..errors import InvalidParameter

__all__ = ["partition", "deal", "PARTITIONS", "MALICIOUS_DATA"]

PARTITIONS = ("iid", "dirichlet", "shards", "quantity", "label_sorted", "by_group", "natural")
MALICIOUS_DATA = ("partition", "iid_overlap")
Kind = Literal["iid", "dirichlet", "shards", "quantity", "label_sorted", "by_group", "natural"]


def partition(
    labels: np.ndarray,
    n_clients: int,
    kind: str,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    beta: float = 1.0,
    min_samples: int = 2,
) -> list[np.ndarray]:
    labels = np.asarray(labels)
    n = len(labels)
    if n_clients < 1:
        raise InvalidParameter(f"partition: n_clients = {n_clients}: must be ≥ 1")
    if n < n_clients * min_samples:
        raise InvalidParameter(
            f"partition: {n} samples cannot give {n_clients} clients {min_samples} samples each"
        )
    if kind == "label_sorted":
        order = np.argsort(labels, kind="stable")
        return [np.sort(p) for p in np.array_split(order, n_clients)]
    if kind == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(n), n_clients)]
    if kind in ("by_group", "natural"):
        return _by_group(labels, n_clients, rng, min_samples)
    if kind == "dirichlet":
        if not alpha > 0:
            raise InvalidParameter(f"partition: alpha = {alpha}: must be > 0")
        return _dirichlet(labels, n_clients, alpha, rng, min_samples)
    if kind == "shards":
        if shards_per_client < 1:
            raise InvalidParameter(f"partition: shards_per_client = {shards_per_client}: must be ≥ 1")
        n_shards = n_clients * shards_per_client
        if n < n_shards * max(1, min_samples // shards_per_client):
            raise InvalidParameter(f"partition: {n} samples are too few for {n_shards} shards")
        order = np.argsort(labels, kind="stable")
        shards = np.array_split(order, n_shards)
        deal = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
        return [np.sort(np.concatenate([shards[s] for s in row])) for row in deal]
    if kind == "quantity":
        if not beta > 0:
            raise InvalidParameter(f"partition: beta = {beta}: must be > 0")
        spare = n - n_clients * min_samples
        props = rng.dirichlet(np.full(n_clients, beta))
        extra = np.floor(props * spare).astype(int)
        extra[: spare - extra.sum()] += 1  # hand out the rounding remainder
        sizes = extra + min_samples
        cuts = np.cumsum(sizes)[:-1]
        return [np.sort(p) for p in np.split(rng.permutation(n), cuts)]
    raise InvalidParameter(f"partition: kind = {kind!r}: must be one of {', '.join(PARTITIONS)}")


def deal(
    labels: np.ndarray,
    n_clients: int,
    malicious: list[int],
    kind: str,
    malicious_data: str,
    rng: np.random.Generator,
    **params: float | int,
) -> list[np.ndarray]:
    """Every client's indices into ``labels``: the partition ``kind``, with the malicious
    clients' data drawn as ``malicious_data`` says (see the module docstring)."""
    if malicious_data not in MALICIOUS_DATA:
        raise InvalidParameter(
            f"partition: malicious_data = {malicious_data!r}: must be one of {', '.join(MALICIOUS_DATA)}")
    mal = sorted(set(int(c) for c in malicious))
    if malicious_data == "partition" or not mal:
        return partition(labels, n_clients, kind, rng, **params)  # type: ignore[arg-type]
    honest = [c for c in range(n_clients) if c not in set(mal)]
    if not honest:
        raise InvalidParameter("partition: malicious_data = 'iid_overlap' needs at least one honest client")
    out: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * n_clients
    for c, p in zip(honest, partition(labels, len(honest), kind, rng, **params)):  # type: ignore[arg-type]
        out[c] = p
    size = max(int(params.get("min_samples", 2)), len(labels) // n_clients)
    for c in mal:
        out[c] = np.sort(rng.choice(len(labels), size=size, replace=False))
    return out


def _by_group(labels: np.ndarray, n_clients: int, rng: np.random.Generator, min_samples: int) -> list[np.ndarray]:
    groups, sizes = np.unique(labels, return_counts=True)
    if len(groups) < n_clients:
        raise InvalidParameter(f"partition: by_group: {len(groups)} groups cannot give {n_clients} clients "
                               "a group each; use fewer clients or another partition")
    shuffled = rng.permutation(len(groups))
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    load = np.zeros(n_clients, dtype=np.int64)
    owner = np.empty(len(groups), dtype=np.int64)
    for g in order:
        c = int(np.argmin(load))  # lowest load, lowest index on ties
        owner[g] = c
        load[c] += sizes[g]
    if int(load.min()) < min_samples:
        raise InvalidParameter(f"partition: by_group left a client with {int(load.min())} < {min_samples} samples")
    client_of = owner[np.searchsorted(groups, labels)]
    return [np.flatnonzero(client_of == c) for c in range(n_clients)]


def _dirichlet(
    labels: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator, min_samples: int
) -> list[np.ndarray]:
    classes = np.unique(labels)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    for _ in range(1000):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        p = rng.dirichlet(np.full(n_clients, alpha), size=len(classes))  # (C, n)
        for c, members in enumerate(by_class):
            cuts = (np.cumsum(p[c])[:-1] * len(members)).astype(int)
            for i, piece in enumerate(np.split(members, cuts)):
                parts[i].append(piece)
        out = [np.sort(np.concatenate(ps)) for ps in parts]
        if min(len(o) for o in out) >= min_samples:
            return out
    raise InvalidParameter(
        f"partition: Dirichlet(alpha = {alpha}) left some client with < {min_samples} samples "
        f"in 1000 draws; raise alpha or lower the number of clients"
    )
