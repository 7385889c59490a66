"""Merge-stage helpers: equivocators' extra rows, and the envelope telemetry of a round."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import DecodeError

#: the data-parallel run (:class:`~.loop.Federation`), whose public attributes the stages read;
#: named here, not imported (it imports this module)
Federation = Any

__all__ = ["place_alternates", "envelope_telemetry"]


def place_alternates(fed: "Federation", tx: Any, rows: list[torch.Tensor], row_clients: list[int],
                     groups: list[list[int]], d: int, extra: dict[str, Any]) -> None:
    """An equivocator's further updates: each goes to the bottom group after its own
    (the other sub-aggregator it was sent to). With one group there is no other
    sub-aggregator, and the receiver keeps only the first header."""
    if tx is None or not tx.alternates:
        return
    ignored = 0
    for c, payloads in sorted(tx.alternates.items()):
        if c not in row_clients:
            continue
        home = next(gi for gi, g in enumerate(groups) if row_clients.index(c) in g)
        for j, payload in enumerate(payloads):
            if len(groups) < 2:
                ignored += 1
                continue
            try:
                row = fed.compressor.codec.decode(payload, d).to(fed.device)
            except DecodeError:
                ignored += 1
                continue
            groups[(home + 1 + j) % len(groups)].append(len(rows))
            rows.append(row)
            row_clients.append(c)
    extra["equivocal_rows"] = len(row_clients) - len(set(row_clients))
    if ignored:
        extra["ignored_alternates"] = ignored


def envelope_telemetry(
    updates: torch.Tensor, clients: list[int], groups: list[list[int]], state: dict[str, dict]
) -> dict[str, Any]:
    """Per-client norms, and the norm bound / cosines the validation filters applied.

    Feeds the envelope-utilisation metrics: how close accepted updates came to each
    validation bound. Bounds and cosines are read from the filters' explicit state
    (``bound``; ``cosine`` with the ``_rows`` a pipeline stage saw).
    """
    norms = torch.linalg.vector_norm(updates.to(torch.float64), dim=1).tolist()
    out: dict[str, Any] = {"norms": dict(zip(clients, norms))}
    bounds: dict[int, float] = {}
    cosines: dict[int, float] = {}
    for gi, rows in enumerate(groups):
        st = state.get(f"0.{gi}", {})
        stages = [v for k, v in sorted(st.items()) if k.isdigit() and isinstance(v, dict)] or [st]
        for stage in stages:
            seen = stage.get("_rows", list(range(len(rows))))
            if "bound" in stage and isinstance(stage["bound"], (int, float)):
                for r in rows:
                    bounds[clients[r]] = float(stage["bound"])
            cos = stage.get("cosine")
            if isinstance(cos, list) and len(cos) == len(seen):
                for local, value in zip(seen, cos):
                    cosines[clients[rows[local]]] = float(value)
                if isinstance(stage.get("threshold"), (int, float)):
                    out["cos_threshold"] = float(stage["threshold"])
    if bounds:
        out["norm_bounds"] = bounds
    if cosines:
        out["cosines"] = cosines
    return out
