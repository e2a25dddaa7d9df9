"""The daemon's xdp bookkeeping, in-process with stand-ins for the attachment and the socket
(no privilege needed): queues, ports, refusals and reclaiming.  tests/transports/
test_xdp_daemon.py runs the real thing in two namespaces."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from typing import ClassVar

import pytest
import trio

from stacklib.daemon import (
    MAX_UMEM_BYTES,
    ClientState,
    CloseXsk,
    Cred,
    Daemon,
    ErrorCode,
    ErrorReply,
    GrantPort,
    Ok,
    OpenXsk,
    RevokePort,
    XdpService,
    XskGranted,
)
from stacklib.daemon.protocol import XSK_ANY_COPY, Reply
from stacklib.transports.xdp.attach import PortTaken
from stacklib.transports.xdp.xsk import OpenedSocket, XdpSetupError, XskLayout

IFACE = "lo"  # any interface of this namespace: the stand-ins never touch it


class FakeAttachment:
    """XdpAttachment's grant rules without the kernel."""

    instances: ClassVar[list[FakeAttachment]] = []

    def __init__(self, interface: str, mode: str | None) -> None:
        self.interface = interface
        self.mode = mode or "native"
        self.owners: dict[int, int] = {}
        self.closed = False
        FakeAttachment.instances.append(self)

    def grant(self, port: int, sock_fd: int) -> None:
        owner = self.owners.get(port)
        if owner is not None and owner != sock_fd:
            raise PortTaken(f"port {port} taken")
        self.owners[port] = sock_fd

    def revoke(self, port: int) -> None:
        self.owners.pop(port, None)

    def revoke_socket(self, sock_fd: int) -> None:
        for port in [p for p, fd in self.owners.items() if fd == sock_fd]:
            self.revoke(port)

    def counters(self) -> dict[str, int]:
        return {"redirected": 0, "no-socket": 0, "passed": 0}

    def close(self) -> None:
        self.closed = True


def fake_open(
    interface: str, queue: int, layout: XskLayout, *, zero_copy: bool | None = None
) -> OpenedSocket:
    if queue == 13:
        raise XdpSetupError(errno.EINVAL, f"AF_XDP: cannot bind to {interface} queue 13")
    sock, other = socket.socketpair()
    other.close()
    umem = os.memfd_create("test-umem")
    os.ftruncate(umem, layout.umem_size)
    return OpenedSocket(sock, umem, layout, socket.if_nametoindex(interface), queue, False)


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    FakeAttachment.instances.clear()
    d = Daemon("/nonexistent")
    d.xdp = XdpService(d._refuse, attach=FakeAttachment, opener=fake_open)
    yield d
    d.xdp.close_all()


def _client(pid: int) -> ClientState:
    return ClientState(sock=None, cred=Cred(pid, 1000, 1000))  # type: ignore[arg-type]


def _open(
    d: Daemon, c: ClientState, queue: int = 0, frames: int = 64, interface: str = IFACE
) -> tuple[Reply, list[int]]:
    message = OpenXsk(c.pid, interface, queue, frames, 2048, XSK_ANY_COPY, 0)
    return trio.run(d.answer, c, message)


def _refused(reply: object, code: ErrorCode, text: str) -> None:
    assert isinstance(reply, ErrorReply), reply
    assert (ErrorCode(reply.code), text in reply.text) == (code, True), reply.text


def test_sockets_share_one_attachment_and_a_held_queue_is_refused(daemon: Daemon) -> None:
    a, b = _client(10), _client(11)
    reply, fds = _open(daemon, a)
    assert isinstance(reply, XskGranted) and len(fds) == 2
    assert os.fstat(fds[1]).st_size == 64 * 2048 and not a.holds_nothing()
    refused, none = _open(daemon, b, queue=0)
    _refused(refused, ErrorCode.IN_USE, f"queue 0 of {IFACE} is held by pid 10")
    assert none == []
    second, _ = _open(daemon, b, queue=1)
    assert isinstance(second, XskGranted) and second.socket != reply.socket
    assert len(FakeAttachment.instances) == 1  # one program per interface
    forged = trio.run(daemon.answer, a, OpenXsk(99, IFACE, 2, 64, 2048, XSK_ANY_COPY, 0))
    _refused(forged[0], ErrorCode.FORGED_PID, "claims pid 99")


