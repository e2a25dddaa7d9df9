"""AF_XDP sockets from Python: the UMEM, the four rings, binding, statistics.

The mapping to U-Net (paper 000 §3.1) is direct: the UMEM is the communication segment, the
FILL ring the free queue, the RX ring the receive queue, TX the send queue, and COMPLETION
hands the send descriptors' buffers back.  The kernel sets everything up (socket, registration,
binding) and afterwards only copies frames and takes a wake-up call on transmit.

Set-up is split along the OS service's line: :func:`open_socket` is the privileged half (an
``AF_XDP`` socket needs CAP_NET_RAW; it registers the UMEM, sizes the rings and binds), and
:class:`XskSocket` the unprivileged half, which maps the rings and the UMEM from the two
file descriptors :func:`open_socket` returns.  A process may do both, or receive the
descriptors from the daemon (``SCM_RIGHTS``) and do only the second.

The UMEM is a ``memfd``, not anonymous memory, so another process can map the same pages.  Ring
operations are plain loads and stores through memoryviews: correct on x86 (total store order);
a weakly ordered CPU (arm64) would need barriers Python cannot emit, so :func:`open_socket`
refuses other architectures.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import platform
import socket
import struct
import time

import attrs

from stacklib.errors import StacklibError

__all__ = ["AF_XDP", "XdpSetupError", "XskLayout", "XskSocket", "open_socket", "xdp_problem"]

AF_XDP = 44
SOL_XDP = 283
XDP_MMAP_OFFSETS, XDP_RX_RING, XDP_TX_RING, XDP_UMEM_REG = 1, 2, 3, 4
XDP_UMEM_FILL_RING, XDP_UMEM_COMPLETION_RING, XDP_STATISTICS, XDP_OPTIONS = 5, 6, 7, 8
XDP_SHARED_UMEM, XDP_COPY, XDP_ZEROCOPY, XDP_USE_NEED_WAKEUP = 1, 2, 4, 8
XDP_MAX_TX_SKB_BUDGET = 9
XDP_OPTIONS_ZEROCOPY = 1
#: Frames the kernel sends per wake-up in copy mode: 32, or up to the TX ring's size where
#: ``XDP_MAX_TX_SKB_BUDGET`` exists (Linux 6.16); stacklib asks for this many.
TX_BUDGET = 256
DEFAULT_TX_BUDGET = 32
XDP_RING_NEED_WAKEUP = 1
#: mmap offsets of the rings (linux/if_xdp.h).
XDP_PGOFF_RX_RING, XDP_PGOFF_TX_RING = 0, 0x80000000
XDP_UMEM_PGOFF_FILL_RING, XDP_UMEM_PGOFF_COMPLETION_RING = 0x100000000, 0x180000000
#: In copy mode received data starts this far into its chunk.
XDP_PACKET_HEADROOM = 256
#: ``struct xdp_statistics``, in order.
STATISTICS = (
    "rx_dropped",
    "rx_invalid_descs",
    "tx_invalid_descs",
    "rx_ring_full",
    "rx_fill_ring_empty_descs",
    "tx_ring_empty_descs",
)
_BIND_RETRY = 2.0

_libc = ctypes.CDLL(None, use_errno=True)


class XdpSetupError(StacklibError, OSError):
    """Setting up an AF_XDP socket failed; the message names the step and the reason."""


@attrs.frozen
class XskLayout:
    """How an AF_XDP socket's UMEM and rings are sized.

    The UMEM holds ``frames`` chunks of ``frame_size`` bytes: the first half receive buffers
    (they circulate through FILL and RX), the second half send buffers (TX and COMPLETION).
    FILL is twice the receive buffers, because the kernel publishes an RX descriptor before it
    frees the FILL slot, so FILL can look full for a moment with every buffer accounted for.
    """

    frames: int = 4096
    frame_size: int = 2048

    def __attrs_post_init__(self) -> None:
        for name in ("frames", "frame_size"):
            value = getattr(self, name)
            if value < 2 or value & (value - 1):
                raise ValueError(f"XskLayout.{name} must be a power of two >= 2, got {value}")
        if not 2048 <= self.frame_size <= 4096:
            raise ValueError(f"XskLayout.frame_size must be 2048 or 4096, got {self.frame_size}")

    @property
    def umem_size(self) -> int:
        return self.frames * self.frame_size

    @property
    def rx_frames(self) -> int:
        return self.frames // 2

    @property
    def ring_size(self) -> int:
        """RX, TX and COMPLETION: one slot per buffer of their half."""
        return self.frames // 2

    @property
    def fill_size(self) -> int:
        return self.frames


def xdp_problem() -> str | None:
    """Why AF_XDP sockets cannot be used here, or None if they can (probes a socket)."""
    if platform.system() != "Linux":
        return f"AF_XDP needs Linux, this is {platform.system()}"
    if platform.machine() != "x86_64":
        return f"stacklib's AF_XDP rings need x86's store ordering; this is {platform.machine()}"
    try:
        socket.socket(AF_XDP, socket.SOCK_RAW, 0).close()
    except OSError as error:
        if error.errno == errno.EPERM:
            return "AF_XDP sockets need CAP_NET_RAW (run as root)"
        return f"AF_XDP sockets are not available: {error.strerror}"
    return None


def _umem_address(memory: mmap.mmap) -> int:
    holder = ctypes.c_char.from_buffer(memory)
    try:
        return ctypes.addressof(holder)
    finally:
        del holder


def _bind(fd: int, flags: int, ifindex: int, queue: int) -> None:
    address = struct.pack("=HHIII", AF_XDP, flags, ifindex, queue, 0)
    buffer = ctypes.create_string_buffer(address, len(address))
    if _libc.bind(fd, buffer, len(address)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


@attrs.frozen
class OpenedSocket:
    """What the privileged half hands over: the socket, the UMEM's memfd, how it is set up."""

    sock: socket.socket
    umem_fd: int
    layout: XskLayout
    ifindex: int
    queue: int
    zero_copy: bool


