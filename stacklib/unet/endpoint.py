"""U-Net endpoints: an application's handle into the network (paper 000 §3.1, paper 003 §3.1).

An endpoint is a communication segment, a send, a receive and a free queue, and a channel table.
The OS service creates it (:mod:`stacklib.unet.os_service`) and hands it to its owner only; the NI
(:mod:`stacklib.unet.ni`) is the only other party that touches it.

Two levels of API, both on this class:

* the descriptor level, as the paper describes it: compose data in :attr:`Endpoint.segment`,
  :meth:`~Endpoint.post_nowait` a :class:`SendDescriptor`, hand receive buffers to the NI with
  :meth:`~Endpoint.post_free`, take :class:`RecvDescriptor` objects off the receive queue;
* the message level, the base-level "one copy" (paper 000 §3.3): :meth:`~Endpoint.send` copies
  bytes into a send buffer (or inline into the descriptor when small), :meth:`~Endpoint.recv`
  copies a message out and returns its buffers to the free queue.

Receive models (paper 000 §3.1): polling (:meth:`~Endpoint.poll`), blocking
(``await ep.recv()``), and upcalls on "receive queue non-empty" and "receive queue almost full"
(:meth:`~Endpoint.set_upcall`), which can be disabled cheaply for critical sections
(:meth:`~Endpoint.upcalls_disabled`).
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import trio

from stacklib.compiled import mypyc_attr
from stacklib.errors import ChannelError, EndpointClosed, UNetError

# The values of the endpoint's API, re-exported (they lived here first).
from stacklib.unet.endpoint_types import Channel as Channel
from stacklib.unet.endpoint_types import DropReason as DropReason
from stacklib.unet.endpoint_types import EndpointConfig as EndpointConfig
from stacklib.unet.endpoint_types import EndpointStatistics as EndpointStatistics
from stacklib.unet.endpoint_types import Message as Message
from stacklib.unet.endpoint_types import UpcallCondition as UpcallCondition
from stacklib.unet.ring import DescriptorRing
from stacklib.unet.segment import Segment
from stacklib.wire.descriptor import (
    DescriptorStatus,
    Fragment,
    RecvDescriptor,
    RecvKind,
    SendDescriptor,
)

if TYPE_CHECKING:
    from stacklib.unet.express import NativeQueue
    from stacklib.unet.ni import NetworkInterface
    from stacklib.unet.os_service import OSService, Principal

#: Host cost-profile operations charged (to the host's "cpu") by the message-level API when the
#: profile defines them and the NI does not model them itself: the host-side work of a send
#: (copy in, push the descriptor) and of a receive (poll, copy out).  See
#: NetworkInterface.host_send_cost.
SEND_OP: Final = "unet.send"
RECV_OP: Final = "unet.recv"


class _Waiters:
    """Tasks parked until the endpoint's state changes (cheaper than a ParkingLot per wait)."""

    __slots__ = ("tasks",)

    def __init__(self) -> None:
        #: The parked tasks (read directly on hot paths: cheaper than calling __bool__).
        self.tasks: deque[trio.lowlevel.Task] = deque()

    def __bool__(self) -> bool:
        return bool(self.tasks)

    def wait(self) -> Awaitable[object]:
        """Park the calling task until :meth:`wake_all`; await the result at once.

        Returns trio's own awaitable rather than wrapping it in a coroutine of ours: one
        coroutine frame less to create, resume and unwind on every blocking receive.
        """
        task = trio.lowlevel.current_task()
        tasks = self.tasks
        tasks.append(task)

        def abort(_: Any) -> trio.lowlevel.Abort:
            with contextlib.suppress(ValueError):  # already woken
                tasks.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        return trio.lowlevel.wait_task_rescheduled(abort)

    def wake_all(self) -> None:
        tasks = self.tasks
        while tasks:
            trio.lowlevel.reschedule(tasks.popleft())


# Any, not object: mypyc looks the alias's names up in the module (and object is not there)
UpcallHandler = Callable[["Endpoint"], Any]


