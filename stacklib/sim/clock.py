"""Virtual time for trio: a :class:`trio.abc.Clock` that never waits for real.

A simulation is ``trio.run(main, clock=sim.clock)``: the same clock is trio's notion of time
(``trio.current_time()``, ``trio.sleep``, ``move_on_after``) and the simulator's ``now``, so trio
timers and modeled costs live on one time line (docs/architecture.md "Time and cost",
docs/performance.md "Virtual time").

Time only moves forward, and only when nothing can run at the current instant:

* trio asks the clock how long to sleep (``deadline_to_sleep_time``) only when its run queue is
  empty, i.e. when every task is parked.  The owning :class:`~stacklib.sim.world.Simulation`
  runs its due events right there (see ``world.py``); when nothing of its own is due before
  trio's next deadline the clock jumps straight to that deadline and answers 0 ("autojump"),
  which makes plain ``trio.sleep`` exact and instant.
* Tasks in ``trio.testing.wait_all_tasks_blocked`` are woken before the clock jumps, as under
  trio's own ``MockClock``: the clock answers the true virtual distance to the deadline, trio sees
  a sleep longer than the waiters' cushion and wakes them instead of expiring anything.  trio
  keeps its waiters private (``Runner.waiting_for_idle``, read through ``getattr`` guards); with
  another trio the clock sees none and jumps, so such waiters then wake only when no deadline is
  left.  A waiter that only re-waits (a loop of ``wait_all_tasks_blocked`` and checkpoints) gets
  one wake-up per idle instant and then time moves on: it must not stall the simulation.

Determinism: trio shuffles each batch of runnable tasks with a module-level ``random.Random``
and breaks ties between equal deadlines by ``id()`` of the cancel scopes.  For a run to repeat
exactly, :meth:`VirtualClock.start_clock` seeds that generator from the simulation seed and turns
on the scheduling mode trio keeps for hypothesis (sort each batch by spawn order, then shuffle
with the seeded generator), so neither memory addresses nor hash seeds leak into the order.  Both
are private to trio, hence the ``getattr`` guards; both are restored when the run ends.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable
from typing import Protocol

import attrs
import trio
import trio.lowlevel

__all__ = ["VirtualClock", "derive_seed"]


def derive_seed(seed: int, stream: str) -> int:
    """A 64-bit seed for one named random stream of a run with ``seed``.

    Hash-based, so it is the same in every process (unlike ``hash()``) and streams do not
    perturb each other: adding a stream never changes the numbers another stream draws.
    """
    digest = hashlib.sha256(f"{seed}\x00{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class _ClockOwner(Protocol):
    """What a simulation provides to the clock it owns (see ``world.Simulation``)."""

    def _on_run_start(self) -> None: ...

    def _on_run_end(self) -> None: ...

    def _sleep_time(self, deadline: float) -> float: ...


class _IdleWaiters(Protocol):
    """trio's private ``Runner.waiting_for_idle``: a SortedDict ``{(cushion, id(task)): task}``."""

    def __len__(self) -> int: ...

    def items(self) -> Iterable[tuple[tuple[float, int], trio.lowlevel.Task]]: ...


class _Deadlines(Protocol):
    """trio's private ``Runner.deadlines``."""

    def next_deadline(self) -> float: ...


class _Runner(Protocol):
    """What the inline charge reads of trio's private ``Runner`` (world.Simulation._park_until)."""

    deadlines: _Deadlines
    ki_pending: bool


def _find_runner() -> _Runner | None:
    """The current run's trio ``Runner`` if it and its tasks have what an inline charge reads
    (world.Simulation._park_until), else None: then every charge parks its task."""
    run_module = getattr(getattr(trio, "_core", None), "_run", None)
    runner = getattr(getattr(run_module, "GLOBAL_RUN_CONTEXT", None), "runner", None)
    task_class = getattr(run_module, "Task", None)
    try:
        task_fields = {field.name for field in attrs.fields(task_class)}  # type: ignore[arg-type]
    except (TypeError, attrs.exceptions.NotAnAttrsClassError):
        return None
    if (
        not callable(getattr(getattr(runner, "deadlines", None), "next_deadline", None))
        or not isinstance(getattr(runner, "ki_pending", None), bool)
        or not {"_cancel_status", "_cancel_points", "_schedule_points"} <= task_fields
    ):
        return None
    return runner


def _find_idle_waiters() -> _IdleWaiters | None:
    """The current run's ``wait_all_tasks_blocked`` waiters, or None on another trio."""
    run_module = getattr(getattr(trio, "_core", None), "_run", None)
    runner = getattr(getattr(run_module, "GLOBAL_RUN_CONTEXT", None), "runner", None)
    waiters = getattr(runner, "waiting_for_idle", None)
    if waiters is None or not hasattr(waiters, "items") or not hasattr(waiters, "__len__"):
        return None
    return waiters  # type: ignore[no-any-return]


