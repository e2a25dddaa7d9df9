"""VMMC-2 (paper 004 §2, Tables 1-2, §4): direct deposit into imported buffers.

A receiver *exports* a buffer; a sender *imports* it and deposits data at an offset into it.
There is no receive call: the NI moves the data into the receiver's memory, translating the
virtual address in the NI (Table 2 "v2p trans"), and the receiver learns of it by spinning on a
flag in its own memory, so its receive overhead is zero (paper 004 §4.1.4, Fig 7) and the
transfer into its memory belongs to L (Table 3).  There is no flow control (Table 1: overflows
"Impossible" because the sender names the place): a deposit overwrites whatever is there,
whether or not the receiver has seen it (paper 004 §4.1).  Reliability is in the NI firmware,
which costs LANai cycles on every message (§5 "Reliable communication").  Below 64 bytes the
host writes the data into the NI by PIO; from 64 bytes the LANai DMAs it from user memory
(§4.1.1: VMMC's knee at 64 B).  Sends are asynchronous (§4.1).

As a datagram service (:class:`Vmmc`), each node exports to each peer a ring of ``slots``
message slots with a flag each; a send deposits into the next slot, and :meth:`Vmmc.recv` spins
on the next slot's flag.  A sender that laps the receiver overwrites unread messages: the
receiver finds a newer sequence number in the slot and counts the ones it missed
(``lost.overwritten``).
"""

from __future__ import annotations

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

__all__ = ["ExportedBuffer", "ImportedBuffer", "Vmmc", "VmmcParams"]

US = 1e-6


@attrs.frozen
class VmmcParams:
    """VMMC-2's per-message costs and limits."""

    dma_threshold: int = cited(64, "paper 004 §4.1.1: VMMC's knee at 64 bytes, PIO to DMA", "bytes")
    send_us: float = estimate(1.2, "check the import handle and bounds, write the descriptor")
    header_bytes: int = estimate(16, "descriptor: import handle, offset, length, flag", "bytes")
    lcp_send_cycles: float = estimate(70.0, "VMMC's LCP send: descriptor, route", "cycles")
    lcp_recv_cycles: float = estimate(50.0, "demultiplex, start the host DMA", "cycles")
    reliability_cycles: float = estimate(
        60.0,
        "per side: sequence numbers, acknowledgments and the retransmission buffer in firmware;"
        " paper 004 §4.1.1 puts reliability at 2.5-3.5 us of latency",
        "cycles",
    )
    translation_cycles: float = estimate(
        30.0, "per side: the NI's virtual-to-physical lookup (UTLB, paper 004 ref [6])", "cycles"
    )
    slots: int = estimate(16, "message slots per peer of the datagram face's ring", "slots")


class ExportedBuffer:
    """Receive memory exported by a node: deposits land here with no receive call."""

    def __init__(self, owner: Vmmc, name: str, size: int) -> None:
        self.owner = owner
        self.name = name
        self.data = bytearray(size)
        #: Deposits completed into this buffer (the flag a receiver spins on).
        self.deposits = 0


