"""The OS service daemon: wire format, channels through passed memory, protection, faults."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.daemon import (
    AllowListFile,
    ChannelGranted,
    ClientState,
    CloseChannel,
    CloseEndpoint,
    CloseXsk,
    CreateEndpoint,
    Cred,
    Daemon,
    DaemonBroker,
    DaemonClient,
    DaemonDenied,
    DaemonError,
    DaemonFormatError,
    Deregister,
    Done,
    Doorbell,
    ErrorCode,
    ErrorReply,
    GrantPort,
    Ok,
    OpenChannel,
    OpenPool,
    OpenQueue,
    OpenXsk,
    PoolGranted,
    QueueGranted,
    Register,
    RevokePort,
    SendDirect,
    Status,
    StatusReply,
    XskGranted,
    decode,
    encode,
)
from stacklib.daemon.process import start_daemon, stop_daemon
from stacklib.transports.shm import (
    PeerGone,
    RegionHeader,
    RegionSpec,
    ShmAddress,
    ShmLink,
    ShmNetwork,
)
from stacklib.unet import connect

SPEC = RegionSpec(1 << 18, 65535)
SIZES = [0, 1, 40, 64, 65, 4096, 20000, 65535]

# ==================================================================== wire format

_names = st.text(min_size=0, max_size=70)
_u16 = st.integers(0, 0xFFFF)
_u32 = st.integers(0, 0xFFFFFFFF)
_u64 = st.integers(0, (1 << 64) - 1)
_u8 = st.integers(0, 255)
_messages = st.one_of(
    st.builds(CreateEndpoint, _u32, _names, _u16),
    st.builds(OpenChannel, _u32, _names, _u16, _names, _u16, _u32, _u32),
    st.builds(CloseChannel, _u32, _u32, st.integers(0, 255)),
    st.builds(CloseEndpoint, _u32, _names, _u16),
    st.builds(Status, _u32),
    st.just(Ok()),
    st.builds(ChannelGranted, _u32, st.integers(0, 255), _u32, _u32),
    st.builds(ErrorReply, _u16, st.text(max_size=200)),
    st.builds(StatusReply, st.text(max_size=200)),
    st.builds(Register, _u32, _u64, _u64),
    st.builds(Deregister, _u32, _u64, _u64),
    st.builds(OpenPool, _u32, _names, _u16, _u32, _u64),
    st.builds(SendDirect, _u32, _u32, st.integers(0, 255), _u64, _u32, _u32),
    st.builds(PoolGranted, _u32, _u64),
    st.builds(Done, _u32, st.integers(0, 255), _u32, _u32),
    st.builds(OpenQueue, _u32, _u32),
    st.builds(Doorbell, _u32),
    st.builds(QueueGranted, _u32),
    st.builds(OpenXsk, _u32, _names, _u32, _u32, _u32, _u8, _u8),
    st.builds(GrantPort, _u32, _u32, _u16),
    st.builds(RevokePort, _u32, _u32, _u16),
    st.builds(CloseXsk, _u32, _u32),
    st.builds(XskGranted, _u32, _u32, _u32, _u32, _u32, _u8, _names),
)


@given(st.integers(0, 0xFFFFFFFF), _messages)
@settings(max_examples=300, deadline=None)
def test_every_message_round_trips(seq: int, message: object) -> None:
    try:
        frame = encode(seq, message)  # type: ignore[arg-type]
    except DaemonFormatError:
        # Only a name too long for its u8-prefixed UTF-8 field may fail to encode.
        assert any(len(str(v).encode()) > 255 for v in vars(message).values())
        return
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert decode(frame[4:]) == (seq, message)


@given(st.binary(max_size=300))
@settings(max_examples=500, deadline=None)
def test_garbage_never_parses_into_anything_but_format_error(data: bytes) -> None:
    with contextlib.suppress(DaemonFormatError):
        decode(data)


@given(_messages, st.data())
@settings(max_examples=200, deadline=None)
def test_truncated_or_extended_bodies_are_rejected(message: object, data: st.DataObject) -> None:
    try:
        body = encode(1, message)[4:]  # type: ignore[arg-type]
    except DaemonFormatError:
        return
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(DaemonFormatError):
        decode(body[:cut])
    with pytest.raises(DaemonFormatError):
        decode(body + b"\0")


# ==================================================================== the state machine in-process


def _client(pid: int, uid: int = 1000) -> ClientState:
    return ClientState(sock=None, cred=Cred(pid, uid, uid))  # type: ignore[arg-type]


def _open(d: Daemon, c: ClientState, local: str, remote: str) -> object:
    (ln, lp), (rn, rp) = (a.split(":") for a in (local, remote))
    d.handle(c, CreateEndpoint(c.cred.pid, ln, int(lp)))
    reply, fd = d.handle(
        c, OpenChannel(c.cred.pid, ln, int(lp), rn, int(rp), SPEC.ring_bytes, SPEC.max_message)
    )
    assert (fd is None) == (not isinstance(reply, ChannelGranted))
    return reply


def test_policy_same_uid_by_default_and_allow_list(tmp_path: object) -> None:
    d = Daemon("/nonexistent")
    alice, bob = _client(10, uid=1000), _client(11, uid=1001)
    first = _open(d, alice, "a:1", "b:1")
    assert isinstance(first, ChannelGranted)
    refused = _open(d, bob, "b:1", "a:1")
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.DENIED
    assert d.counters["denied"] == 1

    rules = os.path.join(str(tmp_path), "allow")
    with open(rules, "w") as f:
        f.write("# bob may reach node a\n1001 a:*\n* public\n")
    policy = AllowListFile.load(rules)
    d = Daemon("/nonexistent", policy=policy)
    alice, bob = _client(10, uid=1000), _client(11, uid=1001)
    assert isinstance(_open(d, bob, "b:1", "a:1"), ChannelGranted)
    assert isinstance(_open(d, alice, "a:1", "b:1"), ErrorReply)  # alice is not listed for b
    assert isinstance(_open(d, alice, "a:2", "public:7"), ChannelGranted)
    for channel in list(d.channels.values()):
        d._retire(channel)


def test_reclaim_marks_the_region_and_a_reopen_gets_a_fresh_channel() -> None:
    d = Daemon("/nonexistent")
    a, b = _client(10), _client(11)
    grant_a, grant_b = _open(d, a, "a:1", "b:1"), _open(d, b, "b:1", "a:1")
    assert isinstance(grant_a, ChannelGranted) and isinstance(grant_b, ChannelGranted)
    assert grant_a.channel == grant_b.channel and {grant_a.side, grant_b.side} == {0, 1}
    channel = d.channels[grant_a.channel]
    assert channel.header.pid(grant_b.side) == 11  # the verified pid
    d.reclaim(b)
    assert channel.header.closed(grant_b.side) and not channel.header.closed(grant_a.side)
    assert channel.header.reclaimed(grant_b.side) and not channel.header.reclaimed(grant_a.side)
    assert d.counters["reclaimed_channels"] == 1 and "b:1" not in map(str, d.endpoints)
    b2 = _client(12)
    fresh = _open(d, b2, "b:1", "a:1")  # a new process on b: the broken channel is not joined
    assert isinstance(fresh, ChannelGranted) and fresh.channel != grant_a.channel
    d.reclaim(a)
    d.reclaim(b2)
    assert not d.channels and not d.endpoints
    both = _client(13)  # one process owning both sides: reclaiming it frees the channel
    assert isinstance(_open(d, both, "p:1", "p:2"), ChannelGranted)
    assert isinstance(_open(d, both, "p:2", "p:1"), ChannelGranted)
    d.reclaim(both)
    assert not d.channels and not d.by_pair


# ==================================================================== a real daemon


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition never held")
        time.sleep(0.01)


def _start_daemon(path: str, *extra: str) -> subprocess.Popen[bytes]:
    return start_daemon(path, *extra, stderr=subprocess.PIPE)


_stop = stop_daemon


@pytest.fixture
def workdir() -> Iterator[str]:
    # Short paths: a UNIX socket path must fit in 108 bytes.
    directory = tempfile.mkdtemp(prefix="sd-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def daemon(workdir: str) -> Iterator[str]:
    path = os.path.join(workdir, "daemon.sock")
    process = _start_daemon(path)
    yield path
    assert _stop(process) == 0
    assert not os.path.exists(path)


def _spawn_echo(path: str, workdir: str, node: str = "b") -> subprocess.Popen[str]:
    code = (
        "from stacklib.daemon import echo_peer; from stacklib.transports.shm import ShmAddress; "
        f"echo_peer({path!r}, {workdir!r}, ShmAddress({node!r}, 1), ShmAddress('a', 1))"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        process.wait()
        raise AssertionError("the echo peer did not start")
    return process


def _kill(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


def _intruder(path: str, channel: int) -> dict[str, object]:
    """A third process: tries to reach the channel of a:1-b:1; reports what it got."""
    code = f"""
