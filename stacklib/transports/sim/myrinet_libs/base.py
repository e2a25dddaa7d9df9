"""What the five libraries of paper 004 share: declared choices, tables, and the data path.

Each library declares its programming-model choices (paper 004 Table 1, :class:`ModelChoices`),
its implementation choices (Table 2, :class:`ImplChoices`) and where each stage of a message's
path is charged in LogP terms (Table 3, :data:`STAGES`).  :func:`table` renders those tables
from the declarations, so ``stacklib libraries`` never types them a second time.

At run time a library is a :class:`~stacklib.services.DatagramService` on one node of a
:class:`~stacklib.transports.sim.lanai4.Lanai4Cluster`; its instances on the other nodes form a
group, indexed by node, and a peer is a node index.  Costs are not fitted per library: each path
is the platform's operations in the order the library's design performs them (PIO or DMA, who
starts the DMA, which copies, which waits), plus a fixed per-message amount of host software and
LANai firmware whose estimate each library states.  The host's CPU is held for the host's part
(the LogP harness's computation queues behind it); the LANai, PCI engine and network engines are
reserved with the pipeline recurrence.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, TypeVar

import attrs
import trio

from stacklib.errors import StacklibError
from stacklib.services import DatagramService
from stacklib.sim.costs import cited
from stacklib.sim.pipeline import stage
from stacklib.transports.sim.lanai4 import Initiator, Lanai4Cluster, Lanai4Node

__all__ = [
    "STAGES",
    "ImplChoices",
    "LibraryError",
    "ModelChoices",
    "MyrinetLibrary",
    "Packet",
    "estimate",
    "open_group",
    "table",
]

US = 1e-6
L = TypeVar("L", bound="MyrinetLibrary")
T = TypeVar("T")


class LibraryError(StacklibError):
    """Misuse of one of the paper 004 libraries (the message names the rule broken)."""


@attrs.frozen
class ModelChoices:
    """A library's programming model: one column of paper 004 Table 1."""

    communication: str
    transfer: str
    intranode_protection: bool
    internode_protection: bool
    multiprogramming: bool
    buffer_overflows: str
    net_errors: str
    net_management: str


@attrs.frozen
class ImplChoices:
    """A library's implementation: one column of paper 004 Table 2 (plus its short path)."""

    send_data: str
    recv_data: str
    protection: str
    reliability: str
    notification: str
    #: How short messages go (Table 2's caption: all but PM use PIO for them).
    short: str


#: Paper 004 Table 3's path stages, in order; a library's ``TABLE3`` gives the LogP parameter
#: each is charged to ("-" where the stage does not occur).
STAGES = (
    "Application to System Buffer",
    "Application/System Buf to NI",
    "NI to NI",
    "NI to Application/System Buffer",
    "System to Application Buffer",
)

_TABLE1: tuple[tuple[str, str], ...] = (
    ("Commun. Model", "communication"),
    ("Control/Data Transfer", "transfer"),
    ("Intranode Protection", "intranode_protection"),
    ("Internode Protection", "internode_protection"),
    ("Multi-programming", "multiprogramming"),
    ("Buffer Overflows", "buffer_overflows"),
    ("Net Errors", "net_errors"),
    ("Net Management", "net_management"),
)
_TABLE2: tuple[tuple[str, str], ...] = (
    ("Send Data", "send_data"),
    ("Recv Data", "recv_data"),
    ("Protection", "protection"),
    ("Reliability", "reliability"),
    ("Notification", "notification"),
    ("Short Messages", "short"),
)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "Yes" if value else "No"
    return str(value)


def table(number: int, libraries: Sequence[type[MyrinetLibrary]]) -> str:
    """Paper 004 Table ``number`` (1, 2 or 3) for ``libraries``, from their declarations."""
    header = ["", *(lib.LABEL for lib in libraries)]
    rows: list[list[str]]
    if number == 1:
        rows = [[h, *(_cell(getattr(lib.MODEL, a)) for lib in libraries)] for h, a in _TABLE1]
    elif number == 2:
        rows = [[h, *(_cell(getattr(lib.IMPL, a)) for lib in libraries)] for h, a in _TABLE2]
    elif number == 3:
        rows = [[s, *(lib.TABLE3[i] for lib in libraries)] for i, s in enumerate(STAGES)]
    else:
        raise ValueError(f"paper 004 has Tables 1, 2 and 3, not {number!r}")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    head = "  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()
    return "\n".join([head, "  ".join("-" * w for w in widths), *lines])