def open_socket(
    interface: str,
    queue: int = 0,
    layout: XskLayout | None = None,
    *,
    zero_copy: bool | None = None,
) -> OpenedSocket:
    """Create, register and bind an AF_XDP socket on ``interface``'s ``queue`` (privileged).

    ``zero_copy``: True insists on it, False uses copy mode, None (default) tries zero-copy and
    falls back to copy mode where the driver has none (veth, for one).  Binding a queue that a
    socket closed a moment ago fails with EBUSY for up to about half a second: retried.
    """
    layout = layout or XskLayout()
    problem = xdp_problem()
    if problem is not None:
        raise XdpSetupError(errno.EOPNOTSUPP, problem)
    try:
        ifindex = socket.if_nametoindex(interface)
    except OSError:
        raise XdpSetupError(errno.ENODEV, f"no network interface named {interface!r}") from None
    sock = socket.socket(AF_XDP, socket.SOCK_RAW, 0)
    umem_fd = -1
    try:
        umem_fd = os.memfd_create("stacklib-umem", os.MFD_CLOEXEC)
        os.ftruncate(umem_fd, layout.umem_size)
        memory = mmap.mmap(umem_fd, layout.umem_size, mmap.MAP_SHARED)
        try:
            reg = struct.pack(
                "=QQIIII", _umem_address(memory), layout.umem_size, layout.frame_size, 0, 0, 0
            )
            _step(sock.setsockopt, "register the UMEM", SOL_XDP, XDP_UMEM_REG, reg)
        finally:
            memory.close()  # the kernel pinned the pages; the memfd keeps them for mapping
        for option, size, what in (
            (XDP_UMEM_FILL_RING, layout.fill_size, "FILL"),
            (XDP_UMEM_COMPLETION_RING, layout.ring_size, "COMPLETION"),
            (XDP_RX_RING, layout.ring_size, "RX"),
            (XDP_TX_RING, layout.ring_size, "TX"),
        ):
            _step(sock.setsockopt, f"size the {what} ring", SOL_XDP, option, size)
        modes = {True: [XDP_ZEROCOPY], False: [XDP_COPY], None: [XDP_ZEROCOPY, XDP_COPY]}
        chosen = _bind_retrying(sock.fileno(), modes[zero_copy], ifindex, queue, interface)
        return OpenedSocket(sock, umem_fd, layout, ifindex, queue, chosen == XDP_ZEROCOPY)
    except BaseException:
        sock.close()
        if umem_fd >= 0:
            os.close(umem_fd)
        raise


