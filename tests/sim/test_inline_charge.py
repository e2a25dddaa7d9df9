"""The inline charge: a task alone charges a modeled cost without a pass of trio's loop.

``Resource.use`` moves the clock itself when parking could only lead to the task's own wake-up
(world.py, "The inline charge").  These tests pin that it fires in the lone-task case, that it
parks whenever anything else could happen first, and that it never changes a result: the same
scripts give the same trace with ``inline_charges`` on and off.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import given, settings

from stacklib.sim import Simulation, us


class _Passes(trio.abc.Instrument):
    """Counts passes of trio's run loop (one I/O wait each)."""

    def __init__(self) -> None:
        self.passes = 0

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1


def _abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.SUCCEEDED


async def _woken_alone(sim: Simulation) -> None:
    """Park until an event of the simulation wakes this task alone (twice: the first wake of
    a run also starts the simulation's watcher task, which then runs in the same batch)."""
    task = trio.lowlevel.current_task()
    for _ in range(2):
        sim.call_after(us(1), trio.lowlevel.reschedule, task)
        await trio.lowlevel.wait_task_rescheduled(_abort)


def test_a_task_woken_alone_charges_without_a_pass() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")
    passes = _Passes()
    seen: list[float] = []

    async def main() -> None:
        await _woken_alone(sim)
        start = trio.current_time()
        trio.lowlevel.add_instrument(passes)
        for _ in range(10):
            await cpu.use(us(3))
            seen.append(trio.current_time() - start)
        trio.lowlevel.remove_instrument(passes)

    sim.run(main)
    assert seen == pytest.approx([us(3) * (i + 1) for i in range(10)])
    assert passes.passes == 0
    assert sim.statistics().charges_inline == 10
    assert cpu.holds == 10
    assert cpu.busy_time == pytest.approx(us(30))


def test_an_earlier_event_makes_the_charge_park_and_run_first() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")
    log: list[tuple[str, float]] = []

    async def main() -> None:
        await _woken_alone(sim)
        start = trio.current_time()
        sim.call_after(us(2), lambda: log.append(("event", sim.now() - start)))
        await cpu.use(us(5))
        log.append(("task", trio.current_time() - start))
        # An event at exactly the hold's end was scheduled first, so it runs first too.
        sim.call_after(us(5), lambda: log.append(("tie", sim.now() - start)))
        await cpu.use(us(5))
        log.append(("task", trio.current_time() - start))

    sim.run(main)
    assert [name for name, _ in log] == ["event", "task", "tie", "task"]
    assert [t for _, t in log] == pytest.approx([us(2), us(5), us(10), us(10)])
    assert sim.statistics().charges_inline == 0


def test_another_runnable_task_makes_the_charge_park() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")
    log: list[tuple[str, float]] = []

    async def other() -> None:
        log.append(("other", trio.current_time()))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await _woken_alone(sim)
            nursery.start_soon(other)  # runnable now: it must run before the clock moves
            await cpu.use(us(5))
            log.append(("main", trio.current_time()))

    sim.run(main)
    assert log[0] == ("other", pytest.approx(us(2)))
    assert log[1] == ("main", pytest.approx(us(7)))
    assert sim.statistics().charges_inline == 0


def test_a_deadline_inside_the_charge_still_cancels_it() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")

    async def main() -> None:
        await _woken_alone(sim)
        start = trio.current_time()
        with trio.move_on_after(us(2)) as scope:
            await cpu.use(us(5))
        assert scope.cancelled_caught
        assert trio.current_time() - start == pytest.approx(us(2))
        assert cpu.busy_until - start == pytest.approx(us(5))  # the reservation stays

    sim.run(main)
    assert sim.statistics().charges_inline == 0


def test_a_pending_cancellation_is_delivered_by_the_charge() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")

    async def main() -> None:
        await _woken_alone(sim)
        start = trio.current_time()
        with trio.CancelScope() as scope:
            scope.cancel()
            await cpu.use(us(5))
        assert scope.cancelled_caught
        assert trio.current_time() == start

    sim.run(main)
    assert sim.statistics().charges_inline == 0


def test_an_inline_charge_is_still_a_checkpoint() -> None:
    sim = Simulation()
    cpu = sim.resource("cpu")

    async def main() -> None:
        await _woken_alone(sim)
        with trio.testing.assert_checkpoints():
            await cpu.use(us(1))

    sim.run(main)
    assert sim.statistics().charges_inline == 1


