"""Spot-check replay of a peer's local training, with bisection to the first divergent step.

Proof-of-learning logs (Jia et al., "Proof-of-Learning: Definitions and Practice", IEEE S&P
2021): a peer trains from a committed start w₀ with a committed seed (which fixes its batches)
and logs a checkpoint every ``every`` steps; a verifier replays sampled segments from the
claimed checkpoint and accepts when it lands within a tolerance of the next one. Verde
(Arun et al., arXiv:2502.19405, 2025), first stage: two parties' checkpoint logs are bisected to
a step where they part, which the referee replays. A check on the final state alone misses a log
that is wrong in the middle and right at the end (a forged checkpoint over an honest run), and a
bisection on "does checkpoint i agree" returns a later fault when there are two; here both
checks return the *first* divergent checkpoint.

The procedure replayed is plain SGD on one peer: at step t the batch is ``batch`` indices
drawn uniformly (with replacement) from the peer's data by a ``torch.Generator`` seeded with
the committed seed (float64 uniforms, as :class:`~.training.BatchedTrainer` draws them), and
w ← w − η·∇L(w; batch). :func:`train_log` is the honest peer; :func:`replay_segment` the
verifier's check of one segment; :func:`first_divergence` the verifier's check of a whole log (the
first divergent checkpoint, ≤ 1× the training); :func:`bisect_divergence` a dispute between two logs (prefix
digests bisected to their first difference, then one segment replayed by the referee).

The log in a ledger (:func:`write_pol_ledger`): the peer signs, as it trains, one in-toto
statement per checkpoint (subject: the checkpoint's SHA-256 over float32 little-endian bytes;
predicate: the peer, the checkpoint's index and step, and the digest of the committed job) into
an RFC 6962 ledger that ``redteam ledger verify`` checks. The verifier then draws the segments
it replays from the ledger's root (:func:`sample_segments`, a Fiat–Shamir draw: the peer cannot
know them before its log is fixed) and checks that the checkpoints it is shown are the logged
ones (:func:`mismatched_checkpoints`): a log rewritten after the draw, so that the sampled
segments replay cleanly (the spoofing of Zhang et al., "'Adversarial Examples' for
Proof-of-Learning", IEEE S&P 2022, builds a log that passes the verifier's checks), no longer
matches its digests.

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

__all__ = ["PeerJob", "train_log", "replay_segment", "first_divergence", "bisect_divergence", "Dispute",
           "chain_digests", "spot_check", "measured_tolerance",
           "POL_PREDICATE", "checkpoint_digest", "job_digest", "write_pol_ledger", "read_pol_ledger",
           "mismatched_checkpoints", "sample_segments"]


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


def _agrees(log: list[torch.Tensor], mine: torch.Tensor, i: int, tol: float) -> bool:
    """Whether claimed checkpoint ``i`` matches the verifier's own state ``mine`` there (relative
    to the distance travelled from w₀ by either)."""
    scale = max(float((log[i] - log[0]).norm()), float((mine - log[0]).norm()), 1e-12)
    return float((mine - log[i]).norm()) / scale <= tol


def first_divergence(loss_fn, job: PeerJob, log: list[torch.Tensor], tol: float) -> tuple[int | None, int]:
    """The first checkpoint index i ≥ 1 whose claimed state differs (beyond ``tol``, relative to
    the distance travelled from w₀) from the verifier's own honest replay from w₀, and the steps
    replayed; ``(None, steps)`` when every checkpoint agrees.

    The verifier replays forward once, comparing each checkpoint as it reaches it, and stops at
    the first that differs: at most the peer's own training (1×), and only up to the fault. This
    is the check that finds the *first* bad checkpoint whatever the log does after it: a log
    that is bad at checkpoint 5 and honest again from 6 on (a forged checkpoint over an honest
    run) is caught at 5, which a bisection on the final state accepts."""
    idx = _batches(job)
    mine, cost = log[0].clone(), 0
    for i in range(1, len(log)):
        lo, hi = min((i - 1) * job.every, job.steps), min(i * job.every, job.steps)
        mine, c = _run(loss_fn, job, mine, lo, hi, idx)
        cost += c
        if not _agrees(log, mine, i, tol):
            return i, cost
    return None, cost


def chain_digests(log: list[torch.Tensor]) -> list[str]:
    """Prefix digests of a checkpoint log: c₀ = H(w₀), cᵢ = H(cᵢ₋₁ ‖ H(wᵢ)) (SHA-256, float32
    little-endian bytes). cᵢ of two logs agree exactly when checkpoints 0 … i all do, so "cᵢ
    differs" is monotone in i, whatever the logs do after their first difference."""
    import hashlib

    out: list[str] = []
    prev = b""
    for w in log:
        prev = hashlib.sha256(prev + bytes.fromhex(checkpoint_digest(w))).digest()
        out.append(prev.hex())
    return out


@dataclass(frozen=True)
class Dispute:
    """The outcome of :func:`bisect_divergence`: the first checkpoint where the logs differ
    (``None``: identical logs), how many prefix digests were compared, the steps the referee
    replayed, and whether the claimed log's step into that checkpoint replays within tolerance
    from the last agreed one (``False``: the claim is the wrong one)."""

    first: int | None
    comparisons: int
    replayed: int
    claimed_ok: bool | None