def _step(call: object, what: str, *args: object) -> None:
    try:
        call(*args)  # type: ignore[operator]
    except OSError as error:
        raise XdpSetupError(error.errno, f"AF_XDP: cannot {what}: {error.strerror}") from None


def _bind_retrying(fd: int, modes: list[int], ifindex: int, queue: int, interface: str) -> int:
    deadline = time.monotonic() + _BIND_RETRY
    while True:
        for index, mode in enumerate(modes):
            try:
                _bind(fd, mode | XDP_USE_NEED_WAKEUP, ifindex, queue)
                return mode
            except OSError as error:
                last = error
                if error.errno in (errno.EOPNOTSUPP, errno.EPROTONOSUPPORT) and index + 1 < len(
                    modes
                ):
                    continue  # no zero-copy in this driver: copy mode
                break
        if last.errno != errno.EBUSY or time.monotonic() > deadline:
            raise XdpSetupError(
                last.errno,
                f"AF_XDP: cannot bind to {interface} queue {queue}: {last.strerror}"
                + (" (another socket holds the queue)" if last.errno == errno.EBUSY else ""),
            )
        time.sleep(0.02)


class _Ring:
    """One single-producer single-consumer ring mapped from the socket."""

    def __init__(
        self, sock: socket.socket, offsets: tuple[int, ...], page: int, size: int, entry: int
    ):
        producer, consumer, desc, flags = offsets
        self.size = size
        self.mask = size - 1
        #: Where the descriptors start in :attr:`memory`.
        self.desc = desc
        self.memory = mmap.mmap(
            sock.fileno(),
            desc + size * entry,
            mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
            mmap.PROT_READ | mmap.PROT_WRITE,
            offset=page,
        )
        view = memoryview(self.memory)
        self.producer = view[producer : producer + 4].cast("I")
        self.consumer = view[consumer : consumer + 4].cast("I")
        self.flags = view[flags : flags + 4].cast("I")
        self.words = view[desc : desc + size * entry].cast("I")
        self.quads = view[desc : desc + size * entry].cast("Q")
        self._views = [self.producer, self.consumer, self.flags, self.words, self.quads, view]

    def close(self) -> None:
        for view in self._views:
            view.release()
        self.memory.close()


