"""Workloads and measurements, registered by name so recipes can pick them.

The workload contract (:class:`Session`, :class:`WorkloadKind`, the registry) is in
:mod:`stacklib.bench.workload`; each workload lives in a module of its own here.
"""

from __future__ import annotations

from stacklib.bench.result import Column, Result
from stacklib.bench.workload import (
    WORKLOADS,
    Session,
    WorkloadKind,
    register_workload,
    workload_kind,
)

__all__ = [
    "WORKLOADS",
    "Column",
    "Result",
    "Session",
    "WorkloadKind",
    "register_workload",
    "workload_kind",
]
