"""Issue 25 §2 and §4: spot-check replay of a PoL log, the tolerance across thread counts,
bisection to the first divergent step, and the cheats a log can hide."""

from __future__ import annotations

import math

import torch

from redteam.federation.replay import (PeerJob, bisect_divergence, first_divergence, measured_tolerance,
                                       replay_segment, spot_check, train_log)

TOL = 1e-4  # relative; the measured honest gap below is ≤ 1e-6 (float32, 1 vs 2 threads)


def _mlp():
    """A 64-32-10 MLP on flat parameters (the digits model's shape, smaller)."""
    d_in, h, k = 64, 32, 10
    sizes = [d_in * h, h, h * k, k]

    def loss(w, x, y):
        a, b, c, e = torch.split(w, sizes)
        z = torch.relu(x @ a.view(d_in, h) + b) @ c.view(h, k) + e
        return torch.nn.functional.cross_entropy(z, y)

    return loss, sum(sizes)


def _job(steps=16, every=1, seed=7):
    loss, d = _mlp()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 64, generator=g)
    y = (x[:, :10].argmax(1))
    return loss, PeerJob(w0=0.1 * torch.randn(d, generator=g), x=x, y=y, seed=seed, steps=steps, batch=16, lr=0.1,
                         every=every)


def test_linear_replay_by_hand():
    # L(w) = ½‖w‖² on any batch: ∇ = w, so w_t = (1 − η)^t w₀ exactly; η = 0.5, w₀ = 8 → 4, 2, 1
    job = PeerJob(w0=torch.tensor([8.0]), x=torch.zeros(4, 1), y=torch.zeros(4), seed=0, steps=3, batch=2, lr=0.5)
    log = train_log(lambda w, x, y: 0.5 * (w * w).sum(), job)
    assert [float(v) for v in log] == [8.0, 4.0, 2.0, 1.0]
    ok, gap, cost = replay_segment(lambda w, x, y: 0.5 * (w * w).sum(), job, log, 1, 0.0)
    assert ok and gap == 0.0 and cost == 1
    # a lazy log skipping step 1 reads 8, 4, 4, 2: segment 1 (4 → 4) replays to 2: gap |2 − 4|/max(0, tiny) huge
    lazy = train_log(lambda w, x, y: 0.5 * (w * w).sum(), job, skip=frozenset({1}))
    assert [float(v) for v in lazy] == [8.0, 4.0, 4.0, 2.0]
    assert not replay_segment(lambda w, x, y: 0.5 * (w * w).sum(), job, lazy, 1, 0.1)[0]
    # the forward check: the verifier's states are 4, 2, 1; checkpoint 1 agrees (4), checkpoint 2
    # does not (2 vs 4): found after 2 replayed steps, and the replay stops there
    first, cost = first_divergence(lambda w, x, y: 0.5 * (w * w).sum(), job, lazy, 0.01)
    assert first == 2 and cost == 2
    # the dispute: prefix digests of [8, 4, 4, 2] and [8, 4, 2, 1] first differ at 2; the referee
    # replays step 1 from the agreed 4 (→ 2), and the claim (4) is the wrong one
    d = bisect_divergence(lambda w, x, y: 0.5 * (w * w).sum(), job, lazy, log, 0.01)
    assert (d.first, d.replayed, d.claimed_ok) == (2, 1, False)
    assert bisect_divergence(lambda w, x, y: 0.5 * (w * w).sum(), job, log, log, 0.01).first is None


def test_honest_replay_passes_across_thread_counts():
    loss, job = _job()
    gap = measured_tolerance(loss, job, (1, 2))
    assert gap <= 1e-5, gap  # measured 0 to ~1e-7 on this machine's CPU
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        log = train_log(loss, job)
        torch.set_num_threads(2)
        results = [replay_segment(loss, job, log, k, TOL) for k in range(job.steps)]
    finally:
        torch.set_num_threads(old)
    assert all(ok for ok, _, _ in results), max(g for _, g, _ in results)
    assert first_divergence(loss, job, log, TOL) == (None, job.steps)


def test_lazy_peer_found_at_its_first_skipped_step():
    loss, job = _job(steps=16, every=1)
    lazy = train_log(loss, job, skip=frozenset({5, 9, 12}))
    first, cost = first_divergence(loss, job, lazy, TOL)
    assert first == 6  # the checkpoint after step 5 (0-based), the first it skipped
    assert cost == 6  # the replay stops at the fault: never more than the training (1×)
    # the segment check catches it only where it samples a skipped segment
    assert not replay_segment(loss, job, lazy, 5, TOL)[0]
    assert replay_segment(loss, job, lazy, 4, TOL)[0]


def test_spliced_pol_segment_is_caught_when_sampled():
    # Zhang et al. (S&P 2022) style spoof: a log whose middle checkpoints are interpolated
    # between honest end points (no training between them) instead of computed
    loss, job = _job(steps=8, every=2)
    log = train_log(loss, job)
    forged = list(log)
    for i in (1, 2, 3):
        forged[i] = log[0] + (log[4] - log[0]) * (i / 4)
    verdicts = [replay_segment(loss, job, forged, k, TOL)[0] for k in range(4)]
    assert verdicts == [False, False, False, False]
    # the final state is honest, but the first forged checkpoint is found (a final-state bisection accepted it)
    assert first_divergence(loss, job, forged, TOL)[0] == 1


