"""The services layers provide and require: the contracts that stacks are assembled from.

Each layer declares the service it needs below and the one it offers above; assembly checks the
fit (:mod:`stacklib.stack`).  Services are nominal: a class states what it offers by inheriting
from one of these, and a more specific service satisfies a need for a more general one (a
reliable message service can carry a layer that asks only for datagrams).

* :class:`DatagramService`: messages to and from peers, which may be lost.
* :class:`UNetService`: raw U-Net, a datagram service that also exposes its endpoint.
* :class:`ReliableService`: messages delivered exactly once and in order per peer, or the peer
  reported unreachable.
* :class:`StreamService`: byte streams (``trio.abc.HalfCloseableStream``), e.g. TCP.
* :class:`FrameService`: whole Ethernet frames on one link (a TAP device), under IP's
  Ethernet mode.

Peers are small integers (the channel ids of the endpoint at the bottom of the stack), so a
message's origin travels up unchanged through every layer.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import ClassVar

import trio

from stacklib.unet.endpoint import Endpoint


class Service:
    """Base of every service type."""

    #: Name used in assembly errors and recipes.
    kind: ClassVar[str] = "service"

    def statistics(self) -> Mapping[str, object]:
        """Counters of the layer that provides this service (empty if it keeps none)."""
        return {}


class DatagramService(Service):
    """Send messages to peers and receive messages from them; any message may be lost."""

    kind = "datagram"

    @property
    @abc.abstractmethod
    def peers(self) -> Sequence[int]:
        """The peers this service can reach."""

    @property
    @abc.abstractmethod
    def max_message(self) -> int:
        """The largest message :meth:`send` accepts."""

    @abc.abstractmethod
    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        """Send one message to ``peer`` (waits under back-pressure)."""

    @abc.abstractmethod
    async def recv(self) -> tuple[int, bytes]:
        """The next message, as (peer, data)."""

    def __aiter__(self) -> DatagramService:
        return self

    async def __anext__(self) -> tuple[int, bytes]:
        try:
            return await self.recv()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None


class UNetService(DatagramService):
    """Raw U-Net: a datagram service over one endpoint; peers are its channel ids."""

    kind = "unet"

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    def __repr__(self) -> str:
        return f"UNetService({self.endpoint!r})"

    @property
    def peers(self) -> Sequence[int]:
        return sorted(self.endpoint.channels)

    @property
    def max_message(self) -> int:
        endpoint = self.endpoint
        pool_limit = endpoint.config.tx_buffers * endpoint.config.tx_buffer_size
        return min(endpoint.ni.max_message, max(pool_limit, endpoint.ni.inline_threshold))

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        await self.endpoint.send(peer, data)

    async def recv(self) -> tuple[int, bytes]:
        message = await self.endpoint.recv()
        return message.channel, message.data

    def statistics(self) -> Mapping[str, object]:
        stats = self.endpoint.statistics()
        return {
            "sent": stats.sent,
            "received": stats.received,
            "dropped": dict(stats.dropped),
            "send_errors": dict(stats.send_errors),
        }


class ReliableService(DatagramService):
    """Messages arrive exactly once and in order per peer, or the peer is reported unreachable
    (:class:`stacklib.errors.PeerUnreachable`)."""

    kind = "reliable"


class FrameService(Service):
    """Whole Ethernet II frames (without FCS) to and from one link.

    Implemented by link helpers such as a TAP device (stacklib.transports.tap); the IP
    layer's Ethernet mode (``ip-ether``) runs IP with ARP over it.  Frames may be lost;
    :meth:`recv` returns every frame the link delivers to this interface (filtering by MAC is
    the caller's business).
    """

    kind = "frames"

    @property
    @abc.abstractmethod
    def mac(self) -> bytes:
        """This interface's 6-byte MAC address."""

    @property
    @abc.abstractmethod
    def mtu(self) -> int:
        """The largest Ethernet payload (frame less its 14-byte header), usually 1500."""

    @abc.abstractmethod
    async def send(self, frame: bytes | bytearray | memoryview) -> None:
        """Transmit one whole frame (header included)."""

    @abc.abstractmethod
    async def recv(self) -> bytes:
        """The next frame received; :class:`trio.EndOfChannel` when the link closes."""


class StreamService(Service):
    """Connected byte streams to peers."""

    kind = "stream"

    @abc.abstractmethod
    async def connect(self, peer: int) -> trio.abc.HalfCloseableStream:
        """Open a stream to ``peer``."""

    @abc.abstractmethod
    async def accept(self) -> tuple[int, trio.abc.HalfCloseableStream]:
        """The next stream a peer opened, as (peer, stream)."""
