"""Paper 004's testbed as a platform for user-space libraries: PPro 200 hosts, LANai 4.1 NIs.

Paper 004 §3: two 200 MHz Pentium Pro PCs (440FX, 256 KB unified L2) with a 32-bit 33 MHz PCI
bus (133 MB/s), each holding a Myrinet card with a 33 MHz LANai 4.1 and 1 MB of SRAM, joined by
one switch (about 100 ns, §4.1 footnote 4) over 1.28 Gbit/s links.  The card has three DMA
engines: two between the network and SRAM and one between SRAM and host memory over PCI (with
physical addresses); the internal bus runs at twice the LANai clock, so two engines run at full
speed at once.  The host reaches SRAM by programmed I/O (PIO): writes, much faster with the
Pentium Pro's write combining (WC), and slower reads.  A DMA between host and SRAM is started by
the LANai or by the host, the LANai faster for 32 B to 4 KB, both near 133 MB/s for a page;
NI-to-host is slower than host-to-NI (Fig 2, §4.2).  Myrinet has STOP/GO flow control: a
receiver that does not drain stops the sender for at most 50 ms, after which the sender resets
the receiver ("forward reset") and data in its queues is lost (§4.1).

The transfer rates, set-up times and LANai cycle costs are those of the raw-U-Net LANai model
(:class:`stacklib.transports.sim.myrinet.LanaiParams`, with their citations and estimates), so
both models describe one card.  This module adds what the five libraries of paper 004 need
beyond that: host memory copies with the L2 cache's knee, the forward reset, and a platform
object whose resources the libraries (:mod:`stacklib.transports.sim.myrinet_libs`) reserve.

Resources per node (a :class:`~stacklib.sim.Host`): ``cpu`` (the Pentium Pro), ``lanai`` (the
LANai processor), ``pci`` (the SRAM<->host DMA engine and the PCI bus it masters), ``net-tx`` and
``net-rx`` (the two network DMA engines, each at link speed).  Messages move through them with
the pipeline recurrence of :mod:`stacklib.sim.pipeline` in ``chunk_bytes`` units, so a stage
that overlaps the next (cut-through) and one that waits for the whole message (store-and-forward)
are both one call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import attrs

from stacklib.sim import Host, Resource, World
from stacklib.sim.costs import cited
from stacklib.sim.pipeline import stage
from stacklib.transports.sim.hosts import HOSTS
from stacklib.transports.sim.myrinet import (
    FIG2_CURVES,
    Direction,
    LanaiParams,
    TransferMethod,
    host_ni_bandwidth,
    host_ni_time_us,
)

__all__ = [
    "FIG2_CURVES",
    "FIG2_SIZES",
    "Direction",
    "Initiator",
    "Lanai4Cluster",
    "Lanai4Node",
    "Lanai4Params",
    "TransferMethod",
    "fig2",
    "host_ni_bandwidth",
    "host_ni_time_us",
]

US = 1e-6
#: Message sizes of the Fig 2 table.
FIG2_SIZES = (4, 16, 32, 64, 256, 1024, 4096, 16384, 65536)
#: Who starts a host<->SRAM DMA (paper 004 Fig 2's two DMA curves).
Initiator = Literal["lanai", "host"]


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and > 0, not {value!r}")


@attrs.frozen
class Lanai4Params:
    """The paper 004 §3 testbed: the LANai 4.1 card (``ni``) and what the host adds."""

    ni: LanaiParams = attrs.field(factory=LanaiParams)
    host: str = cited("ppro200", "paper 004 §3: Pentium Pro 200 MHz, 440FX chipset")
    l2_cache_bytes: int = cited(
        256 * 1024, "paper 004 §3: 256 KBytes of unified second level cache", "bytes"
    )
    copy_mb_s: float = cited(
        66.0,
        "estimated: memcpy on the PPro 200 with the data in L2; AM and FM, whose copies limit "
        "them, peak at 60-70 MB/s (paper 004 abstract, §4.2)",
        "MB/s",
        validator=_positive,
    )
    copy_uncached_mb_s: float = cited(
        48.0,
        "estimated: memcpy from EDO DRAM once the buffers exceed L2; paper 004 §4.2 names the "
        "cache knees (FM 256 KB, AM 512 KB) but not their depth",
        "MB/s",
        validator=_positive,
    )
    forward_reset_ms: float = cited(
        50.0,
        "paper 004 §4.1: STOP/GO stops a sender for no more than 50 ms, then it resets the "
        "receiver and data may be lost",
        "ms",
        validator=_positive,
    )
    crc_bits: int = cited(8, "paper 004 §3: an 8-bit CRC computed by hardware on every packet")
    #: Pipeline unit of DMA and link stages (a cut-through stage passes on each unit).
    chunk_bytes: int = attrs.field(default=256, validator=attrs.validators.ge(4))

    def __attrs_post_init__(self) -> None:
        if self.host not in HOSTS:
            raise ValueError(f"unknown host {self.host!r} (known: {', '.join(sorted(HOSTS))})")

    # --- per-operation times in seconds --------------------------------------------------

    def cycles(self, n: float) -> float:
        """``n`` LANai cycles, in seconds."""
        return self.ni.cycles_us(n) * US

    def pio_write(self, nbytes: int, write_combining: bool) -> float:
        """Host CPU time to store ``nbytes`` into SRAM by PIO."""
        method: TransferMethod = "pio-wc" if write_combining else "pio"
        return host_ni_time_us(method, "h2n", nbytes, self.ni) * US

    def pio_read(self, nbytes: int) -> float:
        """Host CPU time to load ``nbytes`` from SRAM by PIO (slower than writing)."""
        return host_ni_time_us("pio", "n2h", nbytes, self.ni) * US

    def dma_setup(self, initiator: Initiator = "lanai") -> float:
        """Start-up of a host<->SRAM DMA."""
        ni = self.ni
        return (ni.lanai_dma_setup_us if initiator == "lanai" else ni.host_dma_setup_us) * US

    def dma_per_byte(self, direction: Direction) -> float:
        """Seconds per byte of a host<->SRAM DMA (NI-to-host is the slower direction)."""
        ni = self.ni
        return US / (ni.dma_h2n_mb_s if direction == "h2n" else ni.dma_n2h_mb_s)

    def link_per_byte(self) -> float:
        """Seconds per byte on a 1.28 Gbit/s link."""
        return 8.0 / (self.ni.link_gbit_s * 1e9)

    def copy(self, nbytes: int, footprint: int | None = None) -> float:
        """Host CPU time of a memory copy of ``nbytes``.

        ``footprint`` is how much memory the copying loop keeps touching (the application
        buffer of a stream of messages); past the L2 cache the copy runs from DRAM.
        """
        touched = nbytes if footprint is None else footprint
        rate = self.copy_mb_s if touched <= self.l2_cache_bytes else self.copy_uncached_mb_s
        return nbytes / rate * US


class Lanai4Node:
    """One PC with its Myrinet card: a :class:`Host` and its five resources."""

    def __init__(self, name: str, index: int, world: World) -> None:
        self.name = name
        self.index = index
        self.host = Host(name, world)
        self.cpu: Resource = self.host.resource("cpu")
        self.lanai: Resource = self.host.resource("lanai")
        self.pci: Resource = self.host.resource("pci")
        self.net_tx: Resource = self.host.resource("net-tx")
        self.net_rx: Resource = self.host.resource("net-rx")

    def __repr__(self) -> str:
        return f"<Lanai4Node {self.name!r}>"


class Lanai4Cluster:
    """Nodes on one Myrinet switch, in virtual time (``world`` must be a Simulation)."""

    def __init__(
        self, world: World, params: Lanai4Params | None = None, nodes: int | Sequence[str] = 2
    ) -> None:
        if not world.virtual:
            raise ValueError("the LANai 4.1 platform is a model: it needs a Simulation")
        names = [f"node{i}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"need at least two distinctly named nodes, not {names!r}")
        self.world = world
        self.params = params if params is not None else Lanai4Params()
        self.node_list = [Lanai4Node(name, i, world) for i, name in enumerate(names)]
        self.nodes = {node.name: node for node in self.node_list}

    def __repr__(self) -> str:
        return f"<Lanai4Cluster {list(self.nodes)}>"

    def units(self, nbytes: int) -> tuple[int, int]:
        """(pipeline units, bytes per unit) for ``nbytes`` (at least one unit)."""
        chunk = self.params.chunk_bytes
        return max(1, -(-nbytes // chunk)), chunk

    def dma(
        self,
        node: Lanai4Node,
        direction: Direction,
        nbytes: int,
        first_in: float,
        last_in: float,
        *,
        initiator: Initiator = "lanai",
        store_and_forward: bool = False,
    ) -> tuple[float, float]:
        """A host<->SRAM DMA on ``node``'s PCI engine; returns (first unit, last unit) out."""
        p = self.params
        units, _ = self.units(nbytes)
        per_unit = nbytes * p.dma_per_byte(direction) / units
        return stage(
            node.pci,
            first_in,
            last_in,
            units,
            per_unit,
            head=p.dma_setup(initiator),
            store_and_forward=store_and_forward,
        )

    def wire(
        self,
        src: Lanai4Node,
        dst: Lanai4Node,
        nbytes: int,
        first_in: float,
        last_in: float,
        *,
        store_and_forward: bool = False,
    ) -> tuple[float, float]:
        """One packet of ``nbytes`` payload from ``src``'s SRAM into ``dst``'s SRAM.

        The send DMA engine feeds the link, the cut-through switch adds its delay, the receive
        DMA engine drains the link; each engine moves one byte per link byte time.  The packet
        carries the LANai model's header (route, type, tag, CRC) in front of the payload.
        """
        p = self.params
        total = nbytes + p.ni.packet_header_bytes
        units, _ = self.units(total)
        per_unit = total * p.link_per_byte() / units
        first, last = stage(
            src.net_tx, first_in, last_in, units, per_unit, store_and_forward=store_and_forward
        )
        switch = p.ni.switch_latency_us * US
        return stage(dst.net_rx, first + switch, last + switch, units, per_unit)


def fig2(sizes: Sequence[int] = FIG2_SIZES) -> list[dict[str, float]]:
    """Paper 004 Fig 2: host<->NI bandwidth in MB/s by method, direction and DMA initiator.

    One row per size: ``size`` and one ``"<method> <direction>"`` key per curve of
    :data:`FIG2_CURVES`.  Fig 2's values are not in the text; the rates and set-up times are
    estimates that reproduce its stated shape (see ``LanaiParams``).
    """
    rows = []
    for size in sizes:
        row = {"size": float(size)}
        for method, direction in FIG2_CURVES:
            row[f"{method} {direction}"] = host_ni_bandwidth(method, direction, size)
        rows.append(row)
    return rows
