"""Content-addressed chunks, Merkle roots and update manifests (BitTorrent v2 style).

An encoded update (``bytes``) is cut into fixed-size chunks; each chunk is addressed
by its SHA-256 digest and a Merkle root is built over the digests as BEP 52 does for a
file's 16 KiB blocks (Cohen & Norberg, "BitTorrent v2", BEP 52, 2017/2020):

* the leaf layer is padded with 32 zero bytes up to a power of two;
* a node is SHA-256(left ‖ right); a single leaf is its own root.

Because every leaf digest is in the manifest, a single chunk can be checked the
moment it arrives and re-fetched from another peer if it does not match; peers that
hold only the root can check a chunk with :func:`merkle_proof` / :func:`verify_proof`.

Conventions (documented choices, not BEP 52's):

* an empty payload is one empty chunk, so every manifest lists at least one digest;
* chunk i has ``chunk_size`` bytes except the last, which has the remainder.

:class:`UpdateManifest` binds round, client, parent-model digest, codec, payload
length, chunk size, the chunk digests, their Merkle root and a fresh nonce. Its
:meth:`~UpdateManifest.to_json` is the canonical byte string that signatures cover
(sorted keys, no whitespace, ASCII); :meth:`~UpdateManifest.from_json` accepts only that
form and validates every field, raising :class:`ManifestError` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import weakref
from dataclasses import dataclass, fields
from json.encoder import encode_basestring_ascii as _json_str
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from redteam.errors import DecodeError, InvalidParameter, TransportError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ZERO_DIGEST",
    "ManifestError",
    "split",
    "count_chunks",
    "expected_chunk_len",
    "chunk_digest",
    "merkle_root",
    "merkle_proof",
    "verify_proof",
    "params_digest",
    "new_nonce",
    "new_nonces",
    "UpdateManifest",
    "build_manifest",
    "build_manifests",
    "reassemble",
    "check_chunk",
]

DEFAULT_CHUNK_SIZE = 16 * 1024  # BEP 52's leaf block size
ZERO_DIGEST = bytes(32)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX = re.compile(r"[0-9a-f]*")
_DROP_HEX = str.maketrans("", "", "0123456789abcdef")
_MAX_CODEC_LEN = 256
_MAX_INT = 2**53  # JSON-safe integers only


class ManifestError(DecodeError, TransportError):
    """An update manifest is malformed or inconsistent (the message names the field)."""


def _check_chunk_size(chunk_size: Any) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise InvalidParameter(f"chunk_size = {chunk_size!r}: must be an integer ≥ 1")
    return chunk_size


def count_chunks(payload_len: int, chunk_size: int) -> int:
    """How many chunks a payload of ``payload_len`` bytes has (at least one)."""
    return max(1, math.ceil(payload_len / chunk_size))


def split(payload: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> list[bytes]:
    """Cut ``payload`` into chunks of ``chunk_size`` bytes (the last may be short).

    An empty payload gives one empty chunk.
    """
    _check_chunk_size(chunk_size)
    view = memoryview(payload).cast("B")
    if len(view) == 0:
        return [b""]
    return [bytes(view[i : i + chunk_size]) for i in range(0, len(view), chunk_size)]


def chunk_digest(data: bytes) -> bytes:
    """SHA-256 of one chunk (32 bytes)."""
    return hashlib.sha256(memoryview(data)).digest()


def _padded_leaves(digests: Sequence[bytes]) -> list[bytes]:
    leaves = [bytes(d) for d in digests]
    if not leaves:
        raise InvalidParameter("digests = []: a Merkle tree needs at least one leaf")
    for i, d in enumerate(leaves):
        if len(d) != 32:
            raise InvalidParameter(f"digests[{i}] has {len(d)} bytes, expected 32 (SHA-256)")
    width = 1 << (len(leaves) - 1).bit_length()
    return leaves + [ZERO_DIGEST] * (width - len(leaves))


def _parent_layer(layer: list[bytes]) -> list[bytes]:
    sha = hashlib.sha256
    return [sha(layer[i] + layer[i + 1]).digest() for i in range(0, len(layer), 2)]


def merkle_root(digests: Sequence[bytes]) -> bytes:
    """BEP 52 Merkle root over leaf digests (zero-padded to a power of two)."""
    layer = _padded_leaves(digests)
    while len(layer) > 1:
        layer = _parent_layer(layer)
    return layer[0]


def merkle_proof(digests: Sequence[bytes], index: int) -> list[bytes]:
    """Sibling hashes from leaf ``index`` up to (not including) the root."""
    layer = _padded_leaves(digests)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(digests):
        raise InvalidParameter(f"index = {index!r}: must be in [0, {len(digests)})")
    proof = []
    while len(layer) > 1:
        proof.append(layer[index ^ 1])
        layer = _parent_layer(layer)
        index //= 2
    return proof


def verify_proof(leaf_digest: bytes, index: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True iff ``proof`` links ``leaf_digest`` at ``index`` to ``root``; never raises."""
    try:
        node = bytes(leaf_digest)
        if len(node) != 32 or len(bytes(root)) != 32 or not isinstance(index, int) or index < 0:
            return False
        if index >> len(proof):
            return False
        for sibling in proof:
            sib = bytes(sibling)
            if len(sib) != 32:
                return False
            pair = sib + node if index & 1 else node + sib
            node = hashlib.sha256(pair).digest()
            index >>= 1
        return node == bytes(root)
    except (TypeError, ValueError):
        return False


