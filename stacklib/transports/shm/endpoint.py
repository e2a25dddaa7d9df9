"""The endpoint of the shm transport: :class:`ShmEndpoint`, the ``await`` faces over the calls
that never wait (:class:`~stacklib.transports.shm.polling.ShmPollingEndpoint`).

Blocking calls poll for ``spin_time`` seconds with trio checkpoints, then sleep
(:meth:`ShmNI.idle_wait`); a receive first polls without yielding for ``hot_spin`` seconds.
Where the compiled copy is built, a call that neither waits nor yields makes no coroutine
(:data:`~stacklib.unet.polled.QUICK`), and the four ``await`` calls in the class's dict are
those quick calls (:func:`install_quick_calls`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar, cast

import trio

from stacklib.compiled import mypyc_attr
from stacklib.errors import UNetError
from stacklib.transports.shm.polling import _ERROR, _POSTED, YIELD_EVERY, ShmPollingEndpoint
from stacklib.unet.endpoint import Message
from stacklib.unet.polled import CANCELLED_TEST, QUICK, cancel_point, cancelled
from stacklib.unet.polled import relax as relax
from stacklib.wire.descriptor import SendDescriptor

__all__ = ["YIELD_EVERY", "ShmEndpoint", "ShmPollingEndpoint", "relax"]

_T = TypeVar("_T")


@mypyc_attr(allow_interpreted_subclasses=True)
class ShmEndpoint(ShmPollingEndpoint):
    """An shm endpoint with the ``await`` faces: :meth:`send`, :meth:`recv`,
    :meth:`send_payload_async` and :meth:`recv_payload`."""

    def send(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> Coroutine[Any, Any, SendDescriptor]:
        """Send, waiting while the ring is full: spin ``spin_time`` seconds with checkpoints,
        then sleep; return once the message is in the peer's ring.

        Always a cancellation point, yielding to other tasks only every :attr:`yield_every`
        calls that did not wait, as :meth:`recv`.  A message queued behind a full ring is
        waited for until this process's NI has put it into the ring (the NI has no
        processor: a sender that returned could leave it queued with no one to push it);
        cancelled during that wait, the message stays queued and goes out when the NI next
        runs.  The quick form as :meth:`recv`'s (not with ``dest_offset``).
        """
        quick = _QUICK_SEND
        if quick is None or dest_offset is not None:
            return self._send_full(channel, data, dest_offset)
        return cast("Coroutine[Any, Any, SendDescriptor]", quick(self, channel, data))

    def _send_now(self, channel: int, data: bytes | bytearray | memoryview) -> object:
        """:meth:`send`'s quick half, called once the task was found not cancelled: the
        descriptor of a message that went into the ring (or was refused) with no wait and no
        yield; else ``NotImplemented``, having sent nothing, or having queued the message
        behind a full ring (:attr:`_quick_queued`)."""
        unyielded = self._unyielded
        if unyielded >= self.yield_every - 1:
            return NotImplemented
        try:
            descriptor = self.send_nowait(channel, data)
        except trio.WouldBlock:  # the send queue is full: nothing sent
            return NotImplemented
        if descriptor.status is _POSTED:
            self._quick_queued = descriptor
            return NotImplemented
        self._unyielded = unyielded + 1
        return descriptor

    async def _send_slow(
        self, channel: int, data: bytes | bytearray | memoryview
    ) -> SendDescriptor:
        """:meth:`send` once :meth:`_send_now` declined: the wait for the message it queued,
        else the whole call."""
        queued = self._quick_queued
        if queued is not None:
            self._quick_queued = None
            await self._injected(channel, queued)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return queued
        return await self._send_full(channel, data, None)

    async def _send_full(
        self, channel: int, data: bytes | bytearray | memoryview, dest_offset: int | None
    ) -> SendDescriptor:
        """:meth:`send` as one coroutine: the reference of its quick form."""
        unyielded = self._unyielded
        if cancel_point() if unyielded >= self.yield_every - 1 else cancelled():
            await trio.lowlevel.checkpoint_if_cancelled()
        try:
            descriptor = self.send_nowait(channel, data, dest_offset=dest_offset)
        except trio.WouldBlock:  # the send queue is full
            descriptor = await self._send_waiting(channel, data, dest_offset)
        else:
            if descriptor.status is not _POSTED:  # in the ring (or refused): no wait
                if unyielded < self.yield_every - 1:
                    self._unyielded = unyielded + 1
                    return descriptor
                self._unyielded = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
                return descriptor
            await self._injected(channel, descriptor)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return descriptor

    def send_payload_async(
        self, channel: int, data: bytes | bytearray | memoryview
    ) -> Coroutine[Any, Any, None]:
        """:meth:`send` without the descriptor (the ``await`` face of :meth:`send_payload`):
        the same waits, cancellation point, yields and quick form, and the same errors as
        :meth:`send_payload`; a message the fast path takes builds no per-message object."""
        quick = _QUICK_SEND_PAYLOAD
        if quick is None:
            return self._send_payload_full(channel, data)
        return cast("Coroutine[Any, Any, None]", quick(self, channel, data))

    def _send_payload_now(self, channel: int, data: bytes | bytearray | memoryview) -> object:
        """:meth:`_send_now` for :meth:`send_payload_async` (None when sent)."""
        unyielded = self._unyielded
        if unyielded >= self.yield_every - 1:
            return NotImplemented
        try:
            self.send_payload(channel, data)
        except trio.WouldBlock:  # the send queue is full: nothing sent
            return NotImplemented
        queue = self.send_queue
        if queue:  # the ring was full: the message is the last of the queue
            *_, descriptor = queue
            if descriptor.status is _POSTED:
                self._quick_queued = descriptor
                return NotImplemented
        self._unyielded = unyielded + 1
        return None

    async def _send_payload_slow(self, channel: int, data: bytes | bytearray | memoryview) -> None:
        """:meth:`_send_slow` for :meth:`send_payload_async`."""
        queued = self._quick_queued
        if queued is not None:
            self._quick_queued = None
            await self._injected(channel, queued)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        await self._send_payload_full(channel, data)

    async def _send_payload_full(self, channel: int, data: bytes | bytearray | memoryview) -> None:
        """:meth:`send_payload_async` as one coroutine: the reference of its quick form."""
        unyielded = self._unyielded
        if cancel_point() if unyielded >= self.yield_every - 1 else cancelled():
            await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.send_payload(channel, data)
        except trio.WouldBlock:  # the send queue is full: wait for room as send() does
            descriptor = await self._send_waiting(channel, data, None)
            await trio.lowlevel.cancel_shielded_checkpoint()
            if descriptor.status is _ERROR:
                raise UNetError(
                    f"{self!r} channel {channel}: the NI rejected the message "
                    f"({descriptor.error.name})"
                ) from None
            return
        queue = self.send_queue
        if queue:
            # The ring was full: the message is the last of the queue (the fast path sends
            # only with an empty queue, and the queue drains in order).  Wait until the NI
            # has put it into the ring, as send() does.
            *_, descriptor = queue
            if descriptor.status is _POSTED:
                await self._injected(channel, descriptor)
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
        if unyielded < self.yield_every - 1:
            self._unyielded = unyielded + 1
            return
        self._unyielded = 0
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def _send_waiting(
        self, channel: int, data: bytes | bytearray | memoryview, dest_offset: int | None
    ) -> SendDescriptor:
        """The waiting part of :meth:`send`, once the send queue was full: spin ``spin_time``
        seconds with checkpoints, then sleep, until the message is queued; then wait until
        it is in the ring (:meth:`_injected`)."""
        ni = self.shm_ni
        self._unyielded = 0
        deadline = time.perf_counter() + ni.spin_time
        while True:
            if time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
            else:
                await ni.idle_wait()
            try:
                descriptor = self.send_nowait(channel, data, dest_offset=dest_offset)
            except trio.WouldBlock:
                continue
            if descriptor.status is _POSTED:
                await self._injected(channel, descriptor)
            return descriptor

    async def _injected(self, channel: int, descriptor: SendDescriptor) -> None:
        """Wait until this process's NI has put the queued ``descriptor`` into the ring."""
        ni = self.shm_ni
        self._unyielded = 0
        deadline = time.perf_counter() + ni.spin_time
        while True:
            ni.progress()
            if descriptor.status is not _POSTED:
                return
            self._raise_if_failed(channel)
            self.check_open()
            if time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
            else:
                await ni.idle_wait()

    def recv(self) -> Coroutine[Any, Any, Message]:
        """Wait for a message: poll without yielding for ``hot_spin`` seconds (a reply on a
        busy channel comes sooner than a trio scheduler pass takes), then spin ``spin_time``
        seconds with checkpoints, then sleep.

        Always a cancellation point: a call in a cancelled scope raises ``trio.Cancelled``
        before it takes a message (:func:`cancelled`; the call that yields makes the full
        :func:`cancel_point` test, which also delivers a ``KeyboardInterrupt`` trio holds for
        the main task).  A call that did not wait yields to other tasks only every
        :attr:`yield_every` calls: a scheduler pass costs several microseconds, as much as
        the whole round trip over shm, so yielding on every message would make the ``await``
        face several times slower than polling.  Other tasks wait at most ``hot_spin`` plus
        that many calls' work.

        Where the compiled copy is built, the call that neither waits nor yields makes no
        coroutine: :data:`~stacklib.unet.polled.QUICK`'s awaitable tests for cancellation and
        runs :meth:`_recv_now` when awaited, and only falls back to :meth:`_recv_slow`, a
        coroutine, otherwise; the coroutine :meth:`_recv_full` is the reference, and what
        runs where it is not built.  There the class's ``recv`` (and ``send``,
        ``send_payload_async``, ``recv_payload``) is that quick call itself, a method
        descriptor in C (:func:`install_quick_calls`): a Python caller reaches it without
        this method's call.
        """
        quick = _QUICK_RECV
        if quick is None:
            return self._recv_full()
        return cast("Coroutine[Any, Any, Message]", quick(self))

    def _recv_now(self) -> object:
        """:meth:`recv`'s quick half, called once the task was found not cancelled: its
        message where it would neither wait nor yield (the poll, the hot spin), else
        ``NotImplemented``, having done nothing the slow half does not do again."""
        unyielded = self._unyielded
        if unyielded >= self.yield_every - 1:
            return NotImplemented
        message = self.poll()
        if message is None:
            message = self._spin_poll()
            if message is None:
                return NotImplemented
        self._unyielded = unyielded + 1
        return message

    async def _recv_slow(self) -> Message:
        """:meth:`recv` once :meth:`_recv_now` declined: the whole call where it is this
        call's turn to yield or the task is cancelled, else (nothing came within the hot spin)
        the wait."""
        if self._unyielded >= self.yield_every - 1 or cancelled():
            return await self._recv_full()
        return await self._wait(self.poll)

    async def _recv_full(self) -> Message:
        """:meth:`recv` as one coroutine: the reference of its quick form."""
        unyielded = self._unyielded
        if cancel_point() if unyielded >= self.yield_every - 1 else cancelled():
            await trio.lowlevel.checkpoint_if_cancelled()
        message = self.poll()
        if message is None:
            message = self._spin_poll()
            if message is None:
                return await self._wait(self.poll)
        if unyielded < self.yield_every - 1:
            self._unyielded = unyielded + 1
            return message
        self._unyielded = 0
        await trio.lowlevel.cancel_shielded_checkpoint()
        return message

    def recv_payload(self) -> Coroutine[Any, Any, tuple[int, bytes]]:
        """:meth:`recv` as (channel, data), no :class:`Message` (the ``await`` face of
        :meth:`poll_payload`): the same waits, cancellation point and yields, and the same
        quick form."""
        quick = _QUICK_RECV_PAYLOAD
        if quick is None:
            return self._recv_payload_full()
        return cast("Coroutine[Any, Any, tuple[int, bytes]]", quick(self))

    def _recv_payload_now(self) -> object:
        """:meth:`_recv_now` for :meth:`recv_payload`."""
        unyielded = self._unyielded
        if unyielded >= self.yield_every - 1:
            return NotImplemented
        arrival = self.poll_payload()
        if arrival is None:
            arrival = self._spin_payload()
            if arrival is None:
                return NotImplemented
        self._unyielded = unyielded + 1
        return arrival

    async def _recv_payload_slow(self) -> tuple[int, bytes]:
        """:meth:`_recv_slow` for :meth:`recv_payload`."""
        if self._unyielded >= self.yield_every - 1 or cancelled():
            return await self._recv_payload_full()
        return await self._wait(self.poll_payload)

    async def _recv_payload_full(self) -> tuple[int, bytes]:
        """:meth:`recv_payload` as one coroutine: the reference of its quick form."""
        unyielded = self._unyielded
        if cancel_point() if unyielded >= self.yield_every - 1 else cancelled():
            await trio.lowlevel.checkpoint_if_cancelled()
        arrival = self.poll_payload()
        if arrival is None:
            arrival = self._spin_payload()
            if arrival is None:
                return await self._wait(self.poll_payload)
        if unyielded < self.yield_every - 1:
            self._unyielded = unyielded + 1
            return arrival
        self._unyielded = 0
        await trio.lowlevel.cancel_shielded_checkpoint()
        return arrival

    def _spin_poll(self) -> Message | None:
        """:meth:`poll` for up to ``hot_spin`` seconds without yielding (the clock read every
        32nd poll, so a reply is seen within a poll or so of its arrival, and first at the
        32nd: a reply on a busy channel comes before it, a microsecond or two, and the reading
        is a call): the message, or None."""
        hot_spin = self.shm_ni.hot_spin
        if not hot_spin:
            return None
        hot = 0.0
        spins = 0
        while True:
            message = self.poll()
            if message is not None:
                return message
            spins += 1
            if spins & 31 == 0:
                if not hot:
                    hot = time.perf_counter() + hot_spin
                elif time.perf_counter() >= hot:
                    return None
            relax(spins)  # a peer sharing this CPU runs now, not after our time slice

    def _spin_payload(self) -> tuple[int, bytes] | None:
        """:meth:`_spin_poll` with :meth:`poll_payload` (written out again so the loop calls
        it directly)."""
        hot_spin = self.shm_ni.hot_spin
        if not hot_spin:
            return None
        hot = 0.0
        spins = 0
        while True:
            arrival = self.poll_payload()
            if arrival is not None:
                return arrival
            spins += 1
            if spins & 31 == 0:
                if not hot:
                    hot = time.perf_counter() + hot_spin
                elif time.perf_counter() >= hot:
                    return None
            relax(spins)

    async def _wait(self, poll: Callable[[], _T | None]) -> _T:
        """The waiting part of :meth:`recv` and :meth:`recv_payload`, once the hot spin found
        nothing: spins with checkpoints for ``spin_time`` seconds, then sleeps."""
        ni = self.shm_ni
        now = time.perf_counter
        self._unyielded = 0
        deadline = now() + ni.spin_time
        while True:
            self.check_open()
            if now() < deadline:
                await trio.lowlevel.checkpoint()
            else:
                await ni.idle_wait()
                self._raise_if_failed(None)
            arrival = poll()
            if arrival is not None:
                return arrival


