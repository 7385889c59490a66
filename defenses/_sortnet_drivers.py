"""The compiled drivers of ``defenses/_sortnet.py`` (numba; importing this module needs numba).

They take float data as integer keys (see ``_sortnet``'s docstring), tiles of ``W`` = 64 columns,
and the network's fixed pieces from ``_sortnet_kernels``. Unsigned indices throughout: numba adds
no wrap-around test for negative indices, which would stop LLVM from vectorizing the loops.
"""

import numpy as np

from . import _sortnet_kernels as K
from ._numba_cache import njit

U = np.uint64
W = K.W


@njit(nogil=True, boundscheck=False, cache=True)
def _cascade(buf, g, base, up):
    if g == U(2):
        if up:
            K.cascade2_up(buf, base)
        else:
            K.cascade2_down(buf, base)
    elif g == U(4):
        if up:
            K.cascade4_up(buf, base)
        else:
            K.cascade4_down(buf, base)
    elif g == U(8):
        if up:
            K.cascade8_up(buf, base)
        else:
            K.cascade8_down(buf, base)
    elif up:
        K.cascade16_up(buf, base)
    else:
        K.cascade16_down(buf, base)

@njit(nogil=True, boundscheck=False, cache=True)
def _network(buf, real, nb, last):
    """Sort the tile ascending: ``real`` blocks of 16 rows, blocks real … nb − 1 +inf and left
    alone; in the last merge only the blocks flagged in ``last`` get the final four layers."""
    B = U(16) * W
    q = U(0)
    while q < real:
        if (real - U(1) - q) % U(2) == U(0):
            K.sort16_up(buf, q * B)
        else:
            K.sort16_down(buf, q * B)
        q += U(1)
    g = U(2)
    while g <= nb:
        top = (real - U(1)) // g  # the group holding the last real block merges ascending
        q = U(0)
        while q <= top:
            up = (top - q) % U(2) == U(0)
            _cascade(buf, g, q * g * B, up)
            m = q * g
            while m < min(q * g + g, real):
                if g < nb or last[m]:
                    if up:
                        K.clean16_up(buf, m * B)
                    else:
                        K.clean16_down(buf, m * B)
                m += U(1)
            q += U(1)
        g *= U(2)

@njit(nogil=True, boundscheck=False, cache=True)
def _fill(bufs, nb, inf):
    i = U(0)
    while i < bufs.shape[0]:
        bufs[i] = inf
        i += U(1)

@njit(nogil=True, boundscheck=False, cache=True)
def _load(x, idx, d, c0, wide, bufs, T, real, mag, inf):
    """Keys of columns c0 … c0 + wide − 1 into the tiles (64 columns each); rows n … of the
    last real block +inf."""
    n = U(idx.shape[0])
    r = U(0)
    while r < real * U(16):
        s = U(0)
        while s * W < wide:
            w = min(W, wide - s * W)
            dst = s * T + r * W
            j = U(0)
            if r < n:
                src = idx[r] * d + c0 + s * W
                while j < w:
                    v = x[src + j]
                    kv = v ^ mag if v < 0 else v
                    bufs[dst + j] = inf if (v & mag) > inf else kv
                    j += U(1)
            while j < W:
                bufs[dst + j] = inf
                j += U(1)
            s += U(1)
        r += U(1)


@njit(nogil=True, boundscheck=False, cache=True)
def _to_bits(bufs, base, lo, hi, mag):
    """Rows lo … hi − 1 of the tile at ``base``: keys back to float bits, in place (the key map
    is its own inverse)."""
    r = lo
    while r < hi:
        j = U(0)
        while j < W:
            kv = bufs[base + r * W + j]
            bufs[base + r * W + j] = kv ^ mag if kv < 0 else kv
            j += U(1)
        r += U(1)


@njit(nogil=True, boundscheck=False, cache=True)
def order_stats(x, idx, d, ranks, last, out, out_stride, origin, start, stop, bufs, nb, mag, inf):
    """Columns start … stop − 1 of the rows ``idx`` of ``x`` (keys, flat, rows of d): row q of
    ``out`` (flat, rows of ``out_stride``, column c at c − ``origin``) ← every column's
    ``ranks[q]``-th smallest value, as float bits. ``last``: the blocks the last merge finishes
    (those holding the ranks)."""
    real = (U(idx.shape[0]) + U(15)) // U(16)
    T = nb * U(16) * W
    S = U(bufs.shape[0]) // T
    _fill(bufs, nb, inf)
    c0 = start
    while c0 < stop:
        wide = min(S * W, stop - c0)
        _load(x, idx, d, c0, wide, bufs, T, real, mag, inf)
        s = U(0)
        while s * W < wide:
            w = min(W, wide - s * W)
            buf = bufs[s * T:(s + U(1)) * T]
            _network(buf, real, nb, last)
            q = U(0)
            while q < U(ranks.shape[0]):
                src = ranks[q] * W
                dst = q * out_stride + c0 + s * W - origin
                j = U(0)
                while j < w:
                    kv = buf[src + j]
                    out[dst + j] = kv ^ mag if kv < 0 else kv
                    j += U(1)
                q += U(1)
            s += U(1)
        c0 += S * W