def params_digest(params: "torch.Tensor") -> str:
    """Hex SHA-256 of the flattened parameters as little-endian float32 (the parent digest)."""
    import numpy as np

    arr = params.detach().to("cpu").reshape(-1).float().numpy().astype("<f4", copy=False)
    return hashlib.sha256(memoryview(np.ascontiguousarray(arr)).cast("B")).hexdigest()


def new_nonce(rng: "np.random.Generator") -> str:
    """16 random bytes from ``rng`` as 32 hex characters."""
    return bytes(rng.integers(0, 256, size=16, dtype="uint8").tolist()).hex()


def new_nonces(rng: "np.random.Generator", n: int) -> list[str]:
    """``n`` nonces in one draw: the same strings, and the same ``rng`` state after, as
    ``n`` calls of :func:`new_nonce` (16 uint8 draws each, taken in order)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidParameter(f"new_nonces: n = {n!r}: must be an integer ≥ 0")
    block = rng.integers(0, 256, size=(n, 16), dtype="uint8").tobytes().hex()
    return [block[32 * i : 32 * i + 32] for i in range(n)]


@dataclass(frozen=True, slots=True, weakref_slot=True)
class UpdateManifest:
    """What a client announces about one encoded update; the object that gets signed.

    Fields: ``round`` and ``client`` (≥ 0), ``parent_digest`` (hex SHA-256 of the global
    parameters the delta is relative to), ``codec`` (the codec's canonical spec),
    ``payload_len`` and ``chunk_size`` (bytes), ``chunk_digests`` (hex SHA-256 per chunk),
    ``merkle_root`` (hex, BEP 52 root over the digests) and ``nonce`` (32 hex chars).

    Construction does not validate (attacks must be able to forge bad manifests);
    :meth:`validate` and :meth:`from_json` do.
    """

    round: int
    client: int
    parent_digest: str
    codec: str
    payload_len: int
    chunk_size: int
    chunk_digests: tuple[str, ...]
    merkle_root: str
    nonce: str

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_digests)

    def to_json(self) -> bytes:
        """Canonical JSON bytes: sorted keys, no whitespace, ASCII only."""
        fast = _canonical_json(self)
        if fast is not None:
            return fast
        obj = {f.name: getattr(self, f.name) for f in fields(self)}
        obj["chunk_digests"] = list(self.chunk_digests)
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    def validate(self) -> "UpdateManifest":
        """Check every field and the digest/root consistency; return ``self``."""
        if known_valid(self) or _valid_fast(self):
            return self
        return self._validate_slow()

    def _validate_slow(self) -> "UpdateManifest":
        for name in ("round", "client", "payload_len", "chunk_size"):
            v = getattr(self, name)
            low = 1 if name == "chunk_size" else 0
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _MAX_INT:
                raise ManifestError(f"manifest.{name} = {v!r}: must be an integer in [{low}, 2⁵³]")
        for name, pattern, what in (
            ("parent_digest", _HEX64, "64 lowercase hex characters (SHA-256)"),
            ("merkle_root", _HEX64, "64 lowercase hex characters (SHA-256)"),
            ("nonce", _HEX32, "32 lowercase hex characters (16 bytes)"),
        ):
            v = getattr(self, name)
            if not isinstance(v, str) or not pattern.fullmatch(v):
                raise ManifestError(f"manifest.{name} = {_short(v)}: must be {what}")
        codec = self.codec
        if not isinstance(codec, str) or not 0 < len(codec) <= _MAX_CODEC_LEN or not codec.isprintable():
            raise ManifestError(
                f"manifest.codec = {_short(codec)}: must be printable text of 1–{_MAX_CODEC_LEN} characters"
            )
        digests = self.chunk_digests
        if not isinstance(digests, (tuple, list)):
            raise ManifestError(f"manifest.chunk_digests = {_short(digests)}: must be a list of hex digests")
        want = count_chunks(self.payload_len, self.chunk_size)
        if len(digests) != want:
            raise ManifestError(
                f"manifest.chunk_digests has {len(digests)} entries, payload_len {self.payload_len} "
                f"at chunk_size {self.chunk_size} needs {want}"
            )
        for i, h in enumerate(digests):
            if not isinstance(h, str) or not _HEX64.fullmatch(h):
                raise ManifestError(
                    f"manifest.chunk_digests[{i}] = {_short(h)}: must be 64 lowercase hex characters"
                )
        root = merkle_root([bytes.fromhex(h) for h in digests]).hex()
        if root != self.merkle_root:
            raise ManifestError(
                f"manifest.merkle_root {self.merkle_root[:16]}… does not match its chunk digests ({root[:16]}…)"
            )
        return self

    @classmethod
    def from_json(cls, data: bytes) -> "UpdateManifest":
        """Parse and validate canonical manifest JSON (untrusted bytes)."""
        if cls is UpdateManifest and type(data) is bytes:
            # the exact text a builder wrote for a manifest it made: that manifest is the
            # parse (byte equality, not trust: any other bytes are parsed in full)
            known = _RECENT.by_text(data)
            if known is not None:
                return known
        fast = _from_json_fast(cls, data)
        if fast is not None:
            return fast
        try:
            text = bytes(data).decode("ascii")
            obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
        except ManifestError:
            raise
        except (TypeError, ValueError, RecursionError) as exc:
            raise ManifestError(f"manifest: not valid ASCII JSON ({type(exc).__name__}: {exc})") from None
        if not isinstance(obj, dict):
            raise ManifestError(f"manifest: expected a JSON object, got {type(obj).__name__}")
        names = [f.name for f in fields(cls)]
        for key in obj:
            if key not in names:
                raise ManifestError(f"manifest: unknown field {_short(key)}")
        for key in names:
            if key not in obj:
                raise ManifestError(f"manifest.{key}: missing")
        if not isinstance(obj["chunk_digests"], list):
            raise ManifestError(f"manifest.chunk_digests = {_short(obj['chunk_digests'])}: must be a list")
        obj["chunk_digests"] = tuple(obj["chunk_digests"])
        manifest = cls(**obj).validate()
        if manifest.to_json() != bytes(data):
            raise ManifestError("manifest: JSON is valid but not in canonical form (sorted keys, no whitespace)")
        return manifest


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ManifestError(f"manifest: duplicate field {_short(k)}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise ManifestError(f"manifest: {name} is not allowed in JSON")


# -- fast paths: each gives exactly the slow path's answer where it answers, and defers to
# the slow path (which names the problem) for anything it does not accept outright.
_FIELD_NAMES = ("round", "client", "parent_digest", "codec", "payload_len", "chunk_size", "chunk_digests",
                "merkle_root", "nonce")
_FIELD_SET = frozenset(_FIELD_NAMES)
_ASCII_PRINTABLE = re.compile(r"[ -~]*")


def _canonical_json(m: UpdateManifest) -> bytes | None:
    """``json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=True)`` of the
    manifest, written directly; ``None`` unless every field has its exact declared type."""
    ints = (m.round, m.client, m.payload_len, m.chunk_size)
    strs = (m.parent_digest, m.codec, m.merkle_root, m.nonce)
    digests = m.chunk_digests
    if any(type(v) is not int for v in ints) or any(type(v) is not str for v in strs):
        return None
    if type(digests) not in (tuple, list) or any(type(h) is not str for h in digests):
        return None
    return (
        '{"chunk_digests":[' + ",".join(map(_json_str, digests)) + ']'
        + f',"chunk_size":{int.__repr__(m.chunk_size)},"client":{int.__repr__(m.client)}'
        + f',"codec":{_json_str(m.codec)},"merkle_root":{_json_str(m.merkle_root)},"nonce":{_json_str(m.nonce)}'
        + f',"parent_digest":{_json_str(m.parent_digest)},"payload_len":{int.__repr__(m.payload_len)}'
        + f',"round":{int.__repr__(m.round)}}}'
    ).encode("ascii")


def _valid_fast(m: UpdateManifest, root_known: bool = False) -> bool:
    """True only if :meth:`UpdateManifest.validate` would accept ``m`` (never raises).
    ``root_known``: the digests and root were just computed by a trusted builder."""
    try:
        rnd, client, plen, csize = m.round, m.client, m.payload_len, m.chunk_size
        if type(rnd) is not int or type(client) is not int or type(plen) is not int or type(csize) is not int:
            return False
        if not (0 <= rnd <= _MAX_INT and 0 <= client <= _MAX_INT and 0 <= plen <= _MAX_INT
                and 1 <= csize <= _MAX_INT):
            return False
        p, r, nonce, codec = m.parent_digest, m.merkle_root, m.nonce, m.codec
        if type(p) is not str or type(r) is not str or type(nonce) is not str or type(codec) is not str:
            return False
        if len(p) != 64 or len(r) != 64 or len(nonce) != 32 or not _HEX.fullmatch(p + r + nonce):
            return False
        # printable ASCII is a subset of str.isprintable(); anything else takes the slow path
        if not 0 < len(codec) <= _MAX_CODEC_LEN or not _ASCII_PRINTABLE.fullmatch(codec):
            return False
        digests = m.chunk_digests
        n = len(digests)
        if (type(digests) is not tuple and type(digests) is not list) or n != count_chunks(plen, csize):
            return False
        if root_known:
            return True
        if n == 1:  # a single leaf is its own root
            h = digests[0]
            return type(h) is str and len(h) == 64 and h == r and _HEX.fullmatch(h) is not None
        joined = "".join(digests)  # TypeError (to the slow path) unless all are str
        if len(joined) != 64 * n or not all(len(h) == 64 for h in digests) or not _HEX.fullmatch(joined):
            return False
        return merkle_root([bytes.fromhex(h) for h in digests]).hex() == r
    except Exception:  # noqa: BLE001 - odd objects (forged fields) go to the slow path
        return False


_UINT = r"(0|[1-9][0-9]{0,15})"
#: the canonical JSON of a manifest whose codec is printable ASCII without '"' or '\' (the
#: text json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=True) writes for it)
_CANONICAL = re.compile(
    rb'\{"chunk_digests":\[("[0-9a-f]{64}"(?:,"[0-9a-f]{64}")*)\],"chunk_size":' + _UINT.encode()
    + rb',"client":' + _UINT.encode() + rb',"codec":"([ !#-\[\]-~]{1,256})","merkle_root":"([0-9a-f]{64})"'
    rb',"nonce":"([0-9a-f]{32})","parent_digest":"([0-9a-f]{64})","payload_len":' + _UINT.encode()
    + rb',"round":' + _UINT.encode() + rb'\}'
)


def _from_json_fast(cls: type[UpdateManifest], data: Any) -> UpdateManifest | None:
    """Accept ``data`` only when it is, byte for byte, the canonical JSON of a manifest that
    validates (so no duplicate key, constant, escape or whitespace can be in it); ``None``
    sends anything else to the full parser, which names the problem."""
    if type(data) is not bytes:
        return None
    hit = _CANONICAL.fullmatch(data)
    if hit is None:
        return None
    digests, size, client, codec, root, nonce, parent, plen, rnd = hit.groups()
    # the pattern fixed every type, hex form, length and the codec's characters; left to
    # check: the integer ranges, the digest count and the Merkle root
    rnd_i, client_i, plen_i, size_i = int(rnd), int(client), int(plen), int(size)
    if max(rnd_i, client_i, plen_i, size_i) > _MAX_INT or size_i < 1:
        return None
    hexes = tuple(digests[1:-1].decode().split('","'))
    root_s = root.decode()
    if len(hexes) != count_chunks(plen_i, size_i):
        return None
    if len(hexes) == 1:
        if hexes[0] != root_s:
            return None
    elif merkle_root([bytes.fromhex(h) for h in hexes]).hex() != root_s:
        return None
    return cls(rnd_i, client_i, parent.decode(), codec.decode(), plen_i, size_i, hexes, root_s, nonce.decode())


def build_manifest(
    payload: bytes,
    *,
    round: int,
    client: int,
    parent_digest: str,
    codec: str,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    nonce: str | bytes,
) -> tuple[UpdateManifest, list[bytes]]:
    """Chunk ``payload`` and describe it: ``(manifest, chunks)``.

    ``nonce`` is 16 bytes or their 32-char hex (see :func:`new_nonce`).
    """
    chunks = split(payload, chunk_size)
    digests = [chunk_digest(c) for c in chunks]
    if isinstance(nonce, (bytes, bytearray)):
        nonce = bytes(nonce).hex()
    manifest = UpdateManifest(
        round=round,
        client=client,
        parent_digest=parent_digest,
        codec=codec,
        payload_len=len(payload),
        chunk_size=chunk_size,
        chunk_digests=tuple(d.hex() for d in digests),
        merkle_root=merkle_root(digests).hex(),
        nonce=nonce,
    )
    if not _valid_fast(manifest, root_known=True):
        try:
            manifest.validate()
        except ManifestError as exc:
            raise InvalidParameter(f"build_manifest: {exc}") from None
    _BUILT[id(manifest)] = manifest
    return manifest, chunks


def build_manifests(
    payloads: Sequence[bytes],
    *,
    round: int,
    clients: Sequence[int],
    parent_digest: str,
    codec: str,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    nonces: Sequence[str],
) -> tuple[list[tuple[UpdateManifest, list[bytes]]], list[bytes]]:
    """:func:`build_manifest` for many payloads at once (one per client; same round, parent
    and codec): ``([(manifest, chunks), ...], [manifest.to_json(), ...])``, the same
    manifests, chunks and canonical JSON, with what they share checked and written once."""
    if not len(payloads) == len(clients) == len(nonces):
        raise InvalidParameter(f"build_manifests: {len(payloads)} payloads, {len(clients)} clients and "
                               f"{len(nonces)} nonces: must be as many of each")
    _check_chunk_size(chunk_size)
    if not payloads:
        return [], []
    sha = hashlib.sha256
    built: list[tuple[UpdateManifest, list[bytes]]] = []
    texts: list[bytes] = []
    template = None
    # the per-client fields checked for the whole batch at once; a batch that fails is
    # checked client by client below (the first bad one is named, as before)
    batch_ok = _ids_and_nonces_ok(clients, nonces)
    if batch_ok and set(map(type, payloads)) == {bytes} and max(map(len, payloads)) <= chunk_size:
        return _build_one_chunk_each(payloads, round, list(clients), parent_digest, codec, chunk_size, nonces)
    new = _fresh
    manifests: list[UpdateManifest] = []
    for payload, client, nonce in zip(payloads, clients, nonces):
        if not batch_ok and isinstance(nonce, (bytes, bytearray)):
            nonce = bytes(nonce).hex()
        if len(payload) <= chunk_size:  # the common case: one chunk, its own Merkle root
            chunks = [bytes(payload)]
            hexes: tuple[str, ...] = (sha(chunks[0]).hexdigest(),)
            root = hexes[0]
        else:
            chunks = split(payload, chunk_size)
            digests = [sha(c).digest() for c in chunks]
            hexes = tuple(d.hex() for d in digests)
            root = merkle_root(digests).hex()
        manifest = new(round, client, parent_digest, codec, len(payload), chunk_size, hexes, root, nonce)
        if template is None:  # the shared fields, checked in full once
            try:
                manifest.validate()
            except ManifestError as exc:
                raise InvalidParameter(f"build_manifests: {exc}") from None
            template = _json_template(manifest)
        elif not batch_ok and not (type(client) is int and 0 <= client <= _MAX_INT and type(nonce) is str
                                   and len(nonce) == 32 and _HEX.fullmatch(nonce)):
            try:
                manifest.validate()
            except ManifestError as exc:
                raise InvalidParameter(f"build_manifests: {exc}") from None
        manifests.append(manifest)
        built.append((manifest, chunks))
        texts.append((template % ('","'.join(hexes), client, root, nonce, len(payload))).encode("ascii"))
    _RECENT.add(manifests, texts)
    return built, texts


def _build_one_chunk_each(payloads: Sequence[bytes], rnd: int, clients: list[int], parent_digest: str, codec: str,
                          chunk_size: int, nonces: Sequence[str]) -> tuple[list[tuple[UpdateManifest, list[bytes]]],
                                                                        list[bytes]]:
    """:func:`build_manifests` where every payload is ``bytes`` that fits one chunk (its
    digest is the Merkle root) and the ids and nonces passed the batch check: the same
    manifests, chunks and texts, the batch in comprehensions."""
    sha = hashlib.sha256
    hexes = [sha(p).hexdigest() for p in payloads]
    lens = [len(p) for p in payloads]
    first = _fresh(rnd, clients[0], parent_digest, codec, lens[0], chunk_size, (hexes[0],), hexes[0], nonces[0])
    try:  # the shared fields, checked in full once
        first.validate()
    except ManifestError as exc:
        raise InvalidParameter(f"build_manifests: {exc}") from None
    template = _json_template(first)
    manifests = [first] + [_fresh(rnd, c, parent_digest, codec, n, chunk_size, (h,), h, x)
                           for c, n, h, x in zip(clients[1:], lens[1:], hexes[1:], nonces[1:])]
    texts = [(template % (h, c, h, x, n)).encode("ascii") for c, n, h, x in zip(clients, lens, hexes, nonces)]
    _RECENT.add(manifests, texts)
    return [(m, [p]) for m, p in zip(manifests, payloads)], texts


_object_new = object.__new__
(_set_round, _set_client, _set_parent, _set_codec, _set_plen, _set_csize, _set_digests, _set_root,
 _set_nonce) = (getattr(UpdateManifest, name).__set__ for name in _FIELD_NAMES)


def _fresh(rnd: int, client: int, parent: str, codec: str, plen: int, csize: int, digests: tuple[str, ...],
           root: str, nonce: str) -> UpdateManifest:
    """``UpdateManifest(...)`` with the slots written directly (the frozen dataclass's
    ``__init__`` goes through ``object.__setattr__`` once per field): an equal object."""
    m = _object_new(UpdateManifest)
    _set_round(m, rnd)
    _set_client(m, client)
    _set_parent(m, parent)
    _set_codec(m, codec)
    _set_plen(m, plen)
    _set_csize(m, csize)
    _set_digests(m, digests)
    _set_root(m, root)
    _set_nonce(m, nonce)
    return m


def _ids_and_nonces_ok(clients: Sequence[Any], nonces: Sequence[Any]) -> bool:
    """True only if every client id is an ``int`` in [0, 2⁵³] and every nonce 32 lowercase
    hex characters (``str``): what the per-client check of :func:`build_manifests` demands."""
    try:
        if (clients and set(map(type, clients)) != {int}) or (nonces and set(map(type, nonces)) != {str}):
            return False
        if clients and not (0 <= min(clients) and max(clients) <= _MAX_INT):
            return False
        joined = "".join(nonces)
        return len(joined) == 32 * len(nonces) and set(map(len, nonces)) <= {32} \
            and not joined.translate(_DROP_HEX)  # only lowercase hex digits (what _HEX matches)
    except Exception:  # noqa: BLE001 - odd sequences: the per-client check names the problem
        return False


#: manifests made by :func:`build_manifest` (valid by construction, and frozen), by id
_BUILT: "weakref.WeakValueDictionary[int, UpdateManifest]" = weakref.WeakValueDictionary()


class _Recent:
    """What the last :attr:`KEEP` calls of :func:`build_manifests` made, held strongly, one
    pair of plain dicts per call (a weak registry costs more per client than the rest of
    the builder; an old call's pair is dropped whole):

    * by id: id → manifest (valid by construction, and frozen; held, so the id is its own);
    * by text: the canonical JSON the builder wrote → the manifest it is the text of, i.e.
      :meth:`UpdateManifest.from_json`'s answer for those exact bytes.

    Only speed depends on it: a manifest or text no longer here takes the full check."""

    KEEP = 2

    def __init__(self) -> None:
        # newest first; replaced whole (a tuple), so a reader never sees it change
        self.ids: tuple[dict[int, UpdateManifest], ...] = ()
        self.texts: tuple[dict[bytes, UpdateManifest], ...] = ()

    def add(self, manifests: list[UpdateManifest], texts: list[bytes]) -> None:
        self.ids = (dict(zip(map(id, manifests), manifests)), *self.ids[: self.KEEP - 1])
        self.texts = (dict(zip(texts, manifests)), *self.texts[: self.KEEP - 1])

    def by_id(self, m: object) -> bool:
        key = id(m)
        for ids in self.ids:
            if ids.get(key) is m:
                return True
        return False

    def by_text(self, data: bytes) -> UpdateManifest | None:
        for texts in self.texts:
            m = texts.get(data)
            if m is not None:
                return m
        return None


_RECENT = _Recent()


def known_text(data: bytes) -> UpdateManifest | None:
    """The manifest whose canonical JSON :func:`build_manifests` wrote as exactly ``data``
    (what :meth:`UpdateManifest.from_json` returns for it), or ``None``."""
    return _RECENT.by_text(data)


def known_texts(texts: Sequence[bytes]) -> list[UpdateManifest | None]:
    """:func:`known_text` of each of ``texts`` (the newest builder call looked up first, at once)."""
    newest = _RECENT.texts[0] if _RECENT.texts else {}
    out = [newest.get(t) for t in texts]
    if None in out:
        out = [m if m is not None else known_text(t) for m, t in zip(out, texts)]
    return out


def known_valid(m: object) -> bool:
    """True if ``m`` is a manifest a builder made (so :meth:`UpdateManifest.validate` passes)."""
    return _RECENT.by_id(m) or _BUILT.get(id(m)) is m


def known_valid_many(ms: Sequence[object]) -> list[bool]:
    """:func:`known_valid` of each of ``ms`` (the newest builder call looked up first, at once)."""
    newest = _RECENT.ids[0] if _RECENT.ids else {}
    out = [newest.get(id(m)) is m for m in ms]
    if not all(out):
        out = [ok or known_valid(m) for ok, m in zip(out, ms)]
    return out


def _json_template(m: UpdateManifest) -> str:
    """The canonical JSON of a valid manifest with its per-client fields left as %-slots
    (digests, client, root, nonce, payload length), for manifests sharing the rest."""
    codec = _json_str(m.codec).replace("%", "%%")
    return ('{"chunk_digests":["%s"],"chunk_size":' + int.__repr__(m.chunk_size) + ',"client":%d,"codec":'
            + codec + ',"merkle_root":"%s","nonce":"%s","parent_digest":"' + m.parent_digest
            + '","payload_len":%d,"round":' + int.__repr__(m.round) + "}")


def expected_chunk_len(manifest: UpdateManifest, index: int) -> int:
    """Length in bytes chunk ``index`` must have under ``manifest``."""
    if index < manifest.n_chunks - 1:
        return manifest.chunk_size
    return manifest.payload_len - (manifest.n_chunks - 1) * manifest.chunk_size


def check_chunk(manifest: UpdateManifest, index: int, data: bytes) -> str | None:
    """``None`` if ``data`` is chunk ``index`` of ``manifest``, else the problem."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return f"chunk {index} is {type(data).__name__}, not bytes"
    want = expected_chunk_len(manifest, index)
    if len(data) != want:
        return f"chunk {index} has {len(data)} bytes, expected {want}"
    if hashlib.sha256(data).hexdigest() != manifest.chunk_digests[index]:
        return f"chunk {index} digest mismatch"
    return None


def reassemble(manifest: UpdateManifest, chunks: Mapping[int, bytes]) -> bytes:
    """Join the chunks of ``manifest`` after verifying each one and the total length.

    Entries of ``chunks`` with indices outside the manifest are ignored. Raises
    :class:`TransportError` naming the first bad or missing chunk and the client.
    """
    who = f"client {manifest.client}"
    parts = []
    for i in range(manifest.n_chunks):
        if i not in chunks:
            raise TransportError(f"chunk {i} of {who} missing")
        problem = check_chunk(manifest, i, chunks[i])
        if problem is not None:
            raise TransportError(f"{problem.replace(f'chunk {i}', f'chunk {i} of {who}:', 1)}")
        parts.append(bytes(chunks[i]))
    payload = b"".join(parts)
    if len(payload) != manifest.payload_len:
        raise TransportError(f"{who}: reassembled {len(payload)} bytes, manifest says {manifest.payload_len}")
    return payload
