"""Single-copy transfers on the shm transport: cross-memory attach moved by the OS service.

Paper 002 §3-§5 (U-Net/MM) lets an application send from and receive into any virtual
address: the NI translates addresses through a TLB and the kernel pins only the pages the TLB
covers.  Between processes of one host, Linux cross-memory attach (``process_vm_readv`` /
``process_vm_writev``) is that data mover: one copy, straight from one process's memory into
another's, by a process the kernel lets touch both.  Here that process is the OS service daemon
(:mod:`stacklib.daemon`), so the copy is authorized per endpoint and channel:

* **Sender side (any memory).**  A process registers ranges of its own memory
  (``REGISTER``); the daemon checks them against ``/proc/PID/maps`` (readable, mapped) and
  keeps them per process, as the OS service of paper 002 §4 keeps a process's page table.
  A transfer names an address and a length; every page it covers must lie in a registered
  range.  :class:`RegistrationCache` caches those page checks the way the NI TLB caches
  translations: page-granular entries, bounded, LRU eviction, with hits, misses, evictions
  and pinned bytes (the statistics shape of the TLB model).
* **Receiver side (posted buffers).**  Each receiving endpoint has a receive pool
  (:class:`PoolLayout`), a sealed ``memfd`` the daemon creates and maps itself, passed to its
  owner only.  The owner posts buffers (offset, length) into the pool's free ring; the daemon
  takes the next one, copies into it with one ``process_vm_readv`` from the sender, and writes
  a completion into the pool's completion ring, as the NI fills the free and receive queues.
* **Why the daemon, not the peers.**  ``process_vm_readv`` copies between the *calling* process
  and one other, so a third process can move data in one copy only if one end is memory it has
  mapped: the receive pool.  Letting either peer call it instead would give it all of the other's
  address space (the kernel grants cross-memory attach per uid, not per range).
* **How a request reaches the daemon.**  Either a SEND_DIRECT message on the process's control
  socket (answered by DONE; several may be in flight), or an entry in the process's request
  queue (:class:`QueueLayout`), a shared ring the daemon polls while busy and sleeps on when
  idle, woken by a DOORBELL message only when it sleeps.  Both go through the same checks;
  docs/single-copy.md gives the measured costs of each.
* **Errors, not crashes.**  A range not registered, a page that is not mapped (``EFAULT``), a
  gone process (``ESRCH``), a channel the sender does not own, a pool with no posted buffer or a
  buffer too small: each is a :class:`XferStatus` on the transfer's completion.  A garbage
  entry the receiver posted is dropped and counted.
"""

from __future__ import annotations

import collections
import ctypes
import enum
import errno
import mmap
import os
from collections.abc import Callable, Iterable

import attrs
import construct as cs

from stacklib.unet.segment import populate
from stacklib.wire.codec import derive_codec

PAGE = mmap.PAGESIZE
POOL_MAGIC = 0x4C4F4F5054454E55  # "UNETPOOL" little-endian
#: Posted buffers per pool: a power of two (the ring indexes wrap with a mask).
MAX_SLOTS = 4096


class XferStatus(enum.IntEnum):
    """The status of one single-copy transfer (its send descriptor's error status)."""

    OK = 0
    NOT_OWNER = 1  #: the channel (side) is not the sender's
    NOT_REGISTERED = 2  #: the source range is not (wholly) registered memory of the sender
    BAD_ADDRESS = 3  #: the sender does not have that memory (EFAULT) or is gone (ESRCH)
    NO_BUFFER = 4  #: the receiver has no posted buffer (or its completion ring is full)
    TOO_LONG = 5  #: the posted buffer is smaller than the transfer
    PEER_GONE = 6  #: the receiving endpoint has no pool or its owner left the channel


class XmemError(OSError):
    """A cross-memory call failed; ``errno`` says why, ``done`` bytes were moved first."""

    def __init__(self, err: int, message: str, done: int) -> None:
        super().__init__(err, message)
        self.done = done


