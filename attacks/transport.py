"""Transport attacks: what relays, eavesdroppers and senders can do to chunked updates.

The standard P2P threats to chunked, BitTorrent-style distribution (BEP 3, BEP 52):
in-transit tampering / pollution (the P2P pollution
attacks on Kazaa and live streaming: Liang, Kumar, Xi & Ross, "Pollution in P2P File
Sharing Systems", INFOCOM 2005; Dhungel et al., "The Pollution Attack in P2P Live Video
Streaming", P2P-TV 2007), chunk substitution, mix-and-match of two valid updates of one
sender, replay of an earlier round's update, equivocation (two signed updates for one
(sender, round), each to a different sub-aggregator), withholding after announcing, and
codec abuse (a payload whose scale or sparsity decodes to a huge vector, which must be
caught by validation *after* decoding). Each acts through
``tamper_chunks`` (``Surface.TRANSPORT``) on the round's :class:`~redteam.types.ChunkDelivery`
list; index −1 is an update's header (its manifest, or the DSSE envelope signing it).

Threat models (explicit parameters):

* attacks on *other* clients' updates (``chunk_tamper``, ``chunk_substitute``,
  ``mix_and_match``, ``replay``) take ``position``: ``"relay"`` (default) — the malicious
  clients are swarm peers and may only touch deliveries they relay (``relay`` is a
  malicious client other than the author), so they reach only what the network happens
  to route through them; ``"path"`` — an on-path adversary (say, the victims' access
  network) that sees and rewrites every delivery of its ``victims`` (default: every
  honest client), re-fetches included;
* sender-side attacks (``equivocate``, ``withhold``, ``codec_abuse``) act on the
  malicious clients' own uploads and sign with their own enrolled keys (``ctx.state
  ["signer"]``); they cannot sign for anyone else;
* an attacker without a key can still rewrite an *unsigned* header so that it matches
  what it substituted (``forge_header``) — exactly what signing takes away: under
  ``signed_chunks`` the rewritten statement no longer matches its signature.

What the trainer gives them is documented in :mod:`redteam.federation.loop`
(``own_uploads``, ``signer``, ``codec``, ``dim``, ``history`` …). Without it — as in
the contract kit — each attack returns the deliveries unchanged where it has nothing to
work with. Randomness comes only from ``ctx.generator``; everything else is a
deterministic function of the deliveries, so the header call and the chunk calls of
one round agree on what was substituted.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from redteam.types import Attack, AttackContext, ChunkDelivery, Surface, param_error

if TYPE_CHECKING:
    from redteam.transport.chunking import UpdateManifest

__all__ = [
    "ChunkTamper",
    "ChunkSubstitute",
    "MixAndMatch",
    "Replay",
    "Equivocate",
    "Withhold",
    "CodecAbuse",
]

HEADER = -1


# ----------------------------------------------------------------------------- helpers
def _check_position(obj: Any, v: Any) -> None:
    if v not in ("relay", "path"):
        raise param_error(obj, "position", v, "must be 'relay' (only deliveries a malicious client relays) or "
                                              "'path' (every delivery of the victims)")


def _check_victims(obj: Any, v: Any) -> None:
    if not isinstance(v, (tuple, list)) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                   for c in v):
        raise param_error(obj, "victims", v, "must be a list of client ids ≥ 0 (empty: every honest client)")


def _check_flag(obj: Any, name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise param_error(obj, name, v, "must be true or false")


def _touchable(d: ChunkDelivery, ctx: AttackContext, position: str, victims: tuple[int, ...]) -> bool:
    """May an attacker in ``position`` change delivery ``d`` of an honest author?"""
    bad = ctx.malicious
    if d.author in bad or (victims and d.author not in victims):
        return False
    if position == "path":
        return True
    return d.relay in bad and d.relay != d.author


def _copy(d: ChunkDelivery, data: bytes) -> ChunkDelivery:
    return ChunkDelivery(author=d.author, index=d.index, relay=d.relay, data=data, round=d.round)


def _read(header: bytes) -> "UpdateManifest | None":
    from redteam.errors import RedteamError
    from redteam.transport.signing import read_header

    try:
        return read_header(header)
    except RedteamError:
        return None


def _derived_nonce(*parts: Any) -> str:
    """A nonce that is a deterministic function of ``parts`` (the header call and the chunk
    calls of one round must build the very same forged manifest)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _state(ctx: AttackContext, key: str) -> Any:
    return ctx.state.get(key) if ctx.state else None


