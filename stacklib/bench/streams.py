"""Workloads over IP: UDP ping-pong, a UDP stream and a TCP bulk stream, node 0 to node 1.

* ``udp-pingpong``: node 0 sends a UDP datagram of ``size`` bytes to node 1's ``port``, which
  echoes it back; ``iterations`` timed round trips per size after ``warmup`` untimed ones (paper
  000 Table 3 and Fig 5: UDP round trips over U-Net).  A reply not back within ``timeout``
  seconds counts as ``lost``.
* ``udp-stream``: node 0 sends ``datagrams`` UDP datagrams of each size back to back to node
  1's ``port``, bound with a receive buffer of ``rcvbuf_bytes`` and ``rcvbuf_datagrams``;
  ``MB/s = received x size / (last arrival - start) / 1e6`` and the datagrams lost (paper 000
  Table 3 and Fig 7: U-Net UDP bandwidth, "does not experience any losses", §7.6).  What has
  not arrived ``drain`` seconds after the last send is lost.
* ``tcp-stream``: node 0 opens a connection to node 1 (the StreamService view: node 1's
  ``service_port``) and, once both ends have it, writes ``size`` bytes in ``chunk``-byte writes:
  ``MB/s = size / elapsed / 1e6`` to node 1's read of the last byte (paper 000 §7.7, Table 3;
  ranks, one clock per process, time it to node 1's one-byte answer).  Then, after
  ``rtt_warmup`` untimed ones, ``rtt_iterations`` round trips of a ``request``-byte message on
  the same connection give the request/response time (paper 000 Table 3: TCP 157 us on U-Net
  ATM at 16 bytes).

All three find node 1's IP address from its stack (the ``ip`` attribute of the UDP and TCP
layers' services), so they need an ``ip`` layer below ``udp`` or ``tcp``.  Time is trio's:
virtual on a simulated NI, real otherwise.  Registered on import (:data:`UDP_PINGPONG`,
:data:`UDP_STREAM`, :data:`TCP_STREAM`).
"""

from __future__ import annotations

import ipaddress
import statistics as stats
import time
import typing
from collections.abc import Callable, Iterable

import attrs
import trio

from stacklib.bench import Session, WorkloadKind, register_workload
from stacklib.bench.params import check_sizes, count_valid, sizes_valid
from stacklib.bench.result import Cell, Column, Result
from stacklib.layers.ip.service import IpService, UdpService, UdpSocket
from stacklib.layers.ip.wire import IPV4_HEADER_SIZE
from stacklib.services import Service, StreamService

__all__ = [
    "TCP_STREAM",
    "UDP_PINGPONG",
    "UDP_STREAM",
    "TcpStreamParams",
    "UdpPingPongParams",
    "UdpStreamParams",
    "run_tcp_stream",
    "run_udp_pingpong",
    "run_udp_stream",
]

_UDP_HEADER = 8


def _ip_of(service: Service) -> IpService:
    ip = getattr(service, "ip", None)
    if not isinstance(ip, IpService):
        raise TypeError(f"{service!r} does not run over an IP layer (no 'ip' attribute)")
    return ip


def _sizes(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class UdpPingPongParams:
    """Recipe parameters of ``udp-pingpong``."""

    sizes: tuple[int, ...] = attrs.field(
        default=(0, 16, 40, 100, 500, 1000), converter=_sizes, validator=sizes_valid
    )
    iterations: int = attrs.field(default=1000, validator=count_valid(1))
    warmup: int = attrs.field(default=10, validator=count_valid(0))
    #: Node 1's echo port.
    port: int = attrs.field(
        default=7, validator=[attrs.validators.ge(1), attrs.validators.le(65535)]
    )
    #: Seconds to wait for a reply before counting it lost.
    timeout: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))