import json
from stacklib.daemon import DaemonClient, DaemonError
from stacklib.transports.shm import RegionSpec, ShmAddress as A
c, spec, out = DaemonClient({path!r}, start=False), RegionSpec(1 << 18, 65535), {{}}
def attempt(name, call):
    try:
        result = call()
        out[name] = result[0].channel if isinstance(result, tuple) else "ok"
    except DaemonError as e:
        out[name] = e.code.name
attempt("claim_a", lambda: c.create_endpoint(A("a", 1)))
attempt("open_as_a", lambda: c.open_channel(A("a", 1), A("b", 1), spec))
attempt("close_it", lambda: c.close_channel({channel}, 0))
attempt("close_other", lambda: c.close_channel({channel}, 1))
attempt("own", lambda: c.create_endpoint(A("c", 1)))
attempt("c_to_a", lambda: c.open_channel(A("c", 1), A("a", 1), spec))
attempt("c_to_b", lambda: c.open_channel(A("c", 1), A("b", 1), spec))
print(json.dumps(out))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=True
    )
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


async def test_two_processes_exchange_through_passed_memory_a_third_gets_nothing(
    daemon: str, workdir: str
) -> None:
    broker = DaemonBroker(daemon, start=False)
    network = ShmNetwork(directory=workdir, broker=broker, ring_bytes=SPEC.ring_bytes)
    peer = None
    try:
        node = network.add_node("a")
        endpoint = node.os.create_endpoint(node.os.process("app"), port=1)
        channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress("b", 1))
        ((daemon_channel, _),) = broker.channels.values()
        peer = _spawn_echo(daemon, workdir)
        with trio.fail_after(20):
            for size in SIZES:
                data = bytes((i * 7 + size) & 0xFF for i in range(size))
                await endpoint.send(channel, data)
                assert (await endpoint.recv()).data == data
        # The region has no name anywhere: only the two owners hold it.
        assert not [n for n in os.listdir(workdir) if n.startswith("chan")]
        got = _intruder(daemon, daemon_channel)
        assert got["claim_a"] == "IN_USE"  # node a belongs to this process
        assert got["open_as_a"] == "NOT_OWNER"
        assert got["close_it"] == got["close_other"] == "NOT_OWNER"
        assert got["own"] == "ok"
        # Its own channels to a and b are new, separate regions, never a:1-b:1's.
        assert got["c_to_a"] not in (daemon_channel, got["c_to_b"])
        assert got["c_to_b"] != daemon_channel
        with trio.fail_after(5):  # the channel still works
            await endpoint.send(channel, b"still mine")
            assert (await endpoint.recv()).data == b"still mine"
        status = broker.client.status()
        assert status["counters"]["not_owner"] == 3 and status["counters"]["in_use"] == 1
    finally:
        if peer is not None:
            _kill(peer)
        network.close()
        broker.close()


