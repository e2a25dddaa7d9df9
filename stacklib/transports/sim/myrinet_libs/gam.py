"""Generic Active Messages (paper 004 §2, Tables 1-2, §4): requests, replies and tokens.

Every request names a handler to run at the receiver and is matched by exactly one reply
(paper 004 §2).  The rules, enforced here with
:class:`~stacklib.transports.sim.myrinet_libs.base.LibraryError`: a request handler may reply
at most once and only to the requester; a reply handler may neither reply nor request; no
handler may send a request (handlers run inside the poll, where a blocking send could
deadlock).  A request handler that does not reply gets an
empty reply from the library, so the requester's token comes back.

Flow control by tokens: a sender holds ``tokens`` per receiver, a request spends one, its reply
returns it; without tokens a request polls until a reply arrives.  Handlers run only when the
application polls (:meth:`Gam.poll`, and inside :meth:`Gam.request`, which "not only sends a
request, but also implicitly handles a reply, if one has arrived", paper 004 §4.1).  Delivery is
FIFO; network errors are not tolerated (Table 1).

Data paths (Table 2): short requests (up to ``short_bytes``) are written into the NI by PIO
with write combining.  A longer request is a bulk store: the library copies it into its bulk
send buffer one NI buffer (``fragment_bytes``) at a time, and the LANai DMAs each fragment out
while the next is copied; the request returns when the last fragment has left host memory
(Table 3: both stages in Os; sends are synchronous, §4.1).  The library keeps that copy until
the store's reply comes back (Table 2, Reliability: Library+Copy), so with one bulk buffer a
sender has one store in flight: every long message costs a round trip (§2: "every network
operation involves a round trip message exchange").  At the receiver the LANai DMAs each
fragment into a library buffer once it is whole in SRAM; the handler runs when the last one
has landed, its reply leaves at once, and the data is then copied to the application (Or
grows with size, §4.1.4).  That round trip is what makes a 4 KB message slow (RTT/2 197.9 us,
g 153.5 us, Figs 4-5) while long messages, up to ``max_request`` per store, stream at the copy
rate (60-70 MB/s, abstract).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
import trio

from stacklib.sim.costs import cited
from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs.base import (
    ImplChoices,
    LibraryError,
    ModelChoices,
    MyrinetLibrary,
    Packet,
    estimate,
    open_group,
)

__all__ = ["Gam", "GamParams", "Token"]

US = 1e-6
#: Handler index of the datagram face's built-in request handler.
DELIVER = 0

RequestHandler = Callable[["Token", bytes], None]
ReplyHandler = Callable[["Token", bytes], None]


@attrs.frozen
class GamParams:
    """Generic AM's per-message costs and limits."""

    short_bytes: int = estimate(
        32,
        "requests of up to 8 words go by PIO (paper 004 §4.1.1: AM's switch is barely visible)",
        "bytes",
    )
    request_us: float = estimate(
        4.0, "am_request: check tokens, poll once for replies, compose the header"
    )
    handler_us: float = estimate(3.2, "am_poll: find the message, dispatch its handler")
    reply_us: float = estimate(2.0, "am_reply: compose the reply in the handler's context")
    header_bytes: int = estimate(16, "handler, token, sequence and length", "bytes")
    lcp_send_cycles: float = estimate(60.0, "GAM's LCP send", "cycles")
    lcp_recv_cycles: float = estimate(60.0, "GAM's LCP receive: take a host buffer", "cycles")
    cache_knee_bytes: int = cited(
        512 * 1024,
        "paper 004 §4.2: AM's knee at 512 KBytes in all bandwidths, due to cache effects; "
        "where the copies leave the 256 KB L2 relative to the message size is taken from it",
        "bytes",
    )
    send_buffers: int = estimate(
        1,
        "bulk send buffers: each keeps its store's copy until the reply returns (Table 2, "
        "Reliability: Library+Copy); one gives the round trip per long message that the 4 KB "
        "points of Figs 4-5 (197.9 and 153.5 us) show",
        "buffers",
    )
    fragment_bytes: int = estimate(
        4096,
        "one NI buffer (a page): a store is copied and DMAed fragment by fragment",
        "bytes",
    )
    tokens: int = estimate(8, "outstanding requests per receiver", "requests")
    max_request: int = estimate(
        131072,
        "largest store, the size of the bulk buffer; the benchmarks packetize longer messages "
        "(paper 004 §4.1)",
        "bytes",
    )
    rx_store_and_forward: bool = estimate(
        True,
        "GAM's LCP starts the NI-to-host DMA when a packet is whole in SRAM, after its CRC "
        "(paper 004 §3), rather than behind the arriving bytes",
        "",
    )


