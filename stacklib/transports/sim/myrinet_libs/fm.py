"""FM-2.02 (paper 004 §2, Tables 1-2, §4): streaming messages with handlers and flow control.

Sending is a stream: :meth:`Fm.begin_message` opens a message of a stated length to a peer's
handler, :meth:`FmSend.piece` gathers it from pieces anywhere in user memory, and the host
writes every byte into NI memory by PIO with write combining (Table 2 "PIO(WC)"; paper 004 §3
enables WC for AM and FM), so the send overhead grows with size (§4.1.3).  The stream is cut
into packets; each goes as soon as it is full, while the host is still writing the next.

Receiving: the LANai DMAs packets into a library buffer in host memory; :meth:`Fm.extract`
polls and runs the message's handler as soon as its *first* packet is there (§4.1.5: "the
receiving message handler is called when the first byte of the message arrives, while the
sender may still be sending parts of the same message").  The handler pulls the data out with
:meth:`FmReceive.receive`, a copy into user memory per piece (Table 2 "DMA+Copy"), waiting for
later packets as needed.  Flow control is between sender and receiver: a sender holds credits
for the receiver's packet buffers and the receiver returns them as its handlers consume packets.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

import attrs

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

__all__ = ["Fm", "FmParams", "FmReceive", "FmSend", "Handler"]

US = 1e-6

Handler = Callable[["FmReceive"], Awaitable[None]]


@attrs.frozen
class FmParams:
    """FM-2.02's per-message costs and limits."""

    send_us: float = estimate(1.6, "FM_begin_message/FM_end_message: credits, header")
    piece_us: float = estimate(0.2, "FM_send_piece bookkeeping per piece")
    recv_us: float = estimate(2.5, "FM_extract: poll, look up and call the handler")
    lcp_send_cycles: float = estimate(50.0, "FM's LCP: start the network DMA", "cycles")
    lcp_recv_cycles: float = estimate(50.0, "take a host buffer, start the host DMA", "cycles")
    header_bytes: int = estimate(8, "handler, length and sender in each packet", "bytes")
    packet_bytes: int = estimate(
        1024,
        "FM-2's packet payload; streams of 2 KB and up span packets, where paper 004 §4.1.5 sees"
        " FM's L drop",
        "bytes",
    )
    cache_knee_bytes: int = cited(
        256 * 1024,
        "paper 004 §4.2: FM's knee at 256 KBytes in all bandwidths, due to cache effects (the "
        "receive copy's destination outgrows the 256 KB L2, paper 004 §3)",
        "bytes",
    )
    credits: int = estimate(32, "receiver packet buffers per sender", "packets")
    credit_cycles: float = estimate(20.0, "the NI returns a credit to the sender", "cycles")


@attrs.define(eq=False)
class _Incoming:
    src: int
    handler: int
    length: int
    packets: deque[bytes] = attrs.field(factory=deque)
    arrived: int = 0
    count: int = 1