# ==================================================================== cross-memory attach


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_CALLS = {}
for _name in ("process_vm_readv", "process_vm_writev"):
    _fn = getattr(_libc, _name, None)
    if _fn is not None:
        _fn.restype = ctypes.c_ssize_t
        _fn.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(_IOVec),
            ctypes.c_ulong,
            ctypes.POINTER(_IOVec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
        _CALLS[_name] = _fn


def available() -> bool:
    """Whether this libc offers cross-memory attach."""
    return len(_CALLS) == 2


def _move(name: str, pid: int, local: int, remote: int, length: int) -> int:
    """Move ``length`` bytes between ``local`` (this process) and ``remote`` (``pid``),
    resuming after partial transfers; raises :class:`XmemError` with the bytes done so far."""
    call = _CALLS.get(name)
    if call is None:
        raise XmemError(errno.ENOSYS, f"{name} is not available", 0)
    done = 0
    local_iov, remote_iov = _IOVec(), _IOVec()
    while done < length:
        local_iov.iov_base, local_iov.iov_len = local + done, length - done
        remote_iov.iov_base, remote_iov.iov_len = remote + done, length - done
        moved = call(pid, ctypes.byref(local_iov), 1, ctypes.byref(remote_iov), 1, 0)
        if moved < 0:
            err = ctypes.get_errno()
            if err == errno.EINTR:
                continue
            raise XmemError(err, f"{name}(pid {pid}): {os.strerror(err)}", done)
        if moved == 0:  # no progress: the next page is not there
            raise XmemError(errno.EFAULT, f"{name}(pid {pid}): stopped at {done}", done)
        done += moved
    return done


def read_from(pid: int, remote: int, local: int, length: int) -> int:
    """Copy ``length`` bytes at ``remote`` in process ``pid`` to ``local`` in this one."""
    return _move("process_vm_readv", pid, local, remote, length)


def write_to(pid: int, remote: int, local: int, length: int) -> int:
    """Copy ``length`` bytes at ``local`` in this process to ``remote`` in process ``pid``."""
    return _move("process_vm_writev", pid, local, remote, length)


_PR_SET_DUMPABLE, _PR_GET_DUMPABLE = 4, 3


def protect_process() -> None:
    """Make this process non-dumpable, so only a process with ``CAP_SYS_PTRACE`` (a daemon
    run as root) may attach to its memory; other processes of the same uid get ``EPERM``.

    Linux grants cross-memory attach (and ptrace) to any process of the same uid by default,
    whatever the daemon authorizes; this closes that door.  Side effects: no core dumps, and
    ``/proc/PID`` files belong to root (a daemon not run as root can then not serve it).
    """
    if _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE): {os.strerror(err)}")


def protected() -> bool:
    """Whether :func:`protect_process` is in effect."""
    return bool(_libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


def address_of(buffer: bytearray | mmap.mmap | memoryview) -> int:
    """The address of a writable buffer's first byte (for registering it)."""
    holder = ctypes.c_char.from_buffer(buffer)
    address = ctypes.addressof(holder)
    del holder
    return address


def readable_ranges(pid: int) -> list[tuple[int, int]]:
    """[start, end) ranges of ``pid``'s readable mappings, merged where adjacent."""
    ranges: list[tuple[int, int]] = []
    with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=2)
            if len(fields) < 2 or fields[1][:1] != "r":
                continue
            low, _, high = fields[0].partition("-")
            start, end = int(low, 16), int(high, 16)
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((start, end))
    return ranges


def covered(ranges: Iterable[tuple[int, int]], start: int, end: int) -> bool:
    """Whether [start, end) lies inside one of ``ranges``."""
    return any(low <= start and end <= high for low, high in ranges)


# ==================================================================== the registration cache


