"""The all-to-all of a Split-C small-message exchange, on stacklib's simulated Myrinet cluster.

The key exchange of a small-message sort (paper 003 §5.1; stacklib/bench/splitc/programs.py)
sends one small message from every node to every other node and ends in a barrier.
:func:`alltoall` runs exactly what ``stacklib/bench/smpi/alltoall.c`` runs under SimGrid's
SMPI, on N nodes of the simulated LANai 4.1 platform (:mod:`stacklib.transports.sim.lanai4`)
with one of paper 004's libraries: node r sends ``size`` bytes to r+1, r+2, ... (mod N),
takes N-1 messages, then passes a dissemination barrier (in step k it sends 4 bytes to r+2^k
and waits for r-2^k's).  The result is the virtual time at which the last node left the
barrier, so a SimGrid run on the exported platform can be checked against it.
"""

from __future__ import annotations

import math
import time

import attrs
import trio

from stacklib.services import DatagramService
from stacklib.sim import Simulation
from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import LIBRARIES
from stacklib.transports.sim.myrinet_libs.transport import open_library

__all__ = ["AllToAll", "alltoall"]

#: First byte of a message: data of the exchange, or a barrier token (step in the second byte).
_DATA, _TOKEN = 0, 1
#: Virtual seconds without progress after which a node gives up (a message was lost).
_PATIENCE = 1.0


@attrs.frozen
class AllToAll:
    """One all-to-all run: the virtual seconds until the last node left the barrier (NaN if
    a message was lost: a library without flow control drops what its queues cannot hold),
    the nodes that did not finish, and the wall-clock seconds the simulation took."""

    nodes: int
    size: int
    seconds: float
    wall_seconds: float
    unfinished: int = 0

    @property
    def complete(self) -> bool:
        """Every node left the barrier."""
        return self.unfinished == 0


class _Lost(Exception):
    """Nothing arrived for :data:`_PATIENCE` virtual seconds."""


async def _node(lib: DatagramService, rank: int, nodes: int, size: int) -> float | None:
    payload = bytes([_DATA]) + bytes(size - 1)
    for step in range(1, nodes):
        await lib.send((rank + step) % nodes, payload)
    data, tokens = 0, set[tuple[int, int]]()
    steps = max(0, (nodes - 1).bit_length())

    async def take() -> None:
        nonlocal data
        received = None
        with trio.move_on_after(_PATIENCE):
            received = await lib.recv()
        if received is None:
            raise _Lost
        peer, message = received
        if message[:1] == bytes([_DATA]):
            data += 1
        elif len(message) >= 2 and message[0] == _TOKEN:
            tokens.add((peer, message[1]))  # an early token of a later step: kept

    try:
        while data < nodes - 1:
            await take()
        for k in range(steps):
            distance = 1 << k
            await lib.send((rank + distance) % nodes, bytes([_TOKEN, k, 0, 0]))
            source = (rank - distance) % nodes
            while (source, k) not in tokens:
                await take()
    except _Lost:
        return None
    return trio.current_time()


def alltoall(library: str, nodes: int, size: int = 8, seed: int = 1) -> AllToAll:
    """Run the exchange and barrier on ``nodes`` simulated nodes over ``library`` (``am``,
    ``bip``, ``fm``, ``pm``, ``vmmc``) with ``size``-byte messages (at least 2)."""
    if library not in LIBRARIES:
        raise ValueError(f"no library {library!r} (known: {', '.join(LIBRARIES)})")
    if nodes < 2:
        raise ValueError(f"an all-to-all needs at least two nodes, not {nodes}")
    if size < 2:
        raise ValueError(f"a message carries a 1-byte kind: size must be >= 2, not {size}")
    wall = time.perf_counter()
    sim = Simulation(seed)
    libs = open_library(Lanai4Cluster(sim, nodes=nodes), LIBRARIES[library])
    ends: list[float | None] = [None] * nodes

    async def main() -> None:
        async def run(rank: int) -> None:
            ends[rank] = await _node(libs[rank], rank, nodes, size)

        async with trio.open_nursery() as nursery:
            for rank in range(nodes):
                nursery.start_soon(run, rank)

    sim.run(main)
    done = [end for end in ends if end is not None]
    seconds = max(done) if len(done) == nodes else math.nan
    return AllToAll(nodes, size, seconds, time.perf_counter() - wall, nodes - len(done))
