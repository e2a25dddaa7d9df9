"""The trio driver of UDP over IP (paper 000 §7.6): ports, the checksum, and receive buffers
sized by the application.

``sock = await udp.bind(port)``; ``await sock.sendto(data, (ip, port))``;
``data, (ip, port) = await sock.recvfrom()``.  One receive task reads UDP's
:class:`~stacklib.layers.ip.service.ProtocolEndpoint` and demultiplexes by port; sending happens
in the caller's task (paper 000 §7.5: IP's send side "is collapsed into the transport").

* **Checksum policy** (:class:`~stacklib.layers.udp.wire.ChecksumPolicy`): ``both`` (default),
  ``tx``, ``rx`` or ``none``, per layer and per socket; paper 000 §7.6: applications "satisfied
  with the 32-bit CRC at the U-Net AAL5 level" may switch it off.  A received datagram that
  carries no checksum (0) is accepted under every policy (RFC 768).
* **Integrated layer processing**: the checksum "can be combined with the copy operation that
  retrieves the data from the communication segment" (§7.6).  The data is copied out of the
  received packet and summed by one call, :func:`~stacklib.layers.ip.wire.copy_with_sum` (a
  C-level copy, then a C-level sum over the copy while it is in cache: the nearest Python comes
  to one loop); the header and pseudo-header are summed on their own, 20 bytes.  On send the
  same call copies the application's data into the outgoing packet.
* **PCB cache** (§7.6: "a simple pcb caching scheme per incoming channel", after Partridge &
  Pink [23]): a small LRU dict keyed by (source address, source port, destination port) — the
  source address names the channel the datagram came in on — in front of the port table, with
  ``pcb_hits`` and ``pcb_misses`` counters.  Closing a socket empties it.
* **Receive buffering** (§7.3): each socket holds at most ``rcvbuf_bytes`` bytes and
  ``rcvbuf_datagrams`` datagrams, as the application chose at bind; a datagram that does not
  fit is dropped and counted (``overflows``), as a kernel's socket buffer would, but the limit
  is the application's.
* **Datagram face** (:class:`~stacklib.services.DatagramService`, for layers stacked on UDP:
  ARQ, UAM, your own): ``send(peer, data)`` and ``recv()`` use one port, ``port`` (the same on
  every node, bound at the face's first use); peer ``p`` is (the address
  :meth:`~stacklib.layers.ip.service.IpService.neighbors` maps to ``p``, ``port``): over U-Net
  the peers are the channel ids below IP, so the other nodes keep their ids up the stack.  A
  datagram on that port from an address IP has no peer id for, or from another port, is
  dropped and counted (``unknown_peer``).
* **Costs** (only where the NI models the host, ``endpoint.ni.host_copy_per_byte > 0``): each
  datagram sent or received holds the host CPU for ``datagram_us`` (absent: the simulated
  host's :attr:`~stacklib.sim.costs.ProtocolCosts.udp_datagram_us`, 4.5 us on the
  SPARCstation-20, calibrated to paper 000 §7.6, Table 3), then one copy of its data plus, when
  the checksum is computed, ``checksum_us_per_100_bytes`` (paper 000 §7.6: "1μs per 100 bytes
  on a SPARCStation 20").  The sender's task pays on send; on receive the copy is paid by the
  receive task and the per-datagram work by the task that takes the datagram (``recvfrom``).
"""

from __future__ import annotations

import typing
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

import attrs
import trio
import trio.lowlevel

from stacklib.errors import LocalProtocolError
from stacklib.layers.ip.service import IpService, ProtocolEndpoint, UdpService, UdpSocket
from stacklib.layers.ip.wire import (
    IPV4_HEADER_SIZE,
    MAX_PACKET,
    IpProtocol,
    copy_with_sum,
    ip_bytes,
    ones_sum,
    pseudo_header_sum,
)
from stacklib.layers.udp.wire import HEADER_CODEC, HEADER_SIZE, ChecksumPolicy
from stacklib.services import Service
from stacklib.sim.costs import cited
from stacklib.stack import Layer, register_layer, serve

