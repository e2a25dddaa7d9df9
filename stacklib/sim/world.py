"""The two worlds stacklib code runs in: real time, or a deterministic simulation.

All stacklib code takes time from trio and schedules work through a :class:`World`.  One code
path serves both worlds (docs: ARCHITECTURE.md "Time and cost"):

* :class:`RealWorld`: real transports; time is ``trio.current_time()``; scheduled callbacks run
  at once, because a real system has already spent the modeled time for real.
* :class:`Simulation`: virtual time.  NI models, links, switches and the sans-IO protocol cores
  below the application run as plain callbacks from a heap of timed events; trio tasks are woken
  only at the application boundary.  A heap event costs about 0.2 us, a trio wake-up or sleep
  in virtual time about 15 us (``_bench.py``; PERFORMANCE-NOTES.md "Virtual time"), which is
  why modeled costs are heap events and not sleeps.

How a simulation runs inside trio.  One driver task (a trio system task, started on demand)
loops: wait until every other task is parked (``wait_all_tasks_blocked``), then pop heap events
in time order, never past trio's next deadline, moving the clock to each event's time; stop
right after an event that made a task runnable, so that task runs at that very instant before
any later event; with no event before trio's deadline, move the clock to the deadline so trio
fires the timer.  With no events at all the driver parks and the clock alone jumps from one trio
deadline to the next.  Events at equal times run in the order they were scheduled; events due at
the same instant as a trio deadline run before the timer fires.

Whether an event woke a task is known from an instrument counting ``task_scheduled``, so
callbacks may use any trio primitive (``Event.set``, memory channels, ``CancelScope.cancel``,
``trio.lowlevel.reschedule``).  Application code should not itself wait in
``wait_all_tasks_blocked`` inside a simulation: it is woken in the same batch as the driver, so
events may then run while it is runnable (still deterministic, just not "idle first").

A callback that raises ends the run: trio reports a crashed system task as
:class:`trio.TrioInternalError` (the callback's exception is in its ``__cause__``);
:meth:`Simulation.run` re-raises the callback's own exception instead.
"""

from __future__ import annotations

import abc
import heapq
import itertools
import math
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple, Unpack

import attrs
import trio
import trio.lowlevel
import trio.testing

from stacklib.sim.clock import VirtualClock, derive_seed
from stacklib.sim.resources import Resource