@pytest.mark.parametrize(
    ("message", "code", "text"),
    [
        (OpenXsk(10, "no-such-if0", 0, 64, 2048, 2, 0), ErrorCode.BAD_TAG, "no interface"),
        (OpenXsk(10, "a/b", 0, 64, 2048, 2, 0), ErrorCode.BAD_TAG, "bad interface name"),
        (OpenXsk(10, IFACE, 0, 63, 2048, 2, 0), ErrorCode.BAD_SPEC, "power of two"),
        (OpenXsk(10, IFACE, 0, 64, 1024, 2, 0), ErrorCode.BAD_SPEC, "2048 or 4096"),
        (OpenXsk(10, IFACE, 0, 1 << 16, 2048, 2, 0), ErrorCode.BAD_SPEC, str(MAX_UMEM_BYTES)),
        (OpenXsk(10, IFACE, 0, 64, 2048, 3, 0), ErrorCode.BAD_SPEC, "zero_copy 3"),
        (OpenXsk(10, IFACE, 0, 64, 2048, 2, 9), ErrorCode.BAD_SPEC, "mode 9"),
        (OpenXsk(10, IFACE, 13, 64, 2048, 2, 0), ErrorCode.INTERNAL, "cannot bind"),
    ],
)
def test_bad_open_requests_are_refused_and_leave_nothing(
    daemon: Daemon, message: OpenXsk, code: ErrorCode, text: str
) -> None:
    client = _client(10)
    reply, fds = trio.run(daemon.answer, client, message)
    _refused(reply, code, text)
    assert fds == [] and client.holds_nothing()
    assert not daemon.xdp.queues and not daemon.xdp.sockets and not daemon.xdp.attachments
    assert all(attachment.closed for attachment in FakeAttachment.instances)
    assert daemon.counters[code.name.lower()] == 1


def test_ports_belong_to_one_socket(daemon: Daemon) -> None:
    a, b = _client(10), _client(11)
    sa, _ = _open(daemon, a, queue=0)
    sb, _ = _open(daemon, b, queue=1)
    assert isinstance(sa, XskGranted) and isinstance(sb, XskGranted)
    assert daemon.handle(a, GrantPort(10, sa.socket, 5)) == (Ok(), None)
    assert daemon.handle(a, GrantPort(10, sa.socket, 5)) == (Ok(), None)  # again: a no-op
    taken, _ = daemon.handle(b, GrantPort(11, sb.socket, 5))
    _refused(taken, ErrorCode.IN_USE, f"U-Net port 5 on {IFACE} is held by pid 10")
    wide, _ = daemon.handle(b, GrantPort(11, sb.socket, 256))
    _refused(wide, ErrorCode.BAD_TAG, "one byte")
    theirs, _ = daemon.handle(b, GrantPort(11, sa.socket, 6))
    _refused(theirs, ErrorCode.NOT_OWNER, f"xdp socket {sa.socket} is not yours")
    not_granted, _ = daemon.handle(b, RevokePort(11, sb.socket, 5))
    _refused(not_granted, ErrorCode.NOT_OWNER, "not granted to you")
    assert daemon.handle(a, RevokePort(10, sa.socket, 5)) == (Ok(), None)
    assert daemon.handle(b, GrantPort(11, sb.socket, 5)) == (Ok(), None)  # free again
    status = daemon.status()["xdp"][IFACE]["sockets"]
    assert status == {
        str(sa.socket): {"pid": 10, "queue": 0, "ports": []},
        str(sb.socket): {"pid": 11, "queue": 1, "ports": [5]},
    }


def test_reclaim_revokes_closes_and_detaches_with_the_last_socket(daemon: Daemon) -> None:
    a, b = _client(10), _client(11)
    sa, _ = _open(daemon, a, queue=0)
    sb, _ = _open(daemon, b, queue=1)
    assert isinstance(sa, XskGranted) and isinstance(sb, XskGranted)
    daemon.handle(a, GrantPort(10, sa.socket, 5))
    copy = daemon.xdp.sockets[sa.socket].opened
    attachment = FakeAttachment.instances[0]
    daemon.reclaim(a)
    assert attachment.owners == {} and copy.sock.fileno() == -1  # the daemon's copy is closed
    with pytest.raises(OSError):
        os.fstat(copy.umem_fd)
    assert not attachment.closed  # b still has a socket there
    assert daemon.counters["reclaimed_xsks"] == 1 and a.holds_nothing()
    assert daemon.handle(b, CloseXsk(11, sb.socket)) == (Ok(), None)
    assert attachment.closed and daemon.status()["xdp"] == {}
    reopened, _ = _open(daemon, b, queue=0)  # the queue and the interface are free again
    assert isinstance(reopened, XskGranted) and len(FakeAttachment.instances) == 2
