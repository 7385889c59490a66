"""Secure aggregation (Bonawitz et al., CCS 2017): sums, dropouts, aborts, what the server
sees, the masks' arithmetic by hand, the ring's capacity and wrap-around, Shamir sharing,
and bucketed sums."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from redteam.errors import InvalidParameter
from redteam.transport import shamir
from redteam.transport.fixedpoint import check_capacity, decode, encode
from redteam.transport.secagg import (
    SecAggAborted,
    bucketed_secure_sum,
    derive_client_keys,
    pair_seed,
    prg,
    secure_sum,
)


def _rows(m: int, d: int, scale: float = 0.05, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(m, d, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def _fixed_point_sum(rows: torch.Tensor, keep: list[int], clip: float, frac_bits: int) -> torch.Tensor:
    """The exact sum of the survivors' fixed-point encodings (Python-free of the ring)."""
    q = np.rint(np.ldexp(np.clip(rows.double().numpy(), -clip, clip), frac_bits)).astype(np.int64)
    return torch.from_numpy(np.ldexp(q[keep].sum(axis=0).astype(np.float64), -frac_bits))


# --------------------------------------------------------------------------- sums
@pytest.mark.parametrize("modulus_bits", [32, 64])
def test_sum_is_the_float_sum_within_the_quantisation_bound(modulus_bits):
    m, d, frac_bits, clip = 9, 400, 10, 0.5
    rows = _rows(m, d, scale=0.3)
    rows[0, :3] = torch.tensor([0.7, -2.0, 0.5000001])  # three beyond ±clip
    rows[1, 0] = 0.5  # exactly on the bound: not clipped
    res = secure_sum(rows, list(range(m)), round=1, seed=11, clip=clip, frac_bits=frac_bits,
                     modulus_bits=modulus_bits)
    exact = rows.clamp(-clip, clip).sum(0)
    bound = m * 2.0 ** -(frac_bits + 1)  # each client's rounding error ≤ 2^−frac_bits / 2
    err = (res.total - exact).abs().max().item()
    assert err <= bound
    assert err > bound / 20  # the bound is the right scale, not vacuous at this precision
    assert res.clipped == int((rows.abs() > clip).sum())
    assert res.survivors == tuple(range(m)) and res.dropped == ()
    assert res.total.dtype == torch.float64 and res.shares_reconstructed == m


def test_float32_rows_total_in_float32():
    rows = _rows(6, 50, dtype=torch.float32)
    res = secure_sum(rows, [3, 1, 4, 15, 9, 26], round=0, seed=b"s")
    assert res.total.dtype == torch.float32
    bound = 6 * 2.0 ** -17 + 1e-6  # quantisation plus float32 rounding of |total| < 1
    assert (res.total.double() - rows.double().sum(0)).abs().max().item() <= bound


@pytest.mark.parametrize("modulus_bits", [32, 64])
@pytest.mark.parametrize("drop", [(0,), (5,), (2, 4), (0, 1, 6)])
def test_dropouts_are_recovered_exactly(modulus_bits, drop):
    """Clients 0 and 6 are the smallest and largest ids (only adds / only subtracts)."""
    m, d = 7, 300
    ids = [10 * i for i in range(m)]
    rows = _rows(m, d, seed=3)
    res = secure_sum(rows, ids, round=4, seed=5, dropouts=[ids[i] for i in drop], modulus_bits=modulus_bits)
    keep = [i for i in range(m) if i not in drop]
    assert torch.equal(res.total, _fixed_point_sum(rows, keep, 1.0, 16))
    assert res.survivors == tuple(ids[i] for i in keep)
    assert res.dropped == tuple(ids[i] for i in drop)
    assert res.masked.shape == (len(keep), d)
    assert res.shares_reconstructed == m  # b_u of each survivor, s_u^SK of each dropout


