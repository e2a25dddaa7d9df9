"""The shared-memory transport: U-Net between processes of one host, no system call per message.

Paper 000 §3 takes the kernel off the data path by letting the NI and the process share the
endpoint's memory.  Between two processes of one host there is no NI to trust, so this
transport shares, per channel, exactly what the two endpoints of that channel exchange and
nothing else:

* **A channel region** (a file in a directory under ``/dev/shm``, mapped by both processes)
  holds a header page and two single-producer/single-consumer byte rings, one per direction.
  A process can reach only the regions of its own channels, so garbage it writes reaches only
  the peer of that channel, which validates every record before use (paper 000 §3.2 protection
  by construction: no region holds a third endpoint's data).
* **A ring** is ``ring_bytes`` of records, each an 8-byte header (``length: u32``,
  ``kind: u32``) and the message padded to 16 bytes.  ``tail`` (written only by the producer)
  and ``head`` (written only by the consumer) are free-running byte counters on separate cache
  lines; a record never wraps (a PAD record fills the end of the ring instead).  The message is
  copied once, by the sender, from its segment into the record; the receiving NI copies it from
  the record into the endpoint's receive buffer (or inline descriptor) and only then frees the
  record, so the peer cannot change a message after it was validated.  A full ring is
  back-pressure: the send descriptor stays queued, nothing is lost.
* **Ordering**: the producer writes the record, then the tail; x86-64 keeps stores in order, so
  a consumer that sees the tail sees the record.  (Python has no fences; on weakly ordered CPUs
  this transport would need a C helper.)
* **Receive models** (paper 000 §3.1): polling (:meth:`Endpoint.poll` pulls from the rings);
  blocking (``await ep.recv()`` polls for ``spin_time`` seconds with trio checkpoints, then
  sleeps on the node's wake FIFO after raising a "sleeping" flag in each incoming ring; a sender
  writes one byte to the FIFO only when it sees that flag, so a busy receiver costs the sender no
  system call); upcalls, via :meth:`ShmNI.serve`, which pumps the rings and lets the generic
  endpoint machinery raise them.  Setting the flag and checking the ring race without a fence
  (store-load reordering), so a sleeper never waits longer than ``max_sleep`` before checking
  again: a lost wake-up costs at most that, never a hang.
* **Peer death**: each side records its pid in its half of the header page; a sleeper checks
  the peer with a pidfd (or ``kill(pid, 0)``) and fails the channel with :class:`PeerGone` once
  the ring is drained, as it does when the peer closes the channel.

Set-up is the OS service's job and stays off the data path.  Here a :class:`ChannelBroker`
creates or attaches the region; :class:`FileBroker` does it with files (an atomic ``link`` makes
the creator unique).  The daemon that checks ``SO_PEERCRED`` and passes region descriptors over a
UNIX socket is a later session: it implements the same broker interface.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import re
import select
import shutil
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from stacklib.errors import ChannelError
from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.unet.endpoint import Channel, DropReason, Endpoint, EndpointConfig, Message
from stacklib.unet.ni import Payload
from stacklib.unet.node import Node, total_drops
from stacklib.unet.os_service import OSService, Policy
from stacklib.unet.polled import PolledNI
from stacklib.wire.descriptor import DescriptorStatus, SendDescriptor, SendError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

MAGIC = b"UNETSHM1"
VERSION = 1
HEADER_BYTES = 4096
RECORD_HEADER = struct.Struct("<II")  # length, kind
KIND_MESSAGE = 1
KIND_PAD = 2
ALIGN = 16
_HEADER = struct.Struct("<8sIII")  # magic, version, ring_bytes, max_message

# Word indexes (8-byte words) into the header page.  Side s's block: pid, state, port.
_SIDE_WORD = (8, 24)
# Ring r (written by side r): tail, head, consumer sleeping, producer waiting, each on its own
# 64-byte line so the two processes do not bounce one cache line on every message.
_RING_WORD = (64, 96)
_TAIL, _HEAD, _SLEEPING, _WAITING = 0, 8, 16, 24
# Set by the OS service daemon (stacklib.daemon): bit ``1 << side`` means that side's process
# died and the daemon reclaimed it (the side's state word then reads STATE_CLOSED).
_RECLAIMED_WORD = 4

STATE_ABSENT, STATE_ATTACHED, STATE_CLOSED = 0, 1, 2

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class PeerGone(ChannelError):
    """The process at the other end of a channel died or closed its side."""


@attrs.frozen
class ShmAddress:
    """Where an endpoint of the shm transport lives: a node (process) name and a port."""

    node: str
    port: int

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Ring:
    """One direction of a channel: a byte ring of records in shared memory.

    The producer side uses :meth:`try_write`; the consumer side :meth:`peek` and
    :meth:`release`.  Each side keeps its own counter privately and publishes it, so a peer
    scribbling on the shared counters can only confuse this ring, never reach outside it.
    """

    __slots__ = (
        "_base",
        "_cached_head",
        "_head",
        "_tail",
        "_words",
        "capacity",
        "corrupt",
        "data",
        "max_message",
    )

    def __init__(self, words: memoryview, base: int, data: memoryview, max_message: int) -> None:
        self._words = words
        self._base = base
        self.data = data
        self.capacity = len(data)
        self.max_message = max_message
        self._tail = words[base + _TAIL]
        self._head = words[base + _HEAD]
        self._cached_head = self._head
        #: Records rejected because the peer broke the format (counted, skipped).
        self.corrupt = 0

    # ---------------------------------------------------------------- producer
    def try_write(self, payload: Payload) -> bool | None:
        """Append one message; False if the ring is full (back-pressure); None if the
        consumer's published head is impossible (the peer broke the ring)."""
        n = len(payload)
        size = _align(8 + n)
        tail = self._tail
        capacity = self.capacity
        offset = tail % capacity
        to_end = capacity - offset
        need = size if size <= to_end else to_end + size
        if tail + need - self._cached_head > capacity:
            head = self._words[self._base + _HEAD]
            if head > tail or tail - head > capacity or head % ALIGN:
                return None
            self._cached_head = head
            if tail + need - head > capacity:
                return False
        data = self.data
        if size > to_end:
            RECORD_HEADER.pack_into(data, offset, to_end, KIND_PAD)
            tail += to_end
            offset = 0
        RECORD_HEADER.pack_into(data, offset, n, KIND_MESSAGE)
        data[offset + 8 : offset + 8 + n] = payload
        tail += size
        self._tail = tail
        # Published after the record: x86-64 keeps the two stores in this order.
        self._words[self._base + _TAIL] = tail
        return True

    @property
    def consumer_sleeping(self) -> bool:
        return bool(self._words[self._base + _SLEEPING])

    def set_producer_waiting(self, waiting: bool) -> None:
        self._words[self._base + _WAITING] = int(waiting)

    # ---------------------------------------------------------------- consumer
    def peek(self) -> memoryview | None:
        """The next message (a view of its record, valid until :meth:`release`) or None.

        Every field the producer wrote is checked before use; a bad record or tail is counted
        in :attr:`corrupt` and everything published so far is discarded, since record
        boundaries can no longer be trusted.
        """
        head = self._head
        words = self._words
        base = self._base
        tail = words[base + _TAIL]
        while head != tail:
            avail = tail - head
            capacity = self.capacity
            if avail < 0 or avail > capacity or avail % ALIGN:
                self._discard(tail)
                return None
            offset = head % capacity
            length, kind = RECORD_HEADER.unpack_from(self.data, offset)
            if kind == KIND_PAD:
                if length != capacity - offset or length > avail:
                    self._discard(tail)
                    return None
                head += length
                self._head = head
                words[base + _HEAD] = head
                continue
            size = _align(8 + length)
            if (
                kind != KIND_MESSAGE
                or length > self.max_message
                or size > capacity - offset
                or size > avail
            ):
                self._discard(tail)
                return None
            return self.data[offset + 8 : offset + 8 + length]
        return None

    def release(self, view: memoryview) -> None:
        """Free the record :meth:`peek` returned."""
        head = self._head + _align(8 + len(view))
        view.release()
        self._head = head
        self._words[self._base + _HEAD] = head

    def _discard(self, tail: int) -> None:
        self.corrupt += 1
        # Skip to the published tail so an honest producer could go on.
        self._head = tail
        self._words[self._base + _HEAD] = tail

    @property
    def pending(self) -> bool:
        return self._words[self._base + _TAIL] != self._head

    def set_sleeping(self, sleeping: bool) -> None:
        self._words[self._base + _SLEEPING] = int(sleeping)

    @property
    def producer_waiting(self) -> bool:
        return bool(self._words[self._base + _WAITING])


