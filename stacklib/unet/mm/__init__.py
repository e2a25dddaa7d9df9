"""U-Net/MM: memory management in the network interface (paper 002).

Applications send from and receive into any virtual address; the NI caches translations in a
TLB and the kernel pins only the pages the TLB covers, so pinned memory depends on the TLB size,
not on the number of processes (paper 002 §1, §4).

* :mod:`~stacklib.unet.mm.memory`: paged address spaces of simulated processes, frames, pins;
* :mod:`~stacklib.unet.mm.tlb`: the direct-mapped TLB with its FIFO victim cache;
* :mod:`~stacklib.unet.mm.core`: the sans-IO translation core (NI side and kernel module);
* :mod:`~stacklib.unet.mm.costs`: paper 002 Table 1 as cost profiles;
* :mod:`~stacklib.unet.mm.trace` and :mod:`~stacklib.unet.mm.tlbsim`: buffer traces and the
  trace-driven TLB simulation of paper 002 §6.2.

docs/memory-management.md describes the design and the figures.
"""

from __future__ import annotations

from stacklib.unet.mm.core import (
    Arrival,
    BufferReturned,
    Direction,
    MemoryManager,
    MissKind,
    MmParams,
    MmStatistics,
    PageInDone,
    Resumed,
    Status,
    Translation,
)
from stacklib.unet.mm.memory import PAGE_SIZE, AddressSpace, PhysicalMemory, Protection
from stacklib.unet.mm.tlb import Tlb, TlbEntry, TlbGeometry

__all__ = [
    "PAGE_SIZE",
    "AddressSpace",
    "Arrival",
    "BufferReturned",
    "Direction",
    "MemoryManager",
    "MissKind",
    "MmParams",
    "MmStatistics",
    "PageInDone",
    "PhysicalMemory",
    "Protection",
    "Resumed",
    "Status",
    "Tlb",
    "TlbEntry",
    "TlbGeometry",
    "Translation",
]
