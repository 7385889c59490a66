"""Adversarial review of the issue-13 speed work: nothing traded for speed.

Each test here runs a fast lane against an oracle that cannot take it:

* the float32 pairwise kernel's halving sum: the number of float32 roundings on any
  entry's way through :func:`defenses._pairwise._tree_sum`, counted by running the real
  function on counting objects, against the ``TREE_DEPTH`` folded into ``KAPPA``; and the
  bound itself on inputs built to make float32 partial sums cancel, for every group size
  (odd ones included), against float64 difference rows;
* the wire: ``Network.transmit`` with no hook and the builders' memory (remembered texts
  and manifests, the direct lane, the batched landing) against the same call through a
  do-nothing hook with that memory emptied, on headers and manifests an attacker can
  send without a hook: last round's texts (still remembered), texts for another parent,
  for another payload, for another client.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import defenses._pairwise as pw
from redteam.transport import chunking
from redteam.transport.chunking import build_manifests, new_nonces

PARENT = "ab" * 32
OTHER_PARENT = "cd" * 32


# -- the pairwise kernel -----------------------------------------------------------------------

class _Roundings:
    """A stand-in for one float32 entry: each addition is one rounding on the way of every
    term it contains, so the sum's count is the most roundings any term went through."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count

    def __add__(self, other: _Roundings) -> _Roundings:
        return _Roundings(max(self.count, other.count) + 1)

    def to(self, *_: object) -> _Roundings:
        return self


def test_halving_sum_rounds_each_term_at_most_tree_depth_times():
    # _tree_sum halves m partial sums per level (floor(log2 m) levels); position 0 also
    # takes the odd one out at a level with an odd count, so it can round twice per level.
    # By hand: m = 3 -> [a+b, c] -> (a+b)+c: 2 roundings; m = 255 (odd at every level:
    # 255, 127, 63, 31, 15, 7, 3) -> 2 per level x 7 levels = 14; m = 256 (never odd) -> 8.
    # Every m the kernel can batch (1 .. GROUP, _group's range) must stay within TREE_DEPTH.
    want = {1: 0, 2: 1, 3: 2, 4: 2, 7: 4, 255: 14, 256: 8}
    seen = {}
    for m in range(1, pw.GROUP + 1):
        terms = np.empty(m, dtype=object)
        terms[:] = [_Roundings(0) for _ in range(m)]
        seen[m] = pw._tree_sum(terms).count
    assert {m: seen[m] for m in want} == want
    assert max(seen.values()) <= pw.TREE_DEPTH
    assert {pw._group(n) for n in (1, 2, 10, 100, 323, 1000, 5000)} <= set(range(1, pw.GROUP + 1))
    # KAPPA carries gamma_TREE_DEPTH (a few u32 on top of gamma_256): the tree is not free
    gamma = lambda k: k * 2.0 ** -24 / (1 - k * 2.0 ** -24)
    assert pw.KAPPA >= 1.5 * (gamma(pw.BLOCK) + gamma(pw.TREE_DEPTH))


def _exact(x: torch.Tensor) -> torch.Tensor:
    # squared distances from float64 difference rows: each difference of two float32
    # values is exact in float64, the sum of non-negative squares is within (d+2)·2⁻⁵³
    x64 = x.to(torch.float64)
    return torch.stack([(x64 - x64[i]).square().sum(dim=1) for i in range(x.shape[0])])


