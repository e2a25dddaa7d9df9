"""The trio drivers of IP: ``"ip"`` over U-Net channels and ``"ip-ether"`` over Ethernet frames.

**Over U-Net** (:class:`IpLayer`, paper 000 §7.1): every U-Net channel is a point-to-point link
to one peer, and "a single channel is used to carry all IP traffic between two applications".
The address plan is explicit: ``address`` is this host's IPv4 address and ``peers`` maps each
peer's address to the channel (peer id of the datagram service below) that reaches it, e.g. in
a recipe::

    [[layers]]
    kind = "ip"
    address = "10.0.0.1"
    peers = { "10.0.0.2" = 0 }

With ``learn_peers`` (the default) a valid packet from an unknown source address arriving on
channel c also adds (source -> c), so a server needs no table of its clients; a peer can be
added later with :meth:`IpStack.add_peer`.  The MTU of a channel is ``mtu`` (9180: paper 000
§7.5 "IP over U-Net exports an MTU of 9Kbytes"; 9180 is RFC 1626's IP-over-AAL5 default) capped
by the largest message the service below carries (1497 bytes on U-Net/FE, paper 003 §4.4.2).

**Over Ethernet** (:class:`IpEtherLayer`): IP with ARP (:class:`~stacklib.layers.ip.machine.
ArpCache`) over a :class:`~stacklib.layers.ip.service.FrameService` (a TAP device, for one), so
a real host can ping it: ICMP echo requests are answered (both modes).  Every destination is
on-link (no routing table, no gateway).

Common to both (paper 000 §7.5): the receive side is liberal and reassembles fragments
(:class:`~stacklib.layers.ip.machine.Reassembler`).  A packet that fits the MTU goes out whole
with DF set, as paper 000's IP over U-Net sends everything; a larger datagram (up to 65,535
bytes) is cut into fragments by :func:`~stacklib.layers.ip.machine.fragment` (counted:
``fragmented`` datagrams, ``fragments_sent``), unless the sender asked for DF
(``send(..., dont_fragment=True)``), which raises :class:`~stacklib.layers.ip.machine.
FragmentationNeeded` naming the size and the MTU.  No forwarding: packets for other addresses
are dropped (``not_for_us``).  Malformed input is dropped and counted by reason
(``statistics()["dropped"]``).  Transport protocols receive through
:meth:`IpStack.open_protocol`; a protocol nobody opened is dropped (``no_protocol``).  Tasks: a
receive loop, and a timer task for reassembly (and ARP) deadlines.
Any task may send: the services below accept concurrent senders.
"""

from __future__ import annotations

import abc
import functools
import math
import socket
import typing
from collections.abc import AsyncIterator, Callable, Container, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.lowlevel

from stacklib.errors import AssemblyError, LocalProtocolError
from stacklib.layers.ip.machine import ArpCache, Reassembler, fragment
from stacklib.layers.ip.service import FrameService, IpService, ProtocolEndpoint
from stacklib.layers.ip.wire import (
    BROADCAST_MAC,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    IPV4_HEADER_SIZE,
    MAX_PACKET,
    ArpFormatError,
    EthernetFormatError,
    EthernetFrame,
    IcmpFormatError,
    IcmpMessage,
    IcmpType,
    IpProtocol,
    Ipv4FormatError,
    Ipv4Packet,
    address_sum,
    build_ethernet,
    build_icmp,
    build_ipv4,
    build_ipv4_simple,
    build_ipv4_summed,
    ip_bytes,
    parse_arp,
    parse_ethernet,
    parse_icmp,
    parse_ipv4,
    parse_ipv4_simple,
)
from stacklib.services import DatagramService, Service
from stacklib.sim.costs import cited
from stacklib.stack import Layer, register_layer, serve
from stacklib.unet.endpoint import Endpoint

if TYPE_CHECKING:
    from stacklib.sim.costs import ProtocolCosts
    from stacklib.sim.resources import Resource

__all__ = [
    "IpEtherLayer",
    "IpEtherParams",
    "IpEtherStack",
    "IpLayer",
    "IpParams",
    "IpStack",
    "UNetIpStack",
]

