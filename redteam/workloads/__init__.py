"""Workloads: model + data + evaluation. Built-ins: ``digits``, ``synthetic``."""

from .base import Dataset, Workload

__all__ = ["Dataset", "Workload"]