@njit(nogil=True, boundscheck=False, cache=True)
def trimmed32(x, idx, d, b, means, settled, start, stop, bufs, fbufs, nb, slack, last):
    """Per column: the float64 sum of the values of ranks b … n − 1 − b; the mean as float32;
    settled as ``defenses._common.trimmed_means32`` defines it (its test holds for any order
    of the additions). Only the blocks holding ranks b and n − 1 − b are flagged in ``last``:
    after the last merge's block layers every block holds exactly the values of its 16 ranks,
    so the others need not be sorted inside to be summed."""
    mag = np.int32(0x7FFFFFFF)
    inf = np.int32(0x7F800000)
    n = U(idx.shape[0])
    real = (n + U(15)) // U(16)
    T = nb * U(16) * W
    S = U(bufs.shape[0]) // T
    keep = n - U(2) * b
    acc = np.empty(64, dtype=np.float64)
    mean32 = np.empty(64, dtype=np.float32)
    low = np.empty(64, dtype=np.float32)
    high = np.empty(64, dtype=np.float32)
    low_bits = low.view(np.int32)
    high_bits = high.view(np.int32)
    finite = np.empty(64, dtype=np.bool_)
    tiny = 8.0 * 2.0 ** -53
    _fill(bufs, nb, inf)
    c0 = start
    while c0 < stop:
        wide = min(S * W, stop - c0)
        _load(x, idx, d, c0, wide, bufs, T, real, mag, inf)
        s = U(0)
        while s * W < wide:
            w = min(W, wide - s * W)
            base = s * T
            _network(bufs[base:base + T], real, nb, last)
            _to_bits(bufs, base, b, n - b, mag)  # the kept ranks, in place
            j = U(0)
            while j < W:
                acc[j] = 0.0
                j += U(1)
            r = b
            while r < n - b:
                j = U(0)
                while j < W:
                    acc[j] += np.float64(fbufs[base + r * W + j])
                    j += U(1)
                r += U(1)
            # per column, in loops without branches (vectorized): the mean, and the ends of the
            # interval that must round to one float32, compared by their bits
            j = U(0)
            while j < W:
                mean = (acc[j] + 0.0) / np.float64(keep)  # a zero sum is +0.0, as the halves' sums give
                mean32[j] = np.float32(mean)
                big = np.float64(max(abs(fbufs[base + b * W + j]), abs(fbufs[base + (n - U(1) - b) * W + j])))
                reach = abs(mean) * tiny + slack * big
                low[j] = np.float32(mean - reach)
                high[j] = np.float32(mean + reach)
                finite[j] = big < np.inf
                j += U(1)
            j = U(0)
            while j < w:
                c = c0 + s * W + j
                means[c] = mean32[j]
                settled[c] = finite[j] & (low_bits[j] == high_bits[j])
                j += U(1)
            s += U(1)
        c0 += S * W


