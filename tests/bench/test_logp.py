"""The LogP workload recovers the parameters of synthetic stacks (paper 004 §4.1, Fig 3)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import pytest
import trio

from stacklib.bench import Session
from stacklib.bench.logp import (
    LogPParams,
    compute,
    fit_delays,
    run_logp,
    session_host,
    steady_interval,
)
from stacklib.bench.result import Result
from stacklib.services import DatagramService, UNetService
from stacklib.sim import Host, RealWorld, Simulation
from tests.bench.test_bandwidth import make_session, number, profile

SIZES = (4, 1000)


def simulate(params: LogPParams, send_us: float, recv_us: float, latency_us: float) -> Result:
    sim = Simulation(seed=1)
    session = make_session(sim, latency_us=latency_us, costs=profile(send_us, recv_us))
    return sim.run(run_logp, session, params)


@pytest.mark.parametrize(
    ("os_us", "or_us", "l_us"),
    [(5.0, 3.0, 20.0), (3.0, 7.0, 12.0)],
    ids=["sender-bound", "receiver-bound"],
)
def test_recovers_overheads_latency_and_gap(os_us: float, or_us: float, l_us: float) -> None:
    result = simulate(LogPParams(sizes=SIZES), os_us, or_us, l_us)
    assert [row["size"] for row in result.rows] == list(SIZES)
    for row in result.rows:
        assert number(row, "rtt_half_us") == pytest.approx(os_us + l_us + or_us, rel=0.02)
        assert number(row, "os_us") == pytest.approx(os_us, rel=0.02)
        assert number(row, "or_us") == pytest.approx(or_us, rel=0.02)
        assert number(row, "l_us") == pytest.approx(l_us, rel=0.02)
        # Raw U-Net does no flow control, so the sender's steady interval is its overhead
        # even when the receiver is slower (the receiver drops; see messages_lost).
        assert number(row, "g_us") == pytest.approx(os_us, rel=0.02)
        # The receive stream's steady interval: the slower of sender and receiver.
        assert number(row, "gr_us") == pytest.approx(max(os_us, or_us), rel=0.02)


def test_receiver_slower_than_sender_loses_messages_but_still_finishes() -> None:
    result = simulate(LogPParams(sizes=(64,), messages=100), 3.0, 7.0, 12.0)
    assert number(result.rows[0], "or_us") == pytest.approx(7.0, rel=0.02)
    assert number(result.facts, "messages_lost") > 0


class RequestReply(DatagramService):
    """A toy Active-Messages-style layer: every message is answered inside the library with a
    one-byte reply, and the sender's host pays for receiving that reply (paper 004 §4.1.4)."""

    def __init__(self, below: UNetService) -> None:
        self.below = below
        self._deliver, self._inbox = trio.open_memory_channel[tuple[int, bytes]](math.inf)

    @property
    def peers(self) -> Sequence[int]:
        return self.below.peers

    @property
    def max_message(self) -> int:
        return self.below.max_message - 1

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        await self.below.send(peer, b"\x00" + bytes(data))

    async def recv(self) -> tuple[int, bytes]:
        return await self._inbox.receive()

    async def pump(self) -> None:
        while True:
            peer, data = await self.below.recv()
            if data[:1] == b"\x01":
                continue  # a reply: consumed, its receive overhead paid
            await self.below.send(peer, b"\x01")
            await self._deliver.send((peer, data[1:]))