if TYPE_CHECKING:
    from stacklib.sim.resources import Resource

__all__ = ["MAX_DATA", "UdpLayer", "UdpParams", "UdpSocketImpl", "UdpStack"]

_Buffer = bytes | bytearray | memoryview
_UDP = int(IpProtocol.UDP)
EPHEMERAL = range(49152, 65536)  #: IANA's dynamic ports, for bind(0)
#: The most data one datagram carries: 65,535 less the IPv4 and UDP headers (IP fragments it).
MAX_DATA = MAX_PACKET - IPV4_HEADER_SIZE - HEADER_SIZE
_unpack = HEADER_CODEC.unpack
_pack = HEADER_CODEC.pack


def _int_in(low: int, high: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{attribute.name} must be an integer in {low}..{high}, got {value!r}")

    return check


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{attribute.name} must be a number >= 0, got {value!r}")


def _optional_non_negative(
    instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is not None:
        _non_negative(instance, attribute, value)  # type: ignore[arg-type]


@attrs.frozen
class UdpParams:
    """Parameters of the UDP layer (``[[layers]] kind = "udp"``)."""

    #: Checksum policy of new sockets: "both", "tx", "rx" or "none".
    checksum: Literal["both", "tx", "rx", "none"] = "both"
    #: Default receive buffer of a socket, bytes of data (paper 000 §7.3: SunOS's socket
    #: buffer is at most 52 KB; here the application chooses, per socket at bind).
    rcvbuf_bytes: int = attrs.field(default=256 * 1024, validator=_int_in(0, 1 << 40))
    #: Default receive buffer of a socket, datagrams.
    rcvbuf_datagrams: int = attrs.field(default=1024, validator=_int_in(0, 1 << 30))
    #: Entries of the PCB cache.
    pcb_cache: int = attrs.field(default=16, validator=_int_in(0, 1 << 20))
    #: Port of the datagram face (``send(peer, data)``/``recv()``), the same on every node;
    #: bound when the face is first used.  5995, TCP's service port: a port Wireshark claims
    #: for no protocol, so captures dissect as plain UDP (7001 was AFS's Rx; docs/captures.md).
    port: int = attrs.field(default=5995, validator=_int_in(1, 0xFFFF))
    #: Host CPU per datagram sent and per datagram received, beyond its copy and checksum, on
    #: NIs that model the host; absent: the simulated host's
    #: (:attr:`~stacklib.sim.costs.ProtocolCosts.udp_datagram_us`: 4.5 us on the
    #: SPARCstation-20, calibrated to paper 000 §7.6, Table 3's 138 us round trip).
    datagram_us: float | None = attrs.field(default=None, validator=_optional_non_negative)
    #: Host CPU for the checksum, on NIs that model the host.
    checksum_us_per_100_bytes: float = cited(
        1.0,
        "paper 000 §7.6: 'The checksum adds a processing overhead of 1μs per 100 bytes on a "
        "SPARCStation 20'",
        "us",
        validator=_non_negative,
    )


def _ones_add(a: int, b: int) -> int:
    total = a + b
    return (total & 0xFFFF) + (total >> 16)


class UdpSocketImpl(UdpSocket):
    """A bound UDP port; made by :meth:`UdpStack.bind`."""

    def __init__(
        self,
        stack: UdpStack,
        port: int,
        policy: ChecksumPolicy,
        rcvbuf_bytes: int,
        rcvbuf_datagrams: int,
    ) -> None:
        self._stack = stack
        self.port = port
        self.policy = policy
        self.rcvbuf_bytes = rcvbuf_bytes
        self.rcvbuf_datagrams = rcvbuf_datagrams
        self._queue: deque[tuple[bytes, tuple[str, int]]] = deque()
        self._queued_bytes = 0
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False
        self.sent = 0
        self.received = 0
        self.overflows = 0

    def __repr__(self) -> str:
        return f"<UDP socket {self._stack.ip.address}:{self.port}>"

    @property
    def local_address(self) -> tuple[str, int]:
        return self._stack.ip.address, self.port

    async def sendto(self, data: _Buffer, address: tuple[str, int]) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise trio.ClosedResourceError("the UDP socket is closed")
        await self._stack._send(self, data, address)
        self.sent += 1

    async def recvfrom(self) -> tuple[bytes, tuple[str, int]]:
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._queue:
            if self._closed:
                raise trio.ClosedResourceError("the UDP socket is closed")
            await self._lot.park()
        data, source = self._queue.popleft()
        self._queued_bytes -= len(data)
        await trio.lowlevel.cancel_shielded_checkpoint()
        stack = self._stack
        cost = stack._datagram
        if cost:
            # The per-datagram work runs in the receiving application's task (paper 000 §7.3:
            # the protocols are implemented at user level); shielded, so that a datagram taken
            # off the queue is always returned.
            cpu = stack._cpu
            if cpu is not None and not cpu.try_charge(cost):
                with trio.CancelScope(shield=True):
                    await cpu.use(cost)
        return data, source

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stack._unbind(self)
            self._lot.unpark_all()

    def statistics(self) -> Mapping[str, object]:
        """This socket's counters and its buffer's occupancy."""
        return {
            "sent": self.sent,
            "received": self.received,
            "overflows": self.overflows,
            "queued": len(self._queue),
            "queued_bytes": self._queued_bytes,
        }

    def _deliver(self, data: bytes, source: tuple[str, int]) -> bool:
        if (
            len(self._queue) >= self.rcvbuf_datagrams
            or self._queued_bytes + len(data) > self.rcvbuf_bytes
        ):
            self.overflows += 1
            return False
        self._queue.append((data, source))
        self._queued_bytes += len(data)
        self.received += 1
        self._lot.unpark()
        return True


class UdpStack(UdpService):
    """UDP over an :class:`IpService`; made by :class:`UdpLayer`."""

    def __init__(self, ip: IpService, params: UdpParams) -> None:
        self.ip = ip
        self._params = params
        self._policy = ChecksumPolicy(params.checksum)
        self._endpoint: ProtocolEndpoint = ip.open_protocol(_UDP)
        self._sockets: dict[int, UdpSocketImpl] = {}
        self._pcb: OrderedDict[tuple[str, int, int], UdpSocketImpl] = OrderedDict()
        self._next_ephemeral = EPHEMERAL.start
        self._closed = False
        self._counts = dict.fromkeys(
            (
                "sent",
                "received",
                "delivered",
                "overflows",
                "pcb_hits",
                "pcb_misses",
                "checksums_computed",
                "checksums_verified",
            ),
            0,
        )
        self._dropped: dict[str, int] = {}
        self._cpu: Resource | None = ip.modeled_cpu
        self._copy = ip.modeled_copy_per_byte
        self._sum = params.checksum_us_per_100_bytes * 1e-6 / 100
        datagram_us = params.datagram_us
        if datagram_us is None:
            protocol = ip.modeled_protocol
            datagram_us = protocol.udp_datagram_us if protocol is not None else 0.0
        #: Seconds of host CPU per datagram sent or received (0 where nothing is modeled).
        self._datagram = datagram_us * 1e-6 if self._cpu is not None else 0.0
        self._face_socket: UdpSocketImpl | None = None

    def __repr__(self) -> str:
        return f"<UDP over {self.ip!r}, {len(self._sockets)} ports>"

    # ------------------------------------------------------------------ the service

    async def bind(
        self,
        port: int = 0,
        *,
        rcvbuf_bytes: int | None = None,
        rcvbuf_datagrams: int | None = None,
        checksum: str | None = None,
    ) -> UdpSocketImpl:
        await trio.lowlevel.checkpoint()
        return self._bind(port, rcvbuf_bytes, rcvbuf_datagrams, checksum)

    def _bind(
        self,
        port: int,
        rcvbuf_bytes: int | None = None,
        rcvbuf_datagrams: int | None = None,
        checksum: str | None = None,
    ) -> UdpSocketImpl:
        if self._closed:
            raise trio.ClosedResourceError("the UDP layer is closed")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 0xFFFF:
            raise LocalProtocolError(f"UDP: port {port!r} is not in 0..65535")
        try:
            policy = self._policy if checksum is None else ChecksumPolicy(checksum)
        except ValueError:
            raise LocalProtocolError(
                f"UDP: checksum policy {checksum!r} is not one of both, tx, rx, none"
            ) from None
        if port == 0:
            port = self._ephemeral()
        elif port in self._sockets:
            raise LocalProtocolError(f"UDP: port {port} is already bound")
        params = self._params
        sock = UdpSocketImpl(
            self,
            port,
            policy,
            params.rcvbuf_bytes if rcvbuf_bytes is None else rcvbuf_bytes,
            params.rcvbuf_datagrams if rcvbuf_datagrams is None else rcvbuf_datagrams,
        )
        self._sockets[port] = sock
        return sock

    def statistics(self) -> Mapping[str, object]:
        """Counters: sent, received, delivered, overflows, PCB cache hits and misses, checksums,
        and datagrams dropped by reason (short, length, checksum, no_port, unknown_peer)."""
        return {**self._counts, "dropped": dict(sorted(self._dropped.items()))}

    # ------------------------------------------------------------------ the datagram face

    @property
    def peers(self) -> Sequence[int]:
        """The peer ids IP has addresses for (:meth:`IpService.neighbors`)."""
        return sorted(set(self.ip.neighbors().values()))

    @property
    def max_message(self) -> int:
        """The largest UDP datagram: 65,507 bytes (IP fragments what exceeds a peer's MTU)."""
        return MAX_DATA

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` to the datagram face of ``peer`` (its address, :attr:`UdpParams.port`)."""
        address = self._addresses().get(peer)
        if address is None:
            raise LocalProtocolError(f"UDP: no peer {peer!r} (peers: {list(self.peers)})")
        await self._face().sendto(data, (address, self._params.port))

    async def recv(self) -> tuple[int, bytes]:
        """The next datagram to the face's port, as (peer, data)."""
        sock = self._face()
        port = self._params.port
        while True:
            data, (source, sport) = await sock.recvfrom()
            peer = self.ip.neighbors().get(source)
            if peer is not None and sport == port:
                return peer, data
            self._drop("unknown_peer")

    def _face(self) -> UdpSocketImpl:
        face = self._face_socket
        if face is None:
            face = self._face_socket = self._bind(self._params.port)
        return face

    def _addresses(self) -> dict[int, str]:
        """Peer id -> address: the first address IP maps to each peer id."""
        addresses: dict[int, str] = {}
        for address, peer in self.ip.neighbors().items():
            addresses.setdefault(peer, address)
        return addresses

    # ------------------------------------------------------------------ send

    async def _send(self, sock: UdpSocketImpl, data: _Buffer, address: tuple[str, int]) -> None:
        dst, dport = address
        if isinstance(dport, bool) or not isinstance(dport, int) or not 0 < dport <= 0xFFFF:
            raise LocalProtocolError(f"UDP: destination port {dport!r} is not in 1..65535")
        try:
            ip_bytes(dst)
        except ValueError as error:
            raise LocalProtocolError(f"UDP: {error}") from None
        length = HEADER_SIZE + len(data)
        if length - HEADER_SIZE > MAX_DATA:
            raise LocalProtocolError(
                f"UDP: datagram of {len(data)} bytes to {dst} exceeds the largest IPv4 carries "
                f"({MAX_DATA} bytes of data)"
            )
        self.ip.mtu(dst)  # an unreachable destination raises before any cost is charged
        src = self.ip.address
        if sock.policy.tx:
            # Copy the data into the packet and sum it in one call (integrated layer
            # processing, paper 000 §7.6).
            copy, data_sum = copy_with_sum(data)
            header = _pack(sock.port, dport, length, 0)
            total = ones_sum(header, _ones_add(pseudo_header_sum(src, dst, _UDP, length), data_sum))
            check = (~total & 0xFFFF) or 0xFFFF  # a computed 0 is sent as all ones (RFC 768)
            packet = _pack(sock.port, dport, length, check) + copy
            self._counts["checksums_computed"] += 1
        else:
            packet = _pack(sock.port, dport, length, 0) + bytes(data)
        cpu = self._cpu
        if cpu is not None:
            # Two holds, the datagram's and then its bytes', as two steps of the send path.
            if self._datagram:
                await cpu.use(self._datagram)
            await cpu.use(self._cost(len(data), sock.policy.tx))
        await self.ip.send(dst, _UDP, packet)
        self._counts["sent"] += 1

    # ------------------------------------------------------------------ receive

    async def _receive_loop(self) -> None:
        endpoint = self._endpoint
        while True:
            try:
                src, dst, payload = await endpoint.recv()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
            cost = self._input(src, dst, payload)
            if cost and self._cpu is not None:
                await self._cpu.use(cost)

    def _drop(self, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def _input(self, src: str, dst: str, payload: bytes) -> float:
        """Demultiplex, verify and deliver one datagram; returns its modeled host cost.

        Never raises for bad input: every rejection is counted in ``dropped``.
        """
        counts = self._counts
        counts["received"] += 1
        size = len(payload)
        if size < HEADER_SIZE:
            self._drop("short")
            return 0.0
        sport, dport, length, check = _unpack(payload)
        if not HEADER_SIZE <= length <= size:
            self._drop("length")
            return 0.0
        key = (src, sport, dport)
        sock = self._pcb.get(key)
        if sock is not None:
            counts["pcb_hits"] += 1
            self._pcb.move_to_end(key)
        else:
            counts["pcb_misses"] += 1
            sock = self._sockets.get(dport)
            if sock is None:
                self._drop("no_port")
                return 0.0
            if self._params.pcb_cache:
                self._pcb[key] = sock
                if len(self._pcb) > self._params.pcb_cache:
                    self._pcb.popitem(last=False)
        view = memoryview(payload)
        verify = sock.policy.rx and check != 0
        if verify:
            # Copy out and sum in one call (integrated layer processing, paper 000 §7.6).
            data, data_sum = copy_with_sum(view[HEADER_SIZE:length])
            start = _ones_add(pseudo_header_sum(src, dst, _UDP, length), data_sum)
            if ones_sum(view[:HEADER_SIZE], start) != 0xFFFF:
                self._drop("checksum")
                return self._cost(len(data), True)
            counts["checksums_verified"] += 1
        else:
            data = bytes(view[HEADER_SIZE:length])
        if sock._deliver(data, (src, sport)):
            counts["delivered"] += 1
        else:
            counts["overflows"] += 1
        return self._cost(len(data), verify)

    # ------------------------------------------------------------------ helpers

    def _cost(self, nbytes: int, summed: bool) -> float:
        if self._cpu is None:
            return 0.0
        return nbytes * (self._copy + (self._sum if summed else 0.0))

    def _ephemeral(self) -> int:
        for _ in EPHEMERAL:
            port = self._next_ephemeral
            self._next_ephemeral = port + 1 if port + 1 < EPHEMERAL.stop else EPHEMERAL.start
            if port not in self._sockets:
                return port
        raise LocalProtocolError("UDP: no free ephemeral port")

    def _unbind(self, sock: UdpSocketImpl) -> None:
        if self._sockets.get(sock.port) is sock:
            del self._sockets[sock.port]
        self._pcb.clear()  # entries may point at the closed socket

    def _close(self) -> None:
        self._closed = True
        for sock in list(self._sockets.values()):
            sock.close()
        self._endpoint.close()


@register_layer
class UdpLayer(Layer[UdpParams]):
    """UDP over IP (paper 000 §7.6)."""

    name = "udp"
    requires = IpService
    provides = UdpService
    Params = UdpParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[UdpStack]:
        """Run UDP over ``below`` and yield its :class:`UdpStack`."""
        self.require_below(below)
        stack = UdpStack(typing.cast(IpService, below), self.params)
        async with serve(stack, [(stack._receive_loop, "udp receive")], stack._close):
            yield stack