#: The four ``await`` calls as compiled (or written): what the quick calls stand in for.
_METHODS: Final = {
    name: vars(ShmEndpoint)[name] for name in ("send", "send_payload_async", "recv", "recv_payload")
}


def quick_calls(
    quick: Callable[..., Callable[..., Any]] | None,
) -> tuple[Callable[..., Any] | None, ...]:
    """The quick forms of :meth:`ShmEndpoint.send`, ``send_payload_async``, ``recv`` and
    ``recv_payload`` made with ``quick`` (:data:`~stacklib.unet.polled.QUICK`; None: none).

    Each pairs the call's quick half with its slow one, unbound (the awaitable calls them with
    the endpoint: no bound method per call), tests for cancellation itself before the quick
    half (:func:`~stacklib.unet.polled.cancelled`, called at its C function where it is
    built), and stands in for the method in the class's dict: ``endpoint.recv()`` is then one
    call in C, and a call the pair does not take (``send``'s ``dest_offset``) goes to the
    method.
    """
    if quick is None:
        return (None, None, None, None)
    halves = {  # the name's quick half, slow half and arguments after the endpoint
        "send": (ShmEndpoint._send_now, ShmEndpoint._send_slow, 2),
        "send_payload_async": (ShmEndpoint._send_payload_now, ShmEndpoint._send_payload_slow, 2),
        "recv": (ShmEndpoint._recv_now, ShmEndpoint._recv_slow, 0),
        "recv_payload": (ShmEndpoint._recv_payload_now, ShmEndpoint._recv_payload_slow, 0),
    }
    return tuple(
        quick(halves[name][0], halves[name][1], CANCELLED_TEST, method, halves[name][2])
        for name, method in _METHODS.items()
    )


def install_quick_calls(calls: tuple[Callable[..., Any] | None, ...]) -> None:
    """Put :func:`quick_calls`' calls into :class:`ShmEndpoint`'s dict in place of the four
    methods (None: the methods themselves), for callers that look them up there (Python code;
    compiled callers call the methods, which make the same awaitables)."""
    for (name, method), call in zip(_METHODS.items(), calls, strict=True):
        setattr(ShmEndpoint, name, method if call is None else call)


# (Final: the compiled module reads each from a C static, not from the module's dict.)
_QUICK_CALLS: Final = quick_calls(QUICK)
_QUICK_SEND: Final = _QUICK_CALLS[0]
_QUICK_SEND_PAYLOAD: Final = _QUICK_CALLS[1]
_QUICK_RECV: Final = _QUICK_CALLS[2]
_QUICK_RECV_PAYLOAD: Final = _QUICK_CALLS[3]
install_quick_calls(_QUICK_CALLS)
