"""Fixed-point encoding of float rows into the ring Z_R, R = 2^32 or 2^64, for secure sums.

A value x becomes q = rint(clip(x, −clip, clip)·2^frac_bits) (round half to even), an
integer in [−Q, Q] with Q = rint(clip·2^frac_bits), stored as q mod R in numpy
``uint32`` / ``uint64``, whose array arithmetic wraps modulo R. A sum of m encodings
read back as a signed integer in [−R/2, R/2) is the exact sum of the q's as long as
m·Q < R/2; :func:`check_capacity` refuses anything else (for the usual
clip·2^frac_bits an integer, the condition is m·clip·2^frac_bits < R/2). Rounding moves
each value by at most 2^−frac_bits / 2, so a decoded sum of m rows is within
m·2^−(frac_bits+1) of the sum of the clipped floats, per coordinate.

Entries beyond ±clip are clipped, and :func:`encode` returns how many there were, so
the caller can report what clipping cost instead of losing it silently.
"""

from __future__ import annotations

import math

import numpy as np

from redteam.errors import InvalidParameter

__all__ = ["MODULUS_BITS", "DEFAULT_CLIP", "DEFAULT_FRAC_BITS", "ring_dtype", "check_capacity", "encode", "decode"]

#: Supported ring sizes R = 2^bits.
MODULUS_BITS = (32, 64)
#: Default clipping bound per coordinate: model deltas are well inside ±1.
DEFAULT_CLIP = 1.0
#: Default precision: steps of 2^−16 ≈ 1.5e−5; with clip 1, up to 32,767 rows fit R = 2^32.
DEFAULT_FRAC_BITS = 16


def ring_dtype(modulus_bits: int) -> type[np.unsignedinteger]:
    """``numpy.uint32`` for R = 2^32, ``numpy.uint64`` for R = 2^64."""
    if modulus_bits not in MODULUS_BITS:
        raise InvalidParameter(f"secure_sum: modulus_bits = {modulus_bits!r}: must be one of {MODULUS_BITS}")
    return np.uint32 if modulus_bits == 32 else np.uint64


def check_capacity(m: int, clip: float, frac_bits: int, modulus_bits: int) -> int:
    """Q = rint(clip·2^frac_bits), after checking that a sum of m rows cannot wrap: m·Q < R/2."""
    ring_dtype(modulus_bits)
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip <= 0:
        raise InvalidParameter(f"secure_sum: clip = {clip!r}: must be a finite number > 0")
    if type(frac_bits) is not int or not 0 <= frac_bits <= modulus_bits - 2:
        raise InvalidParameter(f"secure_sum: frac_bits = {frac_bits!r}: must be an integer in "
                               f"[0, {modulus_bits - 2}] for modulus_bits = {modulus_bits}")
    half = 2 ** (modulus_bits - 1)
    q = int(np.rint(math.ldexp(float(clip), frac_bits))) if clip < half else half
    if m * q >= half:
        larger = "modulus_bits = 64, " if modulus_bits == 32 else ""
        raise InvalidParameter(
            f"secure_sum: {m} rows × clip {clip} × 2^{frac_bits} = {m * q} ≥ R/2 = 2^{modulus_bits - 1}: "
            f"the decoded sum could wrap; use {larger}a smaller clip or fewer frac_bits")
    return q


def encode(rows: np.ndarray, clip: float, frac_bits: int, modulus_bits: int) -> tuple[np.ndarray, int]:
    """Ring elements for float rows, and how many entries exceeded ±clip (and were clipped)."""
    dt = ring_dtype(modulus_bits)
    clipped = int(np.count_nonzero(np.abs(rows) > clip))
    q = np.rint(np.ldexp(np.clip(rows.astype(np.float64), -clip, clip), frac_bits)).astype(np.int64)
    if modulus_bits == 64:
        return q.view(np.uint64), clipped  # two's complement: q mod 2^64
    return (q & 0xFFFFFFFF).astype(dt), clipped  # q mod 2^32


def decode(field: np.ndarray, frac_bits: int, modulus_bits: int) -> np.ndarray:
    """Ring elements read as signed fixed-point values in [−R/2, R/2)·2^−frac_bits (float64)."""
    ring_dtype(modulus_bits)
    signed = field.view(np.int64 if modulus_bits == 64 else np.int32)
    return np.ldexp(signed.astype(np.float64), -frac_bits)
