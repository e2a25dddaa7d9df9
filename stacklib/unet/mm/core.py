"""The sans-IO translation core of U-Net/MM: the NI TLB and the kernel module (paper 002 §4-§5).

An NI (the i960 firmware, or the DC21140/NT fast trap) calls this core; it never does I/O and
never reads a clock.  Inputs take ``now`` (seconds); results name the modeled operations they
performed as ``steps`` (priced by a :mod:`stacklib.unet.mm.costs` profile and charged by the
caller); the next deadline is :meth:`MemoryManager.get_timer` and events are pulled with
:meth:`MemoryManager.next_event`.

Transmit (paper 002 §4.1): :meth:`MemoryManager.translate_send` looks up every page of a send
buffer.  A hit costs a lookup.  A miss is a translation request to the kernel (a handshake over
the request queue and an interrupt on the PCA-200; inside the trap on the DC21140/NT): the kernel
pins a present page (reference count); a privilege violation becomes an error for the send
descriptor; a non-present page starts a deferred page-in and suspends *only* that endpoint
(status ``DEFERRED``, later ``SUSPENDED`` until :class:`Resumed`), while the NI serves the others.
Inserting a translation may evict the oldest victim-cache entry, which the kernel unpins.  The
pages stay busy (never evicted) until :meth:`MemoryManager.complete`.

Receive (paper 002 §4.1, §5.1.1): buffers posted with :meth:`MemoryManager.post_free` are
pre-translated, up to ``pretranslate`` of them per endpoint, by
:meth:`MemoryManager.pretranslate` as write translations: a present private page is pinned, a
read-only or shared one is copied (copy-on-write), a non-present page-aligned page-sized buffer
gets a fresh zero page where the implementation allows it (PCA-200, not DC21140/NT, paper 002
§6.1), any other non-present page is paged in while the buffer waits.  An arrival
(:meth:`MemoryManager.arrival`) takes pre-translated buffers in order; one whose page-in is not
done is skipped and returned unfilled (:class:`BufferReturned`); with no pre-translated buffer
the message is dropped and counted.

Closing an endpoint invalidates the entries it holds (paper 002 §4.2: the kernel never asks the
NI to invalidate; the NI does it at close).
"""

from __future__ import annotations

import enum
import heapq
from collections import Counter, deque
from collections.abc import Iterable

import attrs

from stacklib.errors import UNetError
from stacklib.sim import CostProfile
from stacklib.unet.mm.memory import AddressSpace, PhysicalMemory, Protection
from stacklib.unet.mm.tlb import Key, Tlb, TlbEntry, TlbGeometry

__all__ = [
    "Arrival",
    "BufferReturned",
    "Direction",
    "MemoryManager",
    "MissKind",
    "MmParams",
    "MmStatistics",
    "PageInDone",
    "Resumed",
    "Status",
    "Translation",
]


class Direction(enum.IntEnum):
    """Which way a buffer's data moves."""

    TRANSMIT = 0
    RECEIVE = 1


class MissKind(enum.StrEnum):
    """How the kernel served a TLB miss (Table 1's rows)."""

    PRESENT = "present"  #: pinned a present page
    COPY_ON_WRITE = "copy-on-write"  #: a write translation of a read-only or shared page
    ZERO_PAGE = "zero-page"  #: a fresh zero page for a page-aligned receive buffer
    PAGE_IN = "page-in"  #: a deferred page-in from disk
    PRIVILEGE = "privilege"  #: no right to the page: an error status, nothing pinned
    NO_ROOM = "no-room"  #: every evictable entry was busy: retry after a transfer completes


class Status(enum.Enum):
    """Outcome of a translation request or an arrival."""

    OK = "ok"  #: translated; the transfer may start
    DEFERRED = "deferred"  #: a page-in started; the endpoint is suspended until Resumed
    SUSPENDED = "suspended"  #: the endpoint waits for a page-in: serve other endpoints
    ERROR = "error"  #: privilege violation: set the send descriptor's error status
    NO_ROOM = "no-room"  #: retry after complete() (pinned-memory cap or busy victims)
    DROPPED = "dropped"  #: an arrival with no pre-translated buffer


