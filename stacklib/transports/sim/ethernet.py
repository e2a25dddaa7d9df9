"""The DEC 21140 Fast Ethernet NI driven by the kernel, as a cost model (paper 001 §3,
paper 003 §4.3-4.4).

The DC21140 has no processor that U-Net could program, so U-Net/FE lives in the kernel as "a
protected co-routine": the application's fast trap services its send queue and pushes
descriptors onto the device's transmit ring (paper 003 Fig 3, eight steps, about 4.2 us of host
time), the chip DMAs header and data over PCI and serializes the frame; on arrival the chip DMAs
the frame into a kernel ring buffer and interrupts, and the interrupt routine demultiplexes on
the U-Net port, copies the message into the endpoint (inline below 64 bytes) and pushes a
receive descriptor (paper 003 Fig 4).  All of that is host CPU time, so on Fast Ethernet the
host is busy for the whole send and receive (paper 003 §4.4.3).

Channels are named by MAC address and a one-byte port (paper 001 §3.1): a frame carries the
destination port only, so an endpoint demultiplexes by (source node, its own port) and can hold
one channel per remote host.
"""

from __future__ import annotations

import typing
from collections.abc import Hashable

import attrs

from stacklib.compiled import mypyc_attr
from stacklib.sim import Host
from stacklib.sim.pipeline import stage
from stacklib.transports.sim.fabric import Fabric, Packet, link_check_fails
from stacklib.transports.sim.links import LinkTech
from stacklib.transports.sim.ni import SimAddress, SimNI
from stacklib.transports.sim.params import Dc21140Params
from stacklib.unet.endpoint import Channel, Endpoint

US = 1e-6


@attrs.frozen
class EthernetSwitch:
    """A Fast Ethernet interconnect: a hub (shared medium) or a store-and-forward switch."""

    name: str
    topology: typing.Literal["hub", "switch"]
    latency_us: float
    cite: str


FE_INTERCONNECTS: dict[str, EthernetSwitch] = {
    "hub": EthernetSwitch(
        "hub",
        "hub",
        0.7,
        "Bay Networks 100BASE-TX hub (paper 003 §4.1); repeater delay calibrated with the "
        "DC21140 to paper 003 §4.4.2's 57 us RTT",
    ),
    "bay28115": EthernetSwitch(
        "bay28115",
        "switch",
        5.0,
        "Bay Networks 28115 (paper 003 §4.1): estimated; paper 003 Fig 5 places it between the "
        "hub (57 us) and the FN100 (91 us), and the text gives no figure",
    ),
    "fn100": EthernetSwitch(
        "fn100",
        "switch",
        11.1,
        "Cabletron FastNet100 (paper 003 §4.1): calibrated to paper 003 §4.4.2's 91 us RTT",
    ),
}


@mypyc_attr(allow_interpreted_subclasses=True)
class Dc21140NI(SimNI):
    """The DC21140 with U-Net/FE in the kernel: a fast trap to send, an interrupt to receive."""

    kind = "dc21140"

    def __init__(
        self,
        name: str,
        host: Host,
        fabric: Fabric,
        params: Dc21140Params,
        link: LinkTech | None = None,
        host_scale: float = 1.0,
    ) -> None:
        super().__init__(
            name,
            host,
            fabric,
            inline_threshold=params.inline_threshold,
            max_message=1497,  # stacklib.wire.unet_eth.MAX_MESSAGE
            alignment=4,
            link=link,
            tx_backlog=params.tx_ring_frames * (link or fabric.tech).shape(1497).per_unit,
        )
        self.params = params
        self.host_scale = host_scale
        #: Frames whose FCS failed on wire errors (each also a ``corrupted`` drop).
        self.fcs_errors = 0
        self.cpu = host.resource("cpu")
        self.engine = host.resource("ni")  # the chip's DMA and transmit machinery
        trap = params.send_trap_us * US * host_scale
        recv = params.host_recv_us * US * host_scale
        self.host_send_cost = lambda nbytes: trap
        self.host_recv_cost = lambda nbytes: recv

    def channel_tags(self, local: SimAddress, remote: SimAddress) -> tuple[Hashable, Hashable]:
        # On the wire: destination MAC and port.  The receiver knows the source MAC and its own
        # port, and maps them to the channel (paper 001 §3.1).
        return (remote, (local.node, remote.port)), (remote.node, local.port)

    def wire_tag(self, channel: Channel, endpoint: Endpoint) -> tuple[str, Hashable, object]:
        # An annotation, not typing.cast: nothing is built per message at run time.
        tx_tag: tuple[SimAddress, Hashable] = channel.tx_tag  # type: ignore[assignment]
        remote, rx_key = tx_tag
        return remote.node, rx_key, remote.port

    def tx_ready(self, now: float) -> float:
        # The trap pushes onto the device's transmit ring at once, unless the ring is full.
        return self.link_ready()

    def tx_timing(self, nbytes: int, now: float) -> tuple[float, float, float]:
        p = self.params
        frame = self.wire_shape(nbytes)
        frame_bytes = frame.wire_bytes - 20  # without preamble and inter-frame gap
        # The chip fetches the descriptor and both buffers over PCI, then transmits the frame
        # from its FIFO once it holds all of it.
        dma = p.tx_dma_setup_us * US + frame_bytes * p.pci_dma_us_per_byte * US
        _, done = stage(self.bus, now, now, 1, dma)
        return done, done, done

    def _rx_done(self, packet: Packet) -> None:
        # The chip checks the frame check sequence and drops a bad frame (IEEE 802.3).
        if packet.corrupted and link_check_fails(packet, self.link):
            self.fcs_errors += 1
        super()._rx_done(packet)

    def rx_timing(self, packet: Packet, first_in: float, last_in: float) -> float:
        p = self.params
        nbytes = len(packet.payload)
        frame_bytes = packet.shape.wire_bytes - 20
        # The frame is DMA'd into a kernel ring buffer once received and checked.
        dma = p.rx_dma_setup_us * US + frame_bytes * p.pci_dma_us_per_byte * US
        _, in_memory = stage(self.bus, last_in, last_in, 1, dma, store_and_forward=True)
        handler = p.rx_handler_small_us
        if nbytes > self.inline_threshold:
            # Fig 4's 100-byte path: a receive buffer is allocated and the copy grows with size.
            copy = nbytes / 100 * p.copy_us_per_100_bytes
            handler += p.rx_buffer_alloc_us + copy - p.small_copy_us
        interrupt = in_memory + p.irq_latency_us * US
        return stage(self.cpu, interrupt, interrupt, 1, handler * US * self.host_scale)[1]
