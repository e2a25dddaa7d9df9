"""A process's virtual address layout for buffer traces (paper 002 §6.2).

Paper 002 §6.2 traced Split-C programs whose messages went out of the programs' own arrays and
into "64 receive buffers, each of size 4Kb", with small messages sent "from a single page of
64-byte buffers".  A trace recorded in stacklib must give each buffer the address it would have
had in such a process, deterministically (the real Python heap's addresses change from run to
run).  :class:`ProcessLayout` models that address space, in units of its page size, so that a
run scaled down by shrinking every size (data, pages, message buffers) keeps its page counts:

====================  =============================================================
page ``HEAP_PAGE-1``  the small-message send buffers: one page of ``SMALL_SLOTS`` slots,
                      used round-robin (static data of the message layer, just below the
                      heap, as the data segment sits below ``brk``)
page ``HEAP_PAGE``    the heap: first the receive ring (``rx_buffers`` page-sized,
                      page-aligned buffers, allocated when the message layer starts), then
                      every array in allocation order
====================  =============================================================

The heap is a first-fit allocator with 16-byte alignment and a 16-byte header per block, and
adjacent free blocks merge: a simple ``malloc``.  Arrays freed and allocated again (a
temporary per pass of a sort) therefore reuse their addresses, as they would in C.
"""

from __future__ import annotations

import bisect

__all__ = ["HEAP_PAGE", "SMALL_SLOTS", "ProcessLayout"]

#: First page of the heap (4096 pages = 16 MiB at 4 KiB pages: text and data below it).
HEAP_PAGE = 4096
#: Slots of the small-message page (paper 002 §6.2: "a single page of 64-byte buffers").
SMALL_SLOTS = 64
_ALIGN = 16
_HEADER = 16


class ProcessLayout:
    """The virtual address space of one traced process (see the module docstring)."""

    def __init__(self, *, page_size: int = 4096, rx_buffers: int = 64) -> None:
        if page_size < SMALL_SLOTS or page_size % SMALL_SLOTS:
            raise ValueError(f"page_size must be a multiple of {SMALL_SLOTS}, not {page_size}")
        if rx_buffers < 1:
            raise ValueError(f"rx_buffers must be >= 1, not {rx_buffers}")
        self.page_size = page_size
        self.rx_buffers = rx_buffers
        self.small_base = (HEAP_PAGE - 1) * page_size
        self.slot_size = page_size // SMALL_SLOTS
        self._next_slot = 0
        self._next_rx = 0
        heap = HEAP_PAGE * page_size
        self.ring_base = heap
        self._brk = heap + rx_buffers * page_size  # the ring is the heap's first block
        self._free: list[tuple[int, int]] = []  # (address, size), sorted, merged
        self._sizes: dict[int, int] = {}  # allocated address -> block size

    def small_buffer(self) -> int:
        """The next small-message send buffer's address."""
        slot = self._next_slot
        self._next_slot = (slot + 1) % SMALL_SLOTS
        return self.small_base + slot * self.slot_size

    def receive_buffers(self, length: int) -> list[tuple[int, int]]:
        """The ring buffers an arrival of ``length`` bytes fills: (address, bytes) each."""
        spans = []
        remaining = max(1, length)
        while remaining > 0:
            take = min(remaining, self.page_size)
            spans.append((self.ring_base + self._next_rx * self.page_size, take))
            self._next_rx = (self._next_rx + 1) % self.rx_buffers
            remaining -= take
        return spans

    def alloc(self, size: int) -> int:
        """Allocate ``size`` bytes on the heap; the block's (16-byte aligned) address."""
        if size < 0:
            raise ValueError(f"cannot allocate {size} bytes")
        need = _HEADER + -(-max(size, 1) // _ALIGN) * _ALIGN
        for i, (address, free) in enumerate(self._free):
            if free >= need:
                if free == need:
                    del self._free[i]
                else:
                    self._free[i] = (address + need, free - need)
                break
        else:
            address = self._brk
            self._brk += need
        self._sizes[address] = need
        return address + _HEADER

    def free(self, pointer: int) -> None:
        """Return a block from :meth:`alloc`; a pointer it did not give raises ValueError."""
        address = pointer - _HEADER
        size = self._sizes.pop(address, None)
        if size is None:
            raise ValueError(f"free of {pointer:#x}, which alloc did not return")
        i = bisect.bisect(self._free, (address, 0))
        # Merge with the following and the preceding free block.
        if i < len(self._free) and self._free[i][0] == address + size:
            size += self._free.pop(i)[1]
        if i > 0 and sum(self._free[i - 1]) == address:
            address, size = self._free[i - 1][0], self._free[i - 1][1] + size
            del self._free[i - 1]
            i -= 1
        if address + size == self._brk:
            self._brk = address  # the top of the heap shrinks back
        else:
            self._free.insert(i, (address, size))