def test_fewer_than_t_survivors_aborts_with_the_counts():
    rows, ids = _rows(6, 20), list(range(6))
    ok = secure_sum(rows, ids, round=0, seed=1, dropouts=[0, 5])  # 4 survivors = t = ⌊6/2⌋ + 1
    assert ok.threshold == 4 and len(ok.survivors) == 4
    assert torch.equal(ok.total, _fixed_point_sum(rows, [1, 2, 3, 4], 1.0, 16))
    with pytest.raises(SecAggAborted, match=r"3 of 6 clients survived \(3 dropped\).*t = 4"):
        secure_sum(rows, ids, round=0, seed=1, dropouts=[0, 2, 5])
    with pytest.raises(SecAggAborted, match=r"5 of 6 .*t = 6"):
        secure_sum(rows, ids, round=0, seed=1, dropouts=[3], threshold=6)
    assert len(secure_sum(rows, ids, round=0, seed=1, dropouts=[0, 1, 2, 3], threshold=2).survivors) == 2


# --------------------------------------------------------------------------- what the server sees
def test_a_masked_row_looks_uniform_and_uncorrelated_with_its_input():
    """Client 0's y_0 against its input x_0 (a ramp over [−0.9, 0.9], d = 2^16).

    Ring elements are recovered exactly from the float64 view (|y|·2^16 < 2^31). Chi-squared
    over 256 bins (expected 256 each, 255 degrees of freedom, mean 255, sd 22.6): the
    statistic must stay below 400 (survival probability ≈ 3e−9), for the top byte and for
    the bottom byte. Pearson correlation with the input: |r| < 5/√d ≈ 0.0195.
    """
    d = 2**16
    rows = _rows(3, d, seed=9)
    rows[0] = torch.linspace(-0.9, 0.9, d, dtype=torch.float64)
    res = secure_sum(rows, [0, 1, 2], round=2, seed=2024)
    y = (np.rint(res.masked[0].numpy() * 2.0**16).astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)
    for byte in (y >> 24, y & 0xFF):
        counts = np.bincount(byte.astype(np.int64), minlength=256)
        chi2 = float(((counts - d / 256) ** 2 / (d / 256)).sum())
        assert chi2 < 400, chi2
    r = np.corrcoef(rows[0].numpy(), res.masked[0].numpy())[0, 1]
    assert abs(r) < 5 / math.sqrt(d)
    assert res.masked.abs().max().item() > 1000  # the server reads noise, not deltas in ±1


def test_pairwise_masks_cancel_worked_by_hand():
    """Three clients, d = 4, frac_bits = 2 so inputs are exact in the ring; every mask is
    recomputed here from the AES-128-CTR keystream read as little-endian 4-byte words."""
    ids, d, f = [0, 1, 2], 4, 2
    x = torch.tensor([[0.5, -0.25, 1.0, 0.0], [-1.0, 0.75, 0.25, 0.5], [0.0, 0.0, -0.5, 0.25]], dtype=torch.float64)
    seed, rnd = b"worked example", 7
    keys = {u: derive_client_keys(seed, rnd, u) for u in ids}

    def words(key: bytes) -> list[int]:
        ks = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(4 * d))
        return [int.from_bytes(ks[4 * i:4 * i + 4], "little") for i in range(d)]

    s = {}
    for u, v in [(0, 1), (0, 2), (1, 2)]:
        s[u, v] = pair_seed(keys[u].s_sk, keys[v].s_pk, rnd, u, v)
        assert s[u, v] == pair_seed(keys[v].s_sk, keys[u].s_pk, rnd, v, u)  # both ends agree
    pm = {k: words(v) for k, v in s.items()}
    bm = {u: words(keys[u].b) for u in ids}
    xq = [[int(round(val * 4)) for val in row] for row in x.tolist()]
    sign = {0: {(0, 1): 1, (0, 2): 1}, 1: {(0, 1): -1, (1, 2): 1}, 2: {(0, 2): -1, (1, 2): -1}}
    expect = [[(xq[u][i] + bm[u][i] + sum(sg * pm[p][i] for p, sg in sign[u].items())) % 2**32
               for i in range(d)] for u in ids]
    res = secure_sum(x, ids, round=rnd, seed=seed, frac_bits=f)
    got = (np.rint(res.masked.numpy() * 4).astype(np.int64) & 0xFFFFFFFF).tolist()
    assert got == expect
    # the pairwise masks cancel: Σ y − Σ PRG(b_u) = Σ x (mod 2^32)
    unmasked = [(sum(expect[u][i] for u in ids) - sum(bm[u][i] for u in ids)) % 2**32 for i in range(d)]
    assert unmasked == [sum(xq[u][i] for u in ids) % 2**32 for i in range(d)]
    assert res.total.tolist() == x.sum(0).tolist() == [-0.5, 0.5, 0.75, 0.75]
    assert np.array_equal(prg(keys[1].b, d), np.array(bm[1], dtype=np.uint32))