class Token:
    """Handed to a handler: who sent the message, and the right to reply (request handlers)."""

    def __init__(
        self, gam: Gam, src: int, is_request: bool, piece: tuple[int, int] = (0, 1)
    ) -> None:
        self.gam = gam
        #: (index, count) of this request among the packets of one datagram-face message.
        self.piece = piece
        self.src = src
        self.is_request = is_request
        self.replies: list[tuple[int, bytes]] = []

    def reply(self, handler: int, data: bytes = b"") -> None:
        """Reply to the requester (once, from a request handler only)."""
        if not self.is_request:
            raise LibraryError("GAM: a reply handler may not reply")
        if self.replies:
            raise LibraryError("GAM: a request handler may reply only once")
        if len(data) > self.gam.params.short_bytes:
            raise LibraryError(f"GAM: a reply carries at most {self.gam.params.short_bytes} bytes")
        self.replies.append((handler, bytes(data)))


class Gam(MyrinetLibrary):
    """Generic Active Messages on one node.  Peers are node indices."""

    LABEL = "Generic AM"
    MODEL = ModelChoices(
        communication="RPC",
        transfer="Combined",
        intranode_protection=True,
        internode_protection=False,
        multiprogramming=False,
        buffer_overflows="Prevented",
        net_errors="Catastrophic",
        net_management="Static",
    )
    IMPL = ImplChoices(
        send_data="DMA+Copy",
        recv_data="DMA+Copy",
        protection="Copy",
        reliability="Library+Copy",
        notification="Polling",
        short="PIO(WC) <= 32 B",
    )
    TABLE3 = ("Os", "Os", "L", "Or", "-")

    def __init__(self, cluster: Lanai4Cluster, index: int, params: GamParams | None = None) -> None:
        super().__init__(cluster, index)
        self.params = params if params is not None else GamParams()
        self.request_handlers: list[RequestHandler] = [self._deliver]
        self.reply_handlers: list[ReplyHandler] = [lambda token, data: None]
        self._tokens: dict[int, int] = {}
        self._arrived: deque[Packet] = deque()
        self._in_handler = False
        self._buffers_busy = 0
        #: Per peer, whether each request awaiting its reply was a bulk store (FIFO, §2).
        self._pending: dict[int, deque[bool]] = {}

    @classmethod
    def open(cls, cluster: Lanai4Cluster, params: GamParams | None = None) -> list[Gam]:
        """An instance on every node of ``cluster``."""
        return open_group([cls(cluster, i, params) for i in range(len(cluster.nodes))])

    def joined(self) -> None:
        self._tokens = {peer: self.params.tokens for peer in self.peers}

    def register_request(self, handler: RequestHandler) -> int:
        """Register a request handler; returns its index (register in the same order on all)."""
        self.request_handlers.append(handler)
        return len(self.request_handlers) - 1

    def register_reply(self, handler: ReplyHandler) -> int:
        """Register a reply handler; returns its index."""
        self.reply_handlers.append(handler)
        return len(self.reply_handlers) - 1

    # --- sending -----------------------------------------------------------------------

    async def request(
        self, peer: int, handler: int, data: bytes | bytearray | memoryview = b""
    ) -> None:
        """Send a request to ``peer``'s request handler ``handler`` (polls for replies)."""
        await self._request(peer, handler, bytes(data), (0, 1))

    def request_nowait(
        self, peer: int, handler: int, data: bytes | bytearray | memoryview = b""
    ) -> None:
        """A short request sent without waiting, or :class:`trio.WouldBlock` (nothing sent)
        when no token for ``peer`` is left even after a :meth:`poll_nowait`.

        The host time :meth:`request` spends is reserved on the CPU behind what is queued
        there, and the request enters the NI when that reservation ends, as it would have.
        """
        if self._in_handler:
            raise LibraryError("GAM: a handler may not send a request")
        self.peer(peer)
        raw = bytes(data)
        p = self.params
        if len(raw) > p.short_bytes:
            raise LibraryError(
                f"GAM: a request sent without waiting carries at most {p.short_bytes} bytes"
            )
        if self._tokens[peer] == 0:
            self.poll_nowait()
            if self._tokens[peer] == 0:
                raise trio.WouldBlock
        self._tokens[peer] -= 1
        self._pending.setdefault(peer, deque()).append(False)
        self._transmit_nowait(
            peer, Packet(self.index, raw, kind="request", tag=handler), p.request_us
        )
        self.counters["requests"] += 1

    async def _request(self, peer: int, handler: int, raw: bytes, piece: tuple[int, int]) -> None:
        if self._in_handler:
            raise LibraryError("GAM: a handler may not send a request")
        self.peer(peer)
        p = self.params
        if len(raw) > p.max_request:
            raise LibraryError(f"GAM: a request carries at most {p.max_request} bytes")
        bulk = len(raw) > p.short_bytes
        await self.poll()

        # Replies return tokens and free the bulk buffer, so waiting means polling for them.
        def held() -> bool:
            return self._tokens[peer] == 0 or (bulk and self._buffers_busy >= p.send_buffers)

        while held():
            await self.wait_until(lambda: bool(self._arrived) or not held())
            await self.poll()
        self._tokens[peer] -= 1
        self._pending.setdefault(peer, deque()).append(bulk)
        packet = Packet(self.index, raw, kind="request", tag=handler, piece=piece)
        with trio.CancelScope(shield=True):  # a request, once started, goes out whole
            if bulk:
                await self._store(peer, packet)
            else:
                await self._transmit(peer, packet, p.request_us)
        self.counters["requests"] += 1

    async def _transmit(self, peer: int, packet: Packet, software_us: float) -> None:
        """A short message (request or reply): PIO with write combining into the NI."""
        p = self.params
        if len(packet.data) > p.short_bytes:
            raise LibraryError(f"GAM: a short message carries at most {p.short_bytes} bytes")
        packet.nbytes = len(packet.data) + p.header_bytes
        await self.host(software_us * US + self.platform.pio_write(packet.nbytes, True))
        self.inject(peer, packet, self.world.now(), lcp_cycles=p.lcp_send_cycles, dma=False)

    def _transmit_nowait(self, peer: int, packet: Packet, software_us: float) -> None:
        """:meth:`_transmit` from code that cannot wait: the CPU is reserved for the same time
        and the packet enters the NI when the reservation ends."""
        p = self.params
        packet.nbytes = len(packet.data) + p.header_bytes
        self.node.cpu.hold(
            software_us * US + self.platform.pio_write(packet.nbytes, True),
            self._inject_short,
            peer,
            packet,
        )

    def _inject_short(self, peer: int, packet: Packet) -> None:
        self.inject(
            peer, packet, self.world.now(), lcp_cycles=self.params.lcp_send_cycles, dma=False
        )

    async def _store(self, peer: int, packet: Packet) -> None:
        """A bulk request: copy into the bulk buffer and DMA out, one NI buffer at a time."""
        p = self.params
        self._buffers_busy += 1
        data = packet.data
        step = p.fragment_bytes
        count = -(-len(data) // step)
        footprint = self._footprint(packet)
        software = p.request_us * US
        out = self.world.now()
        for i in range(count):
            chunk = data[i * step : (i + 1) * step]
            await self.host(software + self.platform.copy(len(chunk), footprint))
            software = 0.0
            last = i == count - 1
            # The last fragment carries the request; the others only fill the receiver's buffer.
            frag = packet if last else Packet(self.index, chunk, kind="fragment")
            frag.nbytes = len(chunk) + p.header_bytes
            out, _ = self.inject(
                peer, frag, self.world.now(), lcp_cycles=p.lcp_send_cycles, dma=True
            )
        # Synchronous: the send returns once the data is out of the bulk buffer (Table 3: Os).
        await self.host_until(out)

    # --- receiving ---------------------------------------------------------------------

    def arrive(self, packet: Packet, first: float, last: float) -> None:
        p = self.params
        start = last if p.rx_store_and_forward and packet.nbytes > p.short_bytes else first
        t = self.lanai(self.node, start, p.lcp_recv_cycles)
        _, done = self.cluster.dma(self.node, "n2h", max(packet.nbytes, 4), t, max(t, last))
        if packet.kind != "fragment":
            self.at(done, self._landed, packet)

    def _landed(self, packet: Packet) -> None:
        self._arrived.append(packet)
        self.notify()

    async def poll(self) -> int:
        """Run the handlers of every arrived message (am_poll); returns how many ran."""
        if self._in_handler:
            raise LibraryError("GAM: a handler may not poll")
        ran = 0
        while self._arrived:
            packet = self._arrived.popleft()
            # A handled message must finish (its reply frees the requester's buffer) even if
            # the poll that took it is cancelled.
            with trio.CancelScope(shield=True):
                ran += await self._handle(packet)
        return ran

    def poll_nowait(self) -> int:
        """:meth:`poll` from code that cannot wait (a synchronous poll): the handlers run now,
        and the host time they take (dispatch, replies, the copy out of a bulk request) is
        reserved on the CPU in the order :meth:`poll` would spend it, each reply entering the
        NI when its reservation ends."""
        if self._in_handler:
            raise LibraryError("GAM: a handler may not poll")
        ran = 0
        cpu = self.node.cpu
        p = self.params
        while self._arrived:
            packet = self._arrived.popleft()
            is_request = packet.kind == "request"
            handlers = self.request_handlers if is_request else self.reply_handlers
            if not 0 <= packet.tag < len(handlers):
                self.drop("unknown_handler")
                if is_request:
                    self._transmit_nowait(packet.src, Packet(self.index, b"", kind="reply"), 0.0)
                else:
                    self._replied(packet.src)
                continue
            cpu.hold(p.handler_us * US)
            reply = self._run_handler(handlers[packet.tag], packet, is_request)
            if reply is not None:
                self._transmit_nowait(packet.src, reply, p.reply_us)
                if len(packet.data) > p.short_bytes:
                    cpu.hold(self.platform.copy(len(packet.data), self._footprint(packet)))
            ran += 1
        return ran

    def _run_handler(
        self, handler: RequestHandler | ReplyHandler, packet: Packet, is_request: bool
    ) -> Packet | None:
        """Run ``handler`` on ``packet``: a request's reply packet (the handler's, or the
        library's empty one), or None after a reply (its token returned)."""
        token = Token(self, packet.src, is_request, packet.piece)
        self._in_handler = True
        try:
            handler(token, packet.data)
        finally:
            self._in_handler = False
        if not is_request:
            self._replied(packet.src)
            self.counters["replies"] += 1
            return None
        handler_index, data = token.replies[0] if token.replies else (0, b"")
        if not token.replies:
            self.counters["automatic_replies"] += 1
        return Packet(self.index, data, kind="reply", tag=handler_index)

    @property
    def arrivals(self) -> int:
        """Messages that have landed and wait for a poll to run their handlers."""
        return len(self._arrived)

    def outstanding(self, peer: int) -> int:
        """Requests sent to ``peer`` whose replies have not been handled yet."""
        return len(self._pending.get(peer, ()))

    def take_message(self) -> tuple[int, bytes] | None:
        """The next message of the datagram face that a poll has delivered, or None."""
        if not self._inbox:
            return None
        self.counters["received"] += 1
        return self._inbox.popleft()

    async def _handle(self, packet: Packet) -> int:
        p = self.params
        is_request = packet.kind == "request"
        handlers = self.request_handlers if is_request else self.reply_handlers
        if not 0 <= packet.tag < len(handlers):
            self.drop("unknown_handler")
            if is_request:  # the requester's token and buffer still come back
                await self._transmit(packet.src, Packet(self.index, b"", kind="reply"), 0.0)
            else:
                self._replied(packet.src)
            return 0
        await self.host(p.handler_us * US)
        reply = self._run_handler(handlers[packet.tag], packet, is_request)
        if reply is not None:
            await self._transmit(packet.src, reply, p.reply_us)
            if len(packet.data) > p.short_bytes:
                # then out of the library buffer into the application's (Table 3: Or)
                await self.host(self.platform.copy(len(packet.data), self._footprint(packet)))
        return 1

    def _replied(self, src: int) -> None:
        """A reply from ``src``: its token returns, and a store's bulk buffer is free again."""
        self._tokens[src] += 1
        pending = self._pending.get(src)
        if pending and pending.popleft():
            self._buffers_busy -= 1
        self.notify()

    def _footprint(self, packet: Packet) -> int:
        """The memory a stream of copies keeps touching, scaled to the cited cache knee."""
        length = packet.piece[1] * max(len(packet.data), 1)
        return length * self.platform.l2_cache_bytes // self.params.cache_knee_bytes

    def _deliver(self, token: Token, data: bytes) -> None:
        whole = self.join_piece(token.src, token.piece, data)
        if whole is not None:
            self.deliver(token.src, whole)

    # --- datagram face -----------------------------------------------------------------

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        raw = self.check_size(data)
        step = self.params.max_request
        count = max(1, -(-len(raw) // step))
        await self.lock_peer(peer)  # one message's pieces go out together
        try:
            for i in range(count):
                await self._request(peer, DELIVER, raw[i * step : (i + 1) * step], (i, count))
        finally:
            self.unlock_peer(peer)
        self.counters["sent"] += 1

    async def recv(self) -> tuple[int, bytes]:
        await self.poll()
        while not self._inbox:
            await self.wait_until(lambda: bool(self._arrived))
            await self.poll()
        self.counters["received"] += 1
        return self._inbox.popleft()
