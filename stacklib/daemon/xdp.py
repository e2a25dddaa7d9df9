"""The daemon's xdp service: it sets up AF_XDP sockets and owns the port map (paper 000 §3).

Paper 000 §3.2: the OS service creates endpoints and registers their tags; the process then
sends and receives alone.  For the xdp transport the daemon (root) holds one
:class:`~stacklib.transports.xdp.attach.XdpAttachment` per interface, shared by every client
with a socket on it (attached on the first OPEN_XSK, detached when its last socket goes); it
opens each client's socket, hands it over with its UMEM (``SCM_RIGHTS``), and writes the
XSKMAP with its own copy of the socket when the client asks for a port.  Only the daemon can
change the program or the map, so a socket receives exactly its granted ports' frames.

The state changes are synchronous and never interleave; only binding a socket, which may wait
for a queue the kernel is still releasing, runs in a thread, with the queue reserved first.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from stacklib.daemon.protocol import (
    XDP_MODES,
    XSK_ANY_COPY,
    XSK_COPY,
    XSK_ZERO_COPY,
    CloseXsk,
    ErrorCode,
    ErrorReply,
    GrantPort,
    Ok,
    OpenXsk,
    Reply,
    RevokePort,
    XskGranted,
)
from stacklib.transports.xdp.attach import PortTaken, XdpAttachment
from stacklib.transports.xdp.xsk import OpenedSocket, XskLayout, open_socket

__all__ = ["MAX_UMEM_BYTES", "XdpService", "XskState"]

log = logging.getLogger("stacklib.daemon")

#: Largest UMEM one socket may ask for: the daemon pins it, so a client must not pin the host.
MAX_UMEM_BYTES = 64 << 20
#: Longest interface name the kernel has (IFNAMSIZ - 1).
_IFNAME_MAX = 15
_ZERO_COPY = {XSK_COPY: False, XSK_ZERO_COPY: True, XSK_ANY_COPY: None}


class Attachment(Protocol):
    """What the service needs of an interface's attachment (tests pass a stand-in)."""

    mode: str
    owners: dict[int, int]

    def grant(self, port: int, sock_fd: int) -> None: ...
    def revoke(self, port: int) -> None: ...
    def revoke_socket(self, sock_fd: int) -> None: ...
    def counters(self) -> dict[str, int]: ...
    def close(self) -> None: ...


class _Owner(Protocol):
    """A connected client, as the service sees it (the daemon's ``ClientState``)."""

    xsks: set[int]

    @property
    def pid(self) -> int: ...


@attrs.define(eq=False)
class XskState:
    """One socket the daemon opened for a client: the daemon's own copies of its descriptors
    (the socket is what the XSKMAP holds) and the ports granted to it."""

    id: int
    owner: Any
    interface: str
    queue: int
    opened: OpenedSocket
    ports: set[int] = attrs.field(factory=set)

    @property
    def fd(self) -> int:
        return self.opened.sock.fileno()

    def close(self) -> None:
        self.opened.sock.close()
        with contextlib.suppress(OSError):
            os.close(self.opened.umem_fd)