def test_key_derivation_follows_the_documented_formula():
    """derive_client_keys / pair_seed recomputed here from RFC 5869 HKDF with the documented
    salt, input key material and info strings (a run is reproducible across versions)."""
    def hkdf(ikm: bytes, info: str, n: int) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=n, salt=b"redteam/secagg/v1", info=info.encode()).derive(ikm)

    def raw_public(sk: bytes) -> bytes:
        return X25519PrivateKey.from_private_bytes(sk).public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    for seed, ikm in ((b"\x01", b"b\x01"), (1, b"i\x01"), (0, b"i\x00"), (255, b"i\xff"),
                      (2**16, b"i\x01\x00\x00")):
        k = derive_client_keys(seed, 5, 42, b"\xab")
        assert k.c_pk == raw_public(hkdf(ikm, "c|5|ab|42", 32))
        assert k.s_pk == raw_public(hkdf(ikm, "s|5|ab|42", 32))
        assert k.b == hkdf(ikm, "b|5|ab|42", 16)
    a, b = derive_client_keys(9, 3, 7), derive_client_keys(9, 3, 2)
    shared = a.s_sk.exchange(X25519PrivateKey.from_private_bytes(hkdf(b"i\x09", "s|3||2", 32)).public_key())
    assert pair_seed(a.s_sk, b.s_pk, 3, 7, 2) == hkdf(shared, "pair|3||2|7", 16)
    assert pair_seed(a.s_sk, b.s_pk, 3, 7, 2, b"\x00") == hkdf(shared, "pair|3|00|2|7", 16)


def test_sealed_share_pairs_do_not_open_elsewhere():
    """The share channel's key and associated data bind (round, context, sender, recipient):
    a ciphertext the server redirects, replays in another round or bucket, or turns round
    does not open (AES-GCM tag failure)."""
    from cryptography.exceptions import InvalidTag
    from redteam.transport.secagg import _channel

    shared = bytes(range(32))
    aead, aad = _channel(shared, 3, 1, 2, b"")
    sealed = aead.encrypt(bytes(12), b"share pair", aad)
    again, aad2 = _channel(shared, 3, 1, 2, b"")
    assert again.decrypt(bytes(12), sealed, aad2) == b"share pair"
    for other in ((4, 1, 2, b""), (3, 1, 5, b""), (3, 5, 2, b""), (3, 2, 1, b""), (3, 1, 2, b"bucket")):
        key, ad = _channel(shared, *other)
        with pytest.raises(InvalidTag):
            key.decrypt(bytes(12), sealed, ad)
        with pytest.raises(InvalidTag):  # the key alone, with the original associated data
            key.decrypt(bytes(12), sealed, aad)


def test_runs_are_reproducible_and_bound_to_round_and_context():
    rows, ids = _rows(4, 30), [1, 2, 3, 4]
    a = secure_sum(rows, ids, round=0, seed=7)
    assert torch.equal(a.masked, secure_sum(rows, ids, round=0, seed=7).masked)
    for other in (dict(round=1, seed=7), dict(round=0, seed=8), dict(round=0, seed=7, context=b"x")):
        b = secure_sum(rows, ids, **other)
        assert not torch.equal(a.masked, b.masked) and torch.equal(a.total, b.total)


