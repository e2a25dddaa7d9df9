"""The simulated network's parameters: the NI models' costs, every one a field with its
citation (paper 000 §4, paper 001 §3, paper 003 §4), and the faults a fabric injects.

Where a paper states a cost it is taken as given; where it states only an end result (a
round-trip time, a bandwidth), the parameters that produce it are marked "calibrated" with the
figure they were fitted to (docs/reproduction.md).  The NI models that use them are
:mod:`~stacklib.transports.sim.atm`, :mod:`~stacklib.transports.sim.ethernet` and
:mod:`~stacklib.transports.sim.fabric`; they are apart because ``stacklib compile`` compiles
those modules, and mypyc does not take attrs fields with citations or validators.
"""

from __future__ import annotations

import attrs

from stacklib.sim.costs import cited

__all__ = [
    "I960_MODELS",
    "SEND_TRAP_STEPS",
    "SINGLE_CELL_MAX",
    "Dc21140Params",
    "FaultParams",
    "ForeFirmwareParams",
    "I960Params",
    "Pca200Params",
    "Sba100Params",
]


# ------------------------------------------------------------------------ ATM (i960, SBA-100)

SINGLE_CELL_MAX = 40  # 48-byte cell payload minus the 8-byte AAL5 trailer


@attrs.frozen
class I960Params:
    """Costs of an SBA-200 running U-Net firmware on a SPARCstation-20, in microseconds
    (paper 000 §4.2).  Subclasses give the PCA-200 and Fore's firmware."""

    name: str = "sba200"
    host_send_us: float = cited(1.5, "paper 003 §4.4.1: host overhead to send 40 bytes", "us")
    host_recv_us: float = cited(1.0, "calibrated: host polls its receive queue (host memory)", "us")
    poll_us: float = cited(1.0, "calibrated: the i960 loop notices a new send descriptor", "us")
    tx_single_us: float = cited(6.0, "calibrated to paper 000 §4.2.3's 65 us RTT", "us")
    rx_single_us: float = cited(8.0, "calibrated to paper 000 §4.2.3's 65 us RTT", "us")
    tx_msg_us: float = cited(20.0, "calibrated to paper 000 §4.2.3's 120 us at 48 bytes", "us")
    rx_msg_us: float = cited(15.0, "calibrated to paper 000 §4.2.3's 120 us at 48 bytes", "us")
    tx_cell_us: float = cited(1.5, "calibrated: below the 3.03 us TAXI cell time", "us")
    rx_cell_us: float = cited(2.0, "calibrated: below the 3.03 us TAXI cell time", "us")
    dma_cell_us: float = cited(
        1.0, "paper 000 §4.2.2: three 32-byte SBus bursts per two cells", "us"
    )
    #: Receive DMA to the host starts after the last cell (see PCA200).
    rx_dma_after_last: bool = False
    signal_us: float = cited(
        30.0, "paper 000 §4.2.3: a UNIX signal instead of polling adds ~30 us on each end", "us"
    )
    output_fifo_cells: int = cited(
        36,
        "paper 000 §4.1-4.2: the SBA-100's 36-cell output FIFO, which the SBA-200 shares",
        "cells",
    )
    inline_threshold: int = cited(
        SINGLE_CELL_MAX,
        "paper 000 §4.2.2: single-cell messages go straight into the receive-queue entry "
        "(48-byte cell payload less the 8-byte AAL5 trailer)",
        "bytes",
    )
    #: The host the paper measured the host-side costs on; other hosts scale them by clock.
    reference_host: str = "ss20"
    cite: str = "paper 000 §4.2"


@attrs.frozen
class ForeFirmwareParams(I960Params):
    """Fore's original firmware on the SBA-200 (paper 000 §4.2.1): the i960 follows the
    kernel's mbuf-like linked structures by DMA, so every message costs far more: about
    160 us round trip and 13 MB/s at 4 KB."""

    name: str = "fore-firmware"
    tx_single_us: float = cited(24.0, "calibrated to paper 000 §4.2.1's ~160 us RTT", "us")
    rx_single_us: float = cited(32.0, "calibrated to paper 000 §4.2.1's ~160 us RTT", "us")
    tx_msg_us: float = cited(24.0, "calibrated to paper 000 §4.2.1's ~160 us RTT", "us")
    rx_msg_us: float = cited(32.0, "calibrated to paper 000 §4.2.1's ~160 us RTT", "us")
    tx_cell_us: float = cited(2.9, "calibrated to paper 000 §4.2.1's 13 MB/s at 4 KB", "us")
    rx_cell_us: float = cited(3.2, "calibrated to paper 000 §4.2.1's 13 MB/s at 4 KB", "us")
    inline_threshold: int = cited(
        0, "paper 000 §4.2.1: Fore's firmware has no U-Net single-cell receive path", "bytes"
    )
    cite: str = "paper 000 §4.2.1"


