"""Resources and hosts: FIFO contention, overlap, costs charged from a profile."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from stacklib.sim import Cost, CostProfile, Host, RealWorld, Simulation, us


def test_holds_on_one_resource_queue_first_come_first_served() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")
    ends: list[tuple[str, float]] = []

    async def main() -> None:
        assert cpu.hold(us(5), lambda: ends.append(("a", sim.now()))) == us(5)
        assert cpu.hold(us(5), lambda: ends.append(("b", sim.now()))) == us(10)
        await trio.sleep(1)

    sim.run(main)
    assert ends == [("a", us(5)), ("b", us(10))]
    assert cpu.busy_until == us(10)


def test_holds_on_different_resources_overlap() -> None:
    sim = Simulation()
    cpu, ni = sim.resource("cpu"), sim.resource("ni")
    assert cpu.hold(us(5)) == us(5)
    assert ni.hold(us(5)) == us(5)
    assert ni.hold(us(3)) == pytest.approx(us(8))


def test_a_hold_starts_when_the_resource_is_free() -> None:
    sim = Simulation()
    link = sim.resource("link")

    async def main() -> None:
        link.hold(us(5))
        await trio.sleep(us(20))  # the link went idle at 5 us
        assert link.hold(us(5)) == pytest.approx(us(25))

    sim.run(main)


def test_busy_time_and_utilization() -> None:
    sim = Simulation()
    bus = sim.resource("bus")
    for _ in range(4):
        bus.hold(us(2.5))
    assert bus.holds == 4
    assert bus.busy_time == pytest.approx(us(10))
    assert bus.utilization(us(40)) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        bus.utilization(0.0)


def test_hold_rejects_bad_durations() -> None:
    cpu = Simulation().resource("cpu")
    for bad in (-1e-9, math.nan, math.inf):
        with pytest.raises(ValueError):
            cpu.hold(bad)
    assert cpu.holds == 0


def test_use_returns_when_the_hold_ends() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")
    done: dict[str, float] = {}

    async def worker(name: str) -> None:
        await cpu.use(us(5))
        done[name] = trio.current_time()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker, "a")
            nursery.start_soon(worker, "b")

    sim.run(main)
    assert sorted(done.values()) == [us(5), us(10)]


def test_use_is_cancellable_but_the_time_stays_spent() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")

    async def main() -> None:
        with trio.move_on_after(us(2)) as scope:
            await cpu.use(us(5))
        assert scope.cancelled_caught
        assert trio.current_time() == us(2)
        assert cpu.busy_until == us(5)  # the reservation remains
        # The stale wake-up at 5 us must not disturb this task's next wait.
        await trio.sleep(us(10))
        assert trio.current_time() == pytest.approx(us(12))
        await cpu.use(us(1))
        assert trio.current_time() == pytest.approx(us(13))

    sim.run(main)


def test_real_world_holds_complete_at_once() -> None:
    world = RealWorld()
    cpu = world.resource("cpu")
    log: list[str] = []

    async def main() -> None:
        now = cpu.hold(1.0, log.append, "then")
        assert log == ["then"]
        assert now <= trio.current_time()
        with trio.testing.assert_no_checkpoints():
            await cpu.use(1.0)
        assert cpu.holds == 2
        assert cpu.busy_time == 2.0

    trio.run(main)


# Paper 003 §4.4.3: sending a 40-byte message costs the FE host 4.2 us of CPU (a kernel trap),
# while the ATM host spends 1.5 us and the i960 does the rest (about 10 us) on its own.
FE = CostProfile(
    name="fe-send",
    ops={"send": Cost("cpu", fixed_us=4.2, cite="paper 003 §4.4.3")},
)
ATM = CostProfile(
    name="atm-send",
    ops={
        "send": Cost("cpu", fixed_us=1.5, cite="paper 003 §4.4.3"),
        "ni.send": Cost("ni", fixed_us=10.0, cite="paper 003 §4.4.3"),
        "copy": Cost("bus", fixed_us=1.0, per_byte_us=0.01),
    },
)


def test_charge_holds_the_resource_the_profile_names() -> None:
    sim = Simulation()
    fe, atm = Host("fe", sim, FE), Host("atm", sim, ATM)

    async def main() -> None:
        assert fe.charge("send") == pytest.approx(us(4.2))
        assert atm.charge("send") == pytest.approx(us(1.5))
        assert atm.charge("ni.send") == pytest.approx(us(10))
        assert atm.charge("copy", 100) == pytest.approx(us(2))
        await trio.sleep(1)

    sim.run(main)
    # The FE host's CPU paid for the whole send; the ATM host's CPU was free after 1.5 us.
    assert fe.resource("cpu").busy_time == pytest.approx(us(4.2))
    assert atm.resource("cpu").busy_time == pytest.approx(us(1.5))
    assert atm.resource("ni").busy_time == pytest.approx(us(10))
    assert set(atm.resources) == {"cpu", "ni", "bus"}


def test_acharge_waits_and_the_host_overlaps_with_its_ni() -> None:
    sim = Simulation()
    host = Host("atm", sim, ATM)
    log: list[tuple[str, float]] = []

    async def main() -> None:
        host.charge("ni.send", then=lambda: log.append(("ni done", sim.now())))
        await host.acharge("send")
        log.append(("cpu free", trio.current_time()))
        await trio.sleep(1)

    sim.run(main)
    assert [name for name, _ in log] == ["cpu free", "ni done"]
    assert [t for _, t in log] == pytest.approx([us(1.5), us(10)])


def test_cost_lookup() -> None:
    host = Host("atm", Simulation(), ATM)
    assert host.cost("copy", 1000) == pytest.approx(us(11))
    with pytest.raises(KeyError, match=r"'atm-send'.*'nope'"):
        host.cost("nope")
    with pytest.raises(KeyError, match="nope"):
        host.charge("nope")


def test_host_without_a_profile_charges_nothing() -> None:
    sim = Simulation()
    host = Host("bare", sim)
    log: list[float] = []

    async def main() -> None:
        await trio.sleep(1)
        assert host.cost("anything", 100) == 0.0
        assert host.charge("anything", 100, lambda: log.append(sim.now())) == 1.0
        with trio.testing.assert_no_checkpoints():
            await host.acharge("anything")
        await trio.sleep(1)

    sim.run(main)
    assert log == [1.0]
    assert dict(host.resources) == {}


def test_host_resources_are_created_once_and_read_only() -> None:
    host = Host("h", Simulation())
    cpu = host.resource("cpu")
    assert host.resource("cpu") is cpu
    assert host.resources["cpu"] is cpu
    with pytest.raises(TypeError):
        host.resources["ni"] = cpu  # type: ignore[index]


async def test_use_outside_its_simulation_says_so() -> None:
    # This test runs under pytest-trio's own clock, not the simulation's.
    sim = Simulation()
    assert not sim.running
    with pytest.raises(RuntimeError, match="not running"):
        await sim.resource("cpu").use(us(1))


def test_try_charge_is_use_without_parking_or_does_nothing() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")
    log: list[tuple[str, float]] = []

    async def main() -> None:
        # Parked, woken alone by its own event: then the one task trio runs in this pass
        # (from the second event of a run on, which finds the simulation's watcher parked).
        await cpu.use(0.25)
        await cpu.use(0.75)
        cpu.hold(0.0)  # another hold ending now does not stand in the way
        with trio.testing.assert_checkpoints():
            assert cpu.try_charge(2.0)
        assert (trio.current_time(), cpu.holds, cpu.busy_until) == (3.0, 4, 3.0)
        # An event inside the hold: the charge would have to park, so nothing is held.
        sim.call_at(4.0, lambda: log.append(("event", sim.now())))
        assert not cpu.try_charge(2.0)
        assert (trio.current_time(), cpu.holds, cpu.busy_until) == (3.0, 4, 3.0)
        await cpu.use(2.0)
        assert log == [("event", 4.0)]
        assert trio.current_time() == 5.0
        # A pending cancellation: nothing held, and the caller's checkpoint raises.
        with trio.CancelScope() as scope:
            scope.cancel()
            assert not cpu.try_charge(1.0)
            await trio.lowlevel.checkpoint_if_cancelled()
        assert (cpu.holds, cpu.busy_until) == (5, 5.0)
        for bad in (-1e-9, math.nan, math.inf):
            assert not cpu.try_charge(bad)
        # From a heap callback, even the first one after this task's lone wake-up with
        # nothing else pending: never (the clock must not move under the event loop).
        await cpu.use(1.0)  # parks (the cancellation above rescheduled this task)
        assert trio.current_time() == 6.0
        woken = trio.Event()

        def callback() -> None:
            log.append(("callback", float(sim.resource("other").try_charge(0.5))))
            woken.set()

        sim.call_at(6.0, callback)
        await woken.wait()
        assert log[-1] == ("callback", 0.0)
        assert trio.current_time() == 6.0

    sim.run(main)
    assert cpu.holds == 6


def test_try_charge_never_charges_in_the_real_world() -> None:
    world = RealWorld()
    cpu = world.resource("cpu")

    async def main() -> None:
        assert not cpu.try_charge(1.0)
        assert cpu.holds == 0

    trio.run(main)
