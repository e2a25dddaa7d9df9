"""The two processes of ``stacklib bench xdp``, one per network namespace.

``python -m stacklib.bench.peers.xdp ROLE --interface IF ...`` runs one side of one measurement
(root: it attaches the XDP program to its own interface).  Roles come in pairs, a server and a
client: ``xdp-echo``/``xdp-ping``, ``udp-echo``/``udp-ping`` (ping-pong), ``xdp-sink``/
``xdp-source``, ``udp-sink``/``udp-source`` (one-way streams) and ``uam-sink``/``uam-source``
(a UAM message stream over xdp, paper 000 §5).

The conversation with the parent (:func:`run_pair`), one line at a time: the child prints
``ready MAC PORT`` (its endpoint's address; ``ready - 0`` for the udp roles) and waits for
``go MAC PORT``, its partner's address.  A server then opens its channel, prints ``set`` and
serves until its stdin closes; a client runs at once.  Both end by printing one JSON line of
results and counters.  Only the parent's word starts a client, so no frame meets a server
without its channel.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Any

import attrs
import trio

from stacklib.transports.ether import EtherAddress
from stacklib.transports.xdp.network import XdpNetwork
from stacklib.transports.xdp.ni import XdpEndpoint
from stacklib.transports.xdp.xsk import XskLayout

SERVERS = ("xdp-echo", "xdp-sink", "udp-echo", "udp-sink", "uam-sink")
CLIENTS = ("xdp-ping", "xdp-source", "udp-ping", "udp-source", "uam-source")
#: The udp roles' port, on the addresses the parent gives the veth ends.
UDP_PORT = 7798
#: Round trips before the timed ones (caches, the first wake-ups, ARP for udp).
WARMUP = 200
#: UMEM chunks of a stream's receiver: 8192 receive buffers (16 MiB), so a receiver preempted
#: for a few milliseconds loses nothing, as the kernel's receiver has its 8 MiB socket buffer.
SINK_FRAMES = 16384
#: Seconds a client waits for an answer before it gives up (nothing is timed this long).
_DEADLINE = 5.0


@attrs.frozen
class Role:
    """What one child does: its role, interface, CPU and workload."""

    role: str
    interface: str
    cpu: int | None = None
    count: int = 10000
    size: int = 40
    #: The udp roles: the partner's IPv4 address (clients) or this end's (servers).
    address: str = ""
    #: The UAM roles: the go-back-N window, in messages.
    window: int = 64
    port: int = 1

    def argv(self) -> list[str]:
        """The command line that runs this role in a child (see :func:`_main`)."""
        argv = [sys.executable, "-m", "stacklib.bench.peers.xdp", self.role]
        argv += ["--interface", self.interface, "--count", str(self.count)]
        argv += ["--size", str(self.size), "--window", str(self.window), "--port", str(self.port)]
        if self.address:
            argv += ["--address", self.address]
        if self.cpu is not None:
            argv += ["--cpu", str(self.cpu)]
        return argv


def _say(*words: object) -> None:
    print(*words, flush=True)


def _hear_go() -> EtherAddress:
    words = sys.stdin.readline().split()
    if len(words) != 3 or words[0] != "go":
        raise RuntimeError(f"xdp bench peer: expected 'go MAC PORT', got {words!r}")
    return EtherAddress(words[1], int(words[2]))


def _watch_stdin(then: Callable[[], None] | None = None) -> threading.Event:
    """An event set when stdin closes (the parent's word to stop), then ``then()`` runs."""
    stop = threading.Event()

    def watch() -> None:
        while sys.stdin.readline():
            pass
        stop.set()
        if then is not None:
            then()

    threading.Thread(target=watch, daemon=True).start()
    return stop


def _percentile(samples: list[int], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] / 1e3


def _round_trips(samples: list[int]) -> dict[str, Any]:
    """Median, p99 and mean of round trips in ns, as microseconds."""
    return {
        "round_trips": len(samples),
        "median_us": _percentile(samples, 0.5),
        "p99_us": _percentile(samples, 0.99),
        "mean_us": sum(samples) / len(samples) / 1e3,
    }


# ---------------------------------------------------------------------- xdp roles


def _xdp(spec: Role) -> dict[str, Any]:
    frames = SINK_FRAMES if spec.role == "xdp-sink" else XskLayout().frames
    network = XdpNetwork(spec.interface, layout=XskLayout(frames=frames))
    try:
        node = network.add_node(spec.role)
        endpoint = node.os.create_endpoint(node.os.process(spec.role), port=spec.port)
        assert isinstance(endpoint, XdpEndpoint)
        _say("ready", endpoint.ni.mac, endpoint.port)
        remote = _hear_go()
        channel = node.os.create_channel(endpoint.owner, endpoint, remote)
        if not spec.size:  # the largest message one frame carries
            spec = attrs.evolve(spec, size=endpoint.ni.max_message)
        if spec.role in SERVERS and spec.role != "uam-sink":  # that one once its layer runs
            _say("set")
        run = {
            "xdp-echo": _xdp_echo,
            "xdp-ping": _xdp_ping,
            "xdp-sink": _xdp_sink,
            "xdp-source": _xdp_source,
            "uam-sink": _uam_sink,
            "uam-source": _uam_source,
        }[spec.role]
        result = run(endpoint, channel, spec)
        result["size"] = spec.size
        ni = endpoint.ni
        result["ni"] = {
            "sent": ni.sent,
            "received": ni.received,
            "dropped": dict(ni.dropped),
            **ni.socket_statistics(),
        }
        return result
    finally:
        network.close()


def _xdp_echo(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    """Echo every message, busy-polling (paper 000 §3.1), until stdin closes."""
    stop = _watch_stdin()
    poll, send = endpoint.poll, endpoint.send_nowait
    echoed = spins = 0
    while True:
        message = poll()
        if message is None:
            spins += 1
            if spins & 1023 == 0 and stop.is_set():
                break
            continue
        send(channel, message.data)
        echoed += 1
    return {"echoed": echoed}


def _xdp_ping(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    """``spec.count`` timed round trips of ``spec.size``-byte messages, busy-polling."""
    message = bytes(spec.size)
    poll, send, clock = endpoint.poll, endpoint.send_nowait, time.perf_counter_ns
    samples = []
    for index in range(WARMUP + spec.count):
        start = clock()
        send(channel, message)
        spins = 0
        while poll() is None:
            spins += 1
            if spins & 0xFFFF == 0 and clock() - start > _DEADLINE * 1e9:
                raise TimeoutError(f"xdp ping-pong: no echo of message {index} in {_DEADLINE} s")
        if index >= WARMUP:
            samples.append(clock() - start)
    return _round_trips(samples)


def _xdp_sink(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    """Count arrivals, draining with :meth:`XdpEndpoint.recv_many` (every waiting frame in
    one pass) in a tight loop, until stdin closes; the rate runs from the first arrival to the
    last (seen when the ring next runs dry)."""
    stop = _watch_stdin()
    recv_many, clock = endpoint.recv_many, time.perf_counter_ns
    received = seen = spins = 0
    first = last = 0
    while True:
        batch = recv_many(256)
        if batch:
            if not received:  # the receiver spins, so the first batch is the first arrival
                first = clock()
            received += len(batch)
            continue
        if received != seen:  # the ring ran dry: the last arrival was just now
            last, seen = clock(), received
        spins += 1
        if spins & 1023 == 0 and stop.is_set():
            break
    return _stream_result(received, first, last)


def _stream_result(received: int, first: int, last: int) -> dict[str, Any]:
    elapsed = (last - first) / 1e9
    rate = (received - 1) / elapsed if received > 1 and elapsed > 0 else None
    return {"received": received, "seconds": elapsed, "rate": rate}


def _xdp_source(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    """Stream ``spec.count`` messages with :meth:`XdpEndpoint.send_many` (one kernel wake-up
    per budget of frames the kernel takes at once), as fast as the send buffers come back."""
    message = bytes(spec.size)
    send_many, progress = endpoint.send_many, endpoint.ni.progress
    sent, start = 0, time.perf_counter()
    while sent < spec.count:
        wanted = min(1024, spec.count - sent)
        taken = send_many(channel, repeat(message, wanted))
        sent += taken
        if taken < wanted:
            progress()  # the send queue filled: let the NI take some
    # Frames still in the send queue go out before the report.
    deadline = time.perf_counter() + _DEADLINE
    while endpoint.send_queue and time.perf_counter() < deadline:
        progress()
    return {"sent": sent, "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------- UAM over xdp


def _uam_params(spec: Role) -> Any:
    from stacklib.layers.uam import UamParams

    # A descheduled peer must not be declared dead on a shared machine (see bench real).
    return UamParams(window=spec.window, max_retries=1000)


def _uam_sink(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    """Receive UAM messages until stdin closes; each must carry the next sequence number."""
    return trio.run(_uam_sink_async, endpoint, channel, spec)


async def _uam_sink_async(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    from stacklib.layers.uam import UamLayer
    from stacklib.services import UNetService

    state = {"received": 0, "in_order": 0, "first": 0, "last": 0}
    async with UamLayer(_uam_params(spec)).open(UNetService(endpoint)) as am:
        _say("set")

        async def take() -> None:
            clock = time.perf_counter_ns
            while True:
                _, data = await am.recv()
                if not state["received"]:
                    state["first"] = clock()
                if int.from_bytes(data[:8], "little") == state["in_order"]:
                    state["in_order"] += 1
                state["received"] += 1
                state["last"] = clock()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take)
            await trio.lowlevel.wait_readable(sys.stdin.fileno())
            while sys.stdin.readline():
                await trio.lowlevel.wait_readable(sys.stdin.fileno())
            nursery.cancel_scope.cancel()
        statistics = {
            k: v
            for k, v in am.statistics().items()
            if isinstance(v, int) and not isinstance(v, bool)
        }
    result = _stream_result(state["received"], state["first"], state["last"])
    result.update(in_order=state["in_order"], uam=statistics)
    return result


def _uam_source(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    return trio.run(_uam_source_async, endpoint, channel, spec)


async def _uam_source_async(endpoint: XdpEndpoint, channel: int, spec: Role) -> dict[str, Any]:
    """Send ``spec.count`` numbered messages with ``await am.send`` and wait for every
    acknowledgement (``am.drain()``)."""
    from stacklib.layers.uam import UamLayer
    from stacklib.services import UNetService

    pad = bytes(max(spec.size - 8, 0))
    with trio.fail_after(60 + spec.count * 1e-3):
        async with UamLayer(_uam_params(spec)).open(UNetService(endpoint)) as am:
            start = time.perf_counter()
            send = am.send
            for number in range(spec.count):
                await send(channel, number.to_bytes(8, "little") + pad)
            await am.drain()
            seconds = time.perf_counter() - start
            statistics = {
                k: v
                for k, v in am.statistics().items()
                if isinstance(v, int) and not isinstance(v, bool)
            }
    return {"sent": spec.count, "seconds": seconds, "uam": statistics}


# ---------------------------------------------------------------------- kernel UDP roles


def _udp(spec: Role) -> dict[str, Any]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        if spec.role in SERVERS:
            sock.bind((spec.address, UDP_PORT))
            # Room for a burst, so the stream's losses are the receiver's pace, not a small
            # buffer's (capped by net.core.rmem_max).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        else:
            # A kernel timeout keeps the socket in blocking mode: no poll(2) before each recv.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 5, 0))
        _say("ready - 0")
        _hear_go()
        if spec.role in SERVERS:
            _say("set")
            # Stop: shut the receiving side, so recv returns b"" once the queue is empty
            # (Linux does it for an unconnected socket too, after saying ENOTCONN).
            _watch_stdin(lambda: _shut(sock))
            return _udp_echo(sock) if spec.role == "udp-echo" else _udp_sink(sock)
        target = (spec.address, UDP_PORT)
        if spec.role == "udp-ping":
            return _udp_ping(sock, target, spec)
        return _udp_source(sock, target, spec)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)


def _udp_echo(sock: socket.socket) -> dict[str, Any]:
    recvfrom, sendto = sock.recvfrom, sock.sendto
    echoed = 0
    while True:
        data, peer = recvfrom(65536)
        if not data:
            return {"echoed": echoed}
        sendto(data, peer)
        echoed += 1


def _udp_ping(sock: socket.socket, target: tuple[str, int], spec: Role) -> dict[str, Any]:
    message = bytes(spec.size)
    sendto, recv, clock = sock.sendto, sock.recv, time.perf_counter_ns
    samples = []
    for index in range(WARMUP + spec.count):
        start = clock()
        sendto(message, target)
        recv(65536)
        if index >= WARMUP:
            samples.append(clock() - start)
    return _round_trips(samples)


def _udp_sink(sock: socket.socket) -> dict[str, Any]:
    recv, clock = sock.recv, time.perf_counter_ns
    received = first = last = 0
    while True:
        data = recv(65536)
        if not data:
            break
        if not received:
            first = clock()
        received += 1
        last = clock()
    return _stream_result(received, first, last)


def _udp_source(sock: socket.socket, target: tuple[str, int], spec: Role) -> dict[str, Any]:
    message = bytes(spec.size)
    sendto = sock.sendto
    start = time.perf_counter()
    for _ in range(spec.count):
        sendto(message, target)
    return {"sent": spec.count, "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------- the parent's side


def _readline(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"xdp bench peer {process.args!r} said nothing (exit {process.poll()})")
    return line.strip()


@contextlib.contextmanager
def _child(namespace: str, role: Role) -> Iterator[subprocess.Popen[str]]:
    from stacklib.netns import netns_argv

    argv = netns_argv(namespace, *role.argv())
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def _tell(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()


def run_pair(
    server: tuple[str, Role], client: tuple[str, Role], timeout: float = 60
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one measurement: ``server`` and ``client`` as (namespace, role) children; returns
    their two JSON reports (server's, client's).  Raises RuntimeError if either fails."""
    with _child(*server) as serving, _child(*client) as asking:
        server_address = _readline(serving, 20).split()[1:]
        client_address = _readline(asking, 20).split()[1:]
        _tell(serving, "go " + " ".join(client_address))
        if _readline(serving, 20) != "set":
            raise RuntimeError(f"xdp bench peer {server[1].role}: no 'set'")
        _tell(asking, "go " + " ".join(server_address))
        client_report = json.loads(_readline(asking, timeout))
        asking.wait(10)
        assert serving.stdin is not None
        serving.stdin.close()
        server_report = json.loads(_readline(serving, 20))
        serving.wait(10)
    return server_report, client_report


def _main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stacklib.bench.peers.xdp",
        description="One side of one measurement of `stacklib bench xdp` (root).",
    )
    parser.add_argument("role", choices=SERVERS + CLIENTS)
    parser.add_argument("--interface", required=True, help="this side's interface")
    parser.add_argument("--cpu", type=int, help="run on this CPU")
    parser.add_argument("--count", type=int, default=10000, help="round trips or messages")
    parser.add_argument(
        "--size", type=int, default=40, help="message size in bytes (xdp: 0 = max_message)"
    )
    parser.add_argument("--address", default="", help="udp roles: the IPv4 address to use")
    parser.add_argument("--window", type=int, default=64, help="uam roles: the window")
    parser.add_argument("--port", type=int, default=1, help="xdp roles: the U-Net port")
    args = parser.parse_args(argv)
    spec = Role(
        args.role,
        args.interface,
        args.cpu,
        args.count,
        args.size,
        args.address,
        args.window,
        args.port,
    )
    if spec.cpu is not None:
        os.sched_setaffinity(0, {spec.cpu})
    result = _udp(spec) if spec.role.startswith("udp") else _xdp(spec)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    # Delegate to the imported module so the classes are the package's own, not __main__ copies.
    from stacklib.bench.peers.xdp import _main as main

    sys.exit(main(sys.argv[1:]))
