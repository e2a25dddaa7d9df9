"""Pipelined stages: a message's timing through a resource, computed once from its size.

A message of ``units`` units (ATM cells, DMA bursts, one Ethernet frame) passes a chain of
stages: an NI processor, an I/O bus, a link, a switch port.  Charging one event per cell would be
too slow for the papers' workloads (docs/performance.md "Virtual time"), so each stage is charged
once per message with the classic pipeline recurrence: a stage starts when it is free and the
first unit has arrived, spends ``head`` before the first unit, ``per_unit`` per unit, and cannot
emit the last unit before it has received it:

    start     = max(busy_until, first_in)
    first_out = start + head + per_unit
    last_out  = max(start + head + units * per_unit, last_in + per_unit)
    busy_until = last_out + tail

A store-and-forward stage (an Ethernet switch, a DMA that starts after reassembly) starts only
once the last unit has arrived.  Stages of one resource queue FIFO in the order they are
reserved; the NI and fabric reserve each stage at the virtual time its first unit reaches it,
so contention between messages emerges at message granularity.
"""

from __future__ import annotations

from stacklib.sim.resources import Resource

__all__ = ["delay", "stage"]


def stage(
    resource: Resource,
    first_in: float,
    last_in: float,
    units: int,
    per_unit: float,
    head: float = 0.0,
    tail: float = 0.0,
    store_and_forward: bool = False,
) -> tuple[float, float]:
    """Reserve ``resource`` for one message; return (first unit out, last unit out)."""
    start = first_in if not store_and_forward else last_in
    busy_until = resource.busy_until
    if busy_until > start:
        start = busy_until
    first_out = start + head + per_unit
    last_out = start + head + units * per_unit
    if not store_and_forward:
        trailing = last_in + per_unit
        if trailing > last_out:
            last_out = trailing
    resource.busy_until = last_out + tail
    resource.busy_time += head + units * per_unit + tail
    resource.holds += 1
    return first_out, last_out


def delay(first_in: float, last_in: float, seconds: float) -> tuple[float, float]:
    """A pure latency (propagation, a switch's forwarding delay): no resource, no queueing."""
    return first_in + seconds, last_in + seconds
