"""The base of simulated NIs: U-Net's generic NI work, timed by a model in virtual time.

A model subclass supplies the timing of its hardware:

* :meth:`SimNI.tx_timing`: when the NI takes a send descriptor, reserve its stages (processor,
  I/O bus, ...) and return when the first and last units reach the link and when the data has
  left the sender's buffers (the descriptor is then marked injected, paper 000 §3.1);
* :meth:`SimNI.rx_timing`: when the first unit arrives, reserve the receive stages and return
  when the message is in the endpoint (its receive descriptor is then pushed);
* ``host_send_cost`` / ``host_recv_cost``: the host CPU time of the message-level send and
  receive on this NI (posting a descriptor, polling the receive queue; a fast trap on NIs the
  kernel drives).

The NI processor takes one descriptor at a time: while it is busy, descriptors wait in the send
queue, which therefore fills and exerts back-pressure exactly when the NI is the bottleneck.
Everything else (validation, tags, demultiplexing, free buffers, inline messages, statistics)
is the generic :class:`~stacklib.unet.ni.NetworkInterface`.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

from stacklib.compiled import mypyc_attr
from stacklib.errors import ChannelError
from stacklib.sim import Host, Resource
from stacklib.transports.sim.fabric import Fabric, Packet
from stacklib.transports.sim.links import LinkTech, WireShape
from stacklib.unet.endpoint import Channel, DropReason, Endpoint
from stacklib.unet.ni import NetworkInterface, Payload
from stacklib.wire.descriptor import SendDescriptor


@attrs.frozen
class SimAddress:
    """An endpoint of a simulated cluster: the node's name and the endpoint's port."""

    node: str
    port: int

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


@mypyc_attr(allow_interpreted_subclasses=True)
class SimNI(NetworkInterface):
    """A simulated NI attached to a :class:`Fabric`.  Subclasses model specific hardware."""

    kind = "sim"

    def __init__(
        self,
        name: str,
        host: Host,
        fabric: Fabric,
        *,
        inline_threshold: int,
        max_message: int,
        alignment: int = 8,
        poll_latency: float = 0.0,
        link: LinkTech | None = None,
        tx_backlog: float = 0.0,
    ) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=inline_threshold,
            max_message=max_message,
            alignment=alignment,
        )
        self.fabric = fabric
        #: The NI's processor (the i960, the LANai) or, for kernel-driven NIs, the host CPU.
        self.engine: Resource = host.resource("ni")
        self.bus: Resource = host.resource("bus")
        self.uplink: Resource = host.resource("uplink")  # replaced by Fabric.attach
        self.downlink: Resource = host.resource("downlink")
        #: ``fabric.egress(self)``, set by Fabric.attach (read once per message).
        self.egress_link: Resource = self.uplink
        self.link: LinkTech = fabric.tech
        #: Delay from a doorbell to the NI noticing the descriptor (an NI polling its queues).
        self.poll_latency = poll_latency
        #: How far ahead of its link the NI may queue, in seconds of link time: the output
        #: FIFO or transmit ring.  Beyond it the NI stops taking descriptors, so the send
        #: queue fills and the application feels the link's back-pressure.
        self.tx_backlog = tx_backlog
        self._poll_at: float | None = None
        # Wire shapes of this NI's link by message size, computed once per size (a shape is a
        # frozen value and a pure function of the link and the size, so sharing one is exact).
        self._shapes: dict[int, WireShape] = {}
        self._shapes_link: LinkTech | None = None
        fabric.attach(self, link)

    # ------------------------------------------------------------------ addressing

    def wire_shape(self, nbytes: int) -> WireShape:
        """``self.link.shape(nbytes)``, cached per size (the hot path asks several times per
        message; a cache belonging to another link is dropped if ``link`` is replaced)."""
        link = self.link
        if link is not self._shapes_link:
            self._shapes = {}
            self._shapes_link = link
        shapes = self._shapes
        shape = shapes.get(nbytes)
        if shape is None:
            shape = shapes[nbytes] = link.shape(nbytes)
        return shape

    def address_of(self, endpoint: Endpoint) -> SimAddress:
        return SimAddress(self.name, endpoint.port)

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, SimAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not a SimAddress")
        if remote.node not in self.fabric.nis:
            raise ChannelError(f"{self!r} cannot reach {remote}: no such node on the fabric")
        return self.channel_tags(self.address_of(endpoint), remote)

    def channel_tags(self, local: SimAddress, remote: SimAddress) -> tuple[Hashable, Hashable]:
        """(transmit tag, receive key) of a channel; by default source and destination ports
        (the U-Net/FE scheme, paper 001 §3.1).  ATM models use VCI pairs."""
        at_remote = (local.node, local.port, remote.port)
        here = (remote.node, remote.port, local.port)
        return (remote, at_remote), here

    def wire_tag(self, channel: Channel, endpoint: Endpoint) -> tuple[str, Hashable, object]:
        """(destination node, receive key at the destination, link-level tag) for a send."""
        # An annotation, not typing.cast: nothing is built per message at run time.
        tx_tag: tuple[SimAddress, Hashable] = channel.tx_tag  # type: ignore[assignment]
        remote, rx_key = tx_tag
        return remote.node, rx_key, remote.port

    # ------------------------------------------------------------------ model hooks

    def tx_timing(self, nbytes: int, now: float) -> tuple[float, float, float]:
        """Reserve the send stages; return (first unit on the link, last unit on the link,
        data read from the sender's buffers)."""
        raise NotImplementedError

    def rx_timing(self, packet: Packet, first_in: float, last_in: float) -> float:
        """Reserve the receive stages; return when the message is in the endpoint."""
        raise NotImplementedError

    def tx_ready(self, now: float) -> float:
        """When the NI can take the next send descriptor: its processor is free and its link
        has room in the output FIFO."""
        engine = self.engine.busy_until
        link = self.egress_link.busy_until - self.tx_backlog  # link_ready(), inlined
        return engine if engine >= link else link

    def link_ready(self) -> float:
        """When the link's queue has drained to the NI's transmit backlog."""
        return self.egress_link.busy_until - self.tx_backlog

    # ------------------------------------------------------------------ send path

    def doorbell(self, endpoint: Endpoint) -> None:
        # _schedule_poll inlined (once per message): the same test and the same heap entry.
        when = self.world.now() + self.poll_latency
        poll_at = self._poll_at
        if poll_at is None or when < poll_at:
            self._poll_at = when
            self.world.call_at(when, self._poll, when)

    def _schedule_poll(self, when: float) -> None:
        if self._poll_at is None or when < self._poll_at:
            self._poll_at = when
            self.world.call_at(when, self._poll, when)

    def _poll(self, when: float) -> None:
        if self._poll_at != when:
            return  # superseded by an earlier poll
        self._poll_at = None
        # resume() inlined (once per message on a polling NI): the same loop.
        for endpoint in list(self.endpoints.values()):
            if endpoint.send_queue:
                self.service(endpoint)

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        world = self.world
        now = world.now()
        ready = self.tx_ready(now)
        if ready > now:
            self._schedule_poll(ready)
            return False
        destination, rx_key, tag = self.wire_tag(channel, endpoint)
        length = len(data)
        first_out, last_out, injected = self.tx_timing(length, now)
        # Positional arguments (source, destination, rx_key, payload, dest_offset, shape, tag):
        # cheaper than keywords on this per-message path.
        packet = Packet(
            self.name,
            destination,
            rx_key,
            bytes(data),  # the DMA reads the buffer before it is marked injected
            descriptor.dest_offset,
            self.wire_shape(length),
            tag,
        )
        world.call_at(injected, self._tx_done, endpoint, descriptor, length)
        self.fabric.transmit_from(self, packet, first_out, last_out)
        return True

    def _tx_done(self, endpoint: Endpoint, descriptor: SendDescriptor, length: int) -> None:
        self.injected(endpoint, descriptor, length)
        endpoint.notify_sent()

    # ------------------------------------------------------------------ receive path

    def arrive(self, packet: Packet, first_in: float, last_in: float) -> None:
        """The first unit of ``packet`` reached this NI (called at ``first_in``)."""
        done = self.rx_timing(packet, first_in, last_in)
        self.world.call_at(done, self._rx_done, packet)

    def _rx_done(self, packet: Packet) -> None:
        if packet.corrupted:
            # The AAL5 CRC (or Ethernet FCS) check fails: the whole message is dropped.
            self.drop(DropReason.CORRUPTED)
            return
        # deliver() inlined (once per message): the same look-up, drop and fill.
        entry = self.demux.get(packet.rx_key)
        if entry is None:
            self.dropped[DropReason.UNKNOWN_TAG] += 1
            return
        self.deliver_to(entry[0], entry[1], packet.payload, packet.dest_offset)