def _adversarial_rows(kind: str, n: int, nb: int, tail: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    d = pw.BLOCK * nb + tail
    if kind == "cancel":
        # block k scaled by 1e6 or 1e-6 in turn, with a sign flipping per block between rows:
        # the float32 halving sum of Gᵢⱼ adds ±1e12-sized block products that cancel, and
        # the small blocks are lost in the partial sums (what the bound must cover)
        scale = torch.tensor([1e6 if k % 2 else 1e-6 for k in range(nb)], dtype=torch.float64)
        sign = torch.tensor([(-1.0) ** k for k in range(nb)], dtype=torch.float64)
        scale = torch.cat([scale.repeat_interleave(pw.BLOCK), torch.ones(tail, dtype=torch.float64)])
        sign = torch.cat([sign.repeat_interleave(pw.BLOCK), torch.ones(tail, dtype=torch.float64)])
        base = torch.rand(d, generator=g, dtype=torch.float64) + 0.5
        rows = [base * scale, base * scale * sign, -base * scale * sign, base * scale * (1 + 1e-7)]
        x = torch.stack((rows * n)[:n])
    elif kind == "alie":  # near copies of one large row: small distances under a large mean
        base = torch.randn(d, generator=g, dtype=torch.float64) * 1e3
        x = base + torch.randn(n, d, generator=g, dtype=torch.float64) * 1e-3
    else:  # "rounding": float32 values with 20 random low bits: every product rounds
        mant = 1 + torch.randint(0, 2 ** 20, (n, d), generator=g).to(torch.float64) * 2.0 ** -23
        x = mant * torch.where(torch.rand(n, d, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return x.to(torch.float32)


@settings(max_examples=40, deadline=None)
@given(group=st.sampled_from([1, 2, 3, 5, 7, 13, 31, 255, 256]), centre=st.booleans(),
       kind=st.sampled_from(["cancel", "alie", "rounding"]), n=st.integers(2, 5), calls=st.integers(1, 2),
       tail=st.sampled_from([0, 7]), seed=st.integers(0, 2 ** 16))
def test_float32_bound_holds_for_every_group_size_on_cancelling_blocks(group, centre, kind, n, calls, tail, seed):
    # the group size and the centring choice fixed by hand (both only change speed), so each
    # odd count and the uncentred branch are reached; |D̂ − D| ≤ E must hold against the
    # float64 difference rows (up to their own (d+3)·2⁻⁵³ relative rounding)
    nb = group * calls + (1 if group > 1 else 0)  # a short last call as well
    x = _adversarial_rows(kind, n, nb, tail, seed)
    saved = pw._group, pw._worth_centring
    pw._group, pw._worth_centring = (lambda _n: group), (lambda _x: centre)
    try:
        pd = pw.pairwise(x)
        gram, gerr = pw.gram(x)
    finally:
        pw._group, pw._worth_centring = saved
    d = x.shape[1]
    exact = _exact(x)
    assert bool(pd.finite.all()) and bool(torch.isfinite(pd.approx).all())
    assert bool(((pd.approx - exact).abs() <= pd.error + exact * (d + 3) * 2.0 ** -53).all())
    x64 = x.to(torch.float64)
    slack = (x64.abs() @ x64.abs().T) * d * 2.0 ** -53
    assert bool(((gram - x64 @ x64.T).abs() <= gerr + slack).all())


def test_float64_recentre_buffer_is_never_the_callers_rows():
    # recentred() copies each block of rows into one reused float64 buffer and subtracts the
    # centre row there: float64 rows given by the caller must come back untouched, and the
    # refined distances must be the exact ones (small integers: every value exact)
    x = torch.tensor([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [6.0, 8.0, 0.0]], dtype=torch.float64)
    x = torch.cat([x, torch.zeros(4, pw.RECENTRE_STEP + 5, dtype=torch.float64)], dim=1)  # two blocks
    before = x.clone()
    pd = pw.pairwise(x).recentred(0)
    assert torch.equal(x, before) and pd.rows.data_ptr() == x.data_ptr()
    # by hand: |r1|² = 25, |r2|² = 3, |r3|² = 100, |r1−r2|² = 4+9+1 = 14, |r1−r3|² = 25, |r2−r3|² = 25+49+1 = 75
    want = torch.tensor([[0, 25, 3, 100], [25, 0, 14, 25], [3, 14, 0, 75], [100, 25, 75, 0]], dtype=torch.float64)
    assert bool(((pd.approx - want).abs() <= pd.error).all()) and float(pd.error.max()) < 1e-9
    sub = pw.pairwise(x).recentred(2, torch.tensor([1, 3]))  # the candidates-only pass
    assert torch.equal(x, before)
    assert bool(((sub.approx[[1, 3]] - want[[1, 3]]).abs() <= sub.error[[1, 3]]).all())


# -- the wire ------------------------------------------------------------------------------------

def _identity(deliveries):
    return list(deliveries)


FAULTS = ["ok"] * 5 + ["replay", "parent", "payload", "swap", "withhold", "corrupt"]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    chunk_size=st.sampled_from([16, 64]),
    loss=st.sampled_from([0.0, 0.3]),
    relay=st.sampled_from([0.0, 0.5]),
    retries=st.integers(0, 2),
    deadline=st.sampled_from([None, 0.5, 0.0704]),
    faults=st.lists(st.sampled_from(FAULTS), min_size=6, max_size=6),
    limit=st.sampled_from([None, 30, 0]),
    headers_on=st.booleans(),
    seed=st.integers(0, 2 ** 16),
)
def test_transmit_lanes_equal_the_general_path_without_the_builders_memory(
        sizes, chunk_size, loss, relay, retries, deadline, faults, limit, headers_on, seed):
    # Every text and manifest below is a builder's (so remembered), but for another round,
    # parent, payload or client than the one it is sent for: the lanes that trust the memory
    # must check round, client, parent and size exactly as the full parse does, and give the
    # same payloads, drops, reasons, detections, times and byte counts.
    from redteam.transport import Network, NetworkConfig

    n = len(sizes)
    clients = list(range(n))
    nonces = new_nonces(np.random.default_rng(seed), n)
    pays = [bytes((7 * c + j) % 256 for j in range(s)) for c, s in enumerate(sizes)]
    other = [p + b"!" for p in pays]
    saved_recent, saved_keep = chunking._RECENT, chunking._Recent.KEEP
    chunking._Recent.KEEP = 8  # remember every batch below (two are kept in a run)
    chunking._RECENT = chunking._Recent()
    try:
        kw = {"clients": clients, "codec": "none()", "chunk_size": chunk_size, "nonces": nonces}
        prev, prev_t = build_manifests(pays, round=2, parent_digest=PARENT, **kw)
        stale, stale_t = build_manifests(pays, round=3, parent_digest=OTHER_PARENT, **kw)
        alt, alt_t = build_manifests(other, round=3, parent_digest=PARENT, **kw)
        built, texts = build_manifests(pays, round=3, parent_digest=PARENT, **kw)
        uploads = {c: (m, list(ch)) for c, (m, ch) in zip(clients, built)}
        headers = dict(zip(clients, texts))
        for c, fault in zip(clients, faults):
            m, chunks = uploads[c]
            swap = (c + 1) % n
            pick = {"replay": (prev[c][0], prev_t[c]), "parent": (stale[c][0], stale_t[c]),
                    "payload": (alt[c][0], alt_t[c]), "swap": (built[swap][0], texts[swap])}.get(fault)
            if pick is not None:  # the header (or, without headers, the manifest) is replaced
                if headers_on:
                    headers[c] = pick[1]
                else:
                    uploads[c] = (pick[0], chunks)
            elif fault == "withhold":
                uploads[c] = (m, chunks[:-1])
            elif fault == "corrupt" and chunks[0]:
                uploads[c] = (m, [bytes([chunks[0][0] ^ 1]) + chunks[0][1:], *chunks[1:]])
        cfg = NetworkConfig(loss=loss, relay_fraction=relay, retries=retries, deadline_s=deadline,
                            bandwidth_sigma=0.0, latency_sigma=0.0, compute_sigma=0.0)
        net = Network(cfg, n, np.random.default_rng(seed))

        def run(hook):
            return net.transmit(3, uploads, 2, np.random.default_rng(seed + 1), hook, parent_digest=PARENT,
                                headers=headers if headers_on else None, max_payload_len=limit)

        lane = run(None)
        assert chunking.known_text(texts[0]) is built[0][0]  # the lane had the memory
        chunking._RECENT = chunking._Recent()  # forgotten: every manifest and text checked in full
        general = run(_identity)
    finally:
        chunking._RECENT, chunking._Recent.KEEP = saved_recent, saved_keep
    assert lane == general
    for c, fault in zip(clients, faults):  # the faults the memory could have hidden are named
        if fault in ("replay", "parent", "swap") and c not in general.dropped and n > 1:
            raise AssertionError(f"client {c} ({fault}) was not dropped: {general}")


def test_replayed_builder_header_is_dropped_with_the_full_parsers_reason():
    # By hand: client 0's header from round 2 (still remembered: two batches are kept) is sent
    # in round 3. The full parse reads round 2, so default_open refuses it: "manifest is for
    # round 2, this is round 3". The lane must say exactly that, and keep client 1.
    from redteam.transport import Network, NetworkConfig

    kw = {"clients": [0, 1], "codec": "none()", "chunk_size": 64, "nonces": ["0f" * 16, "1e" * 16]}
    _, old_texts = build_manifests([b"abc", b"de"], round=2, parent_digest=PARENT, **kw)
    built, texts = build_manifests([b"abc", b"de"], round=3, parent_digest=PARENT, **kw)
    assert chunking.known_text(old_texts[0]) is not None  # the replay is a remembered text
    net = Network(NetworkConfig(bandwidth_sigma=0.0, latency_sigma=0.0, compute_sigma=0.0), 2,
                  np.random.default_rng(0))
    uploads = {c: (m, ch) for c, (m, ch) in enumerate(built)}
    res = net.transmit(3, uploads, 1, np.random.default_rng(1), parent_digest=PARENT,
                       headers={0: old_texts[0], 1: texts[1]})
    assert res.dropped == {0: "bad header: manifest is for round 2, this is round 3 (direct from the author)"}
    assert res.payloads == {1: b"de"} and math.isfinite(res.round_time_s)
    assert dataclasses.asdict(res.manifests[1]) == dataclasses.asdict(built[1][0])


# -- reduced-precision float32 matmul modes -----------------------------------------------------

def _tf32(t: torch.Tensor) -> torch.Tensor:
    # TF32 keeps 10 of float32's 23 mantissa bits (round to nearest even on the 13 dropped)
    bits = t.contiguous().view(torch.int32)
    rounded = (bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF
    return rounded.view(torch.float32)


def test_reduced_precision_matmul_mode_does_not_void_the_float32_bound(monkeypatch):
    # torch.set_float32_matmul_precision("high") (TF32 on CUDA; "medium": bf16 on oneDNN
    # CPUs) lets float32 matmuls round their inputs to 10 (or 7) mantissa bits: a product is
    # then off by ~2⁻¹¹ of its size, ~30x the KAPPA the bound assumes. By hand: rows ±v with
    # every vᵢ = 1 + 2⁻¹² (exact in float32, 1 in TF32), d = 515: the centred rows are ±v
    # (mean 0), D = ‖2v‖² = 4·515·(1 + 2⁻¹²)² ≈ 2061.006; TF32 products give 4·515 = 2060,
    # an error of ≈ 1.0 while E = KAPPA·(2‖v‖)² ≈ 2.5e-5·2061 ≈ 0.05. With such a mode on,
    # the kernel must not use float32 products: the bound has to hold whatever the mode.
    # The hardware rounding is simulated (this machine has no TF32 unit): torch.bmm and
    # torch.matmul on float32 round their inputs as TF32 does while the mode is set.
    real_bmm, real_mm = torch.bmm, torch.Tensor.__matmul__

    def bmm(a, b, *args, **kw):
        if a.dtype == torch.float32:
            a, b = _tf32(a), _tf32(b)
        return real_bmm(a, b, *args, **kw)

    def mm(a, b):
        if a.dtype == torch.float32:
            a, b = _tf32(a), _tf32(b)
        return real_mm(a, b)

    assert float(_tf32(torch.tensor([1 + 2.0 ** -12]))) == 1.0 and float(_tf32(torch.tensor([1.5]))) == 1.5
    v = torch.full((2 * pw.BLOCK + 3,), 1 + 2.0 ** -12)
    x = torch.stack([v, -v])
    want = float((2 * x[0].double()).square().sum())
    prev = torch.get_float32_matmul_precision()
    assert prev == "highest" and pw._float32_products_ieee(x.device)  # the default: the float32 lane
    monkeypatch.setattr(torch, "bmm", bmm)
    monkeypatch.setattr(torch.Tensor, "__matmul__", mm)
    torch.set_float32_matmul_precision("high")
    try:
        assert not pw._float32_products_ieee(x.device)
        pd = pw.pairwise(x)
        g, gerr = pw.gram(x)
    finally:
        torch.set_float32_matmul_precision(prev)
    assert abs(float(pd.approx[0, 1]) - want) <= float(pd.error[0, 1])
    exact = x.double() @ x.double().T
    assert bool(((g - exact).abs() <= gerr).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (real TF32 products)")
def test_tf32_on_cuda_keeps_the_bound():
    # the example above on real TF32 hardware: allow_tf32 on, the bound must still hold
    v = torch.full((2 * pw.BLOCK + 3,), 1 + 2.0 ** -12)
    x = torch.stack([v, -v]).cuda()
    want = float((2 * v.double()).square().sum())
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        pd = pw.pairwise(x)
        g, gerr = pw.gram(x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    assert abs(float(pd.approx[0, 1]) - want) <= float(pd.error[0, 1])
    exact = x.double() @ x.double().T
    assert bool(((g - exact).abs() <= gerr).all())