@attrs.frozen
class MmParams:
    """Configuration of one NI's memory management."""

    geometry: TlbGeometry = attrs.field(factory=TlbGeometry)
    #: A non-present page-aligned, page-sized receive buffer gets a zero page instead of a
    #: page-in (PCA-200/Linux, paper 002 §5.1.1; not on the DC21140 whose buffers share pages).
    zero_map_in: bool = True
    #: Free buffers the NI keeps translated ahead of arrivals, per endpoint (paper 002 §4.1).
    pretranslate: int = attrs.field(default=4, validator=attrs.validators.ge(0))
    #: Seconds of a page-in from disk when no cost profile gives ``page_fault`` (Table 1: ~22 ms).
    page_in_seconds: float = 0.022


@attrs.frozen
class Translation:
    """Result of :meth:`MemoryManager.translate_send`."""

    status: Status
    steps: tuple[str, ...]
    #: The frame of every page of the buffer (when OK).
    frames: tuple[int, ...] = ()
    #: Pass to :meth:`MemoryManager.complete` when the DMA is done (when OK).
    transfer: int | None = None
    #: When DEFERRED: the virtual time the page-in completes.
    ready_at: float | None = None


@attrs.frozen
class Arrival:
    """Result of :meth:`MemoryManager.arrival`."""

    status: Status
    steps: tuple[str, ...]
    #: The (address, length) buffers to fill, in order (when OK).
    buffers: tuple[tuple[int, int], ...] = ()
    #: Buffers skipped because their page-in is not done; returned to the application unfilled.
    skipped: tuple[tuple[int, int], ...] = ()
    transfer: int | None = None


@attrs.frozen
class Resumed:
    """A suspended endpoint may transmit again: its page-in completed at ``at``."""

    endpoint: int
    at: float


@attrs.frozen
class PageInDone:
    """A deferred page-in finished; ``steps`` are the kernel thread's (pinning the page)."""

    endpoint: int
    vpage: int
    at: float
    steps: tuple[str, ...]


@attrs.frozen
class BufferReturned:
    """A free buffer handed back unfilled (page-in late, or a privilege violation)."""

    endpoint: int
    address: int
    length: int
    reason: str


@attrs.frozen
class MmStatistics:
    """Counters of the NI TLB and the kernel module (paper 000 §7.4 style snapshot)."""

    hits: int
    victim_hits: int
    #: Misses by "transmit/<kind>" and "receive/<kind>" (MissKind values).
    misses: dict[str, int]
    evictions: int
    #: Entries invalidated because their endpoint closed (or a write needed a new copy).
    invalidations: int
    pinned_bytes: int
    pinned_bytes_max: int
    valid_entries: int
    dropped_no_buffer: int
    buffers_skipped: int
    page_ins: int


class _BufState(enum.Enum):
    UNTRANSLATED = 0
    PENDING = 1  # a page-in is under way
    READY = 2


@attrs.define(slots=True, eq=False)
class _Buffer:
    address: int
    length: int
    state: _BufState = _BufState.UNTRANSLATED
    entries: list[TlbEntry] = attrs.field(factory=list)
    waiting: set[int] = attrs.field(factory=set)  # vpages still being paged in


@attrs.define(slots=True, eq=False)
class _Endpoint:
    id: int
    space: AddressSpace
    free: deque[_Buffer] = attrs.field(factory=deque)
    suspended_until: float | None = None
    waiting: set[int] = attrs.field(factory=set)  # vpages of sends being paged in


@attrs.define(slots=True, eq=False)
class _PageIn:
    endpoint: int
    vpage: int
    direction: Direction
    done: bool = False


@attrs.define(slots=True, eq=False)
class _Transfer:
    endpoint: int
    entries: list[TlbEntry]
    pieces: list[tuple[int, int]]  # (address, length)