_Buffer = bytes | bytearray | memoryview
_LIMITED_BROADCAST = "255.255.255.255"
_ICMP = int(IpProtocol.ICMP)
#: Dotted quads of the 4-byte source addresses seen (the receive path's fast case).
_dotted = functools.lru_cache(maxsize=1024)(socket.inet_ntoa)
#: Packets IP takes per wake-up of its receive task beyond the first, when no host is modeled.
_RECEIVE_BATCH = 64
_Reply = tuple[str, IcmpMessage]  # (destination, echo reply)


def _address(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    ip_bytes(value)  # ValueError names the bad value


def _int_in(low: int, high: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{attribute.name} must be an integer in {low}..{high}, got {value!r}")

    return check


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _peer_table(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{attribute.name} must be a table of address = channel")
    for address, channel in value.items():
        ip_bytes(address)
        if isinstance(channel, bool) or not isinstance(channel, int) or channel < 0:
            raise ValueError(f"{attribute.name}: channel of {address} must be an int >= 0")


@attrs.frozen
class IpParams:
    """Parameters of IP over U-Net (``[[layers]] kind = "ip"``)."""

    #: This host's IPv4 address.
    address: str = attrs.field(default="10.0.0.1", validator=_address)
    #: Peer address -> channel (the peer id of the datagram service below).
    peers: dict[str, int] = attrs.field(factory=dict, validator=_peer_table)
    #: Add (source -> channel) when a valid packet arrives from an unknown source.
    learn_peers: bool = True
    #: Largest packet per channel, header included (capped by the service below).
    mtu: int = cited(
        9180,
        "paper 000 §7.5: 'IP over U-Net exports an MTU of 9Kbytes' (9180: RFC 1626's default "
        "for IP over AAL5)",
        "bytes",
        validator=_int_in(68, 65535),
    )
    #: Time to live of packets sent (Linux's default).
    ttl: int = attrs.field(default=64, validator=_int_in(1, 255))
    #: Datagrams waiting per protocol endpoint before more are dropped (``protocol_queue_full``).
    protocol_queue: int = attrs.field(default=256, validator=_int_in(1, 1 << 20))
    #: Seconds a fragmented datagram may take to complete (Linux's ipfrag_time).
    reassembly_timeout: float = attrs.field(default=30.0, validator=_positive)
    reassembly_max_datagrams: int = attrs.field(default=64, validator=_int_in(1, 1 << 16))
    reassembly_max_bytes: int = attrs.field(default=1 << 20, validator=_int_in(1, 1 << 30))
    #: Answer ICMP echo requests (ping).
    answer_ping: bool = True


@attrs.frozen
class IpEtherParams:
    """Parameters of IP over Ethernet frames (``[[layers]] kind = "ip-ether"``)."""

    address: str = attrs.field(default="10.0.0.1", validator=_address)
    #: Largest packet; 0 means the frame service's MTU (1500 on Ethernet).
    mtu: int = attrs.field(default=0, validator=_int_in(0, 65535))
    ttl: int = attrs.field(default=64, validator=_int_in(1, 255))
    protocol_queue: int = attrs.field(default=256, validator=_int_in(1, 1 << 20))
    reassembly_timeout: float = attrs.field(default=30.0, validator=_positive)
    reassembly_max_datagrams: int = attrs.field(default=64, validator=_int_in(1, 1 << 16))
    reassembly_max_bytes: int = attrs.field(default=1 << 20, validator=_int_in(1, 1 << 30))
    answer_ping: bool = True
    #: Seconds an ARP entry lives after it was last confirmed.
    arp_lifetime: float = attrs.field(default=60.0, validator=_positive)
    #: Seconds between ARP requests for an unresolved address, and how many retries.
    arp_retry_interval: float = attrs.field(default=1.0, validator=_positive)
    arp_max_retries: int = attrs.field(default=3, validator=_int_in(0, 100))
    #: Packets queued per unresolved address.
    arp_max_pending: int = attrs.field(default=16, validator=_int_in(1, 1 << 16))


class _Endpoint(ProtocolEndpoint):
    def __init__(self, stack: IpStack, protocol: int, capacity: int) -> None:
        self.protocol = protocol
        self._stack = stack
        self._send, self._recv = trio.open_memory_channel[tuple[str, str, bytes]](capacity)
        self._handler: Callable[[str, str, bytes], None] | None = None

    async def recv(self) -> tuple[str, str, bytes]:
        return await self._recv.receive()

    def set_handler(self, handler: Callable[[str, str, bytes], None] | None) -> None:
        """Have IP call ``handler(source, destination, payload)`` for each datagram, in its own
        receive task, instead of queueing it for :meth:`recv` (None: queue again).

        For a transport whose input never blocks (TCP's demultiplexer): one task hand-off less
        per datagram, which on a fast link is a large part of its cost.  ``handler`` must not
        raise for bad input.
        """
        self._handler = handler

    def close(self) -> None:
        if self._stack._protocols.get(self.protocol) is self:
            del self._stack._protocols[self.protocol]
        self._send.close()
        self._recv.close()


class IpStack(IpService):
    """What the IP layers share: receive path, reassembly, ICMP echo, protocol endpoints."""

    def __init__(
        self,
        address: str,
        *,
        ttl: int,
        protocol_queue: int,
        answer_ping: bool,
        reassembler: Reassembler,
    ) -> None:
        self._address = address
        self._address_bytes = ip_bytes(address)
        self._ttl = ttl
        self._protocol_queue = protocol_queue
        self._answer_ping = answer_ping
        self._reassembler = reassembler
        self._protocols: dict[int, _Endpoint] = {}
        self._next_id = 0
        self._closed = False
        self._kick_event = trio.Event()
        self._counts = dict.fromkeys(
            (
                "sent",
                "sent_bytes",
                "received",
                "delivered",
                "echo_requests",
                "echo_replies",
                "reassembled",
                "fragmented",
                "fragments_sent",
            ),
            0,
        )
        self._dropped: dict[str, int] = {}
        #: Sources whose route needs no learning (a link with routes points it at its table).
        self._known: Container[str] = ()

    # ------------------------------------------------------------------ the service

    @property
    def address(self) -> str:
        return self._address

    async def send(
        self,
        dst: str,
        protocol: int,
        payload: _Buffer,
        *,
        ttl: int | None = None,
        dont_fragment: bool = False,
    ) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise trio.ClosedResourceError("the IP layer is closed")
        ident = self._next_id
        packets = self._packets(dst, protocol, payload, ttl, ident, dont_fragment)
        self._next_id = (ident + 1) & 0xFFFF
        counts = self._counts
        counts["sent"] += 1
        if len(packets) > 1:
            counts["fragmented"] += 1
            counts["fragments_sent"] += len(packets)
        for packet in packets:
            counts["sent_bytes"] += len(packet)
            if dst == self._address:
                reply = self._input(packet, None)  # loopback
                if reply is not None:
                    await self._answer(reply)
            else:
                await self._transmit(dst, packet)
        if dst == self._address:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def send_nowait(
        self, dst: str, protocol: int, payload: _Buffer, *, ttl: int | None = None
    ) -> None:
        """Send like :meth:`send` if the link takes the packet at once, without blocking or
        yielding to other tasks; otherwise raise :class:`trio.WouldBlock` having sent nothing
        (the caller then uses :meth:`send`).  Errors as :meth:`send`.

        For a transport with its own output queue (TCP): a segment goes out from the task that
        made it rather than through a sender task, a task hand-off less per segment.  Loopback,
        a datagram that needs fragmenting and links that cannot send without waiting (ARP, a
        modeled host CPU) always block.
        """
        if self._closed:
            raise trio.ClosedResourceError("the IP layer is closed")
        if dst == self._address:
            raise trio.WouldBlock  # loopback may answer a ping, which may wait: use send()
        ident = self._next_id
        packets = self._packets(dst, protocol, payload, ttl, ident, False)
        if len(packets) != 1 or not self._transmit_nowait(dst, packets[0]):
            raise trio.WouldBlock
        self._next_id = (ident + 1) & 0xFFFF
        self._counts["sent"] += 1
        self._counts["sent_bytes"] += len(packets[0])

    def _packets(
        self,
        dst: str,
        protocol: int,
        payload: _Buffer,
        ttl: int | None,
        ident: int,
        dont_fragment: bool,
    ) -> list[bytes]:
        """The packets that carry one datagram: a single packet when it fits the MTU (sent
        with DF set, the fast path), else its fragments (RFC 791 §3.2)."""
        mtu = self.mtu(dst)
        total = IPV4_HEADER_SIZE + len(payload)
        ttl = self._ttl if ttl is None else ttl
        if total <= mtu:
            return [
                build_ipv4_simple(self._address_bytes, ip_bytes(dst), protocol, payload, ttl, ident)
            ]
        if total > MAX_PACKET:
            raise LocalProtocolError(
                f"IP: datagram of {total} bytes to {dst} exceeds IPv4's limit of {MAX_PACKET} "
                f"bytes (at most {MAX_PACKET - IPV4_HEADER_SIZE} bytes of payload)"
            )
        datagram = Ipv4Packet(
            self._address,
            dst,
            protocol,
            bytes(payload),
            ttl,
            identification=ident,
            dont_fragment=dont_fragment,
        )
        return [build_ipv4(piece) for piece in fragment(datagram, mtu)]

    def open_protocol(self, protocol: int) -> ProtocolEndpoint:
        if isinstance(protocol, bool) or not isinstance(protocol, int) or not 0 <= protocol <= 255:
            raise LocalProtocolError(f"IP: protocol {protocol!r} is not in 0..255")
        if protocol in self._protocols:
            raise LocalProtocolError(f"IP: protocol {protocol} is already open")
        endpoint = _Endpoint(self, protocol, self._protocol_queue)
        self._protocols[protocol] = endpoint
        if self._closed:
            endpoint._send.close()
        return endpoint

    def statistics(self) -> Mapping[str, object]:
        """Counters: sent, received, delivered, dropped by reason, reassembly (and ARP)."""
        return {
            **self._counts,
            "dropped": dict(sorted(self._dropped.items())),
            "reassembly": self._reassembler.statistics(),
        }

    # ------------------------------------------------------------------ link hooks

    @abc.abstractmethod
    async def _transmit(self, dst: str, packet: bytes) -> None:
        """Send a whole IP packet towards ``dst`` on the link."""

    def _transmit_nowait(self, dst: str, packet: bytes) -> bool:
        """Send a whole IP packet now if the link takes it without waiting; False (nothing
        sent) otherwise.  By default a link always waits: :meth:`_transmit`."""
        return False

    def _link_timer(self) -> float | None:
        return None

    async def _link_handle_timer(self, now: float) -> None:
        return None

    # ------------------------------------------------------------------ receive path

    def _drop(self, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def _input(self, data: _Buffer, channel: int | None) -> _Reply | None:
        """Process one received packet; returns an echo reply to send, if any.

        Never raises for bad input: every rejection is counted in ``dropped``.
        """
        self._counts["received"] += 1
        if type(data) is bytes:
            # The common case in one step: a whole packet for us, for a protocol with a handler.
            simple = parse_ipv4_simple(data)
            if simple is not None and simple[1] == self._address_bytes and simple[2] != _ICMP:
                endpoint = self._protocols.get(simple[2])
                handler = endpoint._handler if endpoint is not None else None
                if handler is not None:
                    src = _dotted(simple[0])
                    if channel is not None and src not in self._known:
                        self._learn(src, channel)
                    self._counts["delivered"] += 1
                    handler(src, self._address, simple[3])
                    return None
        try:
            packet = parse_ipv4(data)
        except Ipv4FormatError as error:
            self._drop(error.kind.name.lower())
            return None
        if packet.dst != self._address and packet.dst != _LIMITED_BROADCAST:
            self._drop("not_for_us")  # no forwarding (paper 000 §7.5)
            return None
        if channel is not None:
            self._learn(packet.src, channel)
        if packet.is_fragment:
            whole = self._reassembler.receive(packet, trio.current_time())
            self._kick()  # a new reassembly deadline, perhaps
            if whole is None:
                return None
            self._counts["reassembled"] += 1
            packet = whole
        if packet.protocol == IpProtocol.ICMP and self._answer_ping:
            try:
                message = parse_icmp(packet.payload)
            except IcmpFormatError as error:
                self._drop(f"icmp_{error.kind.name.lower()}")
                return None
            if message.type == IcmpType.ECHO_REQUEST and message.code == 0:
                self._counts["echo_requests"] += 1
                return packet.src, IcmpMessage(IcmpType.ECHO_REPLY, 0, message.rest, message.data)
            # Anything else (an echo reply, an error) goes to whoever opened ICMP.
        endpoint = self._protocols.get(packet.protocol)
        if endpoint is None:
            self._drop("no_protocol")
            return None
        handler = endpoint._handler
        if handler is not None:
            self._counts["delivered"] += 1
            handler(packet.src, packet.dst, packet.payload)
            return None
        try:
            endpoint._send.send_nowait((packet.src, packet.dst, packet.payload))
        except trio.WouldBlock:
            self._drop("protocol_queue_full")
            return None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._drop("no_protocol")
            return None
        self._counts["delivered"] += 1
        return None

    async def _answer(self, reply: _Reply) -> None:
        dst, message = reply
        try:
            await self.send(dst, IpProtocol.ICMP, build_icmp(message))
        except LocalProtocolError:
            self._drop("echo_unanswerable")  # too big for the MTU back, or no route
            return
        self._counts["echo_replies"] += 1

    def _learn(self, src: str, channel: int) -> None:
        return None

    # ------------------------------------------------------------------ tasks and helpers

    def _kick(self) -> None:
        self._kick_event.set()

    async def _timer_loop(self) -> None:
        while True:
            kick = self._kick_event = trio.Event()
            deadline = math.inf
            for timer in (self._reassembler.get_timer(), self._link_timer()):
                if timer is not None:
                    deadline = min(deadline, timer)
            with trio.move_on_at(deadline):
                await kick.wait()
            now = trio.current_time()
            timer = self._reassembler.get_timer()
            if timer is not None and timer <= now:
                self._reassembler.handle_timer(now)
            await self._link_handle_timer(now)

    def _close(self) -> None:
        self._closed = True
        for endpoint in self._protocols.values():
            endpoint._send.close()


class UNetIpStack(IpStack):
    """IP over a datagram service whose peers are point-to-point links (U-Net channels)."""

    def __init__(self, below: DatagramService, params: IpParams) -> None:
        super().__init__(
            params.address,
            ttl=params.ttl,
            protocol_queue=params.protocol_queue,
            answer_ping=params.answer_ping,
            reassembler=Reassembler(
                timeout=params.reassembly_timeout,
                max_datagrams=params.reassembly_max_datagrams,
                max_bytes=params.reassembly_max_bytes,
            ),
        )
        self._below = below
        self._params = params
        self._routes: dict[str, int] = dict(params.peers)
        self._known = self._routes
        #: Per peer of send_nowait: (channel, address as 4 bytes, the addresses' word sum).
        self._fast: dict[str, tuple[int, bytes, int]] = {}
        self._mtu = min(params.mtu, below.max_message)
        self._cpu: Resource | None = None
        self._copy = 0.0
        self._protocol: ProtocolCosts | None = None
        # The endpoint to send on without waiting (send_nowait), when nothing is modeled.
        self._nowait: Endpoint | None = None
        # What the service below lends (raw U-Net lends its endpoint): the host to charge,
        # and an endpoint to post to directly.
        endpoint = below.capability(Endpoint)
        if endpoint is not None:
            ni = endpoint.ni
            if ni.host_copy_per_byte > 0:
                self._cpu = ni.host.resource("cpu")
                self._copy = ni.host_copy_per_byte
                self._protocol = ni.host_protocol
            elif ni.host_send_cost is None:
                self._nowait = endpoint

    def __repr__(self) -> str:
        return f"<IP {self._address} over {self._below!r}, {len(self._routes)} peers>"

    @property
    def routes(self) -> Mapping[str, int]:
        """Peer address -> channel, as configured and learned."""
        return dict(self._routes)

    def neighbors(self) -> Mapping[str, int]:
        """The routes, live (no copy: the datagram face of UDP reads it per datagram)."""
        return self._routes

    def add_peer(self, address: str, channel: int) -> None:
        """Reach ``address`` through ``channel`` (replaces an existing entry)."""
        ip_bytes(address)
        if channel not in self._below.peers:
            raise LocalProtocolError(
                f"IP: no channel {channel} below (channels: {list(self._below.peers)})"
            )
        self._routes[address] = channel
        self._fast.clear()

    def mtu(self, peer: str) -> int:
        if peer != self._address and peer not in self._routes:
            ip_bytes(peer)  # a malformed address is a ValueError, not an unknown peer
            raise LocalProtocolError(
                f"IP: no channel to {peer} (known peers: {sorted(self._routes) or 'none'})"
            )
        return self._mtu

    @property
    def modeled_cpu(self) -> Resource | None:
        return self._cpu

    @property
    def modeled_copy_per_byte(self) -> float:
        return self._copy

    @property
    def modeled_protocol(self) -> ProtocolCosts | None:
        return self._protocol

    async def _transmit(self, dst: str, packet: bytes) -> None:
        await self._below.send(self._routes[dst], packet)

    def send_nowait(
        self, dst: str, protocol: int, payload: _Buffer, *, ttl: int | None = None
    ) -> None:
        """:meth:`IpStack.send_nowait` with the route's constants cached per peer: the channel,
        the address bytes and their header-checksum sum (what TCP sends every segment by)."""
        endpoint = self._nowait
        route = self._fast.get(dst)
        if route is None:
            if endpoint is None or dst == self._address or dst not in self._routes:
                super().send_nowait(dst, protocol, payload, ttl=ttl)  # blocks, or raises
                return
            dst_bytes = ip_bytes(dst)
            route = (self._routes[dst], dst_bytes, address_sum(self._address_bytes, dst_bytes))
            self._fast[dst] = route
        size = IPV4_HEADER_SIZE + len(payload)
        if self._closed or endpoint is None or size > self._mtu:
            super().send_nowait(dst, protocol, payload, ttl=ttl)  # raises (WouldBlock if big)
            return
        ident = self._next_id
        channel, dst_bytes, addresses = route
        packet = build_ipv4_summed(
            self._address_bytes,
            dst_bytes,
            addresses,
            protocol,
            payload,
            self._ttl if ttl is None else ttl,
            ident,
        )
        endpoint.send_nowait(channel, packet)  # trio.WouldBlock: nothing was sent
        self._next_id = (ident + 1) & 0xFFFF
        counts = self._counts
        counts["sent"] += 1
        counts["sent_bytes"] += size

    def _transmit_nowait(self, dst: str, packet: bytes) -> bool:
        endpoint = self._nowait
        if endpoint is None:
            return False
        try:
            endpoint.send_nowait(self._routes[dst], packet)
        except trio.WouldBlock:
            return False
        return True

    def _learn(self, src: str, channel: int) -> None:
        if self._params.learn_peers and src not in self._routes and src != _LIMITED_BROADCAST:
            self._routes[src] = channel
            self._fast.clear()

    async def _receive_loop(self) -> None:
        below = self._below
        endpoint = self._nowait
        while True:
            try:
                channel, data = await below.recv()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                self._close()
                return
            reply = self._input(data, channel)
            if reply is not None:
                await self._answer(reply)
            if endpoint is None:
                continue
            # Nothing modeled: take what else has arrived in the same wake-up (at most a
            # batch, so other tasks still run), a scheduler round less per packet.
            for _ in range(_RECEIVE_BATCH):
                message = endpoint.poll()
                if message is None:
                    break
                reply = self._input(message.data, message.channel)
                if reply is not None:
                    await self._answer(reply)


class IpEtherStack(IpStack):
    """IP with ARP over an Ethernet :class:`FrameService`."""

    def __init__(self, below: FrameService, params: IpEtherParams) -> None:
        super().__init__(
            params.address,
            ttl=params.ttl,
            protocol_queue=params.protocol_queue,
            answer_ping=params.answer_ping,
            reassembler=Reassembler(
                timeout=params.reassembly_timeout,
                max_datagrams=params.reassembly_max_datagrams,
                max_bytes=params.reassembly_max_bytes,
            ),
        )
        self._below = below
        self._mac = bytes(below.mac)
        self._mtu = min(params.mtu or below.mtu, below.mtu)
        self.arp = ArpCache(
            self._mac,
            params.address,
            entry_lifetime=params.arp_lifetime,
            retry_interval=params.arp_retry_interval,
            max_retries=params.arp_max_retries,
            max_pending=params.arp_max_pending,
        )

    def __repr__(self) -> str:
        return f"<IP {self._address} ({self._mac.hex(':')}) over {self._below!r}>"

    def mtu(self, peer: str) -> int:
        ip_bytes(peer)
        return self._mtu

    def statistics(self) -> Mapping[str, object]:
        return {**super().statistics(), "arp": self.arp.statistics()}

    async def _transmit(self, dst: str, packet: bytes) -> None:
        if dst == _LIMITED_BROADCAST:
            await self._send_frame(BROADCAST_MAC, ETHERTYPE_IPV4, packet)
            return
        self.arp.resolve(dst, packet, trio.current_time())
        self._kick()  # a retry deadline, perhaps
        await self._flush()

    async def _flush(self) -> None:
        for item in self.arp.frames_to_send():
            await self._send_frame(item.dst, item.ethertype, item.payload)

    async def _send_frame(self, dst: bytes, ethertype: int, payload: bytes) -> None:
        await self._below.send(build_ethernet(EthernetFrame(dst, self._mac, ethertype, payload)))

    def _link_timer(self) -> float | None:
        return self.arp.get_timer()

    async def _link_handle_timer(self, now: float) -> None:
        timer = self.arp.get_timer()
        if timer is not None and timer <= now:
            self.arp.handle_timer(now)
            await self._flush()

    async def _receive_loop(self) -> None:
        below = self._below
        while True:
            try:
                data = await below.recv()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                self._close()
                return
            try:
                frame = parse_ethernet(data)
            except EthernetFormatError:
                self._drop("ethernet_malformed")
                continue
            if frame.dst != self._mac and frame.dst != BROADCAST_MAC:
                self._drop("not_our_mac")
                continue
            if frame.ethertype == ETHERTYPE_IPV4:
                reply = self._input(frame.payload, None)
                if reply is not None:
                    await self._answer(reply)
            elif frame.ethertype == ETHERTYPE_ARP:
                try:
                    arp = parse_arp(frame.payload)
                except ArpFormatError as error:
                    self._drop(f"arp_{error.kind.name.lower()}")
                    continue
                self.arp.receive(arp, trio.current_time())
                await self._flush()
            else:
                self._drop("unknown_ethertype")


def _run(stack: UNetIpStack | IpEtherStack) -> AbstractAsyncContextManager[Any]:
    tasks = [(stack._receive_loop, "ip receive"), (stack._timer_loop, "ip timers")]
    return serve(stack, tasks, stack._close)


@register_layer
class IpLayer(Layer[IpParams]):
    """IPv4 over U-Net: one channel per peer, MTU 9 KB (paper 000 §7); fragments beyond it."""

    name = "ip"
    requires = DatagramService
    provides = IpService
    Params = IpParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[UNetIpStack]:
        """Run IP over ``below`` and yield its :class:`UNetIpStack`."""
        self.require_below(below)
        below = typing.cast(DatagramService, below)
        for address, channel in self.params.peers.items():
            if channel not in below.peers:
                raise AssemblyError(
                    f"layer 'ip': peer {address} is mapped to channel {channel}, which the "
                    f"service below does not have (its peers: {list(below.peers)})"
                )
        async with _run(UNetIpStack(below, self.params)) as stack:
            yield stack


@register_layer
class IpEtherLayer(Layer[IpEtherParams]):
    """IPv4 with ARP over Ethernet frames (a TAP device): real hosts can ping it."""

    name = "ip-ether"
    requires = FrameService
    provides = IpService
    Params = IpEtherParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[IpEtherStack]:
        """Run IP over ``below`` and yield its :class:`IpEtherStack`."""
        self.require_below(below)
        async with _run(IpEtherStack(typing.cast(FrameService, below), self.params)) as stack:
            yield stack