class ImportedBuffer:
    """A sender's handle on a peer's exported buffer."""

    def __init__(self, importer: Vmmc, target: ExportedBuffer) -> None:
        self.importer = importer
        self.target = target

    @property
    def size(self) -> int:
        return len(self.target.data)

    async def deposit(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``offset`` of the remote buffer (asynchronous; no flow control)."""
        raw = bytes(data)
        if offset < 0 or offset + len(raw) > self.size:
            raise LibraryError(
                f"VMMC: a deposit of {len(raw)} bytes at offset {offset} falls outside "
                f"{self.target.name!r} ({self.size} bytes)"
            )
        await self.importer._deposit(self.target, offset, raw, tag=-1)


class Vmmc(MyrinetLibrary):
    """VMMC-2 on one node.  Peers are node indices."""

    LABEL = "VMMC-2"
    MODEL = ModelChoices(
        communication="Direct Deposit",
        transfer="Separate",
        intranode_protection=True,
        internode_protection=True,
        multiprogramming=True,
        buffer_overflows="Impossible",
        net_errors="Tolerated",
        net_management="Dynamic/Demand",
    )
    IMPL = ImplChoices(
        send_data="DMA+v2p trans",
        recv_data="DMA+v2p trans",
        protection="v2p trans",
        reliability="Firmware",
        notification="N/A",
        short="PIO < 64 B",
    )
    TABLE3 = ("-", "L", "L", "L", "-")

    def __init__(
        self, cluster: Lanai4Cluster, index: int, params: VmmcParams | None = None
    ) -> None:
        super().__init__(cluster, index)
        self.params = params if params is not None else VmmcParams()
        self.exports: dict[str, ExportedBuffer] = {}
        # Datagram face: per peer, the slots this node receives into and the next sequence.
        self._slots: dict[int, list[tuple[int, bytes] | None]] = {}
        self._send_seq: dict[int, int] = {}
        self._recv_seq: dict[int, int] = {}
        self._ring = ExportedBuffer(self, "<ring>", 1)

    @classmethod
    def open(cls, cluster: Lanai4Cluster, params: VmmcParams | None = None) -> list[Vmmc]:
        """An instance on every node of ``cluster``."""
        return open_group([cls(cluster, i, params) for i in range(len(cluster.nodes))])

    def joined(self) -> None:
        for peer in self.peers:
            self._slots[peer] = [None] * self.params.slots
            self._send_seq[peer] = self._recv_seq[peer] = 0

    # --- the VMMC API ------------------------------------------------------------------

    def export(self, name: str, size: int) -> ExportedBuffer:
        """Export ``size`` bytes of receive memory under ``name``."""
        if name in self.exports:
            raise LibraryError(f"VMMC: {name!r} is already exported on {self.node.name}")
        if size <= 0:
            raise LibraryError(f"VMMC: an exported buffer needs a positive size, not {size}")
        buffer = self.exports[name] = ExportedBuffer(self, name, size)
        return buffer

    def import_buffer(self, peer: int, name: str) -> ImportedBuffer:
        """Import ``name`` exported by node ``peer`` (the protected channel's set-up)."""
        target = self.peer(peer)
        assert isinstance(target, Vmmc)
        exported = target.exports.get(name)
        if exported is None:
            raise LibraryError(f"VMMC: node {peer} exports no buffer {name!r}")
        return ImportedBuffer(self, exported)

    async def _deposit(self, target: ExportedBuffer, offset: int, raw: bytes, tag: int) -> None:
        p = self.params
        await self.tx_slot()
        packet = Packet(self.index, raw, kind="deposit", tag=tag, where=target, offset=offset)
        cycles = p.lcp_send_cycles + p.reliability_cycles + p.translation_cycles
        if len(raw) < p.dma_threshold:
            await self.host(
                p.send_us * US + self.platform.pio_write(len(raw) + p.header_bytes, False)
            )
            self.inject(target.owner.index, packet, self.world.now(), lcp_cycles=cycles, dma=False)
        else:
            await self.host(p.send_us * US + self.platform.pio_write(p.header_bytes, False))
            self.inject(target.owner.index, packet, self.world.now(), lcp_cycles=cycles, dma=True)
        self.counters["sent"] += 1

    def arrive(self, packet: Packet, first: float, last: float) -> None:
        p = self.params
        cycles = p.lcp_recv_cycles + p.reliability_cycles + p.translation_cycles
        done = self.to_host(packet, first, last, cycles)
        self.at(done, self._landed, packet)

    def _landed(self, packet: Packet) -> None:
        target, offset = packet.where, packet.offset
        if isinstance(target, ExportedBuffer) and packet.tag < 0:
            target.data[offset : offset + len(packet.data)] = packet.data
            target.deposits += 1
        else:
            ring = self._slots[packet.src]
            ring[packet.tag % len(ring)] = (packet.tag, packet.data)
        self.counters["deposits"] += 1
        self.notify()

    # --- datagram face -----------------------------------------------------------------

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        raw = self.check_size(data)
        target = self.peer(peer)
        assert isinstance(target, Vmmc)
        seq = self._send_seq[peer]
        self._send_seq[peer] = seq + 1
        await self._deposit(target._ring, 0, raw, tag=seq)

    async def recv(self) -> tuple[int, bytes]:
        """Spin on the flag of each peer's next slot: no host work beyond the check."""
        while True:
            for peer in self.peers:
                ring = self._slots[peer]
                want = self._recv_seq[peer]
                entry = ring[want % len(ring)]
                if entry is None or entry[0] < want:
                    continue
                seq, data = entry
                if seq > want:
                    # Lapped: the sender overwrote unread slots.  Resume at the oldest message
                    # still in the ring; the ones before it are lost.
                    seq, data = min(e for e in ring if e is not None and e[0] >= want)
                    self.counters["lost.overwritten"] += seq - want
                self._recv_seq[peer] = seq + 1
                self.counters["received"] += 1
                return peer, data
            await self._changed.wait()
