"""The privileged set-up on one interface: the port map, the counters, the program, the link.

:class:`XdpAttachment` is what the OS service owns for an interface (paper 000 §3: the kernel
or a trusted service sets up, the process then works alone): it loads :mod:`.program`, attaches
it through a ``bpf_link`` (native mode, falling back to generic SKB mode where the driver or
the MTU refuses native XDP), and writes the port map, so that a socket receives exactly the
frames of the U-Net ports granted to it.  Closing it (or the death of its process) detaches the
program: the interface is left as it was found.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct

from stacklib.errors import StacklibError
from stacklib.transports.xdp import bpf, program

__all__ = ["PortTaken", "XdpAttachment"]

MODES = ("native", "skb")


class PortTaken(StacklibError, ValueError):
    """The U-Net port is granted to another socket already."""


class XdpAttachment:
    """The XDP program on ``interface``, its port map and counters (needs CAP_NET_ADMIN and
    CAP_BPF).

    ``mode``: ``"native"`` (the driver runs the program), ``"skb"`` (generic mode, after the
    kernel built its socket buffer) or ``None``: native, else SKB mode.  Native XDP on a veth
    refuses to attach when the peer's MTU is above 3506 bytes (ERANGE); SKB mode then works.
    """

    def __init__(self, interface: str, mode: str | None = None) -> None:
        if mode is not None and mode not in MODES:
            raise ValueError(f"XDP attach mode must be one of {', '.join(MODES)}, got {mode!r}")
        try:
            self.ifindex = socket.if_nametoindex(interface)
        except OSError:
            raise bpf.BpfError(errno.ENODEV, f"no network interface named {interface!r}") from None
        self.interface = interface
        self._fds: list[int] = []
        #: Which socket (file descriptor in this process) owns each granted port.
        self.owners: dict[int, int] = {}
        try:
            self.sockets_fd = self._keep(
                bpf.create_map(bpf.BPF_MAP_TYPE_XSKMAP, 4, 4, 256, "sl_unet_ports")
            )
            self.counters_fd = self._keep(
                bpf.create_map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8, len(program.COUNTERS), "sl_counts")
            )
            code = program.unet_redirect(self.sockets_fd, self.counters_fd)
            self.program_fd = self._keep(bpf.load_xdp_program(code, "sl_unet_redirect"))
            self.mode, self.link_fd = self._attach(mode)
        except BaseException:
            self.close()
            raise

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _attach(self, mode: str | None) -> tuple[str, int]:
        tries = [mode] if mode is not None else list(MODES)
        flags = {"native": bpf.XDP_FLAGS_DRV_MODE, "skb": bpf.XDP_FLAGS_SKB_MODE}
        for index, each in enumerate(tries):
            try:
                return each, self._keep(bpf.link_create(self.program_fd, self.ifindex, flags[each]))
            except bpf.BpfError as error:
                if error.errno == errno.EBUSY:
                    raise bpf.BpfError(
                        errno.EBUSY,
                        f"{self.interface} already has an XDP program (another stacklib "
                        f"process, or `ip link set dev {self.interface} xdp off` to remove one)",
                    ) from None
                if index + 1 == len(tries):
                    raise bpf.BpfError(
                        error.errno, f"cannot attach XDP to {self.interface} ({each}): {error}"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def grant(self, port: int, sock_fd: int) -> None:
        """Send U-Net frames for ``port`` to the bound AF_XDP socket ``sock_fd``.  A port
        granted to another socket raises :class:`PortTaken`."""
        if not 0 <= port <= 0xFF:
            raise ValueError(f"U-Net/FE ports are one byte (0-255), got {port}")
        owner = self.owners.get(port)
        if owner is not None and owner != sock_fd:
            raise PortTaken(f"U-Net port {port} on {self.interface} belongs to another socket")
        bpf.map_update(self.sockets_fd, struct.pack("=I", port), struct.pack("=I", sock_fd))
        self.owners[port] = sock_fd

    def revoke(self, port: int) -> None:
        """Stop delivering ``port``'s frames (they are then dropped and counted)."""
        if self.owners.pop(port, None) is not None:
            with contextlib.suppress(bpf.BpfError):  # the socket closed: the kernel removed it
                bpf.map_delete(self.sockets_fd, struct.pack("=I", port))

    def revoke_socket(self, sock_fd: int) -> None:
        """Revoke every port granted to ``sock_fd``."""
        for port in [port for port, owner in self.owners.items() if owner == sock_fd]:
            self.revoke(port)

    def counters(self) -> dict[str, int]:
        """The program's counters: frames redirected, dropped for want of a socket, passed."""
        return program.read_counters(self.counters_fd)

    @property
    def program_id(self) -> int:
        return bpf.program_id(self.program_fd)

    def close(self) -> None:
        """Detach the program and free the maps."""
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop())
        self.owners.clear()

    def __enter__(self) -> XdpAttachment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