@attrs.define
class CacheStats:
    """Statistics of a translation cache, named as the NI TLB model's ``MmStatistics``
    (stacklib.unet.mm) names them; misses are one count here (no transmit/receive split)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    invalidations: int = 0
    pinned_bytes: int = 0
    pinned_bytes_max: int = 0
    valid_entries: int = 0

    def as_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


class RegistrationCache:
    """Page-granular checks of registered memory, bounded like an NI TLB (paper 002 §4).

    An entry maps <pid, virtual page> to "readable by transfers".  A miss is resolved by the
    caller (the OS service: the page must lie in a registered range and be mapped) and then
    inserted; when ``capacity`` entries are valid, the least recently used (``lru``) or oldest
    (``fifo``) is evicted.  ``pinned_bytes`` counts the bytes valid entries cover: the memory
    the service vouches for, which paper 002 §5 bounds by the TLB size, not by the processes.
    """

    def __init__(self, capacity: int = 1024, policy: str = "lru", page: int = PAGE) -> None:
        if capacity < 1:
            raise ValueError(f"a registration cache needs at least one entry, got {capacity}")
        if policy not in ("lru", "fifo"):
            raise ValueError(f"eviction policy must be 'lru' or 'fifo', got {policy!r}")
        if page < 1 or page & (page - 1):
            raise ValueError(f"page size must be a power of two, got {page}")
        self.capacity = capacity
        self.policy = policy
        self.page = page
        self.shift = page.bit_length() - 1
        self.stats = CacheStats()
        self._entries: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def pages(self, address: int, length: int) -> range:
        """The virtual page numbers ``length`` bytes at ``address`` touch."""
        if length <= 0:
            return range(0)
        return range(address >> self.shift, ((address + length - 1) >> self.shift) + 1)

    def lookup(self, pid: int, address: int, length: int) -> list[int]:
        """Count a hit or miss per page; return the pages that missed (not inserted yet)."""
        entries = self._entries
        missed = []
        pages = self.pages(address, length)
        if self.policy == "lru":
            touch = entries.move_to_end  # one dict operation per page: it is the hot loop
            for page in pages:
                try:
                    touch((pid, page))
                except KeyError:
                    missed.append(page)
        else:
            missed = [page for page in pages if (pid, page) not in entries]
        stats = self.stats
        stats.hits += len(pages) - len(missed)
        stats.misses += len(missed)
        return missed

    def insert(self, pid: int, pages: Iterable[int]) -> None:
        """Make ``pages`` of ``pid`` valid, evicting as needed."""
        entries = self._entries
        for page in pages:
            key = (pid, page)
            if key in entries:
                continue
            if len(entries) >= self.capacity:
                entries.popitem(last=False)
                self.stats.evictions += 1
            entries[key] = None
        self._account()

    def _account(self) -> None:
        stats = self.stats
        stats.valid_entries = len(self._entries)
        stats.pinned_bytes = stats.valid_entries * self.page
        stats.pinned_bytes_max = max(stats.pinned_bytes_max, stats.pinned_bytes)

    def invalidate(self, pid: int, address: int | None = None, length: int = 0) -> int:
        """Drop ``pid``'s entries (all, or those of one range); returns how many."""
        if address is None:
            doomed = [key for key in self._entries if key[0] == pid]
        else:
            doomed = [(pid, p) for p in self.pages(address, length) if (pid, p) in self._entries]
        for key in doomed:
            del self._entries[key]
        self.stats.invalidations += len(doomed)
        self._account()
        return len(doomed)


# ==================================================================== receive pools

# Header words (8 bytes each) of a pool.  Each counter sits on its own 64-byte line.
_MAGIC_W, _SLOTS_W, _DATA_W = 0, 1, 2
_FREE_TAIL, _FREE_HEAD, _DONE_TAIL, _DONE_HEAD = 8, 16, 24, 32
#: A posted buffer in a pool's free ring (written by the pool's owner, checked by the daemon).
FREE_ENTRY = cs.Struct("offset" / cs.Int64ul, "length" / cs.Int64ul)
#: A filled buffer in a pool's completion ring (written by the daemon).
DONE_ENTRY = cs.Struct(
    "offset" / cs.Int64ul, "length" / cs.Int64ul, "channel" / cs.Int64ul, "cookie" / cs.Int64ul
)
_FREE_ENTRY = derive_codec(FREE_ENTRY)
_DONE_ENTRY = derive_codec(DONE_ENTRY)
POOL_HEADER = 4096