# --------------------------------------------------------------------------- the ring
def test_overflow_check_raises_exactly_at_the_limit():
    # m·clip·2^frac_bits = 2 · 2^14 · 2^16 = 2^31 = R/2: refused
    with pytest.raises(InvalidParameter, match=r"2147483648 ≥ R/2 = 2\^31.*modulus_bits = 64"):
        secure_sum(torch.zeros(2, 3), [0, 1], round=0, seed=0, clip=2.0**14, frac_bits=16)
    # one quantum below: 2·(2^30 − 1) = 2^31 − 2 < R/2, and the extreme sums decode exactly
    clip = 2.0**14 - 2.0**-16
    assert check_capacity(2, clip, 16, 32) == 2**30 - 1
    for sign in (1.0, -1.0):
        rows = torch.full((2, 3), sign * clip, dtype=torch.float64)
        total = secure_sum(rows, [0, 1], round=0, seed=0, clip=clip, frac_bits=16).total
        assert total.tolist() == [2 * sign * clip] * 3
    # what the check prevents: at the limit two rows at +clip wrap to −R/2
    q, _ = encode(np.full((2, 1), 2.0**14), 2.0**14, 16, 32)
    assert decode(q.sum(axis=0, dtype=np.uint32), 16, 32).tolist() == [-(2.0**15)]
    # R = 2^64: 2 · 2^32 · 2^30 = 2^63 refused, 2^32 − 2^−20 (a float64) accepted
    with pytest.raises(InvalidParameter, match=r"R/2 = 2\^63: the decoded sum could wrap; use a smaller clip or"):
        check_capacity(2, 2.0**32, 30, 64)
    with pytest.raises(InvalidParameter, match=r"could wrap; use modulus_bits = 64, a smaller clip or"):
        check_capacity(2, 2.0**14, 16, 32)
    with pytest.raises(InvalidParameter, match=r"≥ R/2 = 2\^31"):  # beyond any float scaling
        check_capacity(1, 1e300, 16, 32)
    assert check_capacity(2, 2.0**32 - 2.0**-20, 30, 64) == 2**62 - 2**10


@pytest.mark.parametrize("modulus_bits", [32, 64])
def test_encoding_wraps_negative_values_modulo_r(modulus_bits):
    q, clipped = encode(np.array([[-1.0, 0.5, -0.5, 3.0]]), 2.0, 1, modulus_bits)
    r = 2**modulus_bits
    assert q.dtype == (np.uint32 if modulus_bits == 32 else np.uint64)
    assert [int(v) for v in q[0]] == [r - 2, 1, r - 1, 4] and clipped == 1
    assert decode(q, 1, modulus_bits).tolist() == [[-1.0, 0.5, -0.5, 2.0]]
    top = np.array([r - 1, r - 1, 5], dtype=q.dtype)  # Σ = 2R + 3 ≡ 3
    assert int(top.sum(dtype=q.dtype)) == 3


def test_modulus_2_64_sums_what_2_32_must_refuse():
    """Sum 6·2^20·2^20 ≈ 2^42.6 > 2^31: refused at R = 2^32, exact at R = 2^64 (< 2^53)."""
    m, clip, f = 6, 2.0**20, 20
    rows = torch.tensor([[clip, -clip, 1234.5678, -0.001]] * m, dtype=torch.float64)
    rows[1, 2] = -99999.25
    with pytest.raises(InvalidParameter, match="R/2 = 2\\^31"):
        secure_sum(rows, list(range(m)), round=0, seed=0, clip=clip, frac_bits=f)
    res = secure_sum(rows, list(range(m)), round=0, seed=0, clip=clip, frac_bits=f, modulus_bits=64, dropouts=[2])
    assert torch.equal(res.total, _fixed_point_sum(rows, [0, 1, 3, 4, 5], clip, f))
    assert res.total[0].item() == 5 * clip


