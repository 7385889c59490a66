"""Hypothesis strategies for plugin authors: update matrices, contexts, client datasets.

Each strategy draws a few small integers (a seed, sizes, a kind of matrix) and builds
the tensors with :mod:`redteam.testing.builders`, so generation is fast and a failing
example prints as a short, reproducible call. Sizes accept an ``int``, an inclusive
``(low, high)`` pair or a strategy; dtypes accept a dtype, a name, a sequence of them
or a strategy.

>>> from hypothesis import given
>>> from redteam.testing import strategies as rst
>>> @given(rst.attack_contexts(n=(4, 8)))                       # doctest: +SKIP
... def test_rows(ctx):
...     assert my_attack.craft_updates(ctx).shape == ctx.own_updates.shape
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from hypothesis import strategies as st

from .builders import (
    DEFENSE_KINDS,
    KINDS,
    AttackCase,
    DefenseCase,
    make_client_data,
    make_server_context,
    make_updates,
)

if TYPE_CHECKING:
    import torch

    from redteam.types import AttackContext, ClientData, ServerContext

__all__ = [
    "SCALES",
    "DEFENSE_SCALES",
    "seeds",
    "updates",
    "server_contexts",
    "attack_contexts",
    "client_data",
    "attack_cases",
    "defense_cases",
]

#: magnitudes the update matrices are drawn at (tiny deltas to large ones)
SCALES: tuple[float, ...] = (1e-3, 1e-1, 1.0, 10.0, 100.0)
#: magnitudes of the defense inputs: also far below and far above any sensible update
DEFENSE_SCALES: tuple[float, ...] = (1e-30, 1e-6) + SCALES + (1e6, 1e30)

def seeds() -> st.SearchStrategy[int]:
    """Seeds for the builders' generators."""
    return st.integers(min_value=0, max_value=2**31 - 1)


def _ints(v: Any, name: str) -> st.SearchStrategy[int]:
    if isinstance(v, st.SearchStrategy):
        return v
    if isinstance(v, bool):
        raise TypeError(f"{name} = {v!r}: expected an int, a (low, high) pair or a strategy")
    if isinstance(v, int):
        return st.just(v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, int) for x in v) and v[0] <= v[1]:
        return st.integers(min_value=v[0], max_value=v[1])
    raise TypeError(f"{name} = {v!r}: expected an int, a (low, high) pair with low ≤ high, or a strategy")


def _choice(v: Any, name: str) -> st.SearchStrategy[Any]:
    """A strategy from a strategy, a single value, or a non-empty sequence of values."""
    if isinstance(v, st.SearchStrategy):
        return v
    if isinstance(v, (tuple, list)):
        if not v:
            raise ValueError(f"{name}: needs at least one value")
        return st.sampled_from(tuple(v))
    return st.just(v)


def _dtype_names(dtype: Any) -> st.SearchStrategy[str]:
    """dtype(s) → names ('float32'), so that reproduce lines stay short."""
    if isinstance(dtype, st.SearchStrategy):
        return dtype.map(lambda t: str(t).removeprefix("torch."))
    items = dtype if isinstance(dtype, (tuple, list)) else (dtype,)
    return st.sampled_from(tuple(str(t).removeprefix("torch.") for t in items))


def updates(
    n: Any = (1, 8),
    d: Any = (1, 12),
    *,
    dtype: Any = ("float32", "float64"),
    device: "torch.device | str" = "cpu",
    kinds: Sequence[str] | st.SearchStrategy[str] = KINDS,
    scale: Any = SCALES,
    finite: bool = True,
) -> st.SearchStrategy["torch.Tensor"]:
    """``(n, d)`` update matrices (see :func:`~redteam.testing.builders.make_updates` for
    the kinds). ``finite=False`` puts NaN/±Inf into about 10 % of the entries."""
    return st.builds(
        lambda seed, n_, d_, dt, kind, sc: make_updates(seed, n_, d_, dtype=dt, device=device, kind=kind,
                                                          scale=sc, finite=finite),
        seeds(), _ints(n, "n"), _ints(d, "d"), _dtype_names(dtype), _choice(kinds, "kinds"), _choice(scale, "scale"),
    )


def server_contexts(
    updates: Any,
    *,
    weights: Any = ("random", "equal", None),
    previous: Any = (True, False),
    server_data: bool = True,
    client_ids: Any = ("positions", "sparse"),
) -> st.SearchStrategy["ServerContext"]:
    """Server contexts for ``updates`` (a tensor, or a strategy of tensors).

    Weights are random sample counts, ones or absent; there is a previous update or
    not; with ``server_data`` the server can evaluate a quadratic loss and produce a
    root update (both centred on the coordinate median of the rows).
    """
    def build(u: "torch.Tensor") -> st.SearchStrategy["ServerContext"]:
        return st.builds(
            lambda seed, w, prev, ids: make_server_context(u, seed, weights=w, previous=prev,
                                                           server_data=server_data, client_ids=ids),
            seeds(), _choice(weights, "weights"), _choice(previous, "previous"), _choice(client_ids, "client_ids"),
        )

    if isinstance(updates, st.SearchStrategy):
        return updates.flatmap(build)
    return build(updates)