@attrs.frozen
class Pca200Params(I960Params):
    """The PCA-200 (PCI) with U-Net firmware on a 120 MHz Pentium (paper 003 §4.2, §4.4).

    Paper 003 gives both a 17 us per 100 bytes latency slope (4.1 us per cell) and
    118-120 Mbit/s: a fully overlapped pipeline cannot show both (its slope is its bottleneck,
    at most the 2.83 us OC-3 cell time), so the receive DMA is modeled as starting after
    reassembly, adding its per-cell time to the latency but not to the throughput.
    """

    name: str = "pca200"
    host_send_us: float = cited(1.5, "paper 003 §4.4.1: ~1.5 us host overhead, 40 bytes", "us")
    host_recv_us: float = cited(2.1, "calibrated to paper 001 §3.4's 89 us RTT", "us")
    poll_us: float = cited(2.4, "calibrated to paper 001 §3.4's 89 us RTT", "us")
    tx_single_us: float = cited(10.0, "paper 003 §4.4.1: i960 send overhead ~10 us", "us")
    rx_single_us: float = cited(13.0, "paper 003 §4.4.1: i960 receive overhead ~13 us", "us")
    tx_msg_us: float = cited(17.0, "calibrated to paper 003 §4.4.2's 130 us at 44 bytes", "us")
    rx_msg_us: float = cited(20.0, "calibrated to paper 003 §4.4.2's 130 us at 44 bytes", "us")
    tx_cell_us: float = cited(1.5, "calibrated: below the 2.83 us OC-3 cell time", "us")
    rx_cell_us: float = cited(2.0, "calibrated: below the 2.83 us OC-3 cell time", "us")
    dma_cell_us: float = cited(1.425, "calibrated to paper 003 §4.4.2's 351 us at 1500 B", "us")
    rx_dma_after_last: bool = True
    reference_host: str = "p120"
    cite: str = "paper 003 §4.2, §4.4"


I960_MODELS: dict[str, type[I960Params]] = {
    "sba200": I960Params,
    "fore-firmware": ForeFirmwareParams,
    "pca200": Pca200Params,
}


@attrs.frozen
class Sba100Params:
    """The SBA-100: the host does everything (paper 000 §4.1, Table 1), in microseconds.

    Table 1 splits a single-cell one-way trip into 7 us of AAL5 send overhead, 21 us to send
    and receive across the switch at trap level, and 5 us of AAL5 receive overhead.  The 21 us
    contain the two TAXI cell times and the switch (13.06 us) and the two traps (7.94 us,
    split evenly here).  For multi-cell messages the library's per-cell work is calibrated to
    the 6.8 MB/s at 1 KB of paper 000 §4.1.
    """

    name: str = "sba100"
    send_overhead_us: float = cited(7.0, "paper 000 Table 1: send overhead (AAL5)", "us")
    recv_overhead_us: float = cited(5.0, "paper 000 Table 1: receive overhead (AAL5)", "us")
    trap_level_us: float = cited(
        21.0, "paper 000 Table 1: 1-way send and rcv across switch (at trap level)", "us"
    )
    send_cell_us: float = cited(6.65, "calibrated to paper 000 §4.1's 6.8 MB/s at 1 KB", "us")
    recv_cell_us: float = cited(5.5, "calibrated: below the send side's per-cell cost", "us")
    crc_send_share: float = cited(0.33, "paper 000 §4.1: CRC is 33% of the send overhead")
    crc_recv_share: float = cited(0.40, "paper 000 §4.1: CRC is 40% of the receive overhead")
    signal_us: float = cited(
        30.0, "paper 000 §4.2.3: a UNIX signal instead of polling adds ~30 us on each end", "us"
    )
    output_fifo_cells: int = cited(36, "paper 000 §4.1: 36-cell output FIFO", "cells")
    input_fifo_cells: int = cited(292, "paper 000 §4.1: 292-cell input FIFO", "cells")
    reference_host: str = "ss20"
    cite: str = "paper 000 §4.1, Table 1"


# ------------------------------------------------------------------------ Fast Ethernet (DC21140)

