"""PM-1.2 (paper 004 §2, Tables 1-2, §4): gang-scheduled contexts, DMA always, immediate sending.

A daemon (:class:`PmDaemon`) multiplexes the NI among processes by gang scheduling: one job at a
time owns the NI on every node, which is how PM avoids most protection issues (paper 004 §2,
Table 2 "Gang Scheduling").  A context of a job that is not scheduled may not touch the NI: its
sends raise :class:`~stacklib.transports.sim.myrinet_libs.base.LibraryError`; messages already
on their way to it land in its own system buffers, which are saved with the context.

Data always goes by DMA, even for short messages (Table 2's caption), from PM's system buffers,
which the application fills and reads in place (paper 004 §2: the benchmarks "acquire and
access the PM system buffers directly"), so no copy is charged.  Sends are asynchronous (§4.1)
and use "immediate sending": the network DMA starts behind the host-to-NI DMA (§4.2), so their
times overlap.  A receiver's buffers are granted to senders as credits; a consumed buffer's
credit goes back from the NI (flow control between sender and receiver, §2).  Messages longer
than a packet are packetized, as paper 004's benchmarks do for PM (§4.1).
"""

from __future__ import annotations

import attrs

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

__all__ = ["Pm", "PmDaemon", "PmParams"]

US = 1e-6


@attrs.frozen
class PmParams:
    """PM-1.2's per-message costs and limits."""

    send_us: float = estimate(
        1.2, "take a system buffer, write the 16-byte send descriptor into SRAM by PIO"
    )
    recv_us: float = estimate(1.0, "poll the receive queue, return the previous buffer")
    lcp_send_cycles: float = estimate(
        60.0, "PM's LCP: the scheduled context's queue, credits, start both DMAs", "cycles"
    )
    lcp_recv_cycles: float = estimate(
        60.0, "check the context, take a receive buffer, start the host DMA", "cycles"
    )
    packet_bytes: int = estimate(8192, "PM's largest packet (the benchmark packetizes)", "bytes")
    credits: int = estimate(
        64, "receive buffers per sender, granted as credits (PM-1.2 flow control)", "packets"
    )
    credit_cycles: float = estimate(20.0, "the NI returns a credit to the sender", "cycles")


class PmDaemon:
    """The PM daemon of a cluster: gang-schedules one job at a time onto every NI."""

    def __init__(self, cluster: Lanai4Cluster) -> None:
        self.cluster = cluster
        self.jobs: dict[str, list[Pm]] = {}
        self.scheduled: str | None = None
        self.switches = 0

    def open(self, job: str, params: PmParams | None = None) -> list[Pm]:
        """Contexts of ``job`` on every node; the first job opened is scheduled."""
        if job in self.jobs:
            raise LibraryError(f"PM: job {job!r} is already open")
        libs = [
            Pm(self.cluster, i, params, daemon=self, job=job)
            for i in range(len(self.cluster.nodes))
        ]
        self.jobs[job] = open_group(libs)
        if self.scheduled is None:
            self.scheduled = job
        return libs

    def schedule(self, job: str) -> None:
        """Gang switch: ``job`` owns every node's NI from now on."""
        if job not in self.jobs:
            raise LibraryError(f"PM: no job {job!r} (open: {', '.join(self.jobs) or 'none'})")
        if job != self.scheduled:
            self.scheduled = job
            self.switches += 1
            for lib in self.jobs[job]:
                lib.notify()


class Pm(MyrinetLibrary):
    """A PM-1.2 context of one job on one node.  Peers are node indices."""

    LABEL = "PM-1.2"
    MODEL = ModelChoices(
        communication="Send/Recv",
        transfer="Combined",
        intranode_protection=True,
        internode_protection=True,
        multiprogramming=True,
        buffer_overflows="Tolerated",
        net_errors="Catastrophic",
        net_management="Static",
    )
    IMPL = ImplChoices(
        send_data="DMA+Copy",
        recv_data="DMA+Copy",
        protection="Gang Scheduling",
        reliability="None",
        notification="Polling",
        short="DMA always",
    )
    TABLE3 = ("-", "L", "L", "L", "-")

    def __init__(
        self,
        cluster: Lanai4Cluster,
        index: int,
        params: PmParams | None = None,
        *,
        daemon: PmDaemon,
        job: str,
    ) -> None:
        super().__init__(cluster, index)
        self.params = params if params is not None else PmParams()
        self.daemon = daemon
        self.job = job
        self._credits: dict[int, int] = {}

    @classmethod
    def open(cls, cluster: Lanai4Cluster, params: PmParams | None = None) -> list[Pm]:
        """A daemon with one job, ``"job0"``, scheduled: its context on every node."""
        return PmDaemon(cluster).open("job0", params)

    def joined(self) -> None:
        self._credits = {peer: self.params.credits for peer in self.peers}

    def __repr__(self) -> str:
        return f"<Pm job={self.job!r} on {self.node.name}>"

    def _check_scheduled(self) -> None:
        if self.daemon.scheduled != self.job:
            raise LibraryError(
                f"PM: job {self.job!r} is not scheduled on {self.node.name} "
                f"(the NI belongs to {self.daemon.scheduled!r}); one process at a time"
            )

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        raw = self.check_size(data)
        self.peer(peer)
        self._check_scheduled()
        p = self.params
        count = max(1, -(-len(raw) // p.packet_bytes))
        await self.lock_peer(peer)  # one message's packets go out together
        try:
            for i in range(count):
                piece = raw[i * p.packet_bytes : (i + 1) * p.packet_bytes]
                await self.wait_until(lambda: self._credits[peer] > 0)
                await self.tx_slot()
                self._check_scheduled()
                self._credits[peer] -= 1
                await self.host(p.send_us * US)
                packet = Packet(self.index, piece, piece=(i, count))
                self.inject(peer, packet, self.world.now(), lcp_cycles=p.lcp_send_cycles, dma=True)
        finally:
            self.unlock_peer(peer)
        self.counters["sent"] += 1

    def arrive(self, packet: Packet, first: float, last: float) -> None:
        p = self.params
        if packet.kind == "credit":
            t = self.lanai(self.node, first, p.credit_cycles)
            self.at(t, self._credit, packet.src)
            return
        done = self.to_host(packet, first, last, p.lcp_recv_cycles)
        self.at(done, self._piece, packet)

    def _credit(self, src: int) -> None:
        self._credits[src] += 1
        self.notify()

    def _piece(self, packet: Packet) -> None:
        index, count = packet.piece
        whole = self.join_piece(packet.src, packet.piece, packet.data)
        if whole is not None:
            self.deliver(packet.src, whole)
        elif index < count - 1:
            # The benchmark's receive loop takes each packet of a long message as it comes
            # (its host cost is charged with the message): its buffer is free again.
            self._return_credit(packet.src)

    def _return_credit(self, src: int) -> None:
        credit = Packet(self.index, b"", kind="credit")
        self.inject(src, credit, self.world.now(), lcp_cycles=self.params.credit_cycles, dma=False)

    async def recv(self) -> tuple[int, bytes]:
        src, data = await self.next_message()
        p = self.params
        count = max(1, -(-len(data) // p.packet_bytes))
        await self.host(p.recv_us * US * count)
        self._return_credit(src)
        self.counters["received"] += 1
        return src, data
