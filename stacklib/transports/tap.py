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
Ethernet mode (layer ``ip-ether``) runs over: one Ethernet link to the kernel.

The registered transport ``tap`` (:class:`TapNetwork`) builds U-Net nodes on TAP devices for
recipes: each node's NI (:class:`TapNI`) owns one device, whose kernel interface is a port of a
Linux bridge in a network namespace, and its messages are IPv4 packets in Ethernet frames, so
``ip`` + ``udp``/``tcp`` stacks on two nodes exchange real frames that the kernel switches.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import ipaddress
import os
import socket
import struct
import subprocess
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from stacklib.errors import ChannelError, StacklibError
from stacklib.services import FrameService
from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.socket_ni import HandleNetwork, HandleNI
from stacklib.unet.endpoint import Channel, DropReason, Endpoint
from stacklib.unet.ni import Payload
from stacklib.unet.node import Node
from stacklib.unet.os_service import OSService, Policy
from stacklib.unet.polled import PolledEndpoint
from stacklib.wire.descriptor import SendDescriptor

__all__ = [
    "ETHERNET_HEADER",
    "ETHERTYPE_IPV4",
    "FrameSizeError",
    "TapAddress",
    "TapDevice",
    "TapError",
    "TapNI",
    "TapNetwork",
    "TapParams",
    "create_tap",
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
            # can be reused.  Outside trio.run (a network closed after the run) nobody waits.
            with contextlib.suppress(RuntimeError):
                trio.lowlevel.notify_closing(fd)
            os.close(fd)

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def fileno(self) -> int:
        """The descriptor, to wait on (``trio.lowlevel.wait_readable``)."""
        return self._open_fd()

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
    # The set-up runs the ip tool a few times: in a worker thread, so the event loop goes on.
    return await trio.to_thread.run_sync(
        functools.partial(create_tap, name, netns=netns, mtu=mtu, address=address, mac=mac)
    )


def create_tap(
    name: str | None = None,
    *,
    netns: str | None = None,
    mtu: int = 1500,
    address: str | None = None,
    mac: bytes | None = None,
) -> TapDevice:
    """Create a TAP device as :func:`open_tap` does, blocking while the ``ip`` tool runs; the
    caller closes it.  For code that is not async (a transport's network builder)."""
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
            _ip("link", "set", "dev", created, "netns", netns, "name", name or _DEFAULT_PATTERN)
            final = _ifname(fd)
            _ip("-n", netns, "link", "set", "dev", final, "up")
        else:
            final = created
            _set_up(final)
        if address is not None:
            _ip(*_in(netns), "address", "add", address, "dev", final)
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


def _ip(*args: str) -> None:
    command = ["ip", *args]
    try:
        result = subprocess.run(command, capture_output=True, check=False, timeout=30)
    except FileNotFoundError:
        raise TapError(
            "the ip tool is missing (apt-get install iproute2); it moves TAP devices into "
            "network namespaces and sets addresses"
        ) from None
    if result.returncode != 0:
        stderr = result.stderr.decode(errors="replace").strip()
        raise TapError(f"{' '.join(command)} failed: {stderr}")


# ==================================================================== a node transport


#: The EtherType of the frames a :class:`TapNI` sends and takes: U-Net messages are IPv4
#: packets, so the kernel sees (and switches, and tcpdump decodes) ordinary IP over Ethernet.
ETHERTYPE_IPV4 = 0x0800
_ETH = struct.Struct("!6s6sH")


@attrs.frozen
class TapAddress:
    """The endpoint of a :class:`TapNI`: its node's MAC address on the link (one endpoint per
    node: a frame names no port)."""

    mac: str

    def __str__(self) -> str:
        return self.mac


def _mac_bytes(text: str) -> bytes:
    try:
        value = bytes.fromhex(text.replace(":", ""))
    except ValueError:
        value = b""
    if len(value) != 6:
        raise ValueError(f"not a MAC address: {text!r}")
    return value


class TapNI(HandleNI):
    """The NI of one node of a :class:`TapNetwork`: a TAP device whose kernel side is a port
    of the network's Linux bridge.

    A message is the payload of one Ethernet frame of :data:`ETHERTYPE_IPV4` (at most the MTU);
    a channel is the peer node's MAC address, the frame's destination when sending and its
    source when receiving (as U-Net/FE demultiplexes, paper 001 §3.1, without the port byte).
    Frames for other MACs (the kernel's IPv6 chatter, floods) are counted in ``ignored``; frames
    from an unknown MAC are dropped as unknown tags.  The host does the NI's work when the
    application sends or receives (:class:`~stacklib.unet.polled.PolledNI`).
    """

    kind = "tap"

    def __init__(self, name: str, host: Host, device: TapDevice, inline_threshold: int) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=inline_threshold,
            max_message=device.mtu,
            direct_access=False,
        )
        self.device = device
        self.mac = device.mac
        self._init_waiting()
        #: Frames for another MAC, or of another EtherType: not this node's traffic.
        self.ignored = 0

    def address_of(self, endpoint: Endpoint) -> TapAddress:
        return TapAddress(self.mac.hex(":"))

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, TapAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not a TapAddress")
        try:
            mac = _mac_bytes(remote.mac)
        except ValueError as error:
            raise ChannelError(f"{self!r}: {error}") from None
        if mac[0] & 0x01:
            raise ChannelError(f"{self!r}: {remote} is not a unicast MAC address")
        if mac == self.mac:
            raise ChannelError(f"{self!r}: {remote} is this node's own MAC address")
        return mac, mac

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        mac: bytes = channel.tx_tag  # type: ignore[assignment]
        length = len(data)
        frame = _ETH.pack(mac, self.mac, ETHERTYPE_IPV4) + data
        try:
            # A frame the kernel refuses for good (interface down) is lost, as on a wire, and
            # counted by the device as a write-error.
            self.device.send_nowait(frame)
        except trio.WouldBlock:
            self._tx_blocked = True
            return False  # the device queue is full: back-pressure, retried by progress()
        self.injected(endpoint, descriptor, length)
        return True

    def progress(self) -> int:
        """Read every waiting frame and deliver this node's; retry sends the device refused."""
        delivered = 0
        device = self.device
        demux = self.demux
        own = self.mac
        while True:
            try:
                frame = device.recv_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            dst, src, ethertype = _ETH.unpack_from(frame)
            if dst != own or ethertype != ETHERTYPE_IPV4:
                self.ignored += 1
                continue
            entry = demux.get(src)
            if entry is not None and entry[0].recv_queue.full:
                self.drop(DropReason.RECV_QUEUE_FULL, entry[0])
                continue
            self.deliver(src, memoryview(frame)[_ETH.size :])
            delivered += 1
        if self._tx_blocked:
            self._tx_blocked = False
            self.resume()
        return delivered

    def _handle(self) -> int:
        return self.device.fileno()

    def _close_handle(self) -> None:
        self.device.close()  # which deletes its interface


