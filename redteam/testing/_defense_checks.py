"""The defenses' contract checks (private; the public entry is ``check_defense``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from redteam.types import Decision, Defense

from . import _checks as K
from .builders import DefenseCase, generator, make_server_context

if TYPE_CHECKING:
    import torch

SERVER_TENSORS = ("weights", "global_params", "previous_update")


def _check_decision(label: str, dec: Any, updates: "torch.Tensor", where: str, what: str) -> Decision:
    import torch

    n, d = updates.shape
    if not isinstance(dec, Decision):
        K.fail(label, K.P_SHAPE, f"{what} returned {type(dec).__name__}, not a Decision", where)
    agg, acc = dec.aggregate, dec.accepted
    if not isinstance(agg, torch.Tensor) or tuple(agg.shape) != (d,) or agg.dtype != updates.dtype \
            or agg.device != updates.device:
        got = f"{tuple(agg.shape)} {K.dtype_name(agg)} on {agg.device}" if isinstance(agg, torch.Tensor) else repr(agg)
        K.fail(label, K.P_SHAPE, f"{what}: aggregate is {got}; expected ({d},) {K.dtype_name(updates)} "
               f"on {updates.device}", where)
    if not isinstance(acc, torch.Tensor) or tuple(acc.shape) != (n,) or acc.dtype != torch.bool \
            or acc.device != updates.device:
        got = f"{tuple(acc.shape)} {K.dtype_name(acc)} on {acc.device}" if isinstance(acc, torch.Tensor) else repr(acc)
        K.fail(label, K.P_SHAPE, f"{what}: accepted is {got}; expected ({n},) bool on {updates.device}", where)
    if dec.weights is not None and (not isinstance(dec.weights, torch.Tensor) or tuple(dec.weights.shape) != (n,)):
        K.fail(label, K.P_SHAPE, f"{what}: weights has shape {tuple(getattr(dec.weights, 'shape', ()))}, "
               f"expected ({n},) or None", where)
    bad = [k for k in dec.reasons if not isinstance(k, int) or not 0 <= k < n or bool(acc[k])]
    if bad:
        K.fail(label, K.P_SHAPE, f"{what}: reasons name clients {bad} that are not rejected indices "
               f"(accepted = {acc.tolist()})", where)
    if K.finite(updates) and not K.finite(agg):
        K.fail(label, K.P_FINITE, f"{what}: non-finite aggregate {agg.tolist()} from finite updates", where)
    return dec


def _decide(plugin: Defense, label: str, updates: "torch.Tensor", ctx: Any, where: str, what: str,
            tally: K.Tally | None) -> Any:
    snap = K.snapshot({"updates": updates, **{f"ctx.{k}": v for k, v in
                                              K.tensors_of(ctx, SERVER_TENSORS).items()}})
    dec = K.call(label, "decide", lambda: plugin(updates, ctx), where, tally)
    if dec is K.REFUSED:
        return dec
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{what} modified {', '.join(changed)}", where)
    return _check_decision(label, dec, updates, where, what)


def _check_nonfinite(label: str, dec: Decision, updates: "torch.Tensor", where: str) -> None:
    """Rows with a NaN/±Inf entry: never accepted, each with a reason; the aggregate finite."""
    import torch

    bad = (~torch.isfinite(updates).all(dim=1)).nonzero().flatten().tolist()
    let_in = [i for i in bad if bool(dec.accepted[i])]
    silent = [i for i in bad if i not in dec.reasons]
    if let_in or silent:
        K.fail(label, K.P_NONFINITE, f"non-finite rows {bad}: accepted {let_in}, without a reason {silent} "
               "(declare `screens_nonfinite = False` if the rule leaves that to a filter before it)", where)
    if bool(torch.isfinite(updates).all(dim=1).any()) and not K.finite(dec.aggregate):
        K.fail(label, K.P_NONFINITE, f"non-finite aggregate {dec.aggregate.tolist()} although "
               f"{int(torch.isfinite(updates).all(dim=1).sum())} rows are finite", where)


def _same_decision(label: str, a: Decision, b: Decision, where: str, what: str) -> None:
    if not (K.same(a.aggregate, b.aggregate) and K.same(a.accepted, b.accepted)
            and (a.weights is None) == (b.weights is None)
            and (a.weights is None or K.same(a.weights, b.weights)) and set(a.reasons) == set(b.reasons)):
        K.fail(label, K.P_DETERMINISTIC, f"{what}: two calls with generators in the same state differ "
               f"(aggregate max |Δ| = {K.max_gap(a.aggregate, b.aggregate):.3g}, accepted "
               f"{a.accepted.tolist()} vs {b.accepted.tolist()})", where)


def _tie_groups(updates: "torch.Tensor") -> list[list[int]]:
    """Indices of rows grouped by exact equality (clients a rule cannot tell apart)."""
    import torch

    groups: dict[bytes, list[int]] = {}
    for i, row in enumerate(updates.detach().cpu().to(torch.float64) + 0):  # + 0 turns −0.0 into 0.0
        groups.setdefault(row.numpy().tobytes(), []).append(i)
    return list(groups.values())


def declares(defense: Any, attr: str) -> bool:
    """A ClassVar/property flag, conjoined over a pipeline's stages."""
    own = bool(getattr(defense, attr, True))
    stages = getattr(defense, "stages", None)
    if isinstance(stages, tuple):
        return own and all(declares(s, attr) for s in stages)
    return own


def _cycle(n: int, g: "torch.Generator") -> list[int]:
    """A uniformly random n-cycle (Sattolo's algorithm): every client moves."""
    import torch

    p = list(range(n))
    for i in range(n - 1, 0, -1):
        j = int(torch.randint(0, i, (1,), generator=g))
        p[i], p[j] = p[j], p[i]
    return p


