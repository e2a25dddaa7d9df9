"""TCP bulk transfer over U-Net endpoints on the memory transport vs the kernel's TCP loopback.

Each run opens two endpoints on an in-process :class:`~stacklib.transports.memory.MemoryNetwork`
with ``ip`` and ``tcp`` stacks on them, connects, and sends ``size`` bytes in ``chunk``-byte
writes from node a to node b, timed by the wall clock from the first write until b has read
the last byte.  Segment sizes: 2048 bytes (paper 000 §7.8, U-Net TCP's standard) and 9 KB
(9140: IP over U-Net's 9180-byte MTU less the headers, §7.5).  In the same process and the same
run, trio's kernel TCP on 127.0.0.1 moves the same bytes (``trio.open_tcp_listeners`` /
``trio.open_tcp_stream``), so the ratio means something on a noisy machine.  Best of
``repeat``, the runs interleaved.

The data is seeded pseudo-random bytes (all-zero data would make every checksum trivially
cheap).  The window is 65535 bytes both ways (the largest without window scaling).  The 2048-byte
path runs twice: acknowledging every segment (paper 000 §7.8, U-Net TCP's default, on which the
target is judged) and acknowledging every second segment (RFC 5681 §4.2, a lone segment's ACK
delayed by :data:`DELAYED_ACK`), which halves the receiver's segments.

Figures: MB/s (10^6 bytes per second) and, for stacklib, data segments per second (the
sender's ``segments_out`` over the transfer: ``size / mss``, the data cut into whole segments).
Target: at least 30,000 segments per second of 2048 bytes on one core.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from stacklib.bench.result import Cell, Column, Result
from stacklib.layers.ip.driver import IpLayer, IpParams
from stacklib.layers.tcp.driver import TcpLayer, TcpParams, TcpStack
from stacklib.reporting import progress
from stacklib.services import UNetService
from stacklib.stack import Layer, open_stack
from stacklib.transports.memory import MemoryNetwork
from stacklib.unet import EndpointConfig, connect

__all__ = [
    "DELAYED_ACK",
    "TARGET_SEGMENTS_PER_S",
    "bench_tcp",
    "kernel_transfer",
    "stacklib_transfer",
]

#: The target: 2048-byte segments per second on one core.
TARGET_SEGMENTS_PER_S = 30_000
_A, _B = "10.0.0.1", "10.0.0.2"
_PORT = 5001
_WINDOW = 65535  # the largest window without window scaling
#: The optional ACK policy's delay for a lone segment: the 1 ms of U-Net TCP's timer (paper 000
#: §7.8); in a bulk transfer the second segment comes long before, so it acks every second one.
DELAYED_ACK = 0.001
_DELACK_TEXT = "delayed ACK 1 ms"


def _config(mss: int) -> EndpointConfig:
    buffer = 4096 if mss + 40 <= 4096 else 16384
    return EndpointConfig(
        segment_size=(32 + 48) * buffer + 64 * 1024,
        tx_buffers=32,
        tx_buffer_size=buffer,
        rx_buffers=48,
        rx_buffer_size=buffer,
        free_queue=64,
    )


async def _pump(
    send: Callable[[bytes], Awaitable[None]],
    receive: Callable[[int], Awaitable[bytes]],
    size: int,
    chunk: int,
) -> float:
    """Send ``size`` bytes in ``chunk``-byte writes while reading them; wall seconds."""
    # Seeded pseudo-random data: all-zero bytes would make every checksum trivially cheap
    # (their integer is 0), which real data never is.
    block = random.Random(chunk).randbytes(chunk)
    done = trio.Event()
    received = 0

    async def sink() -> None:
        nonlocal received
        while received < size:
            data = await receive(65536)
            if not data:
                break
            received += len(data)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sink)
        start = time.perf_counter()
        remaining = size
        while remaining > 0:
            piece = block if remaining >= chunk else block[:remaining]
            await send(piece)
            remaining -= len(piece)
        await done.wait()
        elapsed = time.perf_counter() - start
    if received != size:
        raise RuntimeError(f"bulk transfer delivered {received} of {size} bytes")
    return elapsed


async def stacklib_transfer(
    size: int, chunk: int, mss: int, delayed_ack: float = 0.0
) -> tuple[float, int]:
    """(wall seconds, segments the sender sent) for one transfer over the memory transport;
    ``delayed_ack`` > 0 has the receiver acknowledge every second segment (RFC 5681 §4.2)."""
    network = MemoryNetwork()
    a, b = network.add_node("a"), network.add_node("b")
    config = _config(mss)
    ep_a = a.os.create_endpoint(a.os.process("bulk-a"), config)
    ep_b = b.os.create_endpoint(b.os.process("bulk-b"), config)
    ch_a, ch_b = connect(ep_a, ep_b)
    tcp = TcpParams(
        mss=mss, send_buffer=_WINDOW, receive_buffer=_WINDOW, seed=1, delayed_ack=delayed_ack
    )
    layers_a: list[Layer[Any]] = [IpLayer(IpParams(address=_A, peers={_B: ch_a})), TcpLayer(tcp)]
    layers_b: list[Layer[Any]] = [IpLayer(IpParams(address=_B, peers={_A: ch_b})), TcpLayer(tcp)]
    async with (
        open_stack(UNetService(ep_a), layers_a) as top_a,
        open_stack(UNetService(ep_b), layers_b) as top_b,
    ):
        assert isinstance(top_a, TcpStack) and isinstance(top_b, TcpStack)
        listener = await top_b.listen(_PORT)
        client = await top_a.connect_to(_B, _PORT)
        server = await listener.accept()
        before = top_a.statistics()["segments_out"]
        elapsed = await _pump(client.send_all, server.receive_some, size, chunk)
        after = top_a.statistics()["segments_out"]
        assert isinstance(before, int) and isinstance(after, int)
        client.abort()
        server.abort()
        await listener.aclose()
    return elapsed, after - before


async def kernel_transfer(size: int, chunk: int) -> float:
    """Wall seconds for one transfer over the kernel's TCP on 127.0.0.1 (trio sockets)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    try:
        port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            accepted: list[trio.SocketStream] = []

            async def accept_one() -> None:
                accepted.append(await listeners[0].accept())

            nursery.start_soon(accept_one)
            client = await trio.open_tcp_stream("127.0.0.1", port)
        server = accepted[0]
        async with client, server:
            return await _pump(client.send_all, server.receive_some, size, chunk)
    finally:
        for listener in listeners:
            await listener.aclose()


