"""Trace-driven simulation of the NI TLB (paper 002 §6.2, Fig 3).

:func:`simulate` replays a buffer trace (:mod:`stacklib.unet.mm.trace`) through a
:class:`~stacklib.unet.mm.tlb.Tlb` of a given size and counts, per page translated, hits and
misses split into transmit/receive x compulsory/non-compulsory.  A miss is compulsory when the
(process, page) was never translated before; any other miss is the TLB's fault (a conflict in
the direct-mapped table that the victim cache did not absorb, or capacity).

Receive buffers: paper 002 §6.2 assumes "64 receive buffers, each of size 4Kb" per process
rather than the addresses the traced programs received into.  With ``rx_buffers > 0`` (the
default, 64 of 4096 bytes) each receive record consumes the next buffers of its process's ring;
the ring is placed right after the highest page the process transmits from, as if allocated
after its data (the paper does not say where its buffers were; placing them at a fixed address
would make them alias the data in the direct-mapped table for no reason of the program's).
With ``rx_buffers=0`` the recorded addresses are used.

Each node of a trace has its own NI and so its own TLB; processes on one node share it.
Fig 3's stacked bars are drawn from the results by :mod:`stacklib.reporting.plots.tlb`.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from stacklib.unet.mm.memory import PAGE_SIZE
from stacklib.unet.mm.tlb import Tlb, TlbEntry, TlbGeometry
from stacklib.unet.mm.trace import TraceRecord

__all__ = ["TlbSimResult", "format_results", "simulate"]


@attrs.frozen
class TlbSimResult:
    """Counts of one replay; ``*_pct`` are percentages of all translations, as in Fig 3."""

    label: str
    entries: int
    victim: int
    translations: int
    hits: int
    tx_compulsory: int
    tx_non_compulsory: int
    rx_compulsory: int
    rx_non_compulsory: int
    pages: int

    @property
    def misses(self) -> int:
        return (
            self.tx_compulsory
            + self.tx_non_compulsory
            + self.rx_compulsory
            + self.rx_non_compulsory
        )

    def pct(self, count: int) -> float:
        return 100.0 * count / self.translations if self.translations else 0.0


def simulate(
    records: Sequence[TraceRecord],
    *,
    entries: int = 1024,
    victim: int = 16,
    ways: int = 1,
    page_size: int = PAGE_SIZE,
    rx_buffers: int = 64,
    rx_buffer_size: int = 4096,
    label: str = "",
) -> TlbSimResult:
    """Replay ``records`` through a TLB of ``entries`` (+ ``victim``) entries."""
    if rx_buffers < 0 or rx_buffer_size <= 0:
        raise ValueError("rx_buffers must be >= 0 and rx_buffer_size > 0")
    geometry = TlbGeometry(entries=entries, ways=ways, victim=victim)
    tlbs: dict[int, Tlb] = {}  # one NI, one TLB per node
    seen: set[tuple[int, int, int]] = set()
    counts = {(d, c): 0 for d in (0, 1) for c in (True, False)}
    hits = 0
    translations = 0
    next_rx: dict[tuple[int, int], int] = {}
    ring: dict[tuple[int, int], int] = {}  # (node, pid) -> the ring's first address
    for record in records:
        if record.direction == 0:
            end = -(-(record.address + record.length) // page_size) * page_size
            owner = (record.node, record.process)
            ring[owner] = max(ring.get(owner, 0), end)
    for record in records:
        pid = record.process
        tlb = tlbs.get(record.node)
        if tlb is None:
            tlb = tlbs[record.node] = Tlb(geometry)
        if record.direction == 1 and rx_buffers:
            need = -(-record.length // rx_buffer_size)
            first = next_rx.get((record.node, pid), 0)
            next_rx[(record.node, pid)] = first + need
            base = ring.get((record.node, pid), 0)
            spans = [
                (base + ((first + k) % rx_buffers) * rx_buffer_size, rx_buffer_size)
                for k in range(need)
            ]
        else:
            spans = [(record.address, record.length)]
        for address, length in spans:
            for vpage in range(address // page_size, (address + length - 1) // page_size + 1):
                key = (pid, vpage)
                translations += 1
                if tlb.lookup(key) is not None:
                    hits += 1
                    continue
                compulsory = (record.node, pid, vpage) not in seen
                seen.add((record.node, pid, vpage))
                counts[(record.direction, compulsory)] += 1
                tlb.insert(TlbEntry(key, frame=0, writable=True))
    return TlbSimResult(
        label=label,
        entries=entries,
        victim=victim,
        translations=translations,
        hits=hits,
        tx_compulsory=counts[(0, True)],
        tx_non_compulsory=counts[(0, False)],
        rx_compulsory=counts[(1, True)],
        rx_non_compulsory=counts[(1, False)],
        pages=len(seen),
    )


def format_results(results: Sequence[TlbSimResult]) -> str:
    """A table: one row per replay, misses as % of translations (Fig 3's bars)."""
    headings = (
        "trace",
        "TLB",
        "translations",
        "pages",
        "tx comp %",
        "tx non-comp %",
        "rx comp %",
        "rx non-comp %",
        "miss %",
    )
    rows = [
        (
            r.label,
            f"{r.entries}+{r.victim}",
            str(r.translations),
            str(r.pages),
            *(
                f"{r.pct(n):.2f}"
                for n in (
                    r.tx_compulsory,
                    r.tx_non_compulsory,
                    r.rx_compulsory,
                    r.rx_non_compulsory,
                    r.misses,
                )
            ),
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headings)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headings, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
