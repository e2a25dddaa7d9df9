"""Communication segments (paper 000 §3.1, §3.4).

A segment is a region of memory of a size fixed at creation that holds message data.  The NI
moves data between it and the network; descriptors name (offset, length) pairs inside it and are
bounds-checked against it, so a process can only ever make the NI touch its own segment.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from typing import Final

from stacklib.errors import SegmentError
from stacklib.wire.descriptor import Fragment

#: ``madvise`` advice that faults every page of a mapping in, writable (Linux 5.14; the
#: ``mmap`` module of Python 3.11 does not name it).
MADV_POPULATE_WRITE: Final = 23
PAGE_BYTES: Final = mmap.PAGESIZE


def populate(mapping: mmap.mmap) -> None:
    """Fault every page of a shared ``mapping`` into this process now: the segment "pinned to
    physical memory" of paper 000 §3.4 and §4.2.2, so no message pays a page fault later.

    A fresh shared mapping's pages are allocated and mapped on first touch: without this, a
    ring's first lap takes a fault on each of its pages, on both sides, tens of microseconds in
    the middle of a round trip.  ``MADV_POPULATE_WRITE`` does it in one call without changing a
    byte (a peer may be writing already); where the kernel lacks it, one byte per page is read
    instead, which maps the page the peer shares.
    """
    try:
        mapping.madvise(MADV_POPULATE_WRITE)
        return
    except OSError:
        pass  # an older kernel (EINVAL): touch the pages
    view = memoryview(mapping)
    try:
        for offset in range(0, len(mapping), PAGE_BYTES):
            view[offset]
    finally:
        view.release()


class Segment:
    """A fixed-size buffer area whose buffers are aligned to ``alignment`` bytes."""

    __slots__ = ("_buffer", "alignment", "size", "view")

    def __init__(self, size: int, alignment: int = 8) -> None:
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.size = size
        self.alignment = alignment
        self._buffer = bytearray(size)
        #: The whole segment as a writable memoryview (what the NI "DMAs" into and out of).
        self.view = memoryview(self._buffer)

    def __repr__(self) -> str:
        return f"Segment(size={self.size}, alignment={self.alignment})"

    def contains(self, offset: int, length: int) -> bool:
        """True if ``length`` bytes at ``offset`` lie inside the segment."""
        return offset >= 0 and length >= 0 and offset + length <= self.size

    def check(self, offset: int, length: int) -> None:
        """Raise :class:`SegmentError` unless the range lies inside the segment."""
        if not self.contains(offset, length):
            raise SegmentError(
                f"range offset={offset} length={length} lies outside the {self.size}-byte segment"
            )

    def is_aligned(self, offset: int) -> bool:
        """True if ``offset`` meets the NI's alignment requirement."""
        return offset & (self.alignment - 1) == 0

    def align_up(self, offset: int) -> int:
        """The first aligned offset at or after ``offset``."""
        mask = self.alignment - 1
        return (offset + mask) & ~mask

    def write(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` into the segment at ``offset`` (bounds-checked)."""
        self.check(offset, len(data))
        self.view[offset : offset + len(data)] = data

    def read(self, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes at ``offset`` (bounds-checked)."""
        self.check(offset, length)
        return bytes(self.view[offset : offset + length])

    def slice(self, offset: int, length: int) -> memoryview:
        """A zero-copy view of ``length`` bytes at ``offset`` (bounds-checked)."""
        self.check(offset, length)
        return self.view[offset : offset + length]

    def gather(self, fragments: Iterable[Fragment]) -> bytes:
        """The concatenation of ``fragments`` (each bounds-checked)."""
        parts = []
        for offset, length in fragments:
            self.check(offset, length)
            parts.append(self.view[offset : offset + length])
        return b"".join(parts)

    def carve(self, start: int, count: int, size: int) -> list[Fragment]:
        """``count`` aligned buffers of ``size`` bytes laid out from ``start`` on.

        A convenience for the buffer management that U-Net leaves to the application
        (paper 000 §3.4): the architecture places no constraint on the size, number or
        allocation policy of buffers, only that they lie in the segment and are aligned.
        """
        if count < 0 or size <= 0:
            raise ValueError(f"cannot carve {count} buffers of {size} bytes")
        buffers = []
        offset = self.align_up(start)
        stride = self.align_up(size)
        for _ in range(count):
            self.check(offset, size)
            buffers.append(Fragment(offset, size))
            offset += stride
        return buffers