async def run_udp_pingpong(session: Session, params: UdpPingPongParams) -> Result:
    """UDP round trips from node 0 to node 1's echo port and back, per size."""
    client = typing.cast(UdpService, session.services[0])
    server = typing.cast(UdpService, session.services[1])
    client_ip, server_ip = _ip_of(client), _ip_of(server)
    target = (server_ip.address, params.port)
    limit = client_ip.mtu(server_ip.address) - IPV4_HEADER_SIZE - _UDP_HEADER
    check_sizes(params.sizes, limit)  # the largest datagram this path carries unfragmented
    rows = []
    lost_total = 0
    wall_start = time.perf_counter()
    async with (
        await server.bind(params.port) as echo_sock,
        await client.bind(0) as sock,
        trio.open_nursery() as nursery,
    ):

        async def echo() -> None:
            while True:
                data, source = await echo_sock.recvfrom()
                await echo_sock.sendto(data, source)

        nursery.start_soon(echo)
        now = trio.current_time
        for size in params.sizes:
            message = bytes(i & 0xFF for i in range(size))
            samples: list[float] = []
            lost = 0
            for i in range(params.warmup + params.iterations):
                start = now()
                await sock.sendto(message, target)
                with trio.move_on_after(params.timeout):
                    while True:
                        reply, _ = await sock.recvfrom()
                        if reply == message:
                            break
                    if i >= params.warmup:
                        samples.append(now() - start)
                    continue
                lost += 1
            lost_total += lost
            mean = stats.fmean(samples) if samples else None
            rows.append(
                {
                    "size": size,
                    "rtt_us": mean * 1e6 if mean is not None else None,
                    "min_us": min(samples) * 1e6 if samples else None,
                    "median_us": stats.median(samples) * 1e6 if samples else None,
                    "lost": lost,
                }
            )
        nursery.cancel_scope.cancel()
    return Result(
        title="UDP ping-pong round-trip time",
        columns=[
            Column("size", "size", "bytes"),
            Column("rtt_us", "RTT mean", "us", 2),
            Column("min_us", "RTT min", "us", 2),
            Column("median_us", "RTT median", "us", 2),
            Column("lost", "lost"),
        ],
        rows=rows,
        facts={
            "server": f"{target[0]}:{target[1]}",
            "max_size": limit,
            "lost": lost_total,
            "wall_seconds": time.perf_counter() - wall_start,
        },
    )


@attrs.frozen
class UdpStreamParams:
    """Recipe parameters of ``udp-stream``."""

    sizes: tuple[int, ...] = attrs.field(
        default=(1024, 4096, 8192), converter=_sizes, validator=sizes_valid
    )
    #: Datagrams sent per size.
    datagrams: int = attrs.field(default=200, validator=count_valid(1))
    #: Node 1's port.
    port: int = attrs.field(
        default=7, validator=[attrs.validators.ge(1), attrs.validators.le(65535)]
    )
    #: Node 1's receive buffer, bytes and datagrams (paper 000 §7.3: at user level the
    #: application sizes it; SunOS's is at most 52 KB).
    rcvbuf_bytes: int = attrs.field(default=4 << 20, validator=attrs.validators.ge(0))
    rcvbuf_datagrams: int = attrs.field(default=4096, validator=attrs.validators.ge(0))
    #: Seconds after the last send that datagrams still in flight may take to arrive.
    drain: float = attrs.field(default=0.1, validator=attrs.validators.gt(0))


async def _stream_once(
    sock: UdpSocket,
    sink: UdpSocket,
    data: bytes,
    count: int,
    target: tuple[str, int],
    drain: float,
) -> tuple[int, float]:
    """Send ``count`` datagrams of ``data`` from ``sock`` to ``target`` (``sink``'s address):
    (datagrams received within ``drain`` seconds of the last send, seconds from the first send
    to the last arrival)."""
    now = trio.current_time
    got = 0
    start = end = now()
    all_in = trio.Event()

    async def receive() -> None:
        nonlocal got, end
        while got < count:
            await sink.recvfrom()
            got += 1
            end = now()
        all_in.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        for _ in range(count):
            await sock.sendto(data, target)
        with trio.move_on_after(drain):
            await all_in.wait()
        nursery.cancel_scope.cancel()
    return got, end - start


