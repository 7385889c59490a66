"""RFC 6962 / 9162 Merkle trees: reference vectors, the RFC's recursive definitions, mutations."""

from __future__ import annotations

import hashlib
from functools import lru_cache

import pytest
from hypothesis import given, settings, strategies as st

from provenance.errors import ProvenanceError, VerificationFailed
from provenance.merkle import (
    EMPTY_ROOT, ConsistencyProof, InclusionProof, consistency_ranges, inclusion_ranges, leaf_hash, node_hash,
    perfect_cover, range_hashes, root_from_leaves, verify_consistency, verify_inclusion,
)

# The Certificate Transparency reference inputs and tree heads (RFC 6962 test data,
# certificate-transparency merkle_tree_test): roots for sizes 0..8.
CT_INPUTS = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                         "606162636465666768696a6b6c6d6e6f")]
CT_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
# (leaf index, tree size, audit path) and (old, new, consistency proof) from the same test data.
CT_INCLUSION = [
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (1, 5, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]
CT_CONSISTENCY = [
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]


# --------------------------------------------------------------------------- RFC 6962 §2.1, transcribed
# The recursive definitions, on the leaf range D[a:b] of a fixed entry list (memoized on
# the range so all sizes up to 300 stay fast).
N_MAX = 300
ENTRIES = [hashlib.sha256(b"entry %d" % i).digest()[: i % 7] + bytes([i % 251]) for i in range(N_MAX)]


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


@lru_cache(maxsize=None)
def ref_mth(a: int, b: int) -> bytes:
    n = b - a
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + ENTRIES[a]).digest()
    k = _k(n)
    return hashlib.sha256(b"\x01" + ref_mth(a, a + k) + ref_mth(a + k, b)).digest()


def ref_path(m: int, a: int, b: int) -> list[bytes]:
    n = b - a
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return ref_path(m, a, a + k) + [ref_mth(a + k, b)]
    return ref_path(m - k, a + k, b) + [ref_mth(a, a + k)]


def ref_subproof(m: int, a: int, b: int, complete: bool) -> list[bytes]:
    n = b - a
    if m == n:
        return [] if complete else [ref_mth(a, b)]
    k = _k(n)
    if m <= k:
        return ref_subproof(m, a, a + k, complete) + [ref_mth(a + k, b)]
    return ref_subproof(m - k, a + k, b, False) + [ref_mth(a, a + k)]


def ref_proof(m: int, n: int) -> list[bytes]:
    return ref_subproof(m, 0, n, True)


# --------------------------------------------------------------------------- a subtree store
def _store(leaves: list[bytes]) -> dict[tuple[int, int], bytes]:
    """Hashes of every complete perfect subtree, keyed (level, index): what the ledger stores."""
    out = {(0, i): h for i, h in enumerate(leaves)}
    level, row = 0, leaves
    while len(row) > 1:
        row = [node_hash(row[j], row[j + 1]) for j in range(0, len(row) - 1, 2)]
        level += 1
        out.update(((level, i), h) for i, h in enumerate(row))
    return out


LEAVES = [leaf_hash(e) for e in ENTRIES]
STORE = _store(LEAVES)


def lookup(keys):
    return {k: STORE[k] for k in keys}


def proof_of(m: int, n: int) -> list[bytes]:
    return range_hashes(inclusion_ranges(m, n), lookup)


def consistency_of(m: int, n: int) -> list[bytes]:
    return range_hashes(consistency_ranges(m, n), lookup)


def root_of(n: int) -> bytes:
    return EMPTY_ROOT if n == 0 else range_hashes([(0, n)], lookup)[0]


# --------------------------------------------------------------------------- reference vectors
def test_reference_roots_sizes_0_to_8():
    leaves = [leaf_hash(x) for x in CT_INPUTS]
    for n in range(9):
        assert root_from_leaves(leaves[:n]).hex() == CT_ROOTS[n]
        store = _store(leaves[:n])
        if n:
            assert range_hashes([(0, n)], lambda ks: {k: store[k] for k in ks})[0].hex() == CT_ROOTS[n]


def test_hand_derived_three_leaf_tree():
    a, b, c = (leaf_hash(x) for x in (b"a", b"b", b"c"))
    ab = hashlib.sha256(b"\x01" + a + b).digest()
    root = hashlib.sha256(b"\x01" + ab + c).digest()
    assert root_from_leaves([a, b, c]) == root
    assert inclusion_ranges(0, 3) == [(1, 2), (2, 3)]      # path of leaf 0: b, then c
    assert inclusion_ranges(2, 3) == [(0, 2)]              # path of leaf 2: MTH(a, b)
    assert consistency_ranges(1, 3) == [(1, 2), (2, 3)]    # PROOF(1, D[3]) = [b, c]
    assert consistency_ranges(2, 3) == [(2, 3)]            # PROOF(2, D[3]) = [c]
    verify_inclusion(0, 3, a, [b, c], root)
    verify_inclusion(2, 3, c, [ab], root)
    verify_consistency(1, 3, a, root, [b, c])
    verify_consistency(2, 3, ab, root, [c])


@pytest.mark.parametrize("index,size,path", CT_INCLUSION)
def test_reference_inclusion_proofs(index, size, path):
    leaves = [leaf_hash(x) for x in CT_INPUTS]
    store = _store(leaves[:size])
    got = range_hashes(inclusion_ranges(index, size), lambda ks: {k: store[k] for k in ks})
    assert [h.hex() for h in got] == path
    verify_inclusion(index, size, leaves[index], got, bytes.fromhex(CT_ROOTS[size]))


