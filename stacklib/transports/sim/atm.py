"""Fore ATM network interfaces as cost models: SBA-100, SBA-200/PCA-200 with the U-Net i960
firmware, and Fore's original firmware as a baseline.

Every number is a field with its citation.  Where a paper states a cost (a send overhead, a
switch latency) it is taken as given; where it states only an end result (a round-trip time, a
bandwidth), the parameters that produce it are marked "calibrated" with the figure they were
fitted to, and the other figures of the same configuration are then predictions that
``stacklib reproduce`` checks (docs/reproduction.md).

**SBA-200 / PCA-200 with U-Net firmware** (paper 000 §4.2.2, paper 003 §4.2): the host posts a
send descriptor with a double-word store into i960 memory; the i960 polls the send queues, DMAs
the data from the host (32-byte bursts on the SBus, 96-byte on PCI), and feeds cells to the
fiber; single-cell messages take a fast path.  On receive the i960 polls the input FIFO and
processes each cell; a single-cell message goes straight into the next receive-queue entry
(inline), longer ones into fixed-size buffers from the free queue, whose descriptor is DMA'd into
the receive queue after the last cell.  Send and free queues live in NI memory, the receive
queue in host memory, so the host polls without crossing the I/O bus.

**SBA-100** (paper 000 §4.1, Table 1): no DMA, no AAL5 CRC; the host moves every cell with a fast
trap into 36-cell output / 292-cell input FIFOs and runs AAL5 segmentation, reassembly and CRC
in a user-level library (CRC is 33% of the send and 40% of the receive overhead).  U-Net is
offered through kernel-emulated endpoints; the whole cost lands on the host CPU.
"""

from __future__ import annotations

from stacklib.compiled import mypyc_attr
from stacklib.sim import Host
from stacklib.sim.pipeline import stage
from stacklib.transports.sim.fabric import Fabric, Packet, link_check_fails
from stacklib.transports.sim.links import LinkTech
from stacklib.transports.sim.ni import SimAddress, SimNI
from stacklib.transports.sim.params import SINGLE_CELL_MAX, I960Params, Sba100Params
from stacklib.unet.endpoint import Channel, Endpoint
from stacklib.unet.ni import Payload
from stacklib.wire.descriptor import SendDescriptor

US = 1e-6


