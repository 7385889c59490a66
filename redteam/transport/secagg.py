"""Secure aggregation with double masking: the server learns the sum of the surviving
clients' rows and nothing about any one of them.

The semi-honest protocol of Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel,
Ramage, Segal & Seth, "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", ACM CCS 2017, in its honest-but-curious version (no signatures and no
consistency-check round: those belong to the actively secure variant), run as one
in-process simulation with real cryptography from ``cryptography``:

0. **AdvertiseKeys.** Client u holds two X25519 key pairs (RFC 7748): (c_u^SK, c_u^PK)
   for the share channel and (s_u^SK, s_u^PK) for mask agreement, and sends both public
   keys.
1. **ShareKeys.** u draws a self-mask seed b_u, splits b_u and s_u^SK into t-of-n Shamir
   shares over F_p, p = 2^521 − 1 (:mod:`.shamir`), and sends party v the pair
   (share of s_u^SK, share of b_u) sealed with AES-128-GCM under
   HKDF-SHA256(X25519(c_u^SK, c_v^PK)) (one key per direction, so the fixed nonce is
   never reused); the server only routes ciphertexts. (The simulation computes each
   pair's X25519 secret once, which both ends would compute alike.)
2. **MaskedInputCollection.** With pairwise seeds s_{u,v} = HKDF-SHA256(X25519(s_u^SK,
   s_v^PK)) bound to (round, context, {u, v}) and PRG = AES-128-CTR keyed by the seed,
   u sends y_u = x_u + PRG(b_u) + Σ_{v>u} PRG(s_{u,v}) − Σ_{v<u} PRG(s_{u,v}) (mod R),
   the sums over every client that sent shares, ordered by client id.
3. **Unmasking.** Each survivor opens the ciphertexts addressed to it and reveals, per
   client, exactly one of its two shares: of b_u when u survived, of s_u^SK when u
   dropped. The server reconstructs each secret from t shares, removes the dropped
   clients' pairwise masks (recomputed from s_u^SK and the survivors' public keys) and
   the survivors' self masks, and decodes the sum.

Dropouts simulated: ``dropouts`` leave after ShareKeys and before sending y_u (the
case the double mask exists for). A client that drops after sending y_u is a survivor
here: its masked row is in the sum and its b_u is rebuilt from the others' shares.
Fewer than t survivors aborts the round (:class:`SecAggAborted`).

Threshold: Bonawitz et al.'s honest-but-curious guarantee holds against the server
together with fewer than t colluding clients, and the round completes while at least t
clients survive. The default t = ⌊n/2⌋ + 1 (a majority) keeps privacy against the
server with up to ⌊n/2⌋ colluding clients and completes with up to ⌈n/2⌉ − 1
dropouts; the paper's actively secure variant needs a larger t (not built here).

Encoding: rows are clipped to [−clip, clip] (the number of clipped entries is
returned, not hidden), scaled by 2^frac_bits, rounded half to even and mapped to
Z_R, R = 2^modulus_bits (32 or 64, numpy uint32 / uint64 wrap-around arithmetic). The
decoded sum is exact while n·Q < R/2, Q = rint(clip·2^frac_bits) (= clip·2^frac_bits
for the defaults), which :func:`check_capacity` enforces; each client's rounding
error is at most 2^−frac_bits / 2 per coordinate, so |total − Σ clip(x)| ≤
n·2^−(frac_bits+1) before the cast to the rows' dtype.

Determinism: every key, seed and Shamir coefficient is derived with HKDF-SHA256 from
``seed`` and (round, context, client), so a run is reproducible byte for byte. A real
deployment draws fresh keys and seeds from the OS every round; a seed here is a
simulation convenience, and whoever knows it knows every client's row.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from redteam.errors import InvalidParameter, RedteamError

from . import shamir
from .fixedpoint import (
    DEFAULT_CLIP,
    DEFAULT_FRAC_BITS,
    MODULUS_BITS,
    check_capacity,
    decode,
    encode,
    ring_dtype,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "MODULUS_BITS",
    "DEFAULT_CLIP",
    "DEFAULT_FRAC_BITS",
    "SecAggAborted",
    "SecAggResult",
    "prg",
    "encode",
    "decode",
    "check_capacity",
    "ClientKeys",
    "derive_client_keys",
    "pair_seed",
    "default_threshold",
    "secure_sum",
    "BucketedSecAgg",
    "bucketed_secure_sum",
]

_SALT = b"redteam/secagg/v1"
_KEY_BYTES = 32  # X25519 private / public key length
_SEED_BYTES = 16  # AES-128 key: the PRG seed length (b_u and s_{u,v})
_SHARE_BYTES = (shamir.FIELD_PRIME.bit_length() + 7) // 8  # 66
_ID = struct.Struct("<qq")  # (sender, recipient) inside each sealed share pair
_NONCE = bytes(12)  # one message per directional key


class SecAggAborted(RedteamError):
    """Too few clients survived for the server to unmask the sum; the round has no result."""


@dataclass(frozen=True, slots=True)
class SecAggResult:
    """What one secure-aggregation round produced.

    ``total`` is the decoded sum of the survivors' (clipped) rows, in the rows' dtype;
    ``masked`` (float64) is what a curious server reads of each survivor, y_u decoded
    as if it were a fixed-point value: noise (exact for R = 2^32; for R = 2^64 float64
    keeps the top 53 bits). ``bytes_up`` is what clients sent the
    server, summed over phases (``phase_bytes``). ``shares_reconstructed`` counts the
    secrets the server rebuilt (one b_u per survivor, one s_u^SK per dropout).
    """

    total: "torch.Tensor"
    survivors: tuple[int, ...]
    masked: "torch.Tensor"
    clipped: int
    bytes_up: int
    shares_reconstructed: int
    dropped: tuple[int, ...]
    threshold: int
    phase_bytes: tuple[tuple[str, int], ...]


# --------------------------------------------------------------------------- primitives
def _seed_material(seed: bytes | int) -> bytes:
    if isinstance(seed, (bytes, bytearray)) and len(seed) > 0:
        return b"b" + bytes(seed)
    if type(seed) is int and seed >= 0:
        return b"i" + seed.to_bytes(max(1, (seed.bit_length() + 7) // 8), "big")
    raise InvalidParameter(f"secure_sum: seed = {seed!r:.40}: must be non-empty bytes or an integer ≥ 0")


def _info(*parts: object) -> bytes:
    return b"|".join(p.hex().encode() if isinstance(p, bytes) else str(p).encode() for p in parts)


def _hkdf(ikm: bytes, info: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=_SALT, info=info).derive(ikm)


class _KeyStream:
    """AES-128-CTR keystream as a byte stream (the Shamir coefficients' source)."""

    __slots__ = ("_enc",)

    def __init__(self, key: bytes) -> None:
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def read(self, n: int) -> bytes:
        return self._enc.update(bytes(n))


def prg(seed: bytes, d: int, modulus_bits: int = 32) -> np.ndarray:
    """d uniform elements of Z_R, R = 2^modulus_bits: the AES-128-CTR keystream of ``seed``
    (16 bytes, IV 0) read as little-endian unsigned integers. One call, no per-coordinate loop."""
    dt = ring_dtype(modulus_bits)
    if len(seed) != _SEED_BYTES:
        raise InvalidParameter(f"prg: seed has {len(seed)} bytes, expected {_SEED_BYTES}")
    stream = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(bytes(d * modulus_bits // 8))
    return np.frombuffer(stream, dtype=np.dtype(dt).newbyteorder("<")).astype(dt, copy=False)


@dataclass(frozen=True, slots=True)
class ClientKeys:
    """One client's key material for one round (derived, see :func:`derive_client_keys`)."""

    c_sk: X25519PrivateKey
    c_pk: bytes
    s_sk: X25519PrivateKey
    s_pk: bytes
    b: bytes


def _raw_public(sk: X25519PrivateKey) -> bytes:
    return sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private_int(sk: X25519PrivateKey) -> int:
    raw = sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    return int.from_bytes(raw, "big")


def derive_client_keys(seed: bytes | int, round: int, client: int, context: bytes = b"") -> ClientKeys:
    """Client ``client``'s two X25519 key pairs and self-mask seed b_u, by HKDF from ``seed``.

    Each is HKDF-SHA256 (RFC 5869) with salt ``b"redteam/secagg/v1"``, input key material
    ``b"b" + seed`` (bytes) or ``b"i" + seed`` as minimal big-endian bytes (int), and info
    ``"<kind>|<round>|<context hex>|<client>"``, kind ``c`` / ``s`` (32 bytes, an X25519
    private key) or ``b`` (16 bytes, an AES-128 PRG key).
    """
    ikm = _seed_material(seed)
    c_sk = X25519PrivateKey.from_private_bytes(_hkdf(ikm, _info("c", round, context, client), _KEY_BYTES))
    s_sk = X25519PrivateKey.from_private_bytes(_hkdf(ikm, _info("s", round, context, client), _KEY_BYTES))
    b = _hkdf(ikm, _info("b", round, context, client), _SEED_BYTES)
    return ClientKeys(c_sk, _raw_public(c_sk), s_sk, _raw_public(s_sk), b)


def pair_seed(sk: X25519PrivateKey, peer_pk: bytes, round: int, u: int, v: int, context: bytes = b"") -> bytes:
    """s_{u,v} = HKDF-SHA256(X25519(s_u^SK, s_v^PK)), 16 bytes, salt as in :func:`derive_client_keys`,
    info ``"pair|<round>|<context hex>|<min(u, v)>|<max(u, v)>"``: symmetric in u, v."""
    shared = sk.exchange(X25519PublicKey.from_public_bytes(peer_pk))
    return _hkdf(shared, _info("pair", round, context, min(u, v), max(u, v)), _SEED_BYTES)


def _channel(shared: bytes, round: int, sender: int, recipient: int, context: bytes) -> tuple[AESGCM, bytes]:
    """The AES-128-GCM key for sender → recipient from their X25519(c, c) secret, and the
    associated data binding it (round, context, sender, recipient)."""
    aad = _info("enc", round, context, sender, recipient)
    return AESGCM(_hkdf(shared, aad, 16)), aad


def default_threshold(n: int) -> int:
    """⌊n/2⌋ + 1: a majority must survive; the server with up to ⌊n/2⌋ colluding clients learns nothing."""
    return n // 2 + 1


# --------------------------------------------------------------------------- the protocol
def _as_ids(values: Sequence[int], name: str) -> list[int]:
    """Python ints from ints / numpy or torch integer scalars (``operator.index``); no bools."""
    try:
        out = [operator.index(v) for v in values if not isinstance(v, bool)]
    except TypeError:
        out = []
    if len(out) != len(values) or any(not 0 <= v < 2**63 for v in out):
        raise InvalidParameter(f"secure_sum: {name} = {list(values)[:8]}: must be integers in [0, 2^63)")
    return out


def _check_ids(client_ids: Sequence[int], m: int, dropouts: Sequence[int]) -> tuple[list[int], set[int]]:
    ids = _as_ids(list(client_ids), "client_ids")
    if len(ids) != m:
        raise InvalidParameter(f"secure_sum: {len(ids)} client_ids for {m} rows: expected one id per row")
    if len(set(ids)) != m:
        raise InvalidParameter(f"secure_sum: client_ids = {ids[:8]}: must be distinct")
    drops = _as_ids(list(dropouts), "dropouts")
    dropped = set(drops)
    if len(dropped) != len(drops) or not dropped <= set(ids):
        raise InvalidParameter(f"secure_sum: dropouts = {drops[:8]}: must be distinct ids among client_ids")
    return ids, dropped


def secure_sum(
    rows: "torch.Tensor",
    client_ids: Sequence[int],
    *,
    round: int,
    seed: bytes | int,
    dropouts: Sequence[int] = (),
    threshold: int | None = None,
    clip: float = DEFAULT_CLIP,
    frac_bits: int = DEFAULT_FRAC_BITS,
    modulus_bits: int = 32,
    context: bytes = b"",
) -> SecAggResult:
    """Run one round of the protocol over ``rows`` (m, d); ``dropouts`` leave before step 2.

    ``context`` is extra binding for every derived key (e.g. a bucket label), so two
    runs in one round never share masks. Raises :class:`SecAggAborted` when fewer than
    ``threshold`` clients survive and :class:`~redteam.errors.InvalidParameter` on bad input.
    """
    import torch

    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or not rows.is_floating_point():
        raise InvalidParameter(f"secure_sum: rows must be a 2-D float tensor (m, d); got "
                               f"{type(rows).__name__} {tuple(getattr(rows, 'shape', ()))}")
    m, d = rows.shape
    if m < 1 or d < 1:
        raise InvalidParameter(f"secure_sum: rows has shape {(m, d)}: need at least one row and one column")
    if type(round) is not int or round < 0:
        raise InvalidParameter(f"secure_sum: round = {round!r}: must be an integer ≥ 0")
    ids, dropped = _check_ids(client_ids, m, dropouts)
    t = default_threshold(m) if threshold is None else threshold
    if type(t) is not int or not 1 <= t <= m:
        raise InvalidParameter(f"secure_sum: threshold = {threshold!r}: must be an integer in [1, {m}] (m = {m})")
    check_capacity(m, clip, frac_bits, modulus_bits)
    x64 = rows.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(x64).all():
        raise InvalidParameter(f"secure_sum: rows has {int((~np.isfinite(x64)).sum())} non-finite entries")
    x, clipped = encode(x64, clip, frac_bits, modulus_bits)
    dt = ring_dtype(modulus_bits)
    word = modulus_bits // 8
    context = bytes(context)

    # 0. AdvertiseKeys
    keys = {u: derive_client_keys(seed, round, u, context) for u in ids}
    bytes_advertise = m * 2 * _KEY_BYTES

    # 1. ShareKeys: Shamir shares of s_u^SK and b_u, sealed per recipient (index i ↔ x = i + 1)
    ikm = _seed_material(seed)
    sealed: dict[tuple[int, int], bytes] = {}
    # X25519(c_u^SK, c_v^PK) = X25519(c_v^SK, c_u^PK): computed once per pair, used by both ends
    c_shared: dict[tuple[int, int], bytes] = {}
    own: dict[int, tuple[int, int]] = {}
    for i, u in enumerate(ids):
        stream = _KeyStream(_hkdf(ikm, _info("shamir", round, context, u), 16))
        s_shares = shamir.split(_private_int(keys[u].s_sk), m, t, stream)
        b_shares = shamir.split(int.from_bytes(keys[u].b, "big"), m, t, stream)
        own[u] = (s_shares[i], b_shares[i])
        for j, v in enumerate(ids):
            if v != u:
                pair = (min(u, v), max(u, v))
                if pair not in c_shared:
                    c_shared[pair] = keys[u].c_sk.exchange(X25519PublicKey.from_public_bytes(keys[v].c_pk))
                aead, aad = _channel(c_shared[pair], round, u, v, context)
                plain = (_ID.pack(u, v) + s_shares[j].to_bytes(_SHARE_BYTES, "big")
                         + b_shares[j].to_bytes(_SHARE_BYTES, "big"))
                sealed[(u, v)] = aead.encrypt(_NONCE, plain, aad)
    bytes_share = sum(len(c) for c in sealed.values())

    # 2. MaskedInputCollection: survivors send y_u (pairs among the share-round cohort);
    #    the server aborts on fewer than t of them (checked first: the outcome is the same)
    survivors = [u for u in ids if u not in dropped]
    if len(survivors) < t:
        raise SecAggAborted(
            f"secure_sum: round {round}: {len(survivors)} of {m} clients survived "
            f"({len(dropped)} dropped) but threshold t = {t} shares are needed to unmask; round aborted")
    pos = {u: i for i, u in enumerate(ids)}
    y = {u: x[pos[u]] + prg(keys[u].b, d, modulus_bits) for u in survivors}
    order = sorted(ids)
    for a_i, a in enumerate(order):
        for b in order[a_i + 1:]:
            if a in dropped and b in dropped:
                continue
            mask = pair_seed(keys[a].s_sk, keys[b].s_pk, round, a, b, context)
            p = prg(mask, d, modulus_bits)
            if a not in dropped:
                y[a] += p  # a < b: a adds
            if b not in dropped:
                y[b] -= p  # b > a: b subtracts
    bytes_masked = len(survivors) * d * word
    masked = np.stack([y[u] for u in survivors])  # non-empty: len(survivors) ≥ t ≥ 1
    z = masked.sum(axis=0, dtype=dt)

    # 3. Unmasking: each survivor opens its ciphertexts, reveals one share per client
    revealed: dict[int, list[tuple[int, int]]] = {u: [] for u in ids}
    for v in survivors:
        for u in ids:
            if u == v:
                s_share, b_share = own[u]
            else:
                aead, aad = _channel(c_shared[(min(u, v), max(u, v))], round, u, v, context)
                plain = aead.decrypt(_NONCE, sealed[(u, v)], aad)
                if _ID.unpack(plain[:_ID.size]) != (u, v):
                    raise RuntimeError(f"secure_sum: share pair from {u} to {v} names other parties")
                body = plain[_ID.size:]
                s_share = int.from_bytes(body[:_SHARE_BYTES], "big")
                b_share = int.from_bytes(body[_SHARE_BYTES:], "big")
            revealed[u].append((pos[v] + 1, s_share if u in dropped else b_share))
    bytes_unmask = len(survivors) * m * (8 + _SHARE_BYTES)
    for u in ids:
        secret = shamir.reconstruct(revealed[u], t)
        if u in dropped:
            sk = X25519PrivateKey.from_private_bytes(secret.to_bytes(_KEY_BYTES, "big"))
            if _raw_public(sk) != keys[u].s_pk:
                raise RuntimeError(f"secure_sum: rebuilt s^SK of client {u} does not match its public key")
            for v in survivors:
                p = prg(pair_seed(sk, keys[v].s_pk, round, u, v, context), d, modulus_bits)
                if v < u:
                    z -= p  # v added PRG(s_{v,u})
                else:
                    z += p  # v subtracted it
        else:
            z -= prg(secret.to_bytes(_SEED_BYTES, "big"), d, modulus_bits)

    phases = (("advertise_keys", bytes_advertise), ("share_keys", bytes_share),
              ("masked_input", bytes_masked), ("unmasking", bytes_unmask))
    return SecAggResult(
        total=torch.from_numpy(decode(z, frac_bits, modulus_bits)).to(rows.device, rows.dtype),
        survivors=tuple(survivors),
        masked=torch.from_numpy(decode(masked, frac_bits, modulus_bits)).to(rows.device),
        clipped=clipped,
        bytes_up=sum(b for _, b in phases),
        shares_reconstructed=m,
        dropped=tuple(u for u in ids if u in dropped),
        threshold=t,
        phase_bytes=phases,
    )


# --------------------------------------------------------------------------- buckets
@dataclass(frozen=True, slots=True)
class BucketedSecAgg:
    """Per-bucket secure sums: what a server running a robust rule over bucket means sees.

    ``sums[b]`` is the sum of bucket b's survivors (zeros for an aborted bucket),
    ``members[b]`` the ids assigned to it, ``results[b]`` its :class:`SecAggResult`
    (``None`` when it aborted and ``skip_aborted`` was set), ``aborted`` those buckets.
    """

    sums: "torch.Tensor"
    members: tuple[tuple[int, ...], ...]
    results: tuple[SecAggResult | None, ...]
    aborted: tuple[int, ...]

    @property
    def counts(self) -> tuple[int, ...]:
        """Survivors per bucket (0 for an aborted bucket): the divisor of each bucket mean."""
        return tuple(0 if r is None else len(r.survivors) for r in self.results)


def _permutation(m: int, rng: "torch.Generator | np.random.Generator") -> list[int]:
    import torch

    if isinstance(rng, np.random.Generator):
        return [int(i) for i in rng.permutation(m)]
    if isinstance(rng, torch.Generator):
        return torch.randperm(m, generator=rng).tolist()
    raise InvalidParameter(f"bucketed_secure_sum: rng is a {type(rng).__name__}: expected a "
                           f"torch.Generator or numpy.random.Generator")


def bucketed_secure_sum(
    rows: "torch.Tensor",
    client_ids: Sequence[int],
    buckets: int,
    rng: "torch.Generator | np.random.Generator",
    *,
    round: int,
    seed: bytes | int,
    dropouts: Sequence[int] = (),
    threshold: int | None = None,
    clip: float = DEFAULT_CLIP,
    frac_bits: int = DEFAULT_FRAC_BITS,
    modulus_bits: int = 32,
    skip_aborted: bool = False,
) -> BucketedSecAgg:
    """Partition the clients uniformly at random into ``buckets`` groups (sizes differ by at
    most one) and run :func:`secure_sum` in each, keys bound to the bucket.

    The server then sees one sum per bucket, and a robust rule can run over the bucket
    means: SHARE (Velicheti, Xia & Koyejo, "Secure Byzantine-Robust Distributed Learning
    via Clustering", arXiv:2110.02940, 2021) securely averages random clusters before
    robust aggregation; the random bucketing itself is Karimireddy, He & Jaggi,
    "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing", ICLR 2022.
    ``threshold`` (default ⌊s/2⌋ + 1 per bucket of s clients) applies to each bucket; a
    bucket with too few survivors raises :class:`SecAggAborted` unless ``skip_aborted``.
    Every bucket must hold at least two clients: a bucket of one publishes its row.
    """
    import torch

    m = len(client_ids)
    if type(buckets) is not int or not 1 <= buckets <= m // 2:
        raise InvalidParameter(f"bucketed_secure_sum: buckets = {buckets!r}: must be an integer in "
                               f"[1, {m // 2}] so that every bucket of the {m} clients holds at least two")
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] != m:
        raise InvalidParameter(f"bucketed_secure_sum: rows must be a 2-D tensor with one row per client "
                               f"({m}); got {tuple(getattr(rows, 'shape', ()))}")
    ids = _as_ids(list(client_ids), "client_ids")
    dropped = set(_as_ids(list(dropouts), "dropouts"))
    if not dropped <= set(ids):
        raise InvalidParameter(f"bucketed_secure_sum: dropouts {sorted(dropped - set(ids))[:8]} are not client_ids")
    perm = _permutation(m, rng)
    groups = [sorted(perm[b::buckets]) for b in range(buckets)]  # positions, sizes ⌊m/B⌋ or ⌈m/B⌉
    sums = torch.zeros(buckets, rows.shape[1], dtype=rows.dtype, device=rows.device)
    results: list[SecAggResult | None] = []
    aborted: list[int] = []
    for b, group in enumerate(groups):
        members = [ids[i] for i in group]
        try:
            res = secure_sum(rows[group], members, round=round, seed=seed,
                             dropouts=[u for u in members if u in dropped], threshold=threshold,
                             clip=clip, frac_bits=frac_bits, modulus_bits=modulus_bits,
                             context=_info("bucket", b, buckets))
        except SecAggAborted as exc:
            if not skip_aborted:
                raise SecAggAborted(f"bucket {b} of {buckets}: {exc}") from None
            results.append(None)
            aborted.append(b)
            continue
        sums[b] = res.total
        results.append(res)
    return BucketedSecAgg(sums=sums, members=tuple(tuple(ids[i] for i in g) for g in groups),
                          results=tuple(results), aborted=tuple(aborted))
