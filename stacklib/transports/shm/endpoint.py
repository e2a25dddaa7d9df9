"""The endpoint of the shm transport: its receive and send calls run the NI.

Fast paths: a poll with nothing queued copies the message straight from the peer's ring (the
ring record is the receive buffer), and a small send with nothing queued goes straight into the
peer's ring.  Blocking calls poll for ``spin_time`` seconds with trio checkpoints, then sleep
(:meth:`ShmNI.idle_wait`).  A failed channel raises :class:`PeerGone` once its ring is drained.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from stacklib.errors import PeerGone, SegmentError
from stacklib.transports.shm.link import ShmLink
from stacklib.transports.shm.ring import WRITTEN_WAKE
from stacklib.unet.endpoint import Endpoint, Message
from stacklib.unet.polled import relax as relax
from stacklib.wire.descriptor import DescriptorStatus, Fragment, SendDescriptor

if TYPE_CHECKING:
    from stacklib.transports.shm.ni import ShmNI


class ShmEndpoint(Endpoint):
    """An endpoint whose receive and send calls run the NI (there is no NI processor)."""

    ni: ShmNI

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: (link, channel id) of each channel, in the order the fast poll scans them.
        self._rx_links: list[tuple[ShmLink, int]] = []
        #: More than one channel to scan, so the fast poll takes them in turn.
        self._rotate = False

    def add_rx_link(self, link: ShmLink, channel: int) -> None:
        """Scan ``link``'s receive ring for ``channel`` in the fast poll (the NI calls this
        when it registers the channel)."""
        self._rx_links.append((link, channel))
        self._rotate = len(self._rx_links) > 1

    def remove_rx_link(self, channel: int) -> None:
        """Stop scanning ``channel``'s ring (the NI calls this when it unregisters it)."""
        self._rx_links[:] = [entry for entry in self._rx_links if entry[1] != channel]
        self._rotate = len(self._rx_links) > 1

    def post_free(self, buffer: Fragment) -> None:
        """Hand a receive buffer to the NI, refusing one it could never fill.

        The shm NI sizes its wait for room (a message that does not fit stays in its ring) by
        the free buffers, so a bogus one must not count: raises :class:`SegmentError` naming
        the problem for a non-integer, empty, misaligned or out-of-segment buffer.
        """
        if not isinstance(buffer, tuple) or len(buffer) != 2:
            raise SegmentError(f"{self!r}: a free buffer is an (offset, length) Fragment")
        offset, length = buffer
        segment = self.segment
        if type(offset) is not int or type(length) is not int or length <= 0:
            raise SegmentError(
                f"{self!r}: free buffer offset={offset!r} length={length!r}: "
                "offset and length must be integers, the length positive"
            )
        segment.check(offset, length)
        if not segment.is_aligned(offset):
            raise SegmentError(
                f"{self!r}: free buffer offset {offset} is not {segment.alignment}-byte aligned"
            )
        super().post_free(Fragment(offset, length))

    def poll(self) -> Message | None:
        """The next message, or None.

        The fast path (nothing queued, no upcalls) copies the message straight from the
        peer's ring into the returned bytes: the ring record is the receive buffer.  Otherwise
        the NI runs (:meth:`ShmNI.progress`) and the generic descriptor path applies.
        """
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            if not self.recv_queue:
                self.ni.progress()
            return super().poll()
        links = self._rx_links
        for index, (link, channel) in enumerate(links):
            ring = link.rx
            corrupt = ring.corrupt
            data = ring.take()  # one call: check, copy and free the record
            if data is None:
                if ring.corrupt != corrupt:
                    self.ni.ring_broken(link, ring, self)
                continue
            # (take() woke a producer waiting for room.)
            if self._rotate:  # round robin, so one busy channel cannot starve the others
                links.append(links.pop(index))
            length = len(data)
            self.received += 1
            self.received_bytes += length
            ni = self.ni
            ni.received += 1
            ni.received_bytes += length
            return Message(channel, data)
        if self.ni.tx_blocked:
            self.ni.progress()
        return None

    def send_nowait(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        """Send now or raise :class:`trio.WouldBlock`.

        Fast path: a small message with nothing queued before it goes straight into the peer's
        ring; the descriptor is returned already injected.
        """
        length = len(data)
        if length <= self.ni.inline_threshold and dest_offset is None and not self.send_queue:
            entry = self.channels.get(channel)
            if entry is not None and not self.closed:
                link: ShmLink = entry.tx_tag  # type: ignore[assignment]
                written = link.failed is None and link.tx.try_write(data)
                if written is None:  # the peer broke the ring: PeerGone just below
                    self.ni.ring_broken(link, link.tx)
                elif written:
                    ni = self.ni
                    if written == WRITTEN_WAKE:
                        ni.wakeups_sent += 1
                        link.wake_peer()
                    inline = data if type(data) is bytes else bytes(data)
                    descriptor = SendDescriptor(
                        channel, inline=inline, status=DescriptorStatus.INJECTED
                    )
                    self.sent += 1
                    self.sent_bytes += length
                    ni.sent += 1
                    ni.sent_bytes += length
                    return descriptor
        self._raise_if_failed(channel)
        try:
            return super().send_nowait(channel, data, dest_offset=dest_offset)
        except trio.WouldBlock:
            self.ni.progress()
            return super().send_nowait(channel, data, dest_offset=dest_offset)

    def send_many(self, channel: int, messages: Iterable[bytes | bytearray | memoryview]) -> int:
        """:meth:`Endpoint.send_many` (same contract) in one pass: with nothing queued, the
        messages go straight into the peer's ring, any size, with one tail update and one
        wake-up check; it stops where the ring is full.  A failed channel raises
        :class:`PeerGone`."""
        batch = self._check_batch(channel, messages)
        link: ShmLink = self.channels[channel].tx_tag  # type: ignore[assignment]
        if self.send_queue or link.failed is not None:
            self._raise_if_failed(channel)
            return super().send_many(channel, batch)
        ring = link.tx
        written = ring.write_many(batch)
        if written is None:  # the peer broke the ring
            self.ni.ring_broken(link, ring)
            self._raise_if_failed(channel)
            return 0
        taken, nbytes = written
        if taken < len(batch):
            ring.set_producer_waiting(True)  # the consumer wakes us when it made room
        ni = self.ni
        if taken:
            if ring.consumer_sleeping:
                ni.wakeups_sent += 1
                link.wake_peer()
            self.sent += taken
            self.sent_bytes += nbytes
            ni.sent += taken
            ni.sent_bytes += nbytes
        return taken

    def recv_many(self, limit: int = 64) -> list[Message]:
        """:meth:`Endpoint.recv_many` (same contract) in one pass: with nothing queued and no
        upcalls, each channel's ring gives up its messages with one head update and one check
        for a waiting producer; channels take turns as in :meth:`poll`."""
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            if not self.recv_queue and not self.closed:
                self.ni.progress()
            return super().recv_many(limit)
        if limit < 1:
            raise ValueError(f"recv_many: limit must be at least 1, got {limit}")
        out: list[Message] = []
        links = self._rx_links
        ni = self.ni
        for index, (link, channel) in enumerate(links):
            ring = link.rx
            if not ring.pending:
                continue
            corrupt = ring.corrupt
            chunk, nbytes = ring.read_many(limit - len(out))
            if ring.corrupt != corrupt:
                ni.ring_broken(link, ring, self)
            if ring.producer_waiting:
                ring.set_producer_waiting(False)
                link.wake_peer()
            if not chunk:
                continue
            out += [Message(channel, data) for data in chunk]
            self.received += len(chunk)
            self.received_bytes += nbytes
            ni.received += len(chunk)
            ni.received_bytes += nbytes
            if len(out) >= limit:
                if len(links) > 1:  # the next call starts with the channels after this one
                    links.append(links.pop(index))
                break
        if not out and ni.tx_blocked:
            ni.progress()
        return out

    async def send(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        await trio.lowlevel.checkpoint_if_cancelled()
        deadline = 0.0
        while True:
            try:
                descriptor = self.send_nowait(channel, data, dest_offset=dest_offset)
            except trio.WouldBlock:
                now = time.perf_counter()
                if not deadline:
                    deadline = now + self.ni.spin_time
                if now < deadline:
                    await trio.lowlevel.checkpoint()
                else:
                    await self.ni.idle_wait()
            else:
                break
        await trio.lowlevel.cancel_shielded_checkpoint()
        return descriptor

    async def recv(self) -> Message:
        """Wait for a message: spin ``spin_time`` seconds with checkpoints, then sleep."""
        await trio.lowlevel.checkpoint_if_cancelled()
        message = self.poll()
        if message is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return message
        ni = self.ni
        deadline = time.perf_counter() + ni.spin_time
        while True:
            self.check_open()
            if time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
            else:
                await ni.idle_wait()
                self._raise_if_failed(None)
            message = self.poll()
            if message is not None:
                return message

    def _raise_if_failed(self, channel: int | None) -> None:
        """Raise :class:`PeerGone` for a failed channel whose ring is drained (once when
        receiving; on every send on it)."""
        channels = (
            self.channels.values()
            if channel is None
            else ([self.channels[channel]] if channel in self.channels else [])
        )
        for entry in channels:
            link = entry.tx_tag
            if not isinstance(link, ShmLink) or link.failed is None:
                continue
            if channel is None and (link.reported or link.rx.pending):
                continue
            link.reported = True
            raise PeerGone(f"{self!r} channel {entry.id}: {link.failed}")
