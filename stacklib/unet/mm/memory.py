"""Paged virtual memory of simulated processes, as U-Net/MM's kernel sees it (paper 002 §4.2).

:class:`PhysicalMemory` holds page frames with their contents and two reference counts: the
processes mapping a frame (sharing) and the NI TLB entries pinning it.  A pinned frame is never
paged out (paper 002 §5.1: "the swapper cannot decrement the reference count of pages mapped by
the NI TLB to zero").  :class:`AddressSpace` is one process's page table: each virtual page is
present (mapped to a frame) or not (its contents are on disk), read-only for copy-on-write or
writable, shared with another process or private, inside a region whose protection says what the
process may do at all.  An access outside every region, or a write to a region without write
permission, is a privilege violation (paper 002 §4.1).
"""

from __future__ import annotations

import enum
from collections import Counter

import attrs

from stacklib.errors import UNetError

__all__ = ["PAGE_SIZE", "AddressSpace", "Page", "PhysicalMemory", "Protection"]

#: Page size of the modeled hosts: the i386 page of Linux 1.3 and NT 4.0 (paper 002 §5).
PAGE_SIZE = 4096


class Protection(enum.Flag):
    """What a process may do to a region of its address space."""

    READ = 1
    WRITE = 2
    READ_WRITE = READ | WRITE


@attrs.define(slots=True)
class Page:
    """One virtual page: its frame when present, its flags, its contents while paged out."""

    frame: int | None
    #: Marked read-only for copy-on-write (a private page not yet written since a fork).
    read_only: bool = False
    #: Mapped by another process as well; a write translation copies it (paper 002 §5.1.1).
    shared: bool = False
    #: Contents while the page is not present (on "disk"); None means never touched (zero).
    swapped: bytes | None = None

    @property
    def present(self) -> bool:
        return self.frame is not None


class PhysicalMemory:
    """Page frames with contents, a count of the processes mapping each, and NI pins."""

    def __init__(self, page_size: int = PAGE_SIZE) -> None:
        if page_size <= 0 or page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two, not {page_size}")
        self.page_size = page_size
        self.frames: dict[int, bytearray] = {}
        self.mappers: Counter[int] = Counter()
        self.pins: Counter[int] = Counter()
        self._next = 1

    def allocate(self, contents: bytes | None = None) -> int:
        """A fresh frame, zeroed or holding ``contents``; mapped by nobody yet."""
        frame = self._next
        self._next += 1
        data = bytearray(self.page_size)
        if contents is not None:
            data[: len(contents)] = contents[: self.page_size]
        self.frames[frame] = data
        return frame

    def release(self, frame: int) -> None:
        """Drop one mapper of ``frame``; free it when nobody maps or pins it."""
        self.mappers[frame] -= 1
        if self.mappers[frame] <= 0:
            del self.mappers[frame]
            if not self.pins[frame]:
                self.pins.pop(frame, None)
                del self.frames[frame]

    def pin(self, frame: int) -> None:
        self.pins[frame] += 1

    def unpin(self, frame: int) -> None:
        """Drop one pin; a frame nobody maps any more (copied away) is freed at zero."""
        if self.pins[frame] <= 0:
            raise UNetError(f"frame {frame} is not pinned")
        self.pins[frame] -= 1
        if not self.pins[frame]:
            del self.pins[frame]
            if not self.mappers[frame]:
                self.mappers.pop(frame, None)
                self.frames.pop(frame, None)

    def pinned(self, frame: int) -> bool:
        return self.pins[frame] > 0

    @property
    def pinned_frames(self) -> int:
        return sum(1 for count in self.pins.values() if count > 0)


