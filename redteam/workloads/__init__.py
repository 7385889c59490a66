"""Workloads: model + data + evaluation. Built-ins: ``digits``, ``synthetic``, ``text`` (byte-level LM)."""

from .base import Dataset, Workload

__all__ = ["Dataset", "Workload"]
