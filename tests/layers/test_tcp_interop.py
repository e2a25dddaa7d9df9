"""stacklib's TCP, UDP and IP against the real Linux kernel, over a TAP device.

The kernel's side of the TAP "cable" lives in a fresh network namespace at 10.99.0.1/24;
stacklib (layers ip-ether + tcp + udp) plays 10.99.0.2 on the other end.  Kernel-side peers
are small Python programs run in the namespace (``ip netns exec``) with ordinary sockets, so
what they see is what any Linux application would see.  10 MB each way, SHA-256 checked.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial

import attrs
import pytest
import trio

from stacklib.layers.ip import IpEtherLayer, IpEtherParams, IpEtherStack
from stacklib.layers.tcp.driver import ConnectionRefused, TcpLayer, TcpParams, TcpStack, TcpStream
from stacklib.layers.tcp.machine import TcpState
from stacklib.layers.udp import UdpLayer, UdpStack
from stacklib.netns import capability_problem, netns, netns_argv, ping_argv, remove_stale
from stacklib.transports.tap import open_tap

PROBLEM = capability_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

PREFIX = "sltcp"
KERNEL, STACK = "10.99.0.1", "10.99.0.2"
SIZE = 10 * 1024 * 1024
TIMEOUT = 60  # seconds for one 10 MB exchange (it takes a few)
# The largest window without window scaling, and a send buffer to match (paper 000 §7.7 uses
# 8 KB over a 157 µs round trip; through Python and a TAP device the round trip is longer).
PARAMS = TcpParams(send_buffer=256 * 1024, receive_buffer=65535)


@attrs.frozen
class Host:
    ns: str
    ip: IpEtherStack
    tcp: TcpStack
    udp: UdpStack


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers_from_killed_runs() -> None:
    if PROBLEM is None:
        remove_stale(PREFIX)


@pytest.fixture
def ns() -> Iterator[str]:
    with netns(PREFIX) as name:
        yield name


@asynccontextmanager
async def host(ns: str, params: TcpParams = PARAMS) -> AsyncIterator[Host]:
    async with (
        open_tap(netns=ns, address=f"{KERNEL}/24") as tap,
        IpEtherLayer(IpEtherParams(address=STACK)).open(tap) as ip,
        TcpLayer(params).open(ip) as tcp,
        UdpLayer().open(ip) as udp,
    ):
        yield Host(ns, ip, tcp, udp)


def payload(seed: int) -> bytes:
    return random.Random(seed).randbytes(SIZE)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# The kernel-side programs.  They print one line: what they received (hex SHA-256, or an error
# name), so a failure shows what the kernel saw.
_COMMON = """
import hashlib, random, socket, sys
def payload(seed):
    return random.Random(seed).randbytes(int(sys.argv[2]))
def receive_all(s):
    h, n = hashlib.sha256(), 0
    while chunk := s.recv(1 << 16):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n
"""

KERNEL_CLIENT = (
    _COMMON
    + """
s = socket.create_connection(("10.99.0.2", int(sys.argv[1])), timeout=50)
s.sendall(payload(1))
s.shutdown(socket.SHUT_WR)
print(*receive_all(s), flush=True)
s.close()
"""
)

KERNEL_SERVER = (
    _COMMON
    + """
server = socket.create_server(("10.99.0.1", int(sys.argv[1])))
print("ready", flush=True)
server.settimeout(50)
s, _ = server.accept()
got = receive_all(s)
s.sendall(payload(2))
s.close()
print(*got, flush=True)
"""
)

KERNEL_REFUSED = """
import socket, sys
try:
    socket.create_connection(("10.99.0.2", int(sys.argv[1])), timeout=10)
except ConnectionRefusedError:
    print("refused")
else:
    print("connected")