async def run_udp_stream(session: Session, params: UdpStreamParams) -> Result:
    """Streams of UDP datagrams node 0 -> node 1, per size: the received bandwidth and losses."""
    client = typing.cast(UdpService, session.services[0])
    server = typing.cast(UdpService, session.services[1])
    client_ip, server_ip = _ip_of(client), _ip_of(server)
    target = (server_ip.address, params.port)
    check_sizes(params.sizes, client_ip.mtu(server_ip.address) - IPV4_HEADER_SIZE - _UDP_HEADER)
    rows = []
    wall_start = time.perf_counter()
    async with (
        await server.bind(
            params.port,
            rcvbuf_bytes=params.rcvbuf_bytes,
            rcvbuf_datagrams=params.rcvbuf_datagrams,
        ) as sink,
        await client.bind(0) as sock,
    ):
        for size in params.sizes:
            data = bytes(i & 0xFF for i in range(size))
            count = params.datagrams
            got, seconds = await _stream_once(sock, sink, data, count, target, params.drain)
            mb_per_s = got * size / seconds / 1e6 if got and seconds > 0 else None
            rows.append(
                {
                    "size": size,
                    "sent": count,
                    "received": got,
                    "lost": count - got,
                    "mb_per_s": mb_per_s,
                    "mbit_per_s": mb_per_s * 8 if mb_per_s is not None else None,
                }
            )
    return Result(
        title="UDP stream bandwidth",
        columns=[
            Column("size", "size", "bytes"),
            Column("sent", "sent"),
            Column("received", "received"),
            Column("lost", "lost"),
            Column("mb_per_s", "bandwidth", "MB/s", 2),
            Column("mbit_per_s", "bandwidth", "Mbit/s", 1),
        ],
        rows=rows,
        facts={
            "server": f"{target[0]}:{target[1]}",
            "wall_seconds": time.perf_counter() - wall_start,
        },
        notes=["MB/s are 10^6 bytes received per second, from the first send to the last arrival"],
    )


@attrs.frozen
class TcpStreamParams:
    """Recipe parameters of ``tcp-stream``."""

    #: Bytes node 0 sends to node 1.
    size: int = attrs.field(default=1 << 20, validator=attrs.validators.ge(1))
    #: Bytes per ``send_all`` call.
    chunk: int = attrs.field(default=8192, validator=attrs.validators.ge(1))
    #: Timed request/response round trips after the transfer (0: none).
    rtt_iterations: int = attrs.field(default=100, validator=count_valid(0))
    #: Bytes of each request and of each response.
    request: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    #: Untimed request/response round trips before the timed ones.
    rtt_warmup: int = attrs.field(default=0, validator=count_valid(0))


async def receive_exactly(stream: trio.abc.ReceiveStream, nbytes: int) -> bytes:
    """Exactly ``nbytes`` from ``stream``; a stream that ends first is a broken resource."""
    got = bytearray()
    while len(got) < nbytes:
        chunk = await stream.receive_some(nbytes - len(got))
        if not chunk:
            raise trio.BrokenResourceError(f"stream ended after {len(got)} of {nbytes} bytes")
        got += chunk
    return bytes(got)


def _segments_out(service: Service) -> int:
    value = service.statistics().get("segments_out", 0)
    return value if isinstance(value, int) else 0


async def serve_tcp_stream(
    server: StreamService,
    params: TcpStreamParams,
    on_received: Callable[[float], object] | None = None,
    accepted: trio.Event | None = None,
) -> int:
    """The receiving side of ``tcp-stream``: take one connection (then set ``accepted``, if
    given), read ``params.size`` bytes (then ``on_received(time)``, if given), say so with one
    byte, then echo requests until the sender closes.  Returns bytes read."""
    received = 0
    _, stream = await server.accept()
    if accepted is not None:
        accepted.set()
    async with stream:
        while received < params.size:
            data = await stream.receive_some(65536)
            if not data:
                raise trio.BrokenResourceError(f"stream ended after {received} bytes")
            received += len(data)
        if on_received is not None:
            on_received(trio.current_time())
        await stream.send_all(b"\x01")
        while request := await stream.receive_some(params.request):
            request += await receive_exactly(stream, params.request - len(request))
            await stream.send_all(request)
    return received


async def drive_tcp_stream(
    client: StreamService,
    peer: int,
    params: TcpStreamParams,
    on_start: Callable[[float], object] | None = None,
    accepted: trio.Event | None = None,
) -> tuple[float, list[float], int]:
    """The sending side of ``tcp-stream`` towards ``peer``: the transfer's seconds (from its
    start, passed to ``on_start`` if given, to the receiver's one-byte answer), the
    request/response round trips after ``rtt_warmup`` untimed ones, and the segments the
    client sent during the transfer.  The transfer starts once connected and, if given,
    ``accepted`` is set (the receiver has the connection too: no handshake in the time)."""
    now = trio.current_time
    segments_before = _segments_out(client)
    stream = await client.connect(peer)
    if accepted is not None:
        await accepted.wait()
    async with stream:
        block = bytes(i & 0xFF for i in range(params.chunk))
        start = now()
        if on_start is not None:
            on_start(start)
        remaining = params.size
        while remaining > 0:
            piece = block if remaining >= params.chunk else block[:remaining]
            await stream.send_all(piece)
            remaining -= len(piece)
        await receive_exactly(stream, 1)
        elapsed = now() - start
        segments = _segments_out(client) - segments_before
        request = bytes(params.request)
        samples = []
        for i in range(params.rtt_warmup + params.rtt_iterations):
            t0 = now()
            await stream.send_all(request)
            await receive_exactly(stream, params.request)
            if i >= params.rtt_warmup:
                samples.append(now() - t0)
        await stream.send_eof()
        await stream.receive_some(1)  # the receiver's close
    return elapsed, samples, segments