@mypyc_attr(allow_interpreted_subclasses=True)
class Endpoint:
    """A U-Net endpoint.  Create it with :meth:`OSService.create_endpoint`, not directly."""

    def __init__(
        self,
        *,
        port: int,
        owner: Principal,
        ni: NetworkInterface,
        os_service: OSService,
        config: EndpointConfig,
    ) -> None:
        self.port = port
        self.owner = owner
        self.ni = ni
        self.os = os_service
        self.config = config
        self.segment = Segment(config.segment_size, ni.alignment)
        self.send_queue: DescriptorRing[SendDescriptor] = DescriptorRing(config.send_queue)
        self.recv_queue: DescriptorRing[RecvDescriptor] = DescriptorRing(config.recv_queue)
        self.free_queue: DescriptorRing[Fragment] = DescriptorRing(config.free_queue)
        self.channels: dict[int, Channel] = {}
        self.closed = False
        #: Set by the NI while it takes descriptors off the send queue (guards re-entry).
        self.in_service = False

        tx = self.segment.carve(0, config.tx_buffers, config.tx_buffer_size)
        rx_start = tx[-1].offset + tx[-1].length if tx else 0
        rx = self.segment.carve(rx_start, config.rx_buffers, config.rx_buffer_size)
        #: First offset after the endpoint-managed buffers: free for the application.
        self.app_area = self.segment.align_up(rx[-1].offset + rx[-1].length if rx else rx_start)
        self._tx_pool: deque[Fragment] = deque(tx)
        self._tx_inflight: deque[tuple[SendDescriptor, tuple[Fragment, ...]]] = deque()
        for buffer in rx:
            self.free_queue.push(buffer)
        if config.direct_window is not None:
            start, end = config.direct_window
            self.segment.check(start, end - start)
            self.direct_window = (start, end)
        else:
            self.direct_window = (self.app_area, self.segment.size)
        self.almost_full = (
            config.almost_full
            if config.almost_full is not None
            else max(1, (config.recv_queue * 3) // 4)
        )

        self._recv_waiters = _Waiters()
        self._send_waiters = _Waiters()
        self._upcalls: dict[UpcallCondition, UpcallHandler] = {}
        self._upcall_depth = 0  # >0 while upcalls are disabled or one is running
        self._upcall_pending = False
        self._upcall_error: BaseException | None = None
        #: Called (with no arguments) when send-queue space or a send buffer frees up; the
        #: kernel emulation uses it to resume servicing its emulated endpoints.
        self.on_send_space: Callable[[], object] | None = None
        #: Called (with no arguments) after the NI pushed a receive descriptor, from the NI's
        #: delivery path: a protocol driver that runs as simulator callbacks in virtual time
        #: (UAM's event path) receives through it instead of a task blocked in :meth:`recv`,
        #: and charges the host's receive cost itself.
        self.on_arrival: Callable[[], object] | None = None

        # Counters, updated by this class and by the NI.
        self.sent = 0
        self.sent_bytes = 0
        self.send_errors: Counter[str] = Counter()
        self.received = 0
        self.received_bytes = 0
        self.dropped: Counter[str] = Counter()
        self.upcalls_run = 0
        self.upcall_errors = 0

        # Host-side cost of the message-level API, decided by the NI (None: free).
        self._send_cost = ni.host_send_cost
        self._recv_cost = ni.host_recv_cost
        self._cpu = ni.host.resource("cpu")
        self._world = ni.world
        self._virtual = ni.world.virtual
        self._prepaid_receives = 0  # receive costs already spent on the CPU
        self._prepaid_wake_pending = False
        self._signal_pending = False

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.channels)} channels"
        return f"<Endpoint {self.ni.name}:{self.port} of {self.owner.name} ({state})>"

    @property
    def address(self) -> object:
        """The address peers name to open a channel to this endpoint."""
        return self.ni.address_of(self)

    # ------------------------------------------------------------------ descriptor level

    def post_nowait(self, descriptor: SendDescriptor) -> None:
        """Push a send descriptor; raise :class:`trio.WouldBlock` if the send queue is full."""
        self.check_open()
        if not self.send_queue.push(descriptor):
            raise trio.WouldBlock
        self.ni.doorbell(self)

    async def post(self, descriptor: SendDescriptor) -> None:
        """Push a send descriptor, waiting while the send queue is full (back-pressure)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            self.check_open()
            if self.send_queue.push(descriptor):
                break
            await self._send_waiters.wait()
        self.ni.doorbell(self)
        await trio.lowlevel.cancel_shielded_checkpoint()

    def post_free(self, buffer: Fragment) -> None:
        """Hand a receive buffer to the NI; :class:`trio.WouldBlock` if the free queue is full.

        The NI, not the application, picks which free buffer an arriving message fills.
        """
        self.check_open()
        if not self.free_queue.push(buffer):
            raise trio.WouldBlock

    def poll_descriptor(self) -> RecvDescriptor | None:
        """The next receive descriptor, or None.  Its buffers stay the application's until it
        returns them with :meth:`release`."""
        self._raise_upcall_error()
        return self.recv_queue.pop()

    async def recv_descriptor(self) -> RecvDescriptor:
        """Wait for the next receive descriptor (see :meth:`poll_descriptor`)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        descriptor = self.poll_descriptor()
        if descriptor is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return descriptor
        while descriptor is None:
            self.check_open()
            await self._recv_waiters.wait()
            descriptor = self.poll_descriptor()
        return descriptor

    def read(self, descriptor: RecvDescriptor) -> bytes:
        """A copy of the message a receive descriptor names."""
        kind = descriptor.kind
        if kind is RecvKind.INLINE:
            return descriptor.inline or b""
        view = self.segment.view
        if kind is RecvKind.DIRECT:
            start = descriptor.dest_offset or 0
            return bytes(view[start : start + descriptor.length])
        remaining = descriptor.length
        fragments = descriptor.fragments
        if len(fragments) == 1:
            offset = fragments[0].offset
            return bytes(view[offset : offset + remaining])
        parts = []
        for offset, size in fragments:
            take = size if size < remaining else remaining
            parts.append(view[offset : offset + take])
            remaining -= take
        return b"".join(parts)

    def release(self, descriptor: RecvDescriptor) -> None:
        """Return a received message's buffers to the free queue."""
        for buffer in descriptor.fragments:
            if not self.free_queue.push(buffer):
                raise UNetError(
                    "free queue overflow while releasing receive buffers: more buffers were "
                    "posted than the free queue holds"
                )

    # ------------------------------------------------------------------ message level

    def send_nowait(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        """Send ``data`` on ``channel`` now or raise :class:`trio.WouldBlock`.

        Small messages travel inline in the descriptor; larger ones are copied into send
        buffers (several, as scatter-gather fragments, if needed).  The returned descriptor's
        ``status`` tells when the NI injected it (or why it rejected it).
        """
        descriptor = self._prepare(channel, data, dest_offset)
        self.send_queue.push(descriptor)
        self.ni.doorbell(self)
        return descriptor

    def _prepare(
        self, channel: int, data: bytes | bytearray | memoryview, dest_offset: int | None
    ) -> SendDescriptor:
        """Build the descriptor of a message-level send, copying into send buffers, once the
        send queue has room for it; :class:`trio.WouldBlock` otherwise."""
        if self.closed:
            self.check_open()
        if self.send_queue.full:
            raise trio.WouldBlock
        length = len(data)
        ni = self.ni
        if length <= ni.inline_threshold and dest_offset is None:
            # Positional (channel, fragments, inline): cheaper than a keyword, once per send.
            return SendDescriptor(channel, (), bytes(data))
        if length > ni.max_message:
            raise UNetError(
                f"message of {length} bytes exceeds the NI's maximum of {ni.max_message}"
            )
        size = self.config.tx_buffer_size
        needed = -(-length // size) if length else 1
        if needed > self.config.tx_buffers:
            raise UNetError(
                f"message of {length} bytes needs {needed} send buffers of {size} bytes; "
                f"the endpoint has {self.config.tx_buffers} (raise EndpointConfig.tx_buffers)"
            )
        pool = self._tx_pool
        if len(pool) < needed:
            self._reclaim()
            if len(pool) < needed:
                raise trio.WouldBlock
        view = self.segment.view
        source = memoryview(data)
        fragments = []
        position = 0
        for _ in range(needed):
            offset = pool.popleft().offset
            take = min(size, length - position)
            view[offset : offset + take] = source[position : position + take]
            fragments.append(Fragment(offset, take))
            position += take
        buffers = tuple(fragments)
        descriptor = SendDescriptor(channel, fragments=buffers, dest_offset=dest_offset)
        self._tx_inflight.append((descriptor, buffers))
        return descriptor

    def send_payload(self, channel: int, data: bytes | bytearray | memoryview) -> None:
        """:meth:`send_nowait` without the descriptor: send ``data`` on ``channel`` now or raise
        :class:`trio.WouldBlock` (the same errors otherwise).

        For senders that never look at the descriptor: a transport whose fast path injects a
        message at once (shm) then builds no per-message object.  A message the NI rejects at
        once (an unknown channel, ...) raises :class:`UNetError` naming the reason, where
        :meth:`send_nowait` returns the descriptor marked ``ERROR``; one rejected later is
        counted in :meth:`statistics`' ``send_errors`` only.  This default calls
        :meth:`send_nowait`.
        """
        descriptor = self.send_nowait(channel, data)
        if descriptor.status is DescriptorStatus.ERROR:
            raise UNetError(
                f"{self!r} channel {channel}: the NI rejected the message ({descriptor.error.name})"
            )

    def send_many(self, channel: int, messages: Iterable[bytes | bytearray | memoryview]) -> int:
        """Send ``messages`` on ``channel`` in order, without waiting; returns how many were
        taken.

        The taken ones are always a prefix of ``messages``: sending stops at the first message
        the endpoint cannot take now (its send queue, send buffers or the transport are full),
        and that one and the rest are not sent; send them again later.  Before anything is
        sent, raises :class:`EndpointClosed` on a closed endpoint, :class:`ChannelError` for a
        channel it does not have, and :class:`UNetError` when any message is one the endpoint
        could never send (above the NI's maximum, or needing more send buffers than it has).
        Transports override it with a one-pass path; this default loops over
        :meth:`send_nowait`.
        """
        batch = self._check_batch(channel, messages)
        taken = 0
        for data in batch:
            try:
                self.send_nowait(channel, data)
            except trio.WouldBlock:
                break
            taken += 1
        return taken

    def _check_batch(
        self, channel: int, messages: Iterable[bytes | bytearray | memoryview]
    ) -> Sequence[bytes | bytearray | memoryview]:
        """``messages`` as a sequence, once :meth:`send_many`'s checks passed (see there)."""
        self.check_open()
        if channel not in self.channels:
            raise ChannelError(f"{self!r} has no channel {channel}")
        batch = messages if isinstance(messages, Sequence) else list(messages)
        ni = self.ni
        largest = ni.max_message
        inline = ni.inline_threshold
        size = self.config.tx_buffer_size
        buffers = self.config.tx_buffers
        for data in batch:
            length = len(data)
            if length > largest:
                raise UNetError(
                    f"message of {length} bytes exceeds the NI's maximum of {largest}; "
                    "nothing of the batch was sent"
                )
            if length > inline and -(-length // size) > buffers:
                raise UNetError(
                    f"message of {length} bytes needs more than the endpoint's {buffers} send "
                    f"buffers of {size} bytes; nothing of the batch was sent"
                )
        return batch

    async def send(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        """Send ``data`` on ``channel``, waiting while the send queue or buffers are full.

        On an NI with a modeled host cost the caller's task holds the host CPU for that cost
        first (in a simulation), as the application's own thread executes the send path.
        """
        send_cost = self._send_cost
        cost = send_cost(len(data)) if send_cost is not None else 0.0
        if not cost or not self._cpu.try_charge(cost):
            # try_charge did nothing: a cancelled task raises here, before the cost is held.
            # When it succeeds, the charge was the checkpoint (it requires no pending
            # cancellation and counts as a parked wait would).
            await trio.lowlevel.checkpoint_if_cancelled()
            if cost:
                await self._cpu.use(cost)
        while True:
            try:
                descriptor = self.send_nowait(channel, data, dest_offset=dest_offset)
            except trio.WouldBlock:
                await self._send_waiters.wait()
            else:
                break
        if not cost:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return descriptor

    async def send_payload_async(self, channel: int, data: bytes | bytearray | memoryview) -> None:
        """:meth:`send` without the descriptor: the ``await`` face of :meth:`send_payload`.

        Waits as :meth:`send` does; a message the NI rejects at once raises
        :class:`UNetError` as :meth:`send_payload` does.  A transport's fast path (shm) then
        builds no per-message object; this default calls :meth:`send`.
        """
        descriptor = await self.send(channel, data)
        if descriptor.status is DescriptorStatus.ERROR:
            raise UNetError(
                f"{self!r} channel {channel}: the NI rejected the message ({descriptor.error.name})"
            )

    def poll(self) -> Message | None:
        """The next received message, or None: the polling receive model."""
        if self._upcall_error is not None:  # the common case skips the call
            self._raise_upcall_error()
        descriptor = self.recv_queue.pop()
        if descriptor is None:
            return None
        if descriptor.kind is RecvKind.INLINE:  # read() inlined for the small-message case
            return Message(descriptor.channel, descriptor.inline or b"", descriptor.dest_offset)
        data = self.read(descriptor)
        if descriptor.fragments:
            self.release(descriptor)
        return Message(descriptor.channel, data, descriptor.dest_offset)

    def poll_payload(self) -> tuple[int, bytes] | None:
        """:meth:`poll` as a (channel, data) pair instead of a :class:`Message`, or None.

        A direct deposit's ``dest_offset`` is not returned (use :meth:`poll` where it
        matters).  A transport's fast path (shm) then builds no object but the pair; this
        default calls :meth:`poll`.
        """
        message = self.poll()
        return None if message is None else (message.channel, message.data)

    # The express lane (stacklib.unet.express): an endpoint that lends its queues overrides
    # these four; here it lends none.

    def express_rx(self, channel: int) -> NativeQueue | None:
        """The queue ``channel``'s messages arrive on, when taking from it directly is what
        :meth:`poll_payload` would do now (it is the only source, nothing else waits to be
        delivered), else None; this default lends none."""
        return None

    def express_tx(self, channel: int) -> NativeQueue | None:
        """The queue to ``channel``, when writing to it directly is what :meth:`send_payload`
        would do now (nothing queued before it, the channel sound), else None; this default
        lends none."""
        return None

    def express_received(self, channel: int, count: int, nbytes: int, broken: bool) -> None:
        """Count ``count`` messages (``nbytes`` in all) taken from the queue
        :meth:`express_rx` lent; ``broken``: the queue broke, fail the channel as
        :meth:`poll_payload` would."""
        raise NotImplementedError(f"{type(self).__name__} lends no queues (express_rx)")

    def express_sent(self, channel: int, count: int, nbytes: int, wakes: int) -> None:
        """Count ``count`` messages (``nbytes`` in all) written to the queue :meth:`express_tx`
        lent, and wake the peer if ``wakes`` writes found it asleep."""
        raise NotImplementedError(f"{type(self).__name__} lends no queues (express_tx)")

    def recv_many(self, limit: int = 64) -> list[Message]:
        """Up to ``limit`` waiting messages in arrival order, without waiting.

        Returns an empty list when none is waiting; raises :class:`EndpointClosed` when the
        endpoint is closed and nothing is left, and :class:`ValueError` for a ``limit`` below
        1.  Transports override it with a one-pass path; this default loops over :meth:`poll`.
        """
        if limit < 1:
            raise ValueError(f"recv_many: limit must be at least 1, got {limit}")
        out: list[Message] = []
        poll = self.poll
        while len(out) < limit:
            message = poll()
            if message is None:
                break
            out.append(message)
        if not out and self.closed:
            self.check_open()
        return out

    def recv_nowait(self) -> Message:
        """The next received message, or :class:`trio.WouldBlock`."""
        message = self.poll()
        if message is None:
            self.check_open()
            raise trio.WouldBlock
        return message

    async def recv(self) -> Message:
        """Wait for the next message: the blocking receive model."""
        if (
            not self.recv_queue
            and not self.closed
            and self._upcall_error is None
            and type(self).poll is Endpoint.poll
        ):
            # Nothing queued: the task parks, and parking is the checkpoint (a pending
            # cancellation is delivered there, before anything is consumed), so the explicit
            # one is skipped on this most common path of a blocking receive.  (A subclass's
            # poll() may do work even on an empty queue: it takes the general path.)
            await self._recv_waiters.wait()
            message = self.poll()
            waited = True
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
            message = self.poll()
            waited = message is None
        while message is None:
            if self.closed:
                self.check_open()
            await self._recv_waiters.wait()
            message = self.poll()
        if self._prepaid_receives:
            # The CPU spent the receive cost when the message arrived (see notify_arrived).
            self._prepaid_receives -= 1
            return message
        recv_cost = self._recv_cost
        cost = recv_cost(len(message.data)) if recv_cost is not None else 0.0
        if cost:
            await self._cpu.use(cost)
        elif not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return message

    async def recv_payload(self) -> tuple[int, bytes]:
        """:meth:`recv` as a (channel, data) pair: the ``await`` face of :meth:`poll_payload`
        (a direct deposit's ``dest_offset`` is not returned).  A transport's fast path (shm)
        builds no :class:`Message`; this default calls :meth:`recv`."""
        message = await self.recv()
        return message.channel, message.data

    def __aiter__(self) -> AsyncIterator[Message]:
        return _Messages(self)

    # ------------------------------------------------------------------ upcalls

    def set_upcall(self, condition: UpcallCondition, handler: UpcallHandler | None) -> None:
        """Register ``handler(endpoint)`` for ``condition`` (None removes it).

        The handler runs like a signal handler, from the NI's delivery path, with further
        upcalls of this endpoint held back until it returns; it may (and should) consume every
        pending message in one go (paper 000 §3.1).  An exception it raises is counted and
        re-raised from the owner's next receive call.
        """
        if handler is None:
            self._upcalls.pop(condition, None)
        else:
            self._upcalls[condition] = handler
            if self.recv_queue:
                self._maybe_upcall()

    @contextmanager
    def upcalls_disabled(self) -> Iterator[None]:
        """A critical section that is atomic with respect to upcalls (paper 000 §3.1).

        Costs two integer updates; a condition that arose meanwhile fires on exit.
        """
        self._upcall_depth += 1
        try:
            yield
        finally:
            self._upcall_depth -= 1
            if self._upcall_pending and self._upcall_depth == 0:
                self._maybe_upcall()

    def _maybe_upcall(self) -> None:
        if self._upcall_depth:
            self._upcall_pending = True
            return
        self._upcall_depth = 1
        try:
            while True:
                self._upcall_pending = False
                queued = len(self.recv_queue)
                if not queued:
                    break
                handler = self._upcalls.get(UpcallCondition.ALMOST_FULL)
                if handler is None or queued < self.almost_full:
                    handler = self._upcalls.get(UpcallCondition.NON_EMPTY)
                if handler is None:
                    break
                self.upcalls_run += 1
                try:
                    handler(self)
                except Exception as error:  # a handler bug must not break the NI's path
                    self.upcall_errors += 1
                    if self._upcall_error is None:
                        self._upcall_error = error
                    break
                if not self._upcall_pending:
                    break
        finally:
            self._upcall_depth = 0

    def _raise_upcall_error(self) -> None:
        error = self._upcall_error
        if error is not None:
            self._upcall_error = None
            raise UNetError(f"an upcall handler of {self!r} raised {error!r}") from error

    # ------------------------------------------------------------------ NI side

    def notify_arrived(self, length: int = 0) -> None:
        """Called by the NI after it pushed a receive descriptor of ``length`` bytes: wakes a
        blocked receiver and raises upcalls.  (:meth:`NetworkInterface.deliver` calls it; a
        transport that pushes receive descriptors itself must too.)"""
        if self._recv_waiters.tasks:
            recv_cost = self._recv_cost
            cost = recv_cost(length) if recv_cost is not None else 0.0
            if cost and self._virtual:
                # A task is blocked in recv, so the CPU polls idly: it spends the receive cost
                # of this first arrival from now on, and the task wakes once, when that is
                # done.  Later arrivals before the wake-up pay their cost when consumed.
                if not self._prepaid_wake_pending:
                    self._prepaid_wake_pending = True
                    self._prepaid_receives += 1
                    self._cpu.hold(cost, self._prepaid_wake)
            else:
                self._recv_waiters.wake_all()
        if self._upcalls:
            signal = self.ni.upcall_cost
            if signal and self._virtual:
                # The upcall is a UNIX signal: the host spends its delivery cost first.
                if not self._signal_pending:
                    self._signal_pending = True
                    self._cpu.hold(signal, self._signal_delivered)
            else:
                self._maybe_upcall()
        if self.on_arrival is not None:
            self.on_arrival()

    def _signal_delivered(self) -> None:
        self._signal_pending = False
        self._maybe_upcall()

    def _prepaid_wake(self) -> None:
        self._prepaid_wake_pending = False
        self._recv_waiters.wake_all()

    def notify_sent(self) -> None:
        """Called by the NI after it took descriptors off the send queue: reclaims send
        buffers and wakes blocked senders."""
        if self._tx_inflight:
            self._reclaim()
        if self._send_waiters.tasks:
            self._send_waiters.wake_all()
        if self.on_send_space is not None:
            self.on_send_space()

    def _reclaim(self) -> None:
        inflight = self._tx_inflight
        pool = self._tx_pool
        while inflight and inflight[0][0].status is not DescriptorStatus.POSTED:
            pool.extend(inflight.popleft()[1])

    def notify_closed(self) -> None:
        """Called by the OS service once it detached the endpoint from its NI (closed or
        reclaimed): blocked callers wake and raise :class:`EndpointClosed`.  Applications call
        :meth:`close` instead."""
        self.closed = True
        self.channels.clear()
        self._recv_waiters.wake_all()
        self._send_waiters.wake_all()

    # ------------------------------------------------------------------ housekeeping

    def channel(self, channel_id: int) -> Channel:
        """The channel with this id, or :class:`ChannelError`."""
        try:
            return self.channels[channel_id]
        except KeyError:
            raise ChannelError(f"{self!r} has no channel {channel_id}") from None

    def check_open(self) -> None:
        """Raise :class:`EndpointClosed` (a :class:`trio.ClosedResourceError`) if closed."""
        if self.closed:
            raise EndpointClosed(f"{self!r} is closed")

    def statistics(self) -> EndpointStatistics:
        """A snapshot of the endpoint's counters."""
        return EndpointStatistics(
            sent=self.sent,
            sent_bytes=self.sent_bytes,
            send_errors=dict(self.send_errors),
            received=self.received,
            received_bytes=self.received_bytes,
            dropped=dict(self.dropped),
            send_queue_high_water=self.send_queue.high_water,
            recv_queue_high_water=self.recv_queue.high_water,
            free_queue_empty_drops=self.dropped.get(DropReason.NO_FREE_BUFFER, 0),
            upcalls=self.upcalls_run,
            upcall_errors=self.upcall_errors,
        )

    def close(self) -> None:
        """Close the endpoint: its channels are unregistered and waiters get EndpointClosed."""
        if not self.closed:
            self.os.close_endpoint(self.owner, self)

    async def aclose(self) -> None:
        """Close the endpoint (idempotent), as trio resources do."""
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> Endpoint:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Messages:
    """``async for message in endpoint``: :meth:`Endpoint.recv` until the endpoint is closed
    (a class rather than an async generator, which mypyc does not compile)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._endpoint.recv()
        except EndpointClosed:
            raise StopAsyncIteration from None
