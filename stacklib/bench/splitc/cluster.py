"""Run an SPMD Split-C program on N ranks in one process: memory transport or a simulated
cluster (virtual time).

:func:`run_spmd` builds the network, one endpoint per rank with a channel to every other rank,
UAM and Split-C on each, and runs ``program(sc)`` on every rank concurrently.  On simulated
clusters local computation charged with :meth:`SplitC.compute` holds the rank's host CPU, and
every run with the same seed gives the same times.  Real processes use
:func:`stacklib.launch.bootstrap` instead (stacklib/commands/splitc.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from stacklib.layers.splitc import SplitC, open_splitc
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.services import UNetService
from stacklib.sim import Resource, Simulation
from stacklib.transports.memory import MemoryNetwork
from stacklib.transports.sim import (
    AtmParams,
    FastEthernetParams,
    SimCluster,
    build_atm,
    build_fe,
)
from stacklib.transports.sim.params import FaultParams
from stacklib.unet import Endpoint, EndpointConfig, connect
from stacklib.unet.node import Node

__all__ = ["SPLITC_UAM", "TRANSPORTS", "SpmdRun", "endpoint_config", "run_spmd"]

T = TypeVar("T")

#: Transports :func:`run_spmd` builds (machines of stacklib.transports.sim.machines add theirs).
TRANSPORTS = ("memory", "sim-memory", "sim-atm", "sim-fe")


#: UAM for Split-C clusters.  In an all-to-all exchange a receiver takes a window from every
#: peer at once: with 7 peers, 56 bulk PDUs cost an SS-20 some 5 ms of protocol and copies
#: (docs/uam.md), more than UAM's default 4 ms timeout, and spurious go-back-N retransmissions
#: then feed on themselves.  A 20 ms timeout (an estimate; paper 000 §5.1 gives none) avoids
#: that.
SPLITC_UAM = UamParams(rto_us=20_000.0, max_retries=20)


def endpoint_config(peers: int) -> EndpointConfig:
    """Endpoint buffers for Split-C over UAM with ``peers`` peers: UAM keeps 2w arrivals per
    peer (paper 000 §5.1.1) and a 4200-byte PDU takes two 4096-byte receive buffers."""
    rx = max(48, 24 * peers)
    return EndpointConfig(
        segment_size=(32 + rx) * 4096 + 64 * 1024,
        tx_buffers=32,
        rx_buffers=rx,
        free_queue=rx,
        recv_queue=rx,
    )


@attrs.frozen
class SpmdRun:
    """What :func:`run_spmd` returns: each rank's result and the longest time a rank spent in
    the program, after start-up (virtual seconds on simulated transports, wall-clock seconds on
    ``memory``)."""

    results: list[Any]
    elapsed: float
    statistics: list[Any]


def _nodes(
    transport: str, n: int, seed: int, faults: FaultParams | None, host: str | None
) -> tuple[Simulation | None, list[Node]]:
    names = [f"rank{r}" for r in range(n)]
    fault = faults or FaultParams()
    if transport == "memory":
        network = MemoryNetwork()
        return None, [network.add_node(name) for name in names]
    sim = Simulation(seed=seed)
    if transport == "sim-memory":
        memory = MemoryNetwork(sim, latency=20e-6)
        return sim, [memory.add_node(name) for name in names]
    cluster: SimCluster | MemoryNetwork
    if transport == "sim-atm":
        cluster = build_atm(sim, AtmParams(host=host or "ss20", faults=fault), names, None)
    elif transport == "sim-fe":
        params = FastEthernetParams(interconnect="bay28115", host=host or "p120", faults=fault)
        cluster = build_fe(sim, params, names, None)
    else:
        from stacklib.transports.sim.machines import build_machine

        cluster = build_machine(sim, transport, names, fault)
    return sim, [cluster.nodes[name] for name in names]


def run_spmd(
    program: Callable[[SplitC], Awaitable[T]],
    n: int,
    transport: str = "memory",
    *,
    seed: int = 1,
    uam: UamParams | None = None,
    faults: FaultParams | None = None,
    host: str | None = None,
) -> SpmdRun:
    """Run ``program(sc)`` on ``n`` ranks over ``transport`` and return every rank's result.

    ``faults`` (simulated ATM and FE) injects loss and the like on the fabric; ``host`` names
    the workstation of every node (stacklib.transports.sim.hosts).
    """
    if n < 1:
        raise ValueError(f"Split-C needs at least one rank, got {n}")
    sim, nodes = _nodes(transport, n, seed, faults, host)
    config = endpoint_config(n - 1)
    endpoints: list[Endpoint] = [
        node.os.create_endpoint(node.os.process(f"splitc{r}"), config)
        for r, node in enumerate(nodes)
    ]
    channels: list[dict[int, int]] = [{} for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            channels[i][j], channels[j][i] = connect(endpoints[i], endpoints[j])
    params = uam or SPLITC_UAM
    results: list[Any] = [None] * n
    stats: list[Any] = [None] * n
    times = [0.0] * n
    # Long enough for UAM's delayed acknowledgments and one retransmission.
    linger = (params.ack_delay_us + params.rto_us) * 1e-6

    async def rank_main(rank: int) -> None:
        cpu: Resource | None = nodes[rank].host.resource("cpu") if sim is not None else None
        async with (
            UamLayer(params).open(UNetService(endpoints[rank])) as am,
            open_splitc(am, rank, channels[rank], cpu=cpu, linger=linger) as sc,
        ):
            start = trio.current_time()
            results[rank] = await program(sc)
            times[rank] = trio.current_time() - start
            stats[rank] = sc.statistics()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for rank in range(n):
                nursery.start_soon(rank_main, rank)

    try:
        if sim is None:
            trio.run(main)
        else:
            sim.run(main)
    except BaseExceptionGroup as group:
        # One rank failed (the others were cancelled): raise its error as itself.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return SpmdRun(results, max(times), stats)