#: Paper 003 Fig 3: the send trap's eight steps for a 40-byte message, in microseconds.
SEND_TRAP_STEPS = (
    ("trap entry overhead", 0.5),
    ("check U-Net send parameters", 0.74),
    ("Ethernet header set-up", 0.37),
    ("device send ring descriptor set-up", 0.56),
    ("issue poll demand to DC21140 to start TX process", 0.92),
    ("free send ring descriptor of previous message", 0.42),
    ("free U-Net send queue entry of previous message", 0.24),
    ("return from trap", 0.4),
)


@attrs.frozen
class Dc21140Params:
    """Costs of U-Net/FE on a DC21140 in a 120 MHz Pentium, in microseconds."""

    name: str = "dc21140"
    send_trap_us: float = cited(
        sum(cost for _, cost in SEND_TRAP_STEPS),
        "paper 003 Fig 3: the eight steps of the send trap (4.15 us; §4.4.1 says ~4.2)",
        "us",
    )
    tx_dma_setup_us: float = cited(
        5.0, "calibrated to paper 003 §4.4.2's 57 us RTT (hub): descriptor and buffer fetch", "us"
    )
    pci_dma_us_per_byte: float = cited(
        0.0167, "calibrated to paper 003 §4.4.2's ~25 us per 100 bytes (DMA at ~60 MB/s)", "us/B"
    )
    rx_dma_setup_us: float = cited(
        3.5, "calibrated to paper 003 §4.4.2's 57 us RTT (hub): receive descriptor update", "us"
    )
    irq_latency_us: float = cited(
        2.0, "paper 003 §4.4.1: frame in memory to interrupt handler, roughly 2 us", "us"
    )
    rx_handler_small_us: float = cited(
        4.08, "paper 003 Fig 4: receive interrupt for a 40-byte message", "us"
    )
    rx_buffer_alloc_us: float = cited(
        0.71,
        "paper 003 Fig 4: allocate a U-Net receive buffer (messages of 64 bytes or more)",
        "us",
    )
    copy_us_per_100_bytes: float = cited(
        1.42, "paper 003 §4.4.1: copy time +1.42 us per additional 100 bytes", "us"
    )
    small_copy_us: float = cited(0.64, "paper 003 Fig 4: copy a 40-byte message", "us")
    host_recv_us: float = cited(1.0, "calibrated: the application polls its receive queue", "us")
    tx_ring_frames: int = cited(
        16, "estimated: a 16-entry transmit ring (the papers do not give its size)", "frames"
    )
    #: Messages below 64 bytes are copied into the receive descriptor (paper 003 §4.3.3).
    inline_threshold: int = cited(63, "paper 003 §4.3.3: under 64 bytes inline", "bytes")
    reference_host: str = "p120"
    cite: str = "paper 001 §3, paper 003 §4.3-4.4"


# ------------------------------------------------------------------------ faults


@attrs.frozen
class FaultParams:
    """Faults injected on the fabric, drawn from the seeded stream ``faults:<fabric>`` (the bits
    that corruption flips from ``corruption:<fabric>``).

    ``loss`` and ``corrupt`` are per unit (cell or frame), so a long AAL5 PDU is more likely to
    be hit, as on a real ATM network (paper 000 §7.8, Romanow & Floyd).  ``corrupt`` flips one
    to three seeded bits of one unit on the wire, and the message travels on to the receiving
    NI, whose link check runs on the flipped bits: ATM reassembles the AAL5 PDU and its CRC-32
    catches the error (``crc_errors``), Fast Ethernet's frame check sequence does
    (``fcs_errors``, as a real NIC drops a bad-FCS frame), Myrinet's 8-bit CRC does; the
    message is dropped (``corrupted``).  ``corrupt_undetected`` (per unit too) flips bits of
    the message's data that no link check sees (an error a CRC misses, or one made past the
    check, in NI memory or on the I/O bus): the message is delivered as corrupted, and only
    the end-to-end checks above (UDP's and TCP's checksums) can catch it.
    """

    loss: float = attrs.field(
        default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )
    corrupt: float = attrs.field(
        default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )
    duplicate: float = attrs.field(
        default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )
    reorder: float = attrs.field(
        default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )
    #: How long a reordered message is held back.
    reorder_delay_us: float = attrs.field(default=50.0, validator=attrs.validators.ge(0.0))
    corrupt_undetected: float = attrs.field(
        default=0.0, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)]
    )

    @property
    def any(self) -> bool:
        return bool(
            self.loss or self.corrupt or self.duplicate or self.reorder or self.corrupt_undetected
        )
