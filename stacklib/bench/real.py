"""Real transports between two processes, side by side in one run (issue 6; paper 000 §1, §4).

U-Net's claim is that taking the kernel off the data path makes communication an order of
magnitude faster.  This benchmark measures it on today's machine, between two real processes:

* 40-byte ping-pong over the shm transport (busy-polling, and trio tasks that spin then block)
  against the same ping-pong over kernel UDP sockets (blocking ``sendto``/``recvfrom``, the
  fastest kernel path; and, if built, U-Net over the udp transport);
* one-way message rate over shm with 40-byte messages;
* bulk bandwidth over shm with 64 KiB messages.

Targets: shm round trip at least 10x below kernel UDP and at most 10 us; at least 100,000
messages/s; at least 1 GB/s.  With 2 cores, two busy-polling processes use the whole machine
(PERFORMANCE-NOTES.md "Between two processes"), so other load on the machine shows directly.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator

import trio

from stacklib.bench.result import Cell, Column, Result
from stacklib.transports.shm import (
    PeerSpec,
    ShmAddress,
    ShmEndpoint,
    ShmNetwork,
    relax,
    spawn_peer,
)
from stacklib.unet import EndpointConfig

_BULK = 65536


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """Run this process on ``cpu`` (None: leave it alone), restoring the old set after."""
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def _placement(same_cpu: bool) -> tuple[int | None, int | None]:
    """(this process's CPU, the peer's CPU): two different CPUs, or both on CPU 0."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None, None
    return (cpus[0], cpus[0]) if same_cpu else (cpus[0], cpus[1])


def _open(network: ShmNetwork, config: EndpointConfig | None = None) -> tuple[ShmEndpoint, int]:
    node = network.add_node("main")
    endpoint = node.os.create_endpoint(node.os.process("bench"), config, port=1)
    if not isinstance(endpoint, ShmEndpoint):
        raise TypeError(f"expected a ShmEndpoint, got {endpoint!r}")
    channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress("peer", 1))
    return endpoint, channel


def _wait_attached(endpoint: ShmEndpoint, channel: int, timeout: float = 30.0) -> None:
    link = endpoint.ni.link(endpoint, channel)
    deadline = time.monotonic() + timeout
    while not link.peer_attached:
        if time.monotonic() > deadline:
            raise TimeoutError("the shm peer process did not attach")
        time.sleep(0.001)


def shm_pingpong(iterations: int, size: int = 40, mode: str = "poll", warmup: int = 200) -> float:
    """Mean round trip (s) of ``size``-byte messages to an echoing peer process over shm."""
    with ShmNetwork() as network:
        endpoint, channel = _open(network)
        peer = spawn_peer(PeerSpec(network.directory, "peer", 1, "main", 1, role="echo", mode=mode))
        try:
            _wait_attached(endpoint, channel)
            message = bytes(size)
            if mode == "trio":
                return trio.run(_trio_pingpong, endpoint, channel, message, iterations, warmup)
            send, poll = endpoint.send_nowait, endpoint.poll
            spins = 0
            for _ in range(warmup):
                send(channel, message)
                while poll() is None:
                    spins += 1
                    relax(spins)
            start = time.perf_counter()
            for _ in range(iterations):
                send(channel, message)
                while poll() is None:
                    spins += 1
                    relax(spins)
            return (time.perf_counter() - start) / iterations
        finally:
            peer.kill()
            peer.join(5)


async def _trio_pingpong(
    endpoint: ShmEndpoint, channel: int, message: bytes, iterations: int, warmup: int
) -> float:
    send, recv = endpoint.send, endpoint.recv
    for _ in range(warmup):
        await send(channel, message)
        await recv()
    start = time.perf_counter()
    for _ in range(iterations):
        await send(channel, message)
        await recv()
    return (time.perf_counter() - start) / iterations


def shm_stream(count: int, size: int) -> float:
    """Seconds for a peer process to stream ``count`` messages of ``size`` bytes to this one,
    from the first arrival to the last (the receiver busy-polls)."""
    ring = 4 << 20
    peer_config = EndpointConfig(
        segment_size=1 << 20, tx_buffers=4, tx_buffer_size=max(size, 64), rx_buffers=1
    )
    mine, theirs = _placement(False)
    with ShmNetwork(ring_bytes=ring, max_message=max(size, 64)) as network, pinned(mine):
        endpoint, channel = _open(network)
        peer = spawn_peer(
            PeerSpec(
                network.directory,
                "peer",
                1,
                "main",
                1,
                role="source",
                count=count,
                size=size,
                ring_bytes=ring,
                max_message=max(size, 64),
                cpu=theirs,
                config=peer_config,
            )
        )
        try:
            poll = endpoint.poll
            deadline = time.monotonic() + 30
            while (first := poll()) is None:
                if time.monotonic() > deadline or not peer.is_alive():
                    raise RuntimeError("the shm source process sent nothing")
            start = time.perf_counter()
            received = 1 if first.data else 0
            idle = 0
            while True:
                message = poll()
                if message is None:
                    idle += 1
                    relax(idle)
                    if idle & 0xFFFFF == 0 and not peer.is_alive():
                        raise RuntimeError("the shm source process died mid-stream")
                    continue
                if not message.data:
                    break
                received += 1
            elapsed = time.perf_counter() - start
            endpoint.send_nowait(channel, b"done")
            if received != count:
                raise RuntimeError(f"shm stream lost messages: {received} of {count}")
            # The first message's arrival starts the clock, so count-1 intervals were timed.
            return elapsed * count / max(count - 1, 1)
        finally:
            peer.join(5)
            if peer.is_alive():
                peer.kill()
                peer.join(5)


