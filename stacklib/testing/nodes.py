"""Two nodes with a stack each, opened in one call: the fixture of most layer tests.

``async with two_nodes(world, [ArqLayer()]) as (a, b):`` builds a network of two nodes of a
registered transport (``"memory"`` by default) in ``world``, gives each node its bottom
service (raw U-Net over a connected endpoint, or what the transport makes), optionally wraps
it (``wrap``: e.g. a :class:`~stacklib.testing.faults.FaultyService`), places each node's
copy of the layers as a recipe would, and opens both stacks side by side
(:func:`stacklib.stack.open_stacks`).  :func:`run_virtual` runs a test's ``main`` in virtual
time with a guard that turns a hang into a failure.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from stacklib.services import Service, UNetService
from stacklib.sim import Simulation, World
from stacklib.stack import Layer, Placement, open_stacks
from stacklib.transports import transport_kind
from stacklib.unet import Endpoint, EndpointConfig, connect
from stacklib.unet.node import Node

__all__ = ["NodeStack", "run_virtual", "two_nodes"]


@attrs.frozen
class NodeStack:
    """One node of :func:`two_nodes`: the top of its stack, the peer id by which it reaches
    the other node, its bottom service (as wrapped), its endpoint (None where the transport
    has none) and its node (host, NI, OS service)."""

    service: Service
    peer: int
    bottom: Service
    endpoint: Endpoint | None
    node: Node


LayerSpec = Sequence[Layer[Any]] | Callable[[int], Sequence[Layer[Any]]]
"""The layers of each node: a list (each node gets its own shallow copies), or a function of
the node index (0 or 1) that makes them."""


@asynccontextmanager
async def two_nodes(
    world: World,
    layers: LayerSpec = (),
    *,
    transport: str = "memory",
    params: Any = None,
    endpoint: EndpointConfig | None = None,
    wrap: Callable[[int, Service], Service] | None = None,
) -> AsyncIterator[tuple[NodeStack, NodeStack]]:
    """Open two nodes of ``transport`` (its ``params``, default ones if None) in ``world``,
    each with its stack of ``layers`` over its bottom service (``wrap(index, bottom)`` if
    given), and yield them.  Must run inside ``world``'s run (e.g. :func:`run_virtual`)."""
    kind = transport_kind(transport)
    transport_params = params if params is not None else kind.Params()
    names = ["a", "b"]
    network = kind.build(world, transport_params, names, None)
    nodes = [network.nodes[name] for name in names]
    endpoints: list[Endpoint | None]
    bottoms: list[Service]
    if kind.open_nodes is not None:
        bottoms, peers = kind.open_nodes(network, transport_params)
        endpoints = [None, None]
    else:
        made = [
            node.os.create_endpoint(node.os.process(f"test@{node.name}"), endpoint)
            for node in nodes
        ]
        to_b, to_a = connect(made[0], made[1])
        peers = [{1: to_b}, {0: to_a}]
        bottoms = [UNetService(each) for each in made]
        endpoints = list(made)
    if wrap is not None:
        bottoms = [wrap(index, bottom) for index, bottom in enumerate(bottoms)]
    stacks: list[tuple[Service, Sequence[Layer[Any]]]] = []
    simulated = isinstance(world, Simulation)
    for index, bottom in enumerate(bottoms):
        own = layers(index) if callable(layers) else [copy.copy(layer) for layer in layers]
        cpu = nodes[index].host.resource("cpu") if simulated else None
        placement = Placement(node=index, nodes=2, channels=peers[index], cpu=cpu)
        for layer in own:
            layer.place(placement)
        stacks.append((bottom, own))
    async with open_stacks(stacks) as services:
        a, b = (
            NodeStack(services[i], peers[i][1 - i], bottoms[i], endpoints[i], nodes[i])
            for i in range(2)
        )
        yield a, b


def run_virtual(
    main: Callable[[Simulation], Awaitable[object]],
    *,
    seed: int = 1,
    timeout: float = 60.0,
) -> Simulation:
    """Run ``main(simulation)`` in virtual time; a run still going after ``timeout`` virtual
    seconds fails with :class:`trio.TooSlowError`.  Returns the simulation (its clock and
    statistics)."""
    simulation = Simulation(seed=seed)

    async def guarded() -> None:
        with trio.fail_after(timeout):
            await main(simulation)

    simulation.run(guarded)
    return simulation
