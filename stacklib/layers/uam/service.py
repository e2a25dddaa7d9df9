"""The service of U-Net Active Messages: GAM 1.1 over a datagram service (paper 000 §5).

:class:`UamService` is what the application calls.  It makes no protocol decisions (the
machines of :mod:`stacklib.layers.uam.machine` do) and it does no I/O itself: it keeps one
:class:`~stacklib.layers.uam.machine.UamMachine` per peer, the handler table, the registered
memory regions and the tasks waiting for something, and runs the handlers of what arrived.
How the machines are fed and their output transmitted is the job of its execution path
(:mod:`stacklib.layers.uam.paths`), chosen once when the service is made:

* the *event path* (:mod:`~stacklib.layers.uam.event_path`), in virtual time over a simulated
  U-Net endpoint: receive, handlers, transmission and timers run as the simulator's
  callbacks, holding the host CPU for the same costs; no task of its own (docs/uam.md, "In
  virtual time");
* the *lean path* (:mod:`~stacklib.layers.uam.lean_path`), over a real U-Net endpoint:
  :meth:`UamService.poll` and the waits take datagrams from the endpoint themselves and run
  the machines and handlers in the caller's task (docs/uam.md, "Over a real transport");
* the *task path* (:mod:`~stacklib.layers.uam.task_path`), over any other datagram service:
  the generic :class:`stacklib.driver.Driver`'s receive task and pump.

With ``background_poll=True`` (the default) handlers run as messages arrive (a poller task on
the task and lean paths); with ``background_poll=False`` only when the application polls, as
in the paper ("The UAM layer receives messages by explicit polling", §5.1.2).

Costs (only where the NI models the host: ``endpoint.ni.host_copy_per_byte > 0``): every PDU
sent or received holds the host CPU for ``proto_us`` plus one memory copy of its bytes
(:class:`~stacklib.layers.uam.paths.HostCosts`).  On real transports nothing is charged.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import attrs
import trio
import trio.lowlevel

from stacklib.compiled import mypyc_attr
from stacklib.errors import (
    LocalProtocolError,
    PeerUnreachable,
    RemoteProtocolError,
)
from stacklib.layers.uam.event_path import EventPath
from stacklib.layers.uam.lean_path import LeanPath
from stacklib.layers.uam.machine import (
    Delivered,
    Event,
    GetReceived,
    GetReplyReceived,
    PeerFailed,
    ReplyReceived,
    RequestReceived,
    StoreReceived,
    UamMachine,
    UamStatistics,
)
from stacklib.layers.uam.params import UamParams
from stacklib.layers.uam.paths import ExecutionPath, HostCosts, Task, host_costs
from stacklib.layers.uam.task_path import TaskPath
from stacklib.layers.uam.wire import MAX_OVERHEAD, PduType
from stacklib.services import (
    ActiveMessageService,
    ActiveMessageTables,
    DatagramService,
    Handler,
    RemoteAddress,
)
from stacklib.sim import Simulation
from stacklib.unet import Endpoint
from stacklib.unet.polled import relax

__all__ = ["Handler", "RemoteAddress", "UamParams", "UamService", "choose_path"]

_REQUEST: Final = int(PduType.REQUEST)
MAX_MESSAGE: Final = 1 << 24  # the datagram face accepts any size; this bounds a single message
# A module constant, not an imported name: compiled, a static read instead of a look-up in the
# module's dictionary at every reading of the clock.
_perf_counter: Final = time.perf_counter


def _clock_offset(clock: trio.abc.Clock) -> float | None:
    """The offset of trio's default clock, which reads ``perf_counter()`` plus a fixed
    random offset (its ``offset`` field), checked against one reading of it; None for any
    other clock (virtual time, a test's), which the service then calls."""
    kind = type(clock)
    offset = getattr(clock, "offset", None)
    if kind.__name__ != "SystemClock" or not kind.__module__.startswith("trio"):
        return None
    if type(offset) is not float:
        return None
    value: float = offset
    before = _perf_counter()
    reading = clock.current_time()
    after = _perf_counter()
    return value if value + before <= reading <= value + after else None


@mypyc_attr(allow_interpreted_subclasses=True)
class UamService(ActiveMessageService):
    """Generic Active Messages 1.1 with peers over a datagram service; made by
    :class:`UamLayer`.  See docs/uam.md.

    As a reliable service it also carries messages: :meth:`send` is a block store into
    the peer's inbox and :meth:`recv` takes them out, so the generic workloads run over UAM.
    """

    #: Use the event path in virtual time (False: the task path, for comparisons).
    event_path = True

    def __init__(self, below: DatagramService, params: UamParams) -> None:
        self._below = below
        self._params = params
        self._machines: dict[int, UamMachine] = {}
        # The machines as (peer, machine) pairs, rebuilt when one is added: the paths iterate
        # it (a snapshot, as a machine may be added while they await) instead of copying the
        # dict at every wake-up.
        self._machine_items: list[tuple[int, UamMachine]] = []
        self._tables = ActiveMessageTables("UAM")
        # The tables' own list and dict, read on every delivery.
        self._handlers = self._tables.handlers
        self._regions = self._tables.regions
        self._gets: dict[tuple[int, int], tuple[int, int, int, tuple[int, ...]]] = {}
        self._inbox: deque[tuple[int, bytes]] = deque()
        # The request whose handler runs now, which may reply (None: no reply allowed): three
        # fields, not a tuple, as one is set for every request handled.
        self._current_machine: UamMachine | None = None
        self._current_token = 0
        self._current_peer = 0
        # Whether a lean poll runs handlers now, and its reading of the clock: a reply from a
        # handler is made at the poll's time, without another reading.  (A flag and a float,
        # not an optional float: compiled, no float object per poll.)
        self._in_poll = False
        self._poll_now = 0.0
        self._failures: dict[int, str] = {}
        # (A list, not a deque: compiled, testing it at every poll is native.)
        self._errors: list[BaseException] = []
        self._closed = False
        # The run's clock (start() binds the clock's own method: one call, not three), or,
        # for trio's default clock, its offset from perf_counter (see _clock_offset).
        self._clock: Callable[[], float] = trio.current_time
        self._offset: float | None = None
        self._sleeping: deque[trio.lowlevel.Task] = deque()  # parked in _wait_until
        # What the tasks in _wait_until (woken or not) wait for, one entry per task.
        self._waiting: list[Callable[[], bool]] = []
        self.chunk_size = min(params.chunk_size, max(1, below.max_message - MAX_OVERHEAD))
        self.unknown_handler = 0
        self.bad_address = 0
        #: Datagrams the endpoint's NI rejected (lean path): taken as lost, resent by go-back-N.
        self.rejected = 0
        self._costs = host_costs(below.capability(Endpoint), params.proto_us, params.bulk_us)
        self._path: ExecutionPath = choose_path(self, below, self.event_path)
        self._spin = self._path.spin
        self._hot_spin = self._path.hot_spin
        self._filter_wakes = self._path.filters_wakes

    def __repr__(self) -> str:
        return f"<UamService over {self._below!r}, {len(self._machines)} peers>"

    @property
    def params(self) -> UamParams:
        """The parameters this service was made with."""
        return self._params

    @property
    def path(self) -> ExecutionPath:
        """How this service runs its machines: its ``name`` is "event", "task" or "lean"."""
        return self._path

    @property
    def host_costs(self) -> HostCosts | None:
        """The host CPU costs charged for UAM's work (None: the NI models no host)."""
        return self._costs

    # ------------------------------------------------------------------ running

    def start(self) -> list[Task]:
        """Bind the run's clock and start the execution path; returns the background tasks to
        run while the layer is open (none on the event path).  :class:`UamLayer` calls it
        once, inside the run."""
        clock = trio.lowlevel.current_clock()
        self._clock = clock.current_time
        self._offset = _clock_offset(clock)
        return self._path.start()

    def _now(self) -> float:
        """The run's clock: trio's default clock read without calling it (``perf_counter``
        plus its offset, a call of Python code fewer per reading), any other clock (virtual
        time, a test's) called."""
        offset = self._offset
        if offset is not None:
            return offset + _perf_counter()
        return self._clock()

    def close(self) -> None:
        """The layer closes: later calls raise :class:`trio.ClosedResourceError`, waiting
        tasks wake, the path takes no more input."""
        self._closed = True
        self._path.close()
        self._wake()

    # ------------------------------------------------------------------ tables

    def register_handler(
        self, handler: Handler, index: int | None = None, name: str | None = None
    ) -> int:
        """Enter ``handler`` in the table at ``index`` (default: the first free) and return
        the index; ``name`` lets callers name it instead (same order on every node)."""
        return self._tables.register_handler(handler, index, name)

    def handler_index(self, handler: int | str) -> int:
        """The table index of a handler given by index or name."""
        return self._tables.handler_index(handler)

    def register_region(self, buffer: bytearray | memoryview, name: str | None = None) -> int:
        """Make ``buffer`` (writable) reachable by stores and gets; returns its region id."""
        return self._tables.register_region(buffer, name)

    def region_id(self, region: int | str) -> int:
        """The id of a region given by id or name."""
        return self._tables.region_id(region)

    # ------------------------------------------------------------------ GAM operations

    def request_nowait(self, peer: int, handler: int | str, *args: int) -> None:
        """Send a request now, or raise :class:`trio.WouldBlock` if the window is full."""
        machine = self._machines.get(peer)
        if machine is None or self._closed or self._failures:
            machine = self._usable(peer)
        if not machine.request_room:
            self.poll()  # paper 000 §5.1.2: a sender with a full window polls
            self._check_usable(peer)
            if not machine.request_room:
                raise trio.WouldBlock
        index = handler if type(handler) is int else self.handler_index(handler)
        now = self._now()
        machine.request(index, args, now)
        self._path.kick(peer, now)

    async def request(self, peer: int, handler: int | str, *args: int) -> None:
        """Send a request (0-4 32-bit words) to ``handler`` of ``peer``; while the window is
        full, poll (run handlers) and wait.  Returns once the request is queued."""
        await self._wait_room(peer)
        self._machines[peer].request(self.handler_index(handler), args, self._now())
        self._path.kick(peer)
        if not self._path.schedule_point_skipped():
            await trio.lowlevel.cancel_shielded_checkpoint()

    def reply(self, handler: int | str, *args: int) -> None:
        """Reply from inside a request handler, once; anywhere else
        :class:`LocalProtocolError` (a reply handler may not reply, paper 000 §5)."""
        machine = self._current_machine
        if machine is None:
            raise LocalProtocolError(
                "UAM: a reply is allowed only from a request handler, once "
                "(a reply handler may not reply: paper 000 §5)"
            )
        index = handler if type(handler) is int else self.handler_index(handler)
        if self._in_poll:
            # Inside a lean poll: made at the poll's reading of the clock, and left for the
            # poll's one transmission when its handlers are done (no kick).
            machine.reply(self._current_token, index, args, self._poll_now)
            self._current_machine = None
            return
        machine.reply(self._current_token, index, args, self._now())
        self._current_machine = None
        self._path.kick(self._current_peer)

    async def store(
        self,
        peer: int,
        data: bytes | bytearray | memoryview,
        remote: RemoteAddress,
        handler: int | str,
        *args: int,
    ) -> None:
        """Store ``data`` (any size) at ``remote`` of ``peer``; ``handler`` runs there with
        (peer, region, offset, nbytes, *args) once all of it has arrived.  Waits for window
        room first and, for back-pressure, until every chunk has been sent once."""
        await self._wait_room(peer)
        machine = self._machines[peer]
        region, offset = remote
        machine.store(
            self.region_id(region),
            offset,
            data,
            self.handler_index(handler),
            args,
            self._now(),
        )
        self._path.kick(None)
        await self._wait_until(lambda: not machine.backlog, peer)

    async def get(
        self,
        peer: int,
        remote: RemoteAddress,
        nbytes: int,
        local: RemoteAddress,
        handler: int | str,
        *args: int,
    ) -> None:
        """Fetch ``nbytes`` at ``remote`` of ``peer`` into ``local``; ``handler`` runs here
        with (peer, local region, local offset, nbytes, *args) when all of it has arrived.
        Returns once the requests are sent (await completion with :meth:`wait_until`)."""
        local_region, local_offset = self.region_id(local[0]), local[1]
        view = self._regions.get(local_region)
        if view is None or not 0 <= local_offset <= len(view) - nbytes:
            raise LocalProtocolError(
                f"UAM: {nbytes} bytes at {local!r} are outside the local regions"
            )
        index = self.handler_index(handler)
        await self._wait_room(peer)
        machine = self._machines[peer]
        region, offset = remote
        xfer = machine.get(self.region_id(region), offset, nbytes, self._now())
        self._gets[peer, xfer] = (local_region, local_offset, index, tuple(args))
        self._path.kick(None)
        await self._wait_until(lambda: not machine.backlog, peer)

    def poll(self) -> int:
        """Run the handlers of every message that has arrived; returns how many.

        Raises (once) :class:`PeerUnreachable` for a peer that failed,
        :class:`RemoteProtocolError` for a get the peer refused, and whatever a handler raised.
        """
        if self._errors:
            raise self._errors.pop(0)
        return self._path.poll()

    def acknowledge(self) -> int:
        """Run the handlers of what has arrived, then send every acknowledgment owed now
        instead of after ``ack_delay``; returns how many handlers ran.

        Call it before a long computation that does not poll: until it ends, nothing this
        rank received would be acknowledged, and the peers' go-back-N timers would expire
        and resend what arrived intact.  Raises what :meth:`poll` raises.
        """
        count = self.poll()
        for machine in self._machines.values():
            machine.acknowledge_now()
        self._path.kick(None)
        return count

    def _run_handlers(self, peer: int, machine: UamMachine) -> int:
        """Take everything ``machine`` has for the application and run its handlers."""
        count = 0
        handlers = self._handlers
        # (machine.take(), not a bound method kept in a local: compiled, a native call.)
        while (taken := machine.take()) is not None:
            count += 1
            if not isinstance(taken, tuple):
                self._dispatch(peer, machine, taken)
                continue
            # A request or a reply: no event object (the common case, kept short).
            handler = handlers[taken[1]]
            if handler is None:
                self.unknown_handler += 1
                continue
            request = taken[0] == _REQUEST
            if request:
                self._current_machine = machine
                self._current_token = taken[3]
                self._current_peer = peer
            # The words as they arrived (objects: compiled, not unboxed and boxed again), in
            # a call with fixed arguments for the common arities (a star call builds a tuple).
            words: tuple[object, ...] = taken[2]
            nwords = len(words)
            if nwords == 4:
                handler(peer, words[0], words[1], words[2], words[3])
            elif nwords == 0:
                handler(peer)
            else:
                handler(peer, *words)
            if request:
                self._current_machine = None
        return count

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Poll until ``predicate()`` is true (checked after each poll)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._wait_until(predicate, None)
        if not self._path.schedule_point_skipped():
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def drain(self, peer: int | None = None) -> None:
        """Poll until everything sent to ``peer`` (default: every peer) is acknowledged."""
        peers = [peer] if peer is not None else list(self._machines)
        for each in peers:
            machine = self._usable(each)
            await self._wait_until(lambda m=machine: m.idle, each)  # type: ignore[misc]

    # ------------------------------------------------------------------ datagram face

    @property
    def peers(self) -> Sequence[int]:
        return self._below.peers

    @property
    def max_message(self) -> int:
        return MAX_MESSAGE

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        """Send one message (any size up to :attr:`max_message`) for the peer's :meth:`recv`."""
        if len(data) > MAX_MESSAGE:
            raise LocalProtocolError(f"UAM: message of {len(data)} bytes exceeds {MAX_MESSAGE}")
        await self._wait_room(peer)
        machine = self._machines[peer]
        machine.send_message(data, self._now())
        self._path.kick(None)
        await self._wait_until(lambda: not machine.backlog, peer)

    async def recv(self) -> tuple[int, bytes]:
        """The next message sent with :meth:`send`, as (peer, data); polls while waiting."""
        if not self._closed:
            await self._wait_until(lambda: bool(self._inbox), None)
        elif not self._inbox:
            await trio.lowlevel.checkpoint()
            raise trio.EndOfChannel
        return self._inbox.popleft()

    # ------------------------------------------------------------------ statistics

    def peer_statistics(self, peer: int) -> UamStatistics:
        """The counters of the machine for ``peer`` (all zero if nothing was exchanged yet)."""
        machine = self._machines.get(peer)
        return (machine if machine is not None else self._new_machine()).statistics()

    def statistics(self) -> Mapping[str, object]:
        """Totals over all peers, plus ``"peers"``: a :class:`UamStatistics` per peer."""
        per_peer = {peer: m.statistics() for peer, m in sorted(self._machines.items())}
        totals: dict[str, object] = {
            field.name: sum(getattr(s, field.name) for s in per_peer.values())
            for field in attrs.fields(UamStatistics)
        }
        totals["unknown_handler"] = self.unknown_handler
        totals["bad_address"] = self.bad_address
        totals["rejected"] = self.rejected
        totals["failed_peers"] = sorted(self._failures)
        totals["peers"] = per_peer
        return totals

    def _background_poll(self) -> None:
        try:
            self.poll()
        except Exception as error:  # handed to the application's next call
            self._errors.append(error)
            self._wake()

    # ------------------------------------------------------------------ helpers

    def _dispatch(self, peer: int, machine: UamMachine, event: Event) -> None:
        if isinstance(event, RequestReceived):
            handler = self._handlers[event.handler]
            if handler is None:
                self.unknown_handler += 1
                return
            self._current_machine = machine
            self._current_token = event.token
            self._current_peer = peer
            try:
                handler(peer, *event.args)
            finally:
                self._current_machine = None
        elif isinstance(event, ReplyReceived):
            handler = self._handlers[event.handler]
            if handler is None:
                self.unknown_handler += 1
                return
            handler(peer, *event.args)
        elif isinstance(event, StoreReceived):
            self._stored(peer, event)
        elif isinstance(event, GetReceived):
            view = self._regions.get(event.region)
            if view is None or event.offset + event.total > len(view):
                self.bad_address += 1
                machine.reply_get(event.token, None, self._now())
                return
            start = event.offset + event.chunk
            machine.reply_get(event.token, bytes(view[start : start + event.length]), self._now())
        elif isinstance(event, GetReplyReceived):
            self._got(peer, event)
        elif isinstance(event, Delivered):
            self._inbox.append((peer, event.data))
        else:
            self._failed(peer, event)

    def _stored(self, peer: int, event: StoreReceived) -> None:
        view = self._regions.get(event.region)
        if view is None or event.offset + event.total > len(view):
            self.bad_address += 1  # counted per chunk; the handler does not run
            return
        start = event.offset + event.chunk
        view[start : start + len(event.data)] = event.data
        if event.last:
            handler = self._handlers[event.handler]
            if handler is None:
                self.unknown_handler += 1
                return
            handler(peer, event.region, event.offset, event.total, *event.args)

    def _got(self, peer: int, event: GetReplyReceived) -> None:
        entry = self._gets.get((peer, event.xfer))
        if entry is None:
            return  # a reply for a get we no longer know (cannot happen with one machine)
        region, offset, index, args = entry
        if not event.ok:
            del self._gets[peer, event.xfer]
            raise RemoteProtocolError(
                f"UAM: peer {peer} refused get {event.xfer}: address outside its regions"
            )
        start = offset + event.chunk
        self._regions[region][start : start + len(event.data)] = event.data
        if event.last:
            del self._gets[peer, event.xfer]
            handler = self._handlers[index]
            if handler is None:
                self.unknown_handler += 1
                return
            handler(peer, region, offset, event.total, *args)

    def _failed(self, peer: int, event: PeerFailed) -> None:
        reason = (
            f"UAM: peer {peer} acknowledged nothing through {event.retransmissions} "
            f"retransmission timeouts; {event.undelivered} message(s) may not have arrived"
        )
        self._failures[peer] = reason
        self._wake()
        raise PeerUnreachable(reason)

    def _add_machine(self, peer: int) -> UamMachine:
        machine = self._machines[peer] = self._new_machine()
        self._machine_items = list(self._machines.items())
        return machine

    def _new_machine(self) -> UamMachine:
        p = self._params
        return UamMachine(
            window=p.window,
            rto=p.rto_us * 1e-6,
            max_retries=p.max_retries,
            ack_delay=p.ack_delay_us * 1e-6,
            chunk_size=self.chunk_size,
        )

    def _usable(self, peer: int) -> UamMachine:
        self._check_usable(peer)
        machine = self._machines.get(peer)
        if machine is None:
            if peer not in self._below.peers:
                raise LocalProtocolError(f"UAM: no peer {peer} (peers: {list(self.peers)})")
            machine = self._add_machine(peer)
        return machine

    def _check_usable(self, peer: int | None) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the UAM layer is closed")
        if peer is not None:
            reason = self._failures.get(peer)
            if reason is not None:
                raise PeerUnreachable(reason)

    def _raise_pending(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    async def _wait_room(self, peer: int) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        machine = self._usable(peer)
        # The first round of _wait_until inline (poll, then check): with window room, the
        # common case, no closure and no coroutine.
        self.poll()
        self._check_usable(peer)
        if machine.request_room > 0:
            return
        await self._wait_until(lambda: machine.request_room > 0, peer)

    async def _wait_until(self, predicate: Callable[[], bool], peer: int | None) -> None:
        spin_until = hot_until = 0.0
        spins = 0
        while True:
            self._check_usable(peer)
            self.poll()  # on the lean path, this receives too
            self._check_usable(peer)
            if predicate():
                return
            if self._spin is not None:
                # The lean path: poll from this task for the NI's spin time, then sleep until
                # the receive task sees an arrival.  The first hot_spin seconds without
                # yielding (a reply on a busy channel comes sooner than a pass of trio's
                # loop takes; other tasks wait that long at most), the rest with checkpoints.
                now = time.perf_counter()
                if not spins:
                    spin_until = now + self._spin
                    hot_until = now + self._hot_spin
                spins += 1
                if now < hot_until:
                    relax(spins)  # a peer sharing this CPU runs now, not after our time slice
                    continue
                if now < spin_until:
                    await trio.lowlevel.checkpoint()
                    continue
            # Park until _wake() (a list of tasks: cheaper than a trio.Event per wake-up).
            task = trio.lowlevel.current_task()
            sleeping = self._sleeping
            sleeping.append(task)
            self._waiting.append(predicate)

            def abort(
                _: object,
                task: trio.lowlevel.Task = task,
                sleeping: deque[trio.lowlevel.Task] = sleeping,
            ) -> trio.lowlevel.Abort:
                with contextlib.suppress(ValueError):  # already woken
                    sleeping.remove(task)
                return trio.lowlevel.Abort.SUCCEEDED

            try:
                await trio.lowlevel.wait_task_rescheduled(abort)
            finally:
                self._waiting.remove(predicate)

    def _wake(self) -> None:
        """Wake the tasks parked in :meth:`_wait_until` (each looks again at what it waits
        for), unless the path knows nothing they wait for can have changed."""
        if self._waiting and (not self._filter_wakes or self._path.worth_waking()):
            sleeping = self._sleeping
            while sleeping:
                trio.lowlevel.reschedule(sleeping.popleft())


def choose_path(service: UamService, below: DatagramService, event_path: bool) -> ExecutionPath:
    """The execution path of ``service`` over ``below`` (:mod:`stacklib.layers.uam.paths`):
    the event path where ``below`` lends a U-Net endpoint of a simulated NI (and
    ``event_path``), the lean path where it lends one of a real NI that models no host costs,
    else the task path."""
    endpoint = below.capability(Endpoint)
    if endpoint is not None:
        world = endpoint.ni.world
        if event_path and isinstance(world, Simulation):
            return EventPath(service, endpoint, world)
        if not world.virtual and service.host_costs is None:
            return LeanPath(service, endpoint)
    return TaskPath(service, below)