@attrs.frozen
class PoolLayout:
    """A receive pool: a header page, a free ring and a completion ring, then the buffers.

    The owner writes ``free tail`` and ``done head``; the daemon writes ``free head`` and
    ``done tail``.  Counters run free; an entry is at ``counter % slots``.
    """

    slots: int
    data_bytes: int

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.slots <= MAX_SLOTS or self.slots & (self.slots - 1):
            raise ValueError(f"pool slots must be a power of two <= {MAX_SLOTS}, got {self.slots}")
        if self.data_bytes < PAGE or self.data_bytes % PAGE or self.data_bytes > 1 << 32:
            raise ValueError(f"pool data bytes must be whole pages <= 4 GiB, got {self.data_bytes}")

    @property
    def free_base(self) -> int:
        return POOL_HEADER

    @property
    def done_base(self) -> int:
        return self.free_base + self.slots * _FREE_ENTRY.size

    @property
    def data_base(self) -> int:
        end = self.done_base + self.slots * _DONE_ENTRY.size
        return (end + PAGE - 1) // PAGE * PAGE

    @property
    def total(self) -> int:
        return self.data_base + self.data_bytes

    def initialize(self, region: mmap.mmap) -> None:
        words = memoryview(region)[:POOL_HEADER].cast("Q")
        words[_MAGIC_W], words[_SLOTS_W], words[_DATA_W] = POOL_MAGIC, self.slots, self.data_bytes
        words.release()


@attrs.frozen
class Completion:
    """A filled posted buffer: where it is in the pool, how much arrived, from which channel
    (daemon channel id) and the sender's cookie."""

    offset: int
    length: int
    channel: int
    cookie: int


class ReceivePool:
    """The owner's side of a receive pool: post buffers, take completions (no system calls)."""

    def __init__(self, region: mmap.mmap, layout: PoolLayout) -> None:
        populate(region)  # the posted buffers, resident before the first copy lands
        self.region = region
        self.layout = layout
        self._view = memoryview(region)
        self._words = self._view[:POOL_HEADER].cast("Q")
        if self._words[_MAGIC_W] != POOL_MAGIC:
            raise ValueError("not a receive pool")
        self.data = self._view[layout.data_base : layout.total]

    def post(self, offset: int, length: int) -> bool:
        """Post ``length`` bytes at ``offset`` of the pool's data; False if the ring is full."""
        words, slots = self._words, self.layout.slots
        tail = words[_FREE_TAIL]
        if tail - words[_FREE_HEAD] >= slots:
            return False
        _FREE_ENTRY.pack_into(
            self._view, self.layout.free_base + (tail % slots) * _FREE_ENTRY.size, offset, length
        )
        words[_FREE_TAIL] = tail + 1  # after the entry: x86-64 keeps stores in order
        return True

    @property
    def posted(self) -> int:
        """Buffers posted and not yet taken by the daemon."""
        return int(self._words[_FREE_TAIL] - self._words[_FREE_HEAD])

    def poll(self) -> Completion | None:
        """The next completion, or None."""
        words = self._words
        head = words[_DONE_HEAD]
        if head == words[_DONE_TAIL]:
            return None
        slot = head % self.layout.slots
        entry = _DONE_ENTRY.unpack(self._view, self.layout.done_base + slot * _DONE_ENTRY.size)
        words[_DONE_HEAD] = head + 1
        return Completion(*entry)

    def close(self) -> None:
        self._words.release()
        self.data.release()
        self._view.release()
        self.region.close()


class PoolState:
    """The daemon's side of one receive pool: take posted buffers, write completions.

    Everything the owner writes is checked before use: a counter that runs backwards or ahead
    makes the pool unusable (``corrupt``); a posted entry outside the data area is dropped and
    counted (``bad_posts``).
    """

    def __init__(self, fd: int, region: mmap.mmap, layout: PoolLayout) -> None:
        self.fd = fd
        self.region = region
        self.layout = layout
        self._view = memoryview(region)
        self._words = self._view[:POOL_HEADER].cast("Q")
        # Fixed for the pool's life: looked up once, not on every transfer.
        self._slots, self._data_bytes = layout.slots, layout.data_bytes
        self._free_base, self._done_base = layout.free_base, layout.done_base
        self._anchor = ctypes.c_char.from_buffer(region)
        self.data_address = ctypes.addressof(self._anchor) + layout.data_base
        self.bad_posts = 0
        self.corrupt = False

    def take(self, length: int) -> tuple[XferStatus, int, int]:
        """Pop the next good posted buffer for ``length`` bytes: (status, offset, size).

        Needs room in the completion ring too, so the buffer can be reported once filled.
        """
        words, slots, data_bytes = self._words, self._slots, self._data_bytes
        while True:
            head, tail = int(words[_FREE_HEAD]), int(words[_FREE_TAIL])
            done_tail, done_head = int(words[_DONE_TAIL]), int(words[_DONE_HEAD])
            if not 0 <= tail - head <= slots or not 0 <= done_tail - done_head <= slots:
                self.corrupt = True
            if self.corrupt or head == tail or done_tail - done_head >= slots:
                return XferStatus.NO_BUFFER, 0, 0
            offset, size = _FREE_ENTRY.unpack(
                self._view, self._free_base + (head % slots) * _FREE_ENTRY.size
            )
            words[_FREE_HEAD] = head + 1
            if size == 0 or offset >= data_bytes or size > data_bytes - offset:
                self.bad_posts += 1
                continue
            if size < length:
                # The buffer is consumed and returned unfilled, with the error.
                return XferStatus.TOO_LONG, offset, size
            return XferStatus.OK, offset, size

    def complete(self, offset: int, length: int, channel: int, cookie: int) -> None:
        words, slots = self._words, self._slots
        tail = int(words[_DONE_TAIL])
        _DONE_ENTRY.pack_into(
            self._view,
            self._done_base + (tail % slots) * _DONE_ENTRY.size,
            offset,
            length,
            channel,
            cookie,
        )
        words[_DONE_TAIL] = tail + 1

    def close(self) -> None:
        self._words.release()
        self._view.release()
        del self._anchor
        self.region.close()
        os.close(self.fd)


