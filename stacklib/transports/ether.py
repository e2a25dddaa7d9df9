"""The ether transport: U-Net/FE frames on a real Ethernet segment through an AF_PACKET socket.

U-Net/FE (paper 001 §3) puts U-Net messages straight into Ethernet frames: a channel is the
remote host's MAC address and a one-byte U-Net port (paper 001 §3.1), and every frame has the
format of :mod:`stacklib.wire.unet_eth` (EtherType 0x88B5, 2-byte length, 1-byte port, padded
to 60 bytes).  A frame names only the destination port, so a node demultiplexes an arrival by
(source MAC, destination port): an endpoint holds at most one channel per remote host, as in
U-Net/FE.

Here each node owns one raw packet socket (``AF_PACKET``, ``SOCK_RAW``) bound to one interface
and to EtherType 0x88B5, so the kernel hands it only U-Net frames; every other EtherType is
filtered out before user space (no count).  The kernel still runs the driver and the socket
layer, a system call per frame (U-Net/FE's was a lighter fast trap, paper 003 Fig 3); the
Ethernet FCS is the NIC's and the kernel's business.  The socket is non-blocking and waited on
with ``trio.lowlevel.wait_readable`` (``trio.socket`` accepts AF_PACKET too, but the NI drains
every waiting frame per wake-up with plain calls), so polling, ``await recv()`` and upcalls
(:meth:`EtherNI.serve`) work as on every transport.  Arrivals that are not for this node are dropped
and counted: malformed frames (``malformed``), frames for a (source, port) without a channel
(``unknown-tag``), and frames for an endpoint whose receive queue is full (``recv-queue-full``:
Ethernet has no back-pressure).  Frames the kernel marks for another host (a promiscuous or
bridged interface) or as broadcast/multicast are counted in :attr:`EtherNI.ignored`.

Needs CAP_NET_RAW.  A real per-host transport cannot be built for a list of node names in one
process the way recipes build networks (:func:`_build` explains the constraint), so the API is
per process: ``EtherNetwork(interface).add_node(name)``, with the peer's address
(:class:`EtherAddress`: MAC and port) learned out of band.  The echo peer and the round-trip
benchmark live in :mod:`stacklib.bench.peers.ether`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Hashable, Sequence

import attrs
import trio

from stacklib.errors import ChannelError
from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.socket_ni import HandleNetwork, SocketNI
from stacklib.unet.endpoint import Channel, DropReason, Endpoint
from stacklib.unet.ni import Payload
from stacklib.unet.node import Node
from stacklib.unet.os_service import OSService, Policy
from stacklib.unet.polled import PolledEndpoint
from stacklib.wire import unet_eth
from stacklib.wire.descriptor import SendDescriptor

ETH_P_UNET = unet_eth.ETHERTYPE_UNET
MAX_MESSAGE = unet_eth.MAX_MESSAGE
#: ``sll_pkttype`` values (linux/if_packet.h).
PACKET_HOST, PACKET_OUTGOING = 0, 4
#: Not in Python's socket module: ask the kernel not to loop our own frames back (Linux 4.20).
_SOL_PACKET, _PACKET_IGNORE_OUTGOING = 263, 23
_PAD = unet_eth.MIN_FRAME - unet_eth.HEADER_SIZE
_pack_header = unet_eth.HEADER_CODEC.pack


@attrs.frozen
class EtherAddress:
    """An endpoint of the ether transport: its host's MAC address and its one-byte port."""

    mac: str
    port: int

    def __str__(self) -> str:
        return f"{self.mac}/{self.port}"


def remote_mac(ni: object, own_mac: bytes, endpoint: Endpoint, remote: object) -> bytes:
    """The MAC address of ``remote``, a U-Net/FE endpoint a channel from ``endpoint`` (of
    ``ni``, whose MAC is ``own_mac``) may reach; :class:`ChannelError` naming the problem
    otherwise (not an :class:`EtherAddress`, a bad MAC, a port beyond one byte, ourselves)."""
    if not isinstance(remote, EtherAddress):
        raise ChannelError(f"{ni!r} cannot reach {remote!r}: not an EtherAddress")
    try:
        mac = unet_eth.mac(remote.mac)
    except ValueError as error:
        raise ChannelError(f"{ni!r}: {error}") from None
    if not 0 <= remote.port <= 0xFF or not 0 <= endpoint.port <= 0xFF:
        raise ChannelError(f"{ni!r}: U-Net/FE ports are one byte, got {remote}")
    if mac == own_mac:
        raise ChannelError(f"{ni!r}: {remote} is this node's own MAC address")
    return mac