class FmSend:
    """An outgoing message being gathered (from :meth:`Fm.begin_message`)."""

    def __init__(self, fm: Fm, peer: int, handler: int, length: int) -> None:
        self.fm = fm
        self.peer = peer
        self.handler = handler
        self.length = length
        self.written = 0
        self._buffer = bytearray()
        self._index = 0
        self._count = max(1, -(-length // fm.params.packet_bytes))

    async def piece(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` to the message (FM_send_piece): PIO-write it into NI packets."""
        raw = bytes(data)
        if self.written + len(raw) > self.length:
            raise LibraryError(f"FM: pieces exceed the {self.length} bytes given to begin_message")
        fm = self.fm
        self.written += len(raw)
        await fm.host(fm.params.piece_us * US)
        self._buffer += raw
        size = fm.params.packet_bytes
        while len(self._buffer) >= size and self._index < self._count - 1:
            await self._flush(bytes(self._buffer[:size]))
            del self._buffer[:size]

    async def _flush(self, payload: bytes) -> None:
        fm = self.fm
        p = fm.params
        await fm.wait_until(lambda: fm._credits[self.peer] > 0)
        fm._credits[self.peer] -= 1
        await fm.host(fm.platform.pio_write(len(payload) + p.header_bytes, True))
        packet = Packet(
            fm.index,
            payload,
            tag=self.handler,
            piece=(self._index, self._count),
            nbytes=len(payload) + p.header_bytes,
        )
        packet.offset = self.length  # the header tells the receiver the message's length
        fm.inject(self.peer, packet, fm.world.now(), lcp_cycles=p.lcp_send_cycles, dma=False)
        self._index += 1

    async def end(self) -> None:
        """Finish the message (FM_end_message); it must have exactly its stated length.

        It releases the peer's send lock :meth:`Fm.begin_message` took, so it is called by
        the task that began the message."""
        if self.written != self.length:
            raise LibraryError(f"FM: message ended after {self.written} of its {self.length} bytes")
        try:
            await self._flush(bytes(self._buffer))
            self._buffer.clear()
        finally:
            self.fm.unlock_peer(self.peer)
        await self.fm.host(self.fm.params.send_us * US / 2)
        self.fm.counters["sent"] += 1


class FmReceive:
    """An incoming message, handed to its handler when its first packet is in host memory."""

    def __init__(self, fm: Fm, incoming: _Incoming) -> None:
        self.fm = fm
        self._in = incoming
        self.remaining = incoming.length
        self._held = b""

    @property
    def sender(self) -> int:
        return self._in.src

    @property
    def length(self) -> int:
        return self._in.length

    async def receive(self, nbytes: int) -> bytes:
        """The next ``nbytes`` of the message (FM_receive), copied out of FM's buffers."""
        if nbytes > self.remaining:
            raise LibraryError(f"FM: asked for {nbytes} bytes, {self.remaining} remain")
        fm = self.fm
        out = bytearray(self._held[:nbytes])
        self._held = self._held[nbytes:]
        while len(out) < nbytes:
            await fm.wait_until(lambda: bool(self._in.packets))
            packet = self._in.packets.popleft()
            footprint = self._in.length * fm.platform.l2_cache_bytes // fm.params.cache_knee_bytes
            await fm.host(fm.platform.copy(len(packet), footprint))
            fm._return_credit(self._in.src)
            take = nbytes - len(out)
            out += packet[:take]
            self._held = packet[take:]
        self.remaining -= nbytes
        return bytes(out)


class Fm(MyrinetLibrary):
    """FM-2.02 on one node.  Peers are node indices."""

    LABEL = "FM-2.02"
    MODEL = ModelChoices(
        communication="Send/Recv",
        transfer="Combined",
        intranode_protection=True,
        internode_protection=False,
        multiprogramming=False,
        buffer_overflows="Prevented",
        net_errors="Catastrophic",
        net_management="Static",
    )
    IMPL = ImplChoices(
        send_data="PIO(WC)",
        recv_data="DMA+Copy",
        protection="PIO+Copy",
        reliability="None",
        notification="Polling",
        short="PIO(WC) always",
    )
    TABLE3 = ("-", "L", "L", "Or", "-")

    def __init__(self, cluster: Lanai4Cluster, index: int, params: FmParams | None = None) -> None:
        super().__init__(cluster, index)
        self.params = params if params is not None else FmParams()
        self.handlers: list[Handler] = [self._deliver_handler]
        self._credits: dict[int, int] = {}
        self._incoming: deque[_Incoming] = deque()
        self._streams: dict[int, _Incoming] = {}
        self._in_handler = False

    @classmethod
    def open(cls, cluster: Lanai4Cluster, params: FmParams | None = None) -> list[Fm]:
        """An instance on every node of ``cluster``."""
        return open_group([cls(cluster, i, params) for i in range(len(cluster.nodes))])

    def joined(self) -> None:
        self._credits = {peer: self.params.credits for peer in self.peers}

    def register(self, handler: Handler) -> int:
        """Register a receive handler on this node; returns its index (same order everywhere)."""
        self.handlers.append(handler)
        return len(self.handlers) - 1

    async def begin_message(self, peer: int, length: int, handler: int) -> FmSend:
        """Start a ``length``-byte message to ``peer``'s handler ``handler`` (FM_begin_message)."""
        self.peer(peer)
        if length < 0 or length > self.MAX_MESSAGE:
            raise LibraryError(f"FM: message length {length} outside 0..{self.MAX_MESSAGE}")
        # One message's packets go out together (its stream at the receiver is per sender):
        # held until end(), so a second message to the same peer waits for this one.
        await self.lock_peer(peer)
        try:
            await self.host(self.params.send_us * US / 2)
        except BaseException:
            self.unlock_peer(peer)
            raise
        return FmSend(self, peer, handler, length)

    # --- arrival and extraction ----------------------------------------------------------

    def arrive(self, packet: Packet, first: float, last: float) -> None:
        p = self.params
        if packet.kind == "credit":
            t = self.lanai(self.node, first, p.credit_cycles)
            self.at(t, self._credit, packet.src)
            return
        done = self.to_host(packet, first, last, p.lcp_recv_cycles)
        self.at(done, self._landed, packet)

    def _credit(self, src: int) -> None:
        self._credits[src] += 1
        self.notify()

    def _landed(self, packet: Packet) -> None:
        index, count = packet.piece
        if index == 0:
            incoming = _Incoming(packet.src, packet.tag, packet.offset, count=count)
            self._incoming.append(incoming)
            if count > 1:
                self._streams[packet.src] = incoming
        else:
            incoming = self._streams[packet.src]
            if index == count - 1:
                del self._streams[packet.src]
        incoming.packets.append(packet.data)
        incoming.arrived += 1
        self.notify()

    def _return_credit(self, src: int) -> None:
        credit = Packet(self.index, b"", kind="credit")
        self.inject(src, credit, self.world.now(), lcp_cycles=self.params.credit_cycles, dma=False)

    async def extract(self, limit: int | None = None) -> int:
        """Poll (FM_extract): run the handlers of messages whose first packet is here (at most
        ``limit`` of them); returns how many ran."""
        ran = 0
        while self._incoming and (limit is None or ran < limit):
            incoming = self._incoming.popleft()
            if not 0 <= incoming.handler < len(self.handlers):
                self.drop("unknown_handler")
                continue
            await self.host(self.params.recv_us * US)
            stream = FmReceive(self, incoming)
            self._in_handler = True
            try:
                await self.handlers[incoming.handler](stream)
                if stream.remaining:  # the rest is discarded, its buffers freed
                    await stream.receive(stream.remaining)
            finally:
                self._in_handler = False
            ran += 1
        return ran

    async def _deliver_handler(self, stream: FmReceive) -> None:
        self.deliver(stream.sender, await stream.receive(stream.length))

    # --- datagram face -----------------------------------------------------------------

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        raw = self.check_size(data)
        message = await self.begin_message(peer, len(raw), 0)
        await message.piece(raw)
        await message.end()

    async def recv(self) -> tuple[int, bytes]:
        while not self._inbox:
            await self.wait_until(lambda: bool(self._incoming) or bool(self._inbox))
            await self.extract(1)
        self.counters["received"] += 1
        return self._inbox.popleft()