@attrs.define(eq=False)
class Packet:
    """One packet between two instances of a library."""

    src: int
    data: bytes
    kind: str = "data"
    #: Library-specific: a sequence number, a slot, a handler index.
    tag: int = 0
    #: Bytes the packet occupies on the wire (its data, unless it only stands for some).
    nbytes: int = -1
    #: Pieces of a streamed message: (index, count).
    piece: tuple[int, int] = (0, 1)
    #: Library-specific: where the data lands (a VMMC exported buffer) and at what offset
    #: (FM: the whole message's length, carried in its header).
    where: object = None
    offset: int = 0

    def __attrs_post_init__(self) -> None:
        if self.nbytes < 0:
            self.nbytes = len(self.data)


def estimate(value: T, why: str, unit: str = "us") -> T:
    """An attrs field for an estimated library constant (``cited`` with "estimated: ...")."""
    return cited(value, "estimated: " + why, unit)


class MyrinetLibrary(DatagramService):
    """Base of the five libraries: a node's instance, its group, counters and the data path."""

    #: Name used in tables and on the command line.
    LABEL: ClassVar[str]
    MODEL: ClassVar[ModelChoices]
    IMPL: ClassVar[ImplChoices]
    TABLE3: ClassVar[tuple[str, str, str, str, str]]
    #: The largest message :meth:`send` takes.
    MAX_MESSAGE: ClassVar[int] = 1 << 20
    #: Packets a node's NI holds waiting for the wire before an asynchronous send must wait
    #: (estimated: SRAM send queue entries; 1 MB of SRAM holds far more data, paper 004 §3).
    TX_DEPTH: ClassVar[int] = 16

    def __init__(self, cluster: Lanai4Cluster, index: int) -> None:
        if not 0 <= index < len(cluster.node_list):
            raise LibraryError(f"{self.LABEL}: no node {index} in {cluster!r}")
        self.cluster = cluster
        self.platform = cluster.params
        self.index = index
        self.node: Lanai4Node = cluster.node_list[index]
        self.world = cluster.world
        self.group: list[MyrinetLibrary] = []
        self.counters: Counter[str] = Counter()
        self._changed = trio.Event()
        self._inbox: deque[tuple[int, bytes]] = deque()
        self._tx_outstanding = 0
        #: Per peer: held while one message's packets go out (:meth:`lock_peer`).
        self._send_locks: dict[int, trio.Lock] = {}
        #: Per sender: the pieces of the message being joined (:meth:`join_piece`).
        self._partial: dict[int, list[bytes]] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} on {self.node.name}>"

    # --- DatagramService ---------------------------------------------------------------

    @property
    def peers(self) -> Sequence[int]:
        return [lib.index for lib in self.group if lib is not self]

    @property
    def max_message(self) -> int:
        return self.MAX_MESSAGE

    def statistics(self) -> Mapping[str, object]:
        return dict(self.counters)

    # --- helpers for subclasses --------------------------------------------------------

    def peer(self, index: int) -> MyrinetLibrary:
        """The group member on node ``index``; a bad index raises :class:`LibraryError`."""
        if index == self.index or not 0 <= index < len(self.group):
            raise LibraryError(f"{self.LABEL}: {index!r} is not a peer of node {self.index}")
        return self.group[index]

    def check_size(self, data: bytes | bytearray | memoryview) -> bytes:
        raw = bytes(data)
        if len(raw) > self.MAX_MESSAGE:
            raise LibraryError(
                f"{self.LABEL}: a {len(raw)}-byte message exceeds {self.MAX_MESSAGE} bytes"
            )
        return raw

    def notify(self) -> None:
        """Wake every task waiting in :meth:`wait_until` (state changed)."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Park until ``ready()`` holds, rechecking after each :meth:`notify`."""
        while not ready():
            await self._changed.wait()

    async def host(self, seconds: float) -> None:
        """Keep this node's CPU busy for ``seconds`` (queued behind earlier holds)."""
        await self.node.cpu.use(max(0.0, seconds))

    async def host_until(self, when: float) -> None:
        """The CPU spins until virtual time ``when`` (a synchronous wait)."""
        now = self.world.now()
        if when > now:
            await self.node.cpu.use(when - now)

    def lanai(self, node: Lanai4Node, start: float, cycles: float) -> float:
        """Run ``cycles`` of firmware on ``node``'s LANai from ``start``; returns the end."""
        return stage(node.lanai, start, start, 1, self.platform.cycles(cycles))[1]

    def at(self, when: float, fn: Callable[..., object], *args: object) -> None:
        self.world.call_at(max(when, self.world.now()), fn, *args)

    async def tx_slot(self) -> None:
        """Wait for room in the NI's send queue (an asynchronous send's back-pressure)."""
        await self.wait_until(lambda: self._tx_outstanding < self.TX_DEPTH)

    def _tx_done(self) -> None:
        self._tx_outstanding -= 1
        self.notify()

    def inject(
        self,
        dst: int,
        packet: Packet,
        ready: float,
        *,
        lcp_cycles: float,
        dma: bool,
        overlap: bool = True,
        initiator: Initiator = "lanai",
    ) -> tuple[float, float]:
        """The sending NI's part from ``ready`` (descriptor, and data if PIO, in SRAM).

        The LANai runs ``lcp_cycles``; with ``dma`` it then pulls the data from host memory,
        and ``overlap`` starts the network DMA behind it (cut-through) rather than after it.
        The receiving instance's :meth:`arrive` is called when the packet's first bytes are in
        its NI's SRAM.  Returns (data out of host memory, last byte on the wire).
        """
        peer = self.peer(dst)
        cluster = self.cluster
        t = self.lanai(self.node, ready, lcp_cycles)
        if dma and packet.nbytes:
            first, last = cluster.dma(self.node, "h2n", packet.nbytes, t, t, initiator=initiator)
            out_of_host = last
        else:
            first = last = t
            out_of_host = ready
        wf, wl = cluster.wire(
            self.node, peer.node, packet.nbytes, first, last, store_and_forward=not overlap
        )
        self._tx_outstanding += 1
        self.at(wl, self._tx_done)
        self.at(wf, peer.arrive, packet, wf, wl)
        return out_of_host, wl

    def to_host(self, packet: Packet, first: float, last: float, lcp_cycles: float) -> float:
        """The receiving NI's part: firmware, then a LANai-started DMA into host memory behind
        the arriving bytes.  Returns when the last byte is in host memory."""
        t = self.lanai(self.node, first, lcp_cycles)
        _, done = self.cluster.dma(self.node, "n2h", max(packet.nbytes, 4), t, last)
        return done

    def joined(self) -> None:
        """The group is complete (:func:`open_group`): set up per-peer state here."""

    def arrive(self, packet: Packet, first: float, last: float) -> None:
        """A packet's first bytes reached this node's SRAM (``last``: when all will have)."""
        raise NotImplementedError

    def deliver(self, src: int, data: bytes) -> None:
        """A whole message is in host memory where the application will take it."""
        self._inbox.append((src, data))
        self.counters["delivered"] += 1
        self.notify()

    async def lock_peer(self, peer: int) -> None:
        """Hold ``peer``'s send lock until :meth:`unlock_peer`: one message's packets go out
        together, since the receiver joins a sender's packets in order and another task's
        message to the same peer would interleave with them.  A free lock is taken without a
        checkpoint, so a lone sender's timing is unchanged."""
        lock = self._send_locks.get(peer)
        if lock is None:
            lock = self._send_locks[peer] = trio.Lock()
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()

    def unlock_peer(self, peer: int) -> None:
        """Release what :meth:`lock_peer` took."""
        self._send_locks[peer].release()

    def join_piece(self, src: int, piece: tuple[int, int], data: bytes) -> bytes | None:
        """Add piece ``(index, count)`` of ``src``'s message; the whole message once its last
        piece is in, else None.  A piece that is not the next one is never joined to another
        message's pieces: the partial message is dropped (``lost.piece_out_of_order``)."""
        index, count = piece
        parts = self._partial.setdefault(src, [])
        if index != len(parts):
            self.drop("piece_out_of_order")
            parts.clear()
            if index != 0:
                return None
        parts.append(data)
        if index < count - 1:
            return None
        del self._partial[src]
        return b"".join(parts)

    def drop(self, reason: str) -> None:
        self.counters["lost." + reason] += 1

    async def next_message(self) -> tuple[int, bytes]:
        """Wait for the next delivered message and take it (no host cost charged here)."""
        await self.wait_until(lambda: bool(self._inbox))
        return self._inbox.popleft()


def open_group(libs: Sequence[L]) -> list[L]:
    """Join one instance per node (in node order) into a group, then tell each it has
    :meth:`~MyrinetLibrary.joined`; returns them as a list."""
    members = list(libs)
    if [lib.index for lib in members] != list(range(len(members))):
        raise LibraryError("a group needs one instance per node, in node order")
    for lib in members:
        lib.group = list(members)
    for lib in members:
        lib.joined()
    return members