def open_packet_socket(interface: str, ethertype: int = ETH_P_UNET) -> socket.socket:
    """A non-blocking raw packet socket on ``interface`` receiving only ``ethertype`` frames."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ethertype))
    try:
        sock.setblocking(False)
        sock.bind((interface, ethertype))
        # An older kernel refuses it: outgoing frames are then filtered by pkttype instead.
        with contextlib.suppress(OSError):
            sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
    except BaseException:
        sock.close()
        raise
    return sock


class EtherNI(SocketNI):
    """The NI of one node: a raw packet socket on one interface."""

    kind = "ether"

    def __init__(self, name: str, host: Host, network: EtherNetwork) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=network.inline_threshold,
            max_message=MAX_MESSAGE,
            direct_access=False,
        )
        self.network = network
        self.interface = network.interface
        self._init_socket(open_packet_socket(self.interface))
        # The bound address holds the interface's MAC (correct in any namespace, unlike sysfs).
        self._mac_bytes = bytes(self.sock.getsockname()[4][:6])
        self.mac = unet_eth.mac_str(self._mac_bytes)
        self._buffer = bytearray(65536)  # an MTU above 1500 must not truncate a frame silently
        #: Frames the kernel refused for good (interface down): visible losses.
        self.lost = 0
        #: Frames for another host, broadcast or multicast: not U-Net traffic for this node.
        self.ignored = 0

    def address_of(self, endpoint: Endpoint) -> EtherAddress:
        return EtherAddress(self.mac, endpoint.port)

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        mac = remote_mac(self, self._mac_bytes, endpoint, remote)
        # Sent: destination MAC and port.  Received: source MAC and our port (paper 001 §3.1).
        return (mac, remote.port), (mac, endpoint.port)  # type: ignore[attr-defined]

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        tag: tuple[bytes, int] = channel.tx_tag  # type: ignore[assignment]
        mac, port = tag
        length = len(data)
        header = _pack_header(mac, self._mac_bytes, length, port)
        parts: list[Payload] = [header, data]
        if length < _PAD:
            parts.append(bytes(_PAD - length))  # the 60-byte minimum frame (paper 001 §3.2)
        try:
            self.sock.sendmsg(parts)
        except (BlockingIOError, InterruptedError):
            self._tx_blocked = True
            return False  # transmit queue full: back-pressure, retried by progress()
        except OSError as error:
            if error.errno == errno.ENOBUFS:
                self._tx_blocked = True
                return False
            if error.errno not in (errno.ENETDOWN, errno.ENXIO, errno.ENODEV):
                raise
            self.lost += 1
        self.injected(endpoint, descriptor, length)
        return True

    def progress(self) -> int:
        """Read every waiting frame and deliver it; retry sends the kernel refused."""
        delivered = 0
        buffer = self._buffer
        view = memoryview(buffer)
        recv = self.sock.recvfrom_into
        demux = self.demux
        while True:
            try:
                size, address = recv(buffer)
            except (BlockingIOError, InterruptedError):
                break
            if address[2] != PACKET_HOST:
                if address[2] != PACKET_OUTGOING:
                    self.ignored += 1
                continue
            try:
                frame = unet_eth.parse(view[:size], strict_min=False)
            except unet_eth.UNetEthFormatError:
                self.drop(DropReason.MALFORMED)
                continue
            key = (frame.src, frame.port)
            entry = demux.get(key)
            if entry is not None and entry[0].recv_queue.full:
                self.drop(DropReason.RECV_QUEUE_FULL, entry[0])
                continue
            self.deliver(key, frame.payload)
            delivered += 1
        if self._tx_blocked:
            self._tx_blocked = False
            self.resume()
        return delivered

    async def _wait_writable(self) -> None:
        # The packet socket has no writable edge for a full device queue everywhere; a short
        # sleep retries without spinning.
        with trio.move_on_after(0.001):
            await trio.lowlevel.wait_writable(self.sock)


class EtherEndpoint(PolledEndpoint):
    """An endpoint whose receive and send calls run the NI."""

    ni: EtherNI


EtherNI.endpoint_class = EtherEndpoint


class EtherNetwork(HandleNetwork):
    """This process's U-Net/FE node(s) on one Ethernet interface.

    Every host on the segment makes its own ``EtherNetwork`` on its interface and adds one node;
    channels name remote endpoints by :class:`EtherAddress`.  One node per interface: a second
    socket on the same interface would see the same frames under the same MAC, so the two nodes
    could not tell their traffic apart (separate processes on one interface share that problem:
    each counts the other's frames as ``unknown-tag``; a kernel filter per port would fix it).
    """

    kind = "ether"

    def __init__(
        self, interface: str, world: World | None = None, *, inline_threshold: int = 64
    ) -> None:
        self.world = world if world is not None else RealWorld()
        if self.world.virtual:
            raise ValueError("the ether transport runs in real time only")
        try:
            socket.if_nametoindex(interface)
        except OSError:
            raise ValueError(f"no network interface named {interface!r} here") from None
        self.interface = interface
        self.inline_threshold = inline_threshold
        self.nodes: dict[str, Node] = {}

    def add_node(
        self, name: str, profile: CostProfile | None = None, *, policy: Policy | None = None
    ) -> Node:
        """Add this host's node: a packet socket on the interface (needs CAP_NET_RAW)."""
        if self.nodes:
            raise ValueError(f"{self.interface} already has node {next(iter(self.nodes))!r}")
        host = Host(name, self.world, profile)
        ni = EtherNI(name, host, self)
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        return node


# ==================================================================== registration


@attrs.frozen
class EtherParams:
    """Recipe parameters of the ether transport."""

    interface: str = "eth0"
    #: The named network namespace this process must be in (checked; a process cannot switch
    #: safely once threads and trio run, so start it with ``ip netns exec NS``).
    namespace: str | None = None
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))


