"""Network interfaces under the U-Net API, registered by name so recipes can pick them.

Each transport builds a network of :class:`~stacklib.unet.Node` objects (host, NI, OS service)
in a given world (real time or a simulation).  The in-process memory transport ships here;
simulated NIs with cost models and real kernel-bypass transports register the same way.

A transport whose nodes run a communication library in place of U-Net endpoints (the Myrinet
libraries of paper 004, :mod:`stacklib.transports.sim.myrinet_libs.transport`) names the service
it puts at the bottom of every stack (``bottom``) and makes those services itself
(``open_nodes``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from stacklib import builtin
from stacklib.registry import Registry
from stacklib.services import Service, UNetService
from stacklib.sim import CostProfile, World
from stacklib.unet.node import Node


class Network(Protocol):
    """What a transport builds: named nodes whose endpoints can open channels to each other."""

    nodes: dict[str, Node]


Builder = Callable[[World, Any, Sequence[str], CostProfile | None], Network]
#: (built network, transport parameters) -> (each node's bottom service, in node order; the peer
#: tables: ``peers[i][j]`` is the peer id node ``i``'s service uses for node ``j``).
NodeOpener = Callable[[Any, Any], tuple[list[Service], list[dict[int, int]]]]


@attrs.frozen
class TransportKind:
    """A registered transport: its parameter class and how to build a network of it."""

    name: str
    Params: type[Any]
    build: Builder
    description: str
    #: Whether it runs in virtual time ("virtual"), real time ("real"), or either ("any").
    clock: str = "any"
    #: The service at the bottom of every stack: raw U-Net over one endpoint per node, or what
    #: ``open_nodes`` makes.
    bottom: type[Service] = UNetService
    #: Makes the nodes' bottom services for a transport without U-Net endpoints (None: the
    #: recipe opens an endpoint per node and connects every pair).
    open_nodes: NodeOpener | None = None
    #: One node per process (ether, xdp: one node per interface): a recipe on it runs as one
    #: rank per node, each in its own process (stacklib.recipes.ranks).
    per_process: bool = False


#: Every transport recipes can name (built-ins, entry points in ``stacklib.transports``,
#: import paths ``"module:KIND"`` naming a :class:`TransportKind`).
TRANSPORTS = Registry.of_instances("transport", TransportKind, builtin.TRANSPORTS)


def register_transport(kind: TransportKind) -> TransportKind:
    """Make a transport available to recipes under ``kind.name``."""
    return TRANSPORTS.register(kind)


def transport_kind(name: str) -> TransportKind:
    """The transport registered as ``name`` (or an import path); an unknown name raises
    :class:`~stacklib.registry.UnknownName` (a ``KeyError``) naming the known ones."""
    return TRANSPORTS[name]


def transports() -> Mapping[str, TransportKind]:
    """Every transport, by name (built-in ones and those of installed distributions)."""
    return TRANSPORTS.load_all()