def _sealed_memfd(name: str, size: int) -> tuple[int, mmap.mmap]:
    """A new ``memfd`` of ``size`` bytes, sealed against resizing so a process that maps it
    can trust its length, and mapped here."""
    import fcntl

    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        )
        region = mmap.mmap(fd, size)
        populate(region)  # the daemon's side of a pool or queue, resident from the start
    except BaseException:
        os.close(fd)
        raise
    return fd, region


def create_pool(layout: PoolLayout, name: str) -> PoolState:
    """A new sealed ``memfd`` pool, initialized and mapped (the daemon's side)."""
    fd, region = _sealed_memfd(name, layout.total)
    layout.initialize(region)
    return PoolState(fd, region, layout)


# ==================================================================== request queues

# Header words of a request queue (each counter on its own 64-byte line).
_Q_SLOTS_W = 1
_SUB_TAIL, _SUB_HEAD, _CQ_TAIL, _CQ_HEAD, _MOVER_SLEEPING = 8, 16, 24, 32, 40
QUEUE_MAGIC = 0x5155455551454E55  # "UNEQUEUQ" little-endian
#: A transfer in a request queue's submission ring (written by the owner, checked by the daemon).
SUBMIT_ENTRY = cs.Struct(
    "address" / cs.Int64ul,
    "length" / cs.Int32ul,
    "channel" / cs.Int32ul,
    "side" / cs.Int32ul,
    "cookie" / cs.Int32ul,
    cs.Padding(8),
)
#: A transfer's result in a request queue's result ring (written by the daemon).
RESULT_ENTRY = cs.Struct(
    "cookie" / cs.Int32ul, "status" / cs.Int32ul, "length" / cs.Int32ul, "channel" / cs.Int32ul
)
_SUBMIT = derive_codec(SUBMIT_ENTRY)
_SUBMIT_BYTES = _SUBMIT.size
_RESULT = derive_codec(RESULT_ENTRY)


@attrs.frozen
class QueueLayout:
    """A request queue: a header page, a submission ring and a completion ring.

    The alternative to sending each transfer over the control socket: the owner writes
    ``submit tail`` and ``completion head``, the daemon ``submit head``, ``completion tail`` and
    the "mover sleeping" flag, which tells the owner to ring the doorbell (a DOORBELL message on
    its control socket) after submitting.
    """

    slots: int

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.slots <= MAX_SLOTS or self.slots & (self.slots - 1):
            raise ValueError(f"queue slots must be a power of two <= {MAX_SLOTS}, got {self.slots}")

    @property
    def submit_base(self) -> int:
        return POOL_HEADER

    @property
    def result_base(self) -> int:
        return self.submit_base + self.slots * _SUBMIT_BYTES

    @property
    def total(self) -> int:
        end = self.result_base + self.slots * _RESULT.size
        return (end + PAGE - 1) // PAGE * PAGE