class XskSocket:
    """The unprivileged half: an AF_XDP socket's rings and UMEM mapped into this process.

    Methods move descriptors; framing and demultiplexing are the NI's
    (:class:`~stacklib.transports.xdp.ni.XdpNI`).
    """

    def __init__(self, opened: OpenedSocket) -> None:
        self.sock = opened.sock
        self.layout = layout = opened.layout
        self.zero_copy = opened.zero_copy
        self.ifindex = opened.ifindex
        self.queue = opened.queue
        self.umem_fd = opened.umem_fd
        self.fd = self.sock.fileno()
        raw = self.sock.getsockopt(SOL_XDP, XDP_MMAP_OFFSETS, 128)
        values = struct.unpack("=16Q", raw)
        rx, tx, fill, comp = (values[i : i + 4] for i in range(0, 16, 4))
        self.rx = _Ring(self.sock, rx, XDP_PGOFF_RX_RING, layout.ring_size, 16)
        self.tx = _Ring(self.sock, tx, XDP_PGOFF_TX_RING, layout.ring_size, 16)
        self.fill = _Ring(self.sock, fill, XDP_UMEM_PGOFF_FILL_RING, layout.fill_size, 8)
        self.comp = _Ring(self.sock, comp, XDP_UMEM_PGOFF_COMPLETION_RING, layout.ring_size, 8)
        self.umem = mmap.mmap(self.umem_fd, layout.umem_size, mmap.MAP_SHARED)
        self.view = memoryview(self.umem)
        half = layout.rx_frames * layout.frame_size
        #: Send buffers not in the TX ring or waiting for completion.
        self.tx_free = list(range(half, layout.umem_size, layout.frame_size))
        #: Receive buffers to give back once FILL has room (see :class:`XskLayout`).
        self.fill_pending: list[int] = []
        self._returned: list[int] = []
        #: Frames one wake-up sends in copy mode (see :data:`TX_BUDGET`).
        self.tx_budget = DEFAULT_TX_BUDGET
        wanted = min(TX_BUDGET, layout.ring_size)
        try:
            self.sock.setsockopt(SOL_XDP, XDP_MAX_TX_SKB_BUDGET, wanted)
            self.tx_budget = wanted
        except OSError:
            pass  # an older kernel: 32 per wake-up
        self.kicks = 0
        self.kick_retries = 0
        self.fill_wakeups = 0
        self.closed = False
        self.refill(list(range(0, half, layout.frame_size)))

    # ---------------------------------------------------------------- FILL and RX
    def refill(self, addresses: list[int]) -> None:
        """Give receive buffers to the kernel (FILL), keeping what does not fit for later."""
        if self._returned:
            addresses = self._returned + addresses
            self._returned = []
        pending = self.fill_pending
        if pending:
            pending.extend(addresses)
            addresses, self.fill_pending = pending, []
        ring = self.fill
        producer = ring.producer[0]
        room = (ring.consumer[0] + ring.size - producer) & 0xFFFFFFFF
        count = min(room, len(addresses))
        quads, mask = ring.quads, ring.mask
        for index in range(count):
            quads[(producer + index) & mask] = addresses[index]
        if count:
            ring.producer[0] = (producer + count) & 0xFFFFFFFF
        if count < len(addresses):
            self.fill_pending = addresses[count:]
        if ring.flags[0] & XDP_RING_NEED_WAKEUP:
            self.fill_wakeups += 1
            with contextlib.suppress(BlockingIOError, InterruptedError):
                self.sock.recv(0, socket.MSG_DONTWAIT)

    def give_back(self, address: int) -> None:
        """Return one receive buffer; they go back to FILL in batches of 16."""
        pending = self._returned
        pending.append(address)
        if len(pending) >= 16:
            self._returned = []
            self.refill(pending)

    def rx_available(self) -> int:
        """How many received frames wait in RX."""
        ring = self.rx
        return (ring.producer[0] - ring.consumer[0]) & 0xFFFFFFFF

    # ---------------------------------------------------------------- TX and COMPLETION
    def reclaim(self) -> int:
        """Take completed send buffers back from COMPLETION; how many."""
        ring = self.comp
        consumer = ring.consumer[0]
        count = (ring.producer[0] - consumer) & 0xFFFFFFFF
        if count:
            quads, mask, free = ring.quads, ring.mask, self.tx_free
            for index in range(count):
                free.append(quads[(consumer + index) & mask])
            ring.consumer[0] = (consumer + count) & 0xFFFFFFFF
        return count

    def kick(self) -> bool:
        """Tell the kernel the TX ring has frames (needed after every batch in copy mode);
        False when the kernel asked to be tried again (EAGAIN, EBUSY, ENOBUFS, ENETDOWN)."""
        if not self.tx.flags[0] & XDP_RING_NEED_WAKEUP:
            return True
        self.kicks += 1
        try:
            self.sock.send(b"", socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self.kick_retries += 1
            return False
        except OSError as error:
            if error.errno in (errno.EBUSY, errno.ENOBUFS, errno.ENETDOWN):
                self.kick_retries += 1
                return False
            raise
        return True

    def tx_pending(self) -> int:
        """Descriptors in TX the kernel has not taken yet."""
        ring = self.tx
        return (ring.producer[0] - ring.consumer[0]) & 0xFFFFFFFF

    # ---------------------------------------------------------------- statistics
    def statistics(self) -> dict[str, int]:
        """The kernel's counters for this socket (``XDP_STATISTICS``), plus the rings' state."""
        raw = self.sock.getsockopt(SOL_XDP, XDP_STATISTICS, 8 * len(STATISTICS))
        values = struct.unpack(f"={len(raw) // 8}Q", raw)
        stats = dict(zip(STATISTICS, values, strict=False))
        stats.update(kicks=self.kicks, kick_retries=self.kick_retries)
        stats.update(fill_wakeups=self.fill_wakeups, fill_pending=len(self.fill_pending))
        return stats

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.view.release()
        self.umem.close()
        for ring in (self.rx, self.tx, self.fill, self.comp):
            ring.close()
        self.sock.close()
        os.close(self.umem_fd)