class _RunGuard(trio.abc.Instrument):
    """The clock's instrument for one run: counts wake-ups, restores trio's state at the end.

    ``scheduled`` counts tasks made runnable by any trio primitive (Event, channel, reschedule,
    cancellation): comparing it before and after a heap event is a public and cheap way to ask
    "did this callback wake a task?" (``current_statistics()`` costs about 1.4 us a call).
    While idle waiters woken by the clock are being watched, it also tells whether anything but
    those waiters ran since (see :meth:`VirtualClock._idle_or_jump`).
    """

    __slots__ = ("_clock", "_saved", "hits", "scheduled", "strangers", "watched")

    def __init__(self, clock: VirtualClock, saved: tuple[object, ...] | None) -> None:
        self._clock = clock
        self._saved = saved
        self.scheduled = 0
        self.watched: frozenset[trio.lowlevel.Task] | None = None
        self.hits = 0  # watched tasks scheduled since watch()
        self.strangers = 0  # other tasks scheduled since watch()

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.scheduled += 1
        watched = self.watched
        if watched is not None:
            if task in watched:
                self.hits += 1
            else:
                self.strangers += 1

    def watch(self, tasks: Iterable[trio.lowlevel.Task]) -> None:
        self.watched = frozenset(tasks)
        self.hits = self.strangers = 0

    def spinning(self) -> bool:
        """The watched waiters were woken, and nothing but them has run since."""
        return self.watched is not None and self.hits > 0 and self.strangers == 0

    def after_run(self) -> None:
        _restore_scheduler(self._saved)
        clock = self._clock
        clock._guard = None
        clock._waiters = None
        clock._runner = None
        owner = clock._owner
        if owner is not None:
            owner._on_run_end()


_FLAG = "_ALLOW_DETERMINISTIC_SCHEDULING"


def _seed_scheduler(seed: int) -> tuple[object, ...] | None:
    """Make trio's batch order a function of ``seed``; returns what to restore afterwards."""
    run_module = getattr(getattr(trio, "_core", None), "_run", None)
    generator = getattr(run_module, "_r", None)
    if not isinstance(generator, random.Random) or not hasattr(run_module, _FLAG):
        return None  # another trio version: runs stay correct, maybe not repeatable
    saved = (generator.getstate(), getattr(run_module, _FLAG))
    generator.seed(derive_seed(seed, "trio.scheduler"))
    setattr(run_module, _FLAG, True)
    return saved


def _restore_scheduler(saved: tuple[object, ...] | None) -> None:
    if saved is None:
        return
    run_module = trio._core._run
    state, flag = saved
    run_module._r.setstate(state)  # type: ignore[arg-type]
    setattr(run_module, _FLAG, flag)


class VirtualClock(trio.abc.Clock):
    """Virtual seconds, starting at 0.0; trio never sleeps for real under this clock.

    Time persists across runs with the same clock (a second ``trio.run`` continues where the
    first stopped), like :class:`trio.testing.MockClock`.  Not thread-safe: a simulation is one
    thread.  Work done for real in other threads (``trio.to_thread``) takes no virtual time and
    virtual time may jump while it runs.
    """

    __slots__ = ("_guard", "_jumps", "_now", "_owner", "_runner", "_waiters", "seed")

    def __init__(self, seed: int = 0) -> None:
        self._now = 0.0
        self.seed = seed
        self._jumps = 0  # times the clock moved forward onto a trio deadline
        self._owner: _ClockOwner | None = None
        self._guard: _RunGuard | None = None  # per run
        self._waiters: _IdleWaiters | None = None  # per run
        self._runner: _Runner | None = None  # per run; None: charges always park

    def __repr__(self) -> str:
        return f"<VirtualClock t={self._now!r}s seed={self.seed}>"

    def _attach(self, owner: _ClockOwner) -> None:
        if self._owner is not None and self._owner is not owner:
            raise RuntimeError("this VirtualClock already belongs to another Simulation")
        self._owner = owner

    def _idle_or_jump(self, deadline: float) -> float:
        """The answer to trio when nothing but trio's own ``deadline`` can happen next.

        Wake idle waiters if there are any (return the virtual distance: trio compares it with
        their cushion and wakes them without expiring anything), else move onto the deadline and
        return 0 so trio expires it in this very pass.
        """
        if deadline == math.inf:
            # trio wakes idle waiters itself (cushion < inf); without any, nothing will ever
            # happen: a deadlock hangs, as in any trio program.
            return math.inf
        now = self._now
        guard = self._guard
        waiters = self._waiters
        if waiters and guard is not None:
            (cushion, _), _task = next(iter(waiters.items()))
            if deadline - now > cushion and not guard.spinning():
                # Watch the ones trio is about to wake (all waiters with the smallest cushion):
                # if they merely wait again, the next idle pass moves time instead.
                guard.watch(task for (c, _), task in waiters.items() if c == cushion)
                return deadline - now
        if guard is not None:
            guard.watched = None
        if deadline > now:
            self._now = deadline
            self._jumps += 1
        return 0.0

    # trio.abc.Clock

    def start_clock(self) -> None:
        # Called inside trio.run before any task exists: no task can be spawned here, but
        # instruments can be installed and the runner is already set up.
        self._guard = _RunGuard(self, _seed_scheduler(self.seed))
        self._waiters = _find_idle_waiters()
        self._runner = _find_runner()
        trio.lowlevel.add_instrument(self._guard)
        if self._owner is not None:
            self._owner._on_run_start()

    def current_time(self) -> float:
        return self._now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # trio calls this only when no task is runnable.  Returning 0 while nothing expires
        # would make trio spin and starve wait_all_tasks_blocked, so every answer either makes
        # something runnable in this pass (an event woke a task, a deadline is due now) or is
        # the true virtual distance to the deadline with idle waiters to wake.
        owner = self._owner
        if owner is not None:
            return owner._sleep_time(deadline)
        return self._idle_or_jump(deadline)
