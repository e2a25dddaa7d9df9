"""How fast the simulator is: wall time per heap event and per trio wake-up.

Run ``python -m stacklib.sim._bench [n]``: it prints, in microseconds of wall time, a heap event
(a callback that schedules the next one), a ping-pong round trip between two tasks through heap
events (two wake-ups of a parked task), ``Resource.use`` by one task alone (the inline charge,
world.py) and parked (``Simulation(inline_charges=False)``), and ``trio.sleep`` in virtual time.
A measurement, not a test: the figures, with the machine and date, are in docs/performance.md
("Virtual time"), which also says what they mean for a model (spend heap events freely below
the application boundary; wake a trio task once per message it delivers).
"""

from __future__ import annotations

import sys
import time

import trio
import trio.lowlevel
import trio.testing

from stacklib.sim.world import Simulation

__all__ = ["bench_events"]


def _time_events(n: int) -> float:
    sim = Simulation()
    done = trio.Event()
    remaining = [n]

    def step() -> None:
        remaining[0] -= 1
        if remaining[0]:
            sim.call_after(1e-6, step)
        else:
            done.set()

    async def main() -> None:
        sim.call_after(1e-6, step)
        await done.wait()

    start = time.perf_counter()
    sim.run(main)
    return (time.perf_counter() - start) / n


def _time_ping_pong(rounds: int) -> float:
    sim = Simulation()

    async def main() -> None:
        tasks: dict[str, trio.lowlevel.Task] = {}

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            return trio.lowlevel.Abort.SUCCEEDED

        async def player(me: str, other: str, serve: bool) -> None:
            tasks[me] = trio.lowlevel.current_task()
            if serve:
                await trio.testing.wait_all_tasks_blocked()
            for _ in range(rounds):
                if serve:
                    sim.call_after(1e-6, trio.lowlevel.reschedule, tasks[other])
                await trio.lowlevel.wait_task_rescheduled(abort)
                if not serve:
                    sim.call_after(1e-6, trio.lowlevel.reschedule, tasks[other])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(player, "b", "a", False)
            nursery.start_soon(player, "a", "b", True)

    start = time.perf_counter()
    sim.run(main)
    return (time.perf_counter() - start) / rounds


def _time_use(n: int, inline: bool = True) -> float:
    sim = Simulation(inline_charges=inline)
    cpu = sim.resource("cpu")

    async def main() -> None:
        for _ in range(n):
            await cpu.use(1e-6)

    start = time.perf_counter()
    sim.run(main)
    return (time.perf_counter() - start) / n


def _time_sleep(n: int) -> float:
    sim = Simulation()

    async def main() -> None:
        for _ in range(n):
            await trio.sleep(1e-6)

    start = time.perf_counter()
    sim.run(main)
    return (time.perf_counter() - start) / n


def bench_events(n: int = 100_000) -> dict[str, float]:
    """Wall-clock costs of the simulator's basic steps, in microseconds (reads the real clock)."""
    tasks = max(1, n // 10)
    round_trip = _time_ping_pong(tasks)
    return {
        "events": float(n),
        "event_us": _time_events(n) * 1e6,
        "round_trip_us": round_trip * 1e6,
        "wakeup_us": round_trip / 2 * 1e6,
        "use_us": _time_use(tasks) * 1e6,
        "use_parked_us": _time_use(tasks, inline=False) * 1e6,
        "sleep_us": _time_sleep(tasks) * 1e6,
    }


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    for key, value in bench_events(size).items():
        print(f"{key:>14} {value:10.3f}")
