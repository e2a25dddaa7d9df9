"""Helpers for the paper 004 library tests: run a body on a fresh two-node LANai platform."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from stacklib.sim import Simulation
from stacklib.transports.sim.lanai4 import Lanai4Cluster

T = TypeVar("T")


def simulate(body: Callable[[Lanai4Cluster], Awaitable[T]], seed: int = 1) -> T:
    """Run ``body(cluster)`` in virtual time on a new two-node cluster."""
    sim = Simulation(seed)
    cluster = Lanai4Cluster(sim)
    return sim.run(body, cluster)
