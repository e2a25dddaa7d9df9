"""The in-process memory transport: U-Net between endpoints of one Python process.

Every node of a :class:`MemoryNetwork` has a :class:`MemoryNI`; a channel is named by the peer's
:class:`MemoryAddress` (node, port), and the NI demultiplexes arrivals by
(source node, source port, destination port), the way U-Net/FE uses MAC address and port
(paper 001 §3.1).  It offers base-level and direct-access U-Net (paper 000 §3.3, §3.6).

Data moves with one copy, the "DMA": from the sender's segment straight into the receiver's free
buffers (or inline in the receive descriptor when small).  In real time delivery is immediate
and synchronous; in a :class:`~stacklib.sim.Simulation` the network may add a fixed ``latency``
per message, and the data is captured when the message is injected.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import attrs

from stacklib.errors import ChannelError
from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.unet.endpoint import Channel, Endpoint
from stacklib.unet.ni import NetworkInterface, Payload
from stacklib.unet.node import Node, total_drops
from stacklib.unet.os_service import OSService, Policy
from stacklib.wire.descriptor import SendDescriptor


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

    def address_of(self, endpoint: Endpoint) -> MemoryAddress:
        return MemoryAddress(self.name, endpoint.port)

    def _tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, MemoryAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not a MemoryAddress")
        if remote.node not in self.network.nodes:
            raise ChannelError(f"{self!r} cannot reach {remote}: no such node")
        return remote, (remote.node, remote.port, endpoint.port)

    def _transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        destination: MemoryAddress = channel.tx_tag  # type: ignore[assignment]
        length = len(data)
        self.network._carry(
            destination,
            (self.name, endpoint.port, destination.port),
            data,
            descriptor.dest_offset,
        )
        self._injected(endpoint, descriptor, length)
        return True


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

    def _carry(
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
            self.world.call_after(self.latency, node.ni._deliver, rx_key, bytes(data), dest_offset)
        else:
            node.ni._deliver(rx_key, data, dest_offset)

    def inject(
        self, node: str, rx_key: Hashable, data: bytes, dest_offset: int | None = None
    ) -> None:
        """Put a raw message with an arbitrary tag on ``node``'s wire.

        For tests of protection: a forged or stale tag must be dropped and counted.
        """
        self.nodes[node].ni._deliver(rx_key, data, dest_offset)

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