@njit(nogil=True, boundscheck=False, cache=True)
def bulyan32(x, idx, d, beta, out, flags, start, stop, bufs, fbufs, nb, chunk):
    """Bulyan's coordinate phase (``defenses.krum._closest_to_median_mean``) on float32 ``x``:
    per column of the θ rows ``idx`` sorted, the mean of the β consecutive values whose farther
    end is nearest the median (the first such window on ties), written to ``out`` as float32.

    The median and the windows' spreads are float32 operations in torch's order, so the window
    is torch's; the window's sum is float64. Per chunk of ``chunk`` columns
    (column c in chunk (c − start) // chunk), flags[k, 0] = 1: a spread is not finite (torch
    then compares in float64: the caller must take torch's path for the chunk);
    flags[k, 1] = 1: a column's mean is not settled (its float32 bits could depend on the order of
    the float64 sum: any order's error is at most (β − 1)·2⁻⁵³·Σ|v| ≤ β²·2⁻⁵³·M, M the larger end
    of the window, so the column is settled when m ± (4β·2⁻⁵³·M + 4·2⁻⁵³·|m|) round to the same
    float32, or when every order's sum is exact, as ``defenses._common.trimmed_means32`` tests)."""
    mag = np.int32(0x7FFFFFFF)
    inf = np.int32(0x7F800000)
    half = np.float32(0.5)
    eps = 2.0 ** -53
    n = U(idx.shape[0])
    real = (n + U(15)) // U(16)
    T = nb * U(16) * W
    S = U(bufs.shape[0]) // T
    last = np.ones(nb, dtype=np.bool_)
    mid = n // U(2)
    span = n - beta + U(1)
    med = np.empty(64, dtype=np.float32)
    best = np.empty(64, dtype=np.float32)
    first = np.zeros(64, dtype=np.uint64)
    bad = np.empty(64, dtype=np.bool_)
    total = np.empty(64, dtype=np.float64)
    big = np.empty(64, dtype=np.float64)
    small = np.empty(64, dtype=np.float64)
    out32 = np.empty(64, dtype=np.float32)
    low = np.empty(64, dtype=np.float32)
    high = np.empty(64, dtype=np.float32)
    low_bits = low.view(np.int32)
    high_bits = high.view(np.int32)
    exact = np.empty(64, dtype=np.bool_)
    _fill(bufs, nb, inf)
    c0 = start
    while c0 < stop:
        wide = min(S * W, stop - c0)
        _load(x, idx, d, c0, wide, bufs, T, real, mag, inf)
        s = U(0)
        while s * W < wide:
            w = min(W, wide - s * W)
            base = s * T
            _network(bufs[base:base + T], real, nb, last)
            _to_bits(bufs, base, U(0), n, mag)
            # per column, vectorized across the tile's 64 columns (loops over rows outside,
            # branch-free selects inside): the median, the first window of least spread, the
            # window's float64 sum (the other rows add +0.0, exactly), its largest and smallest
            # nonzero magnitude, and the settle tests
            j = U(0)
            while j < W:
                if n % U(2) == U(1):
                    med[j] = fbufs[base + mid * W + j]
                else:
                    med[j] = half * fbufs[base + (mid - U(1)) * W + j] + half * fbufs[base + mid * W + j]
                bad[j] = False
                j += U(1)
            i = U(0)
            while i < span:
                lo_row = base + i * W
                hi_row = base + (i + beta - U(1)) * W
                j = U(0)
                while j < W:
                    below = med[j] - fbufs[lo_row + j]
                    above = fbufs[hi_row + j] - med[j]
                    bad[j] = bad[j] | (not (abs(below) < np.float32(np.inf) and abs(above) < np.float32(np.inf)))
                    spread = below if below > above else above
                    better = (i == U(0)) | (spread < best[j])
                    best[j] = spread if better else best[j]
                    first[j] = i if better else first[j]
                    j += U(1)
                i += U(1)
            j = U(0)
            while j < W:
                total[j] = 0.0
                big[j] = 0.0
                small[j] = np.inf
                j += U(1)
            r = U(0)
            while r < n:
                row = base + r * W
                j = U(0)
                while j < W:
                    v = np.float64(fbufs[row + j])
                    inside = (r >= first[j]) & (r < first[j] + beta)
                    total[j] += v if inside else 0.0
                    size = abs(v)
                    big[j] = size if inside and size > big[j] else big[j]
                    small[j] = size if inside and size != 0.0 and size < small[j] else small[j]
                    j += U(1)
                r += U(1)
            j = U(0)
            while j < W:
                mean = total[j] / np.float64(beta)
                out32[j] = np.float32(mean)
                reach = 4.0 * np.float64(beta) * eps * big[j] + 4.0 * eps * abs(mean)
                low[j] = np.float32(mean - reach)
                high[j] = np.float32(mean + reach)
                # or the sum is exact in any order: every value a multiple of 2^u > smallest·2⁻²⁴,
                # every partial sum ≤ β·big ≤ smallest·2²⁸ < 2^(u+53) (a mean at a float32 midpoint:
                # β values of the mean's own size sum exactly, and m = S/β is then a tie)
                exact[j] = big[j] * np.float64(beta) <= small[j] * 2.0 ** 28
                j += U(1)
            k = (c0 + s * W - start) // chunk  # a strip lies in one chunk (chunks are multiples of 64)
            j = U(0)
            while j < w:
                out[c0 + s * W + j] = out32[j]
                if bad[j]:
                    flags[k, 0] = 1  # torch.maximum would give NaN or inf: its float64 branch
                if not (big[j] < np.inf and (low_bits[j] == high_bits[j] or exact[j])):
                    flags[k, 1] = 1
                j += U(1)
            s += U(1)
        c0 += S * W