# ----------------------------------------------------------------------------- tampering
@dataclass(frozen=True, slots=True)
class ChunkTamper(Attack):
    """A polluting relay flips bits in the chunks it forwards (P2P pollution).

    * ``rate``: probability that a touchable delivery is tampered with;
    * ``bits``: bits flipped per tampered delivery, at uniform positions;
    * ``headers``: also flip bits in headers (index −1), not only chunks;
    * ``position`` / ``victims``: the threat model (module docstring).

    Expected defense: the per-chunk SHA-256 in the header catches every flip, the chunk
    is re-fetched from another source and the relay is logged (``flagged_relays``);
    with signatures the same holds for headers.
    """

    rate: float = 1.0
    bits: int = 1
    headers: bool = False
    position: Literal["relay", "path"] = "relay"
    victims: tuple[int, ...] = ()
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRANSPORT,)
    summary: ClassVar[str] = "Relay flips bits in the chunks (and optionally headers) it forwards"
    reference: ClassVar[str] = "Liang et al., INFOCOM 2005 (pollution in P2P file sharing); BEP 52 per-piece hashes"

    def validate_rate(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1):
            raise param_error(self, "rate", v, "must be a probability in [0, 1]")

    def validate_bits(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "bits", v, "must be an integer ≥ 1")

    def validate_headers(self, v: bool) -> None:
        _check_flag(self, "headers", v)

    def validate_position(self, v: str) -> None:
        _check_position(self, v)

    def validate_victims(self, v: tuple[int, ...]) -> None:
        _check_victims(self, v)

    def tamper_chunks(self, deliveries: list[ChunkDelivery], ctx: AttackContext) -> list[ChunkDelivery]:
        import torch

        g = ctx.generator
        u = torch.rand(len(deliveries), generator=g, device=g.device).tolist()
        out = []
        for d, draw in zip(deliveries, u):
            hit = (draw < self.rate and len(d.data) > 0 and (d.index >= 0 or self.headers)
                   and _touchable(d, ctx, self.position, self.victims))
            if hit:
                pos = torch.randint(0, 8 * len(d.data), (self.bits,), generator=g, device=g.device).cpu().numpy()
                arr = np.frombuffer(bytes(d.data), dtype=np.uint8).copy()
                np.bitwise_xor.at(arr, pos // 8, (1 << (pos % 8)).astype(np.uint8))
                d = _copy(d, arr.tobytes())
            out.append(d)
        return out


@dataclass(frozen=True, slots=True)
class _Substitution(Attack):
    """Shared logic: replace some chunks of a victim's update and (when ``forge_header``)
    rewrite its header to announce the substituted digests."""

    position: Literal["relay", "path"] = "relay"
    victims: tuple[int, ...] = ()
    forge_header: bool = True

    def validate_position(self, v: str) -> None:
        _check_position(self, v)

    def validate_victims(self, v: tuple[int, ...]) -> None:
        _check_victims(self, v)

    def validate_forge_header(self, v: bool) -> None:
        _check_flag(self, "forge_header", v)

    # subclasses: the bytes chunk ``index`` of ``victim``'s current update is replaced by
    def source(self, victim: int, index: int, length: int, ctx: AttackContext) -> bytes | None:
        raise NotImplementedError

    def chosen(self, index: int) -> bool:
        return True

    def forged(self, header: bytes, victim: int, ctx: AttackContext) -> bytes:
        from redteam.transport.chunking import merkle_root
        from redteam.transport.signing import forge_header

        m = _read(header)
        if m is None:
            return header
        digests = list(m.chunk_digests)
        for i in range(m.n_chunks):
            length = m.chunk_size if i < m.n_chunks - 1 else m.payload_len - (m.n_chunks - 1) * m.chunk_size
            sub = self.source(victim, i, length, ctx) if self.chosen(i) else None
            if sub is not None:
                digests[i] = _digest(sub)
        if digests == list(m.chunk_digests):
            return header
        new = replace(m, chunk_digests=tuple(digests),
                      merkle_root=merkle_root([bytes.fromhex(h) for h in digests]).hex())
        return forge_header(header, new)

    def tamper_chunks(self, deliveries: list[ChunkDelivery], ctx: AttackContext) -> list[ChunkDelivery]:
        out = []
        for d in deliveries:
            if _touchable(d, ctx, self.position, self.victims):
                if d.index == HEADER:
                    if self.forge_header:
                        d = _copy(d, self.forged(d.data, d.author, ctx))
                elif self.chosen(d.index):
                    sub = self.source(d.author, d.index, len(d.data), ctx)
                    if sub is not None:
                        d = _copy(d, sub)
            out.append(d)
        return out


@dataclass(frozen=True, slots=True)
class ChunkSubstitute(_Substitution):
    """A malicious relay substitutes the victim's chunks with chunks of its own update
    (pollution by substitution rather than random flips).

    The substitute for chunk i is chunk i of the first malicious client's own upload this
    round (same length required, so the victim's update still decodes — now carrying the
    attacker's values). With ``forge_header`` an unsigned header is rewritten to the
    substituted digests, so nothing downstream can tell; a signed header cannot be.

    * ``position`` / ``victims``: the threat model (module docstring);
    * ``forge_header``: rewrite the header to match (default true).
    """

    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRANSPORT,)
    summary: ClassVar[str] = "Malicious relay substitutes victims' chunks with its own (and forges unsigned headers)"
    reference: ClassVar[str] = "Dhungel et al., P2P-TV 2007 (pollution in P2P live streaming); BEP 52"

    def source(self, victim: int, index: int, length: int, ctx: AttackContext) -> bytes | None:
        own = _state(ctx, "own_uploads") or {}
        if not own:
            return None
        chunks = own[min(own)][1]
        if index < len(chunks) and len(chunks[index]) == length:
            return bytes(chunks[index])
        return None


