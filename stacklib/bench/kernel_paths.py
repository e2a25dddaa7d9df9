"""The kernel's paths of the two-process benchmarks (:mod:`stacklib.bench.remote`).

* :class:`KernelUdpService`, :class:`KernelTcpService`: kernel sockets behind trio, as a
  :class:`~stacklib.services.DatagramService`, so the workloads run over them unchanged
  (``kernel-udp``, ``kernel-tcp``).
* :func:`blocking_pingpong`, :func:`blocking_echo`: the kernel at its best for a Python
  program, a ping-pong over blocking UDP sockets with no trio at all (one ``send`` and one
  ``recv`` system call per message, nothing between them): ``kernel-udp-blocking-*``.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

import trio

from stacklib.bench.params import check_sizes
from stacklib.bench.pingpong import PingPongParams, round_trip_result, round_trip_row
from stacklib.bench.result import Cell, Result
from stacklib.services import DatagramService

__all__ = [
    "KERNEL",
    "STOP",
    "KernelTcpService",
    "KernelUdpService",
    "blocking_echo",
    "blocking_pingpong",
    "blocking_socket",
    "kernel_services",
]

#: The kernel paths behind trio, by row name.
KERNEL = ("kernel-udp", "kernel-tcp")
#: Kernel datagrams: the largest UDP payload over IPv4.
UDP_MAX = 65507
#: What ends :func:`blocking_echo`; never a ping-pong message (those count 0, 1, 2, ...).
STOP = b"\xffstacklib-bench-stop"
_LENGTH = struct.Struct(">I")
_TIMEVAL = struct.Struct("@ll")


class KernelUdpService(DatagramService):
    """Messages as kernel UDP datagrams (trio sockets) to one peer address; peer id 0."""

    kind = "kernel-udp"

    def __init__(self, sock: trio.socket.SocketType, peer: tuple[str, int]) -> None:
        self._sock = sock
        self._peer = peer

    @property
    def peers(self) -> Sequence[int]:
        return (0,)

    @property
    def max_message(self) -> int:
        return UDP_MAX

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        await self._sock.sendto(data, self._peer)

    async def recv(self) -> tuple[int, bytes]:
        while True:
            data, source = await self._sock.recvfrom(UDP_MAX)
            if source[:2] == self._peer:
                return 0, data


class KernelTcpService(DatagramService):
    """Messages over one kernel TCP connection, each with a 4-byte length; peer id 0.  TCP is
    reliable, so nothing is ever lost; sends from several tasks are serialised."""

    kind = "kernel-tcp"

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._lock = trio.Lock()
        self._buffer = bytearray()

    @property
    def peers(self) -> Sequence[int]:
        return (0,)

    @property
    def max_message(self) -> int:
        return 1 << 24

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        async with self._lock:
            await self._stream.send_all(_LENGTH.pack(len(data)) + bytes(data))

    async def recv(self) -> tuple[int, bytes]:
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (length,) = _LENGTH.unpack_from(buffer)
                if len(buffer) >= 4 + length:
                    data = bytes(buffer[4 : 4 + length])
                    del buffer[: 4 + length]
                    return 0, data
            chunk = await self._stream.receive_some(1 << 20)
            if not chunk:
                raise trio.EndOfChannel
            buffer += chunk


async def kernel_pair(host: str) -> tuple[list[DatagramService], list[DatagramService]]:
    """Kernel UDP and TCP services joining two sides in this process: ([udp], [tcp])."""
    socks = []
    for _ in range(2):
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        await sock.bind((host, 0))
        socks.append(sock)
    udp: list[DatagramService] = [
        KernelUdpService(socks[0], socks[1].getsockname()[:2]),
        KernelUdpService(socks[1], socks[0].getsockname()[:2]),
    ]
    listeners = await trio.open_tcp_listeners(0, host=host)
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream(host, port)
    server = await listeners[0].accept()
    for listener in listeners:
        await listener.aclose()
    return udp, [KernelTcpService(client), KernelTcpService(server)]


async def kernel_services(
    rank: int, host: str, rendezvous: str, timeout: float
) -> list[tuple[str, DatagramService]]:
    """This rank's kernel UDP and TCP services to the other rank of two (addresses swapped
    through the rendezvous directory, as the bootstrap does)."""
    from stacklib.launch import publish, wait_for

    other = 1 - rank
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind((host, 0))
    publish(rendezvous, rank, f"{host}:{sock.getsockname()[1]}", "kudp")
    listeners = []
    if rank == 1:
        listeners = await trio.open_tcp_listeners(0, host=host)
        publish(rendezvous, rank, f"{host}:{listeners[0].socket.getsockname()[1]}", "ktcp")
    udp_host, _, udp_port = (
        await trio.to_thread.run_sync(wait_for, rendezvous, other, timeout, "kudp")
    ).rpartition(":")
    if rank == 0:
        text = await trio.to_thread.run_sync(wait_for, rendezvous, other, timeout, "ktcp")
        tcp_host, _, tcp_port = text.rpartition(":")
        stream = await trio.open_tcp_stream(tcp_host, int(tcp_port))
    else:
        stream = await listeners[0].accept()
        for listener in listeners:
            await listener.aclose()
    return [
        (KERNEL[0], KernelUdpService(sock, (udp_host, int(udp_port)))),
        (KERNEL[1], KernelTcpService(stream)),
    ]


# ==================================================================== blocking, no trio


def blocking_socket(host: str, timeout: float) -> socket.socket:
    """A blocking UDP socket bound to ``host`` whose receives give up after ``timeout``
    seconds.  The kernel keeps the timeout (SO_RCVTIMEO): a Python socket timeout would add a
    poll(2) before every receive."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((host, 0))
        seconds = int(timeout)
        sock.setsockopt(
            socket.SOL_SOCKET,
            socket.SO_RCVTIMEO,
            _TIMEVAL.pack(seconds, int((timeout - seconds) * 1e6)),
        )
    except BaseException:
        sock.close()
        raise
    return sock


