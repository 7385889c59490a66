"""Communication graphs of the serverless gossip regime (:mod:`.gossip`) and their mixing weights.

A graph is an ``(n, n)`` boolean adjacency matrix (symmetric, no self loops), one node per client.
Topologies (``[gossip] topology``):

* ``ring`` — the cycle 0 – 1 – … – n−1 – 0;
* ``torus`` — a periodic ``rows × (n / rows)`` grid (each node linked to its four grid neighbours);
* ``erdos_renyi`` — each pair linked with probability ``probability``, drawn again (from the run's
  topology stream) until the graph is connected;
* ``exponential`` — node i linked to i ± 2ᵏ (mod n) for 2ᵏ < n: the (undirected) static exponential
  graph of Ying, Yuan, Chen, Hu, Pan & Yin, "Exponential Graph is Provably Efficient for
  Decentralized Deep Training" (NeurIPS 2021), degree O(log n) with a spectral gap that does not
  vanish with n;
* ``two_worlds`` — two cliques of ⌊n/2⌋ and ⌈n/2⌉ nodes with ``bridges`` edges from each node of the
  first into the second (node i ↔ ⌊n/2⌋ + (i + k) mod ⌊n/2⌋, k < bridges): the graph Gaucher,
  Dieuleveut & Hendrikx ("Unified Breakdown Analysis for Byzantine Robust Gossip", ICML 2025) use to
  show that robustness depends on the topology — its two halves are joined by few edges, so its
  Fiedler vector separates them;
* ``complete`` — every pair linked.

Mixing: ``metropolis_hastings`` (default) gives W_ij = 1 / (1 + max(deg_i, deg_j)) on each edge
and W_ii = 1 − Σ_j W_ij (Xiao & Boyd, "Fast linear iterations for distributed averaging", 2004):
symmetric and doubly stochastic on any undirected graph, from local degrees only. ``uniform`` gives
W_ij = 1 / (1 + max_k deg_k) on every edge (also symmetric and doubly stochastic).

Spectra: :func:`spectral_gap` is 1 − max(|λ₂(W)|, |λₙ(W)|) — the consensus distance of plain gossip
x ← W x shrinks at least by the factor (1 − gap)² per step; :func:`laplacian` and
:func:`fiedler_vector` describe a (sub)graph's Laplacian L = D − A (optionally weighted) and the
eigenvector of its second-smallest eigenvalue (the algebraic connectivity μ₂).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidParameter

__all__ = ["TOPOLOGIES", "MIXINGS", "build_graph", "mixing_matrix", "spectral_gap", "laplacian",
           "fiedler_vector", "algebraic_connectivity", "is_connected", "drop_edges"]

TOPOLOGIES = ("ring", "torus", "erdos_renyi", "exponential", "two_worlds", "complete")
MIXINGS = ("metropolis_hastings", "uniform")


def _sym(a: np.ndarray) -> np.ndarray:
    a = a | a.T
    np.fill_diagonal(a, False)
    return a


def is_connected(adj: np.ndarray) -> bool:
    """Whether the graph is connected (a breadth-first search from node 0)."""
    n = adj.shape[0]
    if n <= 1:
        return True
    seen = np.zeros(n, dtype=bool)
    seen[0] = True
    frontier = [0]
    while frontier:
        nxt = np.flatnonzero(adj[frontier].any(axis=0) & ~seen)
        seen[nxt] = True
        frontier = nxt.tolist()
    return bool(seen.all())


def build_graph(topology: str, n: int, rng: np.random.Generator | None = None, *, probability: float = 0.3,
                rows: int | None = None, bridges: int = 1) -> np.ndarray:
    """The adjacency matrix ``(n, n)`` of ``topology`` on ``n`` nodes (module docstring)."""
    if n < 2:
        raise InvalidParameter(f"[gossip]: a graph needs at least 2 nodes, got {n}")
    a = np.zeros((n, n), dtype=bool)
    idx = np.arange(n)
    if topology == "ring":
        a[idx, (idx + 1) % n] = True
    elif topology == "complete":
        a[:] = True
    elif topology == "torus":
        r = rows if rows is not None else max(d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0)
        if r < 1 or n % r:
            raise InvalidParameter(f"[gossip].rows = {r}: must divide the {n} nodes")
        c = n // r
        for i in range(n):
            y, x = divmod(i, c)
            a[i, y * c + (x + 1) % c] = True
            a[i, ((y + 1) % r) * c + x] = True
    elif topology == "exponential":
        k = 1
        while k < n:
            a[idx, (idx + k) % n] = True
            k *= 2
    elif topology == "two_worlds":
        h = n // 2
        if h < 1 or not 1 <= bridges <= n - h:
            raise InvalidParameter(f"[gossip].bridges = {bridges}: must be in [1, {n - h}] for {n} nodes")
        a[:h, :h] = True
        a[h:, h:] = True
        for i in range(h):
            for k in range(bridges):
                a[i, h + (i + k) % (n - h)] = True
    elif topology == "erdos_renyi":
        if rng is None:
            raise InvalidParameter("erdos_renyi needs a random generator")
        for _ in range(1000):
            up = np.triu(rng.random((n, n)) < probability, 1)
            a = _sym(up)
            if is_connected(a):
                return a
        raise InvalidParameter(f"[gossip].probability = {probability}: no connected Erdős–Rényi graph on {n} nodes "
                               "in 1000 draws (raise the probability)")
    else:
        raise InvalidParameter(f"[gossip].topology = {topology!r}: must be one of {', '.join(TOPOLOGIES)}")
    return _sym(a)


def mixing_matrix(adj: np.ndarray, rule: str = "metropolis_hastings", degrees: np.ndarray | None = None) -> np.ndarray:
    """The symmetric, doubly stochastic mixing matrix W of the graph (float64; module docstring).

    ``degrees``: the degrees the nodes announce, where some lie (a Byzantine node understating
    its degree gets the largest weight Metropolis–Hastings gives a neighbour, 1/(1 + deg_i)); the
    rows of the honest nodes are then what they use, and W is no longer symmetric."""
    deg = adj.sum(axis=1).astype(np.float64) if degrees is None else np.asarray(degrees, dtype=np.float64)
    if rule == "metropolis_hastings":
        w = np.where(adj, 1.0 / (1.0 + np.maximum(deg[:, None], deg[None, :])), 0.0)
    elif rule == "uniform":
        w = np.where(adj, 1.0 / (1.0 + deg.max(initial=0.0)), 0.0)
    else:
        raise InvalidParameter(f"[gossip].mixing = {rule!r}: must be one of {', '.join(MIXINGS)}")
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def spectral_gap(w: np.ndarray) -> float:
    """1 − (the second-largest eigenvalue modulus of the symmetric W): 0 for a disconnected graph."""
    if w.shape[0] < 2:
        return 1.0
    ev = np.sort(np.abs(np.linalg.eigvalsh((w + w.T) / 2)))
    return float(max(0.0, 1.0 - ev[-2]))


def laplacian(adj: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """L = D − A of the graph (A weighted by ``weights`` on its edges when given)."""
    a = adj.astype(np.float64) if weights is None else np.where(adj, weights, 0.0)
    return np.diag(a.sum(axis=1)) - a


def algebraic_connectivity(lap: np.ndarray) -> float:
    """μ₂: the Laplacian's second-smallest eigenvalue (0 when disconnected)."""
    if lap.shape[0] < 2:
        return 0.0
    return float(max(0.0, np.linalg.eigvalsh(lap)[1]))


def fiedler_vector(lap: np.ndarray) -> np.ndarray:
    """The unit eigenvector of μ₂, its sign fixed so that its first non-zero entry is negative."""
    vals, vecs = np.linalg.eigh(lap)
    v = vecs[:, 1] if lap.shape[0] > 1 else np.ones(1)
    nz = np.flatnonzero(np.abs(v) > 1e-12)
    if nz.size and v[nz[0]] > 0:
        v = -v
    return v


def drop_edges(adj: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """The graph of one round under churn: each edge down with probability ``p`` (drawn once per
    undirected edge)."""
    if p <= 0:
        return adj
    keep = np.triu(rng.random(adj.shape) >= p, 1)
    return adj & (keep | keep.T)