def create_queue(layout: QueueLayout, name: str) -> tuple[int, mmap.mmap]:
    """A new sealed ``memfd`` request queue, initialized and mapped (the daemon's side)."""
    fd, region = _sealed_memfd(name, layout.total)
    words = memoryview(region)[:POOL_HEADER].cast("Q")
    words[0], words[_Q_SLOTS_W] = QUEUE_MAGIC, layout.slots
    words.release()
    return fd, region


class QueueState:
    """The daemon's side of a request queue: take submissions, post results.

    Counters the owner writes are checked: a queue whose counters run backwards or ahead is
    ``corrupt`` and served no more.
    """

    def __init__(self, fd: int, region: mmap.mmap, layout: QueueLayout) -> None:
        self.fd = fd
        self.region = region
        self.layout = layout
        self._view = memoryview(region)
        self.words = self._view[:POOL_HEADER].cast("Q")
        self.corrupt = False

    def pending(self) -> bool:
        words = self.words
        return not self.corrupt and words[_SUB_TAIL] != words[_SUB_HEAD]

    def take(self) -> tuple[int, int, int, int, int] | None:
        """The next submission (address, length, channel, side, cookie), if the result ring
        has room for its answer."""
        words, slots = self.words, self.layout.slots
        head, tail = int(words[_SUB_HEAD]), int(words[_SUB_TAIL])
        done_tail, done_head = int(words[_CQ_TAIL]), int(words[_CQ_HEAD])
        if not 0 <= tail - head <= slots or not 0 <= done_tail - done_head <= slots:
            self.corrupt = True
        if self.corrupt or head == tail or done_tail - done_head >= slots:
            return None
        entry: tuple[int, int, int, int, int] = _SUBMIT.unpack(
            self._view, self.layout.submit_base + (head % slots) * _SUBMIT_BYTES
        )
        words[_SUB_HEAD] = head + 1
        return entry

    def answer(self, cookie: int, status: int, length: int, channel: int) -> None:
        words, slots = self.words, self.layout.slots
        tail = int(words[_CQ_TAIL])
        _RESULT.pack_into(
            self._view,
            self.layout.result_base + (tail % slots) * _RESULT.size,
            cookie,
            status,
            length,
            channel,
        )
        words[_CQ_TAIL] = tail + 1

    def set_sleeping(self, sleeping: bool) -> None:
        if not self.corrupt:
            self.words[_MOVER_SLEEPING] = int(sleeping)

    def close(self) -> None:
        self.words.release()
        self._view.release()
        self.region.close()
        os.close(self.fd)


class RequestQueue:
    """The owner's side of a request queue: submit transfers and reap results with no system
    call, except a doorbell when the daemon's mover sleeps (``ring`` sends it)."""

    def __init__(self, region: mmap.mmap, layout: QueueLayout, ring: Callable[[], None]) -> None:
        populate(region)
        self.region = region
        self.layout = layout
        self._view = memoryview(region)
        self._words = self._view[:POOL_HEADER].cast("Q")
        if self._words[0] != QUEUE_MAGIC:
            raise ValueError("not a request queue")
        self._ring = ring
        self.doorbells = 0

    def submit(self, channel: int, side: int, address: int, length: int, cookie: int) -> bool:
        """Queue one transfer; False if the submission ring is full."""
        words, slots = self._words, self.layout.slots
        tail = words[_SUB_TAIL]
        if tail - words[_SUB_HEAD] >= slots:
            return False
        _SUBMIT.pack_into(
            self._view,
            self.layout.submit_base + (tail % slots) * _SUBMIT_BYTES,
            address,
            length,
            channel,
            side,
            cookie,
        )
        words[_SUB_TAIL] = tail + 1
        if words[_MOVER_SLEEPING]:
            self.doorbells += 1
            self._ring()
        return True

    def reap(self) -> tuple[int, int, int, int] | None:
        """The next result (cookie, status, length, channel), or None."""
        words = self._words
        head = words[_CQ_HEAD]
        if head == words[_CQ_TAIL]:
            return None
        result: tuple[int, int, int, int] = _RESULT.unpack(
            self._view, self.layout.result_base + (head % self.layout.slots) * _RESULT.size
        )
        words[_CQ_HEAD] = head + 1
        return result

    def close(self) -> None:
        self._words.release()
        self._view.release()
        self.region.close()
