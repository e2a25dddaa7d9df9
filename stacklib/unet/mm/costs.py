"""Costs of U-Net/MM's operations as cited data: paper 002 Table 1 and §6.1.

Five implementations, as paper 002 §6 times them on a 133 MHz Pentium with a 33 MHz PCI bus:
the two U-Net/MM ones (PCA-200/Linux: the TLB in the i960 firmware, misses served by the Linux
kernel; DC21140/NT: a software TLB in the kernel's fast trap) and three baselines without memory
management (PCA-200 U-Net, DC21140 Linux U-Net, DC21140 NT U-Net).  Each is a
:class:`~stacklib.sim.CostProfile` whose operations the translation core names in its ``steps``
(:mod:`stacklib.unet.mm.core`) and an NI charges with :func:`acharge_steps`.

Operation names (resource: ``ni`` is the i960, ``cpu`` the host, ``disk`` the paging device)::

    send.trap  send.queue  send.tlb_hit            the transmit path
    recv.interrupt  recv.queue  recv.tlb_hit       the receive path
    recv.copy                                      per-byte copy into a user buffer (DC21140)
    pre.tlb_hit                                    a free buffer already translated
    miss.handshake  miss.interrupt                 NI-kernel request/reply and its interrupt
    pin.send  pin.recv  pin.cow  pin.zero          pinning a present page; copy-on-write;
                                                   a fresh zero page
    page_fault                                     a page-in from disk (deferred)
    unpin                                          an entry evicted from the victim cache

Numbers the paper does not give, and how they are estimated (docs/memory-management.md):

* DC21140/NT copy-on-write: not in Table 1.  Estimated as NT's receive pin (37 us) plus the
  page copy the PCA-200/Linux column shows (44 - 11 = 33 us on the same host CPU): 70 us.
* Buffer copy is given for 40 and 1498 bytes only (Table 1, "1.3µs-21µs", "1.2µs-42µs"); the
  per-byte cost is the line through those two points.
"""

from __future__ import annotations

from collections.abc import Iterable

from stacklib.sim import Cost, CostProfile, Host

__all__ = [
    "BASELINES",
    "DC21140_LINUX",
    "DC21140_NT",
    "DC21140_NT_MM",
    "IMPLEMENTATIONS",
    "PCA200",
    "PCA200_LINUX_MM",
    "acharge_steps",
    "steps_us",
]

T1 = "paper 002 Table 1"


def _line(at_40: float, at_1498: float) -> tuple[float, float]:
    """(fixed, per byte) of the line through a copy of 40 and of 1498 bytes (Table 1)."""
    per_byte = (at_1498 - at_40) / (1498 - 40)
    return at_40 - 40 * per_byte, per_byte


_LINUX_COPY = _line(1.3, 21.0)
_NT_COPY = _line(1.2, 42.0)

PCA200_LINUX_MM = CostProfile(
    name="pca200-linux-mm",
    description="U-Net/MM on the Fore PCA-200 (i960 firmware TLB) under Linux 1.3.71",
    cite="paper 002 §5.1, Table 1",
    ops={
        "send.queue": Cost("ni", 10.0, cite=f"{T1}, SEND queue handling"),
        "send.tlb_hit": Cost("ni", 1.0, cite=f"{T1}, SEND TLB hit"),
        "miss.handshake": Cost("ni", 24.0, cite=f"{T1}, NI-kernel handshake"),
        "miss.interrupt": Cost("cpu", 10.0, cite=f"{T1}, interrupt service"),
        "pin.send": Cost("cpu", 11.0, cite=f"{T1}, pin page present"),
        "pin.recv": Cost("cpu", 11.0, cite=f"{T1}, pre-translate present non-shared"),
        "pin.cow": Cost("cpu", 44.0, cite=f"{T1}, present shared (copy-on-write)"),
        "pin.zero": Cost("cpu", 36.0, cite=f"{T1}, non-present (zero map-in)"),
        "page_fault": Cost("disk", 22_000.0, cite=f"{T1}, non-present (page fault) ~22ms"),
        "unpin": Cost("cpu", 4.0, cite=f"{T1}, unpin page"),
        "pre.tlb_hit": Cost("ni", 1.0, cite=f"{T1}, PRE-TRANSLATE TLB hit"),
        "recv.queue": Cost("ni", 13.0, cite=f"{T1}, RECEIVE queue handling"),
        "recv.tlb_hit": Cost("ni", 2.0, cite=f"{T1}, RECEIVE TLB hit"),
    },
)