# --------------------------------------------------------------------------- Shamir
class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out


def test_shamir_any_t_shares_reconstruct_and_fewer_are_refused():
    secret = 2**255 + 12345
    stream = _Bytes(bytes(range(256)) * 4)
    shares = shamir.split(secret, 5, 3, stream)
    for subset in itertools.combinations(range(5), 3):
        assert shamir.reconstruct([(i + 1, shares[i]) for i in subset], 3) == secret
    two = [(1, shares[0]), (4, shares[3])]
    with pytest.raises(InvalidParameter, match="2 share\\(s\\) given, threshold t = 3"):
        shamir.reconstruct(two, 3)
    assert shamir.reconstruct(two, 2) != secret  # t − 1 points interpolate to something else


def test_shamir_t_minus_1_shares_are_consistent_with_every_secret():
    """In F_7 with t = 3, every pair of shares (f(i), f(j)) occurs for exactly one of the 49
    coefficient choices, whatever the secret: t − 1 shares carry no information about it."""
    p, n, t = 7, 4, 3
    for secret in range(p):
        for i, j in itertools.combinations(range(n), 2):
            seen = set()
            for a1, a2 in itertools.product(range(p), repeat=2):
                sh = shamir.split(secret, n, t, _Bytes(bytes([a1 << 5, a2 << 5])), prime=p)
                seen.add((sh[i], sh[j]))
                assert shamir.reconstruct([(1, sh[0]), (3, sh[2]), (4, sh[3])], t, prime=p) == secret
            assert len(seen) == p * p
    assert all(0 <= y < p for y in sh)


def test_shamir_boundaries():
    shares = shamir.split(5, 1, 1, _Bytes(b""))
    assert shares == (5,) and shamir.reconstruct([(1, 5)], 1) == 5  # t = n = 1: the secret itself
    assert len(shamir.split(3, 6, 2, _Bytes(bytes(8)), prime=7)) == 6  # n = prime − 1 points fit
    with pytest.raises(InvalidParameter, match="n = 7: needs n < prime = 7"):
        shamir.split(3, 7, 2, _Bytes(bytes(8)), prime=7)
    with pytest.raises(InvalidParameter, match="n = 0: must be an integer ≥ 1"):
        shamir.split(3, 0, 1, _Bytes(b""))
    with pytest.raises(InvalidParameter, match=r"secret must be an integer in \[0, prime\); got int"):
        shamir.split(7, 3, 2, _Bytes(bytes(8)), prime=7)
    with pytest.raises(InvalidParameter, match="got str"):
        shamir.split("1", 3, 2, _Bytes(bytes(8)))
    with pytest.raises(InvalidParameter, match="t = 0: must be an integer ≥ 1"):
        shamir.reconstruct([(1, 5)], 0)
    for bad in ([(0, 1), (1, 2)], [(1, 1), (7, 2)]):
        with pytest.raises(InvalidParameter, match=r"must be distinct integers in \[1, prime\)"):
            shamir.reconstruct(bad, 2, prime=7)


def test_field_element_rejects_out_of_range_draws():
    assert shamir.field_element(_Bytes(bytes([7 << 5, 3 << 5])), 7) == 3
    stream = _Bytes(bytes([251, 250, 9]))  # an 8-bit prime: one byte per draw, 251 rejected
    assert shamir.field_element(stream, 251) == 250 and stream.data == bytes([9])
    with pytest.raises(InvalidParameter, match="t = 0"):
        shamir.split(1, 3, 0, _Bytes(b""))
    with pytest.raises(InvalidParameter, match="distinct"):
        shamir.reconstruct([(1, 5), (1, 6)], 2)