class XdpService:
    """The xdp part of the daemon: attachments, sockets and port grants of its clients.

    ``attach`` and ``opener`` make the attachment and open the socket (the real ones by
    default; tests of the bookkeeping pass stand-ins that need no privilege).
    """

    def __init__(
        self,
        refuse: Callable[[Any, ErrorCode, str], ErrorReply],
        *,
        attach: Callable[[str, str | None], Attachment] = XdpAttachment,
        opener: Callable[..., OpenedSocket] = open_socket,
    ) -> None:
        self._refuse = refuse
        self._attach = attach
        self._opener = opener
        self.attachments: dict[str, Attachment] = {}
        self.sockets: dict[int, XskState] = {}
        #: (interface, queue) -> the client holding it, reserved before the socket is bound.
        self.queues: dict[tuple[str, int], Any] = {}
        self._next_id = 1

    # ---------------------------------------------------------------- OPEN_XSK
    async def open(self, client: _Owner, message: OpenXsk) -> tuple[Reply, list[int]]:
        """Open a socket for ``client``: reply XSK and the two descriptors to pass with it."""
        interface, queue = message.interface, message.queue
        problem = self._check(message)
        if problem is not None:
            return self._refuse(client, *problem), []
        layout = XskLayout(message.frames, message.frame_size)
        holder = self.queues.get((interface, queue))
        if holder is not None:
            whose = "yours" if holder is client else f"held by pid {holder.pid}"
            return self._refuse(
                client, ErrorCode.IN_USE, f"queue {queue} of {interface} is {whose}"
            ), []
        attachment = self.attachments.get(interface)
        if attachment is None:
            try:
                attachment = self._attach(interface, XDP_MODES[message.mode])
            except (OSError, ValueError) as error:
                return self._refuse(
                    client, ErrorCode.INTERNAL, f"cannot attach XDP to {interface}: {error}"
                ), []
            self.attachments[interface] = attachment
            log.info("attached the XDP program to %s (%s)", interface, attachment.mode)
        self.queues[(interface, queue)] = client
        try:
            # Binding may wait (up to ~2 s) for a queue the kernel is still releasing: off the
            # daemon's loop.  Not abandoned on cancel, so the socket is always accounted for.
            opened = await trio.to_thread.run_sync(
                lambda: self._opener(
                    interface, queue, layout, zero_copy=_ZERO_COPY[message.zero_copy]
                )
            )
        except OSError as error:
            del self.queues[(interface, queue)]
            self._release(interface)
            return self._refuse(client, ErrorCode.INTERNAL, str(error)), []
        state = XskState(self._next_id, client, interface, queue, opened)
        self._next_id += 1
        self.sockets[state.id] = state
        client.xsks.add(state.id)
        reply = XskGranted(
            state.id,
            opened.ifindex,
            queue,
            layout.frames,
            layout.frame_size,
            int(opened.zero_copy),
            attachment.mode,
        )
        return reply, [state.fd, opened.umem_fd]

    def _check(self, message: OpenXsk) -> tuple[ErrorCode, str] | None:
        interface = message.interface
        if not interface or len(interface) > _IFNAME_MAX or "/" in interface:
            return ErrorCode.BAD_TAG, f"bad interface name {interface!r}"
        try:
            socket.if_nametoindex(interface)
        except OSError:
            return ErrorCode.BAD_TAG, f"no interface {interface!r} in the daemon's namespace"
        if message.zero_copy not in _ZERO_COPY or message.mode not in XDP_MODES:
            return ErrorCode.BAD_SPEC, f"zero_copy {message.zero_copy} or mode {message.mode}"
        try:
            layout = XskLayout(message.frames, message.frame_size)
        except ValueError as error:
            return ErrorCode.BAD_SPEC, str(error)
        if layout.umem_size > MAX_UMEM_BYTES:
            return ErrorCode.BAD_SPEC, f"a UMEM of {layout.umem_size} > {MAX_UMEM_BYTES} bytes"
        return None

    # ---------------------------------------------------------------- ports
    def _mine(self, client: _Owner, socket_id: int) -> XskState | ErrorReply:
        state = self.sockets.get(socket_id)
        if state is None or state.owner is not client:
            return self._refuse(client, ErrorCode.NOT_OWNER, f"xdp socket {socket_id} is not yours")
        return state

    def grant(self, client: _Owner, message: GrantPort) -> Reply:
        state = self._mine(client, message.socket)
        if isinstance(state, ErrorReply):
            return state
        if not 0 <= message.port <= 0xFF:
            return self._refuse(
                client, ErrorCode.BAD_TAG, f"U-Net/FE ports are one byte, got {message.port}"
            )
        attachment = self.attachments[state.interface]
        holder = attachment.owners.get(message.port)
        try:
            attachment.grant(message.port, state.fd)
        except PortTaken:
            owner = next((s for s in self.sockets.values() if s.fd == holder), None)
            whose = f"pid {owner.owner.pid}" if owner is not None else "another socket"
            return self._refuse(
                client,
                ErrorCode.IN_USE,
                f"U-Net port {message.port} on {state.interface} is held by {whose}",
            )
        except OSError as error:
            return self._refuse(client, ErrorCode.INTERNAL, f"cannot grant: {error}")
        state.ports.add(message.port)
        return Ok()

    def revoke(self, client: _Owner, message: RevokePort) -> Reply:
        state = self._mine(client, message.socket)
        if isinstance(state, ErrorReply):
            return state
        if message.port not in state.ports:
            return self._refuse(
                client, ErrorCode.NOT_OWNER, f"U-Net port {message.port} is not granted to you"
            )
        self.attachments[state.interface].revoke(message.port)
        state.ports.discard(message.port)
        return Ok()

    def close(self, client: _Owner, message: CloseXsk) -> Reply:
        state = self._mine(client, message.socket)
        if isinstance(state, ErrorReply):
            return state
        self._drop(state)
        return Ok()

    # ---------------------------------------------------------------- teardown
    def _drop(self, state: XskState) -> None:
        """Revoke the socket's ports, close the daemon's copies, free its queue; detach the
        program once its interface has no socket left."""
        attachment = self.attachments.get(state.interface)
        if attachment is not None:
            attachment.revoke_socket(state.fd)
        state.close()
        del self.sockets[state.id]
        state.owner.xsks.discard(state.id)
        self.queues.pop((state.interface, state.queue), None)
        self._release(state.interface)

    def _release(self, interface: str) -> None:
        if any(s.interface == interface for s in self.sockets.values()):
            return
        if any(name == interface for name, _ in self.queues):
            return  # a socket is being bound there
        attachment = self.attachments.pop(interface, None)
        if attachment is not None:
            attachment.close()
            log.info("detached the XDP program from %s", interface)

    def reclaim(self, client: _Owner) -> int:
        """``client`` is gone: drop its sockets (so its ports); how many."""
        ids = sorted(client.xsks)
        for socket_id in ids:
            self._drop(self.sockets[socket_id])
        return len(ids)

    def close_all(self) -> None:
        for state in list(self.sockets.values()):
            self._drop(state)
        for interface in list(self.attachments):
            self.attachments.pop(interface).close()

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for interface, attachment in self.attachments.items():
            counters: dict[str, Any]
            try:
                counters = dict(attachment.counters())
            except OSError as error:
                counters = {"error": errno.errorcode.get(error.errno or 0, str(error))}
            result[interface] = {
                "mode": attachment.mode,
                "counters": counters,
                "sockets": {
                    str(s.id): {"pid": s.owner.pid, "queue": s.queue, "ports": sorted(s.ports)}
                    for s in self.sockets.values()
                    if s.interface == interface
                },
            }
        return result