@mypyc_attr(allow_interpreted_subclasses=True)
class I960NI(SimNI):
    """An SBA-200 or PCA-200: the i960 does the NI's work, the host only posts and polls."""

    kind = "i960"

    def __init__(
        self,
        name: str,
        host: Host,
        fabric: Fabric,
        params: I960Params,
        link: LinkTech | None = None,
        host_scale: float = 1.0,
    ) -> None:
        super().__init__(
            name,
            host,
            fabric,
            inline_threshold=params.inline_threshold,
            max_message=65535,
            alignment=8,
            poll_latency=params.poll_us * US,
            link=link,
            tx_backlog=params.output_fifo_cells * (link or fabric.tech).shape(1).per_unit,
        )
        self.params = params
        #: PDUs whose CRC-32 failed on wire errors (each also a ``corrupted`` drop).
        self.crc_errors = 0
        self._seconds_cache: tuple[I960Params, tuple[float, ...]] | None = None
        cls = type(self)
        #: No subclass replaced a hook that transmit inlines.
        self._fused = (
            cls.tx_ready is SimNI.tx_ready
            and cls.wire_tag is I960NI.wire_tag
            and cls.tx_timing is I960NI.tx_timing
        )
        # The firmware's loop interleaves transmit and receive work cell by cell (paper 000
        # §4.2.2-4.2.3: it polls the send queues and the input FIFO in turn).  Charged per
        # message, one FIFO for both would make a one-cell message (an acknowledgment) wait
        # behind a whole multi-cell message going the other way; two queues, one per
        # direction, keep that interleaving at message granularity.  The I/O bus interleaves
        # DMA bursts the same way; each direction uses at most about a third of it (one DMA
        # per cell against a 3 us cell time), so separate queues overstate it little.
        self.engine = host.resource("ni.tx")
        self.rx_engine = host.resource("ni.rx")
        self.bus = host.resource("bus.tx")
        self.rx_bus = host.resource("bus.rx")
        send = params.host_send_us * US * host_scale
        recv = params.host_recv_us * US * host_scale
        self.host_send_cost = lambda nbytes: send
        self.host_recv_cost = lambda nbytes: recv
        self.upcall_cost = params.signal_us * US * host_scale

    def channel_tags(self, local: SimAddress, remote: SimAddress) -> tuple[object, object]:
        # A channel is a VCI pair (paper 000 §4.2.2); the receive key is the incoming VCI.
        tx_vci = self.fabric.vc(local, remote)
        rx_vci = self.fabric.vc(remote, local)
        return (remote.node, tx_vci), rx_vci

    def wire_tag(self, channel: Channel, endpoint: Endpoint) -> tuple[str, object, object]:
        tx_tag: tuple[str, int] = channel.tx_tag  # type: ignore[assignment]  # set by channel_tags
        node, vci = tx_tag
        return node, vci, vci

    def _seconds(self) -> tuple[float, ...]:
        """The per-message constants of tx_timing and rx_timing, in seconds: the very same
        expressions, evaluated once per params object instead of once per message."""
        p = self.params
        cached = self._seconds_cache
        if cached is not None and cached[0] is p:
            return cached[1]
        seconds = (
            (p.tx_single_us - p.tx_cell_us) * US,  # 0: tx head, single cell
            p.tx_cell_us * US,  # 1: tx per cell
            p.tx_msg_us * US,  # 2: tx head, multi-cell
            p.dma_cell_us * US,  # 3: DMA per cell
            (p.rx_single_us - p.rx_cell_us) * US,  # 4: rx head, single cell
            p.rx_msg_us * US,  # 5: rx tail, multi-cell
            p.rx_cell_us * US,  # 6: rx per cell
        )
        self._seconds_cache = (p, seconds)
        return seconds

    def tx_timing(self, nbytes: int, now: float) -> tuple[float, float, float]:
        first, last = self._tx_stages(self.wire_shape(nbytes).units, now)
        return first, last, last

    def _tx_stages(self, cells: int, now: float) -> tuple[float, float]:
        """The i960 and the DMA of a send of ``cells`` cells taken at ``now``: (first, last)
        cell on the link; the data has left the host's buffers with the last."""
        p = self.params
        cached = self._seconds_cache
        k = cached[1] if cached is not None and cached[0] is p else self._seconds()
        if cells == 1 and p.inline_threshold:
            head, per = k[0], k[1]
        else:
            head, per = k[2], k[1]
        # Positional arguments throughout: cheaper than keywords on this per-message path.
        first, last = stage(self.engine, now, now, cells, per, head)
        return stage(self.bus, first, last, cells, k[3])

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        if not self._fused:
            return super().transmit(endpoint, channel, descriptor, data)
        # SimNI.transmit with tx_ready, wire_tag and tx_timing inlined (once per message):
        # the same reservations, heap entries and packet, in the same order.
        world = self.world
        now = world.now()
        ready = self.engine.busy_until
        link = self.egress_link.busy_until - self.tx_backlog
        if link > ready:
            ready = link
        if ready > now:
            self._schedule_poll(ready)
            return False
        tx_tag: tuple[str, int] = channel.tx_tag  # type: ignore[assignment]  # channel_tags
        node, vci = tx_tag
        length = len(data)
        shape = self.wire_shape(length)
        first_out, last_out = self._tx_stages(shape.units, now)
        packet = Packet(self.name, node, vci, bytes(data), descriptor.dest_offset, shape, vci)
        world.call_at(last_out, self._tx_done, endpoint, descriptor, length)
        self.fabric.transmit_from(self, packet, first_out, last_out)
        return True

    def _rx_done(self, packet: Packet) -> None:
        # The firmware reassembles the PDU and checks its CRC-32 (paper 000 §4.2.2).
        if packet.corrupted and link_check_fails(packet, self.link):
            self.crc_errors += 1
        super()._rx_done(packet)

    def rx_timing(self, packet: Packet, first_in: float, last_in: float) -> float:
        p = self.params
        cached = self._seconds_cache
        k = cached[1] if cached is not None and cached[0] is p else self._seconds()
        cells = packet.shape.units
        single = cells == 1 and p.inline_threshold
        head = k[4] if single else 0.0
        # The i960 takes each cell off the input FIFO; after the last cell of a multi-cell
        # message it allocates the buffers' descriptor and starts its DMA to the receive queue.
        tail = 0.0 if single else k[5]
        rx = self.rx_engine
        first, last = stage(rx, first_in, last_in, cells, k[6], head)
        engine_done = last + tail
        if tail:
            rx.busy_until = max(rx.busy_until, engine_done)
            rx.busy_time += tail
        # The DMA engine moves the data to the host while the i960 goes on with later cells.
        dma_done = stage(self.rx_bus, first, last, cells, k[3], 0.0, 0.0, p.rx_dma_after_last)[1]
        return engine_done if engine_done >= dma_done else dma_done  # max() without a call


