"""A shm ring's counters and its two per-message operations: append a record, take one.

:class:`~stacklib.transports.shm.ring.Ring` keeps everything else (batches, views, breaking
the ring, the flags); its per-message work is a core's :meth:`RingCore.try_write` and
:meth:`RingCore.take`.  This module is the reference core, in Python.  ``_ringcore.c`` is the
same core in C, which ``stacklib compile`` builds into the compiled copy (one C call per
message instead of a dozen memoryview operations); :func:`new_core` picks it where it is
built.  Both give the same results, write the same bytes and break on the same values, with
the same words (tests/transports/test_ring_core.py runs one against the other).

A core never raises on what the peer wrote: a value that breaks the ring is reported as
:data:`BROKEN` with :attr:`RingCore.failure` saying which value, and the ring then replaces
the core with a detached one (:func:`detached_core`).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Final, Protocol

from stacklib.unet.ni import Payload

__all__ = [
    "BROKEN",
    "C_CORE",
    "Core",
    "RingCore",
    "detached_core",
    "new_core",
]

ALIGN: Final = 16  #: records start at multiples of this
KIND_MESSAGE: Final = 1
KIND_PAD: Final = 2
#: :meth:`RingCore.try_write`'s results for a written message: the consumer is awake, or asleep.
WRITTEN: Final = 1
WRITTEN_WAKE: Final = 2
#: A core's result when the peer published an impossible value (:attr:`RingCore.failure`).
BROKEN: Final = -1
#: A record header as one native 64-bit word: the length in the low 32 bits, the kind above.
_LOW: Final = 0xFFFFFFFF
_MESSAGE_HIGH: Final = KIND_MESSAGE << 32
_PAD_HIGH: Final = KIND_PAD << 32
# Word offsets within a ring's block of the header page (see ``region.RING_WORD``).
_TAIL: Final = 0
_HEAD: Final = 8
_SLEEPING: Final = 16
_WAITING: Final = 24


class Core(Protocol):
    """What :class:`~stacklib.transports.shm.ring.Ring` needs of a core (either form)."""

    tail: int
    head: int
    cached_head: int
    wake: Callable[[], object] | None

    @property
    def failure(self) -> str | None: ...

    @property
    def max_message(self) -> int: ...

    def try_write(self, payload: Payload) -> int: ...

    def take(self) -> bytes | int | None: ...

    def release(self) -> None: ...


class RingCore:
    """The reference core over ``words[base:]`` (the ring's block of 64-bit header words) and
    ``data`` (its records), starting from the counters ``tail`` and ``head``.

    Where ``data`` is ``mapping[start:start + len(data)]``, :meth:`take` slices the mapping,
    which makes the ``bytes`` at once, without the memoryview a slice of ``data`` builds first.
    """

    __slots__ = (
        "_base",
        "_mapping",
        "_start",
        "_u64",
        "_words",
        "broken",
        "cached_head",
        "capacity",
        "data",
        "failure",
        "head",
        "max_message",
        "tail",
        "wake",
    )

    def __init__(
        self,
        words: memoryview,
        base: int,
        data: memoryview,
        max_message: int,
        tail: int,
        head: int,
        mapping: mmap.mmap | None = None,
        start: int = 0,
    ) -> None:
        self._words = words
        self._base = base
        self.data = data
        self._u64 = data.cast("Q")
        self._mapping = mapping
        self._start = start
        self.capacity = len(data)
        self.max_message = max_message
        self.tail = tail
        self.head = head
        self.cached_head = head
        #: Called by :meth:`take` when it made room for a producer that waits, or None.
        self.wake: Callable[[], object] | None = None
        #: Why the last :data:`BROKEN` result broke the ring, or None.
        self.failure: str | None = None
        #: A detached core (:func:`detached_core`) refuses every write.
        self.broken = False

    def try_write(self, payload: Payload) -> int:
        """Append one message: :data:`WRITTEN`, :data:`WRITTEN_WAKE` (the consumer sleeps:
        the caller wakes it), 0 (full) or :data:`BROKEN` (the consumer published an
        impossible head).  Its length is the caller's to check against ``max_message``."""
        n = len(payload)
        size = (n + 8 + ALIGN - 1) & ~(ALIGN - 1)
        tail = self.tail
        capacity = self.capacity
        offset = tail % capacity
        to_end = capacity - offset
        need = size if size <= to_end else to_end + size
        if tail + need - self.cached_head > capacity:
            if self.broken:
                return BROKEN
            head = self._words[self._base + _HEAD]
            # The consumer's head: aligned, never behind our last view of it nor past our tail.
            if head % ALIGN or head < self.cached_head or head > tail:
                self.failure = f"the consumer published head {head} (tail {tail})"
                return BROKEN
            self.cached_head = head
            if tail + need - head > capacity:
                return 0
        u64 = self._u64
        if size > to_end:
            u64[offset >> 3] = to_end | _PAD_HIGH
            tail += to_end
            offset = 0
        u64[offset >> 3] = n | _MESSAGE_HIGH
        self.data[offset + 8 : offset + 8 + n] = payload
        tail += size
        self.tail = tail
        # Published after the record: x86-64 keeps the two stores in this order.
        words = self._words
        base = self._base
        words[base + _TAIL] = tail
        return WRITTEN_WAKE if words[base + _SLEEPING] else WRITTEN

    def take(self) -> bytes | int | None:
        """A copy of the next message, its record freed at once; None if there is none;
        :data:`BROKEN` if the producer published an impossible tail or record.  A producer
        waiting for room has its flag cleared and :attr:`wake` called."""
        head = self.head
        words = self._words
        base = self._base
        tail = words[base + _TAIL]
        if head == tail:
            return None
        capacity = self.capacity
        avail = tail - head
        if avail < 0 or avail > capacity or avail % ALIGN:
            self.failure = f"the producer published tail {tail} (head {head})"
            return BROKEN
        u64 = self._u64
        offset = head % capacity
        header = u64[offset >> 3]
        length = header & _LOW
        kind = header >> 32
        if kind == KIND_PAD:
            if length != capacity - offset or length > avail:
                self.failure = f"a pad record of length {length} at offset {offset}"
                return BROKEN
            head += length
            avail -= length
            if not avail:
                self.head = head
                words[base + _HEAD] = head
                return None
            offset = 0
            header = u64[0]
            length = header & _LOW
            kind = header >> 32
        size = (length + 8 + ALIGN - 1) & ~(ALIGN - 1)
        if (
            kind != KIND_MESSAGE
            or length > self.max_message
            or size > capacity - offset
            or size > avail
        ):
            self.failure = f"a record of kind {kind} and length {length} at offset {offset}"
            return BROKEN
        mapping = self._mapping
        if mapping is not None:
            first = self._start + offset + 8
            message = mapping[first : first + length]
        else:
            message = bytes(self.data[offset + 8 : offset + 8 + length])
        head += size
        self.head = head
        words[base + _HEAD] = head
        if words[base + _WAITING]:  # the producer waits for room: we just made some
            words[base + _WAITING] = 0
            if self.wake is not None:
                self.wake()
        return message

    def release(self) -> None:
        """Let go of the record view (the link is closing its views of the mapping)."""
        self._u64.release()


_CoreFactory = Callable[[memoryview, int, memoryview, int, int, int], Core]


def _c_core() -> _CoreFactory | None:
    try:  # built by ``stacklib compile`` into the compiled copy only
        from stacklib.transports.shm._ringcore import RingCore as c_core
    except ImportError:
        return None
    return c_core


#: The C core's class where it is built, else None.
C_CORE: Final = _c_core()


def new_core(
    words: memoryview,
    base: int,
    data: memoryview,
    max_message: int,
    tail: int,
    head: int,
    mapping: mmap.mmap | None = None,
    start: int = 0,
    *,
    native: bool | None = None,
) -> Core:
    """A core for a ring attached with counters ``tail`` and ``head``: the C core where it is
    built (``native=None``), or the form asked for (``native=True`` without the C core raises
    ``RuntimeError``)."""
    if native is None:
        native = C_CORE is not None
    if native:
        if C_CORE is None:
            raise RuntimeError("the C ring core is not built here (stacklib compile builds it)")
        core: Core = C_CORE(words, base, data, max_message, tail, head)
        return core
    return RingCore(words, base, data, max_message, tail, head, mapping, start)


def detached_core(words: memoryview, base: int, data: memoryview, max_message: int) -> Core:
    """The core of a broken ring: counters at zero over ``words`` (private zero words, so it
    reads as empty), refusing every write (:data:`BROKEN`)."""
    core = RingCore(words, base, data, max_message, 0, 0)
    core.broken = True
    core.failure = "the ring is broken"
    # Far behind any tail: every write takes the checked path, which refuses it.
    core.cached_head = -(1 << 64)
    return core
