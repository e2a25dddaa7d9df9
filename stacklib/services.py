"""The services layers provide and require: the contracts that stacks are assembled from.

Each layer declares the service it needs below and the one it offers above; assembly checks the
fit (:mod:`stacklib.stack`).  Services are nominal: a class states what it offers by inheriting
from one of these, and a more specific service satisfies a need for a more general one (a
reliable message service can carry a layer that asks only for datagrams).

* :class:`DatagramService`: messages to and from peers, which may be lost.
* :class:`UNetService`: raw U-Net, a datagram service that also exposes its endpoint.
* :class:`ReliableService`: messages delivered exactly once and in order per peer, or the peer
  reported unreachable.
* :class:`ActiveMessageService`: Active Messages (paper 000 §5): requests and replies that run
  handlers, bulk stores and gets into registered regions; a reliable service.
* :class:`StreamService`: byte streams (``trio.abc.HalfCloseableStream``), e.g. TCP.
* :class:`FrameService`: whole Ethernet frames on one link (a TAP device), under IP's
  Ethernet mode.

Peers are small integers (the channel ids of the endpoint at the bottom of the stack), so a
message's origin travels up unchanged through every layer.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeAlias, TypeVar

import trio

from stacklib.errors import LocalProtocolError
from stacklib.unet.endpoint import Endpoint

C = TypeVar("C")


class Service(abc.ABC):  # noqa: B024  (abstract methods come with each kind of service)
    """Base of every service type.  Abstract: a subclass instantiates only once it implements
    every abstract method of the services it inherits from."""

    #: Name used in assembly errors and recipes.
    kind: ClassVar[str] = "service"

    def statistics(self) -> Mapping[str, object]:
        """Counters of the layer that provides this service (empty if it keeps none)."""
        return {}

    def capability(self, kind: type[C]) -> C | None:
        """An object of type ``kind`` that this service lends the layer above, or None.

        Layers ask the service below for what they can use beyond its declared service
        instead of testing its concrete class.  A service that lends nothing returns None
        (the default); see each service class for the capabilities it documents.
        """
        return None


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
        """The next message; iteration ends when the service (or the endpoint under it) is
        closed: :class:`trio.EndOfChannel` or :class:`trio.ClosedResourceError`, which
        :class:`~stacklib.errors.EndpointClosed` is.  A peer that left
        (:class:`~stacklib.errors.PeerGone`, a :class:`trio.BrokenResourceError`) propagates."""
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

    def capability(self, kind: type[C]) -> C | None:
        """Lends the :class:`~stacklib.unet.Endpoint` (``capability(Endpoint)``): a layer above
        may drive it directly (post, poll) with the same effect as :meth:`send` and
        :meth:`recv`.  A subclass that changes what ``send`` or ``recv`` do must not lend it."""
        endpoint = self.endpoint
        return endpoint if isinstance(endpoint, kind) else None

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


Handler: TypeAlias = Callable[..., Any]
"""An Active Message handler: ``fn(peer, *args)`` for requests and replies; ``fn(peer, region,
offset, nbytes, *args)`` for the completion of a store (at the receiver) or a get (at the
requester)."""

RemoteAddress: TypeAlias = tuple[int | str, int]
"""(region id or name, byte offset): an address in a region registered with
:meth:`ActiveMessageService.register_region`.  Names resolve through the local table (the SPMD
model: every node registers the same regions in the same order)."""


class ActiveMessageTables:
    """The handler table and the memory regions of an Active Message service, with names.

    Handlers are entered at an index of a fixed-size table (the first free one by default) or
    by name; regions are writable buffers numbered in registration order.  Names resolve
    locally: like GAM, the SPMD model has every node register the same handlers and regions in
    the same order.  Misuse raises :class:`~stacklib.errors.LocalProtocolError` whose message
    starts with ``label`` ("UAM", "GAM").
    """

    def __init__(self, label: str, size: int = 256, max_regions: int | None = None) -> None:
        self.label = label
        self.handlers: list[Handler | None] = [None] * size
        self.handler_names: dict[str, int] = {}
        self.regions: dict[int, memoryview] = {}
        self.region_names: dict[str, int] = {}
        self._max_regions = max_regions

    def register_handler(
        self, handler: Handler, index: int | None = None, name: str | None = None
    ) -> int:
        """Enter ``handler`` at ``index`` (default: the first free) and return the index."""
        size = len(self.handlers)
        if index is None:
            free = [i for i, h in enumerate(self.handlers) if h is None]
            if not free:
                raise LocalProtocolError(
                    f"{self.label}: the handler table ({size} entries) is full"
                )
            index = free[0]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
            raise LocalProtocolError(
                f"{self.label}: handler index {index!r} is not in 0..{size - 1}"
            )
        self.handlers[index] = handler
        if name is not None:
            self.handler_names[name] = index
        return index

    def handler_index(self, handler: int | str) -> int:
        """The table index of a handler given by index (returned as it is) or by name."""
        if isinstance(handler, str):
            try:
                return self.handler_names[handler]
            except KeyError:
                raise LocalProtocolError(f"{self.label}: no handler named {handler!r}") from None
        return handler

    def register_region(self, buffer: bytearray | memoryview, name: str | None = None) -> int:
        """Make ``buffer`` (writable) reachable by stores and gets; returns its region id."""
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise LocalProtocolError(
                f"{self.label}: a region must be writable (bytearray, memoryview)"
            )
        if self._max_regions is not None and len(self.regions) >= self._max_regions:
            raise LocalProtocolError(f"{self.label}: at most {self._max_regions} regions")
        region = len(self.regions)
        self.regions[region] = view
        if name is not None:
            self.region_names[name] = region
        return region

    def region_id(self, region: int | str) -> int:
        """The id of a region given by id (returned as it is) or by name."""
        if isinstance(region, str):
            try:
                return self.region_names[region]
            except KeyError:
                raise LocalProtocolError(f"{self.label}: no region named {region!r}") from None
        return region


class ActiveMessageService(ReliableService):
    """Active Messages (paper 000 §5, GAM 1.1): small requests and replies that run registered
    handlers at the receiver, and bulk stores and gets into registered memory regions.

    Handlers run when the application polls (:meth:`poll`, :meth:`wait_until`); a request
    handler may :meth:`reply` once.  A failed peer raises
    :class:`~stacklib.errors.PeerUnreachable` from the next call that polls.
    """

    kind = "active-messages"

    @abc.abstractmethod
    def register_handler(
        self, handler: Handler, index: int | None = None, name: str | None = None
    ) -> int:
        """Enter ``handler`` in the handler table (at ``index``, default the first free) and
        return its index; ``name`` lets callers name it instead."""

    @abc.abstractmethod
    def register_region(self, buffer: bytearray | memoryview, name: str | None = None) -> int:
        """Make ``buffer`` (writable) reachable by stores and gets; returns its region id."""

    @abc.abstractmethod
    def request_nowait(self, peer: int, handler: int | str, *args: int) -> None:
        """Send a request now, or raise :class:`trio.WouldBlock` if it cannot go yet."""

    @abc.abstractmethod
    async def request(self, peer: int, handler: int | str, *args: int) -> None:
        """Send a request (a few 32-bit words) to ``handler`` of ``peer``, polling while the
        send window is full."""

    @abc.abstractmethod
    def reply(self, handler: int | str, *args: int) -> None:
        """Reply from inside a request handler, once."""

    @abc.abstractmethod
    async def store(
        self,
        peer: int,
        data: bytes | bytearray | memoryview,
        remote: RemoteAddress,
        handler: int | str,
        *args: int,
    ) -> None:
        """Store ``data`` at ``remote`` of ``peer``; ``handler`` runs there when it has all
        arrived."""

    @abc.abstractmethod
    async def get(
        self,
        peer: int,
        remote: RemoteAddress,
        nbytes: int,
        local: RemoteAddress,
        handler: int | str,
        *args: int,
    ) -> None:
        """Fetch ``nbytes`` at ``remote`` of ``peer`` into ``local``; ``handler`` runs here
        when it has all arrived."""

    @abc.abstractmethod
    def poll(self) -> int:
        """Run the handlers of every message that has arrived; returns how many ran."""

    @abc.abstractmethod
    def acknowledge(self) -> int:
        """Poll, then acknowledge everything received at once; returns how many handlers
        ran.  Call it before a long computation that does not poll."""

    @abc.abstractmethod
    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Poll until ``predicate()`` is true."""

    @abc.abstractmethod
    async def drain(self, peer: int | None = None) -> None:
        """Poll until everything sent to ``peer`` (default: every peer) is acknowledged."""


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