# --------------------------------------------------------------------------- buckets
def test_buckets_partition_clients_and_sum_each_bucket():
    m, d, buckets = 11, 40, 3
    ids = list(range(100, 100 + m))
    rows = _rows(m, d, seed=4)
    out = bucketed_secure_sum(rows, ids, buckets, torch.Generator().manual_seed(0), round=0, seed=3, dropouts=[104])
    assert sorted(u for g in out.members for u in g) == ids
    assert sorted(len(g) for g in out.members) == [3, 4, 4]
    assert out.sums.dtype == torch.float64 and out.sums.shape == (buckets, d)
    for b, group in enumerate(out.members):
        keep = [ids.index(u) for u in group if u != 104]
        assert torch.equal(out.sums[b], _fixed_point_sum(rows, keep, 1.0, 16))
        assert out.counts[b] == len(keep)
        # keys are bound to the bucket: the same members outside a bucket mask differently
        alone = secure_sum(rows[[ids.index(u) for u in group]], list(group), round=0, seed=3,
                           dropouts=[104] if 104 in group else [])
        assert not torch.equal(alone.masked, out.results[b].masked)
    coarse = bucketed_secure_sum(rows, ids, buckets, torch.Generator().manual_seed(0), round=0, seed=3,
                                 clip=0.05, frac_bits=8, modulus_bits=64)
    for b, group in enumerate(coarse.members):
        assert torch.equal(coarse.sums[b], _fixed_point_sum(rows, [ids.index(u) for u in group], 0.05, 8))
        assert coarse.results[b].phase_bytes[2][1] == len(group) * d * 8
    one = bucketed_secure_sum(rows, ids, 1, torch.Generator().manual_seed(0), round=0, seed=3, threshold=11)
    assert one.members == (tuple(ids),) and one.results[0].threshold == 11
    assert torch.equal(one.sums[0], _fixed_point_sum(rows, list(range(m)), 1.0, 16))
    again = bucketed_secure_sum(rows, ids, buckets, torch.Generator().manual_seed(0), round=0, seed=3, dropouts=[104])
    assert again.members == out.members and torch.equal(again.sums, out.sums)
    other = bucketed_secure_sum(rows, ids, buckets, np.random.default_rng(1), round=0, seed=3)
    assert sorted(u for g in other.members for u in g) == ids
    # the partition is drawn from the generator: 5 seeds give 5 different partitions
    drawn = {bucketed_secure_sum(rows, ids, buckets, torch.Generator().manual_seed(s), round=0, seed=3).members
             for s in range(5)}
    assert len(drawn) == 5


def test_buckets_refuse_singletons_and_abort_or_skip():
    rows, ids = _rows(6, 5), list(range(6))
    g = torch.Generator().manual_seed(0)
    assert len(bucketed_secure_sum(rows, ids, 3, g, round=0, seed=0).members) == 3  # pairs
    with pytest.raises(InvalidParameter, match=r"buckets = 4: must be an integer in \[1, 3\]"):
        bucketed_secure_sum(rows, ids, 4, g, round=0, seed=0)
    members = bucketed_secure_sum(rows, ids, 3, torch.Generator().manual_seed(5), round=0, seed=0).members
    victim = members[1][0]  # a pair with one dropout has 1 survivor < t = 2
    with pytest.raises(SecAggAborted, match="bucket 1 of 3"):
        bucketed_secure_sum(rows, ids, 3, torch.Generator().manual_seed(5), round=0, seed=0, dropouts=[victim])
    out = bucketed_secure_sum(rows, ids, 3, torch.Generator().manual_seed(5), round=0, seed=0,
                              dropouts=[victim], skip_aborted=True)
    assert out.aborted == (1,) and out.results[1] is None and out.counts[1] == 0
    assert len(out.results) == 3 and out.counts[0] == out.counts[2] == 2
    assert torch.equal(out.sums[1], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(out.sums[2], _fixed_point_sum(rows, list(members[2]), 1.0, 16))
    every = bucketed_secure_sum(rows, ids, 3, g, round=0, seed=0, dropouts=ids, skip_aborted=True)
    assert every.aborted == (0, 1, 2) and every.counts == (0, 0, 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rows=torch.zeros(5, 2)), r"rows must be a 2-D tensor with one row per client \(6\); got \(5, 2\)"),
    (dict(rows=np.zeros((6, 2))), r"one row per client \(6\); got \(6, 2\)"),
    (dict(rows=[[0.0, 0.0]] * 6), r"one row per client \(6\); got \(\)"),
    (dict(rng=42), "rng is a int: expected a torch.Generator or numpy.random.Generator"),
    (dict(dropouts=[9]), r"dropouts \[9\] are not client_ids"),
    (dict(dropouts=[-1]), r"dropouts = \[-1\]: must be integers"),
    (dict(client_ids=[0, 1, 2, 3, 4, "5"]), r"client_ids = \[0, 1, 2, 3, 4, '5'\]: must be integers"),
])
def test_bucketed_bad_input_is_named(kwargs, match):
    args = dict(rows=_rows(6, 2), client_ids=list(range(6)), rng=torch.Generator(), dropouts=()) | kwargs
    with pytest.raises(InvalidParameter, match=match):
        bucketed_secure_sum(args["rows"], args["client_ids"], 2, args["rng"], round=0, seed=0,
                            dropouts=args["dropouts"])


