"""UAM's event path: in virtual time over a simulated U-Net endpoint, receive, handlers,
transmission and timers run as the simulator's callbacks (docs/uam.md, "In virtual time").

It must give the figures of the task path it replaced, deliver exactly once and in order over
a faulty fabric, wake a waiting task only when what it waits for may have happened, and skip
schedule points only where trio would change nothing."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import TypeVar

import pytest
import trio

from stacklib.experiments import uam as experiments
from stacklib.layers.uam import EventPath, TaskPath, UamLayer, UamParams, UamService
from stacklib.services import UNetService
from stacklib.sim import Simulation
from stacklib.transports.memory import MemoryNetwork
from stacklib.transports.sim import AtmParams, build_atm
from stacklib.transports.sim.params import FaultParams
from stacklib.unet import Endpoint, EndpointConfig, connect

C = TypeVar("C")
CONFIG = EndpointConfig(segment_size=512 * 1024, tx_buffers=32, rx_buffers=48, free_queue=64)


@pytest.fixture
def task_path() -> Iterator[None]:
    """Run UAM with its three tasks instead of the event path (for comparisons)."""
    UamService.event_path = False
    try:
        yield
    finally:
        UamService.event_path = True


def atm_cluster(
    sim: Simulation,
    names: list[str],
    faults: FaultParams | None = None,
    configs: dict[str, EndpointConfig] | None = None,
) -> list[Endpoint]:
    """An SBA-200 cluster and an endpoint on each node (``configs[name]``, else CONFIG)."""
    cluster = build_atm(sim, AtmParams(host="ss20", faults=faults or FaultParams()), names, None)
    return [
        cluster.nodes[name].os.create_endpoint(
            cluster.nodes[name].os.process(name), (configs or {}).get(name, CONFIG)
        )
        for name in names
    ]


def test_the_event_path_is_taken_over_simulated_unet_only() -> None:
    sim = Simulation(seed=1)
    ep_a, _ = atm_cluster(sim, ["a", "b"])
    assert isinstance(UamService(UNetService(ep_a), UamParams()).path, EventPath)
    real = MemoryNetwork().add_node("r")
    endpoint = real.os.create_endpoint(real.os.process("p"), CONFIG)
    assert UamService(UNetService(endpoint), UamParams()).path.name == "lean"

    class Wrapped(UNetService):  # a service that changes send: it lends no endpoint
        async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
            await super().send(peer, data)

        def capability(self, kind: type[C]) -> C | None:
            return None

    wrapped = UamService(Wrapped(ep_a), UamParams())
    assert isinstance(wrapped.path, TaskPath)
    assert wrapped.host_costs is None  # nothing to charge them to either


async def _exchange(a: UamService, b: UamService, to_b: int, to_a: int) -> list[object]:
    """Requests, a store, a get: what arrived and when each step completed."""
    got: list[tuple[int, ...]] = []
    done: list[str] = []
    b.register_handler(lambda peer, *args: b.reply("pong", *args), name="ping")
    b.register_handler(lambda peer, *args: None, name="pong")
    a.register_handler(lambda peer, *args: None, name="ping")
    a.register_handler(lambda peer, *args: got.append(args), name="pong")
    a.register_handler(lambda *args: done.append("got"), name="fetched")
    b.register_handler(lambda *args: done.append("stored"), name="fetched")
    region_a, region_b = bytearray(20000), bytearray(20000)
    a.register_region(region_a)
    b.register_region(region_b)
    block = random.Random(5).randbytes(20000)
    times = []
    for i in range(20):
        await a.request(to_b, "ping", i)
    await a.wait_until(lambda: len(got) == 20)
    times.append(trio.current_time())
    await a.store(to_b, block, (0, 0), "fetched")
    await a.drain()
    times.append(trio.current_time())
    await a.get(to_b, (0, 0), 20000, (0, 0), "fetched")
    await a.wait_until(lambda: "got" in done)
    times.append(trio.current_time())
    return [got, bytes(region_a) == block == bytes(region_b), done, times]


def test_the_event_path_gives_the_task_paths_results() -> None:
    events = experiments.run_pair(_exchange)
    UamService.event_path = False
    try:
        tasks = experiments.run_pair(_exchange)
    finally:
        UamService.event_path = True
    assert isinstance(events, list) and isinstance(tasks, list)
    assert events[:3] == tasks[:3]
    assert events[0] == [(i,) for i in range(20)] and events[1] is True
    # The same modeled costs; only the order of simultaneous holds may differ.
    assert events[3] == pytest.approx(tasks[3], rel=0.01)


def test_the_single_cell_round_trip_is_unchanged(task_path: None) -> None:
    before = experiments.single_cell_rtt(round_trips=5)
    UamService.event_path = True
    assert experiments.single_cell_rtt(round_trips=5) == pytest.approx(before, rel=1e-9)


def test_exactly_once_in_order_over_a_faulty_fabric() -> None:
    sim = Simulation(seed=3)
    # Per cell: a 4 KB chunk is some 90 cells, so these lose about one chunk in four.
    faults = FaultParams(loss=0.002, corrupt=0.001, duplicate=0.05, reorder=0.05)
    ep_a, ep_b = atm_cluster(sim, ["a", "b"], faults)
    to_b, to_a = connect(ep_a, ep_b)
    result: dict[str, object] = {}
    layer = UamLayer(UamParams(rto_us=2000.0, max_retries=50))

    async def main() -> None:
        with trio.fail_after(60):
            async with layer.open(UNetService(ep_a)) as a, layer.open(UNetService(ep_b)) as b:
                got: list[int] = []
                b.register_handler(lambda peer, i: got.append(i), index=0)
                region = bytearray(30000)
                b.register_region(region)
                b.register_handler(lambda *args: None, index=1)
                a.register_region(bytearray(1))
                block = random.Random(9).randbytes(30000)
                for i in range(400):
                    await a.request(to_b, 0, i)
                await a.store(to_b, block, (0, 0), 1)
                await a.drain()
                result.update(
                    got=list(got),
                    same=bytes(region) == block,
                    a=a.peer_statistics(to_b),
                    b=b.peer_statistics(to_a),
                )

    sim.run(main)
    assert result["got"] == list(range(400))
    assert result["same"] is True
    stats_a, stats_b = result["a"], result["b"]
    assert stats_a.retransmitted > 0  # type: ignore[attr-defined]
    assert stats_b.duplicates + stats_b.out_of_order > 0  # type: ignore[attr-defined]


def test_a_waiting_task_sleeps_through_arrivals_it_does_not_wait_for() -> None:
    sim = Simulation(seed=1)
    ep_a, ep_b, ep_c = atm_cluster(sim, ["a", "b", "c"])
    _, b_to_a = connect(ep_a, ep_b)
    c_to_a, _ = connect(ep_c, ep_a)
    steps: list[int] = [0]
    flag: list[bool] = [False]

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith("waiter"):
                steps[0] += 1

    async def main() -> None:
        trio.lowlevel.add_instrument(Steps())
        layer = UamLayer(UamParams())
        async with (
            layer.open(UNetService(ep_a)) as a,
            layer.open(UNetService(ep_b)) as b,
            layer.open(UNetService(ep_c)) as c,
        ):
            a.register_handler(lambda peer: None, index=0)  # c's requests: noise for the waiter
            a.register_handler(lambda peer: flag.__setitem__(0, True), index=1)

            async def waiter() -> None:
                await a.wait_until(lambda: flag[0])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                for _ in range(200):
                    await c.request(c_to_a, 0)
                await c.drain()
                await b.request(b_to_a, 1)

    sim.run(main)
    assert flag[0]
    assert steps[0] <= 3  # started, parked, woken once by b's request (not 200 times by c's)


def test_skipped_schedule_points_change_no_time() -> None:
    def run(inline: bool) -> list[float]:
        sim = Simulation(seed=2, inline_charges=inline)
        ep_a, ep_b = atm_cluster(sim, ["a", "b"])
        to_b, _ = connect(ep_a, ep_b)
        times: list[float] = []

        async def main() -> None:
            layer = UamLayer(UamParams())
            async with layer.open(UNetService(ep_a)) as a, layer.open(UNetService(ep_b)) as b:
                count = [0]
                b.register_handler(lambda peer: count.__setitem__(0, count[0] + 1), index=0)

                async def sender(n: int) -> None:
                    for _ in range(n):
                        await a.request(to_b, 0)
                        times.append(trio.current_time())

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sender, 60)
                    nursery.start_soon(sender, 40)
                await b.wait_until(lambda: count[0] == 100)
                times.append(trio.current_time())

        sim.run(main)
        return times

    assert run(True) == run(False)


def test_pdus_the_send_queue_refuses_wait_in_order() -> None:
    sim = Simulation(seed=4)
    small = EndpointConfig(
        segment_size=512 * 1024, tx_buffers=2, rx_buffers=48, free_queue=64, send_queue=2
    )
    ep_a, ep_b = atm_cluster(sim, ["a", "b"], configs={"a": small})
    to_b, _ = connect(ep_a, ep_b)
    result: dict[str, object] = {}

    async def main() -> None:
        layer = UamLayer(UamParams(window=16))
        async with layer.open(UNetService(ep_a)) as a, layer.open(UNetService(ep_b)) as b:
            got: list[int] = []
            b.register_handler(lambda peer, i: got.append(i), index=0)
            region = bytearray(40000)
            b.register_region(region)
            b.register_handler(lambda *args: None, index=1)
            block = random.Random(6).randbytes(40000)
            for i in range(16):
                a.request_nowait(to_b, 0, i)  # 16 PDUs at once into a queue of 2
            peak = 0
            for _ in range(200):  # the host posts one every few microseconds
                await trio.sleep(1e-6)
                assert isinstance(a.path, EventPath)
                peak = max(peak, a.path.held)
            result["held"] = peak
            await a.store(to_b, block, (0, 0), 1)
            await a.drain()
            result.update(got=list(got), same=bytes(region) == block, hook=ep_a.on_send_space)

    sim.run(main)
    assert isinstance(result["held"], int) and result["held"] > 0  # the queue did refuse
    assert result["got"] == list(range(16))
    assert result["same"] is True
    assert result["hook"] is None  # nothing waits any more: the hook is off
