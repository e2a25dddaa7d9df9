"""Progress of long jobs on stderr: what runs, the elapsed time and an estimate of what is left.

A command opens a :class:`Progress` (``with Progress.open(...)``) and a top-level task in it;
the code it calls reports from inside its long loops through :func:`step` and
:func:`current`, which cost one attribute test when no progress is shown (the default: the
simulated figures cannot move, and the hot paths never call them)::

    with progress.step("Table 1 runs", total=len(cells)) as runs:
        for cell in cells:
            ...
            runs.advance()

Steps nest: the line names the path of open tasks, ``reproduce 3/8 > splitc > Table 1 runs
4.2/36 (12%)``, with the elapsed time and the time left estimated from the innermost task with
a known total, at the rate its work units were done so far.  A task may ``follow`` a
function sampled at each report instead of being advanced, e.g. the virtual time a worker
process has simulated out of the virtual time its run is expected to take.

Where it goes.  On a terminal the line is redrawn in place about twice a second (a bar by
``rich``, the optional extra ``stacklib[rich]``, else a plain bar redrawn with a carriage
return); elsewhere (a log, a pipe, CI) a plain line every ``interval`` seconds (5), with no
control codes.  Nothing is written on stdout, which stays the results (or valid JSON).  A
thread started with the display reports while no loop advances (the first line comes within
``interval`` seconds even if the first run takes half an hour); tests pass ``ticker=False``
and a fake clock and call :meth:`Progress.poll`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

__all__ = [
    "NULL_TASK",
    "Interrupted",
    "Progress",
    "Task",
    "clear",
    "current",
    "duration",
    "is_interrupt",
    "message",
    "shown",
    "step",
]


def duration(seconds: float) -> str:
    """``seconds`` as ``m:ss`` (``h:mm:ss`` from an hour)."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


class Task:
    """One job or step: ``done`` out of ``total`` work units (None: not known).

    Only the thread that opened it advances it; the display reads it from its own thread
    (a float read is atomic), so an estimate may lag by one report, never break."""

    __slots__ = (
        "_progress",
        "_sample",
        "detail",
        "done",
        "name",
        "parent",
        "started",
        "total",
        "unit",
        "weight",
    )

    def __init__(
        self,
        progress: Progress | None,
        name: str,
        total: float | None,
        unit: str,
        parent: Task | None,
        started: float,
        weight: float = 1.0,
    ) -> None:
        if total is not None and total < 0:
            raise ValueError(f"progress task {name!r}: total must be >= 0, got {total}")
        if weight < 0:
            raise ValueError(f"progress task {name!r}: weight must be >= 0, got {weight}")
        self._progress = progress
        self.name = name
        self.total = total
        self.unit = unit
        self.parent = parent
        self.started = started
        #: The units of the parent's total this task stands for (what the parent advances by
        #: when it ends), so the parent's estimate counts the part of it already done.
        self.weight = weight
        self.done = 0.0
        #: Shown after the name instead of ``done/total`` when set (by a sample, say).
        self.detail = ""
        self._sample: Callable[[], float] | None = None

    def advance(self, n: float = 1.0) -> None:
        """``n`` more work units done (a report follows if one is due)."""
        if self._progress is not None:
            self.done += n
            self._progress.poll()

    def follow(self, sample: Callable[[], float] | None) -> None:
        """Take ``done`` from ``sample()`` at each report (None: stop following)."""
        if self._progress is not None:
            self._sample = sample

    def fraction(self) -> float | None:
        """How much of the task is done (0 to 1), counting its open step; None if unknown."""
        if not self.total:
            return None
        return min(self.done, self.total) / self.total

    def _refresh(self) -> None:
        if self._sample is not None:
            with contextlib.suppress(Exception):  # a report never breaks the job
                self.done = float(self._sample())

    @contextlib.contextmanager
    def step(
        self, name: str, total: float | None = None, unit: str = "", weight: float = 1.0
    ) -> Iterator[Task]:
        """A nested task, shown after this one while the block runs; ``weight``: the units of
        this task's total it stands for."""
        if self._progress is None:
            yield NULL_TASK
            return
        with self._progress.task(name, total, unit, weight) as task:
            yield task


#: The task :func:`current` gives when no progress is shown: every call does nothing.
NULL_TASK = Task(None, "", None, "", None, 0.0)