#: Where the in-process run stops the transfer's clock (both sides read one clock).
TO_LAST_BYTE = "node 1's read of the last byte"
#: Where a run with one clock per process stops it (ranks: no clock to compare with node 1's).
TO_ANSWER = "node 0's receipt of node 1's one-byte answer"


def tcp_stream_result(
    params: TcpStreamParams,
    elapsed: float,
    samples: list[float],
    facts: dict[str, Cell],
    until: str = TO_LAST_BYTE,
) -> Result:
    """The ``tcp-stream`` table: the transfer's ``elapsed`` seconds (from its start to
    ``until``) and the round-trip ``samples``."""
    mb_per_s = params.size / elapsed / 1e6 if elapsed > 0 else None
    row: dict[str, Cell] = {
        "size": params.size,
        "chunk": params.chunk,
        "seconds": elapsed,
        "mb_per_s": mb_per_s,
        "mbit_per_s": mb_per_s * 8 if mb_per_s is not None else None,
        "rtt_us": stats.fmean(samples) * 1e6 if samples else None,
        "rtt_min_us": min(samples) * 1e6 if samples else None,
    }
    return Result(
        title="TCP bulk transfer and request/response",
        columns=[
            Column("size", "size", "bytes"),
            Column("chunk", "write", "bytes"),
            Column("seconds", "time", "s", 4),
            Column("mb_per_s", "bandwidth", "MB/s", 2),
            Column("mbit_per_s", "bandwidth", "Mbit/s", 1),
            Column("rtt_us", f"{params.request}-byte RTT mean", "us", 2),
            Column("rtt_min_us", "RTT min", "us", 2),
        ],
        rows=[row],
        facts=facts,
        notes=[f"MB/s are 10^6 bytes per second, to {until}"],
    )


async def run_tcp_stream(session: Session, params: TcpStreamParams) -> Result:
    """Bulk transfer node 0 -> node 1 on one connection, then request/response round trips."""
    client = typing.cast(StreamService, session.services[0])
    server = typing.cast(StreamService, session.services[1])
    address = _ip_of(server).address
    peer = int(ipaddress.IPv4Address(address))  # the StreamService peer of TCP
    received = 0
    # The transfer is timed from node 0's start to node 1's read of the last byte, as paper
    # 000 §7.7's bandwidths are (the experiments of stacklib.experiments.tcpip time it so).
    # Both ends have the connection when it starts, so the handshake is not in the time.
    times: dict[str, float] = {}
    accepted = trio.Event()

    async def serve() -> None:
        nonlocal received
        received = await serve_tcp_stream(
            server, params, lambda t: times.setdefault("end", t), accepted
        )

    wall_start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        _, samples, segments = await drive_tcp_stream(
            client, peer, params, lambda t: times.setdefault("start", t), accepted
        )
    elapsed = times["end"] - times["start"]
    facts: dict[str, Cell] = {
        "server": address,
        "received": received,
        "segments_sent_by_node0": segments,
        "wall_seconds": time.perf_counter() - wall_start,
    }
    return tcp_stream_result(params, elapsed, samples, facts)


UDP_PINGPONG = register_workload(
    WorkloadKind(
        name="udp-pingpong",
        Params=UdpPingPongParams,
        run=run_udp_pingpong,
        description="UDP round-trip time vs datagram size between two nodes (over ip + udp)",
        requires=UdpService,
    )
)
UDP_STREAM = register_workload(
    WorkloadKind(
        name="udp-stream",
        Params=UdpStreamParams,
        run=run_udp_stream,
        description="UDP stream bandwidth and losses vs datagram size, node 0 -> node 1 "
        "(over ip + udp)",
        requires=UdpService,
    )
)
TCP_STREAM = register_workload(
    WorkloadKind(
        name="tcp-stream",
        Params=TcpStreamParams,
        run=run_tcp_stream,
        description="TCP bulk transfer MB/s and request/response RTT, node 0 -> node 1",
        requires=StreamService,
    )
)
