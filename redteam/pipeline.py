"""Composition of defenses: filters, pre-aggregators, one aggregator, post-processing.

A defense in redteam is one of four kinds, each a frozen dataclass:

* :class:`Filter` decides per client whether to keep its update (and may clip it);
  used alone it averages what it kept (sample-weighted).
* :class:`PreAggregator` maps the ``(n, d)`` rows to new rows (mixing, bucketing,
  clipping) before the aggregator sees them.
* :class:`Aggregator` turns rows into the ``(d,)`` aggregate (mean, median, Krum ...).
* :class:`PostProcessor` changes the aggregate (DP noise).

:class:`Pipeline` chains them like optax chains gradient transformations:
``Pipeline((NormBound(bound=3.0), CosineFilter(...), Median()))``. In a scenario file the
pipeline is written as ``[defense] pipeline = [{name = "norm_bound", bound = 3.0}, {name = "median"}]``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from .errors import InvalidParameter
from .types import Decision, Defense, ServerContext, sample_weights

if TYPE_CHECKING:
    import torch

__all__ = [
    "FilterResult",
    "Filter",
    "PreAggregator",
    "Aggregator",
    "PostProcessor",
    "Pipeline",
    "PipelineCheck",
    "HopVerdict",
    "weighted_mean",
]


def weighted_mean(updates: "torch.Tensor", weights: "torch.Tensor") -> "torch.Tensor":
    """Σ wᵢ xᵢ / Σ wᵢ in one matrix-vector product; zeros when every weight is 0."""
    import torch

    total = weights.sum()
    if float(total) <= 0:
        return torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device)
    zero = weights == 0
    if bool(zero.any()) and not bool(torch.isfinite(updates[zero]).all()):
        # a rejected NaN/Inf row must not leak through 0·NaN = NaN
        used = (~zero).nonzero().flatten()
        weights, updates = weights[used], updates[used]
    out = (weights.to(updates.dtype) @ updates) / total.to(updates.dtype)
    if not bool(torch.isfinite(out).all()) and bool(torch.isfinite(updates).all()):
        # finite rows near the dtype's overflow: the same convex combination in float64
        # (its exact value lies within the rows' range, so clamping only undoes rounding)
        w64 = weights.to(device=updates.device, dtype=torch.float64) / float(total)
        big = torch.finfo(updates.dtype).max
        out = torch.cat([w64 @ updates[:, s:s + 65536].to(torch.float64)
                         for s in range(0, updates.shape[1], 65536)]).clamp(-big, big).to(updates.dtype)
    return out


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Rows after a filter (same shape; clipped rows changed), the mask, the reasons."""

    updates: "torch.Tensor"
    accepted: "torch.Tensor"
    reasons: Mapping[int, str] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Filter(Defense):
    """A per-client accept/reject (or clip) rule. Implement :meth:`filter`."""

    kind: ClassVar[str] = "filter"

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:  # pragma: no cover
        raise NotImplementedError

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        res = self.filter(updates, ctx)
        w = sample_weights(ctx, updates.shape[0], updates) * res.accepted.to(updates.dtype)
        return Decision(
            aggregate=weighted_mean(res.updates, w),
            accepted=res.accepted,
            weights=w,
            reasons=dict(res.reasons),
            state=dict(res.state),
        )


@dataclass(frozen=True, slots=True)
class PreAggregator(Defense):
    """Maps rows to rows before aggregation. Implement :meth:`transform`.

    ``transform`` returns the new rows and their weights; the number of rows may
    change (bucketing). Used alone it is followed by a sample-weighted mean.
    """

    kind: ClassVar[str] = "pre"

    def transform(
        self, updates: "torch.Tensor", weights: "torch.Tensor", ctx: ServerContext
    ) -> tuple["torch.Tensor", "torch.Tensor"]:  # pragma: no cover
        raise NotImplementedError

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        rows, w = self.transform(updates, sample_weights(ctx, updates.shape[0], updates), ctx)
        return Decision(
            aggregate=weighted_mean(rows, w),
            accepted=torch.ones(updates.shape[0], dtype=torch.bool, device=updates.device),
        )


@dataclass(frozen=True, slots=True)
class Aggregator(Defense):
    """Rows to one aggregate. Implement :meth:`decide` (returning a full Decision)."""

    kind: ClassVar[str] = "aggregator"


