"""The service contracts of IP and UDP over U-Net, and the frame service IP runs over Ethernet.

* :class:`FrameService`: whole Ethernet II frames to and from a link (a TAP device, an
  AF_PACKET socket, a simulated wire).  IP's Ethernet mode (``"ip-ether"``) needs one.
* :class:`IpService`: IPv4 for transports.  One IP instance carries every protocol above it
  (paper 000 §7.1: "a single channel is used to carry all IP traffic between two
  applications"), so transports do not receive from IP directly: each opens its
  :class:`ProtocolEndpoint` with :meth:`IpService.open_protocol` and UDP and TCP share the
  instance.
* :class:`UdpService` and :class:`UdpSocket`: datagrams between (address, port) pairs; a UDP
  service is also a :class:`~stacklib.services.DatagramService` whose peers are the hosts IP
  reaches directly (:meth:`IpService.neighbors`), so datagram layers (ARQ, UAM, your own) stack
  on it.

Addresses are dotted-quad strings (``"10.0.0.1"``), as Python's socket module uses them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING

import trio

from stacklib.services import DatagramService, FrameService, Service  # FrameService: re-exported

if TYPE_CHECKING:
    from stacklib.sim.costs import ProtocolCosts
    from stacklib.sim.resources import Resource

__all__ = [
    "FrameService",
    "IpService",
    "ProtocolEndpoint",
    "UdpService",
    "UdpSocket",
]

_Buffer = bytes | bytearray | memoryview


class ProtocolEndpoint(abc.ABC):
    """One transport protocol's view of IP: the datagrams that carry its protocol number."""

    protocol: int

    @abc.abstractmethod
    async def recv(self) -> tuple[str, str, bytes]:
        """The next datagram as (source, destination, payload), fragments reassembled.

        Raises :class:`trio.EndOfChannel` once IP is closed and the backlog is read.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Stop receiving; the protocol number is free to open again."""

    def __aiter__(self) -> ProtocolEndpoint:
        return self

    async def __anext__(self) -> tuple[str, str, bytes]:
        try:
            return await self.recv()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None


class IpService(Service):
    """IPv4 datagrams to and from peers (RFC 791), for transport protocols."""

    kind = "ip"

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """This host's IPv4 address."""

    @abc.abstractmethod
    def mtu(self, peer: str) -> int:
        """The largest IP packet (header included) :meth:`send` accepts for ``peer``.

        Larger datagrams are fragmented; a transport that wants whole packets (TCP) fits its
        segments in ``mtu(peer) - 20``.  Raises :class:`~stacklib.errors.LocalProtocolError`
        if ``peer`` is unreachable.
        """

    @abc.abstractmethod
    async def send(
        self,
        dst: str,
        protocol: int,
        payload: _Buffer,
        *,
        ttl: int | None = None,
        dont_fragment: bool = False,
    ) -> None:
        """Send ``payload`` to ``dst`` as one IP datagram of ``protocol``, in fragments if it
        exceeds ``mtu(dst)`` (RFC 791 §3.2).

        Raises :class:`~stacklib.errors.LocalProtocolError` if ``dst`` is unreachable, if the
        datagram exceeds 65,535 bytes, or (its subclass ``FragmentationNeeded``, naming the
        MTU) if ``dont_fragment`` is set and the datagram exceeds ``mtu(dst)``.
        """

    @abc.abstractmethod
    def open_protocol(self, protocol: int) -> ProtocolEndpoint:
        """Start receiving ``protocol``; :class:`LocalProtocolError` if already open."""

    def neighbors(self) -> Mapping[str, int]:
        """Address -> peer id of the hosts reached directly, numbered as the service below
        numbers its peers (over U-Net: the channel ids, so the other nodes keep their ids up
        the stack).  Empty where the link has no such numbering (Ethernet mode).  Read-only:
        it may be the live table, which grows as IP learns peers."""
        return {}

    @property
    def modeled_cpu(self) -> Resource | None:
        """The host CPU resource where the NI below models host costs, else None.

        Transports charge their own modeled costs (copies, checksums) to it.
        """
        return None

    @property
    def modeled_copy_per_byte(self) -> float:
        """Seconds per byte of a host memory copy where modeled (else 0.0)."""
        return 0.0

    @property
    def modeled_protocol(self) -> ProtocolCosts | None:
        """The host's per-message UDP and TCP costs where modeled (else None): the transports
        above charge them to :attr:`modeled_cpu` unless their parameters override them."""
        return None


class UdpSocket(abc.ABC):
    """A UDP port bound by :meth:`UdpService.bind`."""

    @property
    @abc.abstractmethod
    def local_address(self) -> tuple[str, int]:
        """(address, port) this socket is bound to."""

    @abc.abstractmethod
    async def sendto(self, data: _Buffer, address: tuple[str, int]) -> None:
        """Send ``data`` (at most 65,507 bytes) as one datagram to (ip, port); IP fragments it
        if it exceeds the path's MTU."""

    @abc.abstractmethod
    async def recvfrom(self) -> tuple[bytes, tuple[str, int]]:
        """The next datagram and its sender (ip, port)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Unbind; a waiting :meth:`recvfrom` raises :class:`trio.ClosedResourceError`."""

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> UdpSocket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class UdpService(DatagramService):
    """UDP (RFC 768): ports over an :class:`IpService`, and a datagram service to the peers.

    Sockets (:meth:`bind`) speak (address, port) pairs.  The datagram face (``send(peer,
    data)``, ``recv()``) uses one port, the same on every node: peer ``p`` is
    (``address``, ``port``) where :meth:`IpService.neighbors` maps ``address`` to ``p``, so a
    layer above UDP sees the same peer ids as it would over U-Net.  Datagrams may be lost.
    """

    kind = "udp"

    @abc.abstractmethod
    async def bind(
        self,
        port: int = 0,
        *,
        rcvbuf_bytes: int | None = None,
        rcvbuf_datagrams: int | None = None,
        checksum: str | None = None,
    ) -> UdpSocket:
        """Bind ``port`` (0: a free ephemeral port) and return its socket.

        ``rcvbuf_bytes`` / ``rcvbuf_datagrams`` size its receive buffer (paper 000 §7.3: by the
        application, not the kernel); ``checksum`` overrides the layer's policy.
        """
