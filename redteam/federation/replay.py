"""Spot-check replay of a peer's local training, with bisection to the first divergent step.

Proof-of-learning logs (Jia et al., "Proof-of-Learning: Definitions and Practice", IEEE S&P
2021): a peer trains from a committed start w₀ with a committed seed (which fixes its batches)
and logs a checkpoint every ``every`` steps; a verifier replays sampled segments from the
claimed checkpoint and accepts when it lands within a tolerance of the next one. Verde
(Arun et al., arXiv:2502.19405, 2025), first stage: when the final states disagree, bisect
over the logged checkpoints to the first segment whose replay diverges, so a dispute costs
O(log K) segment replays instead of K.

The procedure replayed is plain SGD on one peer: at step t the batch is ``batch`` indices
drawn uniformly (with replacement) from the peer's data by a ``torch.Generator`` seeded with
the committed seed (float64 uniforms, as :class:`~.training.BatchedTrainer` draws them), and
w ← w − η·∇L(w; batch). :func:`train_log` is the honest peer; :func:`replay_segment` the
verifier's check; :func:`bisect_divergence` the dispute.

Tolerance: the replay runs the same operations in the same order, but the thread count (BLAS
blocking, reduction order) changes float32 rounding, so bit equality cannot be required across
machines. A segment passes when ‖ŵ − w_claimed‖ ≤ ``tol`` · max(‖w_claimed − w_start‖, tiny).
:func:`measured_tolerance` measures the honest gap (1 vs 2 threads); tests pin it on CPU.
The band is also the cheat's budget: a log perturbed by less than it passes (attack
``within_band`` in the tests), each segment replayed from the claimed checkpoint, so a
perturbation of δ per segment can accumulate to K·δ over the log.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PeerJob", "train_log", "replay_segment", "bisect_divergence", "spot_check", "measured_tolerance"]


@dataclass(frozen=True)
class PeerJob:
    """What a peer commits before training: start ``w0`` (d,), data ``x``/``y``, ``seed``,
    ``steps``, ``batch``, ``lr``, and the checkpoint interval ``every``."""

    w0: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    seed: int
    steps: int
    batch: int
    lr: float
    every: int = 1


def _batches(job: PeerJob) -> torch.Tensor:
    """The (steps, batch) indices the committed seed fixes."""
    g = torch.Generator(device="cpu").manual_seed(int(job.seed))
    u = torch.rand((job.steps, job.batch), generator=g, dtype=torch.float64)
    return torch.floor(u * int(job.y.shape[0])).to(torch.int64)


def _run(loss_fn, job: PeerJob, w: torch.Tensor, start: int, stop: int, idx: torch.Tensor) -> tuple[torch.Tensor, int]:
    for t in range(start, stop):
        b = idx[t]
        w = w.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(loss_fn(w, job.x[b], job.y[b]), w)
        w = (w - job.lr * g).detach()
    return w, stop - start


def train_log(loss_fn, job: PeerJob, *, skip: frozenset[int] = frozenset()) -> list[torch.Tensor]:
    """The honest PoL log: [w₀, w_every, w_2·every, …, w_steps]. ``skip``: steps a lazy
    peer leaves out (it logs what it actually computed, at the same checkpoint times).
    ``loss_fn(w, x, y)`` is the peer's loss of flat parameters on a batch."""
    idx = _batches(job)
    log = [job.w0.clone()]
    w = job.w0.clone()
    for t in range(job.steps):
        if t not in skip:
            w, _ = _run(loss_fn, job, w, t, t + 1, idx)
        if (t + 1) % job.every == 0 or t + 1 == job.steps:
            log.append(w.clone())
    return log


def _bounds(job: PeerJob, k: int) -> tuple[int, int]:
    return k * job.every, min((k + 1) * job.every, job.steps)


def replay_segment(loss_fn, job: PeerJob, log: list[torch.Tensor], k: int, tol: float) -> tuple[bool, float, int]:
    """Replay segment k (checkpoint k → k + 1) from the claimed checkpoint k: (passes, the
    relative gap ‖ŵ − w_{k+1}‖ / max(‖w_{k+1} − w_k‖, 1e-12), steps replayed)."""
    start, stop = _bounds(job, k)
    w, cost = _run(loss_fn, job, log[k], start, stop, _batches(job))
    ref = log[k + 1]
    gap = float((w - ref).norm() / max(float((ref - log[k]).norm()), 1e-12))
    return gap <= tol, gap, cost


def bisect_divergence(loss_fn, job: PeerJob, log: list[torch.Tensor], tol: float) -> tuple[int | None, int]:
    """Verde's first stage: the first checkpoint index i ≥ 1 whose claimed state differs (beyond
    ``tol``, relative to the distance travelled from w₀) from the verifier's own replay from w₀,
    found by bisection; ``None`` when the final state agrees. Returns (i, steps replayed).

    The verifier keeps its own state at the last agreed checkpoint and replays forward from
    there only, so the cost is at most ``steps`` plus nothing re-run."""
    idx = _batches(job)
    k_last = len(log) - 1
    cost = 0

    def ckpt_step(i: int) -> int:
        return min(i * job.every, job.steps)

    def agrees(mine: torch.Tensor, i: int) -> bool:
        scale = max(float((log[i] - log[0]).norm()), float((mine - log[0]).norm()), 1e-12)
        return float((mine - log[i]).norm()) / scale <= tol

    mine_lo, lo = log[0].clone(), 0
    final, c = _run(loss_fn, job, mine_lo, 0, job.steps, idx)
    cost += c
    if agrees(final, k_last):
        return None, cost
    hi = k_last
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mine_mid, c = _run(loss_fn, job, mine_lo, ckpt_step(lo), ckpt_step(mid), idx)
        cost += c
        if agrees(mine_mid, mid):
            lo, mine_lo = mid, mine_mid
        else:
            hi = mid
    return hi, cost


def spot_check(n_peers: int, p: float, generator: torch.Generator) -> list[int]:
    """The peers sampled this round: each independently with probability ``p`` (a lazy peer
    that cheats every round is then first sampled after a geometric number of rounds, mean 1/p)."""
    u = torch.rand(n_peers, generator=generator, dtype=torch.float64)
    return [i for i in range(n_peers) if float(u[i]) < p]


def measured_tolerance(loss_fn, job: PeerJob, threads: tuple[int, ...] = (1, 2)) -> float:
    """The largest relative gap between the final states of the same job trained at each of
    ``threads`` (torch's intra-op threads), over the distance travelled: the honest floor
    the tolerance must sit above."""
    old = torch.get_num_threads()
    finals = []
    try:
        for t in threads:
            torch.set_num_threads(t)
            finals.append(train_log(loss_fn, job)[-1])
    finally:
        torch.set_num_threads(old)
    travel = max(float((finals[0] - job.w0).norm()), 1e-12)
    return max(float((f - finals[0]).norm()) / travel for f in finals[1:]) if len(finals) > 1 else 0.0