@dataclass(frozen=True, slots=True)
class PostProcessor(Defense):
    """Changes the aggregate. Implement :meth:`post`. Alone it post-processes the mean."""

    kind: ClassVar[str] = "post"

    def post(self, aggregate: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor":  # pragma: no cover
        raise NotImplementedError

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        w = sample_weights(ctx, updates.shape[0], updates)
        return Decision(
            aggregate=self.post(weighted_mean(updates, w), ctx),
            accepted=torch.ones(updates.shape[0], dtype=torch.bool, device=updates.device),
            weights=w,
        )


def _kind(stage: Defense) -> str:
    return stage.kind


@dataclass(frozen=True, slots=True)
class HopVerdict:
    """A pipeline check's judgement of one hop (or one peer's round): ``failed`` (a strike),
    ``recomputed`` (a verifier recomputed it: one extra stage forward, on ``verifier``), why."""

    failed: bool
    recomputed: bool
    reason: str = ""
    verifier: int | None = None  # the peer that recomputed the hop


@dataclass(frozen=True, slots=True)
class PipelineCheck(Filter):
    """A check of a model-parallel pipeline's hops: a plugin kind of its own (``acts_at =
    "pipeline"``), run by the ``[pipeline]`` regime (:mod:`redteam.federation.swarm`) from its
    ``[pipeline] checks`` or from a stage of its ``[defense]`` pipeline. In a stage's aggregation
    path it accepts every update unchanged.

    What the regime calls, each with ``view`` (:class:`redteam.federation.swarm.CheckView`: the
    round, the peers' public state — pid, stage, banned — the stage forward, and
    ``verifier_agrees``, which answers as the drawn verifier would; a check never learns who is
    malicious, only the answer):

    * :meth:`verify_hop` on every hop;
    * :meth:`verify_backward` on the gradient each peer sends back, when ``watches_backward``;
    * :meth:`verify_loss` on the last stage's micro-batch loss, when ``watches_loss``;
    * :meth:`audit_round` at the round's end, before the stages sync, when ``audits``.

    ``strikes`` failures ban a peer for the rest of the run."""

    acts_at: ClassVar[str] = "pipeline"
    screens_nonfinite: ClassVar[bool] = False  # checks hops, not update values: `sanity` screens those
    strikes: ClassVar[int] = 1
    watches_backward: ClassVar[bool] = False
    watches_loss: ClassVar[bool] = False
    audits: ClassVar[bool] = False

    #: what the regime reads of a check, by name (the plugin guide documents each)
    CHECK_INTERFACE: ClassVar[tuple[str, ...]] = (
        "strikes", "watches_backward", "watches_loss", "audits", "verify_hop", "verify_backward", "verify_loss",
        "audit_round")

    def verify_hop(self, view: Any, stage: int, peer: Any, inp: "torch.Tensor", sent: "torch.Tensor",
                   stage_params: "torch.Tensor", rng: Any, memory: dict | None = None) -> HopVerdict:
        """Judge one hop: ``peer`` of ``stage`` sent ``sent`` for input ``inp`` with ``stage_params``
        (``rng``: the checks' stream; ``memory``: the check's own dict for the run)."""
        return HopVerdict(False, False)

    def verify_backward(self, view: Any, stage: int, peer: Any, grad_received: "torch.Tensor",
                        grad_sent: "torch.Tensor", memory: dict) -> HopVerdict:
        """Judge the gradient ``peer`` sent back, given the one it received (``watches_backward``)."""
        return HopVerdict(False, False)

    def verify_loss(self, view: Any, stage: int, peer: Any, loss: float, memory: dict) -> HopVerdict:
        """Judge the last stage's output by its micro-batch loss (``watches_loss``)."""
        return HopVerdict(False, False)

    def audit_round(self, view: Any, stage_params: Any, rng: Any, memory: dict) -> list[tuple[int, HopVerdict]]:
        """Deferred judgements at the round's end (``audits``): ``(peer, verdict)`` pairs;
        ``stage_params(s)`` gives stage ``s``'s parameters of the round."""
        return []

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        n = int(updates.shape[0])
        return FilterResult(updates=updates, accepted=torch.ones(n, dtype=torch.bool, device=updates.device))


@dataclass(frozen=True, slots=True)
class Pipeline(Defense):
    """filters… → pre-aggregators… → one aggregator (default: weighted mean) → post…

    Rows rejected by a filter are removed before the next stage; the final
    ``accepted`` mask is over the original clients. Reasons of every stage are kept.
    Each stage's explicit state is kept under its position (``"0"``, ``"1"`` …).
    """

    stages: tuple[Defense, ...] = ()
    summary: ClassVar[str] = "Composition: filters, pre-aggregators, one aggregator, post-processing"

    def validate_stages(self, stages: tuple[Defense, ...]) -> None:
        order = {"filter": 0, "pre": 1, "aggregator": 2, "post": 3}
        last = -1
        n_agg = 0
        for i, st in enumerate(stages):
            if not isinstance(st, Defense):
                raise InvalidParameter(f"Pipeline.stages[{i}] = {st!r}: expected a defense")
            k = order.get(_kind(st), 2)
            if k < last:
                raise InvalidParameter(
                    f"Pipeline.stages[{i}] = {type(st).__name__} ({_kind(st)}): stages must be ordered "
                    "filters, pre-aggregators, one aggregator, post-processors"
                )
            last = k
            n_agg += k == 2
        if n_agg > 1:
            raise InvalidParameter(f"Pipeline.stages: at most one aggregator, got {n_agg}")

    @property
    def symmetric(self) -> bool:  # type: ignore[override]
        return all(s.symmetric for s in self.stages)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n = updates.shape[0]
        accepted = torch.ones(n, dtype=torch.bool, device=updates.device)
        reasons: dict[int, str] = {}
        state: dict[str, Any] = {}
        rows = updates
        idx = torch.arange(n, device=updates.device)  # original client of each live row
        weights = sample_weights(ctx, n, updates)
        aggregate = None
        agg_weights = None

        def sub_ctx(i: int, keep: "torch.Tensor | None" = None) -> ServerContext:
            sel = idx if keep is None else idx[keep]
            live = sel.tolist()
            ids = tuple(ctx.client_ids[j] for j in live) if ctx.client_ids else tuple(live)
            # every oracle of the round passes through (server data, assigned pages, commitments,
            # replays); the merging node's own row keeps its place among the live rows
            own = live.index(ctx.own_row) if ctx.own_row is not None and ctx.own_row in live else None
            return dataclasses.replace(
                ctx,
                n_clients=int(sel.shape[0]),
                weights=weights,
                state=ctx.state.get(str(i), {}) if isinstance(ctx.state, Mapping) else {},
                client_ids=ids,
                own_row=own,
            )

        for i, st in enumerate(self.stages):
            kind = _kind(st)
            if rows.shape[0] == 0:
                break
            if kind == "filter":
                res = st.filter(rows, sub_ctx(i))  # type: ignore[attr-defined]
                for local, why in res.reasons.items():
                    reasons[int(idx[local])] = why
                keep = res.accepted
                accepted[idx[~keep]] = False
                # "_rows": which of the pipeline's input rows this stage saw (telemetry
                # such as per-row cosines stays attributable to clients)
                state[str(i)] = {**dict(res.state), "_rows": idx.tolist()}
                rows, idx, weights = res.updates[keep], idx[keep], weights[keep]
            elif kind == "pre":
                rows, weights = st.transform(rows, weights, sub_ctx(i))  # type: ignore[attr-defined]
            elif kind == "aggregator":
                dec = st.decide(rows, sub_ctx(i))
                aggregate = dec.aggregate
                agg_weights = dec.weights
                state[str(i)] = dict(dec.state)
                if dec.accepted.shape[0] == idx.shape[0]:  # row-preserving: map back
                    rejected_local = (~dec.accepted).nonzero().flatten().tolist()
                    for local in rejected_local:
                        reasons[int(idx[local])] = dec.reasons.get(local, f"rejected by {type(st).__name__}")
                    accepted[idx[~dec.accepted]] = False
            else:  # post
                if aggregate is None:
                    aggregate = weighted_mean(rows, weights)
                aggregate = st.post(aggregate, sub_ctx(i))  # type: ignore[attr-defined]
        if aggregate is None:
            aggregate = weighted_mean(rows, weights) if rows.shape[0] else torch.zeros(
                updates.shape[1], dtype=updates.dtype, device=updates.device
            )
        full_w = None
        if agg_weights is None or agg_weights.shape[0] == idx.shape[0]:
            full_w = torch.zeros(n, dtype=updates.dtype, device=updates.device)
            src = weights if agg_weights is None else agg_weights
            if src.shape[0] == idx.shape[0]:
                full_w[idx] = src.to(updates.dtype)
                full_w = full_w * accepted.to(updates.dtype)
            else:
                full_w = None
        return Decision(aggregate=aggregate, accepted=accepted, weights=full_w, reasons=reasons, state=state)
