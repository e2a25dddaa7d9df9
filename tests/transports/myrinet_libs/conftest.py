"""Helpers for the paper 004 library tests: run a body on a fresh two-node LANai platform."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import trio

from stacklib.sim import Simulation
from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import MyrinetLibrary

T = TypeVar("T")


def simulate(body: Callable[[Lanai4Cluster], Awaitable[T]], seed: int = 1) -> T:
    """Run ``body(cluster)`` in virtual time on a new two-node cluster."""
    sim = Simulation(seed)
    cluster = Lanai4Cluster(sim)
    return sim.run(body, cluster)


async def send_overheads(lib: MyrinetLibrary, sizes: Iterable[int]) -> list[float]:
    """The virtual time ``lib.send`` to node 1 holds its caller, for a message of each size."""
    costs = []
    for size in sizes:
        start = trio.current_time()
        await lib.send(1, bytes(size))
        costs.append(trio.current_time() - start)
    return costs
