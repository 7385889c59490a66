"""A simulated uplink network: heterogeneous links, loss, relays, retries, deadline, churn.

The model follows a common straggler and churn parametrisation (the
synchronous-round time T_i = H·c_i + bytes_i/bw_i + RTT_i with log-normal device
heterogeneity) and the BitTorrent-style verify-and-re-fetch of BEP 52.

Devices. At construction every client i draws, once and for good, its uplink
bandwidth bw_i = ``bandwidth_mbps``·exp(``bandwidth_sigma``·z), its link latency
RTT_i = ``latency_ms``·exp(``latency_sigma``·z') and its compute time per local step
c_i = ``compute_s_per_step``·exp(``compute_sigma``·z'') (z's standard normal from the
``rng`` given; medians are the configured values). Explicit per-client arrays can be
passed instead (regions, hand-made examples).

One round, for each uploading client i (all times in seconds from the round start):

1. the update is ready at R_i = steps·c_i;
2. the manifest (its canonical JSON) and then the chunks leave back-to-back over i's
   uplink; chunk j has left at R_i + (|manifest| + Σ_{l≤j} |chunk_l|)/bw_i;
3. a direct transfer arrives RTT_i later. With probability ``relay_fraction`` a chunk
   goes via a uniformly drawn other participant r (a swarm peer), which stores and
   forwards it: + |chunk_j|/bw_r + RTT_r. So a client with only direct chunks arrives
   at exactly R_i + bytes_i/bw_i + RTT_i;
4. each chunk attempt is lost with probability ``loss``. The tamper hook then sees the
   attempts that arrive, as :class:`~redteam.types.ChunkDelivery` objects
   (``relay == author`` means the chunk came straight from its author), and returns them
   as delivered: modified, removed (withheld) or added (injected, replayed). Deliveries
   are matched to manifests by ``(author, index)``; others are ignored;
5. the receiver checks every delivery against the manifest (length and SHA-256). A chunk
   that is missing (lost or withheld) or only arrived corrupted is re-fetched, at the
   time it should have arrived, up to ``retries`` times; a re-fetch comes from the
   author directly, or with probability ``relay_fraction`` from a swarm peer other than
   the one of the failed attempt, and costs RTT_src + |chunk|/bw_src. Re-fetches go
   through the hook again. Every delivery that fails its check is a detection (logged
   with its relay), even when another copy or a re-fetch completes the chunk;
6. an update is complete when every chunk verified; it arrives at the last chunk's time.
   With ``deadline_s`` set, a complete update arriving after the deadline is a straggler
   and dropped. Round time = the latest finish (arrival, or giving up) over participants,
   capped at the deadline.

Manifests travel directly and reliably (a control channel), unless the caller passes
``headers``: then each client's header (its manifest JSON, or the DSSE envelope that
signs it, see :mod:`.signing`) is announced as a delivery of index −1 through the same
relay as the client's chunk 0 (an announcement travels with the first chunk), is never
lost, and goes through the tamper hook in a call of its own before the chunks. The
receiver opens every distinct header that arrives for a client with ``open_header``
(default: parse the canonical manifest JSON and check client, round and parent); a
header it refuses is a detection, and the update is dropped unless another header for
that client opens. When several *different* headers open for one client (equivocation),
the first is the update this receiver takes, ``headers`` lists them all (for gossip
between sub-aggregators), and each further one whose chunks arrive complete (matched
by digest, as content-addressed chunks are) is returned in ``alternates``: the copy a
different sub-aggregator would have received.

``bytes_on_wire`` counts each manifest (or header, signature included), each scheduled
attempt on each hop it takes (lost attempts included: their bytes were sent) and any net
growth in bytes the tamper hook causes (injected or replayed chunks and headers).
Re-fetch and relay uplinks are not modelled as contended. All randomness comes from the
``np.random.Generator`` passed in.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from redteam.errors import InvalidParameter, RedteamError
from redteam.types import ChunkDelivery

from .chunking import ManifestError, UpdateManifest, check_chunk, known_text, known_texts, known_valid_many

__all__ = ["NetworkConfig", "Network", "TransmitResult", "TamperHook", "HeaderOpener", "HEADER_INDEX"]

TamperHook = Callable[[list[ChunkDelivery]], list[ChunkDelivery]]
HeaderOpener = Callable[[int, bytes], UpdateManifest]
HEADER_INDEX = -1  # ChunkDelivery.index of an update's header


def _num(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """Parameters of the simulated network (medians and log-normal spreads).

    * ``bandwidth_mbps`` / ``bandwidth_sigma``: median uplink in Mbit/s, σ of its log;
    * ``latency_ms`` / ``latency_sigma``: median link round-trip time, σ of its log;
    * ``loss``: probability that one chunk transmission is lost;
    * ``relay_fraction``: probability that a chunk goes via another peer;
    * ``retries``: re-fetches per chunk after a loss, withholding or digest mismatch;
    * ``deadline_s``: round deadline (``None``: wait for everyone);
    * ``compute_s_per_step`` / ``compute_sigma``: median seconds per local step, σ of log;
    * ``churn_leave`` / ``churn_join``: per-round probability that an online client goes
      offline / that an offline client comes back;
    * ``stragglers``: with a deadline, ``"drop"`` (default) trains every client for all its
      local steps and drops the late ones; ``"partial"`` lets each client stop after the
      steps it can finish in time (:meth:`Network.steps_by_deadline`) and send that
      partial update (heterogeneous compute as in DiLoCo-style volunteer training); a
      client that cannot finish one step is still dropped.
    """

    bandwidth_mbps: float = 10.0
    bandwidth_sigma: float = 0.5
    latency_ms: float = 50.0
    latency_sigma: float = 0.5
    loss: float = 0.0
    relay_fraction: float = 0.0
    retries: int = 2
    deadline_s: float | None = None
    compute_s_per_step: float = 0.01
    compute_sigma: float = 0.5
    churn_leave: float = 0.0
    churn_join: float = 0.0
    stragglers: str = "drop"

    def __post_init__(self) -> None:
        if self.stragglers not in ("drop", "partial"):
            raise InvalidParameter(f"NetworkConfig.stragglers = {self.stragglers!r}: must be 'drop' or 'partial'")
        for name in ("bandwidth_mbps",):
            v = getattr(self, name)
            if not (_num(v) and v > 0):
                raise InvalidParameter(f"NetworkConfig.{name} = {v!r}: must be a finite number > 0")
        for name in ("latency_ms", "compute_s_per_step", "bandwidth_sigma", "latency_sigma", "compute_sigma"):
            v = getattr(self, name)
            if not (_num(v) and v >= 0):
                raise InvalidParameter(f"NetworkConfig.{name} = {v!r}: must be a finite number ≥ 0")
        for name in ("loss", "relay_fraction", "churn_leave", "churn_join"):
            v = getattr(self, name)
            if not (_num(v) and 0 <= v <= 1):
                raise InvalidParameter(f"NetworkConfig.{name} = {v!r}: must be a probability in [0, 1]")
        if self.loss == 1:
            raise InvalidParameter("NetworkConfig.loss = 1: must be < 1 (nothing would ever arrive)")
        r = self.retries
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise InvalidParameter(f"NetworkConfig.retries = {r!r}: must be an integer ≥ 0")
        d = self.deadline_s
        if d is not None and not (_num(d) and d > 0):
            raise InvalidParameter(f"NetworkConfig.deadline_s = {d!r}: must be a number > 0 (or unset)")


@dataclass(slots=True)
class TransmitResult:
    """The outcome of one round's uploads.

    * ``payloads``: client → reassembled, verified payload;
    * ``dropped``: client → why its update did not make it (bad manifest, a chunk lost,
      withheld or corrupted after all retries, straggler);
    * ``detections``: client → digest mismatches seen on its chunks (even if repaired);
    * ``mismatches``: every mismatching delivery as ``(author, index, relay)``;
    * ``stragglers``: clients dropped for arriving after the deadline;
    * ``arrival_s``: client → when its update completed, or when the receiver gave up;
    * ``bytes_on_wire`` (all of it), ``client_bytes`` (per author), ``round_time_s``;
    * with ``headers``: ``manifests`` (client → the manifest its accepted header
      announced), ``headers`` (client → every distinct header that opened, in arrival
      order) and ``alternates`` (client → complete payloads of its further headers).
    """

    payloads: dict[int, bytes] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    detections: dict[int, str] = field(default_factory=dict)
    mismatches: list[tuple[int, int, int]] = field(default_factory=list)
    stragglers: list[int] = field(default_factory=list)
    arrival_s: dict[int, float] = field(default_factory=dict)
    bytes_on_wire: int = 0
    client_bytes: dict[int, int] = field(default_factory=dict)
    round_time_s: float = 0.0
    manifests: dict[int, UpdateManifest] = field(default_factory=dict)
    headers: dict[int, list[bytes]] = field(default_factory=dict)
    alternates: dict[int, list[bytes]] = field(default_factory=dict)


def _profile(
    name: str, given: Sequence[float] | None, median: float, sigma: float, z: np.ndarray, positive: bool
) -> np.ndarray:
    """Per-client values: ``median·exp(sigma·z)``, or the explicit ``given`` array (checked)."""
    if given is None:  # a huge σ may overflow to an infinite value or underflow to 0: IEEE's answer stands
        with np.errstate(over="ignore", under="ignore"):
            return median * np.exp(sigma * z)
    arr = np.asarray(given, dtype=np.float64)
    in_range = (arr > 0).all() if positive else (arr >= 0).all()
    ok = arr.shape == z.shape and bool(np.isfinite(arr).all()) and bool(in_range)
    if not ok:
        raise InvalidParameter(
            f"Network.{name} = {given!r}: expected {z.shape[0]} finite values {'> 0' if positive else '≥ 0'}"
        )
    return arr


class Network:
    """The simulated network for ``n_clients`` devices; see the module docstring.

    Attributes (per client, fixed at construction): ``bandwidth_mbps``, ``latency_s``
    (round-trip), ``compute_s`` (seconds per local step).
    """

    def __init__(
        self,
        config: NetworkConfig,
        n_clients: int,
        rng: np.random.Generator,
        *,
        bandwidth_mbps: Sequence[float] | None = None,
        latency_ms: Sequence[float] | None = None,
        compute_s_per_step: Sequence[float] | None = None,
    ) -> None:
        if not isinstance(config, NetworkConfig):
            raise InvalidParameter(f"Network.config = {config!r}: expected a NetworkConfig")
        if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
            raise InvalidParameter(f"Network.n_clients = {n_clients!r}: must be an integer ≥ 1")
        self.config = config
        self.n_clients = n_clients
        z = rng.standard_normal((3, n_clients))  # drawn even when overridden: streams stay aligned
        c = config
        self.bandwidth_mbps = _profile(
            "bandwidth_mbps", bandwidth_mbps, c.bandwidth_mbps, c.bandwidth_sigma, z[0], True
        )
        self.latency_s = _profile("latency_ms", latency_ms, c.latency_ms, c.latency_sigma, z[1], False) / 1000.0
        self.compute_s = _profile(
            "compute_s_per_step", compute_s_per_step, c.compute_s_per_step, c.compute_sigma, z[2], False
        )
        with np.errstate(over="ignore", under="ignore"):
            self.bytes_per_s = self.bandwidth_mbps * 1e6 / 8.0

    def __repr__(self) -> str:
        return f"Network({self.config!r}, n_clients={self.n_clients})"

    def churn(self, online: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Next round's online mask (vectorized).

        An online client goes offline with probability ``churn_leave``; an offline one
        comes back with probability ``churn_join``.
        """
        online = np.asarray(online, dtype=bool)
        if online.shape != (self.n_clients,):
            raise InvalidParameter(
                f"Network.churn: online has shape {online.shape}, expected ({self.n_clients},)"
            )
        u = rng.random(self.n_clients)
        return np.where(online, u >= self.config.churn_leave, u < self.config.churn_join)

    def ready_s(self, clients: Sequence[int], local_steps: int) -> np.ndarray:
        """When each client's update is ready: steps·c_i."""
        return _times(local_steps, self.compute_s[np.asarray(clients, dtype=np.int64)])

    def steps_by_deadline(self, clients: Sequence[int], local_steps: int, payload_bytes: int) -> np.ndarray:
        """Local steps each client can finish and still deliver by the deadline, for the
        ``"partial"`` straggler policy: ⌊(deadline − upload_i)/c_i⌋ capped at
        ``local_steps``, with upload_i = payload_bytes/bw_i + RTT_i (a direct upload, no
        loss; relays and re-fetches can still make it late). ``local_steps`` for every
        client without a deadline or under ``"drop"``; 0 = cannot finish one step in time."""
        ids = np.asarray(clients, dtype=np.int64)
        full = np.full(len(ids), int(local_steps), dtype=np.int64)
        cfg = self.config
        if cfg.deadline_s is None or cfg.stragglers != "partial":
            return full
        upload = _send_s(payload_bytes, self.bytes_per_s[ids]) + self.latency_s[ids]
        spare = np.maximum(cfg.deadline_s - upload, 0.0)
        c = self.compute_s[ids]
        fit = np.where(c > 0, np.floor(spare / np.where(c > 0, c, 1.0)), float(local_steps))
        return np.minimum(fit, full).astype(np.int64)

    # -- one round --------------------------------------------------------------------
    def transmit(
        self,
        round: int,
        uploads: Mapping[int, tuple[UpdateManifest, Sequence[bytes]]],
        local_steps: int,
        rng: np.random.Generator,
        tamper: TamperHook | None = None,
        *,
        parent_digest: str | None = None,
        headers: Mapping[int, bytes] | None = None,
        open_header: HeaderOpener | None = None,
        max_payload_len: int | None = None,
        client_steps: Mapping[int, int] | None = None,
    ) -> TransmitResult:
        """Send every client's manifest and chunks to the aggregator; see the module docstring.

        ``uploads`` maps client → (its manifest, the chunks it actually sends); a chunk
        the author does not send is withheld. With ``parent_digest`` given, a manifest
        for another parent model is dropped as stale. With ``headers`` (client → header
        bytes) the headers are announced through the tamper hook and opened with
        ``open_header(client, header) -> UpdateManifest``, which raises a
        :class:`~redteam.errors.RedteamError` naming the problem to refuse one.

        ``max_payload_len`` (bytes; e.g. ``codec.payload_size(d)``, the exact length of a
        valid payload for the model) refuses a manifest or header that announces a longer
        payload before any of its chunks is fetched or reassembled: the client is dropped
        with the reason (and, for a header, the refusal is a detection).
        """
        if max_payload_len is not None and (isinstance(max_payload_len, bool)
                                            or not isinstance(max_payload_len, int) or max_payload_len < 0):
            raise InvalidParameter(f"Network.transmit: max_payload_len = {max_payload_len!r}: "
                                   "must be an integer ≥ 0 (or None)")
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 0:
            raise InvalidParameter(f"Network.transmit: local_steps = {local_steps!r}: must be an integer ≥ 0")
        plain = _plain_ids(uploads, self.n_clients)
        if not plain:  # the batch check failed: name the first bad key
            for c in uploads:
                if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < self.n_clients:
                    raise InvalidParameter(
                        f"Network.transmit: upload key {c!r} is not a client id in [0, {self.n_clients})"
                    )
        if headers is not None:
            missing = [] if headers.keys() >= uploads.keys() else sorted(int(c) for c in uploads if c not in headers)
            if missing or not (set(map(type, headers.values())) <= {bytes, bytearray}
                               or all(isinstance(h, (bytes, bytearray)) for h in headers.values())):
                raise InvalidParameter(
                    f"Network.transmit: headers must give bytes for every uploading client (missing {missing})"
                )
        ids = sorted(uploads) if plain else sorted(int(c) for c in uploads)
        cfg, res = self.config, TransmitResult()
        finish: dict[int, float] = {}
        ids_arr = np.asarray(ids, dtype=np.int64)
        # manifests (direct, reliable) or headers (announced; opened after the hook)
        if headers is not None:
            mlens = [len(headers[c]) for c in ids]
        else:
            mlens = [len(uploads[c][0].to_json()) if isinstance(uploads[c][0], UpdateManifest) else 0 for c in ids]
        ready = self.ready_s(ids, local_steps)
        if client_steps is not None:  # partial work: ready after the steps each client ran
            ready = _times(np.array([client_steps.get(c, local_steps) for c in ids], dtype=np.float64),
                           self.compute_s[ids_arr])
        done_all = ready + _send_s(np.asarray(mlens, dtype=np.float64), self.bytes_per_s[ids_arr])
        manifest_done = dict(zip(ids, done_all.tolist()))
        finish0 = done_all + self.latency_s[ids_arr]
        finish: dict[int, float] = dict(zip(ids, finish0.tolist()))
        sent_bytes = np.asarray(mlens, dtype=np.int64)  # per client of ids; res.client_bytes at the end
        res.bytes_on_wire += sum(mlens)
        valid: list[int] = []
        parent_check = parent_digest if headers is None else None
        sent_ms = [uploads[c][0] for c in ids]
        # a builder's manifest (valid, frozen) for this client, round, parent and size needs
        # no further look; anything else gets the full check, which names the problem
        fine = [ok and type(m) is UpdateManifest and m.client == c and m.round == round
                and (parent_check is None or m.parent_digest == parent_check)
                and (max_payload_len is None or m.payload_len <= max_payload_len)
                for ok, c, m in zip(known_valid_many(sent_ms), ids, sent_ms)]
        for c, m, ok in zip(ids, sent_ms, fine):
            if ok:
                valid.append(c)
                continue
            problem = self._manifest_problem(c, m, round, parent_check, max_payload_len)
            if problem is not None:
                res.dropped[c] = f"bad manifest: {problem}"
            else:
                valid.append(c)

        # first attempt of every chunk: departure times, relay and loss draws (vectorized)
        sent_manifests = {c: uploads[c][0] for c in valid}
        counts = [len(m.chunk_digests) for m in sent_manifests.values()]  # n_chunks
        one_chunk = bool(counts) and min(counts) == max(counts) == 1
        if one_chunk:  # one chunk each (a small model): keys by client
            keys = [(c, 0) for c in valid]
            author = np.array(valid, dtype=np.int64)
            firsts = [uploads[c][1] for c in valid]
            data = [ch[0] if len(ch) and type(ch[0]) is bytes else _first_sent(ch) for ch in firsts]
        else:
            keys = [(c, i) for c, n_c in zip(valid, counts) for i in range(n_c)]
            author = np.array([c for c, _ in keys], dtype=np.int64)
            data = [self._sent_data(uploads[c][1], i) for c, i in keys]
        slot = {key: k for k, key in enumerate(keys)}
        size = np.array([len(b) if b is not None else 0 for b in data], dtype=np.float64)
        offsets = np.cumsum([0] + counts)
        # each client's chunks leave back-to-back on its uplink: the running byte count
        # within a client is a global running sum less the client's start (whole numbers
        # of bytes, so exactly the per-client sum)
        run = np.cumsum(size)
        start = np.repeat(run[offsets[:-1] - 1] * (offsets[:-1] > 0), np.diff(offsets)) if len(valid) else run
        done = np.array([manifest_done[c] for c in valid], dtype=np.float64)
        depart = np.repeat(done, np.diff(offsets)) + _send_s(run - start, self.bytes_per_s[author])
        u = rng.random((3, len(keys)))
        relay = self._first_relays(author, ids, u[0] < cfg.relay_fraction, u[1])
        via = relay != author
        forward = np.where(via, _send_s(size, self.bytes_per_s[relay]) + self.latency_s[relay], 0.0)
        when = depart + self.latency_s[author] + forward
        lost = u[2] < cfg.loss
        hops = np.where(via, 2, 1)

        scheduled = {c: j for j, c in enumerate(valid)}
        if headers is None:
            manifests = sent_manifests
            alternates: dict[int, list[UpdateManifest]] = {}
        else:
            manifests, alternates = self._announce(round, valid, headers, relay, slot, tamper, open_header,
                                                   parent_digest, res, max_payload_len)
            valid = [c for c in valid if c in manifests]
        as_sent = len(manifests) == len(sent_manifests) and all(
            [manifests.get(c) is m for c, m in sent_manifests.items()])  # every header opened to what was scheduled
        if (tamper is None and one_chunk and as_sent and not alternates and len(valid) == len(ids)
                and self._direct_lane(ids, ids_arr, sent_ms, data, lost, when, size, hops, author, finish0,
                                      sent_bytes, headers is not None, res)):
            return res
        alt_got: dict[tuple[int, int], dict[int, bytes]] = {}
        # a header may announce more chunks than its author scheduled (a forged one): such
        # chunks count if someone delivers them; they arrive with the author's last chunk
        extra_at: dict[int, float] = {}

        # waves: the first attempt, then up to `retries` re-fetches of what is still missing
        got: dict[int, dict[int, bytes]] = {c: {} for c in valid}
        got_at = np.full(len(keys), np.nan)
        failure: dict[int, tuple[str, float]] = {}
        mismatch_log: dict[int, list[tuple[int, int]]] = {}
        if as_sent:
            pending = np.arange(len(keys), dtype=np.int64)  # every header opened to the manifest scheduled
        else:
            pending = np.array([k for k, (c, i) in enumerate(keys) if c in manifests and i < manifests[c].n_chunks],
                               dtype=np.int64)
        for wave in range(cfg.retries + 1):
            if wave > 0:
                pending = np.array([k for k in pending if keys[k][1] not in got[keys[k][0]]], dtype=np.int64)
                if pending.size == 0:
                    break
                u = rng.random((3, pending.size))
                use_peer = u[0] < cfg.relay_fraction
                relay[pending] = self._refetch_sources(author[pending], ids, use_peer, u[1], relay[pending])
                src = relay[pending]
                fail_time = np.array([failure[k][1] for k in pending.tolist()])
                when[pending] = fail_time + self.latency_s[src] + _send_s(size[pending], self.bytes_per_s[src])
                lost[pending] = u[2] < cfg.loss
                hops[pending] = 1
            sent = [k for k in (pending.tolist() if wave > 0 else range(len(keys))) if data[k] is not None]
            if sent:  # each attempt's bytes on each hop, per author (whole bytes: exact sums)
                nbytes = size[sent] * hops[sent]
                per = np.bincount(author[sent], weights=nbytes, minlength=self.n_clients)[ids_arr]
                sent_bytes += per.astype(np.int64)
                res.bytes_on_wire += int(nbytes.sum())
            lost_l, relay_l = lost.tolist(), relay.tolist()
            if tamper is None:  # what arrives is what was sent: check each attempt where it lands
                if self._land_direct(pending.tolist(), keys, data, lost_l, relay_l, when, wave, manifests, got,
                                     got_at, failure, mismatch_log, res):
                    break  # every pending chunk verified: no re-fetch wave has anything to do
                continue
            deliveries = [
                ChunkDelivery(author=keys[k][0], index=keys[k][1], relay=relay_l[k], data=data[k], round=round)
                for k in sent
                if not lost_l[k]
            ]
            if tamper is not None:
                given = sum(_nbytes(d) for d in deliveries)
                deliveries = list(tamper(deliveries))
                res.bytes_on_wire += max(0, sum(_nbytes(d) for d in deliveries) - given)
            by_key: dict[int, list[ChunkDelivery]] = {}
            for d in deliveries:
                key = _key(d)
                k = slot.get(key, -1) if key is not None else -1
                if k >= 0:
                    by_key.setdefault(k, []).append(d)
                elif key is not None and key[0] in manifests and 0 <= key[1] < manifests[key[0]].n_chunks:
                    c, i = key
                    if i not in got[c] and check_chunk(manifests[c], i, getattr(d, "data", None)) is None:
                        got[c][i] = bytes(d.data)
                        own = when[offsets[scheduled[c]]:offsets[scheduled[c] + 1]]
                        extra_at[c] = float(own.max()) if own.size else finish[c]
                elif key is not None and key[0] in alternates:  # a chunk only an equivocation copy lists
                    self._match_alternate(key, d, alternates, alt_got)
            for k in pending.tolist():
                c, i = keys[k]
                if i in got[c]:
                    continue
                bad_relay = None
                for d in by_key.get(k, ()):  # the first verified copy is used; every bad one is logged
                    if check_chunk(manifests[c], i, getattr(d, "data", None)) is None:
                        if i not in got[c]:
                            got[c][i] = bytes(d.data)
                            got_at[k] = when[k]
                        continue
                    if c in alternates and self._match_alternate((c, i), d, alternates, alt_got):
                        continue
                    r = getattr(d, "relay", None)
                    bad_relay = int(r) if isinstance(r, (int, np.integer)) else -1
                    res.mismatches.append((c, i, bad_relay))
                    mismatch_log.setdefault(c, []).append((i, bad_relay))
                if i in got[c]:
                    continue
                if bad_relay is not None:
                    reason = f"chunk {i} digest mismatch after {wave} retries ({_via(bad_relay, c)})"
                elif lost[k] and data[k] is not None:
                    reason = f"chunk {i} lost after {wave} retries"
                else:
                    reason = f"withheld: missing chunk {i}"
                failure[k] = (reason, float(when[k]))

        # outcome per client
        got_at_l = got_at.tolist()
        offs = offsets.tolist()
        sched_n = np.diff(offsets)
        # per scheduled client, the latest arrival among its scheduled chunks (used where the
        # opened manifest lists exactly those chunks and all arrived: no NaN among them)
        last_at = np.maximum.reduceat(got_at, offsets[:-1]).tolist() if len(keys) and sched_n.min() > 0 else None
        sched_l = sched_n.tolist()
        deadline = cfg.deadline_s
        for c in valid:
            m = manifests[c]
            j = scheduled[c]
            got_c = got[c]
            n_m = m.n_chunks
            if len(got_c) < n_m:
                ks = range(offs[j], offs[j + 1])
                first = min(i for i in range(n_m) if i not in got_c)
                k_first = slot.get((c, first))
                res.dropped[c] = failure[k_first][0] if k_first in failure else f"withheld: missing chunk {first}"
                finish[c] = max([finish[c]] + [failure[k][1] for k in ks if k in failure and keys[k][1] not in got_c])
            else:
                if last_at is not None and sched_l[j] == n_m:
                    fin = max(finish[c], last_at[j])
                else:
                    arrived = [got_at_l[slot[(c, i)]] for i in range(n_m) if (c, i) in slot]
                    fin = max([finish[c], *arrived])
                if c in extra_at:
                    fin = max(fin, extra_at[c])
                finish[c] = fin
                if deadline is not None and fin > deadline:
                    late = f"arrived at {fin:.3g} s > deadline {deadline:.3g} s"
                    res.dropped[c] = f"straggler: {late}"
                    res.stragglers.append(c)
                else:
                    res.payloads[c] = got_c[0] if n_m == 1 else b"".join(got_c[i] for i in range(n_m))
            if c in mismatch_log:
                log = mismatch_log[c]
                i, r = log[0]
                more = f"; {len(log) - 1} more" if len(log) > 1 else ""
                fixed = " (verified copies obtained)" if len(got[c]) == m.n_chunks else ""
                res.detections.setdefault(c, f"chunk {i} digest mismatch ({_via(r, c)}){more}{fixed}")
        for c, alts in sorted(alternates.items()):
            if c not in res.payloads:
                continue
            primary = manifests[c]
            for j, alt in enumerate(alts):
                parts = dict(alt_got.get((c, j), {}))
                for i in range(min(alt.n_chunks, primary.n_chunks)):  # content-addressed: same digest, same chunk
                    if i not in parts and alt.chunk_digests[i] == primary.chunk_digests[i] and i in got[c]:
                        parts[i] = got[c][i]
                if len(parts) == alt.n_chunks:
                    res.alternates.setdefault(c, []).append(b"".join(parts[i] for i in range(alt.n_chunks)))
        if headers is not None:
            res.manifests = {c: manifests[c] for c in valid}
        res.client_bytes = dict(zip(ids, sent_bytes.tolist()))
        res.arrival_s = {c: float(finish[c]) for c in ids}
        end = max(finish.values(), default=0.0)
        res.round_time_s = float(min(end, cfg.deadline_s) if cfg.deadline_s is not None else end)
        return res

    def _direct_lane(self, ids: list[int], ids_arr: np.ndarray, sent_ms: list[UpdateManifest],
                     data: list[bytes | None], lost: np.ndarray, when: np.ndarray, size: np.ndarray, hops: np.ndarray,
                     author: np.ndarray, finish0: np.ndarray, sent_bytes: np.ndarray, with_headers: bool,
                     res: TransmitResult) -> bool:
        """:meth:`transmit`'s outcome, at once, when no hook acts, every client sends one chunk
        under the manifest its header opened to, every first attempt arrives intact (the
        receiver's check: length and SHA-256) and in time. The same result as the waves
        and the per-client outcome give; False, with nothing written, otherwise."""
        if lost.any() or None in data:
            return False
        sha = hashlib.sha256
        if not all([len(chunk) == m.payload_len and sha(chunk).hexdigest() == m.chunk_digests[0]  # type: ignore[arg-type]
                    for chunk, m in zip(data, sent_ms)]):
            return False
        fin = np.maximum(finish0, when).tolist()  # ready + header, or the chunk's arrival: the later
        deadline = self.config.deadline_s
        end = max(fin, default=0.0)
        if deadline is not None and end > deadline:
            return False
        nbytes = size * hops  # the first wave's bytes on each hop, per author (whole bytes: exact sums)
        sent_bytes += np.bincount(author, weights=nbytes, minlength=self.n_clients)[ids_arr].astype(np.int64)
        res.bytes_on_wire += int(nbytes.sum())
        res.payloads = dict(zip(ids, data))  # type: ignore[arg-type]
        if with_headers:
            res.manifests = dict(zip(ids, sent_ms))
        res.client_bytes = dict(zip(ids, sent_bytes.tolist()))
        res.arrival_s = dict(zip(ids, fin))
        res.round_time_s = float(min(end, deadline) if deadline is not None else end)
        return True

    def _announce(
        self,
        round: int,
        valid: list[int],
        headers: Mapping[int, bytes],
        relay: np.ndarray,
        slot: Mapping[tuple[int, int], int],
        tamper: TamperHook | None,
        open_header: HeaderOpener | None,
        parent_digest: str | None,
        res: TransmitResult,
        max_payload_len: int | None = None,
    ) -> tuple[dict[int, UpdateManifest], dict[int, list[UpdateManifest]]]:
        """The announcement: headers through the hook, then opened. Returns the accepted
        manifest per client and the further (equivocating) manifests."""
        if tamper is None and open_header is None:
            # every header arrives once, as sent; where each is the exact text a builder wrote
            # for this client, round and parent within the size limit (the tests below are
            # default_open's and the size check), its manifest is the parse: all at once
            sent_h = [bytes(headers[c]) for c in valid]
            opened = known_texts(sent_h)
            if all([m is not None and m.client == c and m.round == round
                    and (parent_digest is None or m.parent_digest == parent_digest)
                    and (max_payload_len is None or m.payload_len <= max_payload_len)
                    for c, m in zip(valid, opened)]):
                res.headers.update(zip(valid, ([h] for h in sent_h)))
                return dict(zip(valid, opened)), {}  # type: ignore[arg-type]

        def first_relay(c: int) -> int:
            return int(relay[slot[(c, 0)]]) if (c, 0) in slot else c

        arrived: dict[int, list[tuple[bytes, int]]] = {}
        if tamper is None:  # nothing acts in transit: each header arrives once, as sent (below)
            announced: list[ChunkDelivery] = []
        else:
            announced = [ChunkDelivery(author=c, index=HEADER_INDEX, relay=first_relay(c), data=bytes(headers[c]),
                                       round=round) for c in valid]
            given = sum(_nbytes(d) for d in announced)
            announced = list(tamper(announced))
            res.bytes_on_wire += max(0, sum(_nbytes(d) for d in announced) - given)
        valid_set = set(valid)
        for d in announced:
            key = _key(d)
            data = getattr(d, "data", None)
            if key is None or key[1] != HEADER_INDEX or key[0] not in valid_set or not isinstance(
                    data, (bytes, bytearray, memoryview)):
                continue
            r = getattr(d, "relay", key[0])
            seen = arrived.setdefault(key[0], [])
            if all(bytes(data) != h for h, _ in seen):
                seen.append((bytes(data), int(r) if isinstance(r, (int, np.integer)) else -1))

        def default_open(c: int, h: bytes) -> UpdateManifest:
            m = UpdateManifest.from_json(h)  # validated: every field and the Merkle root
            problem = self._manifest_problem(c, m, round, parent_digest, max_payload_len, validated=True)
            if problem is not None:
                raise ManifestError(problem)
            return m

        opener = open_header or default_open
        manifests: dict[int, UpdateManifest] = {}
        alternates: dict[int, list[UpdateManifest]] = {}
        for c in valid:
            if tamper is None:
                h = bytes(headers[c])
                if open_header is None:
                    # the exact text a builder wrote: default_open's parse is that manifest
                    # (known_text), and this test is the rest of default_open's and the size check
                    m = known_text(h)
                    if (m is not None and m.client == c and m.round == round
                            and (parent_digest is None or m.parent_digest == parent_digest)
                            and (max_payload_len is None or m.payload_len <= max_payload_len)):
                        manifests[c] = m
                        res.headers[c] = [h]
                        continue
                arrived[c] = [(h, first_relay(c))]
            opened: list[tuple[bytes, UpdateManifest]] = []
            problems: list[str] = []
            for h, r in arrived.get(c, ()):
                try:
                    m = opener(c, h)
                except RedteamError as exc:
                    problems.append(f"{exc} ({_via(r, c)})")
                    continue
                if not isinstance(m, UpdateManifest):
                    raise InvalidParameter(f"Network.transmit: open_header returned {type(m).__name__}, "
                                           "expected an UpdateManifest")
                too_big = _size_problem(m, max_payload_len)
                if too_big is not None:
                    problems.append(f"{too_big} ({_via(r, c)})")
                    continue
                if all(m != o for _, o in opened):
                    opened.append((h, m))
            more = f"; {len(problems) - 1} more" if len(problems) > 1 else ""
            if problems:
                res.detections[c] = f"bad header: {problems[0]}{more}"
            if not opened:
                res.dropped[c] = f"bad header: {problems[0]}{more}" if problems else \
                    "no header arrived (withheld or dropped in transit)"
                continue
            manifests[c] = opened[0][1]
            res.headers[c] = [h for h, _ in opened]
            if len(opened) > 1:
                alternates[c] = [m for _, m in opened[1:]]
        return manifests, alternates

    @staticmethod
    def _land_direct(pending: list[int], keys: list[tuple[int, int]], data: list[bytes | None], lost: list[bool],
                     relay: list[int], when: np.ndarray, wave: int, manifests: Mapping[int, UpdateManifest],
                     got: dict[int, dict[int, bytes]], got_at: np.ndarray, failure: dict[int, tuple[str, float]],
                     mismatch_log: dict[int, list[tuple[int, int]]], res: TransmitResult) -> bool:
        """One wave without a tamper hook: each attempt that is sent and not lost arrives
        once, as sent, and is checked against the opened manifest (as :meth:`transmit`'s
        general path does with the hook's deliveries). True if every pending chunk verified."""
        sha = hashlib.sha256
        at = [keys[k] for k in pending]
        chunks = [data[k] for k in pending]
        ms = [manifests[c] for c, _ in at]
        # check_chunk's test of every attempt that arrives, in one pass (data is bytes here)
        intact = [chunk is not None and not lost[k]
                  and len(chunk) == (m.chunk_size if i < len(m.chunk_digests) - 1
                                     else m.payload_len - (len(m.chunk_digests) - 1) * m.chunk_size)
                  and sha(chunk).hexdigest() == m.chunk_digests[i]
                  for k, (_, i), chunk, m in zip(pending, at, chunks, ms)]
        if all(intact):  # the common case: everything arrived as announced, filed at once
            for (c, i), chunk in zip(at, chunks):
                got[c][i] = chunk  # type: ignore[assignment]
            got_at[pending] = when[pending]
            return True
        when_l = when.tolist()
        for j, k in enumerate(pending):
            c, i = at[j]
            have = got[c]
            if i in have:
                continue
            chunk, bad_relay = chunks[j], None
            if chunk is not None and not lost[k]:
                if intact[j]:
                    have[i] = bytes(chunk)
                    got_at[k] = when_l[k]
                    continue
                bad_relay = relay[k]
                res.mismatches.append((c, i, bad_relay))
                mismatch_log.setdefault(c, []).append((i, bad_relay))
            if bad_relay is not None:
                reason = f"chunk {i} digest mismatch after {wave} retries ({_via(bad_relay, c)})"
            elif lost[k] and chunk is not None:
                reason = f"chunk {i} lost after {wave} retries"
            else:
                reason = f"withheld: missing chunk {i}"
            failure[k] = (reason, when_l[k])
        return False

    @staticmethod
    def _match_alternate(key: tuple[int, int], d: ChunkDelivery, alternates: Mapping[int, list[UpdateManifest]],
                         alt_got: dict[tuple[int, int], dict[int, bytes]]) -> bool:
        """File ``d`` under the first equivocation copy whose digest it matches; True if one did."""
        c, i = key
        data = getattr(d, "data", None)
        for j, m in enumerate(alternates.get(c, ())):
            if i < m.n_chunks and check_chunk(m, i, data) is None:
                alt_got.setdefault((c, j), {}).setdefault(i, bytes(data))
                return True
        return False

    # -- helpers ------------------------------------------------------------------------
    def _manifest_problem(self, c: int, manifest: object, round: int, parent: str | None,
                          max_payload_len: int | None = None, validated: bool = False) -> str | None:
        if not isinstance(manifest, UpdateManifest):
            return f"expected an UpdateManifest, got {type(manifest).__name__}"
        too_big = _size_problem(manifest, max_payload_len)  # before hashing thousands of digests
        if too_big is not None:
            return too_big
        if not validated:
            try:
                manifest.validate()
            except ManifestError as exc:
                return str(exc)
        if manifest.client != c:
            return f"manifest names client {manifest.client}, uploaded by client {c}"
        if manifest.round != round:
            return f"manifest is for round {manifest.round}, this is round {round}"
        if parent is not None and manifest.parent_digest != parent:
            return f"stale parent model {manifest.parent_digest[:12]}…, current is {parent[:12]}…"
        return None

    @staticmethod
    def _sent_data(chunks: Sequence[bytes], i: int) -> bytes | None:
        if i < len(chunks) and isinstance(chunks[i], (bytes, bytearray, memoryview)):
            return bytes(chunks[i])
        return None

    @staticmethod
    def _first_relays(author: np.ndarray, ids: list[int], use: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Per chunk: its author (direct) or, where ``use``, a uniform other participant."""
        if len(ids) < 2:
            return author.copy()
        peers = np.asarray(ids, dtype=np.int64)
        r = np.minimum((u * (peers.size - 1)).astype(np.int64), peers.size - 2)
        r += r >= np.searchsorted(peers, author)  # skip the author's own slot
        return np.where(use, peers[r], author)

    @staticmethod
    def _refetch_sources(
        author: np.ndarray, ids: list[int], use: np.ndarray, u: np.ndarray, prev: np.ndarray
    ) -> np.ndarray:
        """Re-fetch sources: the author, or where ``use`` a peer other than the author and ``prev``."""
        out = author.copy()
        peers = np.asarray(ids, dtype=np.int64)
        for j in np.flatnonzero(use):
            cand = peers[(peers != author[j]) & (peers != prev[j])]
            if cand.size:
                out[j] = cand[min(int(u[j] * cand.size), cand.size - 1)]
        return out


def _send_s(nbytes: float | np.ndarray, bytes_per_s: np.ndarray) -> np.ndarray:
    """Seconds to send ``nbytes`` over links of ``bytes_per_s``, without numpy warnings:
    infinite where the link is so slow that the time overflows a float (a bandwidth of
    1e-300 Mbit/s, or one a huge σ drew as 0): such an upload never arrives (a straggler
    under a deadline; without one the round lasts forever); 0 where nothing is sent."""
    n = np.asarray(nbytes, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        t = n / bytes_per_s
    return np.where(n == 0, 0.0, t)


def _times(steps: float | np.ndarray, seconds_each: np.ndarray) -> np.ndarray:
    """``steps × seconds_each``; 0 steps take no time even on an infinitely slow device."""
    n = np.asarray(steps, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t = n * seconds_each
    return np.where(n == 0, 0.0, t)


def _first_sent(chunks: Sequence[bytes]) -> bytes | None:
    """:meth:`Network._sent_data` of chunk 0."""
    if len(chunks) and isinstance(chunks[0], (bytes, bytearray, memoryview)):
        return bytes(chunks[0])
    return None


def _plain_ids(uploads: Mapping[object, object], n_clients: int) -> bool:
    """True only if every key of ``uploads`` is an ``int`` (not a bool) in [0, n_clients)."""
    if uploads and set(map(type, uploads)) != {int}:
        return False
    return not uploads or (min(uploads) >= 0 and max(uploads) < n_clients)  # type: ignore[type-var]


def _size_problem(m: UpdateManifest, limit: int | None) -> str | None:
    n = m.payload_len
    if limit is None or not isinstance(n, int) or isinstance(n, bool) or n <= limit:
        return None
    return f"announced payload of {n} bytes exceeds the codec's {limit} bytes for this model"


def _key(d: object) -> tuple[int, int] | None:
    a, i = getattr(d, "author", None), getattr(d, "index", None)
    if isinstance(a, (int, np.integer)) and isinstance(i, (int, np.integer)) and not isinstance(a, bool):
        return int(a), int(i)
    return None


def _nbytes(d: object) -> int:
    data = getattr(d, "data", None)
    return len(data) if isinstance(data, (bytes, bytearray, memoryview)) else 0


def _via(relay: int, author: int) -> str:
    return "direct from the author" if relay == author else f"via relay {relay}"