class TapEndpoint(PolledEndpoint):
    """An endpoint whose receive and send calls run the NI."""

    ni: TapNI


TapNI.endpoint_class = TapEndpoint


class TapNetwork(HandleNetwork):
    """Nodes on TAP devices joined by a Linux bridge: real Ethernet frames through the kernel.

    Each node is a host at the end of its own TAP "cable"; the kernel interfaces are ports of
    the bridge ``bridge`` in network namespace ``netns``, so every frame between two nodes
    crosses the kernel, which switches it like any Ethernet frame (``ip netns exec NS tcpdump
    -i BRIDGE`` shows IPv4, UDP and TCP).  With ``netns`` None a namespace is made for the
    network (``sltap-PID-RANDOM``) and deleted by :meth:`close`, or at the latest when the
    network is collected or the interpreter exits; a given namespace keeps existing, only the
    bridge and the interfaces go.  ``kernel_address`` (e.g. ``"10.0.0.254/24"``) gives the
    bridge an address, so the kernel itself is a host on the segment.  Needs CAP_NET_ADMIN,
    /dev/net/tun and the ``ip`` tool.
    """

    kind = "tap"

    def __init__(
        self,
        world: World | None = None,
        *,
        netns: str | None = None,
        bridge: str = "slbr0",
        mtu: int = 1500,
        kernel_address: str | None = None,
        inline_threshold: int = 64,
    ) -> None:
        self.world = world if world is not None else RealWorld()
        if self.world.virtual:
            raise ValueError("the tap transport runs in real time only")
        _check_name(bridge)
        if not _MIN_MTU <= mtu <= _MAX_MTU:
            raise ValueError(f"mtu must be in [{_MIN_MTU}, {_MAX_MTU}], got {mtu}")
        if kernel_address is not None:
            kernel_address = str(ipaddress.ip_interface(kernel_address))
        self.mtu = mtu
        self.inline_threshold = inline_threshold
        self.bridge = bridge
        self.nodes: dict[str, Node] = {}
        self._devices: list[TapDevice] = []
        self._namespace: contextlib.AbstractContextManager[str] | None = None
        if netns is None:
            from stacklib.netns import netns as new_namespace  # the same naming and clean-up

            self._namespace = new_namespace("sltap")
            netns = self._namespace.__enter__()
        self.netns = netns
        # Everything to undo, held apart from self so that collection can run it.
        self._finalizer = weakref.finalize(
            self, _tear_down, self._devices, netns, bridge, self._namespace
        )
        try:
            _ip("-n", netns, "link", "add", bridge, "type", "bridge")
            _ip("-n", netns, "link", "set", "dev", bridge, "mtu", str(mtu), "up")
            if kernel_address is not None:
                _ip("-n", netns, "address", "add", kernel_address, "dev", bridge)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<TapNetwork {self.bridge} in {self.netns}, {len(self.nodes)} nodes>"

    def add_node(
        self, name: str, profile: CostProfile | None = None, *, policy: Policy | None = None
    ) -> Node:
        """A node on a new TAP device whose interface joins the bridge."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        device = create_tap(netns=self.netns, mtu=self.mtu)
        self._devices.append(device)
        _ip("-n", self.netns, "link", "set", "dev", device.name, "master", self.bridge)
        host = Host(name, self.world, profile)
        ni = TapNI(name, host, device, self.inline_threshold)
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        return node

    def close(self) -> None:
        """Close the nodes and remove the bridge (and a namespace made for the network)."""
        super().close()
        self._finalizer()


def _tear_down(
    devices: list[TapDevice],
    netns: str,
    bridge: str,
    namespace: contextlib.AbstractContextManager[str] | None,
) -> None:
    for device in devices:
        device.close()
    if namespace is not None:
        namespace.__exit__(None, None, None)  # deleting it deletes the bridge too
    else:
        with contextlib.suppress(TapError):
            _ip("-n", netns, "link", "delete", bridge)


@attrs.frozen
class TapParams:
    """Recipe parameters of the tap transport (docs/tap.md, "Recipes over TAP")."""

    #: An existing namespace for the bridge; absent: one is made for the run and deleted.
    netns: str | None = None
    bridge: str = "slbr0"
    mtu: int = attrs.field(default=1500, validator=attrs.validators.in_(range(68, 65536)))
    #: An address with prefix for the bridge, making the kernel a host on the segment.
    kernel_address: str | None = None
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))


def _build(
    world: World, params: TapParams, names: Sequence[str], profile: CostProfile | None
) -> TapNetwork:
    network = TapNetwork(
        world,
        netns=params.netns,
        bridge=params.bridge,
        mtu=params.mtu,
        kernel_address=params.kernel_address,
        inline_threshold=params.inline_threshold,
    )
    try:
        for name in names:
            network.add_node(name, profile)
    except BaseException:
        network.close()
        raise
    return network


register_transport(
    TransportKind(
        name="tap",
        Params=TapParams,
        build=_build,
        description="IPv4 over Ethernet on TAP devices joined by a Linux bridge in a namespace "
        "(needs CAP_NET_ADMIN and /dev/net/tun)",
        clock="real",
    )
)