# --------------------------------------------------------------------------- accounting and bad input
def test_bytes_up_per_phase():
    m, d = 4, 10
    res = secure_sum(_rows(m, d), [0, 1, 2, 3], round=0, seed=0, dropouts=[2])
    # keys 2·32 B per client; sealed (s, b) share pairs 16 + 2·66 + 16 B per ordered pair;
    # y_u 4 B per coordinate per survivor; one (id, share) of 8 + 66 B per client per survivor
    assert dict(res.phase_bytes) == {"advertise_keys": 4 * 64, "share_keys": 12 * 164,
                                     "masked_input": 3 * d * 4, "unmasking": 3 * 4 * 74}
    assert res.bytes_up == 256 + 1968 + 120 + 888
    assert all(type(b) is int for _, b in res.phase_bytes) and type(res.bytes_up) is int
    res64 = secure_sum(_rows(m, d), [0, 1, 2, 3], round=0, seed=0, dropouts=[2], modulus_bits=64)
    assert dict(res64.phase_bytes)["masked_input"] == 3 * d * 8


@pytest.mark.parametrize("kwargs, match", [
    (dict(client_ids=[0, 0, 1]), "client_ids = \\[0, 0, 1\\]: must be distinct"),
    (dict(client_ids=[0, -1, 1]), "client_ids = \\[0, -1, 1\\]: must be integers in \\[0, 2\\^63\\)"),
    (dict(client_ids=[0, 1.5, 2]), "must be integers"),
    (dict(client_ids=[0, True, 2]), "must be integers"),
    (dict(client_ids=[0, 1]), "2 client_ids for 3 rows"),
    (dict(dropouts=[7]), "dropouts = \\[7\\]"),
    (dict(threshold=4), "threshold = 4: must be an integer in \\[1, 3\\]"),
    (dict(modulus_bits=48), "modulus_bits = 48: must be one of \\(32, 64\\)"),
    (dict(frac_bits=31), r"frac_bits = 31: must be an integer in \[0, 30\] for modulus_bits = 32"),
    (dict(frac_bits=-1), r"frac_bits = -1"),
    (dict(clip=float("inf")), "clip = inf"),
    (dict(clip=0.0), "clip = 0.0: must be a finite number > 0"),
    (dict(clip=True), "clip = True"),
    (dict(client_ids=[0, 1, 2**63]), r"client_ids = \[0, 1, 9223372036854775808\]: must be integers"),
    (dict(dropouts=[-1]), r"dropouts = \[-1\]: must be integers"),
    (dict(seed=b""), "seed = b''"),
    (dict(round=-1), "round = -1"),
])
def test_bad_input_is_named(kwargs, match):
    args = dict(client_ids=[0, 1, 2], round=0, seed=1) | kwargs
    with pytest.raises(InvalidParameter, match=match):
        secure_sum(_rows(3, 4), args.pop("client_ids"), **args)


