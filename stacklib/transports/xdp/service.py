"""An xdp node set up by the daemon: the unprivileged process's side (paper 000 §3.2).

The daemon (``stacklib daemon``, run as root) attaches the interface's XDP program, opens
this process's AF_XDP socket and passes it with its UMEM over the control connection
(``SCM_RIGHTS``); every port an endpoint takes is a request to the daemon, which alone writes
the port map.  The process then maps the rings and sends and receives with no privilege and no
daemon on the data path::

    network = XdpNetwork("veth0")
    node = add_daemon_node(network, "a")              # or XdpParams(daemon=PATH)
    endpoint = node.os.create_endpoint(node.os.process("app"), port=5)   # GRANT_PORT 5

Keep the network open while it is used: closing it (or the process dying) closes the control
connection, and the daemon then revokes the socket's ports and frees its queue.
docs/xdp-protection.md says who does what and what the kernel enforces.
"""

from __future__ import annotations

import contextlib
import os
import socket

from stacklib.daemon.client import DaemonClient
from stacklib.daemon.protocol import (
    XSK_ANY_COPY,
    XSK_COPY,
    XSK_ZERO_COPY,
    CloseXsk,
    DaemonError,
    ErrorCode,
    GrantPort,
    OpenXsk,
    RevokePort,
    XskGranted,
)
from stacklib.daemon.sockets import default_socket_path
from stacklib.sim.costs import CostProfile
from stacklib.transports.xdp.attach import PortTaken
from stacklib.transports.xdp.network import XdpNetwork
from stacklib.transports.xdp.xsk import AF_XDP, OpenedSocket, XskLayout
from stacklib.unet.node import Node
from stacklib.unet.os_service import Policy

__all__ = ["DEFAULT_DAEMON", "DaemonGrants", "add_daemon_node", "open_via_daemon"]

#: The ``daemon`` value that means the daemon's default socket path.
DEFAULT_DAEMON = "default"
_ZERO_COPY = {False: XSK_COPY, True: XSK_ZERO_COPY, None: XSK_ANY_COPY}
_MODES = {None: 0, "native": 1, "skb": 2}