async def test_killed_client_is_reclaimed_and_the_peer_sees_the_failure(
    daemon: str, workdir: str
) -> None:
    broker = DaemonBroker(daemon, start=False)
    network = ShmNetwork(directory=workdir, broker=broker, ring_bytes=SPEC.ring_bytes)
    peer = None
    try:
        node = network.add_node("a")
        endpoint = node.os.create_endpoint(node.os.process("app"), port=1)
        channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress("b", 1))
        peer = _spawn_echo(daemon, workdir)
        with trio.fail_after(20):
            await endpoint.send(channel, b"ping")
            assert (await endpoint.recv()).data == b"ping"
        _kill(peer)
        link = node.ni.link(endpoint, channel)  # type: ignore[attr-defined]
        peer_side = 1 - link.side

        def reclaimed() -> bool:
            return RegionHeader(link.region).reclaimed(peer_side)

        _wait_for(reclaimed, 5)
        assert RegionHeader(link.region).closed(peer_side)
        with trio.fail_after(5), pytest.raises(PeerGone):
            await endpoint.recv()
        with pytest.raises(PeerGone):
            await endpoint.send(channel, b"anyone?")
        status = broker.client.status()
        assert status["counters"]["reclaimed_channels"] == 1
        assert status["endpoints"] == ["a:1"]  # b:1 is gone with its process
    finally:
        if peer is not None:
            _kill(peer)
        network.close()
        broker.close()


