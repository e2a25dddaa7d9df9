"""Network interfaces under the U-Net API, registered by name so recipes can pick them.

Each transport builds a network of :class:`~stacklib.unet.Node` objects (host, NI, OS service)
in a given world (real time or a simulation).  The in-process memory transport ships here;
simulated NIs with cost models and real kernel-bypass transports register the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from stacklib.sim import CostProfile, World
from stacklib.unet.node import Node


class Network(Protocol):
    """What a transport builds: named nodes whose endpoints can open channels to each other."""

    nodes: dict[str, Node]


Builder = Callable[[World, Any, Sequence[str], CostProfile | None], Network]


@attrs.frozen
class TransportKind:
    """A registered transport: its parameter class and how to build a network of it."""

    name: str
    Params: type[Any]
    build: Builder
    description: str
    #: Whether it runs in virtual time ("virtual"), real time ("real"), or either ("any").
    clock: str = "any"


TRANSPORTS: dict[str, TransportKind] = {}


def register_transport(kind: TransportKind) -> TransportKind:
    """Make a transport available to recipes under ``kind.name``."""
    if kind.name in TRANSPORTS and TRANSPORTS[kind.name] is not kind:
        raise ValueError(f"transport name {kind.name!r} is taken")
    TRANSPORTS[kind.name] = kind
    return kind


def transport_kind(name: str) -> TransportKind:
    """The transport registered as ``name``; ``KeyError`` names the known ones."""
    _import_builtin_transports()
    try:
        return TRANSPORTS[name]
    except KeyError:
        known = ", ".join(sorted(TRANSPORTS)) or "none"
        raise KeyError(f"no transport named {name!r} (known transports: {known})") from None


def transports() -> Mapping[str, TransportKind]:
    """Every registered transport."""
    _import_builtin_transports()
    return TRANSPORTS


def _import_builtin_transports() -> None:
    from stacklib.transports import (  # noqa: F401  (they register themselves)
        ether,
        memory,
        shm,
        sim,
        tap,
        udp,
    )
