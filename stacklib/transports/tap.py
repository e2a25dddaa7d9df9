"""A TAP device: whole Ethernet frames between stacklib and the Linux kernel.

``open_tap`` opens ``/dev/net/tun`` as a TAP (``IFF_TAP | IFF_NO_PI``), so every ``read`` is one
Ethernet frame the kernel transmitted on the interface and every ``write`` is one frame the
kernel receives on it.  stacklib plays the host on the far end of that cable: it has its own MAC
address (:attr:`TapDevice.mac`, locally administered), distinct from the kernel interface's
(:attr:`TapDevice.kernel_mac`).

Namespace model: the stacklib process stays in its own (root) network namespace and holds the
file descriptor.  With ``netns="NS"`` the kernel *interface* lives in namespace NS: it is created
in the caller's namespace under a temporary name, its MTU set there, then moved and renamed in
one step (``ip link set dev TMP netns NS name NAME``) and brought up inside NS.  A tun file keeps
working across such a move, and moving needs no ``setns`` by the process (which would change the
namespace of a thread trio runs on).  Closing the descriptor deletes the interface, wherever it
is; deleting the namespace deletes it too.

The descriptor is non-blocking and driven by trio's I/O waits (``wait_readable`` /
``wait_writable``), no threads.  One task may receive while another sends.

:class:`TapDevice` is a :class:`~stacklib.layers.ip.service.FrameService`, the service IP's
Ethernet mode (layer ``ip-ether``) runs over.  It is not a registered transport: those build
networks of U-Net nodes, and a TAP device is one Ethernet link to the kernel.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import socket
import struct
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import trio

from stacklib.errors import StacklibError
from stacklib.services import FrameService

__all__ = [
    "ETHERNET_HEADER",
    "FrameSizeError",
    "TapDevice",
    "TapError",
    "open_tap",
    "random_mac",
    "temporary_name_prefix",
]

#: Destination MAC, source MAC, EtherType: what a frame carries beyond the MTU.
ETHERNET_HEADER = 14

_TUN_PATH = "/dev/net/tun"
# ioctl numbers from <linux/if_tun.h> and <linux/sockios.h> (x86-64, arm64 and most others).
_TUNSETIFF = 0x400454CA
_TUNGETIFF = 0x800454D2
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_SIOCSIFMTU = 0x8922
_SIOCGIFHWADDR = 0x8927
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000
_IFF_UP = 0x0001
_IFNAMSIZ = 16
# struct ifreq: a 16-byte name, then a 24-byte union (flags, mtu or sockaddr).
_IFREQ_FLAGS = struct.Struct("16sH22x")
_IFREQ_INT = struct.Struct("16si20x")
_IFREQ_HWADDR = struct.Struct("16sH6s16x")
_MIN_MTU, _MAX_MTU = 68, 65535  # ETH_MIN_MTU and the tun driver's maximum
#: Interface names the kernel picks: the default one, and a temporary one before a move.
_DEFAULT_PATTERN = "tap%d"


def temporary_name_prefix() -> str:
    """How the names of this process's interfaces start before they move to a namespace
    (``sl<pid>t``), so a leftover can be traced to the process that made it."""
    return f"sl{os.getpid()}t"


# Write failures that lose one frame, as a wire would (EIO: the interface is down); any other
# errno means the descriptor no longer works.
_LOSSY_WRITE_ERRORS = frozenset({errno.EIO, errno.EINVAL, errno.ENOBUFS, errno.ENOMEM})


class TapError(StacklibError, OSError):
    """A TAP device cannot be created or configured; the message says why and what to do."""


class FrameSizeError(StacklibError, ValueError):
    """A frame handed to :meth:`TapDevice.send` is longer than the MTU allows, or shorter than
    an Ethernet header."""


def random_mac() -> bytes:
    """A random locally administered unicast MAC address."""
    first, *rest = os.urandom(6)
    return bytes([(first & 0xFC) | 0x02, *rest])


class TapDevice(FrameService, trio.abc.AsyncResource):
    """An open TAP device; make one with :func:`open_tap`.

    The frame service IP's Ethernet mode needs: :meth:`send`, :meth:`recv`, :attr:`mac` and
    :attr:`mtu`, plus :meth:`statistics`.
    """

    def __init__(
        self, fd: int, name: str, *, netns: str | None, mtu: int, mac: bytes, kernel_mac: bytes
    ) -> None:
        self._fd = fd
        #: The kernel interface's name (in :attr:`netns`, or the caller's namespace).
        self.name = name
        #: The namespace holding the kernel interface; None: the caller's own.
        self.netns = netns
        self._mtu = mtu
        self._mac = mac
        #: The kernel interface's own MAC address.
        self.kernel_mac = kernel_mac
        # One more byte than the largest frame: a read that fills it was truncated by the kernel.
        self._buffer = bytearray(self.max_frame + 1)
        self._view = memoryview(self._buffer)
        self._frames_in = self._bytes_in = self._frames_out = self._bytes_out = 0
        self._dropped: Counter[str] = Counter()

    def __repr__(self) -> str:
        where = f" in netns {self.netns!r}" if self.netns else ""
        state = "closed" if self._fd < 0 else f"mtu {self._mtu}"
        return f"<TapDevice {self.name}{where} {state}>"

    @property
    def mac(self) -> bytes:
        """The MAC address stacklib uses on this link (6 bytes, not the kernel's)."""
        return self._mac

    @property
    def mtu(self) -> int:
        """The largest payload of a frame (the interface MTU)."""
        return self._mtu

    @property
    def max_frame(self) -> int:
        """The largest frame :meth:`send` accepts: the MTU plus the Ethernet header."""
        return self._mtu + ETHERNET_HEADER

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def statistics(self) -> Mapping[str, object]:
        """Frames and bytes moved each way, and ``dropped`` frames by reason: ``too-long`` and
        ``too-short`` (refused by :meth:`send`, or dropped on receipt), ``write-error``."""
        return {
            "frames_in": self._frames_in,
            "bytes_in": self._bytes_in,
            "frames_out": self._frames_out,
            "bytes_out": self._bytes_out,
            "dropped": dict(self._dropped),
        }

    # ------------------------------------------------------------------ send

    def send_nowait(self, frame: bytes | bytearray | memoryview) -> None:
        """Send one frame now, or raise :class:`trio.WouldBlock`.

        A frame lost to the interface (it is down) is counted as ``write-error``, not raised:
        frames may be lost, as on any Ethernet.  :class:`trio.BrokenResourceError` once the
        interface is deleted.
        """
        fd = self._open_fd()
        length = len(frame)
        if length > self.max_frame:
            self._dropped["too-long"] += 1
            raise FrameSizeError(
                f"{self.name}: frame of {length} bytes exceeds MTU {self._mtu} "
                f"(at most {self.max_frame} bytes with the Ethernet header)"
            )
        if length < ETHERNET_HEADER:
            self._dropped["too-short"] += 1
            raise FrameSizeError(
                f"{self.name}: frame of {length} bytes is shorter than an Ethernet header "
                f"({ETHERNET_HEADER} bytes)"
            )
        try:
            os.write(fd, frame)
        except BlockingIOError:
            raise trio.WouldBlock from None
        except OSError as exc:
            self._dropped["write-error"] += 1
            if exc.errno not in _LOSSY_WRITE_ERRORS:
                raise trio.BrokenResourceError(f"{self.name}: write failed: {exc}") from exc
            return
        self._frames_out += 1
        self._bytes_out += length

    async def send(self, frame: bytes | bytearray | memoryview) -> None:
        """Send one Ethernet frame (header included, no FCS); waits while the device is full."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                self.send_nowait(frame)
            except trio.WouldBlock:
                await trio.lowlevel.wait_writable(self._fd)
            else:
                break
        await trio.lowlevel.cancel_shielded_checkpoint()

    # ------------------------------------------------------------------ receive

    def recv_nowait(self) -> bytes:
        """The next frame the kernel sent, or :class:`trio.WouldBlock` if there is none."""
        fd = self._open_fd()
        while True:
            try:
                length = os.readv(fd, [self._buffer])
            except BlockingIOError:
                raise trio.WouldBlock from None
            except OSError as exc:
                if exc.errno == errno.EBADFD:
                    # The interface was deleted (ip link delete, or its namespace went away):
                    # the link's end, as FrameService reports it.
                    raise trio.EndOfChannel(f"{self.name}: the interface is gone") from exc
                raise trio.BrokenResourceError(f"{self.name}: read failed: {exc}") from exc
            if length > self.max_frame:
                # The kernel truncates to the buffer; a frame this long came from an MTU raised
                # behind our back.
                self._dropped["too-long"] += 1
            elif length < ETHERNET_HEADER:
                self._dropped["too-short"] += 1
            else:
                self._frames_in += 1
                self._bytes_in += length
                return bytes(self._view[:length])

    async def recv(self) -> bytes:
        """The next Ethernet frame the kernel sent on the interface; :class:`trio.EndOfChannel`
        once the interface is deleted."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                frame = self.recv_nowait()
            except trio.WouldBlock:
                await trio.lowlevel.wait_readable(self._fd)
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return frame

    def __aiter__(self) -> TapDevice:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.recv()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Close the descriptor, which deletes the interface; idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            # Wakes tasks blocked in recv/send with ClosedResourceError before the fd number
            # can be reused.
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def _open_fd(self) -> int:
        if self._fd < 0:
            raise trio.ClosedResourceError(f"{self.name}: the TAP device is closed")
        return self._fd


@asynccontextmanager
async def open_tap(
    name: str | None = None,
    *,
    netns: str | None = None,
    mtu: int = 1500,
    address: str | None = None,
    mac: bytes | None = None,
) -> AsyncIterator[TapDevice]:
    """Create a TAP device, bring its kernel interface up, and close it on exit.

    ``name``: the kernel interface's name (the kernel picks ``tapN`` if None).  ``netns``: an
    existing network namespace to put the kernel interface in (see the module docstring).
    ``address``: an address with prefix (``"10.99.0.1/24"``) to give the kernel interface.
    ``mac``: stacklib's MAC on this link (random, locally administered, if None).  Needs
    CAP_NET_ADMIN, and the ``ip`` tool when ``netns`` or ``address`` is given.
    """
    tap = await _create(name, netns=netns, mtu=mtu, address=address, mac=mac)
    try:
        yield tap
    finally:
        tap.close()


async def _create(
    name: str | None, *, netns: str | None, mtu: int, address: str | None, mac: bytes | None
) -> TapDevice:
    _check_name(name)
    if not _MIN_MTU <= mtu <= _MAX_MTU:
        raise ValueError(f"mtu must be in [{_MIN_MTU}, {_MAX_MTU}], got {mtu}")
    if mac is None:
        mac = random_mac()
    elif len(mac) != 6 or mac[0] & 0x01:
        raise ValueError(f"mac must be 6 bytes of a unicast address, got {mac.hex(':')}")
    else:
        mac = bytes(mac)
    if address is not None:
        address = str(ipaddress.ip_interface(address))  # ValueError names the bad address
    temporary = temporary_name_prefix() + "%d"
    fd = _open_tun(temporary if netns is not None else name or _DEFAULT_PATTERN)
    try:
        created = _ifname(fd)
        _set_mtu(created, mtu)
        if netns is not None:
            # Move and rename in one step: the final name is checked (or picked) in the target
            # namespace, so names in the caller's namespace never clash with it.
            await _ip(
                "link", "set", "dev", created, "netns", netns, "name", name or _DEFAULT_PATTERN
            )
            final = _ifname(fd)
            await _ip("-n", netns, "link", "set", "dev", final, "up")
        else:
            final = created
            _set_up(final)
        if address is not None:
            await _ip(*_in(netns), "address", "add", address, "dev", final)
        kernel_mac = _hwaddr(fd, final)
    except BaseException:
        os.close(fd)  # deletes the half-configured interface
        raise
    if kernel_mac == mac:  # both random: vanishingly unlikely, but they must differ
        os.close(fd)
        raise TapError(f"{final}: stacklib's MAC {mac.hex(':')} equals the kernel's")
    return TapDevice(fd, final, netns=netns, mtu=mtu, mac=mac, kernel_mac=kernel_mac)


def _check_name(name: str | None) -> None:
    if name is None:
        return
    if not 0 < len(name.encode()) < _IFNAMSIZ or any(c in name for c in "/: \t\n") or "%" in name:
        raise ValueError(
            f"interface name must be 1-{_IFNAMSIZ - 1} bytes without '/', ':', '%' or "
            f"whitespace, got {name!r}"
        )


def _open_tun(pattern: str) -> int:
    try:
        fd = os.open(_TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TapError(
            f"{_TUN_PATH} is missing: load the tun module (modprobe tun), or in a container "
            f"pass the device (docker run --device /dev/net/tun)"
        ) from None
    except PermissionError as exc:
        raise TapError(f"cannot open {_TUN_PATH}: {exc.strerror} (run as root)") from None
    try:
        fcntl.ioctl(fd, _TUNSETIFF, _IFREQ_FLAGS.pack(pattern.encode(), _IFF_TAP | _IFF_NO_PI))
    except OSError as exc:
        os.close(fd)
        hint = {
            errno.EPERM: "creating a TAP device needs CAP_NET_ADMIN (run as root)",
            errno.EBUSY: "a TAP device of that name is already open",
            errno.EINVAL: "a non-TAP device of that name exists",
        }.get(exc.errno or 0, exc.strerror)
        raise TapError(f"cannot create TAP device {pattern!r}: {hint}") from exc
    return fd


def _ifname(fd: int) -> str:
    # TUNGETIFF reports the interface's current name, also after a move and rename.
    result = fcntl.ioctl(fd, _TUNGETIFF, bytes(_IFREQ_FLAGS.size))
    return result[:_IFNAMSIZ].split(b"\0", 1)[0].decode()


def _hwaddr(fd: int, name: str) -> bytes:
    # The tun descriptor answers SIOCGIFHWADDR itself, wherever the interface lives.
    request = _IFREQ_HWADDR.pack(name.encode(), 0, bytes(6))
    _, _, address = _IFREQ_HWADDR.unpack(fcntl.ioctl(fd, _SIOCGIFHWADDR, request))
    return bytes(address)


def _set_mtu(name: str, mtu: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            fcntl.ioctl(sock.fileno(), _SIOCSIFMTU, _IFREQ_INT.pack(name.encode(), mtu))
        except OSError as exc:
            raise TapError(f"{name}: cannot set MTU {mtu}: {exc.strerror}") from exc


def _set_up(name: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = _IFREQ_FLAGS.pack(name.encode(), 0)
        _, flags = _IFREQ_FLAGS.unpack(fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))
        try:
            fcntl.ioctl(
                sock.fileno(), _SIOCSIFFLAGS, _IFREQ_FLAGS.pack(name.encode(), flags | _IFF_UP)
            )
        except OSError as exc:
            raise TapError(f"{name}: cannot bring the interface up: {exc.strerror}") from exc


def _in(netns: str | None) -> tuple[str, ...]:
    return ("-n", netns) if netns is not None else ()


async def _ip(*args: str) -> None:
    command = ["ip", *args]
    try:
        result = await trio.run_process(
            command, capture_stdout=True, capture_stderr=True, check=False
        )
    except FileNotFoundError:
        raise TapError(
            "the ip tool is missing (apt-get install iproute2); it moves TAP devices into "
            "network namespaces and sets addresses"
        ) from None
    if result.returncode != 0:
        stderr = result.stderr.decode(errors="replace").strip()
        raise TapError(f"{' '.join(command)} failed: {stderr}")
