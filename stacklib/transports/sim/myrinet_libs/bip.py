"""BIP-0.92 (paper 004 §2, Tables 1-2, §4.1): raw data transfer, no protection, no reliability.

Sends and receives of data only.  Below 256 bytes the host writes the message into NI memory
by PIO (no write combining: paper 004 §3 enables it for AM and FM only); from 256 bytes the
library translates the buffer's pages and the LANai DMAs straight from user memory, with the
network DMA behind it.  Sends are synchronous (paper 004 §4.1: the benchmarks use BIP's
synchronous sends): :meth:`Bip.send` returns once the data is out of the user's buffer.

Receiving follows Myrinet's STOP/GO flow control (paper 004 §4.1):

* a message of 256 bytes or more needs a posted receive; without one the receiving NI stops the
  link, and after 50 ms the sender resets it: the message and everything queued in the NI are
  lost (counted ``lost.forward_reset``, and the reset is counted in ``resets``);
* a smaller message with no receive posted waits in a fixed-size NI buffer; when that is full,
  the message is lost (``lost.small_buffer_full``); a later receive copies it out by PIO read.

A receive is posted while a task waits in :meth:`Bip.recv` or after :meth:`Bip.post`.  The
paper's benchmarks add synchronization messages for 256 bytes and up so nothing is lost (§4.1,
§4.2); ``synchronize=True`` does the same inside the service: the receiver sends a small "ready"
message each time it has consumed a large one, and a large send waits for it.
"""

from __future__ import annotations

from collections import deque

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

__all__ = ["Bip", "BipParams"]

US = 1e-6
PAGE = 4096


@attrs.frozen
class BipParams:
    """BIP-0.92's per-message costs and limits."""

    dma_threshold: int = cited(
        256, "paper 004 §4.1.1: BIP's knee at 256 bytes, from PIO to DMA", "bytes"
    )
    send_us: float = estimate(0.5, "check arguments, write a 16-byte descriptor into SRAM")
    recv_us: float = estimate(0.4, "poll a completion flag the LANai writes into host memory")
    v2p_page_us: float = estimate(0.3, "look up the physical address of each 4 KB page")
    lcp_send_cycles: float = estimate(
        40.0,
        "BIP's LCP: read the descriptor, start the network DMA; the thinnest of the five",
        "cycles",
    )
    lcp_recv_cycles: float = estimate(
        40.0, "match the posted receive, start the host DMA", "cycles"
    )
    small_buffer_slots: int = estimate(
        8,
        "BIP-0.92's fixed NI buffer for unposted small messages (size not in paper 004)",
        "messages",
    )
    header_bytes: int = estimate(8, "BIP's header written with a PIO message", "bytes")