def test_forged_and_malformed_requests_are_refused_and_counted(daemon: str) -> None:
    me = os.getpid()
    with DaemonClient(daemon, start=False) as client:
        with pytest.raises(DaemonDenied) as info:
            client.request(CreateEndpoint(me + 1, "a", 1))
        assert info.value.code is ErrorCode.FORGED_PID
        client.create_endpoint(ShmAddress("a", 1))
        with pytest.raises(DaemonDenied, match="not yours"):
            client.close_channel(12345, 0)
        with pytest.raises(DaemonDenied):  # an endpoint it never registered
            client.open_channel(ShmAddress("z", 1), ShmAddress("b", 1), SPEC)
        for bogus in (ShmAddress("../etc", 1), ShmAddress("a", 1)):  # bad name; itself
            with pytest.raises(DaemonError) as refused:
                client.open_channel(ShmAddress("a", 1), bogus, SPEC)
            assert refused.value.code is ErrorCode.BAD_TAG
        _, fd = client.open_channel(ShmAddress("a", 1), ShmAddress("b", 1), SPEC)
        os.close(fd)
        with pytest.raises(DaemonError) as refused:  # the same side twice
            client.open_channel(ShmAddress("a", 1), ShmAddress("b", 1), SPEC)
        assert refused.value.code is ErrorCode.IN_USE
        for garbage in (b"\x01\xee\0\0\0\1", b"\x02\x05\0\0\0\1\0\0\0\0", b"", b"\x01\x80"):
            client.send_raw(len(garbage).to_bytes(4, "big") + garbage)
            _, reply, fds = client.receive()
            assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.MALFORMED
            assert fds == []
        with pytest.raises(DaemonError, match="not a request"):
            client.request(Ok())
        counters = client.status()["counters"]
    assert counters["forged_pid"] == 1 and counters["not_owner"] == 2
    assert counters["bad_tag"] == 2 and counters["in_use"] == 1
    assert counters["malformed"] == 5
    # A frame too long to be a request: answered, then the daemon hangs up; it lives on.
    with DaemonClient(daemon, start=False) as client:
        client.send_raw((1 << 30).to_bytes(4, "big") + b"x" * 100)
        _, reply, _ = client.receive()
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.MALFORMED
        with pytest.raises(DaemonError, match="closed"):
            client.receive()
    with DaemonClient(daemon, start=False) as client:
        status = client.status()
        assert status["counters"]["malformed"] == 6 and status["clients"] == 1


