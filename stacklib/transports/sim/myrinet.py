"""The Myrinet LANai 4.1 NI running a raw U-Net control program, as a cost model (paper 004 §3).

The hardware (paper 004 §3): a 33 MHz LANai 4.1 with 1 MB of SRAM on a 32-bit 33 MHz PCI card
(133 MB/s) in a 200 MHz Pentium Pro; three DMA engines, two between the network and SRAM (send,
receive) and one between SRAM and host memory over PCI, with physical addresses; an internal bus
at twice the clock, so two DMA engines run at full speed at once; 1.28 Gbit/s links each way,
an 8-bit CRC on every packet, and a cut-through switch of about 100 ns (paper 004 §4.1,
footnote 4).  The host reaches NI memory by programmed I/O (PIO), whose writes are much faster
with the Pentium Pro's write combining (WC) and whose reads are slower than writes.  Paper 004
Fig 2 plots these host<->NI bandwidths; the text gives their shape but not their values, so the
parameters below are estimates chosen to reproduce that shape (docs/myrinet-ni.md says how).

The raw U-Net control program (LCP) modeled on it, in the manner of U-Net's i960 firmware
(paper 000 §4.2.2): send queues live in SRAM and the host writes descriptors there by PIO; the
LCP polls them, and the receive queue lives in host memory, where the LCP DMAs receive
descriptors so the host polls without crossing PCI.

* Send, ``send_method="pio"`` or ``"pio-wc"``: the host CPU copies the message into an SRAM
  send buffer by PIO (so its send overhead grows with size at the PIO rate), then writes the
  descriptor; the LCP notices it, builds the route header and starts the SRAM->network DMA.
* Send, ``send_method="dma"``: the host writes only the descriptor (messages small enough to
  travel inline in it go by PIO with it); the LCP DMAs the data host->SRAM and starts the
  SRAM->network DMA as soon as the rest of the packet will arrive in SRAM before the link needs
  it (``tx_overlap``), so the two DMAs overlap without the link ever running dry.
* Receive: the network->SRAM DMA runs cut-through with the link; once the header is in SRAM the
  LCP demultiplexes on the channel tag, takes free buffers and starts the SRAM->host DMA into
  the endpoint behind the arriving bytes (``rx_overlap``); after the last byte and the CRC check
  it DMAs the receive descriptor into the host's receive queue.  A message short enough to be
  inline goes to the host in one DMA with its descriptor.  A CRC failure drops the message,
  counted as ``corrupted`` (the partial data in the buffers is never announced).

Resources per node: the host CPU (``cpu``), the LANai (``ni``), the SRAM<->host DMA engine and
the PCI bus it masters (``bus``; one engine, shared by both directions), the network send and
receive DMA engines (``ni.send-dma``, ``ni.recv-dma``), and the fabric's links.  Because the
internal bus lets two engines run at full speed, no contention is charged between them; the
three-engine case (sending and receiving at once) is not slowed either (docs/myrinet-ni.md).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from stacklib.errors import ConfigError
from stacklib.sim import CostProfile, Host, World
from stacklib.sim.costs import cited
from stacklib.sim.pipeline import stage
from stacklib.transports.sim.fabric import Fabric, Packet
from stacklib.transports.sim.hosts import HOSTS
from stacklib.transports.sim.links import MyrinetLink
from stacklib.transports.sim.ni import SimNI
from stacklib.transports.sim.params import FaultParams
from stacklib.wire.descriptor import FRAGMENT_SIZE, HEADER_SIZE

if TYPE_CHECKING:
    from stacklib.transports.sim import SimCluster

__all__ = [
    "FIG2_CURVES",
    "Direction",
    "LanaiParams",
    "MyrinetNI",
    "MyrinetParams",
    "SendMethod",
    "TransferMethod",
    "build_myrinet",
    "host_ni_bandwidth",
    "host_ni_time_us",
]

US = 1e-6

SendMethod = Literal["pio", "pio-wc", "dma"]
#: How data crosses between host memory and NI SRAM (paper 004 Fig 2's curves).
TransferMethod = Literal["pio", "pio-wc", "dma-host", "dma-lanai"]
#: ``h2n``: host memory to NI; ``n2h``: NI to host memory (paper 004 Fig 2's labels).
Direction = Literal["h2n", "n2h"]

#: The (method, direction) pairs paper 004 Fig 2 plots.  Write combining only combines writes,
#: so there is no N2H write-combining curve.
FIG2_CURVES: tuple[tuple[TransferMethod, Direction], ...] = (
    ("pio-wc", "h2n"),
    ("pio", "h2n"),
    ("pio", "n2h"),
    ("dma-lanai", "h2n"),
    ("dma-host", "h2n"),
    ("dma-lanai", "n2h"),
    ("dma-host", "n2h"),
)


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and > 0, not {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and >= 0, not {value!r}")


@attrs.frozen
class LanaiParams:
    """Costs of a Myrinet LANai 4.1 PCI card in a 200 MHz Pentium Pro with raw U-Net firmware.

    Rates are in MB/s (10^6 bytes per second), times in microseconds, LANai work in LANai
    cycles so that a "what if the LANai ran at 66 MHz" override changes them all.
    """

    name: str = "lanai4.1"
    clock_mhz: float = cited(
        33.0, "paper 004 §3: the LANai processor is clocked at 33 MHz", "MHz", validator=_positive
    )
    sram_bytes: int = cited(1 << 20, "paper 004 §3: LANai 4.1 with 1 MByte of SRAM", "bytes")
    pci_mb_s: float = cited(
        133.0, "paper 004 §3: 32-bit 33 MHz PCI, 133 MBytes/s maximum", "MB/s", validator=_positive
    )
    link_gbit_s: float = cited(
        1.28,
        "paper 004 §3: links deliver 1.28 Gbits/s in each direction",
        "Gbit/s",
        validator=_positive,
    )
    switch_latency_us: float = cited(
        0.1,
        "paper 004 §4.1 footnote 4: the switch's effect is on the order of 100 ns",
        "us",
        validator=_non_negative,
    )
    packet_header_bytes: int = cited(
        8,
        "estimated: 1 source-route byte for one switch, a 4-byte packet type, a 2-byte U-Net "
        "channel tag and the 8-bit CRC (paper 004 §3) appended by the hardware",
        "bytes",
    )
    # --- host <-> NI transfers (paper 004 Fig 2; values estimated, see docs/myrinet-ni.md)
    pio_write_wc_mb_s: float = cited(
        88.0,
        "estimated: write combining turns uncached stores into 32-byte PCI bursts (paper 004 "
        "§3), ~12 PCI clocks per line (address, 8 data phases, turnaround, chipset gap)",
        "MB/s",
        validator=_positive,
    )
    pio_write_mb_s: float = cited(
        26.7,
        "estimated: without write combining each 4-byte store is its own PCI transaction, "
        "~5 PCI clocks (paper 004 §3: WC 'greatly enhances' write PIO)",
        "MB/s",
        validator=_positive,
    )
    pio_read_mb_s: float = cited(
        12.0,
        "estimated: each 4-byte uncached read stalls the CPU ~0.33 us (paper 004 §3: reads cost "
        "more than writes); with lanai_dma_setup_us it puts the N2H PIO/DMA crossover between "
        "16 and 32 bytes, as paper 004 §4.2's solid line (PIO up to 16 bytes) requires",
        "MB/s",
        validator=_positive,
    )
    dma_h2n_mb_s: float = cited(
        131.0,
        "estimated: host->NI DMA 'approaches the maximum bandwidth (133 MBytes/s)' "
        "(paper 004 §3) less PCI address phases",
        "MB/s",
        validator=_positive,
    )
    dma_n2h_mb_s: float = cited(
        127.0,
        "estimated: NI->host DMA is the lower of the two (paper 004 §4.2: 'network interface to "
        "host transfers are the bottleneck') yet above the 125 MB/s VMMC delivers (paper 004 "
        "abstract)",
        "MB/s",
        validator=_positive,
    )
    lanai_dma_setup_us: float = cited(
        1.5,
        "estimated: LANai-initiated DMA start-up (program the engine, PCI arbitration, first "
        "data); bounded by the 16-32 byte N2H PIO/DMA crossover (paper 004 §4.2) and by "
        "Fig 2's LANai DMA being 'close to' 133 MB/s at 4 KB (paper 004 §3)",
        "us",
        validator=_non_negative,
    )
    host_dma_setup_us: float = cited(
        5.0,
        "estimated: host-initiated DMA (PIO writes of the DMA registers, PIO-read polling for "
        "completion); LANai-initiated is 'significantly' faster from 32 B to 4 KB yet both "
        "are 'close to' 133 MB/s for a 4 KB page (paper 004 §3)",
        "us",
        validator=_non_negative,
    )
    # --- the LCP's per-message work, in LANai cycles (estimated, see docs/myrinet-ni.md)
    lcp_poll_cycles: float = cited(
        16.0,
        "estimated: one pass of the LCP's main loop, which notices a new send descriptor",
        "cycles",
        validator=_non_negative,
    )
    lcp_send_cycles: float = cited(
        50.0,
        "estimated: read and check the descriptor, look up the route, write the header, start "
        "the DMAs; with lcp_recv_cycles it puts a 0-byte one-way time just above BIP's ~6 us "
        "(paper 004 §4.1.1), the thinnest of the measured libraries",
        "cycles",
        validator=_non_negative,
    )
    lcp_recv_cycles: float = cited(
        50.0,
        "estimated: demultiplex on the channel tag, take free buffers, start the host DMA",
        "cycles",
        validator=_non_negative,
    )
    net_dma_setup_cycles: float = cited(
        6.0,
        "estimated: the LCP writes the send DMA's pointer and limit registers",
        "cycles",
        validator=_non_negative,
    )
    sram_tx_buffers: int = cited(
        2,
        "estimated: SRAM send buffers of the DMA path (double buffering: one filling from the "
        "host while one drains to the link)",
        "buffers",
    )
    # --- the host's side (200 MHz Pentium Pro)
    host_send_us: float = cited(
        0.5,
        "estimated: ~100 Pentium Pro instructions to check the send queue and compose a "
        "descriptor; its PIO write into SRAM is added at the PIO rate",
        "us",
        validator=_non_negative,
    )
    host_recv_us: float = cited(
        0.5,
        "estimated: poll the receive queue in host memory (cached) and take the descriptor",
        "us",
        validator=_non_negative,
    )
    inline_threshold: int = cited(
        48,
        "estimated: a 64-byte queue entry (two Pentium Pro cache lines) holds the 16-byte "
        "descriptor header and up to 48 bytes of message",
        "bytes",
    )
    max_message: int = cited(
        65535, "estimated: buffered whole in SRAM (1 MB, paper 004 §3) on either side", "bytes"
    )
    #: The machine the host-side costs are for; other hosts scale them by clock rate.
    reference_host: str = "ppro200"
    cite: str = "paper 004 §3"

    def __attrs_post_init__(self) -> None:
        for name in ("pio_write_wc_mb_s", "pio_write_mb_s", "pio_read_mb_s"):
            if getattr(self, name) > self.pci_mb_s:
                raise ValueError(f"{name} exceeds the PCI bus's {self.pci_mb_s} MB/s")
        for name in ("dma_h2n_mb_s", "dma_n2h_mb_s"):
            if getattr(self, name) > self.pci_mb_s:
                raise ValueError(f"{name} exceeds the PCI bus's {self.pci_mb_s} MB/s")
        if self.sram_tx_buffers < 1:
            raise ValueError("sram_tx_buffers must be at least 1")
        if self.max_message > self.sram_bytes // 2:
            raise ValueError("max_message must fit twice in SRAM (a send and a receive buffer)")

    def cycles_us(self, cycles: float) -> float:
        """LANai cycles in microseconds at :attr:`clock_mhz`."""
        return cycles / self.clock_mhz

    def pio_rate(self, method: TransferMethod, direction: Direction) -> float:
        """MB/s of PIO ``method`` in ``direction``."""
        if direction == "n2h":
            if method == "pio-wc":
                raise ValueError("write combining only combines writes: no N2H 'pio-wc'")
            return self.pio_read_mb_s
        return self.pio_write_wc_mb_s if method == "pio-wc" else self.pio_write_mb_s


def host_ni_time_us(
    method: TransferMethod, direction: Direction, nbytes: int, params: LanaiParams | None = None
) -> float:
    """Modeled time to move ``nbytes`` between host memory and NI SRAM, in microseconds.

    PIO runs at its rate with no start-up cost (the CPU just stores or loads); a DMA pays its
    initiator's set-up, then streams at its direction's rate.  The NI model uses the same
    parameters, so its per-byte costs are these.
    """
    p = params if params is not None else LanaiParams()
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, not {nbytes}")
    if method in ("pio", "pio-wc"):
        return nbytes / p.pio_rate(method, direction)
    if method not in ("dma-host", "dma-lanai"):
        raise ValueError(f"unknown transfer method {method!r}")
    setup = p.lanai_dma_setup_us if method == "dma-lanai" else p.host_dma_setup_us
    rate = p.dma_h2n_mb_s if direction == "h2n" else p.dma_n2h_mb_s
    return setup + nbytes / rate


def host_ni_bandwidth(
    method: TransferMethod, direction: Direction, nbytes: int, params: LanaiParams | None = None
) -> float:
    """Modeled bandwidth in MB/s of one ``nbytes`` host<->NI transfer (paper 004 Fig 2).

    ``method`` is ``"pio"`` (no write combining), ``"pio-wc"`` (H2N only), ``"dma-host"`` or
    ``"dma-lanai"`` (who starts the DMA); ``direction`` is ``"h2n"`` or ``"n2h"``.
    """
    if nbytes <= 0:
        raise ValueError(f"bandwidth needs a positive size, not {nbytes}")
    return nbytes / host_ni_time_us(method, direction, nbytes, params)


class MyrinetNI(SimNI):
    """A LANai 4.1 running raw U-Net: see the module docstring for the send and receive paths."""

    kind = "lanai"

    def __init__(
        self,
        name: str,
        host: Host,
        fabric: Fabric,
        params: LanaiParams,
        *,
        send_method: SendMethod = "dma",
        tx_overlap: bool = True,
        rx_overlap: bool = True,
        direct_access: bool = True,
        host_scale: float = 1.0,
    ) -> None:
        super().__init__(
            name,
            host,
            fabric,
            inline_threshold=params.inline_threshold,
            max_message=params.max_message,
            alignment=4,  # the DMA engines move 32-bit words
            poll_latency=params.cycles_us(params.lcp_poll_cycles) * US,
        )
        self.params = params
        self.send_method: SendMethod = send_method
        self.tx_overlap = tx_overlap
        self.rx_overlap = rx_overlap
        # The SRAM<->host DMA engine uses physical addresses, so it can deposit anywhere in a
        # pinned segment: direct access (paper 000 §3.6), as VMMC does on this card.
        self.direct_access = direct_access
        self.tx_dma = host.resource("ni.send-dma")
        self.rx_dma = host.resource("ni.recv-dma")
        p = params
        self._lcp_send = p.cycles_us(p.lcp_send_cycles) * US
        self._lcp_recv = p.cycles_us(p.lcp_recv_cycles) * US
        self._net_setup = p.cycles_us(p.net_dma_setup_cycles) * US
        self._dma_setup = p.lanai_dma_setup_us * US
        self._h2n_byte = US / p.dma_h2n_mb_s
        self._n2h_byte = US / p.dma_n2h_mb_s
        #: When each of the last ``sram_tx_buffers`` DMA-path sends freed its SRAM buffer.
        self._sram_tx: deque[float] = deque(maxlen=p.sram_tx_buffers)
        #: Bytes of received packets in SRAM not yet delivered to the host, and the peak.
        self.sram_rx_bytes = 0
        self.sram_rx_peak = 0
        pio_method: TransferMethod = "pio-wc" if send_method == "pio-wc" else "pio"
        # Host software scales with the CPU's clock; PIO is paced by PCI and does not.
        send_fixed, recv = p.host_send_us * host_scale, p.host_recv_us * host_scale
        data_by_pio = send_method != "dma"
        inline = p.inline_threshold

        def send_cost(nbytes: int) -> float:
            # The host stores the descriptor into SRAM by PIO, and the data too unless the
            # LANai will DMA it (which it does not for messages inline in the descriptor).
            if nbytes <= inline:
                stored = HEADER_SIZE + nbytes
            else:
                stored = HEADER_SIZE + FRAGMENT_SIZE + (nbytes if data_by_pio else 0)
            return (send_fixed + host_ni_time_us(pio_method, "h2n", stored, p)) * US

        self.host_send_cost = send_cost
        self.host_recv_cost = lambda nbytes: recv * US

    def __repr__(self) -> str:
        return f"<MyrinetNI {self.name} {self.send_method}>"

    # ------------------------------------------------------------------ send

    def tx_ready(self, now: float) -> float:
        ready = self.engine.busy_until
        sram = self._sram_tx
        if len(sram) == sram.maxlen and sram[0] > ready:
            ready = sram[0]  # every SRAM send buffer is still draining to the link
        return ready

    def tx_timing(self, nbytes: int, now: float) -> tuple[float, float, float]:
        wire = self.wire_shape(nbytes)
        byte = wire.per_unit
        _, lcp_done = stage(self.engine, now, now, 1, self._lcp_send)
        dma_path = self.send_method == "dma" and nbytes > self.inline_threshold
        if dma_path:
            first, last = stage(
                self.bus, lcp_done, lcp_done, nbytes, self._h2n_byte, head=self._dma_setup
            )
            injected = last  # the data has left host memory
            # Overlapped, the network DMA starts only when the rest of the packet will be in
            # SRAM before the link needs it: a Myrinet send DMA cannot wait in mid-packet.
            first = max(lcp_done, last - wire.units * byte) if self.tx_overlap else last
        else:
            first = last = lcp_done  # already in SRAM, put there by the host's PIO
            injected = lcp_done
        first_out, last_out = stage(
            self.tx_dma, first, last, wire.units, byte, head=self._net_setup
        )
        if dma_path:
            self._sram_tx.append(last_out)
        elif self.send_method != "dma":
            injected = last_out  # the endpoint's send buffers are the SRAM buffers
        return first_out, last_out, injected

    # ------------------------------------------------------------------ receive

    def rx_timing(self, packet: Packet, first_in: float, last_in: float) -> float:
        shape = packet.shape
        byte = shape.per_unit
        nbytes = len(packet.payload)
        first, last = stage(self.rx_dma, first_in, last_in, shape.units, byte)
        header = min(shape.units, self.params.packet_header_bytes)
        header_in = first + (header - 1) * byte
        _, lcp_done = stage(self.engine, header_in, header_in, 1, self._lcp_recv)
        self.sram_rx_bytes += shape.units
        self.sram_rx_peak = max(self.sram_rx_peak, self.sram_rx_bytes)
        endpoint = self.demux.get(packet.rx_key)
        if endpoint is None:
            return lcp_done  # the LCP drops an unknown tag on sight: nothing crosses PCI
        # The hardware compares the CRC after the last byte (``last``); a failed check stops
        # the LCP before it announces the message.
        corrupted = packet.corrupted
        setup, per = self._dma_setup, self._n2h_byte
        if packet.dest_offset is None and nbytes <= self.inline_threshold:
            # Data and descriptor in one DMA, once the whole packet is in and checked.
            start = max(lcp_done, last)
            if corrupted:
                return start
            return stage(self.bus, start, start, HEADER_SIZE + nbytes, per, head=setup)[1]
        if self.rx_overlap:
            data_first = max(lcp_done, header_in + byte)
        else:
            data_first = max(lcp_done, last)
            if corrupted:
                return data_first
        _, data_done = stage(self.bus, data_first, last, nbytes, per, head=setup)
        if corrupted:
            return data_done  # the bytes reached the buffers, but no descriptor names them
        fragments = 0
        if packet.dest_offset is None:
            # The descriptor lists the receive buffers the message fills, by the endpoint's
            # configured buffer size.
            size = endpoint[0].config.rx_buffer_size
            fragments = max(1, -(-nbytes // size))
        descriptor = HEADER_SIZE + FRAGMENT_SIZE * fragments
        return stage(self.bus, data_done, data_done, descriptor, per, head=setup)[1]

    def _rx_done(self, packet: Packet) -> None:
        self.sram_rx_bytes -= packet.shape.units
        super()._rx_done(packet)


# ------------------------------------------------------------------------- recipe transport


@attrs.frozen
class MyrinetParams:
    """Recipe parameters of the ``sim-myrinet`` transport (raw U-Net on a LANai 4.1)."""

    #: How the host hands message data to the NI: PIO without or with write combining, or a
    #: descriptor and a LANai-initiated DMA (inline-sized messages always go by PIO).
    send_method: SendMethod = "dma"
    #: Overlap the host->SRAM DMA with the SRAM->network DMA of the same message (PM's
    #: "immediate sending", paper 004 §4.2); off: send only once the message is in SRAM.
    tx_overlap: bool = True
    #: Start the SRAM->host DMA behind the arriving bytes; off: after the whole packet.
    rx_overlap: bool = True
    #: Let senders deposit at an offset of the receiver's segment (paper 000 §3.6).
    direct_access: bool = True
    #: The host machine (hosts.HOSTS); host software costs scale by clock rate from the
    #: 200 MHz Pentium Pro of paper 004 §3, PIO and DMA (paced by PCI) do not.
    host: str = "ppro200"
    faults: FaultParams = attrs.Factory(FaultParams)
    #: Replace LanaiParams fields by name, e.g. {clock_mhz = 66.0}: "what if" experiments.
    overrides: dict[str, float] = attrs.Factory(dict)


def lanai_params(overrides: dict[str, float]) -> LanaiParams:
    """:class:`LanaiParams` with recipe ``overrides`` applied, checked by name."""
    fields = {f.name for f in attrs.fields(LanaiParams)}
    for key in overrides:
        if key not in fields or key in ("name", "cite", "reference_host"):
            raise ConfigError("transport", f"overrides.{key}", "not a LanaiParams parameter")
    kinds = {f.name: f.type for f in attrs.fields(LanaiParams)}
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        if kinds[key] in ("int", int):
            if value != int(value):
                raise ConfigError("transport", f"overrides.{key}", f"must be whole, not {value}")
            values[key] = int(value)
        else:
            values[key] = float(value)
    try:
        return attrs.evolve(LanaiParams(), **values)
    except ValueError as error:
        raise ConfigError("transport", "overrides", str(error)) from None


def build_myrinet(
    world: World, params: MyrinetParams, names: Sequence[str], profile: CostProfile | None
) -> SimCluster:
    """Hosts with LANai NIs on one Myrinet switch (paper 004 §3-4: two nodes, one switch)."""
    # Imported here: the package's __init__ imports this module to register it.
    from stacklib.transports.sim import SimCluster

    if params.host not in HOSTS:
        known = ", ".join(HOSTS)
        raise ConfigError("transport", "host", f"unknown host {params.host!r} (known: {known})")
    model = lanai_params(params.overrides)
    # A first-order model of another host: its software runs at the ratio of clock rates.
    scale = HOSTS[model.reference_host].mhz / HOSTS[params.host].mhz
    fabric = Fabric(
        world,
        MyrinetLink(rate_bps=model.link_gbit_s * 1e9, header_bytes=model.packet_header_bytes),
        topology="switch",
        latency=model.switch_latency_us * US,
        faults=params.faults,
        name="myrinet",
    )
    cluster = SimCluster(world, fabric)
    for name in names:
        host = Host(name, world, profile)
        ni = MyrinetNI(
            name,
            host,
            fabric,
            model,
            send_method=params.send_method,
            tx_overlap=params.tx_overlap,
            rx_overlap=params.rx_overlap,
            direct_access=params.direct_access,
            host_scale=scale,
        )
        cluster.add(name, host, ni)
    return cluster