class Bip(MyrinetLibrary):
    """BIP-0.92 on one node.  Peers are node indices."""

    LABEL = "BIP-0.92"
    MODEL = ModelChoices(
        communication="Send/Recv",
        transfer="Data Only",
        intranode_protection=False,
        internode_protection=False,
        multiprogramming=False,
        buffer_overflows="Data Loss",
        net_errors="Catastrophic",
        net_management="Static",
    )
    IMPL = ImplChoices(
        send_data="DMA+v2p trans",
        recv_data="DMA+v2p trans",
        protection="None",
        reliability="None",
        notification="None",
        short="PIO < 256 B",
    )
    TABLE3 = ("-", "Os", "Os", "Os", "-")

    def __init__(
        self,
        cluster: Lanai4Cluster,
        index: int,
        params: BipParams | None = None,
        *,
        synchronize: bool = False,
    ) -> None:
        super().__init__(cluster, index)
        self.params = params if params is not None else BipParams()
        self.synchronize = synchronize
        self._posted = 0
        self._small: deque[Packet] = deque()  # the NI's fixed buffer
        self._ready: dict[int, int] = {}
        self._stopped_until = 0.0

    @classmethod
    def open(
        cls,
        cluster: Lanai4Cluster,
        params: BipParams | None = None,
        *,
        synchronize: bool = False,
    ) -> list[Bip]:
        """An instance on every node of ``cluster``."""
        return open_group(
            [cls(cluster, i, params, synchronize=synchronize) for i in range(len(cluster.nodes))]
        )

    def joined(self) -> None:
        self._ready = {peer: 1 for peer in self.peers}

    # --- sending -----------------------------------------------------------------------

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        raw = self.check_size(data)
        self.peer(peer)
        p = self.params
        large = len(raw) >= p.dma_threshold
        if large and self.synchronize:
            await self.wait_until(lambda: self._ready[peer] > 0)
            self._ready[peer] -= 1
        platform = self.platform
        packet = Packet(self.index, raw)
        if not large:
            await self.host(p.send_us * US + platform.pio_write(len(raw) + p.header_bytes, False))
            self.inject(peer, packet, self.world.now(), lcp_cycles=p.lcp_send_cycles, dma=False)
        else:
            pages = -(-len(raw) // PAGE)
            await self.host(p.send_us * US + pages * p.v2p_page_us * US)
            out, _ = self.inject(
                peer, packet, self.world.now(), lcp_cycles=p.lcp_send_cycles, dma=True
            )
            await self.host_until(out)  # synchronous: the user buffer is free after the DMA
        self.counters["sent"] += 1

    # --- receiving ---------------------------------------------------------------------

    def post(self) -> None:
        """Post one receive: the next message that arrives goes straight to host memory."""
        self._posted += 1

    def arrive(self, packet: Packet, first: float, last: float) -> None:
        p = self.params
        if packet.kind == "ready":
            t = self.lanai(self.node, first, p.lcp_recv_cycles)
            self.at(t, self._on_ready, packet.src)
            return
        if first < self._stopped_until:
            self.drop("forward_reset")  # arrives on a link being reset
            return
        if self._posted > 0:
            self._posted -= 1
            done = self.to_host(packet, first, last, p.lcp_recv_cycles)
            self.at(done, self.deliver, packet.src, packet.data)
            return
        if len(packet.data) >= p.dma_threshold:
            # STOP/GO: the link stays stopped until the sender's forward reset empties this
            # NI's queues (paper 004 §4.1).
            reset = self.platform.forward_reset_ms * 1e-3
            sender = self.group[packet.src].node
            sender.net_tx.busy_until = max(sender.net_tx.busy_until, first + reset)
            self._stopped_until = first + reset
            self.counters["resets"] += 1
            self.drop("forward_reset")
            self.at(first + reset, self._reset)
            return
        if len(self._small) >= p.small_buffer_slots:
            self.drop("small_buffer_full")
            return
        self.lanai(self.node, first, p.lcp_recv_cycles)
        self._small.append(packet)
        self.notify()

    def _reset(self) -> None:
        lost = len(self._small)
        self._small.clear()
        if lost:
            self.counters["lost.forward_reset"] += lost

    def _on_ready(self, src: int) -> None:
        self._ready[src] += 1
        self.notify()

    async def recv(self) -> tuple[int, bytes]:
        p = self.params
        if self._small and not self._inbox:
            # Posting finds the message in the NI buffer: the LANai DMAs it over.
            packet = self._small.popleft()
            t = self.lanai(self.node, self.world.now(), p.lcp_recv_cycles)
            _, done = self.cluster.dma(self.node, "n2h", max(len(packet.data), 4), t, t)
            await self.host(p.recv_us * US)
            await self.host_until(done)
            self.counters["received"] += 1
            return packet.src, packet.data
        if not self._inbox:
            if self._posted == 0:
                self._posted = 1  # the receive stays posted if the wait is cancelled
            await self.wait_until(lambda: bool(self._inbox) or bool(self._small))
            if not self._inbox:
                return await self.recv()
        src, data = self._inbox.popleft()
        await self.host(p.recv_us * US)
        if self.synchronize and len(data) >= p.dma_threshold:
            # The benchmarks' synchronization (paper 004 §4.1): post the next receive, then
            # tell the sender it may send another large message.
            self._posted += 1
            await self._send_ready(src)
        self.counters["received"] += 1
        return src, data

    async def _send_ready(self, peer: int) -> None:
        p = self.params
        await self.host(p.send_us * US + self.platform.pio_write(p.header_bytes, False))
        packet = Packet(self.index, b"", kind="ready")
        self.inject(peer, packet, self.world.now(), lcp_cycles=p.lcp_send_cycles, dma=False)

    def check_size(self, data: bytes | bytearray | memoryview) -> bytes:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise LibraryError(f"BIP sends bytes, not {type(data).__name__}")
        return super().check_size(data)
