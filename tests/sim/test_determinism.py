"""Same seed, same numbers: every run, in any process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from stacklib.sim import Cost, CostProfile, Host, Simulation

PROFILE = CostProfile(
    name="toy",
    ops={
        "send": Cost("cpu", fixed_us=3.0, per_byte_us=0.02),
        "dma": Cost("bus", fixed_us=1.0, per_byte_us=0.01),
        "fw": Cost("ni", fixed_us=7.0),
    },
)

Trace = list[tuple[str, int, str, float]]


def scenario(seed: int) -> Trace:
    """Six tasks spawned in one batch, each drawing from its own stream, contending for a host.

    Sleeps are coarse on purpose so that trio deadlines tie (trio breaks those ties by id()),
    and several tasks wake in the same scheduler batch (trio shuffles those).
    """
    sim = Simulation(seed)
    host = Host("h", sim, PROFILE)
    trace: Trace = []

    async def worker(i: int) -> None:
        rng = sim.rng(f"worker{i}")
        for step in range(25):
            choice = rng.random()
            if choice < 0.3:
                await trio.sleep(rng.choice([1e-5, 2e-5]))
                what = "sleep"
            elif choice < 0.6:
                what = rng.choice(["send", "dma", "fw"])
                await host.acharge(what, rng.randrange(0, 1500, 100))
            else:
                arrived = trio.Event()
                host.charge("fw", 0, sim.call_after, rng.randrange(3) * 1e-6, arrived.set)
                await arrived.wait()
                what = "event"
            trace.append((f"w{i}", step, what, trio.current_time()))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(worker, i)

    sim.run(main)
    return trace


def test_same_seed_same_trace() -> None:
    first = scenario(7)
    assert len(first) == 150
    assert scenario(7) == first


def test_different_seeds_differ() -> None:
    assert scenario(7) != scenario(8)


def repeated_with_memory_noise(seed: int, runs: int) -> list[Trace]:
    """Run the scenario several times, moving objects around in memory in between.

    trio orders tied deadlines by id() of their cancel scopes; without the clock's
    deterministic scheduling these runs were measured to give different traces.
    """
    noise: list[list[object]] = []
    traces = []
    for run in range(runs):
        noise.append([object() for _ in range(1 + 997 * run)])
        if run % 2:
            noise.pop(0)
        traces.append(scenario(seed))
    return traces


def test_same_traces_in_a_fresh_process() -> None:
    # A fresh interpreter with another hash seed and without pytest-trio (which makes trio's
    # scheduler deterministic for the whole test session): the simulation must do it itself.
    root = Path(__file__).resolve().parents[2]
    code = (
        "import json; from tests.sim.test_determinism import repeated_with_memory_noise as r; "
        "print(json.dumps(r(7, 5)))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(root))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    expected = json.loads(json.dumps(scenario(7)))
    assert json.loads(result.stdout) == [expected] * 5