def in_namespace(name: str) -> bool:
    """Whether this process is in the named network namespace ``name`` (``ip netns``)."""
    try:
        wanted = os.stat(f"/run/netns/{name}")
    except OSError:
        return False
    current = os.stat("/proc/self/ns/net")
    return (wanted.st_dev, wanted.st_ino) == (current.st_dev, current.st_ino)


def check_one_node(transport: str, names: Sequence[str], namespace: str | None) -> None:
    """What a transport with one node per process (ether, xdp) asks of a recipe's network:
    one node, and this process in the recipe's ``namespace`` if it names one; ValueError
    naming the problem otherwise."""
    if len(names) != 1:
        raise ValueError(
            f"the {transport} transport builds one node per process (its interface's), got "
            f"{len(names)}; start the peers as separate processes on their own interfaces"
        )
    if namespace is not None and not in_namespace(namespace):
        raise ValueError(
            f"the {transport} transport wants namespace {namespace!r}: run this process with "
            f"`ip netns exec {namespace} ...`"
        )


def _build(
    world: World, params: EtherParams, names: Sequence[str], profile: CostProfile | None
) -> EtherNetwork:
    """Recipes build every node in one process; ether has one node per host (per interface),
    so only a one-node network can be built this way.  Its peers are other processes on other
    interfaces, started separately (``python -m stacklib.bench.peers.ether --peer``)."""
    check_one_node("ether", names, params.namespace)
    network = EtherNetwork(params.interface, world, inline_threshold=params.inline_threshold)
    network.add_node(names[0], profile)
    return network


register_transport(
    TransportKind(
        name="ether",
        Params=EtherParams,
        build=_build,
        description="U-Net/FE frames on raw Ethernet via AF_PACKET (needs CAP_NET_RAW)",
        clock="real",
        per_process=True,
    )
)