def bench_tcp(size: int = 4 << 20, chunk: int = 65536, repeat: int = 3) -> Result:
    """Best-of-``repeat`` bulk transfers: stacklib TCP at 2048 and 9140-byte segments, and the
    kernel's TCP loopback, interleaved."""
    paths: list[tuple[str, int | None, float]] = [
        ("stacklib TCP, memory transport, MSS 2048", 2048, 0.0),
        (f"stacklib TCP, MSS 2048, ACK every 2nd segment ({_DELACK_TEXT})", 2048, DELAYED_ACK),
        ("stacklib TCP, memory transport, MSS 9140", 9140, 0.0),
        ("kernel TCP loopback (trio sockets)", None, 0.0),
    ]
    best: dict[str, tuple[float, int | None]] = {}
    with progress.step("transfers", repeat * len(paths)) as transfers:
        for _ in range(repeat):
            for name, mss, delack in paths:
                if mss is None:
                    elapsed, segments = trio.run(kernel_transfer, size, chunk), None
                else:
                    elapsed, sent = trio.run(stacklib_transfer, size, chunk, mss, delack)
                    segments = sent
                if name not in best or elapsed < best[name][0]:
                    best[name] = (elapsed, segments)
                transfers.advance()
    rows: list[dict[str, Cell]] = []
    for name, mss, _ in paths:
        elapsed, segments = best[name]
        rows.append(
            {
                "path": name,
                "mss": mss,
                "seconds": elapsed,
                "mb_per_s": size / elapsed / 1e6,
                "segments": segments,
                "segments_per_s": segments / elapsed if segments is not None else None,
            }
        )
    small = best[paths[0][0]]
    halved = best[paths[1][0]]
    kernel = best[paths[3][0]]
    small_rate = (small[1] or 0) / small[0]
    halved_rate = (halved[1] or 0) / halved[0]
    return Result(
        title=f"TCP bulk transfer, {size:,} bytes in {chunk:,}-byte writes, wall clock",
        columns=[
            Column("path", "path"),
            Column("mss", "MSS", "bytes"),
            Column("seconds", "time", "s", 4),
            Column("mb_per_s", "bandwidth", "MB/s", 2),
            Column("segments", "segments sent"),
            Column("segments_per_s", "segments/s", "", 0),
        ],
        rows=rows,
        facts={
            "segments_per_s_2048": small_rate,
            "target_segments_per_s": TARGET_SEGMENTS_PER_S,
            "meets_target": "yes" if small_rate >= TARGET_SEGMENTS_PER_S else "no",
            "segments_per_s_2048_ack_every_2nd": halved_rate,
            "kernel_to_stacklib_2048_ratio": small[0] / kernel[0],
            "size": size,
            "chunk": chunk,
            "repeat": repeat,
        },
        notes=[
            f"window {_WINDOW} bytes both ways; best of each over the repeats, interleaved",
            "ACK policy: every segment (paper 000 §7.8, the default; meets_target is judged on "
            f"it), and every second segment ({_DELACK_TEXT} for a lone one)",
            "the kernel's loopback MTU is 65536, so its segment count is not comparable",
        ],
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m stacklib.bench.tcp_bulk [--size N] [--chunk N] [--repeat N] [--json]``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", type=int, default=4 << 20, help="bytes per transfer")
    parser.add_argument("--chunk", type=int, default=65536, help="bytes per write")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is kept")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    result = bench_tcp(size=args.size, chunk=args.chunk, repeat=args.repeat)
    print(result.to_json() if args.json else result.format_table())


if __name__ == "__main__":
    main()