# ==================================================================== set-up (OS service side)


@attrs.frozen
class RegionSpec:
    """Sizes of a channel region."""

    ring_bytes: int = 1 << 20
    max_message: int = 65535

    def __attrs_post_init__(self) -> None:
        if self.ring_bytes < 4096 or self.ring_bytes % 4096:
            raise ValueError(f"ring_bytes must be a multiple of 4096, got {self.ring_bytes}")
        if not 0 < self.max_message <= self.ring_bytes // 2 - 16:
            raise ValueError(
                f"max_message {self.max_message} must be positive and at most half a ring "
                f"({self.ring_bytes // 2 - 16} bytes)"
            )


class ChannelBroker(Protocol):
    """The OS service's set-up seam: give this side the mapped region of a channel.

    Returns the mapping and this side's index (0 or 1).  :class:`FileBroker` does it with
    files; a daemon that authenticates callers by SO_PEERCRED and passes the region's file
    descriptor over a UNIX socket will implement the same call.
    """

    def open_region(
        self, local: ShmAddress, remote: ShmAddress, spec: RegionSpec
    ) -> tuple[mmap.mmap, int, str]: ...


class FileBroker:
    """Channel regions as files in one directory (a tmpfs such as /dev/shm).

    The first side to arrive creates and initializes the file under a private name and links it
    to the channel's name; ``link`` fails if the name exists, so exactly one creator wins and
    the loser attaches to the winner's fully initialized region.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def region_path(self, local: ShmAddress, remote: ShmAddress) -> str:
        low, high = sorted([(local.node, local.port), (remote.node, remote.port)])
        return os.path.join(self.directory, f"chan.{low[0]}.{low[1]}.{high[0]}.{high[1]}")

    def open_region(
        self, local: ShmAddress, remote: ShmAddress, spec: RegionSpec
    ) -> tuple[mmap.mmap, int, str]:
        side = 0 if (local.node, local.port) < (remote.node, remote.port) else 1
        path = self.region_path(local, remote)
        size = HEADER_BYTES + 2 * spec.ring_bytes
        private = f"{path}.{os.getpid()}.{next(_serial)}"
        fd = os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            region = mmap.mmap(fd, size)
            _HEADER.pack_into(region, 0, MAGIC, VERSION, spec.ring_bytes, spec.max_message)
            try:
                os.link(private, path)
            except FileExistsError:
                region.close()
                region = self._attach(path)
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(private)
        return region, side, path

    @staticmethod
    def _attach(path: str) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < HEADER_BYTES:
                raise ChannelError(f"{path} is not a channel region")
            region = mmap.mmap(fd, info.st_size)
        finally:
            os.close(fd)
        magic, version, ring_bytes, max_message = _HEADER.unpack_from(region, 0)
        if (
            magic != MAGIC
            or version != VERSION
            or ring_bytes < 4096
            or ring_bytes % 4096
            or HEADER_BYTES + 2 * ring_bytes != len(region)
            or not 0 < max_message <= ring_bytes // 2 - 16
        ):
            region.close()
            raise ChannelError(f"{path}: not a version-{VERSION} channel region of a valid size")
        return region


_serial = itertools.count()


class ShmLink:
    """This side's view of one channel region: a transmit ring, a receive ring, the peer."""

    def __init__(
        self,
        ni: ShmNI,
        region: mmap.mmap,
        side: int,
        path: str,
        remote: ShmAddress,
        rx_key: tuple[str, int, int],
    ) -> None:
        self.ni = ni
        self.region = region
        self.side = side
        self.path = path
        self.remote = remote
        self.rx_key = rx_key
        _, _, ring_bytes, max_message = _HEADER.unpack_from(region, 0)
        self._view = memoryview(region)
        self._words = self._view[:HEADER_BYTES].cast("Q")
        peer = 1 - side
        rings = [
            Ring(
                self._words,
                _RING_WORD[r],
                self._view[HEADER_BYTES + r * ring_bytes : HEADER_BYTES + (r + 1) * ring_bytes],
                min(max_message, ni.max_message),
            )
            for r in (0, 1)
        ]
        self.tx = rings[side]
        self.rx = rings[peer]
        self._peer_word = _SIDE_WORD[peer]
        own = _SIDE_WORD[side]
        self._words[own] = os.getpid()
        self._words[own + 1] = STATE_ATTACHED
        self._peer_pid = 0
        self._pidfd: int | None = None
        self._peer_wake: int | None = None
        #: Why the channel failed (peer died, closed, broke the ring), or None.
        self.failed: str | None = None
        self.reported = False
        self.closed = False

    def __repr__(self) -> str:
        return f"<ShmLink to {self.remote} side={self.side}>"

    # ---------------------------------------------------------------- wake-ups
    def wake_peer(self) -> None:
        """Write one byte to the peer node's wake FIFO (only called when it sleeps)."""
        fd = self._peer_wake
        if fd is None:
            fd = self._peer_wake = self.ni._open_wake(self.remote.node)
            if fd is None:
                return
        try:
            os.write(fd, b"\0")
        except BlockingIOError:
            pass  # the FIFO is full of wake-ups already
        except OSError:
            os.close(fd)
            self._peer_wake = None

    # ---------------------------------------------------------------- liveness
    def check_peer(self) -> None:
        """Fail the channel if the peer closed its side or its process is gone."""
        if self.failed is not None or self.closed:
            return
        words = self._words
        state = words[self._peer_word + 1]
        if state == STATE_CLOSED:
            if words[_RECLAIMED_WORD] & (1 << (1 - self.side)):
                self.failed = f"peer {self.remote} died; the OS service reclaimed its side"
            else:
                self.failed = f"peer {self.remote} closed the channel"
            return
        if state != STATE_ATTACHED:
            return  # not arrived yet: a channel may be opened before the peer starts
        pid = words[self._peer_word]
        if pid != self._peer_pid:
            self._peer_pid = pid
            if self._pidfd is not None:
                os.close(self._pidfd)
            self._pidfd = None
            if 0 < pid < 1 << 31:
                with contextlib.suppress(OSError):
                    self._pidfd = os.pidfd_open(pid)
        pid = self._peer_pid
        if not 0 < pid < 1 << 31:
            self.failed = f"peer {self.remote} published an impossible pid {pid}"
            return
        if self._pidfd is not None:
            readable, _, _ = select.select([self._pidfd], [], [], 0)
            if readable:
                self.failed = f"peer process {pid} of {self.remote} died"
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self.failed = f"peer process {pid} of {self.remote} died"
        except PermissionError:
            pass

    @property
    def peer_attached(self) -> bool:
        return int(self._words[self._peer_word + 1]) != STATE_ABSENT

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        words = self._words
        words[_SIDE_WORD[self.side] + 1] = STATE_CLOSED
        # A broker that tracks channels (the daemon's) learns at once that this side is gone.
        close_region = getattr(self.ni.network.broker, "close_region", None)
        if close_region is not None:
            close_region(self.path)
        if words[self._peer_word + 1] != STATE_ATTACHED:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        for fd in (self._pidfd, self._peer_wake):
            if fd is not None:
                os.close(fd)
        self._pidfd = self._peer_wake = None
        self.tx.data.release()
        self.rx.data.release()
        self._words.release()
        self._view.release()
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
            self.region.close()


