"""This process's xdp node on one interface, set up by the process itself or by the daemon.

Set up alone (root: CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW), the process attaches the program
(:class:`~stacklib.transports.xdp.attach.XdpAttachment`), opens its socket and grants its
endpoints' ports itself; the program leaves the interface with the process.  Set up by the
daemon (``stacklib daemon``, paper 000 §3's OS service), an unprivileged process receives the
socket and its UMEM as file descriptors and asks the daemon for each port
(:mod:`stacklib.transports.xdp.service`); only the daemon can change the port map.
"""

from __future__ import annotations

import socket

from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports.socket_ni import HandleNetwork
from stacklib.transports.xdp.attach import XdpAttachment
from stacklib.transports.xdp.ni import PortGrants, XdpNI
from stacklib.transports.xdp.xsk import OpenedSocket, XskLayout, XskSocket, open_socket
from stacklib.unet.node import Node
from stacklib.unet.os_service import OSService, Policy

__all__ = ["LocalGrants", "XdpNetwork"]

#: Seconds ``await recv()`` polls before it sleeps: a spinning process preempted on a shared
#: machine stalls for a scheduler tick (~4 ms), so a window near 1 ms keeps it on the CPU
#: through a round trip without giving its partner's CPU away for long.
SPIN_TIME = 0.001


class LocalGrants:
    """Ports granted by this process itself, through its own attachment."""

    def __init__(self, attachment: XdpAttachment, sock_fd: int) -> None:
        self.attachment = attachment
        self.sock_fd = sock_fd

    def grant(self, port: int) -> None:
        self.attachment.grant(port, self.sock_fd)

    def revoke(self, port: int) -> None:
        self.attachment.revoke(port)

    def counters(self) -> dict[str, int]:
        return self.attachment.counters()

    def close(self) -> None:
        self.attachment.close()


class XdpNetwork(HandleNetwork):
    """This process's U-Net/FE node on ``interface`` over AF_XDP (one node per interface
    queue; peers are other processes, addressed by :class:`~stacklib.transports.ether.
    EtherAddress`)."""

    kind = "xdp"

    def __init__(
        self,
        interface: str,
        world: World | None = None,
        *,
        queue: int = 0,
        layout: XskLayout | None = None,
        mode: str | None = None,
        zero_copy: bool | None = None,
        spin_time: float = SPIN_TIME,
        inline_threshold: int = 64,
    ) -> None:
        self.world = world if world is not None else RealWorld()
        if self.world.virtual:
            raise ValueError("the xdp transport runs in real time only")
        try:
            socket.if_nametoindex(interface)
        except OSError:
            raise ValueError(f"no network interface named {interface!r} here") from None
        if spin_time < 0:
            raise ValueError(f"spin_time must be >= 0, got {spin_time}")
        self.interface = interface
        self.queue = queue
        self.layout = layout or XskLayout()
        self.mode = mode
        self.zero_copy = zero_copy
        self.spin_time = spin_time
        self.inline_threshold = inline_threshold
        self.nodes: dict[str, Node] = {}
        self._closers: list[object] = []

    def add_node(
        self,
        name: str,
        profile: CostProfile | None = None,
        *,
        policy: Policy | None = None,
        opened: OpenedSocket | None = None,
        grants: PortGrants | None = None,
    ) -> Node:
        """Add this host's node.  Alone (default) the process sets everything up itself (root);
        or it passes the socket it was handed (``opened``) and who grants its ports (closed
        with the network if it has a ``close``; :func:`~stacklib.transports.xdp.service.
        add_daemon_node` does this with the daemon)."""
        if self.nodes:
            raise ValueError(f"{self.interface} already has node {next(iter(self.nodes))!r}")
        local: LocalGrants | None = None
        if opened is None:
            attachment = XdpAttachment(self.interface, self.mode)
            try:
                opened = open_socket(
                    self.interface, self.queue, self.layout, zero_copy=self.zero_copy
                )
            except BaseException:
                attachment.close()
                raise
            local = LocalGrants(attachment, opened.sock.fileno())
            grants = local
        elif grants is None:
            raise ValueError("a socket handed over needs the grants of whoever handed it")
        try:
            xsk = XskSocket(opened)
        except BaseException:
            opened.sock.close()
            if local is not None:
                local.close()
            raise
        assert grants is not None
        host = Host(name, self.world, profile)
        ni = XdpNI(name, host, self, xsk, grants)
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        # Whoever granted the ports is closed with the network: the process's own attachment,
        # or the daemon's grants (which give the socket back).
        if hasattr(grants, "close"):
            self._closers.append(grants)
        return node

    @property
    def attachment(self) -> XdpAttachment | None:
        """The program this process attached itself (None when the daemon did)."""
        for closer in self._closers:
            if isinstance(closer, LocalGrants):
                return closer.attachment
        return None

    def close(self) -> None:
        super().close()
        for closer in self._closers:
            closer.close()  # type: ignore[attr-defined]
        self._closers.clear()
