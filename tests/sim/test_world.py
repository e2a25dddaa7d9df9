"""The event heap inside trio: ordering, wake-ups at the application boundary, failures."""

from __future__ import annotations

import math
import random

import pytest
import trio
import trio.testing

from stacklib.sim import RealWorld, Simulation, World, us


def test_call_at_runs_in_time_order() -> None:
    sim = Simulation()
    log: list[tuple[str, float]] = []

    def record(name: str) -> None:
        log.append((name, sim.now()))

    async def main() -> None:
        sim.call_at(3.0, record, "c")
        sim.call_at(1.0, record, "a")
        sim.call_at(2.0, record, "b")
        sim.call_after(0.5, record, "first")
        await trio.sleep(10)

    sim.run(main)
    assert log == [("first", 0.5), ("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert sim.events_processed == 4


def test_equal_times_run_first_in_first_out() -> None:
    sim = Simulation()
    log: list[int] = []

    async def main() -> None:
        for i in range(50):
            sim.call_at(1.0, log.append, i)
        await trio.sleep(2)

    sim.run(main)
    assert log == list(range(50))


def test_events_scheduled_before_trio_run() -> None:
    sim = Simulation()
    log: list[tuple[str, float]] = []
    sim.call_at(1.0, lambda: log.append(("early", sim.now())))
    sim.call_after(2.0, lambda: log.append(("later", sim.now())))

    async def main() -> None:
        await trio.sleep(5)
        log.append(("main", trio.current_time()))

    sim.run(main)
    assert log == [("early", 1.0), ("later", 2.0), ("main", 5.0)]


def test_woken_task_runs_at_the_instant_of_its_event() -> None:
    sim = Simulation()
    log: list[tuple[str, float]] = []
    delivered = trio.Event()

    async def main() -> None:
        sim.call_at(2.0, delivered.set)
        sim.call_at(3.0, lambda: log.append(("event", sim.now())))
        await delivered.wait()
        log.append(("task", trio.current_time()))

    sim.run(main)
    # The task saw exactly t=2 and ran before the t=3 event, which still runs afterwards.
    assert log[0] == ("task", 2.0)


def test_woken_task_runs_before_later_events_at_the_same_instant() -> None:
    sim = Simulation()
    log: list[str] = []
    ready = trio.Event()

    async def waiter() -> None:
        await ready.wait()
        log.append("task")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            sim.call_at(1.0, ready.set)
            sim.call_at(1.0, log.append, "second event")
            await trio.sleep(2)

    sim.run(main)
    assert log == ["task", "second event"]


def test_any_trio_primitive_wakes_tasks_from_events() -> None:
    sim = Simulation()
    send, receive = trio.open_memory_channel[tuple[str, float]](10)
    got: list[tuple[tuple[str, float], float]] = []

    def deliver(what: str) -> None:
        send.send_nowait((what, sim.now()))

    async def main() -> None:
        sim.call_at(us(10), deliver, "x")
        sim.call_at(us(25), deliver, "y")
        for _ in range(2):
            item = await receive.receive()
            got.append((item, trio.current_time()))

    sim.run(main)
    assert got == [(("x", us(10)), us(10)), (("y", us(25)), us(25))]


def test_event_cancels_a_scope_at_its_time() -> None:
    sim = Simulation()

    async def main() -> float:
        with trio.CancelScope() as scope:
            sim.call_at(4.0, scope.cancel)
            await trio.sleep_forever()
        return trio.current_time()

    assert sim.run(main) == 4.0


def test_events_and_trio_timers_interleave() -> None:
    sim = Simulation()
    log: list[tuple[str, float]] = []

    async def sleeper() -> None:
        for _ in range(3):
            await trio.sleep(1.0)
            log.append(("sleep", trio.current_time()))

    async def main() -> None:
        for t in (0.5, 1.5, 2.5):
            sim.call_at(t, lambda: log.append(("event", sim.now())))
        await sleeper()

    sim.run(main)
    assert log == [
        ("event", 0.5),
        ("sleep", 1.0),
        ("event", 1.5),
        ("sleep", 2.0),
        ("event", 2.5),
        ("sleep", 3.0),
    ]


def test_event_at_a_deadline_runs_before_the_timer() -> None:
    sim = Simulation()
    log: list[str] = []

    async def main() -> None:
        sim.call_at(1.0, log.append, "event")
        await trio.sleep(1.0)
        log.append("timer")

    sim.run(main)
    assert log == ["event", "timer"]


def test_callbacks_schedule_callbacks() -> None:
    sim = Simulation()
    times: list[float] = []
    done = trio.Event()

    def hop(left: int) -> None:
        times.append(sim.now())
        if left:
            sim.call_after(us(1), hop, left - 1)
        else:
            done.set()

    async def main() -> None:
        sim.call_after(0, hop, 4)
        await done.wait()

    sim.run(main)
    assert times == pytest.approx([0.0, us(1), us(2), us(3), us(4)])


def test_pending_events_wait_for_the_next_run() -> None:
    sim = Simulation()
    log: list[float] = []

    async def short() -> None:
        sim.call_at(10.0, lambda: log.append(sim.now()))
        await trio.sleep(1)

    sim.run(short)
    assert sim.statistics().events_pending == 1
    assert log == []

    async def long() -> None:
        await trio.sleep(20)

    sim.run(long)
    assert log == [10.0]
    assert sim.statistics().events_pending == 0


def test_callback_exception_propagates_out_of_run() -> None:
    sim = Simulation()

    def broken() -> None:
        raise ZeroDivisionError("model bug")

    async def main() -> None:
        sim.call_at(1.0, broken)
        await trio.sleep(5)

    with pytest.raises(ZeroDivisionError, match="model bug"):
        sim.run(main)


def test_callback_exception_is_not_swallowed_by_plain_trio_run() -> None:
    sim = Simulation()

    def broken() -> None:
        raise KeyError("model bug")

    async def main() -> None:
        sim.call_at(1.0, broken)
        await trio.sleep(5)

    with pytest.raises(trio.TrioInternalError) as info:
        trio.run(main, clock=sim.clock)
    group = info.value.__cause__
    assert isinstance(group, BaseExceptionGroup)
    assert group.subgroup(KeyError) is not None


def test_call_at_rejects_the_past_and_non_finite_times() -> None:
    sim = Simulation()

    async def main() -> None:
        await trio.sleep(1)
        with pytest.raises(ValueError):
            sim.call_at(0.5, print)
        with pytest.raises(ValueError):
            sim.call_at(math.inf, print)
        with pytest.raises(ValueError):
            sim.call_at(math.nan, print)
        with pytest.raises(ValueError):
            sim.call_after(-1e-9, print)

    sim.run(main)


def test_statistics_is_a_frozen_snapshot() -> None:
    sim = Simulation(seed=3)
    ev = trio.Event()

    async def main() -> None:
        sim.call_at(1.0, ev.set)
        await ev.wait()
        await trio.sleep(1)

    sim.run(main)
    stats = sim.statistics()
    assert stats.seed == 3
    assert stats.now == 2.0
    assert stats.events_processed == 1
    assert stats.task_wakeups == 1
    with pytest.raises(AttributeError):
        stats.now = 0.0  # type: ignore[misc]


def test_rng_streams_are_deterministic_and_independent() -> None:
    a, b = Simulation(seed=1), Simulation(seed=1)
    assert a.rng("link") is a.rng("link")
    assert [a.rng("link").random() for _ in range(3)] == [b.rng("link").random() for _ in range(3)]
    # Drawing from one stream does not disturb another.
    assert a.rng("loss").random() == b.rng("loss").random()
    assert Simulation(seed=2).rng("link").random() != Simulation(seed=1).rng("link").random()
    assert Simulation(seed=1).rng("x").random() != Simulation(seed=1).rng("y").random()
    assert isinstance(RealWorld().rng("x"), random.Random)
    assert RealWorld().seed == 0


def test_worlds_say_which_they_are() -> None:
    assert Simulation().virtual is True
    assert RealWorld().virtual is False
    assert isinstance(Simulation(), World)
    resource = Simulation().resource("cpu")
    assert resource.name == "cpu"


async def test_real_world_calls_right_away() -> None:
    world = RealWorld(seed=9)
    log: list[int] = []
    world.call_at(trio.current_time() + 100, log.append, 1)
    world.call_after(100, log.append, 2)
    assert log == [1, 2]
    before = trio.current_time()
    assert before <= world.now() <= trio.current_time()
    assert world.seed == 9


def test_other_tasks_waiting_for_idle_do_not_stall_time() -> None:
    # A task that keeps waiting in wait_all_tasks_blocked() is woken once per idle instant;
    # then the clock moves on, landing exactly on each deadline (no now + (deadline - now)).
    sim = Simulation()
    log: list[tuple[str, float]] = []
    stop = trio.Event()

    async def idler() -> None:
        while not stop.is_set():
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(idler)
            base = 1e6 + 1 / 3  # far from 0, so now + (deadline - now) may round
            await trio.sleep_until(base)
            for i in range(1, 6):
                sim.call_at(base + i * 0.7, lambda: log.append(("event", sim.now())))
            for i in range(1, 6):
                await trio.sleep_until(base + i * 0.3)
                log.append(("sleep", trio.current_time()))
            stop.set()

    sim.run(main)
    sleeps = [t for kind, t in log if kind == "sleep"]
    events = [t for kind, t in log if kind == "event"]
    base = 1e6 + 1 / 3
    assert sleeps == [base + i * 0.3 for i in range(1, 6)]
    assert events[:2] == [base + i * 0.7 for i in range(1, 3)]
    assert [t for _, t in log] == sorted(t for _, t in log)
