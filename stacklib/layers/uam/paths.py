"""How a :class:`~stacklib.layers.uam.service.UamService` runs its machines: the execution
path, one strategy object chosen once, when the service is made (docs/uam.md).

* :class:`~stacklib.layers.uam.event_path.EventPath`: in virtual time over a simulated U-Net
  endpoint, receive, handlers, transmission and timers run as the simulator's callbacks;
* :class:`~stacklib.layers.uam.lean_path.LeanPath`: over a real U-Net endpoint, the
  application's own polls receive and transmit;
* :class:`~stacklib.layers.uam.task_path.TaskPath`: over any datagram service, the generic
  :class:`stacklib.driver.Driver` (a receive task and a pump).

:func:`stacklib.layers.uam.service.choose_path` picks one from what the service below lends
(``below.capability(Endpoint)``) and the documented attributes of the endpoint's NI: its
``world`` (a :class:`~stacklib.sim.Simulation` or real time), ``host_copy_per_byte`` (the NI
models its host's costs) and, for a :class:`~stacklib.unet.polled.PolledNI`, ``spin_time``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import attrs
import trio

from stacklib.compiled import mypyc_attr
from stacklib.layers.uam.wire import PduType
from stacklib.sim import Resource
from stacklib.unet import Endpoint

if TYPE_CHECKING:
    from stacklib.layers.uam.service import UamService

__all__ = ["ExecutionPath", "HostCosts", "Task", "host_costs"]

Task = tuple[Callable[[], Awaitable[None]], str]
"""A background task as :func:`stacklib.stack.serve` takes it: (function, name)."""

_DATA_TYPES: Final = frozenset({int(PduType.STORE), int(PduType.GET_REPLY)})


@attrs.frozen
class HostCosts:
    """What UAM's work holds the host CPU for, where the NI models its host
    (``host_copy_per_byte > 0``): every PDU sent or received costs ``proto`` seconds plus one
    copy of its bytes at ``copy`` seconds per byte, "from the source data structure into a
    send buffer and from the receive buffer into the destination data structure" (paper 000
    §5.2), and a bulk PDU ``bulk`` more."""

    cpu: Resource
    copy: float
    proto: float
    bulk: float

    def cost(self, datagram: bytes) -> float:
        """Host CPU seconds to copy ``datagram`` and run the protocol on it."""
        cost = self.proto + self.copy * len(datagram)
        if datagram and datagram[0] in _DATA_TYPES:
            cost += self.bulk
        return cost


def host_costs(endpoint: Endpoint | None, proto_us: float, bulk_us: float) -> HostCosts | None:
    """The costs to charge over ``endpoint`` (None: its NI models no host, or no endpoint)."""
    if endpoint is None:
        return None
    ni = endpoint.ni
    if not ni.host_copy_per_byte > 0:
        return None
    return HostCosts(
        ni.host.resource("cpu"), ni.host_copy_per_byte, proto_us * 1e-6, bulk_us * 1e-6
    )


@mypyc_attr(allow_interpreted_subclasses=True)
class ExecutionPath:
    """The interface between a :class:`UamService` and the way its machines are run.

    The service calls :meth:`kick` when a machine may have something to send, :meth:`poll`
    to run the handlers of what arrived (receiving first where the path receives in the
    caller's task), and :meth:`start` once, inside the run, for the background tasks.
    """

    #: "event", "task" or "lean".
    name = "base"
    #: Whether :meth:`worth_waking` can say no (else the service does not ask).
    filters_wakes = False

    def __init__(self, service: UamService) -> None:
        self.service = service
        # Set when an arrival or a failure may have events for the application (the poller
        # of the task and lean paths waits on it).
        self._arrival = trio.Event()

    def __repr__(self) -> str:
        return f"<UAM {self.name} path of {self.service!r}>"

    @property
    def spin(self) -> float | None:
        """Seconds a waiting task keeps polling before it parks (None: it parks at once)."""
        return None

    @property
    def hot_spin(self) -> float:
        """Seconds of :attr:`spin` a waiting task polls without yielding to other tasks."""
        return 0.0

    def start(self) -> list[Task]:
        """Begin (inside the run, after the service's clock is bound); the background tasks."""
        return []

    def kick(self, peer: int | None, now: float | None = None) -> None:
        """A machine (``peer``'s, or any) may have something to send; ``now``, if given, is
        the caller's reading of the service's clock (a path may use it instead of its own)."""
        raise NotImplementedError

    def poll(self) -> int:
        """Run the handlers of what has arrived; returns how many ran."""
        raise NotImplementedError

    def worth_waking(self) -> bool:
        """Whether the parked tasks should be woken now (False: nothing they wait for can
        have changed)."""
        return True

    def schedule_point_skipped(self) -> bool:
        """Count a schedule point without yielding, where yielding would change nothing."""
        return False

    def close(self) -> None:
        """The layer closes: stop taking input."""
        return None

    async def poller(self) -> None:
        """Run :meth:`UamService.poll` whenever messages arrived (``background_poll``)."""
        service = self.service
        while True:
            arrival = self._arrival = trio.Event()
            service._background_poll()
            await arrival.wait()
