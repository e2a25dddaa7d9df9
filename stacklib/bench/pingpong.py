"""Ping-pong: round-trip time against message size (paper 000 Fig 3, paper 004 §4).

One side sends a message of ``size`` bytes, the other echoes it back, ``iterations`` times per
size after ``warmup`` untimed round trips.  Time comes from trio, so the same workload measures
virtual time on a simulated NI and real time on a real transport.
"""

from __future__ import annotations

import math
import statistics as stats
import time
import typing
from collections.abc import Sequence

import attrs
import trio
import trio.lowlevel

from stacklib.bench.params import check_sizes, count_valid, sizes_valid
from stacklib.bench.result import Cell, Column, Result
from stacklib.bench.workload import Session, WorkloadKind, register_workload
from stacklib.reporting import progress
from stacklib.services import DatagramService, UNetService


@attrs.frozen
class PingPongParams:
    """Recipe parameters of the ping-pong workload."""

    sizes: tuple[int, ...] = attrs.field(
        default=(0, 16, 40, 100, 500, 1000, 1500), converter=tuple, validator=sizes_valid
    )
    iterations: int = attrs.field(default=1000, validator=count_valid(1))
    warmup: int = attrs.field(default=10, validator=count_valid(0))


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``samples`` (not empty): the smallest sample that at
    least ``fraction`` of them do not exceed."""
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered), math.ceil(fraction * len(ordered))) - 1)]


def round_trip_row(size: int, samples: Sequence[float]) -> dict[str, Cell]:
    """One size's row from its round-trip times in seconds (not empty): mean, min, median and
    99th percentile in microseconds, and round trips per second."""
    mean = stats.fmean(samples)
    return {
        "size": size,
        "rtt_us": mean * 1e6,
        "min_us": min(samples) * 1e6,
        "median_us": stats.median(samples) * 1e6,
        "p99_us": percentile(samples, 0.99) * 1e6,
        "round_trips_per_s": 1.0 / mean if mean > 0 else None,
    }


def round_trip_result(rows: list[dict[str, Cell]], messages: int, wall: float) -> Result:
    """The ping-pong table of ``rows`` (:func:`round_trip_row`), ``messages`` sent in all in
    ``wall`` seconds."""
    return Result(
        title="ping-pong round-trip time",
        columns=[
            Column("size", "size", "bytes"),
            Column("rtt_us", "RTT mean", "us", 2),
            Column("min_us", "RTT min", "us", 2),
            Column("median_us", "RTT median", "us", 2),
            Column("p99_us", "RTT p99", "us", 2),
            Column("round_trips_per_s", "round trips/s", "", 0),
        ],
        rows=rows,
        facts={
            "messages": messages,
            "wall_seconds": wall,
            "messages_per_wall_second": messages / wall if wall > 0 else None,
        },
    )


async def echo(service: DatagramService) -> None:
    """Send every message back to where it came from, forever."""
    if type(service) is UNetService:
        # Raw U-Net: the endpoint's own calls, one coroutine frame fewer per message (the
        # wrapper only renames them); the same operations in the same order.
        endpoint = service.endpoint
        send, recv = endpoint.send, endpoint.recv
        while True:
            message = await recv()
            await send(message.channel, message.data)
    while True:
        peer, data = await service.recv()
        await service.send(peer, data)


async def pingpong(
    client: DatagramService, server: DatagramService, peer: int, params: PingPongParams
) -> Result:
    """Measure round trips from ``client`` to ``server`` (reached as ``peer``) and back.

    A size above ``client.max_message`` raises :class:`~stacklib.errors.ConfigError` before
    anything is sent."""
    check_sizes(params.sizes, client.max_message)
    rows: list[dict[str, Cell]] = []
    wall_start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo, server)
        with progress.step("sizes", len(params.sizes)) as sweep:
            for size in params.sizes:
                message = bytes(i & 0xFF for i in range(size))
                for _ in range(params.warmup):
                    await client.send(peer, message)
                    await client.recv()
                samples = []
                # trio.current_time() is this clock's current_time() behind a look-up of the run.
                now = trio.lowlevel.current_clock().current_time
                if type(client) is UNetService:
                    # Raw U-Net: the endpoint's own calls, as in echo().
                    endpoint = client.endpoint
                    send, recv = endpoint.send, endpoint.recv
                    for _ in range(params.iterations):
                        start = now()
                        await send(peer, message)
                        reply = (await recv()).data
                        samples.append(now() - start)
                        if reply != message:
                            raise RuntimeError(f"ping-pong reply of {len(reply)} bytes differs")
                else:
                    for _ in range(params.iterations):
                        start = now()
                        await client.send(peer, message)
                        _, reply = await client.recv()
                        samples.append(now() - start)
                        if reply != message:
                            raise RuntimeError(f"ping-pong reply of {len(reply)} bytes differs")
                rows.append(round_trip_row(size, samples))
                sweep.advance()
        nursery.cancel_scope.cancel()
    wall = time.perf_counter() - wall_start
    messages = 2 * (params.iterations + params.warmup) * len(params.sizes)
    return round_trip_result(rows, messages, wall)


async def _run_pingpong(session: Session, params: PingPongParams) -> Result:
    # The recipe loader checked that the stack's top provides DatagramService.
    client = typing.cast(DatagramService, session.services[0])
    server = typing.cast(DatagramService, session.services[1])
    return await pingpong(client, server, session.peers[0][1], params)


PINGPONG = register_workload(
    WorkloadKind(
        name="pingpong",
        Params=PingPongParams,
        run=_run_pingpong,
        description="round-trip time vs message size between two nodes",
    )
)
