"""The shm endpoint's calls that never wait: polls, sends into the peer's ring or the send
queue, views, batches and the express lane (:class:`ShmPollingEndpoint`); the ``await``
faces are :class:`~stacklib.transports.shm.endpoint.ShmEndpoint`'s.

Fast paths: a poll with nothing queued copies the message straight from the peer's ring (the
ring record is the receive buffer), and a small send with nothing queued goes straight into the
peer's ring.  A failed channel raises :class:`PeerGone` once its ring is drained.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, cast

import trio

from stacklib.compiled import mypyc_attr
from stacklib.errors import PeerGone, SegmentError
from stacklib.transports.shm.link import ShmLink
from stacklib.transports.shm.ring import WRITTEN_WAKE, Ring
from stacklib.unet.endpoint import Endpoint, EndpointConfig, Message
from stacklib.unet.express import NativeQueue
from stacklib.wire.descriptor import DescriptorStatus, Fragment, SendDescriptor

if TYPE_CHECKING:
    from stacklib.transports.shm.ni import ShmNI
    from stacklib.unet.ni import NetworkInterface
    from stacklib.unet.os_service import OSService, Principal

_INJECTED: Final = DescriptorStatus.INJECTED
_POSTED: Final = DescriptorStatus.POSTED
_ERROR: Final = DescriptorStatus.ERROR

#: The ``await`` calls (:meth:`ShmEndpoint.send`, ``recv``, ``send_payload_async``,
#: ``recv_payload``) that did not wait yield to other trio tasks once in this many calls of
#: an endpoint (its ``yield_every``).  Each is a cancellation point every time; the call that
#: yields also delivers a ``KeyboardInterrupt`` trio holds for the main task.  A scheduler
#: pass costs some 5-10 us here, so this adds 0.02-0.04 us a call (0.08-0.15 at 64); other
#: tasks wait at most this many calls' work, some 0.1-0.2 ms compiled and 0.5 ms pure.
YIELD_EVERY: Final = 256


@mypyc_attr(allow_interpreted_subclasses=True)
class ShmPollingEndpoint(Endpoint):
    """An endpoint whose receive and send calls run the NI (there is no NI processor): the
    calls that never wait, and the state of the ``await`` faces :class:`ShmEndpoint` adds."""

    def __init__(
        self,
        *,
        port: int,
        owner: Principal,
        ni: NetworkInterface,
        os_service: OSService,
        config: EndpointConfig,
    ) -> None:
        # The arguments spelt out: mypyc's compiled ``**kwargs`` forwarding to a compiled
        # base class mixes them up.
        super().__init__(port=port, owner=owner, ni=ni, os_service=os_service, config=config)
        # ``self.ni``, typed: a compiled subclass may not narrow the type of an inherited
        # attribute (stacklib/compiled.py), so the shm NI has a name of its own.
        #: This endpoint's NI (the OS service creates a ShmEndpoint for a ShmNI only).
        self.shm_ni: ShmNI = cast("ShmNI", self.ni)
        #: (link, channel id) of each channel, in the order the fast poll scans them.
        self._rx_links: list[tuple[ShmLink, int]] = []
        #: More than one channel to scan, so the fast poll takes them in turn.
        self._rotate = False
        #: The ring whose record :meth:`poll_view` lent out, freed by the next receive call.
        self._held: Ring | None = None
        #: The ``await`` faces (:meth:`send`, :meth:`recv`, ...) yield to other tasks, and
        #: make the full cancellation test, on every this-many-th call that did not wait
        #: (:data:`YIELD_EVERY` unless changed; 1: every call).
        self.yield_every: int = YIELD_EVERY
        #: Calls of the ``await`` faces since one last yielded to other tasks.
        self._unyielded = 0
        #: The message a send's quick half queued behind a full ring, for its slow half to
        #: wait for (set and taken within one ``await``).
        self._quick_queued: SendDescriptor | None = None

    def add_rx_link(self, link: ShmLink, channel: int) -> None:
        """Scan ``link``'s receive ring for ``channel`` in the fast poll (the NI calls this
        when it registers the channel)."""
        self._rx_links.append((link, channel))
        self._rotate = len(self._rx_links) > 1

    def remove_rx_link(self, channel: int) -> None:
        """Stop scanning ``channel``'s ring (the NI calls this when it unregisters it)."""
        for link, id_ in self._rx_links:
            if id_ == channel and link.rx is self._held:
                self.release_view()
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
        # Unpacked as objects: compiled, unpacking a Fragment would check for ints itself and
        # raise TypeError instead of the SegmentError promised here.
        fields: tuple[object, ...] = tuple(buffer)
        offset, length = fields
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
        if self._held is not None:
            self.release_view()
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            if not self.recv_queue:
                self.shm_ni.progress()
            return super().poll()
        links = self._rx_links
        for index, (link, channel) in enumerate(links):
            ring = link.rx
            corrupt = ring.corrupt
            data = ring.take()  # one call: check, copy and free the record
            if data is None:
                if ring.corrupt != corrupt:
                    self.shm_ni.ring_broken(link, ring, self)
                continue
            # (take() woke a producer waiting for room.)
            if self._rotate:  # round robin, so one busy channel cannot starve the others
                links.append(links.pop(index))
            length = len(data)
            self.received += 1
            self.received_bytes += length
            ni = self.shm_ni
            ni.received += 1
            ni.received_bytes += length
            return Message(channel, data)
        if self.shm_ni.tx_blocked:
            self.shm_ni.progress()
        return None

    def poll_payload(self) -> tuple[int, bytes] | None:
        """:meth:`Endpoint.poll_payload`: :meth:`poll`'s fast path (the same loop, written out
        again so neither pays a call for the other) returning (channel, data), no
        :class:`Message`."""
        if self._held is not None:
            self.release_view()
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            message = self.poll()
            return None if message is None else (message.channel, message.data)
        links = self._rx_links
        for index, (link, channel) in enumerate(links):
            ring = link.rx
            corrupt = ring.corrupt
            data = ring.take()
            if data is None:
                if ring.corrupt != corrupt:
                    self.shm_ni.ring_broken(link, ring, self)
                continue
            if self._rotate:
                links.append(links.pop(index))
            length = len(data)
            self.received += 1
            self.received_bytes += length
            ni = self.shm_ni
            ni.received += 1
            ni.received_bytes += length
            return channel, data
        if self.shm_ni.tx_blocked:
            self.shm_ni.progress()
        return None

    # ------------------------------------------------------------------ the express lane

    def express_rx(self, channel: int) -> NativeQueue | None:
        """:meth:`Endpoint.express_rx`: the ring of ``channel`` when it is this
        endpoint's only receive ring and :meth:`poll_payload` would take from it now (no view
        held, nothing queued, no upcalls, open, no send waiting for ring room)."""
        if (
            self._held is not None
            or self.recv_queue
            or self._upcalls
            or self._upcall_error is not None
            or self.closed
            or self.shm_ni.tx_blocked
        ):
            return None
        links = self._rx_links
        if len(links) != 1:
            return None
        link, source = links[0]
        return link.rx.native_queue() if source == channel else None

    def express_tx(self, channel: int) -> NativeQueue | None:
        """:meth:`Endpoint.express_tx`: the ring to ``channel`` when
        :meth:`send_payload` would write to it now (nothing queued, open, channel sound)."""
        if self.send_queue or self.closed:
            return None
        entry = self.channels.get(channel)
        if entry is None:
            return None
        link: ShmLink = entry.tx_tag  # type: ignore[assignment]
        if link.failed is not None:
            return None
        return link.tx.native_queue()

    def express_received(self, channel: int, count: int, nbytes: int, broken: bool) -> None:
        """:meth:`Endpoint.express_received`: the counters :meth:`poll_payload` keeps;
        a broken ring fails the channel as there."""
        self.received += count
        self.received_bytes += nbytes
        ni = self.shm_ni
        ni.received += count
        ni.received_bytes += nbytes
        if broken:
            for link, source in self._rx_links:
                if source == channel:
                    ring = link.rx
                    ring.take_broke()
                    ni.ring_broken(link, ring, self)
                    break

    def express_sent(self, channel: int, count: int, nbytes: int, wakes: int) -> None:
        """:meth:`Endpoint.express_sent`: the counters and wake-ups of
        :meth:`send_payload`."""
        self.sent += count
        self.sent_bytes += nbytes
        ni = self.shm_ni
        ni.sent += count
        ni.sent_bytes += nbytes
        if wakes:
            link: ShmLink = self.channels[channel].tx_tag  # type: ignore[assignment]
            for _ in range(wakes):
                ni.wakeups_sent += 1
                link.wake_peer()

    def poll_into(self, buffer: bytearray | memoryview) -> tuple[int, int] | None:
        """Copy the next message into ``buffer``: (channel, length), or None.

        One copy, from the peer's ring straight into ``buffer`` (a receive-into for bulk data:
        reuse one buffer, as MPI's ``Recv`` does).  A message longer than ``buffer`` stays where
        it is and raises ``ValueError`` naming both lengths.  With messages queued by the NI
        (upcalls, a full receive queue) the next queued one is copied instead.
        """
        if self._held is not None:
            self.release_view()
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            message = self.poll()
            if message is None:
                return None
            length = len(message.data)
            if length > len(buffer):
                raise ValueError(
                    f"a message of {length} bytes does not fit a {len(buffer)}-byte buffer"
                )
            with memoryview(buffer) as target:
                target[:length] = message.data
            return message.channel, length
        links = self._rx_links
        for index, (link, channel) in enumerate(links):
            ring = link.rx
            corrupt = ring.corrupt
            taken = ring.take_into(buffer)
            if taken is None:
                if ring.corrupt != corrupt:
                    self.shm_ni.ring_broken(link, ring, self)
                continue
            if self._rotate:
                links.append(links.pop(index))
            self._count_received(taken)
            return channel, taken
        if self.shm_ni.tx_blocked:
            self.shm_ni.progress()
        return None

    def poll_view(self) -> tuple[int, memoryview] | None:
        """The next message without a copy: (channel, read-only view of its ring record), or
        None.

        The record stays this endpoint's until the next receive call on it (:meth:`poll`,
        :meth:`poll_payload`, :meth:`poll_into`, :meth:`poll_view`, :meth:`recv_many`,
        :meth:`recv`),
        :meth:`release_view` or :meth:`close`, which free it and release the view: using it
        after that raises ``ValueError``.  Slices taken from the view are the caller's to drop
        by then (the ring reuses those bytes).  The peer can still write into its ring, so copy
        out what you check before trusting it.  With messages queued by the NI (upcalls, a full
        receive queue) the next queued one is returned as a view of its bytes.
        """
        if self._held is not None:
            self.release_view()
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            message = self.poll()
            return None if message is None else (message.channel, memoryview(message.data))
        links = self._rx_links
        for index, (link, channel) in enumerate(links):
            ring = link.rx
            corrupt = ring.corrupt
            view = ring.hold()
            if view is None:
                if ring.corrupt != corrupt:
                    self.shm_ni.ring_broken(link, ring, self)
                continue
            self._held = ring
            if self._rotate:
                links.append(links.pop(index))
            self._count_received(len(view))
            return channel, view
        if self.shm_ni.tx_blocked:
            self.shm_ni.progress()
        return None

    def release_view(self) -> None:
        """Free the record :meth:`poll_view` lent out and release its view (no-op without
        one); the next receive call does this itself."""
        ring = self._held
        if ring is not None:
            self._held = None
            ring.release_held()

    def _count_received(self, length: int) -> None:
        self.received += 1
        self.received_bytes += length
        ni = self.shm_ni
        ni.received += 1
        ni.received_bytes += length

    def send_nowait(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        """Send now or raise :class:`trio.WouldBlock`.

        Fast path: with nothing queued before it, a small message, or ``bytes`` of any size up
        to the NI's ``max_message``, goes straight from ``data`` into the peer's ring (one
        copy: bulk data skips the segment); the descriptor is returned already injected, its
        ``inline`` the caller's own ``bytes`` object.  (:meth:`send_many` does the same for
        any buffer type.)
        """
        length = len(data)
        if (
            (length <= self.shm_ni.inline_threshold or type(data) is bytes)
            and dest_offset is None
            and not self.send_queue
        ):
            entry = self.channels.get(channel)
            if entry is not None and not self.closed:
                link: ShmLink = entry.tx_tag  # type: ignore[assignment]
                ring = link.tx
                written = (
                    link.failed is None and length <= ring.max_message and ring.try_write(data)
                )
                if written is None:  # the peer broke the ring: PeerGone just below
                    self.shm_ni.ring_broken(link, link.tx)
                elif written:
                    ni = self.shm_ni
                    if written == WRITTEN_WAKE:
                        ni.wakeups_sent += 1
                        link.wake_peer()
                    inline = data if type(data) is bytes else bytes(data)
                    # Positional: a keyword call builds a dict per message.
                    descriptor = SendDescriptor(channel, (), inline, None, _INJECTED)
                    self.sent += 1
                    self.sent_bytes += length
                    ni.sent += 1
                    ni.sent_bytes += length
                    return descriptor
        self._raise_if_failed(channel)
        try:
            return super().send_nowait(channel, data, dest_offset=dest_offset)
        except trio.WouldBlock:
            self.shm_ni.progress()
            return super().send_nowait(channel, data, dest_offset=dest_offset)

    def send_payload(self, channel: int, data: bytes | bytearray | memoryview) -> None:
        """:meth:`Endpoint.send_payload`: :meth:`send_nowait`'s fast path (written out again so
        neither pays a call for the other), no :class:`SendDescriptor`; anything else (a queue
        before it, a full or broken ring, a large non-``bytes`` buffer) goes to
        :meth:`send_nowait`."""
        length = len(data)
        if (length <= self.shm_ni.inline_threshold or type(data) is bytes) and not self.send_queue:
            entry = self.channels.get(channel)
            if entry is not None and not self.closed:
                link: ShmLink = entry.tx_tag  # type: ignore[assignment]
                ring = link.tx
                # A broken ring (None) or a full one (0) is left to send_nowait, which tries
                # it again and raises or queues as it documents.
                if link.failed is None and length <= ring.max_message:
                    written = ring.try_write(data)
                    if written:
                        ni = self.shm_ni
                        if written == WRITTEN_WAKE:
                            ni.wakeups_sent += 1
                            link.wake_peer()
                        self.sent += 1
                        self.sent_bytes += length
                        ni.sent += 1
                        ni.sent_bytes += length
                        return
        super().send_payload(channel, data)

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
            self.shm_ni.ring_broken(link, ring)
            self._raise_if_failed(channel)
            return 0
        taken, nbytes = written
        if taken < len(batch):
            ring.set_producer_waiting(True)  # the consumer wakes us when it made room
        ni = self.shm_ni
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
        if self._held is not None:
            self.release_view()
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            if not self.recv_queue and not self.closed:
                self.shm_ni.progress()
            return super().recv_many(limit)
        if limit < 1:
            raise ValueError(f"recv_many: limit must be at least 1, got {limit}")
        out: list[Message] = []
        links = self._rx_links
        ni = self.shm_ni
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
