"""The OS service daemon at its limits: descriptors, connections per uid, idle connections, and
who may reach its socket."""

from __future__ import annotations

import grp
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator

import attrs
import pytest
import trio

from stacklib.daemon import (
    ConnectionLimits,
    DaemonBroker,
    DaemonClient,
    DaemonError,
    ErrorCode,
    ErrorReply,
    choose_victim,
    clients_for_descriptors,
    decode,
    socket_permissions,
)
from stacklib.daemon.cli import main
from stacklib.daemon.process import start_daemon, stop_daemon
from stacklib.transports.shm import ShmAddress, ShmNetwork


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition never held")
        time.sleep(0.01)


def _start(path: str, *extra: str, nofile: int | None = None) -> subprocess.Popen[bytes]:
    process = start_daemon(path, *extra, nofile=nofile)
    assert process.poll() is None, "the daemon exited while starting"
    return process


_stop = stop_daemon


@pytest.fixture
def workdir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="sl-")  # short: a socket path fits in 108 bytes
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _raw(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


async def _raw_when_there_is_room(path: str, patience: float = 5.0) -> socket.socket | None:
    """:func:`_raw`, again while the daemon's listen backlog is full (a connect to a Unix
    socket with a timeout then fails at once with EAGAIN: on a loaded machine the daemon
    accepts slower than a loop connects); None if it never connects."""
    deadline = trio.current_time() + patience
    while True:
        try:
            return _raw(path)
        except BlockingIOError:
            if trio.current_time() > deadline:
                return None
            await trio.sleep(0.005)
        except OSError:  # a connect may time out: the daemon lives
            return None


def _closed_by_daemon(sock: socket.socket, timeout: float = 5.0) -> str:
    """The reason the daemon sent before closing ``sock`` (it must close it)."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    assert data, "closed without a word"
    _, reply = decode(data[4 : 4 + int.from_bytes(data[:4], "big")])
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.BUSY
    return reply.text


# ==================================================================== descriptors


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param((), id="limits-from-rlimit"),
        # Limits above what the descriptors allow: accept() itself fails with EMFILE.
        pytest.param(("--max-clients", "5000", "--max-clients-per-uid", "5000"), id="emfile"),
    ],
)
async def test_hundreds_of_idle_connections_under_a_low_descriptor_limit(
    workdir: str, extra: tuple[str, ...]
) -> None:
    path = os.path.join(workdir, "d.sock")
    process = _start(path, *extra, nofile=256)
    brokers = [DaemonBroker(path, start=False), DaemonBroker(path, start=False)]
    idle: list[socket.socket] = []
    try:
        with (
            ShmNetwork(directory=workdir, broker=brokers[0]) as net_a,
            ShmNetwork(directory=workdir, broker=brokers[1]) as net_b,
        ):
            a, b = net_a.add_node("a"), net_b.add_node("b")
            ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
            ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
            ch_a = a.os.create_channel(ep_a.owner, ep_a, ShmAddress("b", 1))
            ch_b = b.os.create_channel(ep_b.owner, ep_b, ShmAddress("a", 1))

            async def exchange(text: bytes) -> None:
                with trio.fail_after(10):
                    await ep_a.send(ch_a, text)
                    assert (await ep_b.recv()).data == text
                    await ep_b.send(ch_b, text[::-1])
                    assert (await ep_a.recv()).data == text[::-1]

            await exchange(b"before")
            for _ in range(400):
                sock = await _raw_when_there_is_room(path)
                if sock is not None:
                    idle.append(sock)
                    await exchange(b"during") if len(idle) % 100 == 0 else None
            assert process.poll() is None, "the daemon died"
            with DaemonClient(path, start=False) as fresh:
                status = fresh.status()
            assert status["channels"] == 1 and "reclaimed_channels" not in status["counters"]
            assert status["counters"]["shed"] > 0
            if extra:
                assert status["counters"]["accept_emfile"] > 0
            else:
                assert status["clients"] <= status["limits"]["max_clients"] == 56
            await exchange(b"after")
            assert ep_a.statistics().dropped == ep_b.statistics().dropped == {}
    finally:
        for sock in idle:
            sock.close()
        for broker in brokers:
            broker.close()
        assert _stop(process) == 0


# ==================================================================== per uid, idle


def test_per_uid_limit_sheds_idle_connections_and_keeps_those_holding_channels(
    workdir: str,
) -> None:
    path = os.path.join(workdir, "d.sock")
    process = _start(path, "--max-clients-per-uid", "3", "--client-idle-timeout", "0")
    clients: list[DaemonClient] = []
    try:
        for node in ("a", "b"):
            clients.append(DaemonClient(path, start=False))
            clients[-1].create_endpoint(ShmAddress(node, 1))
        lurker = _raw(path)
        time.sleep(0.3)  # accepted before the next one
        third = DaemonClient(path, start=False)  # the uid is full: the lurker goes
        assert third.status()["clients"] == 3
        assert "uid 0 is at its limit of 3" in _closed_by_daemon(lurker)
        fourth = DaemonClient(path, start=False)  # now the third, holding nothing, goes
        assert fourth.status()["clients"] == 3
        with pytest.raises(DaemonError, match="connection closed: uid 0 is at its limit"):
            third.status()
        third.close()
        fourth.create_endpoint(ShmAddress("c", 1))
        with (
            DaemonClient(path, start=False) as refused,
            pytest.raises(DaemonError, match="3 connections holding channels"),
        ):
            refused.status()
        status = fourth.status()
        assert sorted(status["endpoints"]) == ["a:1", "b:1", "c:1"]
        assert status["counters"]["shed"] == 2 and status["counters"]["busy"] == 1
        clients.append(fourth)
    finally:
        for client in clients:
            client.close()
        assert _stop(process) == 0


def test_idle_connections_holding_nothing_time_out(workdir: str) -> None:
    path = os.path.join(workdir, "d.sock")
    process = _start(path, "--client-idle-timeout", "0.3")
    try:
        lurker = _raw(path)
        with DaemonClient(path, start=False) as holder:
            holder.create_endpoint(ShmAddress("a", 1))
            started = time.monotonic()
            assert _closed_by_daemon(lurker) == "connection closed: idle"
            assert 0.2 < time.monotonic() - started < 5
            with DaemonClient(path, start=False) as chatty:
                for _ in range(8):  # one request every 0.1 s keeps it open
                    chatty.status()
                    time.sleep(0.1)
            time.sleep(0.5)  # holding an endpoint, it may stay silent for ever
            status = holder.status()
            assert status["endpoints"] == ["a:1"] and status["counters"]["idle_closed"] >= 1
    finally:
        assert _stop(process) == 0


@attrs.define
class _Conn:
    uid: int
    last_active: float
    holds: bool = False

    def holds_nothing(self) -> bool:
        return not self.holds


def test_choose_victim_and_the_limits() -> None:
    conns = [_Conn(1, 5.0), _Conn(1, 1.0, holds=True), _Conn(1, 3.0), _Conn(2, 0.5)]
    assert choose_victim(conns, 1) is conns[2]  # least recently active holding nothing
    assert choose_victim(conns) is conns[2]  # uid 1 has the most connections
    assert choose_victim(conns, 2) is conns[3]
    assert choose_victim([_Conn(1, 0.0, holds=True)]) is None
    assert choose_victim(conns, 3) is None
    assert clients_for_descriptors(256) == 56 and clients_for_descriptors(10) == 1
    for bad in ({"max_clients": 0}, {"max_per_uid": 0}, {"idle_timeout": 0.0}):
        with pytest.raises(ValueError, match="must be"):
            ConnectionLimits(**bad)  # type: ignore[arg-type]
    assert ConnectionLimits(max_clients=7).total() == 7


def test_bad_limit_options_are_refused(workdir: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = os.path.join(workdir, "d.sock")
    assert main(["--socket", path, "--max-clients-per-uid", "0"]) == 2
    assert main(["--socket", path, "--client-idle-timeout", "-1"]) == 2
    assert main(["--socket", path, "--socket-group", "no-such-group-here"]) == 2
    err = capsys.readouterr().err
    assert "max_per_uid" in err and "--client-idle-timeout" in err and "no group" in err
    assert not os.path.exists(path)


# ==================================================================== socket permissions


def test_socket_permission_policy() -> None:
    assert socket_permissions(1000) == (0o600, -1)
    assert socket_permissions(1000, 0o640) == (0o640, -1)
    assert socket_permissions(0, 0o666) == (0o666, -1)
    assert socket_permissions(0, group="root") == (0o660, 0)
    try:
        gid = grp.getgrnam("stacklib").gr_gid
    except KeyError:
        assert socket_permissions(0) == (0o600, -1)  # root only, unless asked
    else:
        assert socket_permissions(0) == (0o660, gid)
    with pytest.raises(DaemonError, match="not a permission mode"):
        socket_permissions(0, 0o7777)
    with pytest.raises(DaemonError, match="no group"):
        socket_permissions(0, group="no-such-group-here")


@pytest.mark.parametrize(
    ("extra", "mode"),
    [((), None), (("--socket-mode", "0666"), 0o666), (("--socket-group", "root"), 0o660)],
)
def test_the_socket_gets_the_stated_permissions(
    workdir: str, extra: tuple[str, ...], mode: int | None
) -> None:
    path = os.path.join(workdir, "d.sock")
    process = _start(path, *extra)
    try:
        info = os.stat(path)
        expected, gid = socket_permissions(os.geteuid(), mode, "root" if "root" in extra else None)
        assert stat.S_IMODE(info.st_mode) == expected
        assert gid == -1 or info.st_gid == gid
        if os.geteuid() == 0 and not extra:
            assert not info.st_mode & 0o006  # a root daemon is not open to every user by default
    finally:
        assert _stop(process) == 0