@dataclass(frozen=True, slots=True)
class MixAndMatch(_Substitution):
    """Combine chunks of two valid updates of one sender (mix-and-match).

    The victim's chunks at the odd indices (or ``indices``) are replaced by the same
    chunks of its update from ``lag`` rounds earlier, recorded by the attacker; every
    piece is authentic, only the combination is not. Expected defense: per-chunk digests
    under a signed root (with ``forge_header`` on an unsigned header, nothing catches it).

    * ``lag``: how many rounds back the second update is (≥ 1);
    * ``indices``: the chunk indices taken from the older update (default: the odd ones);
    * ``position`` / ``victims`` / ``forge_header``: as for ``chunk_substitute``.
    """

    lag: int = 1
    indices: tuple[int, ...] = ()
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRANSPORT,)
    summary: ClassVar[str] = "Mix chunks of a sender's current and earlier updates (forging unsigned headers)"
    reference: ClassVar[str] = "BEP 52 (per-file Merkle piece roots); Liang et al., INFOCOM 2005"

    def validate_lag(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "lag", v, "must be an integer ≥ 1")

    def validate_indices(self, v: tuple[int, ...]) -> None:
        if not isinstance(v, (tuple, list)) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                       for i in v):
            raise param_error(self, "indices", v, "must be a list of chunk indices ≥ 0 (empty: the odd ones)")

    @property
    def history_rounds(self) -> int:
        return self.lag

    def chosen(self, index: int) -> bool:
        return index in self.indices if self.indices else index % 2 == 1

    def source(self, victim: int, index: int, length: int, ctx: AttackContext) -> bytes | None:
        past = (_state(ctx, "history") or {}).get(ctx.round - self.lag, ())
        for d in past:
            if d.author == victim and d.index == index and len(d.data) == length:
                return bytes(d.data)
        return None