def blocking_pingpong(sock: socket.socket, peer: tuple[str, int], params: PingPongParams) -> Result:
    """The ping-pong workload's table (:func:`~stacklib.bench.pingpong.pingpong`) measured on
    a blocking UDP ``sock`` towards a :func:`blocking_echo` at ``peer``, which is sent
    :data:`STOP` at the end.  No trio: the process sleeps in ``recv`` for every reply.  A
    reply that does not come within the socket's receive timeout raises TimeoutError."""
    check_sizes(params.sizes, UDP_MAX)
    sock.connect(peer)
    send, recv, now = sock.send, sock.recv, time.perf_counter
    rows: list[dict[str, Cell]] = []
    wall_start = now()
    try:
        for size in params.sizes:
            message = bytes(i & 0xFF for i in range(size))
            for _ in range(params.warmup):
                send(message)
                recv(UDP_MAX)
            samples = []
            for _ in range(params.iterations):
                start = now()
                send(message)
                reply = recv(UDP_MAX)
                samples.append(now() - start)
                if reply != message:
                    raise RuntimeError(f"ping-pong reply of {len(reply)} bytes differs")
            rows.append(round_trip_row(size, samples))
    except BlockingIOError:
        raise TimeoutError("blocking UDP ping-pong: no reply within the receive timeout") from None
    finally:
        sock.send(STOP)
    wall = now() - wall_start
    messages = 2 * (params.iterations + params.warmup) * len(params.sizes)
    return round_trip_result(rows, messages, wall)


def blocking_echo(sock: socket.socket) -> int:
    """Send every datagram on the blocking ``sock`` back to its source until :data:`STOP`
    arrives, or, once something arrived, until a whole receive timeout of the socket passes
    without an arrival (the other side is gone); returns how many were echoed.  Receive
    timeouts before the first arrival keep waiting."""
    recvfrom, sendto = sock.recvfrom, sock.sendto
    echoed = seen = 0
    while True:
        try:
            data, source = recvfrom(UDP_MAX)
        except BlockingIOError:
            if echoed and echoed == seen:
                return echoed
            seen = echoed
            continue
        if data == STOP:
            return echoed
        sendto(data, source)
        echoed += 1
