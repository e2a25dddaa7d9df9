"""Progress of simulated runs, in this process or in worker processes, while they run.

A run at the papers' sizes can take half an hour of wall time: a line per finished run is
not enough.  Each worker process publishes, twice a second from a thread of its own, the
virtual time its simulation has reached (:data:`stacklib.sim.world.RUNNING`, read and never
asked for, so the simulation does not slow) into a shared array, one slot per run; the
parent's progress display (:mod:`stacklib.reporting.progress`) reads the array at each report.
A run's share of the work is its expected cost; a run that has an expected virtual time (the
paper's) counts done in proportion to the virtual time it has simulated.  All of this is
set up only while a progress display is shown: otherwise the workers start no thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

from stacklib.reporting import progress

__all__ = ["PUBLISH_SECONDS", "RunsProgress", "init_worker", "run_indexed"]

A = TypeVar("A")
R = TypeVar("R")

#: How often a worker publishes its run's virtual time (wall seconds).
PUBLISH_SECONDS = 0.5

#: In a worker: the shared array of virtual times (one slot per run) and the run it simulates.
_TIMES: Any = None
_INDEX = -1


def _simulated() -> float | None:
    from stacklib.sim import world

    simulation = world.RUNNING
    return None if simulation is None else float(simulation.clock._now)


def _publish() -> None:
    while True:
        time.sleep(PUBLISH_SECONDS)
        index, now = _INDEX, _simulated()
        if index >= 0 and now is not None:
            _TIMES[index] = now


def init_worker(times: Any) -> None:
    """A pool's initializer: publish into ``times`` (None: progress is not shown)."""
    global _TIMES
    if times is not None:
        _TIMES = times
        threading.Thread(target=_publish, name="progress", daemon=True).start()


def run_indexed(index: int, run: Callable[[A], R], argument: A) -> R:
    """``run(argument)`` in a worker, its virtual time published as run ``index``."""
    global _INDEX
    _INDEX = index
    try:
        return run(argument)
    finally:
        _INDEX = -1


class RunsProgress:
    """The progress of ``len(labels)`` runs: a step of the current progress task (nothing
    when none is shown) and, per finished run, a line for ``write``.

    ``costs`` weigh the runs against each other (any unit); ``expected`` is each run's
    expected virtual time in seconds, None where it is not known.  ``clock`` times the
    finished runs' lines.
    """

    def __init__(
        self,
        name: str,
        labels: Sequence[str],
        costs: Sequence[float],
        expected: Sequence[float | None],
        write: Callable[[str], None] | None,
        clock: Callable[[], float],
    ) -> None:
        if not len(labels) == len(costs) == len(expected):
            raise ValueError("RunsProgress: one label, cost and expected time per run")
        self.name = name
        self.labels = list(labels)
        self.costs = list(costs)
        self.expected = list(expected)
        self.total_cost = sum(costs) or 1.0
        self.done_cost = 0.0
        self.done = 0
        self.write = write
        self.clock = clock
        self.started = clock()
        self.finished_runs: set[int] = set()
        self.local: int | None = None  # the run simulated in this process, if any
        self.times: Any = None
        self._task = progress.NULL_TASK
        self._step: Any = None

    def __enter__(self) -> RunsProgress:
        self._step = progress.step(self.name, total=self.total_cost)
        self._task = self._step.__enter__()
        self._task.follow(self._sample)
        return self

    def __exit__(self, *exc: object) -> None:
        self._step.__exit__(*exc)
        self._task = progress.NULL_TASK

    @property
    def shown(self) -> bool:
        """Whether a progress display shows these runs."""
        return self._task is not progress.NULL_TASK

    def shared(self, context: BaseContext) -> Any:
        """The array the workers publish into (None when no progress is shown)."""
        if self.shown and self.times is None:
            self.times = context.RawArray("d", len(self.labels))
        return self.times

    def running(self, index: int | None) -> None:
        """Run ``index`` is simulated in this process (None: no run is)."""
        self.local = index

    def finished(self, index: int, line: Callable[[int, int, float, float | None], str]) -> None:
        """Run ``index`` is done: ``line(done, count, elapsed, left)`` goes to ``write``."""
        self.finished_runs.add(index)
        self.done += 1
        self.done_cost += self.costs[index]
        elapsed = self.clock() - self.started
        left = None
        if self.done < len(self.labels) and elapsed > 0:
            left = elapsed * (self.total_cost - self.done_cost) / self.done_cost
        if self.write is not None:
            self.write(line(self.done, len(self.labels), elapsed, left))
        self._task.advance(0)  # a report, if one is due

    def _virtual_time(self, index: int) -> float:
        if index == self.local:
            return _simulated() or 0.0
        return float(self.times[index]) if self.times is not None else 0.0

    def _sample(self) -> float:
        """The work done (in cost units), counting the runs under way; sets the detail."""
        done = self.done_cost
        running = []
        for index in range(len(self.labels)):
            if index in self.finished_runs:
                continue
            simulated = self._virtual_time(index)
            if simulated <= 0:
                continue
            expected = self.expected[index]
            if expected:
                # Never all of it: the run may take longer than the paper's time.
                done += self.costs[index] * min(simulated / expected, 0.95)
                running.append(f"{self.labels[index]} t={simulated:.3g}/{expected:.3g} s")
            else:
                running.append(f"{self.labels[index]} t={simulated:.3g} s")
        self._task.detail = f"{self.done}/{len(self.labels)} done" + (
            f"; simulating {', '.join(running)}" if running else ""
        )
        return done