@dataclass(frozen=True, slots=True)
class Replay(Attack):
    """Resend a victim's update from ``lag`` rounds earlier (replay, or rollback:
    an old valid envelope presented again in a later round).

    Every touchable header and chunk of the victim is replaced by its recorded
    counterpart from round t − lag. With ``rewrite`` the old header is made to claim the
    current round, parent model and a fresh nonce: an unsigned header then passes and the
    server applies a stale delta (a rollback of the victim's progress); a signed one
    fails its signature. Without ``rewrite`` the old header is resent verbatim and the
    round / parent / nonce binding rejects it even unsigned.

    * ``lag``: rounds back (≥ 1); ``rewrite``: see above (default true);
    * ``position`` / ``victims``: the threat model (module docstring).
    """

    lag: int = 1
    rewrite: bool = True
    position: Literal["relay", "path"] = "relay"
    victims: tuple[int, ...] = ()
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRANSPORT,)
    summary: ClassVar[str] = "Replay a victim's update from an earlier round (rewriting unsigned headers)"
    reference: ClassVar[str] = "Syverson, IEEE CSFW 1994 (a taxonomy of replay attacks)"

    def validate_lag(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "lag", v, "must be an integer ≥ 1")

    def validate_rewrite(self, v: bool) -> None:
        _check_flag(self, "rewrite", v)

    def validate_position(self, v: str) -> None:
        _check_position(self, v)

    def validate_victims(self, v: tuple[int, ...]) -> None:
        _check_victims(self, v)

    @property
    def history_rounds(self) -> int:
        return self.lag

    def tamper_chunks(self, deliveries: list[ChunkDelivery], ctx: AttackContext) -> list[ChunkDelivery]:
        past = (_state(ctx, "history") or {}).get(ctx.round - self.lag, ())
        if not past:
            return list(deliveries)
        old = {(d.author, d.index): bytes(d.data) for d in past}
        out = []
        for d in deliveries:
            key = (d.author, d.index)
            if key in old and _touchable(d, ctx, self.position, self.victims):
                data = old[key]
                if d.index == HEADER and self.rewrite:
                    data = self._rewrite(data, d.data)
                d = _copy(d, data)
            out.append(d)
        return out

    @staticmethod
    def _rewrite(old_header: bytes, current_header: bytes) -> bytes:
        from redteam.transport.signing import forge_header

        old, cur = _read(old_header), _read(current_header)
        if old is None or cur is None:
            return old_header
        new = replace(old, round=cur.round, parent_digest=cur.parent_digest,
                      nonce=_derived_nonce("replay", old.nonce, cur.round))
        return forge_header(old_header, new)


# ----------------------------------------------------------------------------- sender side
def _reupload(c: int, payload: bytes, template: "UpdateManifest", nonce: str, ctx: AttackContext
              ) -> tuple[bytes, list[bytes]] | None:
    """A new header (signed with ``c``'s own key when updates are signed) and chunks for
    ``payload``, announced like ``template``."""
    from redteam.errors import RedteamError
    from redteam.transport.chunking import build_manifest

    signer = _state(ctx, "signer")
    if signer is None:
        return None
    m, chunks = build_manifest(payload, round=template.round, client=c, parent_digest=template.parent_digest,
                               codec=template.codec, chunk_size=template.chunk_size, nonce=nonce)
    try:
        return signer(m), chunks
    except RedteamError:
        return None