@mypyc_attr(allow_interpreted_subclasses=True)
class Sba100NI(SimNI):
    """The SBA-100: cells moved by fast traps, AAL5 in a user library, all on the host CPU.

    The host's send overhead (AAL5 segmentation and CRC plus one trap per cell) is charged to
    the sending application, which is blocked for it; the receive side's per-cell traps and
    reassembly are charged to the receiving host's CPU as the cells arrive.
    """

    kind = "sba100"

    def __init__(
        self,
        name: str,
        host: Host,
        fabric: Fabric,
        params: Sba100Params,
        link: LinkTech | None = None,
        host_scale: float = 1.0,
    ) -> None:
        cell = (link or fabric.tech).shape(1).per_unit
        super().__init__(
            name,
            host,
            fabric,
            inline_threshold=SINGLE_CELL_MAX,
            max_message=65535,
            link=link,
            tx_backlog=params.output_fifo_cells * cell,
        )
        self.params = params
        #: PDUs whose CRC-32 failed on wire errors (each also a ``corrupted`` drop).
        self.crc_errors = 0
        self.engine = host.resource("cpu")  # no NI processor: the host CPU does the NI's work
        link_and_switch = 2 * (link or fabric.tech).shape(1).per_unit + fabric.latency
        self.trap_us = max(0.0, params.trap_level_us - link_and_switch / US) / 2
        p = params
        # Per-message and per-cell parts, so that one cell costs exactly Table 1's figures.
        send_single = p.send_overhead_us + self.trap_us
        recv_single = p.recv_overhead_us + self.trap_us
        self.send_fixed_us = (send_single - p.send_cell_us) * host_scale
        self.recv_fixed_us = (recv_single - p.recv_cell_us) * host_scale
        self.send_cell_us = p.send_cell_us * host_scale
        self.recv_cell_us = p.recv_cell_us * host_scale
        tech = self.link

        def send_cost(nbytes: int) -> float:
            return (self.send_fixed_us + tech.shape(nbytes).units * self.send_cell_us) * US

        self.host_send_cost = send_cost
        self.host_recv_cost = None

    def channel_tags(self, local: SimAddress, remote: SimAddress) -> tuple[object, object]:
        return (remote.node, self.fabric.vc(local, remote)), self.fabric.vc(remote, local)

    def wire_tag(self, channel: Channel, endpoint: Endpoint) -> tuple[str, object, object]:
        tx_tag: tuple[str, int] = channel.tx_tag  # type: ignore[assignment]  # channel_tags
        node, vci = tx_tag
        return node, vci, vci

    def tx_ready(self, now: float) -> float:
        # The traps already ran on the host CPU during the send overhead; only the output
        # FIFO can hold the NI back.
        return self.link_ready()

    def tx_timing(self, nbytes: int, now: float) -> tuple[float, float, float]:
        # The cells are in the output FIFO; the link drains it at its own rate.
        return now, now, now

    def _rx_done(self, packet: Packet) -> None:
        # The user-level AAL5 library reassembles the PDU and checks its CRC-32 (§4.1).
        if packet.corrupted and link_check_fails(packet, self.link):
            self.crc_errors += 1
        super()._rx_done(packet)

    def rx_timing(self, packet: Packet, first_in: float, last_in: float) -> float:
        cells = packet.shape.units
        return stage(
            self.engine,
            first_in,
            last_in,
            cells,
            self.recv_cell_us * US,
            head=self.recv_fixed_us * US,
        )[1]