class MemoryManager:
    """The NI TLB plus the kernel module serving its misses, for one NI."""

    def __init__(
        self,
        params: MmParams | None = None,
        memory: PhysicalMemory | None = None,
        profile: CostProfile | None = None,
    ) -> None:
        self.params = params or MmParams()
        self.memory = memory or PhysicalMemory()
        self.page_size = self.memory.page_size
        self.tlb = Tlb(self.params.geometry)
        self.page_in_seconds = self.params.page_in_seconds
        #: The kernel starts a page-in once the request reached it (handshake, interrupt).
        self.request_seconds = 0.0
        if profile is not None:
            if "page_fault" in profile.ops:
                self.page_in_seconds = profile.ops["page_fault"].seconds()
            for op in ("miss.handshake", "miss.interrupt"):
                if op in profile.ops:
                    self.request_seconds += profile.ops[op].seconds()
        self._endpoints: dict[int, _Endpoint] = {}
        self._timers: list[tuple[float, int, _PageIn]] = []
        self._order = 0
        self._events: deque[Resumed | PageInDone | BufferReturned] = deque()
        self._transfers: dict[int, _Transfer] = {}
        self._next_transfer = 1
        self.hits = 0
        self.misses: Counter[str] = Counter()
        self.evictions = 0
        self.invalidations = 0
        self.pinned_max = 0
        self.dropped_no_buffer = 0
        self.buffers_skipped = 0
        self.page_ins = 0

    # ------------------------------------------------------------------ endpoints

    def open_endpoint(self, endpoint: int, space: AddressSpace) -> None:
        """Register ``endpoint`` of the process owning ``space``."""
        if endpoint in self._endpoints:
            raise UNetError(f"endpoint {endpoint} is already open")
        if space.memory is not self.memory:
            raise UNetError(f"address space of pid {space.pid} is in another memory")
        self._endpoints[endpoint] = _Endpoint(endpoint, space)

    def close_endpoint(self, endpoint: int) -> tuple[str, ...]:
        """Invalidate ``endpoint``'s entries and forget its buffers; the unpin steps."""
        ep = self._endpoint(endpoint)
        del self._endpoints[endpoint]
        # Its transfers and pre-translated buffers are abandoned: release what they held.
        for transfer_id in [t for t, x in self._transfers.items() if x.endpoint == endpoint]:
            for entry in self._transfers.pop(transfer_id).entries:
                entry.busy -= 1
        for buffer in ep.free:
            for entry in buffer.entries:
                entry.busy -= 1
        ep.free.clear()
        steps: list[str] = []
        for entry in self.tlb:
            entry.owners.discard(endpoint)
            if not entry.owners:
                self.tlb.remove(entry.key)
                self.invalidations += 1
                self._unpin(entry, steps, evicted=False)
        return tuple(steps)

    def _endpoint(self, endpoint: int) -> _Endpoint:
        ep = self._endpoints.get(endpoint)
        if ep is None:
            raise UNetError(f"endpoint {endpoint} is not open on this NI")
        return ep

    def free_buffers(self, endpoint: int) -> int:
        """How many free buffers ``endpoint`` has posted that no arrival has taken yet."""
        return len(self._endpoint(endpoint).free)

    def is_open(self, endpoint: int) -> bool:
        """Whether ``endpoint`` is registered with this NI."""
        return endpoint in self._endpoints

    def suspended(self, endpoint: int) -> bool:
        """Whether ``endpoint`` waits for a page-in (the NI skips its send queue)."""
        return self._endpoint(endpoint).suspended_until is not None

    # ------------------------------------------------------------------ transmit

    def translate_send(self, now: float, endpoint: int, address: int, length: int) -> Translation:
        """Translate a send buffer for reading (paper 002 §4.1, transmit)."""
        ep = self._endpoint(endpoint)
        if ep.suspended_until is not None:
            return Translation(Status.SUSPENDED, ())
        steps: list[str] = []
        entries: list[TlbEntry] = []
        for vpage in self._pages(address, length):
            entry, kind = self._translate(now, ep, vpage, Direction.TRANSMIT, steps, whole=False)
            if entry is None:
                for held in entries:
                    held.busy -= 1
                if kind is MissKind.PAGE_IN:
                    return Translation(Status.DEFERRED, tuple(steps), ready_at=ep.suspended_until)
                status = Status.ERROR if kind is MissKind.PRIVILEGE else Status.NO_ROOM
                return Translation(status, tuple(steps))
            entry.busy += 1  # held for the rest of this buffer, so it cannot evict itself
            entries.append(entry)
        transfer = self._start(endpoint, entries, [(address, length)])
        frames = tuple(entry.frame for entry in entries)
        return Translation(Status.OK, tuple(steps), frames, transfer)

    def complete(self, transfer: int) -> tuple[str, ...]:
        """A DMA finished: its pages may be evicted again; the steps of any shrinking."""
        record = self._transfers.pop(transfer, None)
        if record is None:
            raise UNetError(f"no transfer {transfer} in progress")
        for entry in record.entries:
            entry.busy -= 1
        steps: list[str] = []
        if self.params.geometry.victim_grows:
            for entry in self.tlb.shrink():
                self._unpin(entry, steps)
        return tuple(steps)

    def dma_read(self, transfer: int) -> bytes:
        """The bytes a transfer's buffer holds, read through its frames (the NI's DMA)."""
        record = self._transfer(transfer)
        return bytes(self._dma(record, None))

    def dma_write(self, transfer: int, data: bytes) -> None:
        """Write ``data`` into a transfer's buffers through their frames (the NI's DMA)."""
        self._dma(self._transfer(transfer), data)

    def _transfer(self, transfer: int) -> _Transfer:
        record = self._transfers.get(transfer)
        if record is None:
            raise UNetError(f"no transfer {transfer} in progress")
        return record

    def _dma(self, record: _Transfer, data: bytes | None) -> bytearray:
        frames = {entry.key[1]: entry.frame for entry in record.entries}
        out = bytearray()
        position = 0
        size = self.page_size
        for address, length in record.pieces:
            end = address + length
            cursor = address
            while cursor < end and (data is None or position < len(data)):
                vpage, start = divmod(cursor, size)
                take = min(size - start, end - cursor)
                frame = self.memory.frames[frames[vpage]]
                if data is None:
                    out += frame[start : start + take]
                else:
                    take = min(take, len(data) - position)
                    frame[start : start + take] = data[position : position + take]
                    position += take
                cursor += take
        return out

    # ------------------------------------------------------------------ receive

    def post_free(self, endpoint: int, address: int, length: int) -> None:
        """The application posted a free buffer at a virtual address."""
        if length <= 0:
            raise UNetError(f"free buffer length must be > 0, not {length}")
        self._endpoint(endpoint).free.append(_Buffer(address, length))

    def pretranslate(self, now: float, endpoint: int) -> tuple[str, ...]:
        """Translate the first ``pretranslate`` free buffers ahead of arrivals; the steps."""
        ep = self._endpoint(endpoint)
        steps: list[str] = []
        depth = self.params.pretranslate
        for buffer in list(ep.free)[:depth]:
            if buffer.state is not _BufState.UNTRANSLATED:
                continue
            whole = buffer.address % self.page_size == 0 and buffer.length >= self.page_size
            for vpage in self._pages(buffer.address, buffer.length):
                if any(e.key[1] == vpage for e in buffer.entries) or vpage in buffer.waiting:
                    continue
                entry, kind = self._translate(now, ep, vpage, Direction.RECEIVE, steps, whole)
                if entry is not None:
                    entry.busy += 1  # a pre-translated buffer's pages stay put
                    buffer.entries.append(entry)
                elif kind is MissKind.PAGE_IN:
                    buffer.waiting.add(vpage)
                elif kind is MissKind.PRIVILEGE:
                    self._return(ep, buffer, "privilege")
                    break
                else:
                    break  # NO_ROOM: try again later
            else:
                buffer.state = _BufState.PENDING if buffer.waiting else _BufState.READY
        return tuple(steps)

    def arrival(self, now: float, endpoint: int, length: int) -> Arrival:
        """A message of ``length`` bytes arrived for ``endpoint``: choose its buffers."""
        ep = self._endpoint(endpoint)
        self._run_timers(now)
        skipped: list[tuple[int, int]] = []
        while ep.free and ep.free[0].state is _BufState.PENDING:
            buffer = ep.free[0]
            skipped.append((buffer.address, buffer.length))
            self._return(ep, buffer, "page-in late")
        taken: list[_Buffer] = []
        total = 0
        for buffer in ep.free:
            if total >= length or buffer.state is not _BufState.READY:
                break
            taken.append(buffer)
            total += buffer.length
        if total < length:
            self.dropped_no_buffer += 1
            return Arrival(Status.DROPPED, (), skipped=tuple(skipped))
        entries: list[TlbEntry] = []
        for buffer in taken:
            ep.free.popleft()
            entries += buffer.entries
        steps = ("recv.tlb_hit",) * len(taken)
        self.hits += len(taken)
        pieces = [(b.address, b.length) for b in taken]
        transfer = self._start(endpoint, entries, pieces)
        return Arrival(Status.OK, steps, tuple(pieces), tuple(skipped), transfer)

    def _return(self, ep: _Endpoint, buffer: _Buffer, reason: str) -> None:
        ep.free.remove(buffer)
        for entry in buffer.entries:
            entry.busy -= 1
        self.buffers_skipped += 1
        self._events.append(BufferReturned(ep.id, buffer.address, buffer.length, reason))

    # ------------------------------------------------------------------ time and events

    def get_timer(self) -> float | None:
        """When the next deferred page-in completes, or None."""
        while self._timers and self._timers[0][2].done:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def handle_timer(self, now: float) -> None:
        """Complete the page-ins due by ``now`` (the in-kernel thread's work)."""
        self._run_timers(now)

    def next_event(self) -> Resumed | PageInDone | BufferReturned | None:
        """The next event, or None."""
        return self._events.popleft() if self._events else None

    def _run_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            at, _, job = heapq.heappop(self._timers)
            if job.done:
                continue
            job.done = True
            ep = self._endpoints.get(job.endpoint)
            if ep is None:
                continue  # closed meanwhile: the page-in happened, nobody waits
            ep.space.page_in(job.vpage)
            steps: list[str] = []
            entry = self._install(ep, job.vpage, job.direction, steps)
            self._events.append(PageInDone(ep.id, job.vpage, at, tuple(steps)))
            if job.direction is Direction.TRANSMIT:
                ep.waiting.discard(job.vpage)
                if not ep.waiting:
                    ep.suspended_until = None
                    self._events.append(Resumed(ep.id, at))
                continue
            for buffer in ep.free:
                if job.vpage in buffer.waiting:
                    buffer.waiting.discard(job.vpage)
                    if entry is not None:
                        entry.busy += 1
                        buffer.entries.append(entry)
                    if not buffer.waiting and entry is not None:
                        buffer.state = _BufState.READY
                    elif not buffer.waiting:
                        buffer.state = _BufState.UNTRANSLATED  # no room: translate again
                        for old in buffer.entries:
                            old.busy -= 1
                        buffer.entries.clear()

    # ------------------------------------------------------------------ the TLB and the kernel

    def _pages(self, address: int, length: int) -> range:
        if address < 0 or length <= 0:
            raise UNetError(f"bad buffer: address {address:#x}, length {length}")
        size = self.page_size
        return range(address // size, (address + length - 1) // size + 1)

    def _translate(
        self,
        now: float,
        ep: _Endpoint,
        vpage: int,
        direction: Direction,
        steps: list[str],
        whole: bool,
    ) -> tuple[TlbEntry | None, MissKind | None]:
        """Look ``vpage`` up; on a miss, ask the kernel.  (entry, None) on a hit."""
        key: Key = (ep.space.pid, vpage)
        write = direction is Direction.RECEIVE
        entry = self.tlb.lookup(key)
        if entry is not None and (entry.writable or not write):
            self.hits += 1
            steps.append("pre.tlb_hit" if write else "send.tlb_hit")
            entry.owners.add(ep.id)
            return entry, None
        side = "receive" if write else "transmit"
        # A translation request: over the request queue with an interrupt (PCA-200), or the
        # same routine inside the trap (DC21140/NT, whose profile has no such costs).
        steps += ("miss.handshake", "miss.interrupt")
        space = ep.space
        protection = space.protection(vpage)
        needed = Protection.WRITE if write else Protection.READ
        if protection is None or needed not in protection:
            self.misses[f"{side}/{MissKind.PRIVILEGE}"] += 1
            return None, MissKind.PRIVILEGE
        if entry is not None:
            # A read-only translation now needed for writing: drop it, then copy-on-write.
            if entry.busy:
                self.misses[f"{side}/{MissKind.NO_ROOM}"] += 1
                return None, MissKind.NO_ROOM
            self.tlb.remove(key)
            self._unpin(entry, steps, evicted=False)
        # Check for room before changing the page (copy, zero page): a refusal has no effect.
        if self.tlb.plan(key) is None:
            self.misses[f"{side}/{MissKind.NO_ROOM}"] += 1
            return None, MissKind.NO_ROOM
        page = space.pages[vpage]
        if page.frame is None:
            if write and whole and self.params.zero_map_in:
                kind = MissKind.ZERO_PAGE
                space.map_zero(vpage)
                steps.append("pin.zero")
            else:
                self.misses[f"{side}/{MissKind.PAGE_IN}"] += 1
                self._start_page_in(now, ep, vpage, direction)
                return None, MissKind.PAGE_IN
        elif write and (page.read_only or page.shared):
            kind = MissKind.COPY_ON_WRITE
            space.copy_on_write(vpage)
            steps.append("pin.cow")
        else:
            kind = MissKind.PRESENT
            steps.append("pin.recv" if write else "pin.send")
        self.misses[f"{side}/{kind}"] += 1
        return self._insert(ep, vpage, write, steps), None

    def _install(
        self, ep: _Endpoint, vpage: int, direction: Direction, steps: list[str]
    ) -> TlbEntry | None:
        """Insert the translation of a page just paged in, or None if there is no room."""
        key: Key = (ep.space.pid, vpage)
        write = direction is Direction.RECEIVE
        existing = self.tlb.lookup(key)
        if existing is not None and (existing.writable or not write):
            existing.owners.add(ep.id)
            return existing
        if existing is not None:
            if existing.busy:
                return None
            self.tlb.remove(key)
            self._unpin(existing, steps, evicted=False)
        if self.tlb.plan(key) is None:
            return None
        page = ep.space.pages[vpage]
        if write and (page.read_only or page.shared):
            ep.space.copy_on_write(vpage)
            steps.append("pin.cow")
        else:
            steps.append("pin.recv" if write else "pin.send")
        return self._insert(ep, vpage, write, steps)

    def _insert(self, ep: _Endpoint, vpage: int, write: bool, steps: list[str]) -> TlbEntry:
        frame = ep.space.pages[vpage].frame
        if frame is None:
            raise RuntimeError(f"page {vpage:#x} is not present")  # the callers made it so
        self.memory.pin(frame)
        page = ep.space.pages[vpage]
        protection = ep.space.protection(vpage) or Protection.READ
        # A read translation of a copy-on-write page must not let the NI write into it.
        writable = Protection.WRITE in protection and (write or not (page.read_only or page.shared))
        entry = TlbEntry((ep.space.pid, vpage), frame, writable, owners={ep.id})
        for old in self.tlb.insert(entry):
            self._unpin(old, steps)
        self.pinned_max = max(self.pinned_max, len(self.tlb) * self.page_size)
        return entry

    def _unpin(self, entry: TlbEntry, steps: list[str], evicted: bool = True) -> None:
        self.memory.unpin(entry.frame)
        if evicted:
            self.evictions += 1
        steps.append("unpin")

    def _start_page_in(self, now: float, ep: _Endpoint, vpage: int, direction: Direction) -> None:
        self.page_ins += 1
        ready = now + self.request_seconds + self.page_in_seconds
        if direction is Direction.TRANSMIT:
            ep.waiting.add(vpage)
            ep.suspended_until = max(ep.suspended_until or 0.0, ready)
        self._order += 1
        heapq.heappush(self._timers, (ready, self._order, _PageIn(ep.id, vpage, direction)))

    def _start(self, endpoint: int, entries: list[TlbEntry], pieces: list[tuple[int, int]]) -> int:
        transfer = self._next_transfer
        self._next_transfer += 1
        self._transfers[transfer] = _Transfer(endpoint, entries, pieces)
        return transfer

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> MmStatistics:
        """A snapshot of the counters."""
        return MmStatistics(
            hits=self.hits,
            victim_hits=self.tlb.victim_hits,
            misses=dict(self.misses),
            evictions=self.evictions,
            invalidations=self.invalidations,
            pinned_bytes=len(self.tlb) * self.page_size,
            pinned_bytes_max=self.pinned_max,
            valid_entries=len(self.tlb),
            dropped_no_buffer=self.dropped_no_buffer,
            buffers_skipped=self.buffers_skipped,
            page_ins=self.page_ins,
        )


def total_misses(stats: MmStatistics, kinds: Iterable[MissKind] | None = None) -> int:
    """Misses of ``kinds`` (all by default) in both directions."""
    wanted = {str(k) for k in kinds} if kinds is not None else None
    return sum(
        n for name, n in stats.misses.items() if wanted is None or name.split("/")[1] in wanted
    )