__all__ = ["RealWorld", "Simulation", "SimulationStatistics", "World"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_Event = tuple[float, int, Callable[..., object], tuple[object, ...]]


class World(abc.ABC):
    """Where time comes from and how timed work is scheduled."""

    virtual: bool
    seed: int

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rngs: dict[str, random.Random] = {}

    def rng(self, stream: str) -> random.Random:
        """The random stream ``stream``: a function of (seed, name) only, one object per name.

        Give each consumer (a lossy link, a workload) its own stream so that adding randomness
        in one place never changes the numbers drawn in another.
        """
        generator = self._rngs.get(stream)
        if generator is None:
            generator = self._rngs[stream] = random.Random(derive_seed(self.seed, stream))
        return generator

    def resource(self, name: str) -> Resource:
        """A new :class:`Resource` in this world (not cached: hosts own and cache theirs)."""
        return Resource(name, self)

    @abc.abstractmethod
    async def _park_until(self, when: float) -> None:
        """Park the calling task until time ``when`` (cancellable); see :meth:`Resource.use`."""

    @abc.abstractmethod
    def now(self) -> float:
        """Current time in seconds, on trio's clock."""

    @abc.abstractmethod
    def call_at(self, when: float, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` at time ``when``."""

    @abc.abstractmethod
    def call_after(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` ``delay`` seconds from now."""


class RealWorld(World):
    """Real time: modeled costs cost nothing, because real time is spent for real."""

    virtual = False

    def __repr__(self) -> str:
        return f"<RealWorld seed={self.seed}>"

    def now(self) -> float:
        return trio.current_time()

    def call_at(self, when: float, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` right away: the modeled delay has already passed for real."""
        fn(*args)

    def call_after(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        """Call ``fn(*args)`` right away (see :meth:`call_at`)."""
        fn(*args)

    async def _park_until(self, when: float) -> None:
        """Return at once, without a checkpoint: the modeled time has passed for real."""


@attrs.frozen
class SimulationStatistics:
    """A snapshot of a simulation's counters (trio style: a frozen ``statistics()`` record)."""

    seed: int
    now: float
    events_processed: int
    events_pending: int
    task_wakeups: int  # events after which the driver let a woken trio task run
    deadline_jumps: int  # times the driver moved the clock to a trio deadline
    driver_rounds: int  # times the driver resumed because every other task was parked


class _WakeCounter(trio.abc.Instrument):
    """Counts tasks made runnable, whatever trio primitive did it (Event, channel, reschedule).

    The driver compares the count before and after each event: a public and cheap way to ask
    "did this callback wake a task?" (``current_statistics()`` costs about 1.4 us a call).
    """

    __slots__ = ("scheduled",)

    def __init__(self) -> None:
        self.scheduled = 0

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.scheduled += 1


def _abort_park(raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.SUCCEEDED


class _Waiter:
    """A task parked until a heap event; cancelling it leaves the event to fire harmlessly."""

    __slots__ = ("cancelled", "task")

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.cancelled = False

    def wake(self) -> None:
        if not self.cancelled:
            trio.lowlevel.reschedule(self.task)

    def abort(self, raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        self.cancelled = True
        return trio.lowlevel.Abort.SUCCEEDED


class Simulation(World):
    """A deterministic simulated world in virtual time.

    Run it with ``sim.run(main)`` or ``trio.run(main, clock=sim.clock)``.  The same seed gives
    the same numbers on every run, in any process.
    """

    virtual = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.clock = VirtualClock(seed)
        self.clock._attach(self)
        self.events_processed = 0
        self._heap: list[_Event] = []
        self._sequence = itertools.count()
        self._task_wakeups = 0
        self._deadline_jumps = 0
        self._driver_rounds = 0
        # Per trio run:
        self._in_run = False
        self._driver: trio.lowlevel.Task | None = None
        self._driver_done = False  # the driver exited (run shutting down): do not respawn
        self._parked = False  # the driver waits for the first event (empty heap)
        self._wakes = _WakeCounter()
        self._failure: BaseException | None = None
        self._seen_deadline = math.inf  # what trio last passed to the clock with events pending
        self._seen_mark = -1  # ... and the wake count then (see _drive_loop)

    def __repr__(self) -> str:
        return (
            f"<Simulation seed={self.seed} t={self.clock._now!r}s "
            f"pending={len(self._heap)} processed={self.events_processed}>"
        )

    # World

    def now(self) -> float:
        return self.clock._now

    def call_at(self, when: float, fn: Callable[..., object], *args: object) -> None:
        """Schedule ``fn(*args)`` at virtual time ``when`` (FIFO among equal times)."""
        if not when >= self.clock._now or when == math.inf:
            raise ValueError(
                f"call_at({when!r}): must be a finite time not before now ({self.clock._now!r})"
            )
        heapq.heappush(self._heap, (when, next(self._sequence), fn, args))
        if self._driver is None or self._parked:
            self._kick()

    def call_after(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        """Schedule ``fn(*args)`` ``delay`` virtual seconds from now."""
        if not 0.0 <= delay < math.inf:
            raise ValueError(f"call_after({delay!r}): delay must be finite and >= 0")
        heapq.heappush(self._heap, (self.clock._now + delay, next(self._sequence), fn, args))
        if self._driver is None or self._parked:
            self._kick()

    async def _park_until(self, when: float) -> None:
        if not self._in_run:
            raise RuntimeError(
                f"{self!r} is not running: use sim.run(main) or trio.run(main, clock=sim.clock)"
            )
        waiter = _Waiter(trio.lowlevel.current_task())
        self.call_at(when, waiter.wake)
        await trio.lowlevel.wait_task_rescheduled(waiter.abort)

    # Running

    @property
    def running(self) -> bool:
        """True while a ``trio.run`` under this simulation's clock is in progress."""
        return self._in_run

    def run(self, async_fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: *Ts) -> T:
        """``trio.run(async_fn, *args, clock=self.clock)``, re-raising a failed callback's error."""
        try:
            result = trio.run(async_fn, *args, clock=self.clock)
        except trio.TrioInternalError:
            failure, self._failure = self._failure, None
            if failure is None:
                raise
        else:
            return result
        raise failure  # outside the except block: no misleading implicit exception context

    def statistics(self) -> SimulationStatistics:
        return SimulationStatistics(
            seed=self.seed,
            now=self.clock._now,
            events_processed=self.events_processed,
            events_pending=len(self._heap),
            task_wakeups=self._task_wakeups,
            deadline_jumps=self._deadline_jumps,
            driver_rounds=self._driver_rounds,
        )

    # Hooks called by the clock (see clock._ClockOwner)

    def _on_run_start(self) -> None:
        self._in_run = True
        self._driver = None
        self._driver_done = False
        self._parked = False
        self._failure = None
        self._wakes = _WakeCounter()
        trio.lowlevel.add_instrument(self._wakes)

    def _on_run_end(self) -> None:
        self._in_run = False
        self._driver = None
        self._parked = False

    def _sleep_time(self, deadline: float) -> float | None:
        """The clock's answer while events are pending; None lets the clock autojump."""
        if not self._heap or not self._in_run or self._driver_done:
            return None
        if self._driver is None or self._parked:
            self._kick()  # events from before trio.run, or pushed from outside any task
            return 0.0
        # The driver is parked in wait_all_tasks_blocked: a positive time lets trio see the
        # loop idle and wake it; at or past the deadline trio expires the timer first.
        self._seen_deadline = deadline
        self._seen_mark = self._wakes.scheduled
        return max(0.0, deadline - self.clock._now)

    # The driver

    def _kick(self) -> None:
        """Start the driver for this run, or wake it from its empty-heap park."""
        if not self._in_run or self._driver_done:
            return  # not running under our clock: the events wait for sim.run
        if self._driver is None:
            self._driver = trio.lowlevel.spawn_system_task(self._drive, name="stacklib.sim driver")
        elif self._parked:
            self._parked = False
            trio.lowlevel.reschedule(self._driver)

    async def _drive(self) -> None:
        try:
            await self._drive_loop()
        finally:
            self._driver_done = True
            self._driver = None
            self._parked = False

    async def _drive_loop(self) -> None:
        heap = self._heap
        clock = self.clock
        wakes = self._wakes
        statistics = trio.lowlevel.current_statistics
        heappop = heapq.heappop
        while True:
            if not heap:
                self._parked = True
                await trio.lowlevel.wait_task_rescheduled(_abort_park)
                continue
            await trio.testing.wait_all_tasks_blocked()
            self._driver_rounds += 1
            if wakes.scheduled == self._seen_mark + 1:
                # Only this task was scheduled since trio last asked the clock, so nothing ran
                # that could have moved a deadline: the deadline trio passed is exact and fresh.
                horizon = self._seen_deadline
                exact = True
            else:
                # Another task ran in between (one also waiting for idle): re-read trio's state,
                # and let whatever it made runnable run first.
                state = statistics()
                if state.tasks_runnable:
                    continue
                horizon = clock._now + state.seconds_to_next_deadline
                exact = False
            processed = 0
            try:
                while heap and heap[0][0] <= horizon:
                    when, _, fn, args = heappop(heap)
                    if when > clock._now:
                        clock._now = when
                    mark = wakes.scheduled
                    processed += 1
                    fn(*args)
                    if wakes.scheduled != mark:
                        self._task_wakeups += 1
                        break
                else:
                    if horizon != math.inf:
                        self._jump_to_deadline(horizon, exact)
            except BaseException as exc:
                self._failure = exc
                raise
            finally:
                self.events_processed += processed

    def _jump_to_deadline(self, target: float, exact: bool) -> None:
        """Move the clock onto trio's next deadline so trio expires it.

        An inexact target (``now + seconds_to_next_deadline``) can round one ulp short of the
        deadline; trio would then find the loop idle again with nothing expired, forever.
        Step up to it.
        """
        clock = self.clock
        clock._advance(target)
        if not exact:
            while trio.lowlevel.current_statistics().seconds_to_next_deadline > 0.0:
                clock._now = math.nextafter(clock._now, math.inf)
        self._deadline_jumps += 1