"""


def kernel_argv(ns: str, script: str, *args: object) -> list[str]:
    return netns_argv(ns, sys.executable, "-c", textwrap.dedent(script), *map(str, args))


async def run_kernel(ns: str, script: str, *args: object) -> str:
    result = await trio.run_process(
        kernel_argv(ns, script, *args), capture_stdout=True, capture_stderr=True, check=False
    )
    out: bytes = result.stdout
    assert result.returncode == 0, result.stderr.decode()
    return out.decode().strip()


async def receive_all(stream: TcpStream) -> bytes:
    got = bytearray()
    while chunk := await stream.receive_some(1 << 16):
        got += chunk
    return bytes(got)


async def test_kernel_connects_sends_10_mb_and_gets_10_mb_back(ns: str) -> None:
    async with host(ns) as h:
        listener = await h.tcp.listen(8080)
        result: dict[str, object] = {}

        async def kernel_side() -> None:
            result["kernel"] = await run_kernel(ns, KERNEL_CLIENT, 8080, SIZE)

        with trio.fail_after(TIMEOUT):
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(kernel_side)
                stream = await listener.accept()
                got = await receive_all(stream)  # the kernel's FIN ends it: it closed first
                received = trio.current_time()
                assert digest(got) == digest(payload(1))
                await stream.send_all(payload(2))
                await stream.aclose()
            sent = trio.current_time()
        assert result["kernel"] == f"{digest(payload(2))} {SIZE}"
        stats = stream.statistics()
        assert stats.bytes_received == stats.bytes_sent == SIZE and stats.mss == 1460
        # Orderly close begun by the kernel: CLOSE-WAIT, LAST-ACK, then CLOSED.
        assert stream.state is TcpState.CLOSED
        print(
            f"\nkernel -> stacklib 10 MB: {received - start:.2f} s; "
            f"stacklib -> kernel 10 MB: {sent - received:.2f} s; {stats}"
        )


async def test_stacklib_connects_to_a_kernel_listener_both_ways_10_mb(ns: str) -> None:
    async with host(ns) as h:
        result: dict[str, object] = {}

        async def kernel_side() -> None:
            result["kernel"] = await run_kernel(ns, KERNEL_SERVER, 9090, SIZE)

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(kernel_side)
                while True:  # until the kernel listens; meanwhile it answers with RSTs
                    try:
                        stream = await h.tcp.connect_to(KERNEL, 9090)
                        break
                    except ConnectionRefused:
                        await trio.sleep(0.05)
                start = trio.current_time()
                await stream.send_all(payload(1))
                await stream.send_eof()  # stacklib closes first: FIN-WAIT-1, FIN-WAIT-2...
                sent = trio.current_time()
                got = await receive_all(stream)
                received = trio.current_time()
        assert result["kernel"] == f"ready\n{digest(payload(1))} {SIZE}"
        assert digest(got) == digest(payload(2))
        assert stream.state is TcpState.TIME_WAIT  # ...and TIME-WAIT after the kernel's FIN
        print(
            f"\nstacklib -> kernel 10 MB: {sent - start:.2f} s; "
            f"kernel -> stacklib 10 MB: {received - sent:.2f} s; {stream.statistics()}"
        )
        await stream.aclose()


@pytest.mark.parametrize("first", ["kernel", "stacklib"])
async def test_orderly_close_started_by_either_side(ns: str, first: str) -> None:
    # The kernel server echoes what it gets, then closes when it sees EOF (stacklib first), or
    # closes at once after one message (kernel first).
    script = """
    import socket, sys
    server = socket.create_server(("10.99.0.1", 7070))
    print("ready", flush=True)
    s, _ = server.accept()
    s.sendall(s.recv(100))
    if sys.argv[1] == "stacklib":
        print("eof" if s.recv(100) == b"" else "data", flush=True)
    s.close()
    """
    async with host(ns) as h:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                result: dict[str, str] = {}

                async def kernel_side() -> None:
                    result["kernel"] = await run_kernel(ns, script, first)

                nursery.start_soon(kernel_side)
                while True:
                    try:
                        stream = await h.tcp.connect_to(KERNEL, 7070)
                        break
                    except ConnectionRefused:
                        await trio.sleep(0.05)
                await stream.send_all(b"hello")
                assert await stream.receive_some(100) == b"hello"
                if first == "stacklib":
                    await stream.send_eof()
                assert await stream.receive_some(100) == b""  # the kernel's FIN
                await stream.aclose()
            while stream.state not in (TcpState.TIME_WAIT, TcpState.CLOSED):
                await trio.sleep(0.01)  # the last ACK of the exchange
        if first == "stacklib":
            assert result["kernel"] == "ready\neof"
            assert stream.state is TcpState.TIME_WAIT  # the side that closes first waits
        else:
            assert result["kernel"] == "ready"
            assert stream.state is TcpState.CLOSED  # LAST-ACK acknowledged
        assert stream.statistics().retransmissions == 0


async def test_closed_ports_refuse_in_both_directions(ns: str) -> None:
    async with host(ns) as h:
        with trio.fail_after(10):
            with pytest.raises(ConnectionRefused):
                await h.tcp.connect_to(KERNEL, 9)  # the kernel's RST
            assert await run_kernel(ns, KERNEL_REFUSED, 9) == "refused"  # stacklib's RST
        assert h.tcp.statistics()["resets_sent"] == 1


async def test_udp_echo_both_ways(ns: str) -> None:
    kernel_echo = """
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("10.99.0.1", 7007))
    print("ready", flush=True)
    s.settimeout(10)
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
    """
    kernel_client = """
    import socket
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(b"from the kernel", ("10.99.0.2", 7))
    data, peer = s.recvfrom(2048)
    print(data.decode(), *peer)
    """
    async with host(ns) as h:
        with trio.fail_after(15):
            # The kernel sends to stacklib's echo port.
            echo = await h.udp.bind(7)

            async def echo_once() -> None:
                data, peer = await echo.recvfrom()
                await echo.sendto(data, peer)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo_once)
                assert (await run_kernel(ns, kernel_client)) == f"from the kernel {STACK} 7"
            # stacklib sends to a kernel echo socket.
            sock = await h.udp.bind()
            async with trio.open_nursery() as nursery:
                process: trio.Process = await nursery.start(
                    partial(trio.run_process, kernel_argv(ns, kernel_echo), stdout=subprocess.PIPE)
                )
                assert process.stdout is not None
                assert (await process.stdout.receive_some(100)).startswith(b"ready")
                await sock.sendto(b"from stacklib", (KERNEL, 7007))
                assert await sock.recvfrom() == (b"from stacklib", (KERNEL, 7007))
            assert process.returncode == 0


async def test_the_kernels_ping_is_answered(ns: str) -> None:
    async with host(ns) as h:
        with trio.fail_after(10):
            result = await trio.run_process(
                ping_argv(ns, STACK, wait=5), check=False, capture_stdout=True
            )
        assert result.returncode == 0, result.stdout
        assert h.ip.statistics()["echo_replies"] == 1