# One step of a task's script: (kind, resource or target, microseconds, microseconds).
_Step = tuple[str, int, int, int]
_steps = st.one_of(
    st.tuples(st.just("use"), st.integers(0, 1), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("sleep"), st.just(0), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("event"), st.just(0), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("wake"), st.integers(0, 2), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("timeout"), st.integers(0, 1), st.integers(0, 4), st.integers(0, 4)),
    st.tuples(st.just("hold"), st.integers(0, 1), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("wait"), st.integers(0, 2), st.integers(0, 4), st.just(0)),
)
_scripts = st.lists(st.lists(_steps, min_size=1, max_size=6), min_size=1, max_size=3)


def _trace(scripts: list[list[_Step]], inline: bool, seed: int) -> tuple[list[object], int]:
    """Run ``scripts`` (one task each): everything they and the world observed, and how many
    charges were inline."""
    sim = Simulation(seed=seed, inline_charges=inline)
    resources = [sim.resource("cpu"), sim.resource("ni")]
    events = [trio.Event() for _ in scripts]
    log: list[object] = []

    async def run(index: int, script: list[_Step]) -> None:
        for number, (kind, which, a, b) in enumerate(script):
            if kind == "use":
                await resources[which].use(us(a))
            elif kind == "sleep":
                await trio.sleep(us(a))
            elif kind == "event":
                sim.call_after(us(a), trio.lowlevel.reschedule, trio.lowlevel.current_task())
                await trio.lowlevel.wait_task_rescheduled(_abort)
            elif kind == "wake":
                sim.call_after(us(a), events[which % len(events)].set)
            elif kind == "timeout":
                with trio.move_on_after(us(a)):
                    await resources[which].use(us(b))
            elif kind == "wait":
                with trio.move_on_after(us(10 + a)):
                    await events[which % len(events)].wait()
            else:  # "hold": a callback's charge, queued with the tasks' ones
                resources[which].hold(us(a), log.append, ("held", index, number))
            log.append((index, number, trio.current_time()))
        with trio.move_on_after(us(20)):
            await events[index].wait()
        log.append((index, "end", trio.current_time()))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for index, script in enumerate(scripts):
                nursery.start_soon(run, index, script)

    sim.run(main)
    log.append(sim.now())
    log.extend((r.busy_until, r.busy_time, r.holds) for r in resources)
    return log, sim.statistics().charges_inline


@settings(max_examples=150, deadline=None)
@given(_scripts, st.integers(0, 3))
def test_inline_charges_change_no_result(scripts: list[list[_Step]], seed: int) -> None:
    inline, _ = _trace(scripts, True, seed)
    parked, none = _trace(scripts, False, seed)
    assert inline == parked
    assert none == 0  # inline_charges=False parks for every charge


def test_the_comparison_exercises_inline_charges() -> None:
    # The property above would hold vacuously if no script ever charged inline.
    scripts: list[list[_Step]] = [
        [("event", 0, 1, 0), ("use", 0, 3, 0), ("use", 1, 2, 0), ("timeout", 0, 4, 2)]
    ]
    inline, charged = _trace(scripts, True, 0)
    assert inline == _trace(scripts, False, 0)[0]
    assert charged == 2  # the first charge parks: the run's first wake-up starts the watcher


@pytest.mark.parametrize(
    "scripts",
    [
        # A charge ending exactly on another task's deadline: both run in one batch.
        [[("event", 0, 1, 0), ("event", 0, 1, 0), ("use", 0, 2, 0)], [("sleep", 0, 4, 0)]],
        # Two tasks woken by one event run in one batch: neither may move the clock.
        [
            [("event", 0, 1, 0), ("event", 0, 1, 0), ("wake", 2, 1, 0)],
            [("wait", 2, 0, 0), ("use", 0, 3, 0), ("use", 0, 1, 0)],
            [("wait", 2, 0, 0), ("use", 1, 3, 0), ("use", 1, 1, 0)],
        ],
    ],
)
def test_charges_that_must_park(scripts: list[list[_Step]]) -> None:
    for seed in range(4):
        inline, charged = _trace(scripts, True, seed)
        assert inline == _trace(scripts, False, seed)[0]
        assert charged == 0
