"""How a simulation rides trio's run loop: events run inside the clock hook, one pass per wake.

Heap events run from ``deadline_to_sleep_time``, which trio calls only when every task is parked
(world.py).  These tests pin what that must preserve: a woken task runs in the very pass that
woke it, ``wait_all_tasks_blocked`` keeps its meaning in virtual time, failures surface, and
shutdown leaves pending events for the next run.
"""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing

from stacklib.sim import Simulation, VirtualClock, us
from stacklib.sim import clock as clock_module


class _Passes(trio.abc.Instrument):
    """Counts trio run-loop passes (one I/O wait each) and task steps."""

    def __init__(self) -> None:
        self.passes = 0
        self.steps = 0

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


def _abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.SUCCEEDED


def test_a_wake_up_costs_one_pass_of_trio() -> None:
    # Two tasks bounce a wake-up through the heap: every pass of trio's loop must run a task
    # (no idle pass for a driver to notice that everything is parked).
    sim = Simulation()
    rounds = 200
    passes = _Passes()

    async def main() -> None:
        trio.lowlevel.add_instrument(passes)
        tasks: dict[str, trio.lowlevel.Task] = {}

        async def player(me: str, other: str, serve: bool) -> None:
            tasks[me] = trio.lowlevel.current_task()
            if serve:
                await trio.testing.wait_all_tasks_blocked()
            for _ in range(rounds):
                if serve:
                    sim.call_after(us(1), trio.lowlevel.reschedule, tasks[other])
                await trio.lowlevel.wait_task_rescheduled(_abort)
                if not serve:
                    sim.call_after(us(1), trio.lowlevel.reschedule, tasks[other])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(player, "b", "a", False)
            nursery.start_soon(player, "a", "b", True)

    sim.run(main)
    assert sim.now() == pytest.approx(2 * rounds * us(1))
    assert sim.statistics().task_wakeups == 2 * rounds
    # 2 * rounds wake-ups, plus a handful of passes to start and end the run.
    assert 2 * rounds <= passes.passes <= 2 * rounds + 10
    assert passes.steps >= passes.passes - 2


def test_several_tasks_woken_at_one_instant_run_in_one_batch() -> None:
    sim = Simulation()
    ready = trio.Event()
    seen: list[float] = []
    passes = _Passes()

    async def waiter() -> None:
        await ready.wait()
        seen.append(trio.current_time())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(passes)
            sim.call_at(1.0, ready.set)
        trio.lowlevel.remove_instrument(passes)

    sim.run(main)
    assert seen == [1.0] * 5
    # main parks in the nursery; the event wakes all five; they exit; main leaves the nursery.
    assert passes.passes <= 4


def test_tasks_started_by_callbacks_run_at_the_event_instant() -> None:
    sim = Simulation()
    log: list[tuple[str, float]] = []

    async def child(name: str) -> None:
        log.append((name, trio.current_time()))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            sim.call_at(1.0, nursery.start_soon, child, "child")
            sim.call_at(2.0, trio.lowlevel.spawn_system_task, child, "system")
            sim.call_at(2.0, lambda: log.append(("later event", sim.now())))
            await trio.sleep(3)

    sim.run(main)
    assert log == [("child", 1.0), ("system", 2.0), ("later event", 2.0)]


def test_a_sleeping_task_and_events_share_one_time_line() -> None:
    sim = Simulation()
    log: list[tuple[str, float]] = []

    async def main() -> None:
        for t in (0.25, 1.0, 1.0, 2.5):
            sim.call_at(t, lambda: log.append(("event", sim.now())))
        with trio.move_on_after(1.0):
            await trio.sleep_forever()
        log.append(("timeout", trio.current_time()))
        await trio.sleep(2.0)
        log.append(("sleep", trio.current_time()))

    sim.run(main)
    assert log == [
        ("event", 0.25),
        ("event", 1.0),
        ("event", 1.0),
        ("timeout", 1.0),
        ("event", 2.5),
        ("sleep", 3.0),
    ]
    assert sim.statistics().deadline_jumps == 1  # t=1 was reached by events, t=3 by a jump


# wait_all_tasks_blocked in virtual time


def test_idle_waiter_wakes_before_the_clock_jumps_to_a_timer() -> None:
    sim = Simulation()

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 10)
            await trio.testing.wait_all_tasks_blocked()
            woke = trio.current_time()
            nursery.cancel_scope.cancel()
        return woke

    assert sim.run(main) == 0.0


def test_idle_waiter_waits_for_events_due_before_the_next_timer() -> None:
    # An arrival at t=1 wakes a receiver, which parks again: only then is everything idle.
    sim = Simulation()
    send, receive = trio.open_memory_channel[str](1)
    got: list[tuple[str, float]] = []

    async def receiver() -> None:
        async for item in receive:
            got.append((item, trio.current_time()))

    async def main() -> tuple[float, list[tuple[str, float]]]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            nursery.start_soon(trio.sleep, 10)
            sim.call_at(1.0, send.send_nowait, "message")
            await trio.testing.wait_all_tasks_blocked()
            seen = (trio.current_time(), list(got))
            nursery.cancel_scope.cancel()
        return seen

    assert sim.run(main) == (1.0, [("message", 1.0)])