@dataclass(frozen=True, slots=True)
class _SenderRewrite(Attack):
    """Shared logic: each malicious sender replaces (or, when ``extra``, adds to) its own
    header and chunks with those of :meth:`payload`'s result."""

    extra: ClassVar[bool] = False

    def payload(self, own: bytes, ctx: AttackContext) -> bytes | None:
        raise NotImplementedError

    def _plans(self, ctx: AttackContext) -> dict[int, tuple[bytes, list[bytes], int]]:
        """malicious client → (new header, new chunks, how many chunks it originally had)."""
        plans = {}
        for c, (header, chunks) in sorted((_state(ctx, "own_uploads") or {}).items()):
            m = _read(header)
            new = self.payload(b"".join(chunks), ctx) if m is not None else None
            if new is None:
                continue
            up = _reupload(c, new, m, _derived_nonce(type(self).__name__, m.nonce), ctx)
            if up is not None:
                plans[c] = (*up, len(chunks))
        return plans

    def tamper_chunks(self, deliveries: list[ChunkDelivery], ctx: AttackContext) -> list[ChunkDelivery]:
        plans = self._plans(ctx)
        if not plans:
            return list(deliveries)
        out: list[ChunkDelivery] = []
        for d in deliveries:
            plan = plans.get(d.author)
            if plan is None:
                out.append(d)
                continue
            header, chunks, had = plan
            relay = d.author if self.extra else d.relay
            if self.extra:
                out.append(d)
            if d.index == HEADER:
                out.append(ChunkDelivery(d.author, HEADER, relay, header, d.round))
                continue
            # with the last original chunk go any chunks the new payload has beyond it
            upto = len(chunks) if d.index == had - 1 else d.index + 1
            out.extend(ChunkDelivery(d.author, i, relay, chunks[i], d.round) for i in range(d.index, upto))
        return out


@dataclass(frozen=True, slots=True)
class Equivocate(_SenderRewrite):
    """Sign two different updates for one round and send each to a different
    sub-aggregator (equivocation; compare BTARD's broadcast-hash accusation,
    Gorbunov, Borzunov, Diskin & Ryabinin, ICML 2022).

    The second update is ``factor`` × the first (re-encoded with the round's codec; 1
    keeps the payload, and the two signed statements still differ by their nonces). It is
    signed with the sender's own key. Without gossip each sub-aggregator sees one valid
    update and the sender is counted twice; with ``signed_chunks(gossip=true)`` the two
    signatures for one (sender, round) prove equivocation and the sender is banned.

    * ``factor``: the second update relative to the first (any finite number).
    """

    factor: float = 1.0
    extra: ClassVar[bool] = True
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRANSPORT,)
    summary: ClassVar[str] = "Two different signed updates for one round, to two sub-aggregators"
    reference: ClassVar[str] = "Lamport, Shostak & Pease, TOPLAS 1982; Gorbunov et al., ICML 2022 (BTARD)"

    def validate_factor(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            raise param_error(self, "factor", v, "must be a finite number")

    def payload(self, own: bytes, ctx: AttackContext) -> bytes | None:
        if self.factor == 1.0:
            return own
        codec, dim = _state(ctx, "codec"), _state(ctx, "dim")
        if codec is None or dim is None:
            return None
        import torch

        from redteam.errors import RedteamError

        try:
            row = codec.decode(own, dim)
            g = torch.Generator().manual_seed(ctx.round)  # deterministic: header and chunk calls agree
            return codec.encode(self.factor * row, g)
        except RedteamError:
            return None


@dataclass(frozen=True, slots=True)
class Withhold(Attack):
    """Announce the update, then withhold chunks (withholding / partial
    upload): the header goes out, the last ⌈``fraction`` · n⌉ chunks never do, so the
    receiver waits, re-fetches in vain and drops the sender as a straggler. Expected
    defense: a deadline, and not counting the sender as present in Byzantine-fraction
    arithmetic.

    * ``fraction``: share of each update's chunks withheld, in (0, 1] (at least one).
    """

    fraction: float = 1.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRANSPORT,)
    summary: ClassVar[str] = "Announce an update, then withhold (some of) its chunks"
    reference: ClassVar[str] = "Liang et al., INFOCOM 2005 (P2P pollution and withholding); BEP 52"

    def validate_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    def tamper_chunks(self, deliveries: list[ChunkDelivery], ctx: AttackContext) -> list[ChunkDelivery]:
        own = _state(ctx, "own_uploads") or {}
        bad = set(ctx.malicious)
        counts = {c: len(own[c][1]) for c in own}
        for d in deliveries:
            if d.author in bad and d.author not in own and d.index >= 0:
                counts[d.author] = max(counts.get(d.author, 0), d.index + 1)
        first = {c: k - max(1, math.ceil(self.fraction * k - 1e-12)) for c, k in counts.items()}
        return [d for d in deliveries if not (d.author in bad and d.index >= 0 and d.index >= first.get(d.author, 0))]


