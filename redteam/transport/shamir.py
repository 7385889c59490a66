"""Shamir t-of-n secret sharing over a prime field, for secure aggregation's key shares.

Shamir, "How to Share a Secret", CACM 22(11), 1979: a secret s ∈ F_p is the constant
term of a polynomial f of degree t − 1 whose other t − 1 coefficients are uniform in
F_p; party i (x = 1 … n) holds f(i). Any t points determine f and so s = f(0)
(Lagrange interpolation at 0); any t − 1 points are uniformly distributed whatever s
is, so they carry no information about it (for every candidate s′ exactly one
polynomial of degree ≤ t − 1 passes through (0, s′) and the t − 1 points).

The field is fixed: :data:`FIELD_PRIME` = 2^521 − 1, the Mersenne prime M521, larger
than every secret secure aggregation shares (32-byte X25519 private keys and 32-byte
mask seeds, both < 2^256). Every function takes ``prime`` so that tests can enumerate
a tiny field; nothing else should change it.

Coefficients come from a caller-supplied byte stream (:class:`ByteStream`), drawn
uniformly from [0, p) by rejection sampling of ``bits(p)``-bit draws, so a seeded run
is reproducible. Arithmetic is Python integers: n·t multiplications per secret.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from redteam.errors import InvalidParameter

__all__ = ["FIELD_PRIME", "ByteStream", "field_element", "evaluate", "split", "reconstruct"]

#: The Mersenne prime 2^521 − 1 (M521): every share and secret is an element of F_p.
FIELD_PRIME = 2**521 - 1


class ByteStream(Protocol):
    """Anything with ``read(n) -> bytes`` giving n fresh (pseudo)random bytes."""

    def read(self, n: int) -> bytes: ...


def field_element(stream: ByteStream, prime: int = FIELD_PRIME) -> int:
    """A uniform element of [0, prime), by rejection sampling of ``prime.bit_length()``-bit draws."""
    bits = prime.bit_length()
    nbytes = (bits + 7) // 8
    excess = 8 * nbytes - bits
    while True:
        v = int.from_bytes(stream.read(nbytes), "big") >> excess
        if v < prime:
            return v


def evaluate(coefficients: Sequence[int], x: int, prime: int = FIELD_PRIME) -> int:
    """f(x) mod prime for f(z) = Σ_k coefficients[k]·z^k (Horner's rule)."""
    acc = 0
    for c in reversed(coefficients):
        acc = (acc * x + c) % prime
    return acc


def _check_tn(t: int, n: int, prime: int) -> None:
    if type(n) is not int or n < 1:
        raise InvalidParameter(f"shamir: n = {n!r}: must be an integer ≥ 1")
    if type(t) is not int or not 1 <= t <= n:
        raise InvalidParameter(f"shamir: t = {t!r}: must be an integer with 1 ≤ t ≤ n (n = {n})")
    if n >= prime:
        raise InvalidParameter(f"shamir: n = {n}: needs n < prime = {prime} distinct non-zero points")


def split(secret: int, n: int, t: int, stream: ByteStream, *, prime: int = FIELD_PRIME) -> tuple[int, ...]:
    """The n shares f(1), …, f(n) of ``secret`` (share i belongs to party i, x = i)."""
    _check_tn(t, n, prime)
    if type(secret) is not int or not 0 <= secret < prime:
        raise InvalidParameter(f"shamir: secret must be an integer in [0, prime); got {type(secret).__name__}")
    coefficients = [secret] + [field_element(stream, prime) for _ in range(t - 1)]
    return tuple(evaluate(coefficients, x, prime) for x in range(1, n + 1))


def reconstruct(points: Sequence[tuple[int, int]], t: int, *, prime: int = FIELD_PRIME) -> int:
    """f(0) from at least ``t`` points (x, f(x)) with distinct non-zero x; uses the first t.

    Fewer than t points is refused: t − 1 shares are consistent with every secret, so
    interpolating them would return a value unrelated to it.
    """
    if type(t) is not int or t < 1:
        raise InvalidParameter(f"shamir: t = {t!r}: must be an integer ≥ 1")
    if len(points) < t:
        raise InvalidParameter(f"shamir: {len(points)} share(s) given, threshold t = {t} needed to reconstruct")
    pts = list(points[:t])
    xs = [x for x, _ in pts]
    if len(set(xs)) != t or any(type(x) is not int or not 0 < x < prime for x in xs):
        raise InvalidParameter(f"shamir: share x-coordinates {xs}: must be distinct integers in [1, prime)")
    secret = 0
    for i, (xi, yi) in enumerate(pts):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % prime
                den = den * (xj - xi) % prime
        secret = (secret + yi * num * pow(den, -1, prime)) % prime
    return secret