def test_numpy_and_torch_integer_ids_are_accepted():
    rows = _rows(3, 4)
    a = secure_sum(rows, np.array([5, 6, 7]), round=0, seed=1, dropouts=[torch.tensor(6)], threshold=2)
    b = secure_sum(rows, [5, 6, 7], round=0, seed=1, dropouts=[6], threshold=2)
    assert a.survivors == (5, 7) and type(a.survivors[0]) is int and torch.equal(a.masked, b.masked)


def test_frac_bits_range_ends_and_largest_ids_are_accepted():
    rows = torch.tensor([[3.0, -2.0], [1.0, 1.0]], dtype=torch.float64)
    assert secure_sum(rows, [0, 2**63 - 1], round=0, seed=1, frac_bits=0, clip=4.0).total.tolist() == [4.0, -1.0]
    tiny = torch.tensor([[2.0**-30, -(2.0**-29)], [2.0**-30, 0.0]], dtype=torch.float64)
    assert secure_sum(tiny, [0, 1], round=0, seed=1, frac_bits=30, clip=0.25).total.tolist() == [2.0**-29, -(2.0**-29)]


def test_one_client_and_threshold_one():
    """m = 1 (t = 1) runs: the 'sum' is that client's row, masked by b_u alone, whose key
    is bound to the context like every other."""
    row = _rows(1, 8)
    a = secure_sum(row, [4], round=0, seed=1)
    assert a.threshold == 1 and torch.equal(a.total, _fixed_point_sum(row, [0], 1.0, 16))
    assert not torch.equal(a.masked, secure_sum(row, [4], round=0, seed=1, context=b"other").masked)
    three = secure_sum(_rows(3, 8), [0, 1, 2], round=0, seed=1, dropouts=[0, 2], threshold=1)
    assert three.survivors == (1,) and torch.equal(three.total, _fixed_point_sum(_rows(3, 8), [1], 1.0, 16))


def test_a_single_coordinate():
    rows = torch.tensor([[0.25], [-1.5], [0.5]], dtype=torch.float64)
    assert secure_sum(rows, [0, 1, 2], round=0, seed=1, clip=2.0, dropouts=[2]).total.tolist() == [-1.25]


def test_all_clients_dropped_aborts():
    with pytest.raises(SecAggAborted, match="0 of 3 clients survived"):
        secure_sum(_rows(3, 4), [0, 1, 2], round=0, seed=1, dropouts=[2, 0, 1])


@pytest.mark.parametrize("rows, match", [
    (np.zeros((3, 4)), r"rows must be a 2-D float tensor \(m, d\); got ndarray \(3, 4\)"),
    (torch.zeros(3, 4, dtype=torch.int64), r"got Tensor \(3, 4\)"),
    (torch.zeros(12), r"got Tensor \(12,\)"),
    (torch.zeros(3, 0), r"rows has shape \(3, 0\): need at least one row and one column"),
    (torch.zeros(0, 4), r"rows has shape \(0, 4\)"),
    ([[0.0] * 4] * 3, r"got list \(\)"),
])
def test_bad_rows_are_named(rows, match):
    with pytest.raises(InvalidParameter, match=match):
        secure_sum(rows, [0, 1, 2], round=0, seed=1)


def test_prg_refuses_a_short_seed():
    with pytest.raises(InvalidParameter, match="prg: seed has 15 bytes, expected 16"):
        prg(bytes(15), 4)


def test_non_finite_rows_refused():
    rows = _rows(3, 4)
    rows[1, 2] = float("nan")
    with pytest.raises(InvalidParameter, match="rows has 1 non-finite entries"):
        secure_sum(rows, [0, 1, 2], round=0, seed=1)
