"""One direction of a shm channel: a single-producer/single-consumer byte ring of records.

A ring is ``ring_bytes`` of records, each an 8-byte header (``length: u32``, ``kind: u32``) and
the message padded to 16 bytes.  ``tail`` (written only by the producer) and ``head`` (written
only by the consumer) are free-running byte counters on separate cache lines of the region's
header page; a record never wraps (a PAD record fills the end of the ring instead).  The
producer writes the record, then the tail; x86-64 keeps stores in order, so a consumer that
sees the tail sees the record.  (Python has no fences; on weakly ordered CPUs this would need a
C helper.)
"""

from __future__ import annotations

import struct

from stacklib.unet.ni import Payload

RECORD_HEADER = struct.Struct("<II")  # length, kind
KIND_MESSAGE = 1
KIND_PAD = 2
ALIGN = 16
#: Word offsets within a ring's block of the header page (see ``region.RING_WORD``).
_TAIL, _HEAD, _SLEEPING, _WAITING = 0, 8, 16, 24


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Ring:
    """One direction of a channel: a byte ring of records in shared memory.

    The producer side uses :meth:`try_write`; the consumer side :meth:`peek` and
    :meth:`release`.  Each side keeps its own counter privately and publishes it, so a peer
    scribbling on the shared counters can only confuse this ring, never reach outside it.
    """

    __slots__ = (
        "_base",
        "_cached_head",
        "_head",
        "_tail",
        "_words",
        "capacity",
        "corrupt",
        "data",
        "max_message",
    )

    def __init__(self, words: memoryview, base: int, data: memoryview, max_message: int) -> None:
        self._words = words
        self._base = base
        self.data = data
        self.capacity = len(data)
        self.max_message = max_message
        self._tail = words[base + _TAIL]
        self._head = words[base + _HEAD]
        self._cached_head = self._head
        #: Records rejected because the peer broke the format (counted, skipped).
        self.corrupt = 0

    # ---------------------------------------------------------------- producer
    def try_write(self, payload: Payload) -> bool | None:
        """Append one message; False if the ring is full (back-pressure); None if the
        consumer's published head is impossible (the peer broke the ring)."""
        n = len(payload)
        size = _align(8 + n)
        tail = self._tail
        capacity = self.capacity
        offset = tail % capacity
        to_end = capacity - offset
        need = size if size <= to_end else to_end + size
        if tail + need - self._cached_head > capacity:
            head = self._words[self._base + _HEAD]
            if head > tail or tail - head > capacity or head % ALIGN:
                return None
            self._cached_head = head
            if tail + need - head > capacity:
                return False
        data = self.data
        if size > to_end:
            RECORD_HEADER.pack_into(data, offset, to_end, KIND_PAD)
            tail += to_end
            offset = 0
        RECORD_HEADER.pack_into(data, offset, n, KIND_MESSAGE)
        data[offset + 8 : offset + 8 + n] = payload
        tail += size
        self._tail = tail
        # Published after the record: x86-64 keeps the two stores in this order.
        self._words[self._base + _TAIL] = tail
        return True

    @property
    def consumer_sleeping(self) -> bool:
        return bool(self._words[self._base + _SLEEPING])

    def set_producer_waiting(self, waiting: bool) -> None:
        self._words[self._base + _WAITING] = int(waiting)

    # ---------------------------------------------------------------- consumer
    def peek(self) -> memoryview | None:
        """The next message (a view of its record, valid until :meth:`release`) or None.

        Every field the producer wrote is checked before use; a bad record or tail is counted
        in :attr:`corrupt` and everything published so far is discarded, since record
        boundaries can no longer be trusted.
        """
        head = self._head
        words = self._words
        base = self._base
        tail = words[base + _TAIL]
        while head != tail:
            avail = tail - head
            capacity = self.capacity
            if avail < 0 or avail > capacity or avail % ALIGN:
                self._discard(tail)
                return None
            offset = head % capacity
            length, kind = RECORD_HEADER.unpack_from(self.data, offset)
            if kind == KIND_PAD:
                if length != capacity - offset or length > avail:
                    self._discard(tail)
                    return None
                head += length
                self._head = head
                words[base + _HEAD] = head
                continue
            size = _align(8 + length)
            if (
                kind != KIND_MESSAGE
                or length > self.max_message
                or size > capacity - offset
                or size > avail
            ):
                self._discard(tail)
                return None
            return self.data[offset + 8 : offset + 8 + length]
        return None

    def release(self, view: memoryview) -> None:
        """Free the record :meth:`peek` returned."""
        head = self._head + _align(8 + len(view))
        view.release()
        self._head = head
        self._words[self._base + _HEAD] = head

    def _discard(self, tail: int) -> None:
        self.corrupt += 1
        # Skip to the published tail so an honest producer could go on.
        self._head = tail
        self._words[self._base + _HEAD] = tail

    @property
    def pending(self) -> bool:
        return self._words[self._base + _TAIL] != self._head

    def set_sleeping(self, sleeping: bool) -> None:
        self._words[self._base + _SLEEPING] = int(sleeping)

    @property
    def producer_waiting(self) -> bool:
        return bool(self._words[self._base + _WAITING])
