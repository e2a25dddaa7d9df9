"""UAM's ``await`` calls on the lean path: a reply within the hot spin is taken without yielding,
calls that did not wait yield every ``YIELD_EVERY``-th time, and every call stays a
cancellation point."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
import trio.lowlevel

from stacklib.bench import real_am
from stacklib.bench.real import _wait_attached, open_endpoint
from stacklib.layers.uam import UamLayer, UamParams, UamService
from stacklib.layers.uam.lean_path import YIELD_EVERY
from stacklib.services import UNetService
from stacklib.transports.shm import ShmEndpoint, ShmNetwork
from stacklib.unet.polled import others_runnable
from tests.transports.ticker import Ticker

ECHO, REPLY, READY = real_am._UAM_ECHO, real_am._UAM_REPLY, real_am._UAM_READY
PARAMS = UamParams(max_retries=1000)


@contextmanager
def _served(hot_spin: float) -> Iterator[tuple[ShmEndpoint, int]]:
    """This side's endpoint (its NI polling ``hot_spin`` seconds without yielding) and channel
    to a peer process whose UAM answers every request from its background poller."""
    with ShmNetwork(spin_time=1.0, hot_spin=hot_spin) as network:
        endpoint, channel = open_endpoint(network, name="main", remote="peer")
        peer = multiprocessing.get_context("spawn").Process(
            target=real_am._uam_peer,
            args=(network.directory, None, "request", "trio", 1.0, True),
            daemon=True,
        )
        peer.start()
        try:
            _wait_attached(endpoint, channel)
            yield endpoint, channel
        finally:
            peer.kill()
            peer.join(10)


class _Client:
    """This side's handlers (those of the benchmark's client: the peer replies to REPLY and
    says it is ready with READY) and a request/reply round trip through the await calls."""

    def __init__(self, am: UamService) -> None:
        self.am = am
        self.replies = 0
        self.ready = False
        am.register_handler(lambda peer, *words: None, ECHO)
        am.register_handler(self._reply, REPLY)
        am.register_handler(self._hello, READY)

    def _reply(self, peer: int, *words: int) -> None:
        self.replies += 1

    def _hello(self, peer: int) -> None:
        self.ready = True

    async def round_trip(self, channel: int) -> None:
        target = self.replies + 1
        await self.am.request(channel, ECHO, 1, 2, 3, 4)
        await self.am.wait_until(lambda: self.replies >= target)


async def _ticks_during(hot_spin: float, round_trips: int) -> int:
    """How often another task ran while this one made ``round_trips`` request/reply round
    trips through the ``await`` calls, its NI's hot spin ``hot_spin``."""
    with _served(hot_spin) as (endpoint, channel):
        async with UamLayer(PARAMS).open(UNetService(endpoint)) as am:
            client = _Client(am)
            with trio.fail_after(60):
                await am.wait_until(lambda: client.ready)
                ticker = Ticker()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(ticker.run)
                    await trio.lowlevel.checkpoint()
                    before = ticker.ticks
                    for _ in range(round_trips):
                        await client.round_trip(channel)
                    ran = ticker.ticks - before
                    nursery.cancel_scope.cancel()
                await am.drain()
    return ran


@pytest.mark.parametrize("hot_spin", [5.0, 0.0])  # 5 s: slack for a loaded machine
async def test_a_reply_within_hot_spin_is_taken_without_yielding(hot_spin: float) -> None:
    ran = await _ticks_during(hot_spin, 3)
    if hot_spin:
        assert ran == 0  # (3 calls: none of them the YIELD_EVERY-th)
    else:
        assert ran > 0


async def test_calls_that_did_not_wait_yield_every_yield_every_calls() -> None:
    # 4 x YIELD_EVERY await calls (two a round trip); the receive task's own skipped passes
    # count too, so the application's yields fall about every YIELD_EVERY calls, not exactly.
    ran = await _ticks_during(5.0, 2 * YIELD_EVERY)
    assert 2 <= ran <= 16  # not once per call


async def test_every_request_is_a_cancellation_point() -> None:
    with _served(5.0) as (endpoint, channel):
        async with UamLayer(PARAMS).open(UNetService(endpoint)) as am:
            client = _Client(am)
            with trio.fail_after(30):
                await am.wait_until(lambda: client.ready)
                await client.round_trip(channel)
                sent = am.statistics()["sent"]
                with trio.CancelScope() as scope:
                    scope.cancel()
                    await am.request(channel, ECHO, 1, 2, 3, 4)
                assert scope.cancelled_caught
                assert am.statistics()["sent"] == sent  # nothing went out
                await am.drain()


async def test_the_receive_task_spins_hot_only_while_nothing_else_can_run() -> None:
    """With background polling the receive task polls between checkpoints for the hot spin,
    but yields at once whenever another task is ready to run."""
    with ShmNetwork(spin_time=1.0, hot_spin=5.0) as network:
        endpoint, _ = open_endpoint(network, name="main", remote="peer")  # nobody there
        async with UamLayer(PARAMS).open(UNetService(endpoint)):
            ticker = Ticker()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker.run)
                await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
    assert ticker.ticks > 100  # a receive task keeping the CPU for 5 s would allow ~1


def test_others_runnable_reads_trio_s_run_queue() -> None:
    assert others_runnable()  # outside a run: yield, to be safe

    async def main() -> list[bool]:
        seen = [others_runnable()]  # the only task
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 0)
            seen.append(others_runnable())  # the new task waits to run
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
            seen.append(others_runnable())
        return seen

    assert trio.run(main) == [False, True, False]


@pytest.mark.parametrize(
    ("spin", "hot_spin_us", "expected"),
    [
        (50e-6, None, (20e-6, 50e-6)),  # the NI's hot spin, within its spin
        (50e-6, 200.0, (200e-6, 200e-6)),  # the layer's, the spin stretched to hold it
        (0.0, 200.0, (0.0, 0.0)),  # an NI that does not spin: no hot spin either
    ],
)
async def test_the_hot_spin_is_the_nis_or_the_layers(
    spin: float, hot_spin_us: float | None, expected: tuple[float, float]
) -> None:
    with ShmNetwork(spin_time=spin, hot_spin=20e-6) as network:
        endpoint, _ = open_endpoint(network, name="main", remote="peer")
        params = UamParams(hot_spin_us=hot_spin_us)
        async with UamLayer(params).open(UNetService(endpoint)) as am:
            assert (am.path.hot_spin, am.path.spin) == pytest.approx(expected)
    with pytest.raises(ValueError):
        UamParams(hot_spin_us=-1.0)