def test_replay_inside_the_tolerance_band_passes():
    # the band is the cheat's budget: each checkpoint nudged by half the tolerance still passes
    loss, job = _job(steps=8)
    log = train_log(loss, job)
    g = torch.Generator().manual_seed(1)
    nudged = [log[0]]
    for k in range(1, len(log)):
        step = float((log[k] - log[k - 1]).norm())
        noise = torch.randn(log[k].shape, generator=g)
        nudged.append(log[k] + 0.5 * TOL * step * noise / noise.norm())
    assert all(replay_segment(loss, job, nudged, k, TOL)[0] for k in range(job.steps))


def test_spot_checking_a_fraction_catches_a_lazy_peer_in_about_1_over_p_rounds():
    # a peer lazy every round is caught the first round it is sampled: geometric, mean 1/p
    for p in (0.1, 0.25, 0.5):
        g = torch.Generator().manual_seed(0)
        waits = []
        for _ in range(400):
            r = 1
            while 0 not in spot_check(1, p, g):
                r += 1
            waits.append(r)
        mean = sum(waits) / len(waits)
        se = math.sqrt((1 - p) / p ** 2 / len(waits))
        assert abs(mean - 1 / p) < 4 * se, (p, mean)


def test_pol_log_in_a_ledger_fixes_the_log_before_the_verifier_samples(tmp_path):
    """The peer signs each checkpoint into an RFC 6962 ledger as it trains; the verifier draws
    the segments to replay from the ledger's root. An honest log matches its digests and its
    sampled segments replay; a log rewritten after the draw (a sampled segment's end replaced by
    the verifier's own replay, so that it passes) no longer matches the ledger."""
    import subprocess
    import sys

    from redteam.federation.replay import (mismatched_checkpoints, read_pol_ledger, sample_segments,
                                           write_pol_ledger)

    loss, job = _job(steps=12, every=2)
    log = train_log(loss, job, skip=frozenset({5}))  # lazy: step 5 skipped, segment 2 diverges
    path = tmp_path / "pol.sqlite"
    assert write_pol_ledger(path, job, log, peer=3) == len(log) == 7
    out = subprocess.run([sys.executable, "-m", "redteam.cli", "ledger", "verify", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "ledger OK: 7 entries" in out.stdout, out.stdout + out.stderr
    logged, root = read_pol_ledger(path)
    assert [e["index"] for e in logged] == list(range(7)) and [e["step"] for e in logged] == [0, 2, 4, 6, 8, 10, 12]
    assert mismatched_checkpoints(log, logged, job) == []
    picks = sample_segments(root, 6, 6)
    assert picks == list(range(6)) and sample_segments(root, 6, 2) == sample_segments(root, 6, 2)
    assert not replay_segment(loss, job, log, 2, TOL)[0]  # the lazy segment fails its replay
    # the cheat rewrites checkpoint 3 to what an honest replay of segment 2 gives: segment 2 passes
    # now, but checkpoint 3 is not the one in the ledger (and segment 3 no longer starts from it)
    forged = list(log)
    from redteam.federation.replay import _run, _batches
    forged[3], _ = _run(loss, job, log[2], 4, 6, _batches(job))
    assert replay_segment(loss, job, forged, 2, TOL)[0]
    assert mismatched_checkpoints(forged, logged, job) == [3]
    # a log of another job (another seed) does not match its job digest anywhere
    other = PeerJob(job.w0, job.x, job.y, seed=8, steps=12, batch=16, lr=0.1, every=2)
    assert mismatched_checkpoints(log, logged, other) == list(range(7))


def _forge(log: list[torch.Tensor], at: tuple[int, ...]) -> list[torch.Tensor]:
    """``log`` with the checkpoints ``at`` replaced by a point off the trajectory."""
    out = list(log)
    for i in at:
        out[i] = log[i] + 0.5 * (log[i] - log[i - 1])
    return out


def test_the_first_bad_checkpoint_is_found_whatever_follows_it():
    # issue 33 §3, by hand: bad checkpoints at 5 and 64 → 5 (the former bisection reported 64);
    # only 5 bad and an honest final state → 5 (the former bisection accepted the log)
    loss, job = _job(steps=64, every=1)
    log = train_log(loss, job)
    for at in ((5, 64), (5,)):
        forged = _forge(log, at)
        first, cost = first_divergence(loss, job, forged, TOL)
        assert (first, cost) == (5, 5), at
        d = bisect_divergence(loss, job, forged, log, TOL)
        assert d.first == 5 and d.claimed_ok is False and d.replayed == 1
        assert d.comparisons <= 2 + 7  # the final and start digests, then ⌈log₂ 64⌉ midpoints
    # the honest challenger's log is the one that replays: the dispute convicts the right party
    assert bisect_divergence(loss, job, log, _forge(log, (5,)), TOL).claimed_ok is True


def test_first_divergence_costs_at_most_the_training_and_nothing_on_an_honest_log():
    loss, job = _job(steps=32, every=4)
    log = train_log(loss, job)
    assert first_divergence(loss, job, log, TOL) == (None, 32)  # 1× the training, every checkpoint checked
    first, cost = first_divergence(loss, job, _forge(log, (3,)), TOL)
    assert (first, cost) == (3, 12)  # checkpoint 3 is step 12: the replay stops there



def test_a_dispute_over_the_start_blames_the_log_that_left_the_committed_start():
    # the challenger's w₀ is off by one: the logs differ at checkpoint 0, and the claim (which starts
    # at the committed w₀) is the right one
    loss, job = _job(steps=8)
    log = train_log(loss, job)
    off = [log[0] + 1.0, *log[1:]]
    d = bisect_divergence(loss, job, log, off, TOL)
    assert d.first == 0 and d.claimed_ok is True and d.replayed == 0
    assert bisect_divergence(loss, job, off, log, TOL).claimed_ok is False
