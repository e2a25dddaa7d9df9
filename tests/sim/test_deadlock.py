"""A simulation that can never go on ends with Deadlock, naming the waiting tasks, instead of
hanging; runs that are only idle for a while (timers, events, idle waiters) are not deadlocks."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from stacklib.errors import Deadlock
from stacklib.sim import Simulation


def test_every_task_waiting_on_nothing_is_a_deadlock() -> None:
    async def main() -> None:
        never = trio.Event()

        async def reader(name: str) -> None:
            await never.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, "a", name="reader")
            nursery.start_soon(reader, "b", name="reader")
            await trio.sleep(0.001)  # a timer first: time moves, then nothing is left

    sim = Simulation()
    with pytest.raises(Deadlock, match=r"t=1000\.000 us .* \(2 waiting: 2 x reader\)"):
        sim.run(main)


def test_a_deadlock_with_events_pending_first() -> None:
    async def main() -> None:
        woken = trio.Event()
        sim.call_at(0.5, woken.set)
        await woken.wait()
        await trio.Event().wait()  # nobody will set this one

    sim = Simulation()
    with pytest.raises(Deadlock, match=r"t=500000\.000 us"):
        sim.run(main)
    assert sim.now() == 0.5


def test_timers_events_and_idle_waiters_are_not_deadlocks() -> None:
    async def main() -> float:
        done = trio.Event()
        sim.call_at(2.0, done.set)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.testing.wait_all_tasks_blocked)
            await done.wait()
            await trio.sleep(1.0)
        return trio.current_time()

    sim = Simulation()
    assert sim.run(main) == 3.0


def test_waiting_for_real_io_needs_detection_turned_off() -> None:
    async def main() -> float:
        # A thread is real I/O: virtual time cannot see it coming back.
        await trio.to_thread.run_sync(time.sleep, 0.02)
        return trio.current_time()

    with pytest.raises(Deadlock, match=r"t=0\.000 us .*\(1 waiting: .*main\)"):
        Simulation().run(main)
    assert Simulation(detect_deadlock=False).run(main) == 0.0
