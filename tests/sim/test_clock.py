"""VirtualClock: trio's own timers in virtual time, exact and instant."""

from __future__ import annotations

import math

import trio
import trio.testing

from stacklib.sim import Simulation, VirtualClock


def test_sleep_is_exact_and_instant() -> None:
    sim = Simulation()
    seen: list[float] = []

    async def main() -> None:
        seen.append(trio.current_time())
        await trio.sleep(1.5)
        seen.append(trio.current_time())
        await trio.sleep(3600)
        seen.append(trio.current_time())

    class SleepRecorder(trio.abc.Instrument):
        """Records how long trio asks the OS to wait: it must never wait for real."""

        def __init__(self) -> None:
            self.timeouts: list[float] = []

        def before_io_wait(self, timeout: float) -> None:
            self.timeouts.append(timeout)

    recorder = SleepRecorder()

    async def instrumented() -> None:
        # Only while main runs: at shutdown trio itself waits on its wake-up pipe.
        trio.lowlevel.add_instrument(recorder)
        await main()
        trio.lowlevel.remove_instrument(recorder)

    sim.run(instrumented)
    assert recorder.timeouts and max(recorder.timeouts) == 0.0
    assert seen == [0.0, 1.5, 3601.5]
    assert sim.now() == 3601.5


def test_move_on_after_fires_at_its_deadline() -> None:
    sim = Simulation()

    async def main() -> tuple[bool, float]:
        with trio.move_on_after(2.25) as scope:
            await trio.sleep_forever()
        return scope.cancelled_caught, trio.current_time()

    assert sim.run(main) == (True, 2.25)


def test_fail_after_raises_at_deadline() -> None:
    sim = Simulation()

    async def main() -> float:
        try:
            with trio.fail_after(0.5):
                await trio.Event().wait()
        except trio.TooSlowError:
            return trio.current_time()
        return -1.0

    assert sim.run(main) == 0.5


def test_nested_tasks_wake_in_order_at_exact_times() -> None:
    sim = Simulation()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, delay: float) -> None:
        await trio.sleep(delay)
        woke.append((name, trio.current_time()))

    async def main() -> None:
        async with trio.open_nursery() as outer:
            outer.start_soon(sleeper, "c", 3.0)
            outer.start_soon(sleeper, "a", 1.0)
            async with trio.open_nursery() as inner:
                inner.start_soon(sleeper, "b", 2.0)
                inner.start_soon(sleeper, "d", 4.5)

    sim.run(main)
    assert woke == [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.5)]


def test_checkpoints_do_not_advance_time() -> None:
    sim = Simulation()

    async def main() -> float:
        for _ in range(10):
            await trio.sleep(0)
            await trio.lowlevel.checkpoint()
        return trio.current_time()

    assert sim.run(main) == 0.0


def test_bare_virtual_clock_autojumps() -> None:
    clock = VirtualClock()
    assert clock.current_time() == 0.0

    async def main() -> float:
        await trio.sleep(7)
        return trio.current_time()

    assert trio.run(main, clock=clock) == 7.0


def test_time_persists_across_runs() -> None:
    sim = Simulation()

    async def nap() -> float:
        await trio.sleep(1)
        return trio.current_time()

    assert sim.run(nap) == 1.0
    assert sim.run(nap) == 2.0


def test_deadline_to_sleep_time_never_waits_for_real() -> None:
    clock = VirtualClock()
    assert clock.deadline_to_sleep_time(5.0) == 0.0
    assert clock.current_time() == 5.0  # it jumped
    assert clock.deadline_to_sleep_time(1.0) == 0.0
    assert clock.current_time() == 5.0  # and never goes back
    assert clock.deadline_to_sleep_time(math.inf) == math.inf


def test_trio_scheduler_state_is_restored_after_a_run() -> None:
    # The clock seeds trio's private scheduler randomness for the run; it must put it back.
    run_module = trio._core._run
    before = (run_module._r.getstate(), run_module._ALLOW_DETERMINISTIC_SCHEDULING)

    async def main() -> None:
        await trio.sleep(1)

    Simulation(seed=5).run(main)
    assert (run_module._r.getstate(), run_module._ALLOW_DETERMINISTIC_SCHEDULING) == before


async def test_wait_all_tasks_blocked_still_works_in_real_trio() -> None:
    # Sanity: importing the simulator changes nothing for ordinary trio runs.
    await trio.testing.wait_all_tasks_blocked()