# ==================================================================== the NI


class ShmNI(PolledNI):
    """The NI of one node (usually one process) on a :class:`ShmNetwork`.

    It has no processor of its own: the owning process runs it whenever it polls, receives or
    sends (:meth:`progress`), or from :meth:`serve` for upcalls.
    """

    kind = "shm"

    def __init__(self, name: str, host: Host, network: ShmNetwork) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=network.inline_threshold,
            max_message=network.spec.max_message,
            alignment=network.alignment,
            direct_access=False,
        )
        self.network = network
        self.spin_time = network.spin_time
        self.max_sleep = network.max_sleep
        self._links: dict[Hashable, ShmLink] = {}
        self._link_list: list[ShmLink] = []
        self._tx_blocked = False
        self._sleeper = False
        self._lot = trio.lowlevel.ParkingLot()
        self.wake_path = os.path.join(network.directory, f"{name}.wake")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.wake_path)
        os.mkfifo(self.wake_path, 0o600)
        # O_RDWR keeps the FIFO open for writing too, so open() never blocks and reads never
        # see end-of-file while no peer has it open.
        self._wake_fd = os.open(self.wake_path, os.O_RDWR | os.O_NONBLOCK)
        self.wakeups_sent = 0
        self.sleeps = 0

    # ---------------------------------------------------------------- addressing
    def address_of(self, endpoint: Endpoint) -> ShmAddress:
        return ShmAddress(self.name, endpoint.port)

    def _tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, ShmAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not a ShmAddress")
        if not _NAME.match(remote.node) or not 0 <= remote.port < 1 << 16:
            raise ChannelError(f"{self!r} cannot reach {remote}: bad node name or port")
        rx_key = (remote.node, remote.port, endpoint.port)
        if rx_key in self._links:
            raise ChannelError(f"{self!r} already has a channel from {remote} to {endpoint!r}")
        local = ShmAddress(self.name, endpoint.port)
        if local == remote:
            raise ChannelError(f"{self!r}: a channel from {local} to itself")
        region, side, path = self.network.broker.open_region(local, remote, self.network.spec)
        link = ShmLink(self, region, side, path, remote, rx_key)
        self._links[rx_key] = link
        self._link_list.append(link)
        return link, rx_key

    def _register(self, endpoint: Endpoint, channel: Channel) -> None:
        try:
            super()._register(endpoint, channel)
        except BaseException:
            self._drop_link(channel.rx_key)
            raise
        link = self._links.get(channel.rx_key)
        if isinstance(endpoint, ShmEndpoint) and link is not None:
            endpoint._rx_links.append((link, channel.id))

    def _unregister(self, endpoint: Endpoint, channel: Channel) -> None:
        super()._unregister(endpoint, channel)
        if isinstance(endpoint, ShmEndpoint):
            endpoint._rx_links[:] = [e for e in endpoint._rx_links if e[1] != channel.id]
        self._drop_link(channel.rx_key)

    def _drop_link(self, rx_key: Hashable) -> None:
        link = self._links.pop(rx_key, None)
        if link is not None:
            self._link_list.remove(link)
            link.close()

    def link(self, endpoint: Endpoint, channel: int) -> ShmLink:
        """The shared-memory link of one of ``endpoint``'s channels."""
        found = self._links.get(endpoint.channel(channel).rx_key)
        if found is None:
            raise ChannelError(f"{endpoint!r} channel {channel} has no link")
        return found

    # ---------------------------------------------------------------- send path
    def _validate(self, endpoint: Endpoint, descriptor: SendDescriptor) -> SendError:
        error = super()._validate(endpoint, descriptor)
        if error is SendError.NONE:
            link = endpoint.channels[descriptor.channel].tx_tag
            if isinstance(link, ShmLink) and link.failed is not None:
                return SendError.CHANNEL_CLOSED
        return error

    def _transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        link: ShmLink = channel.tx_tag  # type: ignore[assignment]
        ring = link.tx
        written = ring.try_write(data)
        if not written:
            if written is None:
                link.failed = f"peer {link.remote} corrupted the ring's head counter"
                # Reject rather than wait forever on a ring that cannot drain.
                descriptor.status = DescriptorStatus.ERROR
                descriptor.error = SendError.CHANNEL_CLOSED
                endpoint.send_errors[SendError.CHANNEL_CLOSED.name] += 1
                self.send_errors[SendError.CHANNEL_CLOSED.name] += 1
                return True
            ring.set_producer_waiting(True)
            self._tx_blocked = True
            return False
        if ring.consumer_sleeping:
            self.wakeups_sent += 1
            link.wake_peer()
        self._injected(endpoint, descriptor, len(data))
        return True

    # ---------------------------------------------------------------- receive path
    def progress(self) -> int:
        """Run the NI once: move arrived messages into their endpoints (while they have room;
        a message that does not fit stays in the ring, which pushes back on the sender) and
        retry sends the rings refused.  Returns how many messages were delivered."""
        delivered = 0
        inline = self.inline_threshold
        for link in self._link_list:
            ring = link.rx
            if ring._head == ring._words[ring._base + _TAIL]:
                continue
            entry = self._demux.get(link.rx_key)
            if entry is None:
                continue
            endpoint = entry[0]
            recv_queue = endpoint.recv_queue
            before = ring.corrupt
            while not recv_queue.full:
                view = ring.peek()
                if view is None:
                    break
                length = len(view)
                if length > inline and not _room(endpoint, length):
                    view.release()
                    break
                self._fill(endpoint, entry[1], view, None)
                ring.release(view)
                delivered += 1
            if ring.corrupt != before:
                for _ in range(ring.corrupt - before):
                    self.drop(DropReason.MALFORMED, endpoint)
            if ring.producer_waiting:
                ring.set_producer_waiting(False)
                link.wake_peer()
        if self._tx_blocked:
            self._tx_blocked = False
            self._resume()
        return delivered

    def check_peers(self) -> None:
        """Look for dead or departed peers (done when idle, never per message)."""
        for link in self._link_list:
            link.check_peer()

    async def idle_wait(self) -> None:
        """Sleep until a peer wakes this node, at most ``max_sleep`` seconds.

        One task sleeps on the wake FIFO for the whole node; other tasks of this process that
        want to sleep park behind it and wake with it.
        """
        if self._sleeper:
            with trio.move_on_after(self.max_sleep):
                await self._lot.park()
            return
        self._sleeper = True
        self.sleeps += 1
        links = self._link_list
        try:
            for link in links:
                link.rx.set_sleeping(True)
            # Re-check after raising the flags: a message may have landed in between.
            if not any(link.rx.pending for link in links):
                with trio.move_on_after(self.max_sleep):
                    await trio.lowlevel.wait_readable(self._wake_fd)
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_fd, 4096):
                        pass
            self.check_peers()
        finally:
            for link in links:
                if not link.closed:
                    link.rx.set_sleeping(False)
            self._sleeper = False
            self._lot.unpark_all()

    async def serve(self) -> None:
        """Run the NI in a task forever: deliver arrivals (raising upcalls), spin then sleep."""
        while True:
            if self.progress():
                await trio.lowlevel.checkpoint()
                continue
            deadline = time.perf_counter() + self.spin_time
            while time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
                if self.progress():
                    break
            else:
                await self.idle_wait()

    # ---------------------------------------------------------------- helpers
    def _open_wake(self, node: str) -> int | None:
        path = os.path.join(self.network.directory, f"{node}.wake")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return None  # the peer has not started yet (or is gone): nothing to wake
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def close(self) -> None:
        """Close every endpoint's links and the wake FIFO."""
        for endpoint in list(self.endpoints.values()):
            if not endpoint.closed:
                endpoint.close()
        for link in list(self._link_list):
            self._drop_link(link.rx_key)
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            self._wake_fd = -1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.wake_path)