class DaemonGrants:
    """The :class:`~stacklib.transports.xdp.ni.PortGrants` of a socket the daemon opened:
    each grant and revoke is a request on the control connection ``client``.

    :meth:`close` gives the socket back (its ports and queue), and closes ``client`` if
    ``owns_client``.
    """

    def __init__(
        self, client: DaemonClient, socket_id: int, interface: str, *, owns_client: bool = False
    ) -> None:
        self.client = client
        self.socket_id = socket_id
        self.interface = interface
        self.owns_client = owns_client
        self.closed = False

    def grant(self, port: int) -> None:
        """Ask for ``port``; :class:`PortTaken` if another process holds it (the daemon's
        words say whose), DaemonError for any other refusal."""
        self._check_open()
        try:
            self.client.request(GrantPort(os.getpid(), self.socket_id, port))
        except DaemonError as error:
            if error.code is ErrorCode.IN_USE:
                raise PortTaken(str(error)) from None
            raise

    def revoke(self, port: int) -> None:
        """Give ``port`` back.  A daemon that is gone has revoked it already: not an error."""
        if self.closed:
            return
        try:
            self.client.request(RevokePort(os.getpid(), self.socket_id, port))
        except DaemonError as error:
            if error.code is not None:  # a refusal, not a lost connection
                raise

    def counters(self) -> dict[str, int]:
        """The interface's program counters (redirected, no socket, passed), from the daemon."""
        self._check_open()
        counters: dict[str, int] = self.client.status()["xdp"][self.interface]["counters"]
        return counters

    def _check_open(self) -> None:
        if self.closed:
            raise DaemonError(f"the daemon's grants of {self.interface} were closed")

    def close(self) -> None:
        """Give the socket back to the daemon (idempotent)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(DaemonError):  # a daemon that is gone has freed it already
            self.client.request(CloseXsk(os.getpid(), self.socket_id))
        if self.owns_client:
            self.client.close()


def open_via_daemon(
    interface: str,
    queue: int = 0,
    layout: XskLayout | None = None,
    *,
    zero_copy: bool | None = None,
    mode: str | None = None,
    socket_path: str | None = None,
    client: DaemonClient | None = None,
) -> tuple[OpenedSocket, DaemonGrants]:
    """Ask the daemon for an AF_XDP socket on ``interface``'s ``queue``: the socket handed
    over and its grants, for ``XdpNetwork.add_node(name, opened=..., grants=...)``.

    ``client``: an open control connection (kept open by the caller), else one is made to
    ``socket_path`` (default: the daemon's default path), owned by the grants.  The daemon is
    never started on demand: it must run as root already.  The interface must be the one the
    daemon sees (same network namespace), which is checked.
    """
    layout = layout or XskLayout()
    if mode not in _MODES:
        raise ValueError(f"XDP attach mode must be native, skb or None, got {mode!r}")
    try:
        local_index = socket.if_nametoindex(interface)
    except OSError:
        raise ValueError(f"no network interface named {interface!r} here") from None
    owns = client is None
    if client is None:
        client = DaemonClient(
            socket_path if socket_path is not None else default_socket_path(), start=False
        )
    try:
        reply, fds = client.request_fds(
            OpenXsk(
                os.getpid(),
                interface,
                queue,
                layout.frames,
                layout.frame_size,
                _ZERO_COPY[zero_copy],
                _MODES[mode],
            )
        )
        opened = _opened(reply, fds, interface, local_index, layout)
    except BaseException:
        if owns:
            client.close()
        raise
    assert isinstance(reply, XskGranted)
    return opened, DaemonGrants(client, reply.socket, interface, owns_client=owns)


def _opened(
    reply: object, fds: list[int], interface: str, local_index: int, layout: XskLayout
) -> OpenedSocket:
    """Check the daemon's answer and wrap its two descriptors (closed if anything is off)."""
    try:
        if not isinstance(reply, XskGranted) or len(fds) != 2:
            raise DaemonError(f"unexpected reply {reply!r} with {len(fds)} descriptors to OPEN_XSK")
        if reply.ifindex != local_index:
            raise DaemonError(
                f"the daemon's {interface} is another interface than this process's (index "
                f"{reply.ifindex}, here {local_index}): run in the daemon's network namespace"
            )
        if (reply.frames, reply.frame_size) != (layout.frames, layout.frame_size):
            raise DaemonError(f"the daemon sized the UMEM {reply.frames}x{reply.frame_size}")
        if os.fstat(fds[1]).st_size != layout.umem_size:
            raise DaemonError("the UMEM the daemon passed has the wrong size")
        # Python cannot infer an AF_XDP socket's family (getsockname is not supported).
        sock = socket.socket(AF_XDP, socket.SOCK_RAW, 0, fileno=fds[0])
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return OpenedSocket(sock, fds[1], layout, reply.ifindex, reply.queue, bool(reply.zero_copy))


def add_daemon_node(
    network: XdpNetwork,
    name: str,
    profile: CostProfile | None = None,
    *,
    socket_path: str | None = None,
    client: DaemonClient | None = None,
    policy: Policy | None = None,
) -> Node:
    """Add ``network``'s node on a socket from the daemon (its queue, layout, mode and
    zero-copy choice); the network gives the socket back when it closes."""
    if socket_path == DEFAULT_DAEMON:
        socket_path = None
    opened, grants = open_via_daemon(
        network.interface,
        network.queue,
        network.layout,
        zero_copy=network.zero_copy,
        mode=network.mode,
        socket_path=socket_path,
        client=client,
    )
    try:
        return network.add_node(name, profile, policy=policy, opened=opened, grants=grants)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(opened.umem_fd)
        opened.sock.close()
        grants.close()
        raise
