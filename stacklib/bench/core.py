"""Raw U-Net ping-pong over the memory transport vs a bare trio memory-channel ping-pong.

Both run in the same process and the same run, so the ratio is meaningful on a noisy machine
(compared side by side, in one run).  Target: the U-Net round trip
costs at most 2x the bare trio channel round trip.
"""

from __future__ import annotations

import time

import trio

from stacklib.bench.result import Cell, Column, Result
from stacklib.reporting import progress
from stacklib.transports.memory import MemoryNetwork
from stacklib.unet import Endpoint, connect


async def _unet_pingpong(iterations: int, size: int) -> float:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    ep_a: Endpoint = a.os.create_endpoint(a.os.process("ping"))
    ep_b: Endpoint = b.os.create_endpoint(b.os.process("pong"))
    ch_a, ch_b = connect(ep_a, ep_b)
    message = bytes(size)

    async def pong() -> None:
        recv, send = ep_b.recv, ep_b.send
        for _ in range(iterations):
            await send(ch_b, (await recv()).data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pong)
        recv, send = ep_a.recv, ep_a.send
        start = time.perf_counter()
        for _ in range(iterations):
            await send(ch_a, message)
            await recv()
        elapsed = time.perf_counter() - start
    return elapsed / iterations


async def _trio_pingpong(iterations: int, size: int) -> float:
    to_b_send, to_b_recv = trio.open_memory_channel[bytes](64)
    to_a_send, to_a_recv = trio.open_memory_channel[bytes](64)
    message = bytes(size)

    async def pong() -> None:
        for _ in range(iterations):
            await to_a_send.send(await to_b_recv.receive())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pong)
        start = time.perf_counter()
        for _ in range(iterations):
            await to_b_send.send(message)
            await to_a_recv.receive()
        elapsed = time.perf_counter() - start
    return elapsed / iterations


def bench_core(iterations: int = 20000, size: int = 40, repeat: int = 3) -> Result:
    """Best-of-``repeat`` round-trip cost of both, interleaved so drift hits both alike."""
    unet: list[float] = []
    bare: list[float] = []
    with progress.step("runs", 2 * repeat) as runs:
        for _ in range(repeat):
            unet.append(trio.run(_unet_pingpong, iterations, size))
            runs.advance()
            bare.append(trio.run(_trio_pingpong, iterations, size))
            runs.advance()
    best_unet, best_bare = min(unet), min(bare)
    rows: list[dict[str, Cell]] = [
        {"path": path, "rtt_us": rtt * 1e6, "round_trips_per_s": 1.0 / rtt}
        for path, rtt in (
            ("U-Net endpoints, memory transport", best_unet),
            ("bare trio memory channels", best_bare),
        )
    ]
    return Result(
        title=f"raw U-Net vs trio channel ping-pong, {size}-byte messages",
        columns=[
            Column("path", "path"),
            Column("rtt_us", "round trip", "us", 2),
            Column("round_trips_per_s", "round trips/s", "", 0),
        ],
        rows=rows,
        facts={
            "ratio_unet_to_trio": best_unet / best_bare,
            "send_plus_receive_us": best_unet * 1e6 / 2,
            "iterations": iterations,
            "repeat": repeat,
        },
        notes=["best of each over the repeats; runs interleaved in one process"],
    )
