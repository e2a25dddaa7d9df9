"""The in-process memory transport: U-Net between endpoints of one Python process.

Every node of a :class:`MemoryNetwork` has a :class:`MemoryNI`; a channel is named by the peer's
:class:`MemoryAddress` (node, port), and the NI demultiplexes arrivals by
(source node, source port, destination port), the way U-Net/FE uses MAC address and port
(paper 001 §3.1).  It offers base-level and direct-access U-Net (paper 000 §3.3, §3.6).

Data moves with one copy, the "DMA": from the sender's segment straight into the receiver's free
buffers (or inline in the receive descriptor when small).  In real time delivery is immediate
and synchronous; in a :class:`~stacklib.sim.Simulation` the network may add a fixed ``latency``
per message, and the data is captured when the message is injected.

Where delivery is immediate, a message-level send with nothing queued before it that fits one
send buffer takes a shorter path (:meth:`MemoryEndpoint.send_nowait`): the channel is checked as
the NI's validation would, then the caller's bytes are copied once, straight into the
receiver's free buffer, with no send buffer, no send descriptor in the queue and no second
validation; the descriptor is returned already injected.  Tags, demultiplexing, drops and
counters are exactly those of the queued path, which everything else (descriptor-level sends,
scatter-gather messages, direct access, a paused NI, a queue that is not empty, a simulated
latency, a buffer trace) still takes.  The receive side places a message that fits the first
free buffer, and returns that buffer on :meth:`MemoryEndpoint.poll`, without the general
multi-buffer code.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import attrs

from stacklib.errors import ChannelError, UNetError
from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.unet.endpoint import Channel, DropReason, Endpoint, EndpointConfig, Message
from stacklib.unet.ni import NetworkInterface, Payload
from stacklib.unet.node import Node, total_drops
from stacklib.unet.os_service import OSService, Policy, Principal
from stacklib.wire.descriptor import DescriptorStatus, RecvDescriptor, RecvKind, SendDescriptor

_INJECTED = DescriptorStatus.INJECTED
_BUFFERS = RecvKind.BUFFERS
_INLINE = RecvKind.INLINE


@attrs.frozen
class MemoryAddress:
    """Where an endpoint of the memory transport lives: a node name and a port."""

    node: str
    port: int

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


class MemoryNI(NetworkInterface):
    """The NI of one node of a :class:`MemoryNetwork`."""

    kind = "memory"

    def __init__(self, name: str, host: Host, network: MemoryNetwork) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=network.inline_threshold,
            max_message=network.max_message,
            alignment=network.alignment,
            direct_access=network.direct_access,
        )
        self.network = network
        #: Whether a message arrives during the send call (no simulated latency): the
        #: condition of the endpoints' one-copy send path.
        self.immediate = not (network.latency and network.world.virtual)

    def address_of(self, endpoint: Endpoint) -> MemoryAddress:
        return MemoryAddress(self.name, endpoint.port)

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, MemoryAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not a MemoryAddress")
        if remote.node not in self.network.nodes:
            raise ChannelError(f"{self!r} cannot reach {remote}: no such node")
        return remote, (remote.node, remote.port, endpoint.port)

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        destination: MemoryAddress = channel.tx_tag  # type: ignore[assignment]
        length = len(data)
        self.network.carry(
            destination,
            (self.name, endpoint.port, destination.port),
            data,
            descriptor.dest_offset,
        )
        self.injected(endpoint, descriptor, length)
        return True

    def deliver(self, rx_key: Hashable, data: Payload, dest_offset: int | None = None) -> None:
        """Demultiplex and place one arrival; the common case (a base-level message that fits
        the first free buffer) written out, everything else through the general fill."""
        entry = self.demux.get(rx_key)
        if entry is None:
            self.dropped[DropReason.UNKNOWN_TAG] += 1
            return
        endpoint, channel = entry
        length = len(data)
        recv_queue = endpoint.recv_queue
        if (
            dest_offset is not None
            or endpoint.closed
            or length > self.max_message
            or recv_queue.full
            or self.buffer_trace is not None
        ):
            self.deliver_to(endpoint, channel, data, dest_offset)  # to drop and count, or deposit
            return
        if length <= self.inline_threshold:
            recv_queue.push(RecvDescriptor(channel, length, _INLINE, inline=bytes(data)))
        else:
            free = endpoint.free_queue
            buffer = free.peek()
            if buffer is None:
                self.deliver_to(endpoint, channel, data, dest_offset)  # drops it, counted
                return
            offset, size = buffer
            segment = endpoint.segment
            if (
                size < length
                or offset < 0
                or offset + size > segment.size
                or offset & (segment.alignment - 1)
            ):
                # Several buffers, or a bad free-queue entry to drop and count: the general fill.
                self.deliver_to(endpoint, channel, data, dest_offset)
                return
            free.pop()
            segment.view[offset : offset + length] = data
            recv_queue.push(RecvDescriptor(channel, length, _BUFFERS, (buffer,)))
        endpoint.received += 1
        endpoint.received_bytes += length
        self.received += 1
        self.received_bytes += length
        endpoint.notify_arrived(length)


class MemoryEndpoint(Endpoint):
    """An endpoint of the memory transport: the one-copy message-level send (module docstring)
    and a receive that returns a single-buffer message's buffer without the general read."""

    def __init__(
        self,
        *,
        port: int,
        owner: Principal,
        ni: NetworkInterface,
        os_service: OSService,
        config: EndpointConfig,
    ) -> None:
        super().__init__(port=port, owner=owner, ni=ni, os_service=os_service, config=config)
        #: Per channel id: the channel, the receiving NI and the message's tag there.
        self._routes: dict[int, tuple[Channel, MemoryNI, tuple[str, int, int]]] = {}
        # The lengths that take the one-copy path: those the queued path would send inline or
        # from one send buffer (a message of several still goes through the queue, as a
        # scatter-gather descriptor), within the NI's maximum message.
        room = config.tx_buffer_size if config.tx_buffers else 0
        self._fast_limit = min(ni.max_message, max(room, ni.inline_threshold))

    def _route(self, channel: int) -> tuple[Channel, MemoryNI, tuple[str, int, int]] | None:
        """The receiving NI and tag of a registered channel (cached per channel), or None."""
        entry = self.channels.get(channel)
        if entry is None:
            return None
        route = self._routes.get(channel)
        if route is not None and route[0] is entry:
            return route
        destination = entry.tx_tag
        ni = self.ni
        if not isinstance(destination, MemoryAddress) or not isinstance(ni, MemoryNI):
            return None
        node = ni.network.nodes.get(destination.node)
        if node is None or not isinstance(node.ni, MemoryNI):
            return None
        route = (entry, node.ni, (ni.name, self.port, destination.port))
        self._routes[channel] = route
        return route

    def send_nowait(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        """Send now or raise :class:`trio.WouldBlock`, as :meth:`Endpoint.send_nowait`.

        With immediate delivery, nothing queued before it and no direct-access offset, the
        message goes straight into the receiver's buffers; the descriptor comes back injected.
        """
        ni: MemoryNI = self.ni  # type: ignore[assignment]
        if (
            dest_offset is None
            and ni.immediate
            and not self.send_queue
            and not ni.tx_paused
            and not self.closed
            and ni.buffer_trace is None
        ):
            route = self._routes.get(channel)
            if route is None or route[0] is not self.channels.get(channel):
                route = self._route(channel)
            length = len(data)
            if route is not None and length <= self._fast_limit:
                message = data if type(data) is bytes else bytes(data)
                route[1].deliver(route[2], message)
                self.sent += 1
                self.sent_bytes += length
                ni.sent += 1
                ni.sent_bytes += length
                if self._send_waiters.tasks or self.on_send_space is not None:
                    self.notify_sent()
                return SendDescriptor(channel, inline=message, status=_INJECTED)
        return super().send_nowait(channel, data, dest_offset=dest_offset)

    def poll(self) -> Message | None:
        """The next received message, or None (see :meth:`Endpoint.poll`)."""
        if self._upcall_error is not None:
            self._raise_upcall_error()
        descriptor = self.recv_queue.pop()
        if descriptor is None:
            return None
        kind = descriptor.kind
        if kind is _INLINE:
            return Message(descriptor.channel, descriptor.inline or b"", descriptor.dest_offset)
        fragments = descriptor.fragments
        if kind is _BUFFERS and len(fragments) == 1:
            buffer = fragments[0]
            offset = buffer[0]
            data = bytes(self.segment.view[offset : offset + descriptor.length])
            if not self.free_queue.push(buffer):
                raise UNetError(
                    "free queue overflow while releasing receive buffers: more buffers were "
                    "posted than the free queue holds"
                )
            return Message(descriptor.channel, data)
        data = self.read(descriptor)
        if fragments:
            self.release(descriptor)
        return Message(descriptor.channel, data, descriptor.dest_offset)


MemoryNI.endpoint_class = MemoryEndpoint


class MemoryNetwork:
    """A set of nodes whose NIs exchange messages in memory."""

    kind = "memory"

    def __init__(
        self,
        world: World | None = None,
        *,
        latency: float = 0.0,
        inline_threshold: int = 64,
        max_message: int = 65535,
        alignment: int = 8,
        direct_access: bool = True,
    ) -> None:
        if latency < 0:
            raise ValueError(f"latency must not be negative, got {latency}")
        self.world = world if world is not None else RealWorld()
        #: Seconds from injection to delivery; only a simulation can honour it.
        self.latency = latency
        self.inline_threshold = inline_threshold
        self.max_message = max_message
        self.alignment = alignment
        self.direct_access = direct_access
        self.nodes: dict[str, Node] = {}

    def add_node(
        self, name: str, profile: CostProfile | None = None, *, policy: Policy | None = None
    ) -> Node:
        """Add a node (host, NI, OS service) named ``name``."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        host = Host(name, self.world, profile)
        ni = MemoryNI(name, host, self)
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        return node

    def carry(
        self,
        destination: MemoryAddress,
        rx_key: tuple[str, int, int],
        data: Payload,
        dest_offset: int | None,
    ) -> None:
        node = self.nodes.get(destination.node)
        if node is None:
            return
        if self.latency and self.world.virtual:
            # The sender may reuse its buffer once the descriptor is injected: capture now.
            self.world.call_after(self.latency, node.ni.deliver, rx_key, bytes(data), dest_offset)
        else:
            node.ni.deliver(rx_key, data, dest_offset)

    def inject(
        self, node: str, rx_key: Hashable, data: bytes, dest_offset: int | None = None
    ) -> None:
        """Put a raw message with an arbitrary tag on ``node``'s wire.

        For tests of protection: a forged or stale tag must be dropped and counted.
        """
        self.nodes[node].ni.deliver(rx_key, data, dest_offset)

    def dropped(self) -> dict[str, int]:
        """Drops by reason summed over every NI of the network."""
        return total_drops(self.nodes.values())


@attrs.frozen
class MemoryParams:
    """Recipe parameters of the memory transport."""

    #: Delay from injection to delivery, honoured only in virtual time.
    latency_us: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    max_message: int = attrs.field(default=65535, validator=attrs.validators.ge(1))
    alignment: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    direct_access: bool = True


def _build(
    world: World, params: MemoryParams, names: Sequence[str], profile: CostProfile | None
) -> MemoryNetwork:
    network = MemoryNetwork(
        world,
        latency=params.latency_us * 1e-6,
        inline_threshold=params.inline_threshold,
        max_message=params.max_message,
        alignment=params.alignment,
        direct_access=params.direct_access,
    )
    for name in names:
        network.add_node(name, profile)
    return network


register_transport(
    TransportKind(
        name="memory",
        Params=MemoryParams,
        build=_build,
        description="in-process U-Net: one copy between segments, optional fixed latency",
    )
)
