"""The trio driver of U-Net Active Messages: GAM 1.1 over a U-Net endpoint (paper 000 §5).

The driver makes no protocol decisions; :mod:`stacklib.layers.uam.machine` does.  It keeps one
:class:`~stacklib.layers.uam.machine.UamMachine` per peer, the handler table and the registered
memory regions, and runs up to three tasks while the layer is open:

* the *receive task* reads datagrams from the service below and feeds them to the peer's
  machine (acknowledgments take effect at once; handlers wait for a poll);
* the *pump*, the only task that writes below: it fires expired timers, transmits what the
  machines want sent, and sleeps until the earliest deadline or a kick;
* the *poller* (``background_poll=True``, the default) runs :meth:`UamService.poll` whenever
  messages are waiting, for trio applications; with ``background_poll=False`` handlers run
  only when the application polls, as in the paper ("The UAM layer receives messages by
  explicit polling", §5.1.2).

On real transports (a U-Net endpoint in wall-clock time, no modelled host) the driver takes the
*lean path* instead: :meth:`UamService.poll` and the waits take datagrams from the endpoint
themselves and run the machines and handlers in the caller's task; output goes straight to the
endpoint with ``send_nowait``.  The receive task then only sleeps on the NI (and runs handlers
with ``background_poll``), and the pump only runs timers and resends what the endpoint refused.
See docs/uam.md, "Over a real transport".

In virtual time over a simulated U-Net endpoint the driver takes the *event path*: no tasks at
all.  Receive (through ``Endpoint.on_arrival``), handlers, transmission and timers run as the
simulator's callbacks, holding the host CPU for the same costs; a waiting application task is
woken only when what it waits for may hold.  See docs/uam.md, "In virtual time".

Costs (only where the NI models the host: ``endpoint.ni.host_copy_per_byte > 0``): every PDU
sent or received holds the host CPU for ``proto_us`` plus one memory copy of its bytes, "from
the source data structure into a send buffer and from the receive buffer into the destination
data structure" (paper 000 §5.2).  On real transports nothing is charged.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import attrs
import trio
import trio.lowlevel

from stacklib.compiled import mypyc_attr
from stacklib.errors import (
    LocalProtocolError,
    PeerUnreachable,
    RemoteProtocolError,
)
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
from stacklib.layers.uam.wire import MAX_OVERHEAD, PduType
from stacklib.services import (
    ActiveMessageService,
    DatagramService,
    Handler,
    RemoteAddress,
    UNetService,
)
from stacklib.sim import Resource, Simulation
from stacklib.unet import Endpoint, RecvKind

__all__ = ["Handler", "RemoteAddress", "UamParams", "UamService"]

_DATA_TYPES = frozenset({int(PduType.STORE), int(PduType.GET_REPLY)})
_RECV_INLINE = RecvKind.INLINE
_REQUEST = int(PduType.REQUEST)
MAX_MESSAGE = 1 << 24  # the datagram face accepts any size; this bounds a single message


@mypyc_attr(allow_interpreted_subclasses=True)
class UamService(ActiveMessageService):
    """Generic Active Messages 1.1 with peers over a datagram service; made by
    :class:`UamLayer`.  See docs/uam.md.

    As a reliable service it also carries messages: :meth:`send` is a block store into
    the peer's inbox and :meth:`recv` takes them out, so the generic workloads run over UAM.
    """

    #: Use the event path in virtual time (False: the three tasks, for comparisons).
    event_path = True

    def __init__(self, below: DatagramService, params: UamParams) -> None:
        self._below = below
        self._params = params
        self._machines: dict[int, UamMachine] = {}
        # The machines as (peer, machine) pairs, rebuilt when one is added: the tasks iterate
        # it (a snapshot, as a machine may be added while they await) instead of copying the
        # dict at every wake-up.
        self._machine_items: list[tuple[int, UamMachine]] = []
        self._handlers: list[Handler | None] = [None] * 256
        self._handler_names: dict[str, int] = {}
        self._regions: dict[int, memoryview] = {}
        self._region_names: dict[str, int] = {}
        self._gets: dict[tuple[int, int], tuple[int, int, int, tuple[int, ...]]] = {}
        self._inbox: deque[tuple[int, bytes]] = deque()
        self._current: tuple[UamMachine, int, int] | None = None  # machine, token, peer
        # Virtual path: a machine may have events for poll() (set where arrivals and timers
        # feed the machines, cleared when a poll has taken everything): most polls of a
        # waiting task find nothing, and then need not look at every peer.
        self._unpolled = False
        self._failures: dict[int, str] = {}
        self._errors: deque[BaseException] = deque()
        self._closed = False
        # The run's clock (UamLayer.open binds the clock's own method: one call, not three).
        self._now: Callable[[], float] = trio.current_time
        self._kick_event = trio.Event()
        self._sleeping: deque[trio.lowlevel.Task] = deque()  # parked in _wait_until
        self._arrival = trio.Event()
        self.chunk_size = min(params.chunk_size, max(1, below.max_message - MAX_OVERHEAD))
        self.unknown_handler = 0
        self.bad_address = 0
        # Costs: only where the NI models the host's copies (simulated NIs).
        self._cpu = None
        self._copy = self._proto = self._bulk = 0.0
        if isinstance(below, UNetService):
            ni = below.endpoint.ni
            if ni.host_copy_per_byte > 0:
                self._cpu = ni.host.resource("cpu")
                self._copy = ni.host_copy_per_byte
                self._proto = params.proto_us * 1e-6
                self._bulk = params.bulk_us * 1e-6
        # The lean path (real transports: a U-Net endpoint, no modelled host, wall-clock
        # time): the caller's task takes datagrams from the endpoint and runs the machines
        # and handlers inline, and output goes straight to the endpoint with send_nowait.
        self._endpoint = None
        self._spin = 0.0
        self._pump_deadline = math.inf  # when the lean pump wakes next (inf: only if kicked)
        self._last_poll = -math.inf  # perf_counter of the application's last lean poll
        self._deferred: bool | None = None  # in a lean poll: None, or whether to flush after
        # What the tasks in _wait_until (woken or not) wait for, one entry per task.
        self._waiting: list[Callable[[], bool]] = []
        self._unsent: dict[int, deque[bytes]] = {}
        if isinstance(below, UNetService) and self._cpu is None:
            endpoint = below.endpoint
            if not endpoint.ni.world.virtual:
                self._endpoint = endpoint
                self._spin = float(getattr(endpoint.ni, "spin_time", 0.0))
        # The event path (virtual time over a simulated U-Net endpoint): receive, handlers,
        # transmission and timers run as the simulator's callbacks, holding the host CPU for
        # their costs; only the application's own tasks are trio tasks (docs/uam.md, "In
        # virtual time").
        self._events: Endpoint | None = None
        self._world: Simulation | None = None
        self._host_cpu: Resource | None = None
        self._send_cost: Callable[[int], float] | None = None
        self._recv_cost: Callable[[int], float] | None = None
        self._rx_busy = False  # a received PDU is being processed (its CPU hold runs)
        self._defer = 0  # >0 inside poll() or an event: a kick transmits when it ends
        self._dirty = False  # kicked while deferred
        self._timer_at = math.inf  # the earliest timer event scheduled
        self._touched: set[int] = set()  # peers whose machines may have output
        self._touched_all = False  # ... or every machine
        self._held: deque[tuple[int, bytes]] = deque()  # refused by a full send queue
        if self.event_path and isinstance(below, UNetService):
            endpoint = below.endpoint
            world = endpoint.ni.world
            if (
                isinstance(world, Simulation)
                and type(below).send is UNetService.send
                and type(below).recv is UNetService.recv
            ):
                self._events = endpoint
                self._world = world
                self._host_cpu = endpoint.ni.host.resource("cpu")
                self._send_cost = endpoint.ni.host_send_cost
                self._recv_cost = endpoint.ni.host_recv_cost

    def __repr__(self) -> str:
        return f"<UamService over {self._below!r}, {len(self._machines)} peers>"

    @property
    def params(self) -> UamParams:
        """The parameters this service was made with."""
        return self._params

    # ------------------------------------------------------------------ tables

    def register_handler(
        self, handler: Handler, index: int | None = None, name: str | None = None
    ) -> int:
        """Enter ``handler`` in the table at ``index`` (default: the first free) and return
        the index; ``name`` lets callers name it instead (same order on every node)."""
        if index is None:
            free = [i for i, h in enumerate(self._handlers) if h is None]
            if not free:
                raise LocalProtocolError("UAM: the handler table (256 entries) is full")
            index = free[0]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= 255:
            raise LocalProtocolError(f"UAM: handler index {index!r} is not in 0..255")
        self._handlers[index] = handler
        if name is not None:
            self._handler_names[name] = index
        return index

    def handler_index(self, handler: int | str) -> int:
        """The table index of a handler given by index or name."""
        if isinstance(handler, str):
            try:
                return self._handler_names[handler]
            except KeyError:
                raise LocalProtocolError(f"UAM: no handler named {handler!r}") from None
        return handler

    def register_region(self, buffer: bytearray | memoryview, name: str | None = None) -> int:
        """Make ``buffer`` (writable) reachable by stores and gets; returns its region id."""
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise LocalProtocolError("UAM: a region must be writable (bytearray, memoryview)")
        region = len(self._regions)
        self._regions[region] = view
        if name is not None:
            self._region_names[name] = region
        return region

    def region_id(self, region: int | str) -> int:
        """The id of a region given by id or name."""
        if isinstance(region, str):
            try:
                return self._region_names[region]
            except KeyError:
                raise LocalProtocolError(f"UAM: no region named {region!r}") from None
        return region

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
        index = handler if handler.__class__ is int else self.handler_index(handler)
        machine.request(index, args, self._now())
        self._kick(peer)

    async def request(self, peer: int, handler: int | str, *args: int) -> None:
        """Send a request (0-4 32-bit words) to ``handler`` of ``peer``; while the window is
        full, poll (run handlers) and wait.  Returns once the request is queued."""
        await self._wait_room(peer)
        self._machines[peer].request(self.handler_index(handler), args, self._now())
        self._kick(peer)
        if not self._schedule_point_skipped():
            await trio.lowlevel.cancel_shielded_checkpoint()

    def reply(self, handler: int | str, *args: int) -> None:
        """Reply from inside a request handler, once; anywhere else
        :class:`LocalProtocolError` (a reply handler may not reply, paper 000 §5)."""
        current = self._current
        if current is None:
            raise LocalProtocolError(
                "UAM: a reply is allowed only from a request handler, once "
                "(a reply handler may not reply: paper 000 §5)"
            )
        machine, token, peer = current
        index = handler if handler.__class__ is int else self.handler_index(handler)
        machine.reply(token, index, args, self._now())
        self._current = None
        self._kick(peer)

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
        self._kick()
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
        self._kick()
        await self._wait_until(lambda: not machine.backlog, peer)

    def poll(self) -> int:
        """Run the handlers of every message that has arrived; returns how many.

        Raises (once) :class:`PeerUnreachable` for a peer that failed,
        :class:`RemoteProtocolError` for a get the peer refused, and whatever a handler raised.
        """
        if self._errors:
            raise self._errors.popleft()
        if self._endpoint is not None:
            return self._poll_lean()
        if not self._unpolled:
            return 0
        count = 0
        self._defer += 1  # the event path transmits what the handlers produce once, at the end
        try:
            for peer, machine in self._machine_items:
                if machine.pending:
                    self._touched.add(peer)  # taking its events may make an ACK due
                    count += self._run_handlers(peer, machine)
            # Everything taken (a nested poll from a handler took the rest, if any); if a
            # handler raised, the flag stays set for what is left.
            self._unpolled = False
        finally:
            self._current = None
            self._defer -= 1
            if self._events is None:
                if count:
                    self._kick()
            elif count or self._dirty:
                self._dirty = True
                if not self._defer:
                    self._transmit_events()
        return count

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
        self._kick()
        return count

    def _poll_lean(self) -> int:
        """poll() on the lean path: receive from the endpoint, run the handlers, and transmit
        once at the end whatever they and the arrivals produced (replies, ACKs)."""
        self._last_poll = time.perf_counter()
        nested = self._deferred is not None
        if not nested:
            self._deferred = False
        count = 0
        try:
            while True:
                if self._absorb(flush=False):
                    self._deferred = True
                full = self._arrivals_full()
                for peer, machine in self._machine_items:
                    count += self._run_handlers(peer, machine)
                if not full:  # else more may wait at the endpoint, which _absorb left there
                    break
        finally:
            self._current = None
            if not nested:
                flush = count or self._deferred
                self._deferred = None
                if flush:
                    self._flush()
        return count

    def _run_handlers(self, peer: int, machine: UamMachine) -> int:
        """Take everything ``machine`` has for the application and run its handlers."""
        count = 0
        handlers = self._handlers
        take = machine.take
        while (taken := take()) is not None:
            count += 1
            if not isinstance(taken, tuple):
                self._dispatch(peer, machine, taken)
                continue
            # A request or a reply: no event object (the common case, kept short).
            handler = handlers[taken[1]]
            if handler is None:
                self.unknown_handler += 1
            elif taken[0] == _REQUEST:
                self._current = (machine, taken[3], peer)
                handler(peer, *taken[2])
                self._current = None
            else:
                handler(peer, *taken[2])
        return count

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Poll until ``predicate()`` is true (checked after each poll)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._wait_until(predicate, None)
        if not self._schedule_point_skipped():
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
        self._kick()
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
        totals["failed_peers"] = sorted(self._failures)
        totals["peers"] = per_peer
        return totals

    # ------------------------------------------------------------------ the tasks

    async def _receive_loop(self) -> None:
        below = self._below
        # Over plain U-Net, the endpoint's own receive (what UNetService.recv awaits, one
        # coroutine less per datagram).
        plain = isinstance(below, UNetService) and type(below).recv is UNetService.recv
        endpoint = below.endpoint if plain and isinstance(below, UNetService) else None
        cpu = self._cpu
        machines = self._machines
        now = self._now
        while True:
            try:
                if endpoint is not None:
                    message = await endpoint.recv()
                    peer, datagram = message.channel, message.data
                else:
                    peer, datagram = await below.recv()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
            if cpu is not None:
                # Pull the message out of the receive buffer (paper 000 §5.1.2).  try_charge
                # is use() without a coroutine when the charge needs no parking.
                cost = self._cost(datagram)
                if not cpu.try_charge(cost):
                    await cpu.use(cost)
            machine = machines.get(peer)
            if machine is None:
                machine = self._add_machine(peer)
            machine.receive(datagram, now())
            if machine.pending:
                self._unpolled = True
                self._arrival.set()
            self._kick()  # window room for the backlog, or an ACK owed for a duplicate
            self._wake()

    async def _receive_lean(self) -> None:
        """The receive task of the lean path: takes what the application's own polls have not
        taken yet, runs the handlers at once with ``background_poll``, and sleeps on the NI
        when nothing arrives (it never holds a datagram across a checkpoint, so datagrams
        reach the machines in arrival order whichever task takes them)."""
        endpoint = self._endpoint
        assert endpoint is not None
        idle_wait = getattr(endpoint.ni, "idle_wait", None)
        background = self._params.background_poll
        while True:
            if self._closed or endpoint.closed:
                return
            if self._absorb():
                if background:
                    self._background_poll()
                await trio.lowlevel.checkpoint()
                continue
            if idle_wait is None:
                # No NI to sleep on: a blocking receive.  Only shm has arrivals from another
                # process between two polls, and it has idle_wait.
                try:
                    message = await endpoint.recv()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    return
                self._receive_one(message.channel, message.data)
                self._kick()
                self._wake()
                if background:
                    self._background_poll()
                continue
            # Spin with checkpoints for the NI's spin time, then sleep until a peer wakes
            # the node (a failed peer shows as retransmission timeouts, as in the paper).
            # While the application polls, keep spinning: asleep, this task would make every
            # sender pay a wake-up system call.
            spin = self._spin
            deadline = time.perf_counter() + spin
            while (now := time.perf_counter()) < deadline or now < self._last_poll + spin:
                await trio.lowlevel.checkpoint()
                if self._closed or self._absorb():
                    break
            else:
                await idle_wait()
                continue
            if background:
                self._background_poll()

    def _background_poll(self) -> None:
        try:
            self.poll()
        except Exception as error:  # handed to the application's next call
            self._errors.append(error)
            self._wake()

    def _receive_one(self, peer: int, datagram: bytes) -> None:
        machine = self._machines.get(peer)
        if machine is None:
            machine = self._add_machine(peer)
        machine.receive(datagram, self._now())
        self._unpolled = True

    def _absorb(self, flush: bool = True) -> int:
        """Lean path: feed every datagram waiting at the endpoint to its machine; returns how
        many.  Handlers wait for a poll; acknowledgments and window room take effect."""
        endpoint = self._endpoint
        assert endpoint is not None
        if self._arrivals_full():
            return 0  # handlers first: the next datagram may be for that peer
        poll = endpoint.poll
        message = poll()
        if message is None:
            return 0
        now = self._now()
        machines = self._machines
        count = 0
        while message is not None:
            machine = machines.get(message.channel)
            if machine is None:
                machine = self._add_machine(message.channel)
            machine.receive(message.data, now)
            count += 1
            if machine.arrivals_full:
                # Taking more would drop this peer's next PDU (go-back-N would resend it and
                # everything after it, after a timeout); at the endpoint it waits for a poll.
                break
            message = poll()
        if flush:
            self._flush()  # window room for the backlog, or an ACK owed for a duplicate
        if self._waiting:
            self._wake()
        return count

    def _arrivals_full(self) -> bool:
        """Some peer has 2w arrivals waiting for their handlers (lean path)."""
        return any(machine.arrivals_full for _, machine in self._machine_items)

    def _flush(self, kick: bool = True) -> bool:
        """Lean path: transmit what the machines want sent, now, with ``send_nowait``; what
        the endpoint refuses waits (in order) for the pump.  Returns False if something
        waits.  Kicks the pump only when a timer is due before the pump would wake."""
        endpoint = self._endpoint
        assert endpoint is not None
        send = endpoint.send_nowait
        now = self._now()
        unsent = self._unsent
        moved = False
        done = True
        earliest = math.inf
        for peer, machine in self._machines.items():
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
                        send(peer, datagram)
                    except trio.WouldBlock:
                        unsent.setdefault(peer, deque()).extend(datagrams[index:])
                        done = False
                        break
                    moved = True
            timer = machine.get_timer()
            if timer is not None and timer < earliest:
                earliest = timer
        if kick and (not done or earliest < self._pump_deadline):
            self._kick_event.set()
        if moved and self._waiting:
            self._wake()  # the backlog moved: senders waiting for it may go on
        return done

    async def _pump_lean(self) -> None:
        """The pump of the lean path: only timers and what the endpoint refused to take."""
        while True:
            kick = self._kick_event = trio.Event()
            self._pump_deadline = math.inf  # a kick from now on makes it run again
            # What has arrived counts before a timer fires (after a stall of this process,
            # an acknowledgment waiting at the endpoint must not be taken for a loss).
            if self._absorb(flush=False) and self._params.background_poll:
                self._background_poll()
            now = self._now()
            for machine in list(self._machines.values()):
                timer = machine.get_timer()
                if timer is not None and timer <= now:
                    machine.handle_timer(now)
                    if machine.pending:
                        self._unpolled = True
                        self._arrival.set()  # a PeerFailed to report
                        self._wake()
            done = self._flush(kick=False)
            deadline = math.inf
            for machine in self._machines.values():
                timer = machine.get_timer()
                if timer is not None:
                    deadline = min(deadline, timer)
            if not done:  # the endpoint's queues are full: try again soon
                deadline = min(deadline, self._now() + 20e-6)
            self._pump_deadline = deadline
            with trio.move_on_at(deadline):
                await kick.wait()

    async def _pump(self) -> None:
        below = self._below
        # Over plain U-Net, the endpoint's own send (what UNetService.send awaits).
        plain = isinstance(below, UNetService) and type(below).send is UNetService.send
        send = below.endpoint.send if plain and isinstance(below, UNetService) else below.send
        cpu = self._cpu
        clock = self._now
        while True:
            # A fresh event before looking at the machines: a kick from now on is not missed.
            kick = self._kick_event = trio.Event()
            deadline = math.inf
            for peer, machine in self._machine_items:
                timer = machine.get_timer()
                if timer is not None and timer <= clock():
                    machine.handle_timer(clock())
                    if machine.pending:
                        self._unpolled = True
                        self._arrival.set()  # a PeerFailed to report
                        self._wake()
                    timer = machine.get_timer()
                # has_output is False only when datagrams_to_send would do nothing.
                if machine.has_output:
                    datagrams = machine.datagrams_to_send(clock())
                    if datagrams:
                        self._wake()  # the backlog moved: senders waiting for it may go on
                        for datagram in datagrams:
                            if cpu is not None:
                                # Copy into a send buffer of the segment (paper 000 §5.1.2);
                                # try_charge is use() without a coroutine when it can be.
                                cost = self._cost(datagram)
                                if not cpu.try_charge(cost):
                                    await cpu.use(cost)
                            await send(peer, datagram)
                    timer = machine.get_timer()
                if timer is not None and timer < deadline:
                    deadline = timer
            if deadline == math.inf:
                await kick.wait()  # no timer: no cancel scope to build and tear down
            else:
                with trio.move_on_at(deadline):
                    await kick.wait()

    async def _poller(self) -> None:
        while True:
            arrival = self._arrival = trio.Event()
            try:
                self.poll()
            except Exception as error:  # handed to the application's next call
                self._errors.append(error)
                self._wake()
            await arrival.wait()

    # ------------------------------------------------------------------ the event path

    def _start_events(self) -> None:
        """Receive through the endpoint's arrival hook from now on (the event path)."""
        endpoint = self._events
        assert endpoint is not None
        if endpoint.on_arrival is not None or endpoint.on_send_space is not None:
            raise LocalProtocolError(f"UAM: {endpoint!r} already has a driver attached")
        endpoint.on_arrival = self._on_arrival
        if endpoint.recv_queue:
            self._on_arrival()

    def _on_arrival(self) -> None:
        # The NI pushed a receive descriptor.  One PDU at a time: the next is taken when the
        # host is done with this one, as a receiving thread would.
        if not self._rx_busy and not self._closed:
            self._receive_next()

    def _receive_next(self) -> None:
        """Take the next PDU from the receive queue and hold the host CPU for its cost: U-Net's
        receive and UAM's protocol work and copy (paper 000 §5.1.2), then :meth:`_received`."""
        endpoint = self._events
        assert endpoint is not None and self._world is not None
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
        cost = self._event_cost(data, self._recv_cost)
        if cost > 0.0:
            assert self._host_cpu is not None
            self._host_cpu.hold(cost, self._received, descriptor.channel, data)
        else:
            self._world.call_at(self._world.now(), self._received, descriptor.channel, data)

    def _received(self, peer: int, datagram: bytes) -> None:
        if self._closed:
            self._rx_busy = False
            return
        self._defer += 1
        try:
            machine = self._machines.get(peer)
            if machine is None:
                machine = self._add_machine(peer)
            machine.receive(datagram, self._now())
            self._touched.add(peer)  # window room for the backlog, or an ACK owed
            if machine.pending:
                # Every earlier arrival was handled at once unless something is left over: then
                # this machine alone has events, and poll() need not look at the others.
                # (Without background_poll the handlers wait for the application's poll().)
                alone = not (self._unpolled or self._errors)
                self._unpolled = True
                if self._params.background_poll and not alone:
                    self._background_poll()
                elif self._params.background_poll:
                    try:
                        self._run_handlers(peer, machine)
                        self._unpolled = False
                    except Exception as error:  # handed to the application's next call
                        self._errors.append(error)
                    finally:
                        self._current = None
            self._wake()
        finally:
            self._defer -= 1
        # Window room for the backlog, an ACK owed, replies the handlers produced.
        self._transmit_events()
        if self._events is not None and self._events.recv_queue:
            self._receive_next()
        else:
            self._rx_busy = False

    def _transmit_events(self) -> None:
        """The event path's pump: hand every machine's output to the host CPU (each PDU is
        sent when its hold ends) and schedule the earliest timer."""
        self._dirty = False
        if self._closed:
            return
        now = self._now()
        moved = False
        earliest = math.inf
        touched = self._touched
        items: Sequence[tuple[int, UamMachine]]
        if self._touched_all:
            self._touched_all = False
            touched.clear()
            items = self._machine_items
        elif len(touched) == 1:
            peer = touched.pop()
            items = ((peer, self._machines[peer]),)
        else:
            machines = self._machines
            items = [(peer, machines[peer]) for peer in touched]
            touched.clear()
        for peer, machine in items:
            if machine.has_output:
                datagrams = machine.datagrams_to_send(now)
                if datagrams:
                    moved = True
                    for datagram in datagrams:
                        self._send_event(peer, datagram)
            timer = machine.get_timer()
            if timer is not None and timer < earliest:
                earliest = timer
        if earliest < self._timer_at:
            self._timer_at = earliest
            world = self._world
            assert world is not None
            world.call_at(earliest if earliest > now else now, self._on_timer, earliest)
        if moved:
            self._wake()  # the backlog moved: senders waiting for it may go on

    def _send_event(self, peer: int, datagram: bytes) -> None:
        # Copy into a send buffer and post it (paper 000 §5.1.2), on the host CPU.
        cost = self._event_cost(datagram, self._send_cost)
        if cost > 0.0:
            assert self._host_cpu is not None
            self._host_cpu.hold(cost, self._post, peer, datagram)
        else:
            self._post(peer, datagram)

    def _event_cost(self, datagram: bytes, unet: Callable[[int], float] | None) -> float:
        """Host CPU seconds of one PDU on the event path: UAM's work and copy (where the NI
        models them) and U-Net's message-level send or receive (``unet``)."""
        cost = self._cost(datagram) if self._cpu is not None else 0.0
        if unet is not None:
            cost += unet(len(datagram))
        return cost

    def _post(self, peer: int, datagram: bytes) -> None:
        endpoint = self._events
        assert endpoint is not None
        if self._closed or endpoint.closed:
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
        endpoint = self._events
        assert endpoint is not None
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
        if at != self._timer_at or self._closed:
            return  # superseded by an earlier timer event, which scheduled the next
        self._timer_at = math.inf
        now = self._now()
        failed = False
        self._defer += 1
        try:
            for _, machine in self._machine_items:
                timer = machine.get_timer()
                if timer is not None and timer <= now:
                    machine.handle_timer(now)
                    if machine.pending:
                        self._unpolled = failed = True  # a PeerFailed to report
            self._touched_all = True
            if failed:
                self._wake()
                if self._params.background_poll:
                    self._background_poll()
        finally:
            self._defer -= 1
        self._transmit_events()

    # ------------------------------------------------------------------ helpers

    def _cost(self, datagram: bytes) -> float:
        """Host CPU seconds to copy ``datagram`` and run the protocol on it."""
        cost = self._proto + self._copy * len(datagram)
        if datagram and datagram[0] in _DATA_TYPES:
            cost += self._bulk
        return cost

    def _dispatch(self, peer: int, machine: UamMachine, event: Event) -> None:
        if isinstance(event, RequestReceived):
            handler = self._handlers[event.handler]
            if handler is None:
                self.unknown_handler += 1
                return
            self._current = (machine, event.token, peer)
            try:
                handler(peer, *event.args)
            finally:
                self._current = None
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
            raise self._errors.popleft()

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
        spin_until = None
        while True:
            self._check_usable(peer)
            self.poll()  # on the lean path, this receives too
            self._check_usable(peer)
            if predicate():
                return
            if self._endpoint is not None:
                # Lean path: poll from this task for the NI's spin time, then sleep until the
                # receive task sees an arrival.
                now = time.perf_counter()
                if spin_until is None:
                    spin_until = now + self._spin
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

    def _schedule_point_skipped(self) -> bool:
        """Event path: a schedule point counted without yielding, where yielding would change
        nothing (``Simulation._skip_schedule_point``)."""
        world = self._world
        return world is not None and world._skip_schedule_point()

    def _kick(self, peer: int | None = None) -> None:
        """Something may be ready to send (on ``peer``'s machine only, if given)."""
        if self._events is not None:
            if peer is None:
                self._touched_all = True
            else:
                self._touched.add(peer)
            if self._defer:
                self._dirty = True
            else:
                self._transmit_events()
        elif self._endpoint is None:
            self._kick_event.set()
        elif self._deferred is not None:
            self._deferred = True  # a lean poll is running: it transmits when done
        else:
            self._flush()

    def _wake(self) -> None:
        if self._waiting:
            if self._events is not None and not self._worth_waking():
                return
            sleeping = self._sleeping
            while sleeping:
                trio.lowlevel.reschedule(sleeping.popleft())

    def _worth_waking(self) -> bool:
        """Event path: would a waiting task find anything new?  Every arrival calls
        :meth:`_wake`, but a rank waiting for window room to one peer has no use for a PDU
        from another: waking it costs a pass of trio's loop for nothing (most of a Split-C
        exchange's wall time, before this test)."""
        if self._closed or self._errors or self._failures:
            return True
        if self._unpolled and not self._params.background_poll:
            return True  # only the application's own poll runs the handlers
        return any(predicate() for predicate in self._waiting)

    def _close(self) -> None:
        self._closed = True
        endpoint = self._events
        if endpoint is not None:
            endpoint.on_arrival = None
            endpoint.on_send_space = None
        self._wake()