DC21140_NT_MM = CostProfile(
    name="dc21140-nt-mm",
    description="U-Net/MM on the DC21140 Fast Ethernet under Windows NT 4.0 (kernel TLB)",
    cite="paper 002 §5.2, Table 1",
    ops={
        "send.trap": Cost("cpu", 3.0, cite=f"{T1}, SEND trap"),
        "send.queue": Cost("cpu", 2.8, cite=f"{T1}, SEND queue handling"),
        "send.tlb_hit": Cost("cpu", 1.0, cite=f"{T1}, SEND TLB hit"),
        "pin.send": Cost("cpu", 16.0, cite=f"{T1}, pin page present (MmProbeAndLockPages)"),
        "pin.recv": Cost("cpu", 37.0, cite=f"{T1}, pre-translate present non-shared"),
        "pin.cow": Cost(
            "cpu", 70.0, cite="estimate: NT pin.recv 37 + PCA-200 page copy 33 (Table 1)"
        ),
        "page_fault": Cost("disk", 22_000.0, cite=f"{T1}, non-present (page fault) ~22ms"),
        "unpin": Cost("cpu", 4.0, cite=f"{T1}, unpin page (MmUnlockPages)"),
        "pre.tlb_hit": Cost("cpu", 1.0, cite=f"{T1}, SEND TLB hit (same lookup routine)"),
        "recv.interrupt": Cost("cpu", 3.0, cite=f"{T1}, RECEIVE interrupt entry"),
        "recv.queue": Cost("cpu", 3.7, cite=f"{T1}, RECEIVE queue handling"),
        "recv.tlb_hit": Cost("cpu", 1.0, cite=f"{T1}, RECEIVE TLB hit"),
        "recv.copy": Cost(
            "cpu", *_NT_COPY, cite=f"{T1}, buffer copy 1.2 us (40 B) - 42 us (1498 B)"
        ),
    },
)

PCA200 = CostProfile(
    name="pca200-unet",
    description="U-Net on the PCA-200 without memory management (pinned segment)",
    cite="paper 002 §6, Table 1",
    ops={
        "send.queue": Cost("ni", 10.0, cite=f"{T1}, SEND queue handling"),
        "recv.queue": Cost("ni", 13.0, cite=f"{T1}, RECEIVE queue handling"),
    },
)

DC21140_LINUX = CostProfile(
    name="dc21140-linux-unet",
    description="U-Net/FE on the DC21140 under Linux without memory management",
    cite="paper 002 §6, Table 1; paper 001",
    ops={
        "send.trap": Cost("cpu", 1.0, cite=f"{T1}, SEND trap"),
        "send.queue": Cost("cpu", 3.2, cite=f"{T1}, SEND queue handling"),
        "recv.interrupt": Cost("cpu", 2.0, cite=f"{T1}, RECEIVE interrupt entry"),
        "recv.queue": Cost("cpu", 3.3, cite=f"{T1}, RECEIVE queue handling"),
        "recv.copy": Cost(
            "cpu", *_LINUX_COPY, cite=f"{T1}, buffer copy 1.3 us (40 B) - 21 us (1498 B)"
        ),
    },
)

DC21140_NT = CostProfile(
    name="dc21140-nt-unet",
    description="U-Net/FE on the DC21140 under Windows NT 4.0 without memory management",
    cite="paper 002 §6, Table 1",
    ops={
        "send.trap": Cost("cpu", 3.0, cite=f"{T1}, SEND trap"),
        "send.queue": Cost("cpu", 2.8, cite=f"{T1}, SEND queue handling"),
        "recv.interrupt": Cost("cpu", 3.0, cite=f"{T1}, RECEIVE interrupt entry"),
        "recv.queue": Cost("cpu", 3.7, cite=f"{T1}, RECEIVE queue handling"),
        "recv.copy": Cost(
            "cpu", *_NT_COPY, cite=f"{T1}, buffer copy 1.2 us (40 B) - 42 us (1498 B)"
        ),
    },
)

#: The two U-Net/MM implementations by name.
IMPLEMENTATIONS = {p.name: p for p in (PCA200_LINUX_MM, DC21140_NT_MM)}
#: The baselines without memory management, by name.
BASELINES = {p.name: p for p in (PCA200, DC21140_LINUX, DC21140_NT)}


def steps_us(profile: CostProfile, steps: Iterable[str], nbytes: int = 0) -> float:
    """Microseconds of ``steps`` in sequence under ``profile`` (ops it lacks cost nothing).

    A step the implementation does not have (a baseline has no TLB) is free by design: the
    same core drives every implementation and each profile prices what its hardware does.
    """
    ops = profile.ops
    total = 0.0
    for step in steps:
        cost = ops.get(step)
        if cost is not None:
            total += cost.fixed_us + cost.per_byte_us * nbytes
    return total


async def acharge_steps(host: Host, steps: Iterable[str], nbytes: int = 0) -> None:
    """Charge ``steps`` one after the other to ``host``'s resources (an NI busy-waits a miss)."""
    profile = host.profile
    if profile is None:
        return
    for step in steps:
        if step in profile.ops:
            await host.acharge(step, nbytes)