def _udp_echo(port_out: object, cpu: int | None) -> None:
    """A kernel UDP echo server in its own process (blocking socket)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port_out.put(sock.getsockname()[1])  # type: ignore[attr-defined]
    while True:
        data, peer = sock.recvfrom(65536)
        if data == b"stop":
            return
        sock.sendto(data, peer)


def udp_pingpong(
    iterations: int, size: int = 40, warmup: int = 200, same_cpu: bool = False
) -> float:
    """Mean round trip (s) over kernel UDP sockets between two processes (blocking I/O)."""
    import multiprocessing

    mine, theirs = _placement(same_cpu)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    peer = context.Process(target=_udp_echo, args=(queue, theirs), daemon=True)
    peer.start()
    try:
        with pinned(mine):
            address = ("127.0.0.1", queue.get(timeout=30))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.settimeout(5)
                message = bytes(size)
                send, recv = sock.send, sock.recv
                for _ in range(warmup):
                    send(message)
                    recv(65536)
                start = time.perf_counter()
                for _ in range(iterations):
                    send(message)
                    recv(65536)
                elapsed = (time.perf_counter() - start) / iterations
                send(b"stop")
        return elapsed
    finally:
        peer.join(5)
        if peer.is_alive():
            peer.kill()
            peer.join(5)


def _best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def bench_real(
    iterations: int = 20000,
    messages: int = 200000,
    bulk_messages: int = 20000,
    repeat: int = 3,
    size: int = 40,
) -> Result:
    """All the measurements, best of ``repeat`` each, interleaved in one run.

    Both processes are pinned to two different CPUs (the U-Net case: two applications, two
    processors); kernel UDP is also measured with both processes on one CPU, where a wake-up
    is a cheap same-CPU switch (PERFORMANCE-NOTES.md), for completeness.
    """
    few = max(iterations // 10, 10)
    runs: dict[str, list[float]] = {}
    plan: list[tuple[str, Callable[[], float]]] = [
        ("shm", lambda: shm_pingpong(iterations, size, "poll")),
        ("udp", lambda: udp_pingpong(few, size)),
        ("trio", lambda: shm_pingpong(few, size, "trio")),
        ("udp1", lambda: udp_pingpong(few, size, same_cpu=True)),
        ("rate", lambda: shm_stream(messages, size)),
        ("bulk", lambda: shm_stream(bulk_messages, _BULK)),
    ]
    for _ in range(repeat):
        for key, run in plan:
            runs.setdefault(key, []).append(run())
    best = {key: min(values) for key, values in runs.items()}
    rtt_shm, rtt_udp = best["shm"], best["udp"]
    per_second = messages / best["rate"]
    bandwidth = bulk_messages * _BULK / best["bulk"]
    ratio = rtt_udp / rtt_shm
    rows: list[dict[str, Cell]] = [
        {
            "measurement": f"{size} B ping-pong, shm, busy-poll (2 CPUs)",
            "value": rtt_shm * 1e6,
            "unit": "us RTT",
            "target": "<= 10 us and >= 10x below UDP",
            "met": "yes" if rtt_shm <= 10e-6 and ratio >= 10 else "no",
        },
        {
            "measurement": f"{size} B ping-pong, shm, trio await: spin then block (2 CPUs)",
            "value": best["trio"] * 1e6,
            "unit": "us RTT",
            "target": "-",
            "met": "-",
        },
        {
            "measurement": f"{size} B ping-pong, kernel UDP, blocking sockets (2 CPUs)",
            "value": rtt_udp * 1e6,
            "unit": "us RTT",
            "target": "baseline",
            "met": "-",
        },
        {
            "measurement": f"{size} B ping-pong, kernel UDP, blocking sockets (1 CPU)",
            "value": best["udp1"] * 1e6,
            "unit": "us RTT",
            "target": "-",
            "met": "-",
        },
        {
            "measurement": f"one-way message rate, shm, {size} B",
            "value": per_second,
            "unit": "msgs/s",
            "target": ">= 100,000",
            "met": "yes" if per_second >= 100_000 else "no",
        },
        {
            "measurement": "bulk bandwidth, shm, 64 KiB messages",
            "value": bandwidth / 1e9,
            "unit": "GB/s",
            "target": ">= 1",
            "met": "yes" if bandwidth >= 1e9 else "no",
        },
    ]
    return Result(
        title="U-Net between two processes: shared memory vs kernel UDP (one run)",
        columns=[
            Column("measurement", "measurement"),
            Column("value", "value", "", 2),
            Column("unit", "unit"),
            Column("target", "target"),
            Column("met", "met"),
        ],
        rows=rows,
        facts={
            "udp_to_shm_rtt_ratio": ratio,
            "udp_1cpu_to_shm_rtt_ratio": best["udp1"] / rtt_shm,
            "iterations": iterations,
            "messages": messages,
            "bulk_messages": bulk_messages,
            "repeat": repeat,
        },
        notes=[
            "best of each over the repeats; each side is its own process (spawn start method)",
            "2 CPUs: this process on one CPU, the peer on the other (sched_setaffinity)",
        ],
    )


if __name__ == "__main__":
    print(bench_real().format_table())
