"""UAM's event path: in virtual time over a simulated U-Net endpoint (docs/uam.md, "In
virtual time").

No task of its own.  Receive (through ``Endpoint.on_arrival``), handlers, transmission and
timers run as the simulator's callbacks, holding the host CPU for the same costs a receiving
thread and the sender's calls would: U-Net's message-level send and receive
(``ni.host_send_cost``, ``ni.host_recv_cost``) and UAM's protocol work and copies
(:class:`~stacklib.layers.uam.paths.HostCosts`).  A waiting application task is woken only
when what it waits for may hold; a Split-C exchange then wakes trio 0.2 times per PDU instead
of 6.6.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import trio

from stacklib.compiled import mypyc_attr
from stacklib.errors import LocalProtocolError
from stacklib.layers.uam.machine import UamMachine
from stacklib.layers.uam.paths import ExecutionPath, Task
from stacklib.sim import Resource, Simulation
from stacklib.unet import Endpoint, RecvKind

if TYPE_CHECKING:
    from stacklib.layers.uam.service import UamService

__all__ = ["EventPath"]

_RECV_INLINE: Final = RecvKind.INLINE


@mypyc_attr(allow_interpreted_subclasses=True)
class EventPath(ExecutionPath):
    """The event path of ``service`` over ``endpoint`` of a simulated NI in ``world``."""

    name = "event"
    filters_wakes = True

    def __init__(self, service: UamService, endpoint: Endpoint, world: Simulation) -> None:
        super().__init__(service)
        self._endpoint = endpoint
        self._world = world
        ni = endpoint.ni
        self._host_cpu: Resource = ni.host.resource("cpu")
        self._send_cost: Callable[[int], float] | None = ni.host_send_cost
        self._recv_cost: Callable[[int], float] | None = ni.host_recv_cost
        # A machine may have events for poll() (set where arrivals and timers feed the
        # machines, cleared when a poll has taken everything): most polls of a waiting task
        # find nothing, and then need not look at every peer.
        self._unpolled = False
        self._rx_busy = False  # a received PDU is being processed (its CPU hold runs)
        self._defer = 0  # >0 inside poll() or an event: a kick transmits when it ends
        self._dirty = False  # kicked while deferred
        self._timer_at = math.inf  # the earliest timer event scheduled
        self._touched: set[int] = set()  # peers whose machines may have output
        self._touched_all = False  # ... or every machine
        self._held: deque[tuple[int, bytes]] = deque()  # refused by a full send queue

    @property
    def held(self) -> int:
        """PDUs the endpoint's full send queue refused, waiting (in order) for room."""
        return len(self._held)

    # ------------------------------------------------------------------ the service's calls

    def start(self) -> list[Task]:
        """Receive through the endpoint's arrival hook from now on; no tasks."""
        endpoint = self._endpoint
        if endpoint.on_arrival is not None or endpoint.on_send_space is not None:
            raise LocalProtocolError(f"UAM: {endpoint!r} already has a driver attached")
        endpoint.on_arrival = self._on_arrival
        if endpoint.recv_queue:
            self._on_arrival()
        return []

    def kick(self, peer: int | None, now: float | None = None) -> None:
        if peer is None:
            self._touched_all = True
        else:
            self._touched.add(peer)
        if self._defer:
            self._dirty = True
        else:
            self._transmit()

    def poll(self) -> int:
        if not self._unpolled:
            return 0
        service = self.service
        count = 0
        self._defer += 1  # transmit what the handlers produce once, at the end
        try:
            for peer, machine in service._machine_items:
                if machine.pending:
                    self._touched.add(peer)  # taking its events may make an ACK due
                    count += service._run_handlers(peer, machine)
            # Everything taken (a nested poll from a handler took the rest, if any); if a
            # handler raised, the flag stays set for what is left.
            self._unpolled = False
        finally:
            service._current_machine = None
            self._defer -= 1
            if count or self._dirty:
                self._dirty = True
                if not self._defer:
                    self._transmit()
        return count

    def worth_waking(self) -> bool:
        """Would a waiting task find anything new?  Every arrival wakes, but a rank waiting for
        window room to one peer has no use for a PDU from another: waking it costs a pass of
        trio's loop for nothing (most of a Split-C exchange's wall time, before this test)."""
        service = self.service
        if service._closed or service._errors or service._failures:
            return True
        if self._unpolled and not service._params.background_poll:
            return True  # only the application's own poll runs the handlers
        return any(predicate() for predicate in service._waiting)

    def schedule_point_skipped(self) -> bool:
        return self._world._skip_schedule_point()

    def close(self) -> None:
        endpoint = self._endpoint
        endpoint.on_arrival = None
        endpoint.on_send_space = None

    # ------------------------------------------------------------------ receive

    def _on_arrival(self) -> None:
        # The NI pushed a receive descriptor.  One PDU at a time: the next is taken when the
        # host is done with this one, as a receiving thread would.
        if not self._rx_busy and not self.service._closed:
            self._receive_next()

    def _receive_next(self) -> None:
        """Take the next PDU from the receive queue and hold the host CPU for its cost: U-Net's
        receive and UAM's protocol work and copy (paper 000 §5.1.2), then :meth:`_received`."""
        endpoint = self._endpoint
        # U-Net's descriptor-level receive (Endpoint.poll without building a Message).
        descriptor = endpoint.poll_descriptor() if not endpoint.closed else None
        if descriptor is None:
            self._rx_busy = False
            return
        self._rx_busy = True
        if descriptor.kind is _RECV_INLINE:
            data = descriptor.inline or b""
        else:
            data = endpoint.read(descriptor)
            if descriptor.fragments:
                endpoint.release(descriptor)
        cost = self._cost(data, self._recv_cost)
        if cost > 0.0:
            self._host_cpu.hold(cost, self._received, descriptor.channel, data)
        else:
            self._world.call_at(self._world.now(), self._received, descriptor.channel, data)

    def _received(self, peer: int, datagram: bytes) -> None:
        service = self.service
        if service._closed:
            self._rx_busy = False
            return
        self._defer += 1
        try:
            machine = service._machines.get(peer)
            if machine is None:
                machine = service._add_machine(peer)
            machine.receive(datagram, service._now())
            self._touched.add(peer)  # window room for the backlog, or an ACK owed
            if machine.pending:
                # Every earlier arrival was handled at once unless something is left over: then
                # this machine alone has events, and poll() need not look at the others.
                # (Without background_poll the handlers wait for the application's poll().)
                alone = not (self._unpolled or service._errors)
                self._unpolled = True
                if service._params.background_poll and not alone:
                    service._background_poll()
                elif service._params.background_poll:
                    try:
                        service._run_handlers(peer, machine)
                        self._unpolled = False
                    except Exception as error:  # handed to the application's next call
                        service._errors.append(error)
                    finally:
                        service._current_machine = None
            service._wake()
        finally:
            self._defer -= 1
        # Window room for the backlog, an ACK owed, replies the handlers produced.
        self._transmit()
        if self._endpoint.recv_queue:
            self._receive_next()
        else:
            self._rx_busy = False

    # ------------------------------------------------------------------ transmit and timers

    def _transmit(self) -> None:
        """Hand every touched machine's output to the host CPU (each PDU is sent when its
        hold ends) and schedule the earliest timer."""
        self._dirty = False
        service = self.service
        if service._closed:
            return
        now = service._now()
        moved = False
        earliest = math.inf
        touched = self._touched
        items: Sequence[tuple[int, UamMachine]]
        if self._touched_all:
            self._touched_all = False
            touched.clear()
            items = service._machine_items
        elif len(touched) == 1:
            peer = touched.pop()
            items = ((peer, service._machines[peer]),)
        else:
            machines = service._machines
            items = [(peer, machines[peer]) for peer in touched]
            touched.clear()
        for peer, machine in items:
            if machine.has_output:
                datagrams = machine.datagrams_to_send(now)
                if datagrams:
                    moved = True
                    for datagram in datagrams:
                        self._send(peer, datagram)
            timer = machine.get_timer()
            if timer is not None and timer < earliest:
                earliest = timer
        if earliest < self._timer_at:
            self._timer_at = earliest
            self._world.call_at(earliest if earliest > now else now, self._on_timer, earliest)
        if moved:
            service._wake()  # the backlog moved: senders waiting for it may go on

    def _send(self, peer: int, datagram: bytes) -> None:
        # Copy into a send buffer and post it (paper 000 §5.1.2), on the host CPU.
        cost = self._cost(datagram, self._send_cost)
        if cost > 0.0:
            self._host_cpu.hold(cost, self._post, peer, datagram)
        else:
            self._post(peer, datagram)

    def _cost(self, datagram: bytes, unet: Callable[[int], float] | None) -> float:
        """Host CPU seconds of one PDU: UAM's work and copy (where the NI models them) and
        U-Net's message-level send or receive (``unet``)."""
        costs = self.service._costs
        cost = costs.cost(datagram) if costs is not None else 0.0
        if unet is not None:
            cost += unet(len(datagram))
        return cost

    def _post(self, peer: int, datagram: bytes) -> None:
        endpoint = self._endpoint
        if self.service._closed or endpoint.closed:
            return
        held = self._held
        if held:
            held.append((peer, datagram))  # behind what the send queue refused, in order
            return
        try:
            endpoint.send_nowait(peer, datagram)
        except trio.WouldBlock:
            held.append((peer, datagram))
            # Told when the send queue has room again (only while something waits: the
            # endpoint calls this hook twice for every PDU sent).
            endpoint.on_send_space = self._on_send_space

    def _on_send_space(self) -> None:
        endpoint = self._endpoint
        held = self._held
        while held and not endpoint.closed:
            peer, datagram = held[0]
            try:
                endpoint.send_nowait(peer, datagram)
            except trio.WouldBlock:
                return
            held.popleft()
        endpoint.on_send_space = None

    def _on_timer(self, at: float) -> None:
        service = self.service
        if at != self._timer_at or service._closed:
            return  # superseded by an earlier timer event, which scheduled the next
        self._timer_at = math.inf
        now = service._now()
        failed = False
        self._defer += 1
        try:
            for _, machine in service._machine_items:
                timer = machine.get_timer()
                if timer is not None and timer <= now:
                    machine.handle_timer(now)
                    if machine.pending:
                        self._unpolled = failed = True  # a PeerFailed to report
            self._touched_all = True
            if failed:
                service._wake()
                if service._params.background_poll:
                    service._background_poll()
        finally:
            self._defer -= 1
        self._transmit()
