"""The UDP transport: U-Net messages encapsulated in UDP/IPv4 datagrams.

Paper 003 §4.4.3 suggests encapsulating U-Net in IPv4 to cross routed networks.  Each node owns
one UDP socket; a channel is (remote IPv4 address, remote UDP port, remote U-Net port id).  Every
datagram carries this header in front of the message::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |    version    |     flags     |      destination port id      |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |        source port id         |        message length         |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

The NI demultiplexes by (source IP, source UDP port, source port id, destination port id), as
U-Net/FE does by MAC address and port (paper 001 §3.1); anything else is dropped and counted
(unknown tag, malformed, length mismatch).  :data:`HEADER` (construct) is the definition;
:data:`HEADER_FAST` is the struct-speed codec, proven equal by a property test.

The kernel is on this data path (that is the point of comparing it with shm).  It is UDP: a
datagram can be lost, and a loss the receiver can see (a socket buffer overflow is not visible
from user space) is counted; a send the kernel refuses for lack of buffer space is
back-pressure, retried when the socket is writable.  Sockets are non-blocking and waited on with
trio (``trio.lowlevel.wait_readable``), so the same endpoint API as every transport applies:
polling, ``await recv()`` and upcalls via :meth:`UdpNI.serve`.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from collections.abc import Hashable, Sequence

import attrs
import construct as c

from stacklib.errors import ChannelError, FormatError
from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.socket_ni import HandleNetwork, SocketNI
from stacklib.unet.endpoint import Channel, DropReason, Endpoint
from stacklib.unet.ni import Payload
from stacklib.unet.node import Node
from stacklib.unet.os_service import OSService, Policy
from stacklib.unet.polled import PolledEndpoint
from stacklib.wire.descriptor import SendDescriptor

VERSION = 1
#: The header as a construct definition: the single source of truth for the format.
HEADER = c.Struct(
    "version" / c.Const(VERSION, c.Int8ub),
    "flags" / c.Int8ub,
    "dst_port" / c.Int16ub,
    "src_port" / c.Int16ub,
    "length" / c.Int16ub,
)
#: The same layout as a struct, for the per-message path.
HEADER_FAST = struct.Struct("!BBHHH")
HEADER_SIZE = HEADER_FAST.size
#: Largest message: a UDP/IPv4 datagram's 65507-byte payload less this header.
MAX_MESSAGE = 65507 - HEADER_SIZE


class UdpFormatError(FormatError):
    """udp transport: a datagram that is not a well-formed U-Net/UDP message."""


@attrs.frozen
class UdpHeader:
    """A parsed header."""

    dst_port: int
    src_port: int
    length: int
    flags: int = 0


def build(header: UdpHeader, payload: bytes = b"") -> bytes:
    """Header then payload (the fast codec)."""
    return (
        HEADER_FAST.pack(VERSION, header.flags, header.dst_port, header.src_port, header.length)
        + payload
    )


def parse(datagram: bytes | bytearray | memoryview) -> tuple[UdpHeader, memoryview]:
    """Header and payload of a datagram; :class:`UdpFormatError` if malformed.

    Integrity first (long enough, length matches), then sanity (version).
    """
    if len(datagram) < HEADER_SIZE:
        raise UdpFormatError(f"udp: {len(datagram)}-byte datagram is shorter than the header")
    version, flags, dst, src, length = HEADER_FAST.unpack_from(datagram)
    if length != len(datagram) - HEADER_SIZE:
        raise UdpFormatError(
            f"udp: header says {length} bytes, datagram holds {len(datagram) - HEADER_SIZE}"
        )
    if version != VERSION:
        raise UdpFormatError(f"udp: version {version}, expected {VERSION}")
    return UdpHeader(dst, src, length, flags), memoryview(datagram)[HEADER_SIZE:]


@attrs.frozen
class UdpAddress:
    """An endpoint of the udp transport: IPv4 address, UDP port of its node, U-Net port id."""

    host: str
    udp_port: int
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.udp_port}/{self.port}"


class UdpNI(SocketNI):
    """The NI of one node: one non-blocking UDP socket."""

    kind = "udp"

    def __init__(self, name: str, host: Host, network: UdpNetwork, bind: tuple[str, int]) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=network.inline_threshold,
            max_message=network.max_message,
            direct_access=False,
        )
        self.network = network
        self._init_socket(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        self.sock.setblocking(False)
        self.sock.bind(bind)
        self.local = self.sock.getsockname()
        self.spin_time = network.spin_time
        #: Datagrams the kernel reported lost or refused (visible losses only).
        self.lost = 0

    def address_of(self, endpoint: Endpoint) -> UdpAddress:
        return UdpAddress(self.local[0], self.local[1], endpoint.port)

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, UdpAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not a UdpAddress")
        try:
            host = str(ipaddress.IPv4Address(remote.host))
        except ValueError:
            raise ChannelError(f"{self!r}: {remote.host!r} is not an IPv4 address") from None
        if not (0 < remote.udp_port < 1 << 16 and 0 <= remote.port < 1 << 16):
            raise ChannelError(f"{self!r}: bad UDP port or port id in {remote}")
        return (host, remote.udp_port, remote.port), (
            host,
            remote.udp_port,
            remote.port,
            endpoint.port,
        )

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        tag: tuple[str, int, int] = channel.tx_tag  # type: ignore[assignment]
        host, udp_port, port = tag
        header = HEADER_FAST.pack(VERSION, 0, port, endpoint.port, len(data))
        try:
            self.sock.sendmsg([header, data], [], 0, (host, udp_port))
        except BlockingIOError:
            self._tx_blocked = True
            return False  # socket buffer full: back-pressure, retried by progress()
        except OSError as error:
            # ECONNREFUSED and friends: a loss the kernel made visible.
            if error.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                raise
            self.lost += 1
        self.injected(endpoint, descriptor, len(data))
        return True

    def progress(self) -> int:
        """Read every waiting datagram and deliver it; retry sends the kernel refused."""
        delivered = 0
        recvfrom = self.sock.recvfrom
        while True:
            try:
                datagram, (src_host, src_udp) = recvfrom(65535)
            except BlockingIOError:
                break
            except OSError:
                self.lost += 1  # an ICMP error for an earlier send surfaced here
                continue
            try:
                header, payload = parse(datagram)
            except UdpFormatError:
                self.drop(DropReason.MALFORMED)
                continue
            key = (src_host, src_udp, header.src_port, header.dst_port)
            entry = self.demux.get(key)
            if entry is not None and entry[0].recv_queue.full:
                # No room: this is a loss (UDP has no back-pressure across the network).
                self.drop(DropReason.RECV_QUEUE_FULL, entry[0])
                continue
            self.deliver(key, payload)
            delivered += 1
        if self._tx_blocked:
            self._tx_blocked = False
            self.resume()
        return delivered


class UdpEndpoint(PolledEndpoint):
    """An endpoint whose receive and send calls run the NI."""

    ni: UdpNI


UdpNI.endpoint_class = UdpEndpoint


class UdpNetwork(HandleNetwork):
    """Nodes, each with a UDP socket on ``host`` (by default 127.0.0.1, kernel-chosen ports)."""

    kind = "udp"

    def __init__(
        self,
        world: World | None = None,
        *,
        host: str = "127.0.0.1",
        max_message: int = MAX_MESSAGE,
        inline_threshold: int = 64,
        spin_time: float = 0.0,
    ) -> None:
        self.world = world if world is not None else RealWorld()
        if self.world.virtual:
            raise ValueError("the udp transport runs in real time only")
        if not 0 < max_message <= MAX_MESSAGE:
            raise ValueError(f"max_message must lie in 1..{MAX_MESSAGE}")
        self.host = host
        self.max_message = max_message
        self.inline_threshold = inline_threshold
        self.spin_time = spin_time
        self.nodes: dict[str, Node] = {}

    def add_node(
        self,
        name: str,
        profile: CostProfile | None = None,
        *,
        policy: Policy | None = None,
        udp_port: int = 0,
    ) -> Node:
        """Add a node with its own socket bound to (host, ``udp_port``)."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        host = Host(name, self.world, profile)
        ni = UdpNI(name, host, self, (self.host, udp_port))
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        return node


@attrs.frozen
class UdpParams:
    """Recipe parameters of the udp transport."""

    host: str = "127.0.0.1"
    max_message: int = attrs.field(default=MAX_MESSAGE, validator=attrs.validators.ge(1))
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))


def _build(
    world: World, params: UdpParams, names: Sequence[str], profile: CostProfile | None
) -> UdpNetwork:
    network = UdpNetwork(
        world,
        host=params.host,
        max_message=params.max_message,
        inline_threshold=params.inline_threshold,
    )
    for name in names:
        network.add_node(name, profile)
    return network


register_transport(
    TransportKind(
        name="udp",
        Params=UdpParams,
        build=_build,
        description="U-Net messages in UDP/IPv4 datagrams (kernel sockets; loss possible)",
        clock="real",
    )
)
