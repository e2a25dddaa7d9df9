"""Workloads: what a recipe runs on its stacks, registered by name.

A workload runs on a :class:`Session`: the top service of the stack on each node of a network,
and the peer ids that reach the other nodes.  It returns a :class:`~stacklib.bench.result.Result`.
Each workload module registers its own :class:`WorkloadKind` (:func:`register_workload`); the
built-in ones are declared in :mod:`stacklib.builtin`, others come from entry points in the
``stacklib.workloads`` group or an import path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from stacklib import builtin
from stacklib.bench.result import Result
from stacklib.registry import Registry
from stacklib.services import DatagramService, Service
from stacklib.sim import World

__all__ = ["WORKLOADS", "Runner", "Session", "WorkloadKind", "register_workload", "workload_kind"]


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
        """The required services, for messages: ``a 'reliable' service`` or
        ``an 'active-messages' or 'splitc' service``."""
        wanted = self.requires if isinstance(self.requires, tuple) else (self.requires,)
        article = "an" if wanted[0].kind[:1] in "aeiou" else "a"
        return f"{article} {' or '.join(repr(service.kind) for service in wanted)} service"


#: Every workload recipes can name (built-ins, entry points in ``stacklib.workloads``, import
#: paths ``"module:KIND"`` naming a :class:`WorkloadKind`).
WORKLOADS = Registry.of_instances("workload", WorkloadKind, builtin.WORKLOADS)


def register_workload(kind: WorkloadKind) -> WorkloadKind:
    """Make a workload available to recipes under ``kind.name``."""
    return WORKLOADS.register(kind)


def workload_kind(name: str) -> WorkloadKind:
    """The workload registered as ``name`` (or an import path); an unknown name raises
    :class:`~stacklib.registry.UnknownName` (a ``KeyError``) naming the known ones."""
    return WORKLOADS[name]
