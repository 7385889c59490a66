"""RFC 6962 / RFC 9162 Merkle trees: hashes, proofs and their verification.

* ``MTH({}) = SHA-256("")``; a leaf is ``SHA-256(0x00 ‖ entry)``; an inner node is
  ``SHA-256(0x01 ‖ left ‖ right)``; a tree of n > 1 leaves splits at k, the largest
  power of two smaller than n (RFC 6962 §2.1).
* Inclusion proofs are the RFC's audit path ``PATH(m, D[n])`` and consistency proofs
  ``PROOF(m, D[n])`` (RFC 6962 §2.1.1-2.1.2, RFC 9162 §2.1.3.1 / §2.1.4.1), both as
  lists of hashes, leaf level first.
* Verification follows RFC 9162 §2.1.3.2 (inclusion) and §2.1.4.2 (consistency)
  literally.

Proof generation here never walks the tree. Every node a proof needs is either a
*perfect* subtree (2^level leaves starting at ``index·2^level``) or a subtree on the
right edge of the tree, which is the right-fold of the perfect subtrees of its binary
decomposition. :func:`inclusion_ranges` / :func:`consistency_ranges` name the leaf
ranges a proof consists of, :func:`perfect_cover` the O(log n) stored perfect subtrees
they need, and :func:`range_hashes` folds them; so a store keyed by ``(level, index)``
(the ledger's SQLite table) answers any proof with O(log n) lookups.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from . import _codec
from .errors import ProvenanceError, VerificationFailed

__all__ = [
    "EMPTY_ROOT",
    "ConsistencyProof",
    "InclusionProof",
    "consistency_ranges",
    "inclusion_ranges",
    "leaf_hash",
    "node_hash",
    "perfect_cover",
    "range_hashes",
    "root_from_leaves",
    "verify_consistency",
    "verify_inclusion",
]

_sha256 = hashlib.sha256
EMPTY_ROOT = _sha256(b"").digest()


def leaf_hash(entry: bytes) -> bytes:
    return _sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return _sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n ≥ 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_from_leaves(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH over leaf hashes, bottom-up in O(n) (equal to the RFC's recursive definition)."""
    if not leaf_hashes:
        return EMPTY_ROOT
    level = list(leaf_hashes)
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])  # an unpaired right node is promoted unchanged
        level = nxt
    return level[0]


# --------------------------------------------------------------------------- ranges
def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """The leaf ranges ``[start, end)`` whose MTHs form ``PATH(index, D[size])``, leaf level first."""
    if not 0 <= index < size:
        raise ProvenanceError(f"leaf index {index}: must be in [0, {size}) for a tree of size {size}")
    out = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            lo = lo + k
    out.reverse()
    return out


def consistency_ranges(old: int, new: int) -> list[tuple[int, int]]:
    """The leaf ranges whose MTHs form ``PROOF(old, D[new])`` (RFC 6962 §2.1.2)."""
    if not 0 <= old <= new:
        raise ProvenanceError(f"consistency between sizes {old} and {new}: need 0 ≤ old ≤ new")
    if old == 0 or old == new:
        return []
    out = []
    lo, hi, complete = 0, new, True  # SUBPROOF(m, D[lo:hi], complete), m = old - lo
    while True:
        m = old - lo
        if m == hi - lo:
            if not complete:
                out.append((lo, hi))
            break
        k = _split(hi - lo)
        if m <= k:
            out.append((lo + k, hi))
            hi = lo + k
        else:
            out.append((lo, lo + k))
            lo, complete = lo + k, False
    out.reverse()
    return out


def perfect_cover(start: int, end: int) -> list[tuple[int, int]]:
    """``(level, index)`` of the perfect subtrees whose right-fold is MTH(D[start:end]).

    Valid for the ranges proofs use: ``start`` a multiple of a power of two ≥ the
    range's length. Largest (leftmost) first.
    """
    n = end - start
    if n <= 0:
        raise ProvenanceError(f"leaf range [{start}, {end}): must be non-empty")
    out = []
    pos = start
    for level in range(n.bit_length() - 1, -1, -1):
        if n >> level & 1:
            if pos % (1 << level):
                raise ProvenanceError(f"leaf range [{start}, {end}) is not aligned to a subtree")
            out.append((level, pos >> level))
            pos += 1 << level
    return out


def range_hashes(ranges: Iterable[tuple[int, int]], lookup: Callable[[list[tuple[int, int]]], Mapping[tuple[int, int], bytes]]) -> list[bytes]:
    """MTH of each range, with ``lookup(keys) -> {(level, index): hash}`` called once."""
    ranges = list(ranges)
    covers = [perfect_cover(s, e) for s, e in ranges]
    need = sorted({k for c in covers for k in c})
    got = lookup(need) if need else {}
    out = []
    for cover in covers:
        try:
            h = got[cover[-1]]
            for key in reversed(cover[:-1]):
                h = node_hash(got[key], h)
        except KeyError as exc:
            raise ProvenanceError(f"subtree {exc.args[0]} is not stored; the log is truncated or damaged") from None
        out.append(h)
    return out


