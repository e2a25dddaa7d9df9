"""The trio versions stacklib supports.

The simulator reads a few of trio's internals (the run's deadlines, the keyboard-interrupt flag
and the idle waiters) to charge modeled costs without parking a task; it checks for them and
falls back to parking where they are missing, which keeps every figure but is several times
slower.  pyproject.toml pins the versions tested (CI also runs the simulator's tests with the
lowest one); these tests fail when the installed trio is outside the range or no longer has what
the fast path reads, so a new trio release is noticed instead of silently slowing the simulator.
"""

from __future__ import annotations

import importlib.metadata
import re

import trio

from stacklib.sim import Simulation
from stacklib.sim.clock import VirtualClock


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_the_installed_trio_is_in_the_pinned_range() -> None:
    (requirement,) = [
        r for r in importlib.metadata.requires("stacklib") or [] if r.startswith("trio")
    ]
    lowest = re.search(r">=\s*([\d.]+)", requirement)
    below = re.search(r"<\s*([\d.]+)", requirement)
    assert lowest is not None and below is not None, f"trio is not pinned: {requirement!r}"
    installed = _version(trio.__version__)
    assert _version(lowest.group(1)) <= installed < _version(below.group(1)), (
        f"trio {trio.__version__} is outside the tested range {requirement!r}"
    )


def test_the_simulator_finds_the_trio_internals_it_reads() -> None:
    sim = Simulation(seed=0)
    found: dict[str, bool] = {}

    async def main() -> None:
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, VirtualClock)
        found["runner"] = clock._runner is not None
        found["idle waiters"] = clock._waiters is not None

    sim.run(main)
    assert found == {"runner": True, "idle waiters": True}