def test_request_reply_stacks_split_os_from_or_with_a_short_burst() -> None:
    os_us, or_us, l_us = 5.0, 3.0, 20.0

    async def main(sim: Simulation) -> Result:
        plain = make_session(sim, latency_us=l_us, costs=profile(os_us, or_us))
        layers = [RequestReply(s) for s in plain.services]  # type: ignore[arg-type]
        session = Session(sim, plain.network, layers, plain.peers)
        async with trio.open_nursery() as nursery:
            for layer in layers:
                nursery.start_soon(layer.pump)
            # A burst of 8 sends (40 us) ends before the first reply is back (53 us).
            result = await run_logp(session, LogPParams(sizes=SIZES, request_reply=True, burst=8))
            nursery.cancel_scope.cancel()
        return result

    sim = Simulation(seed=1)
    result = sim.run(main, sim)
    for row in result.rows:
        assert number(row, "os_us") == pytest.approx(os_us, rel=0.02)
        assert number(row, "or_us") == pytest.approx(or_us, rel=0.02)
        # Every request's reply costs the sender Or too: g = Os + Or.
        assert number(row, "g_us") == pytest.approx(os_us + or_us, rel=0.02)
        assert row["gr_us"] is None  # no receive stream for request-reply


def test_same_seed_gives_identical_rows() -> None:
    params = LogPParams(sizes=(16,), messages=50, iterations=20)
    first = simulate(params, 5.0, 3.0, 20.0)
    second = simulate(params, 5.0, 3.0, 20.0)
    assert first.rows == second.rows


async def test_runs_in_real_time_over_the_memory_transport() -> None:
    session = make_session(RealWorld())
    params = LogPParams(sizes=(4, 1000), messages=40, iterations=20, warmup=2, timeout=0.05)
    result = await run_logp(session, params)
    assert [row["size"] for row in result.rows] == [4, 1000]
    for row in result.rows:
        assert number(row, "rtt_half_us") > 0
        assert number(row, "g_us") > 0


def test_fit_delays_averages_the_slope_one_part() -> None:
    # g(D) = 5 + max(2, D): flat up to Idle = 2, then slope 1.
    points: list[tuple[float, float | None]] = [(d, 5 + max(2.0, d)) for d in (1, 2, 3, 6, 10)]
    fit = fit_delays(7.0, points)
    assert fit.intercept == pytest.approx(5.0)
    assert [d for d, _ in fit.points] == [3, 6, 10]
    assert fit.slope == pytest.approx(1.0)
    assert fit.idle(7.0) == pytest.approx(2.0)
    flat = fit_delays(7.0, [(1.0, 7.0), (2.0, 7.1), (3.0, None)])
    assert (flat.intercept, flat.points, flat.slope, flat.idle(7.0)) == (None, (), None, None)


def test_steady_interval_skips_the_start() -> None:
    # A fast start while queues fill, then one message every 2 s.
    times = [0.0, 0.1, 0.2, 0.3, 2.3, 4.3, 6.3, 8.3]
    assert steady_interval(times) == pytest.approx(2.0)
    assert steady_interval([1.0, 4.0]) == pytest.approx(3.0)
    assert steady_interval([1.0]) is None


def test_compute_holds_the_host_cpu_in_virtual_time() -> None:
    async def main(sim: Simulation) -> tuple[float, float]:
        host = Host("h", sim)
        start = trio.current_time()
        # A charge already queued on the CPU delays the computation behind it.
        host.resource("cpu").hold(3e-6)
        await compute(sim, host, 10e-6)
        return trio.current_time() - start, host.resource("cpu").busy_time

    sim = Simulation()
    elapsed, busy = sim.run(main, sim)
    assert elapsed == pytest.approx(13e-6)
    assert busy == pytest.approx(13e-6)


async def test_compute_busy_waits_in_real_time() -> None:
    session = make_session(RealWorld())
    host = session_host(session, 0)
    assert host is not None
    start = time.perf_counter()
    await compute(session, host, 0.002)
    assert time.perf_counter() - start >= 0.002  # a lower bound, by construction


def test_a_simulated_computation_needs_a_host() -> None:
    sim = Simulation()
    with pytest.raises(ValueError, match="needs the host"):
        sim.run(compute, sim, None, 1e-6)


def test_session_host_finds_node_hosts_in_order() -> None:
    sim = Simulation()
    session = make_session(sim)
    hosts = [session_host(session, i) for i in range(3)]
    assert [h.name if h else None for h in hosts] == ["node0", "node1", None]
