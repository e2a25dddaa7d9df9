"""UAM's lean path: over a real U-Net endpoint (docs/uam.md, "Over a real transport").

:meth:`UamService.poll` and the waits take datagrams from the endpoint themselves and run the
machines and handlers in the caller's task; output goes straight to the endpoint with
``send_payload`` (no descriptor per datagram), once at the end of a poll.  A round trip then
needs no hand-off between trio tasks.  The receive task only takes what the application's polls
have not (running the handlers with ``background_poll``) and sleeps on the NI in between; the
pump only runs timers and resends what the endpoint refused.

Where the NI is a :class:`~stacklib.unet.polled.PolledNI` (shm, udp, ether), a waiting task and
the receive task poll with checkpoints for its documented ``spin_time`` before they sleep in
its ``idle_wait``; on another NI the receive task blocks in the endpoint's receive.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import trio
import trio.lowlevel

from stacklib.compiled import mypyc_attr
from stacklib.errors import UNetError
from stacklib.layers.uam.paths import ExecutionPath, Task
from stacklib.unet import Endpoint
from stacklib.unet.express import NativeQueue
from stacklib.unet.polled import PolledNI, others_runnable, relax

if TYPE_CHECKING:
    from stacklib.layers.uam.machine import UamMachine
    from stacklib.layers.uam.service import UamService

__all__ = ["LeanPath"]

_RETRY: Final = 20e-6  # seconds before the pump offers the endpoint again what it refused
#: The ``await`` calls that did not wait (``request``, a ``wait_until`` whose condition held
#: within the hot spin) yield to other trio tasks once in this many calls, as the shm
#: endpoint's do: a pass of trio's loop with UAM's tasks costs some 10 us compiled, twice a
#: whole polled round trip.
YIELD_EVERY: Final = 256


@mypyc_attr(allow_interpreted_subclasses=True)
class LeanPath(ExecutionPath):
    """The lean path of ``service`` over ``endpoint`` of a real NI."""

    name = "lean"

    def __init__(self, service: UamService, endpoint: Endpoint) -> None:
        super().__init__(service)
        #: Whether polls and sends take the lean forms in the common case (False: always the
        #: general forms, the reference the tests compare them with).
        self.fast = True
        self._endpoint = endpoint
        ni = endpoint.ni
        self._polled: PolledNI | None = ni if isinstance(ni, PolledNI) else None
        self._spin = self._polled.spin_time if self._polled is not None else 0.0
        # The hot spin is part of the spin, and only where the NI spins at all (not where
        # ranks outnumber the CPUs and spinning would take a core another rank needs).
        hot_us = service._params.hot_spin_us
        if self._polled is None or not self._spin:
            self._hot = 0.0
        elif hot_us is None:
            self._hot = min(self._polled.hot_spin, self._spin)
        else:
            self._hot = hot_us * 1e-6
            self._spin = max(self._spin, self._hot)
        self._unyielded = 0  # await calls since the last one that yielded
        self._kick_event = trio.Event()
        self._kicked = False  # _kick_event is set (a flag: testing the event is a call)
        self._pump_deadline = math.inf  # when the pump wakes next (inf: only if kicked)
        # The application's polls, counted (a clock reading per poll would cost more): the
        # receive task keeps spinning while this moves.
        self._polls = 0
        self._deferred: bool | None = None  # in a poll: None, or whether to flush after
        self._unsent: dict[int, deque[bytes]] = {}
        # Set when the machines may hold arrivals or events no poll has run yet (taken by the
        # receive task or the pump, or left by a raising handler): the next poll is the full one.
        self._unpolled = False
        #: Whether polls and transmissions of the one machine use the endpoint's queues
        #: directly where it lends them (False: its ordinary calls; the tests compare both).
        self.express = True
        # The express lane (stacklib.unet.express), where the endpoint lends its queues.
        self._lends = type(endpoint).express_rx is not Endpoint.express_rx
        # The clock the express poll reads: trio's default clock as its offset from
        # perf_counter (the C core reads it itself), set at start, when the run's clock is known.
        self._clock: Callable[[], float] | float = service._now

    @property
    def spin(self) -> float | None:
        return self._spin

    @property
    def hot_spin(self) -> float:
        return self._hot

    def schedule_point_skipped(self) -> bool:
        """Skip the schedule point of an ``await`` call that did not wait, but every
        :data:`YIELD_EVERY`-th (the call is still a cancellation point: the service tests
        for cancellation first)."""
        unyielded = self._unyielded + 1
        if unyielded < YIELD_EVERY:
            self._unyielded = unyielded
            return True
        self._unyielded = 0
        return False

    def start(self) -> list[Task]:
        """The receive task and the pump, and the poller with ``background_poll``."""
        offset = self.service._offset
        self._clock = self.service._now if offset is None else offset
        tasks: list[Task] = [(self._receive, "uam receive"), (self._pump, "uam pump")]
        if self.service._params.background_poll:
            tasks.append((self.poller, "uam poller"))
        return tasks

    def kick(self, peer: int | None, now: float | None = None) -> None:
        if self._deferred is not None:
            self._deferred = True  # a poll is running: it transmits when done
        elif peer is not None and not self._unsent and self.fast:
            # Only that machine has new output (a request or reply): the others' timers
            # are the pump's.
            self._transmit(peer, self.service._machines[peer], True, now)
        else:
            self._flush(now=now)

    def poll(self) -> int:
        """Receive from the endpoint, run the handlers, and transmit once at the end whatever
        they and the arrivals produced (replies, ACKs).

        The common case (not nested in a handler, nothing fed to the machines since the last
        poll, nothing refused by the endpoint) is :meth:`_poll_arrivals`: an empty poll costs
        one look at the endpoint.  Everything else takes :meth:`_poll_all`, the reference.
        """
        self._polls += 1
        if self._deferred is not None or self._unpolled or self._unsent or not self.fast:
            return self._poll_all()
        if self._lends and self.express:
            items = self.service._machine_items
            if len(items) == 1:
                peer, machine = items[0]
                rx = self._endpoint.express_rx(peer)
                if rx is not None:
                    return self._poll_express(rx, peer, machine)
        arrival = self._endpoint.poll_payload()
        if arrival is None:
            return 0
        return self._poll_arrivals(arrival)

    def _poll_arrivals(self, first: tuple[int, bytes]) -> int:
        """The lean poll: feed each datagram to its machine and run what it made ready at once
        (requests and replies as tuples, no event objects), then transmit once.  Handling each
        arrival before taking the next keeps at most one arrival per peer waiting, so the 2w
        buffers never fill (as in virtual time); the datagrams sent are those of
        :meth:`_poll_all`, which takes all arrivals first (the replies and ACKs are built at
        the one transmission, with the same acknowledgment)."""
        service = self.service
        machines = service._machines
        # (channel, data): no Message per datagram.  (endpoint.poll_payload() at each call,
        # not a bound method kept: compiled, a native call.)
        endpoint = self._endpoint
        now = service._now()
        count = 0
        self._deferred = False
        done = False
        arrival: tuple[int, bytes] | None = first
        peer = first[0]
        machine = None
        service._poll_now = now  # the handlers' replies take this reading of the clock
        service._in_poll = True
        try:
            while arrival is not None:
                peer, data = arrival
                machine = machines.get(peer)
                if machine is None:
                    machine = service._add_machine(peer)
                machine.receive(data, now)
                count += service._run_handlers(peer, machine)  # (compiled: a native call)
                arrival = endpoint.poll_payload()
            done = True
        finally:
            service._current_machine = None
            service._in_poll = False
            self._deferred = None
            if not done:
                self._unpolled = True  # a handler raised: the rest waits for the next poll
            # Acknowledgments took effect (the window may have room), handlers replied.
            if machine is not None and len(machines) == 1 and not self._unsent:
                self._transmit(peer, machine, True, now)
            else:
                self._flush(now=now)
            if service._waiting:
                service._wake()
        return count

    def _poll_express(self, rx: NativeQueue, peer: int, machine: UamMachine) -> int:
        """:meth:`_poll_arrivals` for the one machine, its peer's queue read by the machine
        itself (``express_poll``): no tuple, ``bytes`` or Python call per datagram in the C
        core; the same datagrams taken, handlers run and transmission after.  An empty queue
        costs the one call."""
        service = self.service
        self._deferred = False
        service._in_poll = True
        done = False
        taken = 0
        try:
            taken = machine.express_poll(rx, self._clock, service._handlers, service, peer)
            done = True
        finally:
            service._current_machine = None
            service._in_poll = False
            self._deferred = None
            broken = False
            if not done:
                taken = machine.express_taken
            elif taken < 0:  # the queue broke (after -1 - taken messages)
                taken = -1 - taken
                broken = True
            if taken or broken:
                self._endpoint.express_received(peer, taken, machine.express_bytes, broken)
            if taken:
                if not done:
                    self._unpolled = True  # a handler raised: the rest waits for the next poll
                now = service._poll_now
                if len(service._machines) == 1 and not self._unsent:
                    self._transmit(peer, machine, True, now)
                else:
                    self._flush(now=now)
                if service._waiting:
                    service._wake()
        return machine.express_handled if taken else 0

    def _poll_all(self) -> int:
        """The general poll: take every datagram waiting (while each peer has room for its
        arrivals), run every machine's handlers, loop while some peer was full."""
        nested = self._deferred is not None
        if not nested:
            self._deferred = False
        service = self.service
        count = 0
        done = False
        try:
            while True:
                if self._absorb(flush=False):
                    self._deferred = True
                full = self._arrivals_full()
                for peer, machine in service._machine_items:
                    count += service._run_handlers(peer, machine)
                if not full:  # else more may wait at the endpoint, which _absorb left there
                    break
            done = True
        finally:
            service._current_machine = None
            if not nested:
                self._unpolled = not done  # done: every arrival taken so far was handled
                flush = count or self._deferred
                self._deferred = None
                if flush:
                    self._flush()
        return count

    # ------------------------------------------------------------------ receive

    async def _receive(self) -> None:
        """Take what the application's own polls have not taken yet, run the handlers at once
        with ``background_poll``, and sleep on the NI when nothing arrives (it never holds a
        datagram across a checkpoint, so datagrams reach the machines in arrival order
        whichever task takes them)."""
        service = self.service
        endpoint = self._endpoint
        polled = self._polled
        background = service._params.background_poll
        # With background_poll this task answers the peers' requests: for hot_spin seconds
        # after it handled an arrival (a busy channel's next one comes sooner than a pass of
        # trio's loop takes) it polls without checkpoints while no other task is queued to
        # run; otherwise it yields between polls.
        hot = self._hot if background else 0.0
        hot_until = 0.0
        while True:
            if service._closed or endpoint.closed:
                return
            if self._absorb():
                if background:
                    service._background_poll()
                    if hot:
                        hot_until = time.perf_counter() + hot
                        if not others_runnable() and self.schedule_point_skipped():
                            continue
                await trio.lowlevel.checkpoint()
                continue
            if polled is None:
                # No NI to sleep on: a blocking receive.  Only shm has arrivals from another
                # process between two polls, and it has idle_wait.
                try:
                    message = await endpoint.recv()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return
                machine = service._machines.get(message.channel)
                if machine is None:
                    machine = service._add_machine(message.channel)
                machine.receive(message.data, service._now())
                self._unpolled = True
                self.kick(None)
                service._wake()
                if background:
                    service._background_poll()
                continue
            # Spin with checkpoints for the NI's spin time, then sleep until a peer wakes
            # the node (a failed peer shows as retransmission timeouts, as in the paper).
            # While the application polls, keep spinning: asleep, this task would make every
            # sender pay a wake-up system call.
            spin = self._spin
            deadline = time.perf_counter() + spin
            yield_at = hot_until
            spins = 0
            polls = self._polls
            while (now := time.perf_counter()) < deadline or self._polls != polls:
                if self._polls != polls:  # the application polled since the last look
                    polls = self._polls
                    deadline = now + spin
                spins += 1
                relax(spins)  # a peer sharing this CPU runs now, not after our time slice
                if now >= yield_at or others_runnable():
                    await trio.lowlevel.checkpoint()
                    yield_at = 0.0  # a stretch without checkpoints follows arrivals only
                if service._closed or self._absorb():
                    break
            else:
                await polled.idle_wait()
                continue
            if background:
                service._background_poll()
                if hot:
                    hot_until = time.perf_counter() + hot

    def _absorb(self, flush: bool = True) -> int:
        """Feed every datagram waiting at the endpoint to its machine; returns how many.
        Handlers wait for a poll; acknowledgments and window room take effect."""
        if self._arrivals_full():
            return 0  # handlers first: the next datagram may be for that peer
        endpoint = self._endpoint
        arrival = endpoint.poll_payload()
        if arrival is None:
            return 0
        service = self.service
        now = service._now()
        machines = service._machines
        count = 0
        while arrival is not None:
            peer, data = arrival
            machine = machines.get(peer)
            if machine is None:
                machine = service._add_machine(peer)
            machine.receive(data, now)
            count += 1
            self._unpolled = True
            if machine.arrivals_full:
                # Taking more would drop this peer's next PDU (go-back-N would resend it and
                # everything after it, after a timeout); at the endpoint it waits for a poll.
                break
            arrival = endpoint.poll_payload()
        if flush:
            self._flush()  # window room for the backlog, or an ACK owed for a duplicate
        if service._waiting:
            service._wake()
        return count

    def _arrivals_full(self) -> bool:
        """Some peer has 2w arrivals waiting for their handlers."""
        return any(machine.arrivals_full for _, machine in self.service._machine_items)

    # ------------------------------------------------------------------ transmit and timers

    def _flush(self, kick: bool = True, now: float | None = None) -> bool:
        """Transmit what the machines want sent, now, with ``send_payload``; what the endpoint
        refuses waits (in order) for the pump.  Returns False if something waits.  Kicks the
        pump only when a timer is due before the pump would wake."""
        service = self.service
        items = service._machine_items
        unsent = self._unsent
        if len(items) == 1 and not unsent and self.fast:
            peer, machine = items[0]
            return self._transmit(peer, machine, kick, now)
        endpoint = self._endpoint
        if now is None:
            now = service._now()
        moved = False
        done = True
        earliest = math.inf
        for peer, machine in service._machines.items():
            datagrams = machine.datagrams_to_send(now)
            if unsent:
                waiting = unsent.get(peer)
                if waiting:
                    waiting.extend(datagrams)
                    datagrams = list(waiting)
                    waiting.clear()
            if datagrams:
                for index, datagram in enumerate(datagrams):
                    try:
                        endpoint.send_payload(peer, datagram)
                    except trio.WouldBlock:
                        unsent.setdefault(peer, deque()).extend(datagrams[index:])
                        done = False
                        break
                    except UNetError as error:
                        self._rejected(error)
                    moved = True
            timer = machine.get_timer()
            if timer is not None and timer < earliest:
                earliest = timer
        if kick and (not done or earliest < self._pump_deadline):
            self._kicked = True
            self._kick_event.set()
        if moved and service._waiting:
            service._wake()  # the backlog moved: senders waiting for it may go on
        return done

    def _transmit(
        self, peer: int, machine: UamMachine, kick: bool = True, now: float | None = None
    ) -> bool:
        """:meth:`_flush` for one machine, when nothing refused waits for any peer."""
        service = self.service
        if now is None:
            now = service._now()
        tx = self._endpoint.express_tx(peer) if self._lends and self.express else None
        moved = 0
        datagrams: list[bytes] | None = None  # for send_payload (None: none; no list built)
        if tx is not None:
            # The machine writes straight into the queue; what it refused goes on below.
            sent = machine.express_send(tx, now)
            if sent is not None:  # (None: nothing to send)
                moved, nbytes, wakes, datagrams = sent
                if moved:
                    self._endpoint.express_sent(peer, moved, nbytes, wakes)
        else:
            datagrams = machine.datagrams_to_send(now)
        done = True
        index = 0
        if datagrams:
            endpoint = self._endpoint
            for index, datagram in enumerate(datagrams):
                try:
                    endpoint.send_payload(peer, datagram)  # (compiled: a native call)
                except trio.WouldBlock:
                    self._unsent[peer] = deque(datagrams[index:])
                    done = False
                    break
                except UNetError as error:
                    self._rejected(error)
        # (A pump whose deadline has passed runs at the next checkpoint anyway: no kick.)
        if kick and not self._kicked and now < self._pump_deadline:
            timer = machine.get_timer()
            if not done or (timer is not None and timer < self._pump_deadline):
                self._kicked = True
                self._kick_event.set()
        if (moved or datagrams) and service._waiting and (moved or done or index):
            service._wake()  # the backlog moved: senders waiting for it may go on
        return done

    def _rejected(self, error: UNetError) -> None:
        """A datagram the NI rejected (``send_payload``'s :class:`UNetError`, where
        ``send_nowait`` returned a descriptor marked ``ERROR``): counted in the service's
        ``rejected`` and otherwise taken as lost (go-back-N resends it, and a peer that stays
        unreachable fails as one that loses everything).  Its subclasses (a closed endpoint,
        a gone peer) are raised, as ``send_nowait`` raised them."""
        if type(error) is not UNetError:
            raise error
        self.service.rejected += 1

    async def _pump(self) -> None:
        """Only timers and what the endpoint refused to take."""
        service = self.service
        while True:
            kick = self._kick_event = trio.Event()
            self._kicked = False
            self._pump_deadline = math.inf  # a kick from now on makes it run again
            # What has arrived counts before a timer fires (after a stall of this process,
            # an acknowledgment waiting at the endpoint must not be taken for a loss).
            if self._absorb(flush=False) and service._params.background_poll:
                service._background_poll()
            now = service._now()
            for machine in list(service._machines.values()):
                timer = machine.get_timer()
                if timer is not None and timer <= now:
                    machine.handle_timer(now)
                    if machine.pending:
                        self._unpolled = True
                        self._arrival.set()  # a PeerFailed to report
                        service._wake()
            done = self._flush(kick=False)
            deadline = math.inf
            for machine in service._machines.values():
                timer = machine.get_timer()
                if timer is not None:
                    deadline = min(deadline, timer)
            if not done:  # the endpoint's queues are full: try again soon
                deadline = min(deadline, service._now() + _RETRY)
            self._pump_deadline = deadline
            with trio.move_on_at(deadline):
                await kick.wait()