# --------------------------------------------------------------------------- verification
def _check_hashes(proof: Sequence[bytes], what: str) -> None:
    for i, h in enumerate(proof):
        if not isinstance(h, (bytes, bytearray)) or len(h) != 32:
            raise ProvenanceError(f"{what}[{i}]: expected a 32-byte SHA-256 hash")


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """RFC 9162 §2.1.3.2: the root that ``proof`` implies for ``leaf`` at ``index``."""
    _check_hashes(proof, "inclusion proof")
    if not 0 <= index < size:
        raise VerificationFailed(f"inclusion proof: leaf index {index} is not below tree size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise VerificationFailed(f"inclusion proof: {len(proof)} hashes is too long for index {index} "
                                     f"in a tree of size {size}")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise VerificationFailed(f"inclusion proof: {len(proof)} hashes is too short for index {index} "
                                 f"in a tree of size {size}")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Raise :class:`VerificationFailed` unless ``proof`` shows ``leaf`` at ``index`` under ``root``."""
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise VerificationFailed(f"inclusion proof: leaf {index} does not lead to the root of tree size {size}")


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """RFC 9162 §2.1.4.2: raise :class:`VerificationFailed` unless tree ``new`` extends tree ``old``.

    Sizes 0 and old == new, which the RFC's algorithm does not cover, need an empty
    proof (and, for equal sizes, equal roots).
    """
    _check_hashes(proof, "consistency proof")
    if not 0 <= old <= new:
        raise VerificationFailed(f"consistency proof: sizes {old} → {new} go backwards")
    if old == 0 or old == new:
        if proof:
            raise VerificationFailed(f"consistency proof from size {old} to {new} must be empty")
        if old == new and old_root != new_root:
            raise VerificationFailed(f"two different roots for the same tree size {old}: the log forked")
        return
    path = list(proof)
    if not path:
        raise VerificationFailed(f"consistency proof from size {old} to {new}: empty")
    if old & (old - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise VerificationFailed(f"consistency proof from size {old} to {new}: too many hashes")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0 or fr != old_root or sr != new_root:
        raise VerificationFailed(f"consistency proof from size {old} to {new} does not verify")


# --------------------------------------------------------------------------- JSON documents
@dataclass(frozen=True, slots=True)
class InclusionProof:
    """An inclusion proof as printed by ``ledger prove``: hex hashes, like Rekor's API."""

    log_index: int
    tree_size: int
    root_hash: bytes
    hashes: tuple[bytes, ...]
    checkpoint: str | None = None

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"logIndex": self.log_index, "treeSize": self.tree_size,
                                "rootHash": self.root_hash.hex(), "hashes": [h.hex() for h in self.hashes]}
        if self.checkpoint is not None:
            d["checkpoint"] = self.checkpoint
        return d

    @classmethod
    def from_dict(cls, d: object, what: str = "inclusion proof") -> "InclusionProof":
        d = _codec.obj(d, what, ("logIndex", "treeSize", "rootHash", "hashes"), ("checkpoint",))
        hs = d["hashes"]
        if not isinstance(hs, list):
            raise ProvenanceError(f"{what}.hashes: expected a list of hex hashes")
        cp = d.get("checkpoint")
        return cls(log_index=_codec.integer(d["logIndex"], f"{what}.logIndex"),
                   tree_size=_codec.integer(d["treeSize"], f"{what}.treeSize", minimum=1),
                   root_hash=_codec.hex32(d["rootHash"], f"{what}.rootHash"),
                   hashes=tuple(_codec.hex32(h, f"{what}.hashes[{i}]") for i, h in enumerate(hs)),
                   checkpoint=None if cp is None else _codec.string(cp, f"{what}.checkpoint"))

    def verify(self, leaf: bytes) -> None:
        """Check the path against this document's own ``rootHash`` (bind it to a signed
        checkpoint separately: see ``ledger.verify_inclusion_document``)."""
        verify_inclusion(self.log_index, self.tree_size, leaf, self.hashes, self.root_hash)


@dataclass(frozen=True, slots=True)
class ConsistencyProof:
    """A consistency proof between two tree sizes, with both roots (hex in JSON)."""

    old_size: int
    new_size: int
    old_root: bytes
    new_root: bytes
    hashes: tuple[bytes, ...]
    checkpoint: str | None = None

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"oldSize": self.old_size, "treeSize": self.new_size,
                                "oldRootHash": self.old_root.hex(), "rootHash": self.new_root.hex(),
                                "hashes": [h.hex() for h in self.hashes]}
        if self.checkpoint is not None:
            d["checkpoint"] = self.checkpoint
        return d

    @classmethod
    def from_dict(cls, d: object, what: str = "consistency proof") -> "ConsistencyProof":
        d = _codec.obj(d, what, ("oldSize", "treeSize", "oldRootHash", "rootHash", "hashes"), ("checkpoint",))
        hs = d["hashes"]
        if not isinstance(hs, list):
            raise ProvenanceError(f"{what}.hashes: expected a list of hex hashes")
        cp = d.get("checkpoint")
        return cls(old_size=_codec.integer(d["oldSize"], f"{what}.oldSize"),
                   new_size=_codec.integer(d["treeSize"], f"{what}.treeSize"),
                   old_root=_codec.hex32(d["oldRootHash"], f"{what}.oldRootHash"),
                   new_root=_codec.hex32(d["rootHash"], f"{what}.rootHash"),
                   hashes=tuple(_codec.hex32(h, f"{what}.hashes[{i}]") for i, h in enumerate(hs)),
                   checkpoint=None if cp is None else _codec.string(cp, f"{what}.checkpoint"))

    def verify(self) -> None:
        verify_consistency(self.old_size, self.new_size, self.old_root, self.new_root, self.hashes)