def bisect_divergence(loss_fn, job: PeerJob, claimed: list[torch.Tensor], other: list[torch.Tensor],
                      tol: float) -> Dispute:
    """Verde's dispute (Arun et al. 2025, first stage) between two logs of the same job (a
    trainer's ``claimed`` log and a challenger's ``other``): bisect on the prefix digests
    (:func:`chain_digests`) to the first checkpoint where the logs differ — O(log K)
    comparisons, exact, since a prefix digest differs from the first difference on — then the
    referee replays that one segment from the last agreed checkpoint and checks the claimed
    state against it (within ``tol``). Exact digests need the parties' kernels to agree bit for
    bit (Verde's RepOps); a verifier that replays on other hardware uses
    :func:`first_divergence`, with a tolerance, instead."""
    a, b = chain_digests(claimed), chain_digests(other)
    if len(a) != len(b):
        raise ValueError(f"the logs have {len(a)} and {len(b)} checkpoints")
    comparisons = 1
    if a[-1] == b[-1]:
        return Dispute(None, comparisons, 0, None)
    lo, hi = 0, len(a) - 1  # the logs agree up to lo (the committed start), differ by hi
    comparisons += 1
    if a[0] != b[0]:  # the start itself differs: the committed w₀ says which log is wrong
        return Dispute(0, comparisons, 0, checkpoint_digest(claimed[0]) == checkpoint_digest(job.w0))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        comparisons += 1
        if a[mid] == b[mid]:
            lo = mid
        else:
            hi = mid
    start, stop = min(lo * job.every, job.steps), min(hi * job.every, job.steps)
    mine, cost = _run(loss_fn, job, claimed[lo], start, stop, _batches(job))
    return Dispute(hi, comparisons, cost, _agrees(claimed, mine, hi, tol))


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


POL_PREDICATE = "https://redteam.dev/pol-checkpoint/v1"


def checkpoint_digest(w: torch.Tensor) -> str:
    """SHA-256 (hex) of a checkpoint's float32 little-endian bytes."""
    import hashlib

    arr = w.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
    return hashlib.sha256(arr.tobytes()).hexdigest()


def job_digest(job: PeerJob) -> str:
    """SHA-256 (hex) of what the peer commits before training: its start, data, seed and
    schedule (steps, batch, learning rate, checkpoint interval)."""
    import hashlib
    import json

    head = json.dumps({"seed": int(job.seed), "steps": int(job.steps), "batch": int(job.batch),
                       "lr": float(job.lr), "every": int(job.every)}, sort_keys=True).encode()
    h = hashlib.sha256(head)
    for t in (job.w0, job.x, job.y):
        h.update(t.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()


def _peer_key(seed: int, peer: int):
    import numpy as np

    from ..transport.signing import derive_key

    return derive_key(np.random.default_rng(np.random.SeedSequence([seed, 21, peer])), "p256")


def write_pol_ledger(path, job: PeerJob, log: list[torch.Tensor], peer: int, *, seed: int = 0,
                     origin: str = "redteam.verification/pol") -> int:
    """A new ledger at ``path`` holding ``peer``'s PoL log: one signed statement per checkpoint,
    appended in order as training produces them. Keys from ``seed`` (Ed25519 for the log,
    P-256 for the peer). Returns the number of entries."""
    import json

    import numpy as np
    from provenance import dsse
    from provenance.ledger import Ledger

    from ..transport.signing import derive_key

    log_key = derive_key(np.random.default_rng(np.random.SeedSequence([seed, 21])), "ed25519")
    key = _peer_key(seed, peer)
    jd = job_digest(job)
    with Ledger.init(path, log_key, origin) as ledger:
        for k, w in enumerate(log):
            statement = {"_type": "https://in-toto.io/Statement/v1",
                         "subject": [{"name": f"peer-{int(peer)}/checkpoint-{k}",
                                      "digest": {"sha256": checkpoint_digest(w)}}],
                         "predicateType": POL_PREDICATE,
                         "predicate": {"peer": int(peer), "index": k, "step": min(k * job.every, job.steps),
                                       "job": jd}}
            ledger.append_many([(dsse.sign(json.dumps(statement, sort_keys=True).encode(), key), key.public)])
    return len(log)


def read_pol_ledger(path) -> tuple[list[dict], bytes]:
    """The verified ledger's checkpoints in log order (peer, index, step, job, digest) and its
    root hash; raises :class:`provenance.errors.VerificationFailed` when it does not verify."""
    from .commitments import verified_statements

    statements, root = verified_statements(path, POL_PREDICATE)
    return [{**st["predicate"], "digest": st["subject"][0]["digest"]["sha256"]} for _, st in statements], root


def mismatched_checkpoints(log: list[torch.Tensor], logged: list[dict], job: PeerJob) -> list[int]:
    """Indices of the shown log whose checkpoint is not the logged one (a different digest,
    one missing from the ledger, or a ledger entry for another job)."""
    jd = job_digest(job)
    by_index = {int(e["index"]): e for e in logged}
    return [k for k, w in enumerate(log)
            if k not in by_index or by_index[k]["digest"] != checkpoint_digest(w) or by_index[k]["job"] != jd]


def sample_segments(root: bytes, n_segments: int, k: int) -> list[int]:
    """``k`` distinct segment indices in [0, n_segments), drawn from the ledger's root hash
    (Fiat–Shamir: fixed once the log is, unknown before)."""
    import hashlib

    g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(b"pol-sample" + root).digest()[:8], "little") >> 1)
    return sorted(torch.randperm(n_segments, generator=g)[:min(k, n_segments)].tolist())