def check_case(plugin: Defense, label: str, case: DefenseCase | None, updates: "torch.Tensor",
                        ctx: Any, where: str, tally: K.Tally, consensus_norm: float,
                        permutation: Sequence[int] | None = None) -> None:
    import torch

    n, d = updates.shape
    seed = case.seed if case is not None else 0
    g0 = getattr(ctx, "generator", None)
    gen_state = g0.get_state() if g0 is not None else None

    def fresh(c: Any) -> Any:  # the same context with a generator in the starting state
        if gen_state is None:
            return c
        return dataclasses.replace(c, generator=K.regenerate(g0, gen_state))

    dec = _decide(plugin, label, updates, ctx, where, "the call", tally)
    if dec is K.REFUSED:
        return
    if not K.finite(updates) and declares(plugin, "screens_nonfinite"):
        _check_nonfinite(label, dec, updates, where)
    again = _decide(plugin, label, updates, fresh(ctx), where, "a second call", None)
    _same_decision(label, dec, again, where, "the call")
    # next round: its own state back (with fresh updates when the kit built the input)
    nxt = case.updates(device=updates.device, seed_offset=1) if case is not None else updates
    if case is not None:
        ctx2 = case.context(nxt, state=dict(dec.state), round=1, previous=dec.aggregate.detach().clone())
    else:
        ctx2 = dataclasses.replace(ctx, state=dict(dec.state), round=ctx.round + 1)
    d2 = _decide(plugin, label, nxt, fresh(ctx2), where, "round 2 with its own Decision.state", K.Tally())
    if d2 is K.REFUSED and case is not None:
        # the fresh round-2 updates may be ones the rule documents it cannot take (e.g. NaN rows
        # leaving too few for a trimmed mean): round 2 on the accepted updates must then work
        nxt = updates
        ctx2 = case.context(nxt, state=dict(dec.state), round=1, previous=dec.aggregate.detach().clone())
        d2 = _decide(plugin, label, nxt, fresh(ctx2), where, "round 2 with its own Decision.state", None)
    elif d2 is K.REFUSED:
        d2 = _decide(plugin, label, nxt, fresh(ctx2), where, "round 2 with its own Decision.state", None)
    d3 = _decide(plugin, label, nxt, fresh(ctx2), where, "round 2 again", None)
    _same_decision(label, d2, d3, where, "round 2 with its own Decision.state")
    tol = K.TOLERANCE.get(K.dtype_name(updates), 1e-4)
    if declares(plugin, "symmetric") and n > 1:
        perm = torch.tensor(list(permutation) if permutation is not None else _cycle(n, generator(seed + 7)))
        if sorted(perm.tolist()) != list(range(n)):
            raise ValueError(f"check_defense: permutation = {perm.tolist()} is not a permutation of 0 … {n - 1}")
        w = getattr(ctx, "weights", None)
        ids = tuple(getattr(ctx, "client_ids", ()) or ())
        ctx_p = dataclasses.replace(
            fresh(ctx), weights=None if w is None else w[perm.to(w.device)],
            client_ids=tuple(ids[i] for i in perm.tolist()) if len(ids) == n else ids)
        up = updates[perm.to(updates.device)]
        dp = _decide(plugin, label, up, ctx_p, where, f"the call on clients permuted by {perm.tolist()}", None)
        mags = updates.abs()
        mags = mags[torch.isfinite(mags)]
        scale = float(mags.max()) if mags.numel() else 0.0
        garbage_in = not K.finite(updates) and not declares(plugin, "screens_nonfinite")
        if not garbage_in and not K.close(dp.aggregate, dec.aggregate, tol, scale):
            K.fail(label, K.P_PERMUTATION, f"permuting the clients by {perm.tolist()} moved the aggregate by "
                   f"{K.max_gap(dp.aggregate, dec.aggregate):.3g} (tolerance {tol:g} × {scale:.3g})", where)
        back = torch.empty_like(dp.accepted)
        back[perm.to(back.device)] = dp.accepted
        for group in _tie_groups(updates):
            if int(back[group].sum()) != int(dec.accepted[group].sum()):
                K.fail(label, K.P_PERMUTATION, f"permuting the clients by {perm.tolist()} changed who is accepted: "
                       f"{dec.accepted.tolist()} became {back.tolist()} (mapped back to the original order)", where)
    if declares(plugin, "symmetric") and declares(plugin, "unanimity"):
        row = updates[0].to(torch.float64) if n else torch.zeros(d, dtype=torch.float64, device=updates.device)
        if not bool(torch.isfinite(row).all()) or float(row.norm()) == 0.0:
            row = torch.ones(d, dtype=torch.float64, device=updates.device)
        x = (row * (consensus_norm / float(row.norm()))).to(updates.dtype) if d else row.to(updates.dtype)
        same_rows = x.expand(max(n, 1), d).clone()
        ctx_i = make_server_context(same_rows, seed, weights=getattr(case, "weights", "random"),
                                    previous=x.clone(), target=x, client_ids="positions")
        di = _decide(plugin, label, same_rows, ctx_i, where, f"{max(n, 1)} identical rows x", None)
        if not K.close(di.aggregate, x, tol, consensus_norm):
            K.fail(label, K.P_IDENTITY, f"{max(n, 1)} copies of x = {x.tolist()} aggregated to "
                   f"{di.aggregate.tolist()} (declare `unanimity = False` if changing that is the rule's point)",
                   where)
    tally.ok("decide")
