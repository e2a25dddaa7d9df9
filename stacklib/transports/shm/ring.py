"""One direction of a shm channel: a single-producer/single-consumer byte ring of records.

A ring is ``ring_bytes`` of records, each an 8-byte header (``length: u32``, ``kind: u32``) and
the message padded to 16 bytes.  ``tail`` (written only by the producer) and ``head`` (written
only by the consumer) are free-running byte counters on separate cache lines of the region's
header page; a record never wraps (a PAD record fills the end of the ring instead).  The
producer writes the record, then the tail; x86-64 keeps stores in order, so a consumer that
sees the tail sees the record.  (Python has no fences; on weakly ordered CPUs this would need a
C helper.)

The peer process can write anything into the shared counters and records.  Each side keeps its
own counter privately and checks every value it reads from the peer before use, with a few
integer compares: a tail or head that is unaligned, behind this side's view, more than a ring
ahead, or moving backwards, and a record whose kind or length does not fit, *break* the ring.
A broken ring counts it in :attr:`Ring.corrupt`, says why in :attr:`Ring.error`, and is cut off
the shared memory (it reads as empty and refuses writes); its channel then fails with that
error.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Sequence
from typing import Final

# The record format and the header words are the core's (one definition for both forms):
# KIND_*, ALIGN and WRITTEN* are this module's public names too.
from stacklib.transports.shm.ring_core import (
    _HEAD,
    _LOW,
    _MESSAGE_HIGH,
    _PAD_HIGH,
    _SLEEPING,
    _TAIL,
    _WAITING,
    ALIGN,
    KIND_MESSAGE,
    KIND_PAD,
    WRITTEN,
    WRITTEN_WAKE,
    Core,
    RingCore,
    detached_core,
    new_core,
)
from stacklib.unet.ni import Payload

__all__ = ["ALIGN", "KIND_MESSAGE", "KIND_PAD", "RECORD_HEADER", "WRITTEN", "WRITTEN_WAKE", "Ring"]

RECORD_HEADER: Final = struct.Struct("<II")  # length, kind
#: Size in words of the private block a broken ring uses instead of the shared header page.
_DETACHED_WORDS: Final = 512


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Ring:
    """One direction of a channel: a byte ring of records in shared memory.

    The producer side uses :meth:`try_write`; the consumer side :meth:`peek` and
    :meth:`release`.  Each side keeps its own counter privately and publishes it, so a peer
    scribbling on the shared memory can only break this ring, never reach outside it: the first
    impossible value read from the peer breaks the ring for good (:attr:`error`).
    """

    __slots__ = (
        "_base",
        "_core",
        "_mapping",
        "_start",
        "_u64",
        "_wake",
        "_words",
        "capacity",
        "corrupt",
        "data",
        "error",
        "held",
        "max_message",
    )

    def __init__(
        self,
        words: memoryview,
        base: int,
        data: memoryview,
        max_message: int,
        mapping: mmap.mmap | None = None,
        start: int = 0,
        *,
        native: bool | None = None,
    ) -> None:
        """``data`` is the ring's bytes; where they are ``mapping[start:start + len(data)]``
        (the link passes its mapping), messages are copied out by slicing the mapping, which
        makes the ``bytes`` at once, without the memoryview a slice of ``data`` builds first.
        ``native``: the per-message core in C (True), in Python (False), or C where it is
        built (None; see :mod:`~stacklib.transports.shm.ring_core`)."""
        capacity = len(data)
        if capacity <= 0 or capacity % ALIGN:
            raise ValueError(f"a ring of {capacity} bytes: not a positive multiple of {ALIGN}")
        self._words = words
        self._base = base
        self.data = data
        self._mapping = mapping
        self._start = start
        # Record headers read and written as one 64-bit word, the length in its low half and
        # the kind in its high half (offsets are 16-byte aligned): one indexing costs less
        # than two, or a Struct call and its tuple.  Native order, which is RECORD_HEADER's
        # little-endian on x86-64 (see the module's note on ordering).
        self._u64 = data.cast("Q")
        self.capacity = capacity
        self.max_message = max_message
        #: Times the peer broke the ring (a broken ring is cut off, so at most once).
        self.corrupt = 0
        #: Why the ring broke (which value the peer wrote), or None while it is sound.
        self.error: str | None = None
        self._wake: Callable[[], object] | None = None
        #: The view :meth:`hold` handed out, its record not yet freed (see :meth:`hold`).
        self.held: memoryview | None = None
        # Counters found in the region when this side attaches come from shared memory too.
        tail = words[base + _TAIL]
        head = words[base + _HEAD]
        # (A tail near 2**64 would overflow its word as we write on.)
        if tail % ALIGN or head % ALIGN or not 0 <= tail - head <= capacity or tail >> 62:
            self._core: Core = detached_core(words, base, data, max_message)
            self._break(f"found tail {tail} and head {head} when attaching")
        else:
            # The private counters and the per-message operations.
            self._core = new_core(
                words, base, data, max_message, tail, head, mapping, start, native=native
            )

    @property
    def wake_producer(self) -> Callable[[], object] | None:
        """Called by :meth:`take` when it made room for a producer that waits (the link sets
        it to its wake-up of the peer)."""
        return self._wake

    @wake_producer.setter
    def wake_producer(self, wake: Callable[[], object] | None) -> None:
        self._wake = wake
        self._core.wake = wake

    @property
    def native(self) -> bool:
        """Whether the per-message operations run in C (:mod:`ring_core`'s ``_ringcore``)."""
        return not isinstance(self._core, RingCore)

    # ---------------------------------------------------------------- producer
    def try_write(self, payload: Payload) -> int | None:
        """Append one message: :data:`WRITTEN`, or :data:`WRITTEN_WAKE` when the consumer
        sleeps (the caller wakes it: the flag is read here, saving the caller a call); 0 if the
        ring is full (back-pressure); None if the ring is broken (the consumer published an
        impossible head, now or before)."""
        written = self._core.try_write(payload)
        if written >= 0:
            return written
        if self.error is None:
            self._break(self._core.failure or "the consumer published an impossible head")
        return None

    def write_many(self, messages: Sequence[Payload]) -> tuple[int, int] | None:
        """Append ``messages`` in order while they fit, publishing the tail once at the end;
        returns (messages, bytes) written (a prefix: fewer when the ring filled up), or None
        if the ring is broken.  Lengths are the caller's to check against ``max_message``."""
        core = self._core
        tail = core.tail
        capacity = self.capacity
        room = core.cached_head + capacity  # the tail may advance up to here
        data = self.data
        u64 = self._u64
        count = nbytes = 0
        for payload in messages:
            n = len(payload)
            size = (n + 8 + ALIGN - 1) & ~(ALIGN - 1)
            offset = tail % capacity
            to_end = capacity - offset
            need = size if size <= to_end else to_end + size
            if tail + need > room:
                if self.error is not None:
                    return None
                head = self._words[self._base + _HEAD]
                if head % ALIGN or head < core.cached_head or head > core.tail:
                    self._break(f"the consumer published head {head} (tail {core.tail})")
                    return None
                core.cached_head = head
                room = head + capacity
                if tail + need > room:
                    break
            if size > to_end:
                u64[offset >> 3] = to_end | _PAD_HIGH
                tail += to_end
                offset = 0
            u64[offset >> 3] = n | _MESSAGE_HIGH
            data[offset + 8 : offset + 8 + n] = payload
            tail += size
            count += 1
            nbytes += n
        if count:
            core.tail = tail
            # Published once, after every record: x86-64 keeps the stores in this order.
            self._words[self._base + _TAIL] = tail
        return count, nbytes

    # ---------------------------------------------------------------- the express lane
    def native_queue(self) -> Core | None:
        """The core, lent to the express lane (:mod:`stacklib.unet.express`: its ``take`` and
        ``try_write`` are this ring's, and in C its capsule serves ``native_queue.h``), while
        no view is lent out by :meth:`hold` and the ring is sound; else None."""
        return self._core if self.held is None and self.error is None else None

    def take_broke(self) -> None:
        """A take from the core (:meth:`take`'s, or the express lane's) found the ring broken
        (the core's ``failure`` says how): break it."""
        if self.error is None:
            self._break(self._core.failure or "the producer published an impossible record")

    @property
    def consumer_sleeping(self) -> bool:
        return bool(self._words[self._base + _SLEEPING])

    def set_producer_waiting(self, waiting: bool) -> None:
        self._words[self._base + _WAITING] = int(waiting)

    # ---------------------------------------------------------------- consumer
    def peek(self) -> memoryview | None:
        """The next message (a view of its record, valid until :meth:`release`) or None.

        Every value the producer wrote is checked before use; a bad tail or record breaks the
        ring (:meth:`_break`), which then reads as empty: record boundaries can no longer be
        trusted.
        """
        if self.held is not None:
            self.release_held()
        head = self._core.head
        words = self._words
        base = self._base
        tail = words[base + _TAIL]
        while head != tail:
            avail = tail - head
            capacity = self.capacity
            # Our head is always aligned, so an unaligned avail is an unaligned tail.
            if avail < 0 or avail > capacity or avail % ALIGN:
                self._break(f"the producer published tail {tail} (head {head})")
                return None
            offset = head % capacity
            header = self._u64[offset >> 3]
            length = header & _LOW
            kind = header >> 32
            if kind == KIND_PAD:
                if length != capacity - offset or length > avail:
                    self._break(f"a pad record of length {length} at offset {offset}")
                    return None
                head += length
                self._core.head = head
                words[base + _HEAD] = head
                continue
            size = _align(8 + length)
            if (
                kind != KIND_MESSAGE
                or length > self.max_message
                or size > capacity - offset
                or size > avail
            ):
                self._break(f"a record of kind {kind} and length {length} at offset {offset}")
                return None
            return self.data[offset + 8 : offset + 8 + length]
        return None

    def take(self) -> bytes | None:
        """A copy of the next message, its record freed at once, or None: :meth:`peek`, the
        copy and :meth:`release` in one call (the single-message receive path).  A producer
        waiting for room has its flag cleared and is woken through :attr:`wake_producer`."""
        if self.held is not None:
            self.release_held()
        message = self._core.take()
        if message is None or message.__class__ is bytes:
            return message
        self.take_broke()
        return None

    def read_many(self, limit: int) -> tuple[list[bytes], int]:
        """Copies of up to ``limit`` waiting messages and their total bytes, freeing their
        records with one head update.  Checks every record as :meth:`peek` does; a bad one
        breaks the ring, and the sound messages before it are still returned."""
        if self.held is not None:
            self.release_held()
        out: list[bytes] = []
        head = self._core.head
        words = self._words
        base = self._base
        tail = words[base + _TAIL]
        if head == tail:
            return out, 0
        capacity = self.capacity
        avail = tail - head
        if avail < 0 or avail > capacity or avail % ALIGN:
            self._break(f"the producer published tail {tail} (head {head})")
            return out, 0
        data = self.data
        mapping = self._mapping
        start = self._start
        u64 = self._u64
        largest = self.max_message
        append = out.append
        left = limit
        nbytes = 0
        while head != tail and left:
            offset = head % capacity
            header = u64[offset >> 3]
            length = header & _LOW
            kind = header >> 32
            if kind == KIND_PAD:
                if length != capacity - offset or length > tail - head:
                    self._break(f"a pad record of length {length} at offset {offset}")
                    return out, nbytes
                head += length
                continue
            size = (length + 8 + ALIGN - 1) & ~(ALIGN - 1)
            if (
                kind != KIND_MESSAGE
                or length > largest
                or size > capacity - offset
                or size > tail - head
            ):
                self._break(f"a record of kind {kind} and length {length} at offset {offset}")
                return out, nbytes
            if mapping is not None:  # as in take(): the bytes straight from the mapping
                first = start + offset + 8
                append(mapping[first : first + length])
            else:
                append(bytes(data[offset + 8 : offset + 8 + length]))
            head += size
            nbytes += length
            left -= 1
        self._core.head = head
        words[base + _HEAD] = head
        return out, nbytes

    def take_into(self, buffer: bytearray | memoryview) -> int | None:
        """Copy the next message into ``buffer`` and free its record: its length, or None
        (empty or broken).  One copy, ring to buffer.  A message longer than ``buffer`` stays
        in the ring and raises ``ValueError`` naming both lengths."""
        view = self.peek()
        if view is None:
            return None
        length = len(view)
        if length > len(buffer):
            view.release()
            raise ValueError(
                f"a message of {length} bytes does not fit a {len(buffer)}-byte buffer"
            )
        # Through a memoryview: a bytearray's slice assignment would copy the view first.
        with memoryview(buffer) as target:
            target[:length] = view
        self.release(view)
        if self._words[self._base + _WAITING]:  # as in take(): we made room
            self._words[self._base + _WAITING] = 0
            if self.wake_producer is not None:
                self.wake_producer()
        return length

    def hold(self) -> memoryview | None:
        """The next message as a read-only view of its record, no copy, or None.

        The record stays allocated (the producer cannot reuse it) until :meth:`release_held`,
        which the next read of this ring (:meth:`take`, :meth:`take_into`, :meth:`read_many`,
        :meth:`peek`, :meth:`hold`) calls first; the view is released then and raises
        ``ValueError`` if used later.  Slices taken from the view are not released: they must
        be dropped by then, as the ring reuses those bytes.  The producer can still write into
        the shared record, so anything checked must be copied out before it is trusted.
        """
        view = self.peek()
        if view is None:
            return None
        held = view.toreadonly()
        view.release()
        self.held = held
        return held

    def release_held(self) -> None:
        """Free the record of the view :meth:`hold` handed out and release the view (no-op
        without one); wakes a producer waiting for room, as :meth:`take` does."""
        held = self.held
        if held is None:
            return
        self.held = None
        self.release(held)
        if self._words[self._base + _WAITING]:
            self._words[self._base + _WAITING] = 0
            if self.wake_producer is not None:
                self.wake_producer()

    def release(self, view: memoryview) -> None:
        """Free the record :meth:`peek` returned."""
        core = self._core
        head = core.head + _align(8 + len(view))
        view.release()
        core.head = head
        self._words[self._base + _HEAD] = head

    def _break(self, what: str) -> None:
        """The peer broke the ring: count it, say why, and cut the ring off the shared words.

        Nothing the peer publishes later is trusted (adopting its tail could make our head
        unaligned), so from now on the ring reads and writes private zero words: empty to the
        consumer, full to the producer.  The data view stays valid until the link closes.
        """
        self.corrupt += 1
        self.error = f"corrupt ring: {what}"
        self._words = memoryview(bytearray(8 * _DETACHED_WORDS)).cast("Q")
        self._core.release()
        self._core = detached_core(self._words, self._base, self.data, self.max_message)
        self._core.wake = self._wake

    def release_views(self) -> None:
        """Release this ring's views of the mapping (its link closes): first a view still
        lent out by :meth:`hold`, then the record views."""
        self.release_held()
        self._core.release()  # (the C core holds the data view's buffer)
        self._u64.release()
        self.data.release()

    @property
    def pending(self) -> bool:
        return self._words[self._base + _TAIL] != self._core.head

    def set_sleeping(self, sleeping: bool) -> None:
        self._words[self._base + _SLEEPING] = int(sleeping)

    @property
    def producer_waiting(self) -> bool:
        return bool(self._words[self._base + _WAITING])