def _attack_numbers(n: Any, f: Any, d: Any) -> st.SearchStrategy[tuple[int, int, int]]:
    def with_f(n_: int) -> st.SearchStrategy[tuple[int, int]]:
        fs = _ints(f, "f") if f is not None else st.integers(1, max(1, (n_ - 1) // 2))
        return fs.filter(lambda k: 1 <= k <= n_).map(lambda k: (n_, k))

    return st.tuples(_ints(n, "n").flatmap(with_f), _ints(d, "d")).map(lambda t: (t[0][0], t[0][1], t[1]))


def attack_cases(
    n: Any = (3, 10),
    f: Any = None,
    d: Any = (1, 12),
    *,
    dtype: Any = ("float32", "float64"),
    kinds: Sequence[str] | st.SearchStrategy[str] = KINDS,
    scale: Any = SCALES,
    samples: Any = (1, 24),
) -> st.SearchStrategy[AttackCase]:
    """The numbers behind one attack input (:class:`~redteam.testing.builders.AttackCase`).

    ``f`` defaults to a minority, 1 … ⌊(n − 1)/2⌋ (at least 1).
    """
    return st.builds(
        lambda seed, nfd, dt, kind, sc, prev, churn, lr, k: AttackCase(
            seed=seed, n=nfd[0], f=nfd[1], d=nfd[2], dtype=dt, kind=kind, scale=sc, previous=prev,
            churn=churn, server_lr=lr, samples=k),
        seeds(), _attack_numbers(n, f, d), _dtype_names(dtype), _choice(kinds, "kinds"), _choice(scale, "scale"),
        st.booleans(), st.booleans(), st.sampled_from((1.0, 0.5, 2.0)), _ints(samples, "samples"),
    )


def attack_contexts(
    n: Any = (3, 10),
    f: Any = None,
    d: Any = (1, 12),
    *,
    dtype: Any = ("float32", "float64"),
    device: "torch.device | str" = "cpu",
    kinds: Sequence[str] | st.SearchStrategy[str] = KINDS,
    scale: Any = SCALES,
    omniscient: bool = False,
    num_classes: int = 10,
    defense: Any = None,
) -> st.SearchStrategy["AttackContext"]:
    """Attack contexts: own and visible honest rows, malicious ids and rows (ids differ
    from rows in about half the examples, as under churn), weights, a previous update
    or none, a server step η ∈ {1, 0.5, 2}, a seeded generator. ``visible_updates`` is
    every honest row when ``omniscient`` and the same tensor as ``own_updates`` otherwise."""
    return attack_cases(n, f, d, dtype=dtype, kinds=kinds, scale=scale).map(
        lambda c: c.context(device=device, omniscient=omniscient, defense=defense, num_classes=num_classes)
    )


def client_data(
    samples: Any = (1, 24),
    *,
    sample_shape: tuple[int, ...] = (64,),
    num_classes: int = 10,
    dtype: Any = "float32",
    device: "torch.device | str" = "cpu",
) -> st.SearchStrategy["ClientData"]:
    """Client datasets: inputs uniform in [0, 1) of ``sample_shape``, int64 labels in
    [0, num_classes)."""
    return st.builds(
        lambda seed, k, dt: make_client_data(seed, samples=k, sample_shape=sample_shape,
                                             num_classes=num_classes, dtype=dt, device=device),
        seeds(), _ints(samples, "samples"), _dtype_names(dtype),
    )


def defense_cases(
    n: Any = (1, 16),
    d: Any = (1, 64),
    *,
    dtype: Any = ("float32", "float64"),
    kinds: Sequence[str] | st.SearchStrategy[str] = DEFENSE_KINDS,
    scale: Any = DEFENSE_SCALES,
    weights: Any = ("random", "equal", None),
    finite: Any = (True, True, True, False),
) -> st.SearchStrategy[DefenseCase]:
    """The numbers behind one defense input (:class:`~redteam.testing.builders.DefenseCase`):
    every kind of :data:`~redteam.testing.builders.DEFENSE_KINDS` (rows near the dtype's
    overflow and all-zero rows included), magnitudes from 1e-30 to 1e30, and NaN/±Inf
    entries in about a quarter of the inputs (``finite``)."""
    return st.builds(
        DefenseCase,
        seed=seeds(), n=_ints(n, "n"), d=_ints(d, "d"), dtype=_dtype_names(dtype), kind=_choice(kinds, "kinds"),
        scale=_choice(scale, "scale"), weights=_choice(weights, "weights"), previous=st.booleans(),
        client_ids=st.sampled_from(("positions", "sparse")), finite=_choice(finite, "finite"),
    )