def _room(endpoint: Endpoint, length: int) -> bool:
    """Whether the free queue holds enough buffer space for ``length`` bytes."""
    total = 0
    for _, size in endpoint.free_queue:
        total += size
        if total >= length:
            return True
    return False


# ==================================================================== endpoints


class ShmEndpoint(Endpoint):
    """An endpoint whose receive and send calls run the NI (there is no NI processor)."""

    ni: ShmNI

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: (link, channel id) of each channel, in the order the fast poll scans them.
        self._rx_links: list[tuple[ShmLink, int]] = []

    def poll(self) -> Message | None:
        """The next message, or None.

        The fast path (nothing queued, no upcalls) copies the message straight from the
        peer's ring into the returned bytes: the ring record is the receive buffer.  Otherwise
        the NI runs (:meth:`ShmNI.progress`) and the generic descriptor path applies.
        """
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            if not self.recv_queue:
                self.ni.progress()
            return super().poll()
        links = self._rx_links
        for index, (link, channel) in enumerate(links):
            ring = link.rx
            if ring._head == ring._words[ring._base + _TAIL]:
                continue
            corrupt = ring.corrupt
            view = ring.peek()
            if ring.corrupt != corrupt:
                for _ in range(ring.corrupt - corrupt):
                    self.ni.drop(DropReason.MALFORMED, self)
            if view is None:
                continue
            data = bytes(view)
            ring.release(view)
            if ring.producer_waiting:
                ring.set_producer_waiting(False)
                link.wake_peer()
            if len(links) > 1:  # round robin, so one busy channel cannot starve the others
                links.append(links.pop(index))
            length = len(data)
            self.received += 1
            self.received_bytes += length
            ni = self.ni
            ni.received += 1
            ni.received_bytes += length
            return Message(channel, data)
        if self.ni._tx_blocked:
            self.ni.progress()
        return None

    def send_nowait(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        """Send now or raise :class:`trio.WouldBlock`.

        Fast path: a small message with nothing queued before it goes straight into the peer's
        ring; the descriptor is returned already injected.
        """
        if len(data) <= self.ni.inline_threshold and dest_offset is None and not self.send_queue:
            entry = self.channels.get(channel)
            if entry is not None and not self.closed:
                link: ShmLink = entry.tx_tag  # type: ignore[assignment]
                if link.failed is None and link.tx.try_write(data):
                    ni = self.ni
                    if link.tx.consumer_sleeping:
                        ni.wakeups_sent += 1
                        link.wake_peer()
                    inline = data if type(data) is bytes else bytes(data)
                    descriptor = SendDescriptor(
                        channel, inline=inline, status=DescriptorStatus.INJECTED
                    )
                    length = len(inline)
                    self.sent += 1
                    self.sent_bytes += length
                    ni.sent += 1
                    ni.sent_bytes += length
                    return descriptor
        self._raise_if_failed(channel)
        try:
            return super().send_nowait(channel, data, dest_offset=dest_offset)
        except trio.WouldBlock:
            self.ni.progress()
            return super().send_nowait(channel, data, dest_offset=dest_offset)

    async def send(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        await trio.lowlevel.checkpoint_if_cancelled()
        deadline = 0.0
        while True:
            try:
                descriptor = self.send_nowait(channel, data, dest_offset=dest_offset)
            except trio.WouldBlock:
                now = time.perf_counter()
                if not deadline:
                    deadline = now + self.ni.spin_time
                if now < deadline:
                    await trio.lowlevel.checkpoint()
                else:
                    await self.ni.idle_wait()
            else:
                break
        await trio.lowlevel.cancel_shielded_checkpoint()
        return descriptor

    async def recv(self) -> Message:
        """Wait for a message: spin ``spin_time`` seconds with checkpoints, then sleep."""
        await trio.lowlevel.checkpoint_if_cancelled()
        message = self.poll()
        if message is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return message
        ni = self.ni
        deadline = time.perf_counter() + ni.spin_time
        while True:
            self._check_usable()
            if time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
            else:
                await ni.idle_wait()
                self._raise_if_failed(None)
            message = self.poll()
            if message is not None:
                return message

    def _raise_if_failed(self, channel: int | None) -> None:
        """Raise :class:`PeerGone` for a failed channel whose ring is drained (once when
        receiving; on every send on it)."""
        channels = (
            self.channels.values()
            if channel is None
            else ([self.channels[channel]] if channel in self.channels else [])
        )
        for entry in channels:
            link = entry.tx_tag
            if not isinstance(link, ShmLink) or link.failed is None:
                continue
            if channel is None and (link.reported or link.rx.pending):
                continue
            link.reported = True
            raise PeerGone(f"{self!r} channel {entry.id}: {link.failed}")


ShmNI.endpoint_class = ShmEndpoint


# ==================================================================== the network


#: Seconds a blocking call polls before it sleeps (PERFORMANCE-NOTES: wake-ups across CPUs
#: cost 27-65 us, so spinning about that long first is cheaper on a busy channel).
SPIN_TIME = 50e-6


class ShmNetwork:
    """Nodes whose endpoints talk through shared memory in ``directory``.

    Every process that takes part makes its own ``ShmNetwork`` on the same directory and adds
    its own node(s); channels name remote nodes by name (:class:`ShmAddress`), which may live in
    another process.  Without a directory a private one is made under /dev/shm and removed by
    :meth:`close`.
    """

    kind = "shm"

    def __init__(
        self,
        world: World | None = None,
        *,
        directory: str | None = None,
        ring_bytes: int = 1 << 20,
        max_message: int = 65535,
        inline_threshold: int = 64,
        alignment: int = 8,
        spin_time: float = SPIN_TIME,
        max_sleep: float = 0.02,
        broker: ChannelBroker | None = None,
    ) -> None:
        self.world = world if world is not None else RealWorld()
        if self.world.virtual:
            raise ValueError("the shm transport runs in real time only")
        if spin_time < 0 or max_sleep <= 0:
            raise ValueError("spin_time must be >= 0 and max_sleep > 0")
        self.spec = RegionSpec(ring_bytes, max_message)
        self.inline_threshold = inline_threshold
        self.alignment = alignment
        #: Seconds a blocking call polls before it sleeps (:data:`SPIN_TIME`).
        self.spin_time = spin_time
        #: Longest sleep before re-checking rings and peers (bounds a lost wake-up).
        self.max_sleep = max_sleep
        self.owns_directory = directory is None
        if directory is None:
            base = "/dev/shm" if os.path.isdir("/dev/shm") else None
            directory = tempfile.mkdtemp(prefix="stacklib-shm-", dir=base)
        self.directory = directory
        self.broker: ChannelBroker = broker if broker is not None else FileBroker(directory)
        self.nodes: dict[str, Node] = {}

    def add_node(
        self, name: str, profile: CostProfile | None = None, *, policy: Policy | None = None
    ) -> Node:
        """Add a node (host, NI, OS service) named ``name`` in this process."""
        if not _NAME.match(name):
            raise ValueError(f"node name {name!r} must match {_NAME.pattern}")
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        host = Host(name, self.world, profile)
        ni = ShmNI(name, host, self)
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        return node

    def dropped(self) -> dict[str, int]:
        """Drops by reason summed over this process's NIs."""
        return total_drops(self.nodes.values())

    def close(self) -> None:
        """Close this process's nodes; remove the directory if this network made it."""
        for node in self.nodes.values():
            ni = node.ni
            if isinstance(ni, ShmNI):
                ni.close()
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ShmNetwork:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ==================================================================== peers in other processes


@attrs.frozen
class PeerSpec:
    """What a peer process does: its node and port, whom it talks to, and its role.

    Roles: ``echo`` (send every message back on its channel), ``sink`` (count messages of a
    stream, reply once with the count when a 0-byte message ends it), ``source`` (send
    ``count`` messages of ``size`` bytes, then a 0-byte end marker).  ``mode`` is ``poll``
    (busy-poll loop, no trio) or ``trio`` (``await recv``/``send``).
    """

    directory: str
    node: str
    port: int
    remote_node: str
    remote_port: int
    role: str = "echo"
    mode: str = "poll"
    count: int = 0
    size: int = 40
    ring_bytes: int = 1 << 20
    max_message: int = 65535
    #: Pin the peer process to this CPU (benchmarks place the two processes deliberately).
    cpu: int | None = None
    config: EndpointConfig = attrs.field(factory=EndpointConfig)


def peer_main(spec: PeerSpec) -> None:
    """Entry point of a peer process (spawned with :func:`spawn_peer` or ``-m``)."""
    if spec.cpu is not None:
        os.sched_setaffinity(0, {spec.cpu})
    network = ShmNetwork(
        directory=spec.directory, ring_bytes=spec.ring_bytes, max_message=spec.max_message
    )
    node = network.add_node(spec.node)
    endpoint = node.os.create_endpoint(node.os.process(spec.role), spec.config, port=spec.port)
    if not isinstance(endpoint, ShmEndpoint):
        raise TypeError(f"expected a ShmEndpoint, got {endpoint!r}")
    channel = node.os.create_channel(
        endpoint.owner, endpoint, ShmAddress(spec.remote_node, spec.remote_port)
    )
    try:
        if spec.mode == "trio":
            trio.run(_peer_trio, endpoint, channel, spec)
        else:
            _peer_poll(endpoint, channel, spec)
    except PeerGone:
        pass
    finally:
        network.close()


def relax(spins: int) -> None:
    """Call from a busy-poll loop after each empty poll, with a running count.

    Every 64th empty poll gives the CPU away (``sched_yield``): when both processes of a
    channel land on one CPU (2 cores and other load), the peer then runs within tens of
    microseconds instead of after a whole scheduler time slice.  Across CPUs it costs one
    system call per 64 empty polls, and none while messages flow.
    """
    if spins & 63 == 0:
        os.sched_yield()


def _peer_poll(endpoint: ShmEndpoint, channel: int, spec: PeerSpec) -> None:
    """Busy-poll loop: the fastest receive model (paper 000 §3.1 polling)."""
    poll, send = endpoint.poll, endpoint.send_nowait
    link = endpoint.ni.link(endpoint, channel)
    spins = 0

    def idle() -> None:
        nonlocal spins
        spins += 1
        relax(spins)
        if spins & 0xFFFF == 0:
            link.check_peer()
            if link.failed is not None:
                raise PeerGone(link.failed)

    if spec.role == "source":
        payload = bytes(spec.size)
        for index in range(spec.count + 1):
            outgoing = payload if index < spec.count else b""
            while True:
                try:
                    send(channel, outgoing)
                    break
                except trio.WouldBlock:
                    idle()
        while endpoint.send_queue:
            endpoint.ni.progress()
            idle()
        while poll() is None:  # wait for the receiver's acknowledgment before closing
            idle()
        return
    received = 0
    while True:
        message = poll()
        if message is None:
            idle()
            continue
        if spec.role == "echo":
            while True:
                try:
                    send(message.channel, message.data)
                    break
                except trio.WouldBlock:
                    idle()
        elif message.data:
            received += 1
        else:
            send(message.channel, received.to_bytes(8, "little"))
            received = 0


async def _peer_trio(endpoint: ShmEndpoint, channel: int, spec: PeerSpec) -> None:
    if spec.role == "source":
        payload = bytes(spec.size)
        for _ in range(spec.count):
            await endpoint.send(channel, payload)
        await endpoint.send(channel, b"")
        await endpoint.recv()
        return
    received = 0
    while True:
        message = await endpoint.recv()
        if spec.role == "echo":
            await endpoint.send(message.channel, message.data)
        elif message.data:
            received += 1
        else:
            await endpoint.send(message.channel, received.to_bytes(8, "little"))
            received = 0


def spawn_peer(spec: PeerSpec) -> BaseProcess:
    """Start a peer process with the ``spawn`` start method (a fresh interpreter, as a real
    second application would be) and return it, started."""
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(
        target=peer_main, args=(spec,), daemon=True, name=f"shm-peer-{spec.node}"
    )
    process.start()
    return process


def _main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stacklib.transports.shm",
        description="Run a U-Net shm peer process (echo, sink or source).",
    )
    parser.add_argument("--peer", action="store_true", help="run as a peer (the only mode)")
    parser.add_argument("directory", help="the shared directory of the ShmNetwork")
    parser.add_argument("node", help="this peer's node name")
    parser.add_argument("port", type=int, help="this peer's endpoint port")
    parser.add_argument("remote", help="the remote endpoint as NODE:PORT")
    parser.add_argument("--role", choices=["echo", "sink", "source"], default="echo")
    parser.add_argument("--mode", choices=["poll", "trio"], default="poll")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--size", type=int, default=40)
    args = parser.parse_args(argv)
    remote_node, _, remote_port = args.remote.rpartition(":")
    if not remote_node or not remote_port.isdigit():
        parser.error(f"remote must be NODE:PORT, got {args.remote!r}")
    peer_main(
        PeerSpec(
            directory=args.directory,
            node=args.node,
            port=args.port,
            remote_node=remote_node,
            remote_port=int(remote_port),
            role=args.role,
            mode=args.mode,
            count=args.count,
            size=args.size,
        )
    )
    return 0


# ==================================================================== registration


@attrs.frozen
class ShmParams:
    """Recipe parameters of the shm transport."""

    ring_bytes: int = attrs.field(default=1 << 20, validator=attrs.validators.ge(4096))
    max_message: int = attrs.field(default=65535, validator=attrs.validators.ge(1))
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    spin_us: float = attrs.field(default=SPIN_TIME * 1e6, validator=attrs.validators.ge(0.0))
    max_sleep_ms: float = attrs.field(default=20.0, validator=attrs.validators.gt(0.0))


def _build(
    world: World, params: ShmParams, names: Sequence[str], profile: CostProfile | None
) -> ShmNetwork:
    network = ShmNetwork(
        world,
        ring_bytes=params.ring_bytes,
        max_message=params.max_message,
        inline_threshold=params.inline_threshold,
        spin_time=params.spin_us * 1e-6,
        max_sleep=params.max_sleep_ms * 1e-3,
    )
    for name in names:
        network.add_node(name, profile)
    return network


if __name__ == "__main__":
    # Run as ``python -m``: delegate to the imported module, so the classes (and the
    # transport registration) are the package's own, not copies living in ``__main__``.
    from stacklib.transports.shm import _main as main

    sys.exit(main(sys.argv[1:]))
else:
    register_transport(
        TransportKind(
            name="shm",
            Params=ShmParams,
            build=_build,
            description="U-Net between processes over shared-memory rings; no syscall per message",
            clock="real",
        )
    )