def test_stop_restart_and_stale_socket(workdir: str) -> None:
    path = os.path.join(workdir, "daemon.sock")
    first = _start_daemon(path)
    try:
        second = subprocess.run(  # one daemon per socket: the second refuses
            [sys.executable, "-m", "stacklib.daemon", "--socket", path],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert second.returncode == 2 and "already" in second.stderr
        with DaemonClient(path, start=False) as client:
            assert client.status()["pid"] == first.pid
    finally:
        assert _stop(first) == 0
    assert not os.path.exists(path)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # a socket left by a daemon that was SIGKILLed
    stale.close()
    with pytest.raises(DaemonError, match="no daemon"):
        DaemonClient(path, start=False)
    again = _start_daemon(path)
    try:
        with DaemonClient(path, start=False) as client:
            assert client.status()["pid"] == again.pid
    finally:
        assert _stop(again) == 0
    assert not os.path.exists(path)


def test_started_on_demand_once_by_racing_starters(workdir: str) -> None:
    path = os.path.join(workdir, "run", "daemon.sock")
    pids: list[int] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            with DaemonClient(path) as client:  # start=True: spawn one if none answers
                pids.append(client.status()["pid"])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    daemon_pids = set(pids)
    try:
        assert not errors and len(pids) == 4 and len(daemon_pids) == 1
    finally:
        for pid in daemon_pids:
            os.kill(pid, signal.SIGTERM)
        _wait_for(lambda: not os.path.exists(path), 5)


def test_random_request_streams_get_error_replies_and_the_daemon_lives(daemon: str) -> None:
    rng = random.Random(6)
    with DaemonClient(daemon, start=False) as client:
        for _ in range(50):
            body = rng.randbytes(rng.randrange(0, 40))
            if body and rng.random() < 0.5:
                body = bytes([1]) + body[1:]  # the right version, so deeper fields are parsed
            client.send_raw(len(body).to_bytes(4, "big") + body)
            _, reply, fds = client.receive()
            assert isinstance(reply, ErrorReply) and fds == []
        assert client.status()["counters"]["requests"] == 1


def test_idle_daemon_exits_and_removes_its_socket(workdir: str) -> None:
    path = os.path.join(workdir, "daemon.sock")
    process = _start_daemon(path, "--idle-timeout", "0.3")
    try:
        with DaemonClient(path, start=False) as client:
            client.status()
            time.sleep(0.5)  # a connected client keeps it alive
            client.status()
        assert process.wait(5) == 0
        assert not os.path.exists(path)
    finally:
        _stop(process)


async def test_one_process_owning_both_sides_and_the_close_hook(
    daemon: str, workdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hook proposed for ShmLink.close: tell the broker the side is closed.
    original = ShmLink.close

    def close_with_hook(link: ShmLink) -> None:
        if not link.closed:
            link.ni.network.broker.close_region(link.path)  # type: ignore[attr-defined]
        original(link)

    monkeypatch.setattr(ShmLink, "close", close_with_hook)
    broker = DaemonBroker(daemon, start=False)
    try:
        with ShmNetwork(directory=workdir, broker=broker, ring_bytes=SPEC.ring_bytes) as network:
            a, b = network.add_node("a"), network.add_node("b")
            ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
            ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
            ch_a, ch_b = connect(ep_a, ep_b)
            assert sorted(side for _, side in broker.channels.values()) == [0, 1]
            with trio.fail_after(5):
                await ep_a.send(ch_a, b"both sides here")
                message = await ep_b.recv()
            assert (message.channel, message.data) == (ch_b, b"both sides here")
            assert broker.client.status()["channels"] == 1
        status = broker.client.status()  # both links closed through the hook
        assert status["channels"] == 0 and status["counters"].get("not_owner", 0) == 0
    finally:
        broker.close()


def test_the_daemon_uses_only_the_public_names_of_the_shm_package() -> None:
    import ast
    from pathlib import Path

    import stacklib.daemon

    package = Path(stacklib.daemon.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "stacklib.transports.shm"
            ):
                assert node.module == "stacklib.transports.shm", f"{path.name}: {node.module}"
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"{path.name} imports {private} of shm"