class AddressSpace:
    """One simulated process's page table (``pid`` names it in the NI TLB)."""

    def __init__(self, pid: int, memory: PhysicalMemory) -> None:
        self.pid = pid
        self.memory = memory
        self.page_size = memory.page_size
        self.pages: dict[int, Page] = {}
        self._protection: dict[int, Protection] = {}

    def __repr__(self) -> str:
        return f"<AddressSpace pid={self.pid} pages={len(self.pages)}>"

    def _page_range(self, address: int, length: int) -> range:
        if address < 0 or length <= 0:
            raise UNetError(f"bad range: address {address:#x}, length {length}")
        first = address // self.page_size
        last = (address + length - 1) // self.page_size
        return range(first, last + 1)

    def map(
        self,
        address: int,
        length: int,
        *,
        protection: Protection = Protection.READ_WRITE,
        present: bool = True,
        read_only: bool = False,
    ) -> None:
        """Map private pages covering ``[address, address + length)``, zero-filled.

        ``present=False`` maps them paged out (on disk); ``read_only`` marks them copy-on-write.
        """
        for vpage in self._page_range(address, length):
            if vpage in self.pages:
                raise UNetError(f"pid {self.pid}: page {vpage:#x} is already mapped")
            frame = None
            if present:
                frame = self.memory.allocate()
                self.memory.mappers[frame] += 1
            self.pages[vpage] = Page(frame, read_only=read_only)
            self._protection[vpage] = protection

    def share_from(self, other: AddressSpace, address: int, length: int) -> None:
        """Map ``other``'s present pages at the same addresses, shared by both (as after fork)."""
        for vpage in other._page_range(address, length):
            page = other.pages.get(vpage)
            if page is None or page.frame is None:
                raise UNetError(f"pid {other.pid}: page {vpage:#x} is not present")
            if vpage in self.pages:
                raise UNetError(f"pid {self.pid}: page {vpage:#x} is already mapped")
            page.shared = True
            self.pages[vpage] = Page(page.frame, shared=True)
            self._protection[vpage] = other._protection[vpage]
            self.memory.mappers[page.frame] += 1

    def protection(self, vpage: int) -> Protection | None:
        """The region protection of ``vpage``, or None if it is not mapped at all."""
        return self._protection.get(vpage)

    def page_out(self, vpage: int) -> bool:
        """Write ``vpage`` to disk and free its frame, as the swapper would; False if pinned."""
        page = self.pages[vpage]
        frame = page.frame
        if frame is None:
            return True
        if self.memory.pinned(frame) or page.shared:
            return False
        page.swapped = bytes(self.memory.frames[frame])
        page.frame = None
        self.memory.release(frame)
        return True

    def page_in(self, vpage: int) -> int:
        """Bring ``vpage`` back into a frame (the deferred page-in's work); its frame."""
        page = self.pages[vpage]
        if page.frame is None:
            page.frame = self.memory.allocate(page.swapped)
            self.memory.mappers[page.frame] += 1
            page.swapped = None
        return page.frame

    def map_zero(self, vpage: int) -> int:
        """Replace a non-present page by a fresh zero page (its old contents are discarded)."""
        page = self.pages[vpage]
        if page.frame is None:
            page.frame = self.memory.allocate()
            self.memory.mappers[page.frame] += 1
            page.swapped = None
        return page.frame

    def copy_on_write(self, vpage: int) -> int:
        """Give this process a private, writable copy of ``vpage``; its new frame."""
        page = self.pages[vpage]
        old = page.frame
        if old is None:
            raise UNetError(f"pid {self.pid}: page {vpage:#x} is not present")
        frame = self.memory.allocate(bytes(self.memory.frames[old]))
        self.memory.mappers[frame] += 1
        self.memory.release(old)
        page.frame = frame
        page.read_only = False
        page.shared = False
        return frame

    def write(self, address: int, data: bytes) -> None:
        """Store ``data`` as the process would (present pages only; copy-on-write honoured)."""
        self._access(address, data, None)

    def read(self, address: int, length: int) -> bytes:
        """Load ``length`` bytes as the process would (present pages only)."""
        out = bytearray(length)
        self._access(address, None, out)
        return bytes(out)

    def _access(self, address: int, data: bytes | None, out: bytearray | None) -> None:
        length = len(data) if data is not None else len(out or b"")
        if not length:
            return
        position = 0
        for vpage in self._page_range(address, length):
            page = self.pages.get(vpage)
            if page is None or page.frame is None:
                raise UNetError(f"pid {self.pid}: page {vpage:#x} is not present")
            if data is not None and (page.read_only or page.shared):
                self.copy_on_write(vpage)
            frame_id = page.frame  # copy_on_write may have replaced it
            if frame_id is None:
                raise UNetError(f"pid {self.pid}: page {vpage:#x} is not present")
            frame = self.memory.frames[frame_id]
            start = max(address, vpage * self.page_size) - vpage * self.page_size
            take = min(self.page_size - start, length - position)
            if data is not None:
                frame[start : start + take] = data[position : position + take]
            elif out is not None:
                out[position : position + take] = frame[start : start + take]
            position += take