class _Renderer:
    """Writes the state of the open tasks: a plain line, or a redrawn one on a terminal."""

    def __init__(self, stream: TextIO, live: bool) -> None:
        self.stream = stream
        self.live = live
        self.width = 0

    def show(self, line: str, fraction: float | None) -> None:
        if not self.live:
            self.stream.write(f"{line}\n")
        else:
            bar = ""
            if fraction is not None:
                filled = round(fraction * 20)
                bar = f"[{'#' * filled}{'-' * (20 - filled)}] "
            text = (bar + line)[: _columns() - 1]
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        self.stream.flush()

    def clear(self) -> None:
        if self.live and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0

    def message(self, line: str) -> None:
        self.clear()
        self.stream.write(f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        self.clear()


class _RichRenderer(_Renderer):
    """The line under a ``rich`` live bar (optional extra ``stacklib[rich]``).  stdout is
    left alone (rich would send it to the bar's console, stderr): :meth:`clear` takes the
    bar away before the command writes on stdout, and the next report brings it back."""

    def __init__(self, stream: TextIO, bar: Any, task: Any) -> None:
        super().__init__(stream, live=True)
        self.bar = bar
        self.task = task
        self.started = False

    def show(self, line: str, fraction: float | None) -> None:
        self.bar.update(self.task, completed=1000 * (fraction or 0.0), description=line)
        if not self.started:
            self.bar.start()
            self.started = True

    def clear(self) -> None:
        if self.started:
            self.bar.stop()
            self.started = False

    def message(self, line: str) -> None:
        self.bar.console.print(line, markup=False, highlight=False)

    def close(self) -> None:
        self.clear()


def _simulated() -> float | None:
    """The virtual time of the simulation running in this process, if one runs: read, not
    asked for, so the simulator's hot path knows nothing of progress (and a process that
    never imported the simulator pays nothing)."""
    world = sys.modules.get("stacklib.sim.world")
    simulation = getattr(world, "RUNNING", None)
    if simulation is None:
        return None
    return float(simulation.clock._now)


def _columns() -> int:
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


def _rich_renderer(stream: TextIO) -> _Renderer | None:
    try:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn
    except ImportError:
        return None  # rich is optional: the plain bar
    bar = Progress(
        BarColumn(),
        TextColumn("{task.description}"),
        console=Console(file=stream),
        transient=True,
        redirect_stdout=False,
    )
    return _RichRenderer(stream, bar, bar.add_task("", total=1000))


class Progress:
    """The progress display of one command: its tasks, their reports on ``stream``.

    ``live`` (default: whether ``stream`` is a terminal) redraws one line in place every
    ``refresh`` seconds; otherwise a plain line is written every ``interval`` seconds of
    ``clock``.  ``ticker`` starts a thread that reports while nothing advances.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 5.0,
        refresh: float = 0.5,
        live: bool | None = None,
        use_rich: bool = True,
        ticker: bool = True,
    ) -> None:
        if interval <= 0 or refresh <= 0:
            raise ValueError("progress: interval and refresh must be positive")
        self.stream: TextIO = stream if stream is not None else sys.stderr
        if live is None:
            live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.live = live
        self.period = refresh if live else interval
        self.tasks: list[Task] = []
        self.lines = 0
        self._use_rich = use_rich
        self._ticker = ticker
        self._renderer: _Renderer | None = None
        self._due = 0.0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # Tasks

    @contextlib.contextmanager
    def task(
        self, name: str, total: float | None = None, unit: str = "", weight: float = 1.0
    ) -> Iterator[Task]:
        """Open a task (nested in the innermost open one) for the block; it is the task
        :func:`current` gives while it is the innermost."""
        with self._lock:
            now = self.clock()
            parent = self.tasks[-1] if self.tasks else None
            task = Task(self, name, total, unit, parent, now, weight)
            self.tasks.append(task)
            if parent is None:
                self._start(now)
        try:
            yield task
        finally:
            with self._lock:
                if task in self.tasks:
                    del self.tasks[self.tasks.index(task) :]
                last = not self.tasks
            if last:
                self._finish()  # outside the lock: it waits for the ticker, which takes it

    def _start(self, now: float) -> None:
        global _ACTIVE
        self._due = now + self.period
        if self.live and self._use_rich:
            self._renderer = _rich_renderer(self.stream)
        if self._renderer is None:
            self._renderer = _Renderer(self.stream, self.live)
        _ACTIVE = self
        if self._ticker:
            self._stop.clear()
            self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._thread.start()

    def _finish(self) -> None:
        global _ACTIVE
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._lock:
            if self._renderer is not None:
                self._renderer.close()
                self._renderer = None
            if _ACTIVE is self:
                _ACTIVE = None

    def _tick(self) -> None:
        while not self._stop.wait(min(self.period, 0.5)):
            self.poll()

    # Reports

    def poll(self) -> None:
        """Report if the next report is due by ``clock``."""
        if self.clock() >= self._due:
            self.report()

    def report(self) -> None:
        """Report now (and the next one ``interval`` from now)."""
        with self._lock:
            if not self.tasks or self._renderer is None:
                return
            now = self.clock()
            self._due = now + self.period
            line, fraction = self.line(now)
            self._renderer.show(line, fraction)
            self.lines += 1

    def line(self, now: float) -> tuple[str, float | None]:
        """The report at ``now``: the text, and the fraction done of the outermost task with a
        known total, counting the done part of its open steps (each by its weight)."""
        parts = []
        estimate: Task | None = None
        for task in self.tasks:
            task._refresh()
            text = task.name
            if task.detail:
                text += f" {task.detail}"
            elif task.total is not None:
                unit = f" {task.unit}" if task.unit else ""
                text += f" {_number(task.done)}/{_number(task.total)}{unit}"
            elif task.done:
                text += f" {_number(task.done)}{' ' + task.unit if task.unit else ''}"
            if task.total and estimate is None:
                estimate = task
            parts.append(text)
        simulated = None if self.tasks[-1].detail else _simulated()
        if simulated is not None:
            parts[-1] += f" (t={simulated:.4g} s simulated)"
        line = " > ".join(parts) + f"; {duration(now - self.tasks[0].started)} elapsed"
        fraction = None
        if estimate is not None:
            fraction = self._overall(estimate)
            line += f" ({fraction:.0%} of {estimate.name})"
            spent = now - estimate.started
            if 0 < fraction < 1 and spent > 0:
                line += f", about {duration(spent * (1 - fraction) / fraction)} left"
        return line, fraction

    def _overall(self, task: Task) -> float:
        """The fraction of ``task`` done: its own units plus the fraction of its open step
        times the step's weight.  A step without a total counts as far as its own open step
        has come (its only measure), an innermost one as not begun."""
        fraction = 0.0  # of the step below the level being summed
        weight = 1.0
        for level in reversed(self.tasks[self.tasks.index(task) :]):
            if level.total:
                fraction = min(level.done + weight * fraction, level.total) / level.total
            weight = level.weight
        return fraction

    def clear(self) -> None:
        """Clear the live line until the next report."""
        with self._lock:
            if self._renderer is not None:
                self._renderer.clear()

    def message(self, line: str) -> None:
        """Write ``line`` on the stream above the live line (and not through it)."""
        with self._lock:
            if self._renderer is None:
                self.stream.write(f"{line}\n")
                self.stream.flush()
            else:
                self._renderer.message(line)


@contextlib.contextmanager
def shown(
    name: str,
    total: float | None = None,
    unit: str = "",
    *,
    quiet: bool = False,
    **options: Any,
) -> Iterator[Task]:
    """A command's top-level task on a new :class:`Progress` (``options``), or
    :data:`NULL_TASK` with ``quiet`` or ``$STACKLIB_PROGRESS`` set to ``0`` or ``off``.
    Under a display already shown (a command run by another), a step of it instead."""
    if quiet or os.environ.get("STACKLIB_PROGRESS", "").lower() in ("0", "off", "no"):
        yield NULL_TASK
        return
    if current() is not NULL_TASK:
        with step(name, total, unit) as task:
            yield task
        return
    with Progress(**options).task(name, total, unit) as task:
        yield task


#: The display of the command that runs, if it shows progress.
_ACTIVE: Progress | None = None


def current() -> Task:
    """The innermost open task of the active display; :data:`NULL_TASK` when none is shown."""
    active = _ACTIVE
    if active is None or not active.tasks:
        return NULL_TASK
    return active.tasks[-1]


def step(
    name: str, total: float | None = None, unit: str = "", weight: float = 1.0
) -> contextlib.AbstractContextManager[Task]:
    """A step nested in the current task for the block (:data:`NULL_TASK` when no progress
    is shown): what long loops call to report their work units.  ``weight``: the units of
    the current task's total this step stands for."""
    return current().step(name, total, unit, weight)


def clear() -> None:
    """Clear the live progress line (it comes back at the next report): before writing
    on stdout, which may be the same terminal."""
    active = _ACTIVE
    if active is not None:
        active.clear()


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a job whose results accumulate: ``partial`` is what finished (a result of
    the job's own kind), ``detail`` says what did not.  A KeyboardInterrupt, so that code
    that knows nothing of partial results stops as it would for Ctrl-C."""

    def __init__(self, partial: Any, detail: str) -> None:
        super().__init__(detail)
        self.partial = partial
        self.detail = detail


def is_interrupt(error: BaseException) -> bool:
    """Whether ``error`` is Ctrl-C: a KeyboardInterrupt, or a group (from a nursery) with one."""
    if isinstance(error, BaseExceptionGroup):
        return error.subgroup(KeyboardInterrupt) is not None
    return isinstance(error, KeyboardInterrupt)


def message(line: str) -> None:
    """A line on stderr, written above the live progress line when there is one."""
    active = _ACTIVE
    if active is None:
        print(line, file=sys.stderr, flush=True)
    else:
        active.message(line)