# payload layout of redteam.transport.compression (public wire format)
_HDR = struct.Struct("<4sBBBBII")
_F16_MAX, _BF16_MAX = 65504.0, 3.3895313892515355e38


@dataclass(frozen=True, slots=True)
class CodecAbuse(_SenderRewrite):
    """A sender whose payload header decodes to a huge vector (codec
    abuse; the answer is to validate in parameter space, after decoding).

    The malicious client takes its honest payload and rewrites it in the codec's own
    wire format, then signs the result with its own key (so signatures cannot help):

    * ``mode="scale"``: int8 — every block scale becomes ``magnitude``/127; dense, fp16,
      bf16 and sparse codecs — every value becomes ±``magnitude`` (clipped to the
      format's largest finite value). It decodes to a finite vector of enormous norm,
      which only a validation bound after decoding (``norm_bound``, ``sanity``) stops;
    * ``mode="density"``: a sparse payload claiming k = d (every coordinate present, all
      ±``magnitude``); the decoder refuses the count;
    * ``mode="dim"``: a header claiming dimension 2³² − 1 (a memory-exhaustion attempt);
      the decoder refuses it before allocating anything.

    * ``magnitude``: the largest absolute value the forged payload decodes to (> 0).
    """

    mode: Literal["scale", "density", "dim"] = "scale"
    magnitude: float = 1e30
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRANSPORT,)
    summary: ClassVar[str] = "Sender forges its codec header/scales so the update decodes to a huge vector"
    reference: ClassVar[str] = "CWE-130 (length field inconsistent with the data); CWE-409 (decompression bombs)"

    def validate_mode(self, v: str) -> None:
        if v not in ("scale", "density", "dim"):
            raise param_error(self, "mode", v, "must be 'scale', 'density' or 'dim'")

    def validate_magnitude(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "magnitude", v, "must be a finite number > 0")

    def payload(self, own: bytes, ctx: AttackContext) -> bytes | None:
        if len(own) < _HDR.size:
            return None
        magic, version, cid, dtype, flags, dim, count = _HDR.unpack_from(own, 0)
        body = bytearray(own[_HDR.size:])
        if self.mode == "dim":
            return _HDR.pack(magic, version, cid, dtype, flags, 0xFFFFFFFF, count) + bytes(body)
        sparse = cid in (4, 5)
        if self.mode == "density" and sparse:
            vals = np.full(dim, min(self.magnitude, 3.4e38), dtype="<f4")
            bitmap = np.packbits(np.ones(dim, dtype=bool), bitorder="little")
            return _HDR.pack(magic, version, cid, dtype, 1, dim, dim) + vals.tobytes() + bitmap.tobytes()
        if cid == 3:  # int8: scales first
            block = max(count, 1)
            nb = math.ceil(dim / block)
            scales = np.full(nb, min(self.magnitude, 3.4e38) / 127.0, dtype="<f4")
            return own[:_HDR.size] + scales.tobytes() + bytes(body[4 * nb:])
        n_vals = count if sparse else dim
        if cid in (0, 4, 5):
            vals = np.frombuffer(bytes(body[:4 * n_vals]), dtype="<f4")
            new = np.where(vals < 0, -1.0, 1.0).astype("<f4") * np.float32(min(self.magnitude, 3.4e38))
            return own[:_HDR.size] + new.astype("<f4").tobytes() + bytes(body[4 * n_vals:])
        if cid == 1:
            vals = np.frombuffer(bytes(body[:2 * dim]), dtype="<f2")
            new = (np.where(vals < 0, -1.0, 1.0) * min(self.magnitude, _F16_MAX)).astype("<f2")
            return own[:_HDR.size] + new.tobytes()
        if cid == 2:
            vals = np.frombuffer(bytes(body[:2 * dim]), dtype="<u2")
            sign = (vals & 0x8000) != 0
            top = (np.array([min(self.magnitude, _BF16_MAX)], dtype="<f4").view("<u4")[0] >> 16) & 0x7FFF
            new = (np.where(sign, 0x8000, 0) | top).astype("<u2")
            return own[:_HDR.size] + new.tobytes()
        return None
