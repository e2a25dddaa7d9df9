"""Workloads and measurements, registered by name so recipes can pick them.

A workload runs on a :class:`Session`: the top service of the stack on each node of a network,
and the peer ids that reach the other nodes.  It returns a :class:`~stacklib.bench.result.Result`.
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from stacklib.bench.pingpong import PingPongParams, pingpong
from stacklib.bench.result import Column, Result
from stacklib.services import DatagramService, Service
from stacklib.sim import World


@attrs.frozen
class Session:
    """What a workload runs on."""

    world: World
    network: Any
    #: The top service of the stack on each node, in node order.
    services: Sequence[Service]
    #: ``peers[i][j]``: the peer id node ``i`` uses to reach node ``j``.
    peers: Sequence[Mapping[int, int]]


Runner = Callable[[Session, Any], Awaitable[Result]]


@attrs.frozen
class WorkloadKind:
    """A registered workload: its parameters, how to run it, and how many nodes it needs."""

    name: str
    Params: type[Any]
    run: Runner
    description: str
    nodes: int = 2
    #: The service the workload drives (the stack's top must provide it), or several it can.
    requires: type[Service] | tuple[type[Service], ...] = DatagramService

    def accepts(self, top: type[Service]) -> bool:
        """Whether the workload can drive a stack whose top provides ``top``."""
        return issubclass(top, self.requires)

    @property
    def needs(self) -> str:
        """The required service kinds, for messages: ``'reliable'`` or ``'reliable' or ..."""
        wanted = self.requires if isinstance(self.requires, tuple) else (self.requires,)
        return " or ".join(repr(service.kind) for service in wanted)


WORKLOADS: dict[str, WorkloadKind] = {}


def register_workload(kind: WorkloadKind) -> WorkloadKind:
    """Make a workload available to recipes under ``kind.name``."""
    if kind.name in WORKLOADS and WORKLOADS[kind.name] is not kind:
        raise ValueError(f"workload name {kind.name!r} is taken")
    WORKLOADS[kind.name] = kind
    return kind


def workload_kind(name: str) -> WorkloadKind:
    """The workload registered as ``name``; ``KeyError`` names the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        known = ", ".join(sorted(WORKLOADS)) or "none"
        raise KeyError(f"no workload named {name!r} (known workloads: {known})") from None


async def _run_pingpong(session: Session, params: PingPongParams) -> Result:
    # The recipe loader checked that the stack's top provides DatagramService.
    client = typing.cast(DatagramService, session.services[0])
    server = typing.cast(DatagramService, session.services[1])
    return await pingpong(client, server, session.peers[0][1], params)


def _register_builtin() -> None:
    # Imported here: these modules import Session from this package.
    from stacklib.bench.bandwidth import BandwidthParams, run_bandwidth
    from stacklib.bench.logp import LogPParams, run_logp

    register_workload(
        WorkloadKind(
            name="bandwidth",
            Params=BandwidthParams,
            run=run_bandwidth,
            description="unidirectional, ping-pong and simultaneous bandwidth vs message size",
        )
    )
    register_workload(
        WorkloadKind(
            name="logp",
            Params=LogPParams,
            run=run_logp,
            description="LogP parameters (RTT/2, Os, Or, g, L) vs message size by delay injection",
        )
    )
    import stacklib.bench.streams  # noqa: F401  (registers udp-pingpong and tcp-stream)


register_workload(
    WorkloadKind(
        name="pingpong",
        Params=PingPongParams,
        run=_run_pingpong,
        description="round-trip time vs message size between two nodes",
    )
)

_register_builtin()

__all__ = [
    "WORKLOADS",
    "Column",
    "Result",
    "Session",
    "WorkloadKind",
    "register_workload",
    "workload_kind",
]
