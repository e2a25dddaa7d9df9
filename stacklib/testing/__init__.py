"""Tools for testing protocols built with stacklib (docs/testing.md).

* :class:`Faults`: what befalls each datagram, scripted by number ("drop the 3rd") or drawn
  from a seeded generator (drop, duplicate, reorder, corrupt, delay);
* :class:`Link`: two sans-IO machines joined by a faulty link, run at explicit times;
* :class:`FaultyService` and :class:`FaultLayer`: the same faults under any layer, as a
  datagram service;
* :func:`check_format` and :func:`format_names`: the conformance suite of every registered
  wire format;
* :func:`two_nodes` and :func:`run_virtual`: two nodes with a stack each, in virtual time.

hypothesis is imported only by the format checks, when they run: it stays a test-only
dependency.
"""

from __future__ import annotations

from stacklib.testing.faults import (
    CORRUPT,
    DROP,
    DUPLICATE,
    REORDER,
    FaultLayer,
    FaultParams,
    Faults,
    FaultyService,
    invert_first_byte,
    late_by,
)
from stacklib.testing.formats import (
    check_format,
    check_malformed,
    check_round_trip,
    format_names,
)
from stacklib.testing.link import SIDES, Link, Sent
from stacklib.testing.nodes import NodeStack, run_virtual, two_nodes

__all__ = [
    "CORRUPT",
    "DROP",
    "DUPLICATE",
    "REORDER",
    "SIDES",
    "FaultLayer",
    "FaultParams",
    "Faults",
    "FaultyService",
    "Link",
    "NodeStack",
    "Sent",
    "check_format",
    "check_malformed",
    "check_round_trip",
    "format_names",
    "invert_first_byte",
    "late_by",
    "run_virtual",
    "two_nodes",
]
