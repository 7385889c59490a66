"""Test helpers for the Flower integration: the in-process Grid (now in the package,
:class:`redteam.integrations.flower.engine.LocalGrid`) and a hand-made training reply."""

from __future__ import annotations

import time

from flwr.app import Message, Metadata, RecordDict

from redteam.integrations.flower.engine import RUN_ID, SERVER, LocalGrid

__all__ = ["LocalGrid", "reply", "SERVER"]


def reply(node: int, arrays, n: int, **records) -> Message:
    """A training reply from ``node`` carrying ``arrays`` and ``num-examples`` = ``n``."""
    from flwr.app import MetricRecord

    meta = Metadata(run_id=RUN_ID, message_id=f"r{node}", src_node_id=node, dst_node_id=SERVER,
                    reply_to_message_id="", group_id="", created_at=time.time(), ttl=100.0, message_type="train")
    return Message(content=RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": n}), **records}),
                   metadata=meta)