@pytest.mark.parametrize("old,new,proof", CT_CONSISTENCY)
def test_reference_consistency_proofs(old, new, proof):
    leaves = [leaf_hash(x) for x in CT_INPUTS]
    store = _store(leaves[:new])
    got = range_hashes(consistency_ranges(old, new), lambda ks: {k: store[k] for k in ks})
    assert [h.hex() for h in got] == proof
    verify_consistency(old, new, bytes.fromhex(CT_ROOTS[old]), bytes.fromhex(CT_ROOTS[new]), got)


# --------------------------------------------------------------------------- sizes 1..300 against the RFC
def test_roots_and_proofs_match_rfc_definitions_for_sizes_1_to_300():
    for n in range(1, N_MAX + 1):
        assert root_of(n) == ref_mth(0, n) == root_from_leaves(LEAVES[:n])
        for m in range(n):
            path = proof_of(m, n)
            assert path == ref_path(m, 0, n), (m, n)
        for m in range(1, n + 1):
            assert consistency_of(m, n) == ref_proof(m, n), (m, n)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, N_MAX).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1), st.integers(1, n))))
def test_generated_proofs_verify(args):
    n, m, old = args
    root = ref_mth(0, n)
    verify_inclusion(m, n, LEAVES[m], proof_of(m, n), root)
    verify_consistency(old, n, ref_mth(0, old), root, consistency_of(old, n))


@settings(max_examples=400, deadline=None)
@given(st.integers(2, N_MAX).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))),
       st.data())
def test_every_single_byte_mutation_of_an_inclusion_proof_is_rejected(args, data):
    n, m = args
    path = proof_of(m, n)
    i = data.draw(st.integers(0, len(path) - 1))
    j = data.draw(st.integers(0, 31))
    x = data.draw(st.integers(1, 255))
    bad = list(path)
    bad[i] = bad[i][:j] + bytes([bad[i][j] ^ x]) + bad[i][j + 1:]
    with pytest.raises(VerificationFailed):
        verify_inclusion(m, n, LEAVES[m], bad, ref_mth(0, n))


@settings(max_examples=400, deadline=None)
@given(st.integers(3, N_MAX).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n - 1))), st.data())
def test_every_single_byte_mutation_of_a_consistency_proof_is_rejected(args, data):
    n, m = args
    proof = consistency_of(m, n)
    i = data.draw(st.integers(0, len(proof) - 1))
    j = data.draw(st.integers(0, 31))
    x = data.draw(st.integers(1, 255))
    bad = list(proof)
    bad[i] = bad[i][:j] + bytes([bad[i][j] ^ x]) + bad[i][j + 1:]
    with pytest.raises(VerificationFailed):
        verify_consistency(m, n, ref_mth(0, m), ref_mth(0, n), bad)


def test_wrong_index_size_or_shape_is_rejected():
    n, m = 21, 5
    path, root = proof_of(m, n), ref_mth(0, n)
    # (An audit path does not by itself pin the tree size: leaf 5's path is the same in
    # trees of 17..32 leaves. The size is bound by the signed checkpoint; see the ledger tests.)
    for bad_m, bad_n, bad_path in [(m + 1, n, path), (m, 16, path), (m, 33, path),
                                   (m, n, path[:-1]), (m, n, path + [path[0]]), (n, n, path)]:
        with pytest.raises(VerificationFailed):
            verify_inclusion(bad_m, bad_n, LEAVES[m], bad_path, root)
    with pytest.raises(VerificationFailed):
        verify_inclusion(m, n, LEAVES[m + 1], path, root)
    c = consistency_of(7, n)
    with pytest.raises(VerificationFailed):
        verify_consistency(7, n, ref_mth(0, 7), ref_mth(0, n), c[:-1])
    with pytest.raises(VerificationFailed):
        verify_consistency(8, n, ref_mth(0, 7), ref_mth(0, n), c)
    with pytest.raises(VerificationFailed, match="forked"):
        verify_consistency(4, 4, ref_mth(0, 4), ref_mth(0, 5), [])
    with pytest.raises(ProvenanceError, match="32-byte"):
        verify_inclusion(m, n, LEAVES[m], [b"short"], root)


def test_range_helpers_reject_bad_input():
    assert perfect_cover(8, 13) == [(2, 2), (0, 12)]
    with pytest.raises(ProvenanceError, match="aligned"):
        perfect_cover(3, 7)
    with pytest.raises(ProvenanceError, match=r"leaf index 5: must be in \[0, 5\)"):
        inclusion_ranges(5, 5)
    with pytest.raises(ProvenanceError, match="0 ≤ old ≤ new"):
        consistency_ranges(6, 5)


def test_proof_documents_round_trip_and_reject_malformed_fields():
    p = InclusionProof(5, 21, ref_mth(0, 21), tuple(proof_of(5, 21)))
    assert InclusionProof.from_dict(p.to_dict()) == p
    InclusionProof.from_dict(p.to_dict()).verify(LEAVES[5])
    c = ConsistencyProof(7, 21, ref_mth(0, 7), ref_mth(0, 21), tuple(consistency_of(7, 21)))
    assert ConsistencyProof.from_dict(c.to_dict()) == c
    c.verify()
    d = p.to_dict()
    for key, value, msg in [("rootHash", d["rootHash"].upper(), "lowercase hex"),
                            ("logIndex", -1, "must be ≥ 0"), ("treeSize", "21", "expected an integer"),
                            ("hashes", "x", "list")]:
        bad = dict(d, **{key: value})
        with pytest.raises(ProvenanceError, match=msg):
            InclusionProof.from_dict(bad)
    with pytest.raises(ProvenanceError, match="unexpected field"):
        InclusionProof.from_dict(dict(d, extra=1))
    with pytest.raises(ProvenanceError, match="missing field 'hashes'"):
        InclusionProof.from_dict({k: v for k, v in d.items() if k != "hashes"})