def test_idle_waiter_with_only_events_pending_wakes_when_they_are_done() -> None:
    sim = Simulation()
    log: list[float] = []

    async def main() -> float:
        for t in (1.0, 2.0, 3.0):
            sim.call_at(t, log.append, t)
        await trio.testing.wait_all_tasks_blocked()
        return trio.current_time()

    assert sim.run(main) == 3.0
    assert log == [1.0, 2.0, 3.0]


def test_idle_waiter_wakes_again_at_the_same_instant_after_progress() -> None:
    # wait, let another task run, wait again: both waits return at t=0, before the t=5 timer.
    sim = Simulation()
    go = trio.Event()
    log: list[tuple[str, float]] = []

    async def worker() -> None:
        await go.wait()
        log.append(("worker", trio.current_time()))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker)
            nursery.start_soon(trio.sleep, 5)
            await trio.testing.wait_all_tasks_blocked()
            log.append(("first wait", trio.current_time()))
            go.set()
            await trio.testing.wait_all_tasks_blocked()
            log.append(("second wait", trio.current_time()))

    sim.run(main)
    assert log == [("first wait", 0.0), ("worker", 0.0), ("second wait", 0.0)]
    assert sim.now() == 5.0


def test_idle_waiter_cushion_is_compared_with_virtual_time() -> None:
    # trio wakes a waiter when the loop would sleep longer than its cushion; in virtual time
    # that is the virtual distance to the next timer (the cushion itself passes for real).
    sim = Simulation()

    async def waits_with(timer: float, cushion: float) -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, timer)
            await trio.testing.wait_all_tasks_blocked(cushion)
            woke = trio.current_time()
            nursery.cancel_scope.cancel()
        return woke

    start = sim.now()
    assert sim.run(waits_with, 1.0, 0.001) == start  # the timer is farther than the cushion
    start = sim.now()
    assert sim.run(waits_with, 0.0005, 0.001) == start + 0.0005  # it fires first


def test_bare_virtual_clock_wakes_idle_waiters_before_jumping() -> None:
    async def main() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 7)
            await trio.testing.wait_all_tasks_blocked()
            return trio.current_time()

    clock = VirtualClock()
    assert trio.run(main, clock=clock) == 0.0
    assert clock.current_time() == 7.0


def test_without_trio_internals_idle_waiters_wake_when_nothing_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Another trio version: the clock cannot see idle waiters and jumps; timings stay exact.
    monkeypatch.setattr(clock_module, "_find_idle_waiters", lambda: None)
    sim = Simulation()
    log: list[tuple[str, float]] = []

    async def main() -> None:
        sim.call_at(0.5, lambda: log.append(("event", sim.now())))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep, 2)
            await trio.testing.wait_all_tasks_blocked()
            log.append(("idle", trio.current_time()))

    sim.run(main)
    assert log == [("event", 0.5), ("idle", 2.0)]


# Failures and shutdown


def test_failure_after_the_first_events_still_surfaces() -> None:
    # The watcher is parked by then: the failure must wake it (not only the first-pass path).
    sim = Simulation()
    arrived = trio.Event()

    def broken() -> None:
        raise ZeroDivisionError("late model bug")

    async def main() -> None:
        sim.call_at(1.0, arrived.set)
        await arrived.wait()
        sim.call_at(2.0, broken)
        sim.call_at(3.0, arrived.set)  # never runs: the failure stops event processing
        await trio.sleep(10)

    with pytest.raises(ZeroDivisionError, match="late model bug"):
        sim.run(main)
    assert sim.now() == 2.0
    assert sim.statistics().events_pending == 1


def test_failure_with_an_idle_waiter_present() -> None:
    sim = Simulation()

    def broken() -> None:
        raise KeyError("bug")

    async def main() -> None:
        sim.call_at(1.0, broken)
        await trio.testing.wait_all_tasks_blocked()

    with pytest.raises(KeyError):
        sim.run(main)


def test_the_simulation_runs_again_after_a_failure() -> None:
    sim = Simulation()

    async def failing() -> None:
        sim.call_at(1.0, lambda: 1 / 0)
        await trio.sleep(5)

    with pytest.raises(ZeroDivisionError):
        sim.run(failing)
    log: list[float] = []

    async def fine() -> None:
        sim.call_after(1.0, lambda: log.append(sim.now()))
        await trio.sleep(2)

    sim.run(fine)
    assert log == [2.0]


def test_main_returning_at_once_leaves_early_events_pending() -> None:
    sim = Simulation()
    log: list[float] = []
    sim.call_at(1.0, log.append, 1.0)

    async def main() -> str:
        return "done"

    assert sim.run(main) == "done"
    assert log == []
    assert sim.statistics().events_pending == 1
    assert sim.now() == 0.0


def test_events_do_not_run_while_system_tasks_shut_down() -> None:
    # After main returns, a system task still finishing (shielded sleep) must not let events
    # that are pending run in this run.
    sim = Simulation()
    log: list[float] = []

    async def lingering() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(1)
                log.append(trio.current_time())

    async def main() -> None:
        trio.lowlevel.spawn_system_task(lingering)
        sim.call_at(0.5, log.append, -1.0)
        await trio.sleep(0.1)
        sim.call_at(0.2, log.append, -2.0)

    sim.run(main)
    assert log == [1.1]
    assert sim.statistics().events_pending == 2
