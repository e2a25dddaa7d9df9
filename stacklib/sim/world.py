"""The two worlds stacklib code runs in: real time, or a deterministic simulation.

All stacklib code takes time from trio and schedules work through a :class:`World`; one code
path serves both (docs/architecture.md, "Time and cost", explains the design):

* :class:`RealWorld`: real transports; time is ``trio.current_time()``; scheduled callbacks run
  at once, because a real system has already spent the modeled time for real.
* :class:`Simulation`: virtual time.  NI models, links, switches and the sans-IO protocol cores
  below the application run as plain callbacks from a heap of timed events, popped by the
  virtual clock when trio has no runnable task; trio tasks are woken only at the application
  boundary, at the virtual instant of the event that woke them.

Contracts of a simulation:

* Events run in time order, and in scheduling order at equal times; events due at the same
  instant as a trio deadline run before the timer fires.
* With no event, no trio deadline and nobody in ``wait_all_tasks_blocked``, the run ends with
  :class:`~stacklib.errors.Deadlock` naming the waiting tasks (``detect_deadlock=False``: it
  waits, for a run that waits for real I/O in virtual time).
* A task charging a modeled cost that nothing else can interleave with moves the clock itself
  instead of parking (``inline_charges=False`` parks for every charge): the same times, order
  and checkpoint counters, fewer simulator events.  :meth:`Resource.try_charge` is that test
  without a coroutine.
* Callbacks run between trio's passes, not in a task: they may use trio primitives that work
  outside a task (``Event.set``, ``send_nowait``, ``CancelScope.cancel``,
  ``trio.lowlevel.reschedule``, ``spawn_system_task``), must not checkpoint, and must not move a
  trio deadline earlier than the one being waited for.
* ``trio.testing.wait_all_tasks_blocked`` returns once every task is parked and no heap event is
  due before trio's next deadline, before the clock jumps to it (as under ``MockClock``).
* A callback that raises ends the run; :meth:`Simulation.run` re-raises its exception (trio
  itself would report a crashed system task as :class:`trio.TrioInternalError`).
"""

from __future__ import annotations

import abc
import heapq
import itertools
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple, Unpack

import attrs
import trio
import trio.lowlevel

from stacklib.errors import Deadlock
from stacklib.sim.clock import VirtualClock, _RunGuard, derive_seed
from stacklib.sim.resources import Resource

__all__ = ["RealWorld", "Simulation", "SimulationStatistics", "World"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_Event = tuple[float, int, Callable[..., object], tuple[object, ...]]

# Bound once: looked up on every event of the hot path.
_heappush = heapq.heappush
_INF = math.inf
_current_task = trio.lowlevel.current_task
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_reschedule = trio.lowlevel.reschedule


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

    def _charge_inline(self, when: float) -> bool:
        """Spend a charge ending at ``when`` without parking the calling task, if that changes
        nothing; True if done (:meth:`Resource.use` then skips :meth:`_park_until`)."""
        return False

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
    task_wakeups: int  # events after which a woken trio task was let run
    deadline_jumps: int  # times the clock moved forward onto a trio deadline
    driver_rounds: int  # times trio found every task parked with an event due (events ran)
    charges_inline: int = 0  # Resource.use charges that moved the clock without parking


class _Waiter:
    """A task parked until a heap event; cancelling it leaves the event to fire harmlessly."""

    __slots__ = ("cancelled", "task")

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.cancelled = False

    def wake(self) -> None:
        if not self.cancelled:
            _reschedule(self.task)

    def abort(self, raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        self.cancelled = True
        return trio.lowlevel.Abort.SUCCEEDED


class Simulation(World):
    """A deterministic simulated world in virtual time.

    Run it with ``sim.run(main)`` or ``trio.run(main, clock=sim.clock)``.  The same seed gives
    the same numbers on every run, in any process.
    """

    virtual = True

    def __init__(
        self, seed: int = 0, *, inline_charges: bool = True, detect_deadlock: bool = True
    ) -> None:
        super().__init__(seed)
        #: Let a task charge a modeled cost without parking when parking would change nothing
        #: (``_charge_inline``); False parks for every charge (for comparisons: same results).
        self.inline_charges = inline_charges
        #: End a run that can never go on with :class:`~stacklib.errors.Deadlock` (False: wait,
        #: as trio does, e.g. for real I/O in virtual time).
        self.detect_deadlock = detect_deadlock
        self.clock = VirtualClock(seed)
        self.clock._attach(self)
        self.events_processed = 0
        self._heap: list[_Event] = []
        self._sequence = itertools.count()
        self._task_wakeups = 0
        self._driver_rounds = 0
        self._charges_inline = 0
        #: ``counter.scheduled`` right after an event woke one task alone, else -1.
        self._solo = -1
        # Per trio run:
        self._in_run = False
        self._counter: _RunGuard | None = None  # the clock's instrument for this run
        self._watcher: trio.lowlevel.Task | None = None  # spawned with the first due event
        self._watcher_parked = False
        self._stopped = False  # shutting down, or a callback failed: no more events this run
        self._failure: BaseException | None = None

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
        if not when >= self.clock._now or when == _INF:
            raise ValueError(
                f"call_at({when!r}): must be a finite time not before now ({self.clock._now!r})"
            )
        _heappush(self._heap, (when, next(self._sequence), fn, args))

    def call_after(self, delay: float, fn: Callable[..., object], *args: object) -> None:
        """Schedule ``fn(*args)`` ``delay`` virtual seconds from now."""
        if not 0.0 <= delay < math.inf:
            raise ValueError(f"call_after({delay!r}): delay must be finite and >= 0")
        heapq.heappush(self._heap, (self.clock._now + delay, next(self._sequence), fn, args))

    def _charge_inline(self, when: float) -> bool:
        """Move the clock to ``when`` for the calling task without parking it, if that is
        exactly what parking would do; True if it did (module docstring, "The inline charge")."""
        # This task is the only one trio runs in this pass and nothing else is runnable (no
        # task scheduled since the event that woke it alone); no heap event and no trio
        # deadline falls before ``when`` (an equal one would run first or in the same batch)
        # and no cancellation is pending.  Parked, the task would be woken by its own event,
        # alone, at ``when``, in the very next pass: moving the clock here is the same step
        # without the pass.
        heap = self._heap
        clock = self.clock
        if (heap and heap[0][0] <= when) or not clock._now <= when < _INF:
            return False
        if not self._alone_until(when):
            return False
        counter = self._counter
        assert counter is not None  # _alone_until checked it
        task = _current_task()
        if task._cancel_status.effectively_cancelled:
            return False
        # The counters a parked wait_task_rescheduled would move (trio.testing's
        # assert_checkpoints still sees a checkpoint).
        task._cancel_points += 1
        task._schedule_points += 1
        counter.watched = None  # time moved: idle waiters may be woken again
        clock._now = when
        self._charges_inline += 1
        return True

    def _skip_schedule_point(self) -> bool:
        """Count a schedule point (``cancel_shielded_checkpoint``) for the calling task without
        yielding, if yielding would change nothing; True if done.

        It would not when the task is the only one trio runs in this pass and nothing has been
        scheduled since (the inline charge's test, module docstring) and no trio deadline is
        due now: trio would find the task alone in its run queue, run no heap event (it asks
        the clock only with an empty queue) and resume it at once, without a random draw (a
        batch of one is not shuffled).
        """
        if not self._alone_until(self.clock._now):
            return False
        _current_task()._schedule_points += 1
        return True

    def _alone_until(self, when: float) -> bool:
        """The calling task is the only one trio runs in this pass, nothing has been scheduled
        since the event that woke it, and no trio deadline or keyboard interrupt comes before
        ``when`` (the test of the inline charge and of a skipped schedule point)."""
        counter = self._counter
        if counter is None or counter.scheduled != self._solo or not self.inline_charges:
            return False
        runner = self.clock._runner
        return not (runner is None or runner.ki_pending or runner.deadlines.next_deadline() <= when)

    async def _park_until(self, when: float) -> None:
        if not self._in_run:
            raise RuntimeError(
                f"{self!r} is not running: use sim.run(main) or trio.run(main, clock=sim.clock)"
            )
        waiter = _Waiter(_current_task())
        # call_at(when, waiter.wake), inlined (the hot path of every modeled host cost): the
        # same check and the same heap entry, so the same sequence number and order.
        if not when >= self.clock._now or when == _INF:
            self.call_at(when, waiter.wake)  # raises the ValueError
        _heappush(self._heap, (when, next(self._sequence), waiter.wake, ()))
        await _wait_task_rescheduled(waiter.abort)

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
            deadline_jumps=self.clock._jumps,
            driver_rounds=self._driver_rounds,
            charges_inline=self._charges_inline,
        )

    # Hooks called by the clock (see clock._ClockOwner)

    def _on_run_start(self) -> None:
        global RUNNING
        RUNNING = self
        self._in_run = True
        self._solo = -1
        self._counter = self.clock._guard
        self._watcher = None
        self._watcher_parked = False
        self._stopped = False
        self._failure = None

    def _on_run_end(self) -> None:
        global RUNNING
        if RUNNING is self:
            RUNNING = None
        self._in_run = False
        self._solo = -1
        self._counter = None
        self._watcher = None
        self._watcher_parked = False

    def _sleep_time(self, deadline: float) -> float:
        """trio's run queue is empty: run the events due up to ``deadline``, then answer trio."""
        heap = self._heap
        if not heap or heap[0][0] > deadline or self._stopped:
            if deadline == _INF and not heap and self._stalled():
                return 0.0
            return self.clock._idle_or_jump(deadline)
        if self._watcher is None and not self._start_watcher():
            return self.clock._idle_or_jump(deadline)
        # Pop events in time order up to ``deadline``, until one wakes a task (inlined here,
        # where trio asks once per pass of its loop, rather than one call further down).
        clock = self.clock
        counter = self._counter
        assert counter is not None  # set by the clock's start_clock for every run
        heappop = heapq.heappop
        counter.watched = None  # events are progress: idle waiters may be woken again
        self._driver_rounds += 1
        self._solo = -1  # no task runs alone while callbacks run (Resource.try_charge from one)
        mark = counter.scheduled  # after the watcher's spawn, which is not an event's wake-up
        processed = 0
        try:
            while True:
                when, _, fn, args = heappop(heap)
                if when > clock._now:
                    clock._now = when
                processed += 1
                fn(*args)
                scheduled = counter.scheduled
                if scheduled != mark:
                    # Let the woken task run now, at this instant, before any later event.
                    self._task_wakeups += 1
                    # trio's next batch is exactly the tasks scheduled since ``mark`` (its run
                    # queue was empty, or it would not have asked the clock) plus a watcher
                    # spawned in this pass: one task alone may charge inline (_charge_inline).
                    self._solo = scheduled if scheduled == mark + 1 and self._watcher_parked else -1
                    return 0.0
                if not heap or heap[0][0] > deadline:
                    break
        except BaseException as exc:
            # Raising here would crash trio's run loop (TrioInternalError without the cause
            # attached the way a crashed task has it): hand the error to the watcher instead.
            self._fail(exc)
            return 0.0
        finally:
            self.events_processed += processed
        return clock._idle_or_jump(deadline)

    def _stalled(self) -> bool:
        """Nothing can ever happen again: end the run with :class:`Deadlock` (if detecting)."""
        waiters = self.clock._waiters  # None: this trio hides them, so trio may yet wake some
        if not self.detect_deadlock or self._stopped or waiters is None or waiters:
            return False
        if self._watcher is None and not self._start_watcher():
            return False
        waiting = Counter(_parked_tasks(self._watcher))
        shown = ", ".join(
            f"{count} x {name}" if count > 1 else name for name, count in sorted(waiting.items())
        )
        self._fail(
            Deadlock(
                f"deadlock at t={self.clock._now * 1e6:.3f} us of virtual time: every task "
                f"waits and no event or timer is pending ({waiting.total()} waiting: {shown})"
            )
        )
        return True

    def _start_watcher(self) -> bool:
        """Spawn the watcher with the first due event of a run; False if the run is ending."""
        try:
            watcher = trio.lowlevel.spawn_system_task(self._watch, name="stacklib.sim watcher")
        except RuntimeError:  # the system nursery is closed: every task is done
            self._stopped = True
            return False
        self._watcher = watcher
        nursery = watcher.parent_nursery
        if nursery is not None and nursery.cancel_scope.cancel_called:
            # The main task is done and trio is cancelling the system tasks: the events wait
            # for the next run (the watcher, cancelled at once, exits quietly).
            self._stopped = True
            return False
        return True

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self._stopped = True
        if self._watcher_parked:
            self._watcher_parked = False
            assert self._watcher is not None
            trio.lowlevel.reschedule(self._watcher)
        # else: the watcher was spawned in this very pass and sees the failure when it starts

    async def _watch(self) -> None:
        """Park for the whole run; raise a failed callback's exception; notice shutdown."""
        if self._failure is None:
            self._watcher_parked = True
            await trio.lowlevel.wait_task_rescheduled(self._watcher_abort)
        failure = self._failure
        if failure is not None:
            raise failure

    def _watcher_abort(self, raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        # Only the system nursery's cancellation reaches the watcher: the main task is done and
        # the run is shutting down, so stop running events (they wait for the next run).
        self._watcher_parked = False
        self._stopped = True
        return trio.lowlevel.Abort.SUCCEEDED


#: The simulation running in this process, if one is: read by progress displays
#: (stacklib.reporting.progress) from their own thread, to show the virtual time simulated.
RUNNING: Simulation | None = None


def _parked_tasks(watcher: trio.lowlevel.Task | None) -> list[str]:
    """The names of the run's tasks that have no children (the ones actually waiting), trio's
    own system tasks left out."""
    names: list[str] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None or task is watcher:
            continue
        children = [child for nursery in task.child_nurseries for child in nursery.child_tasks]
        if children:
            stack.extend(children)
        elif not task.name.startswith("<"):  # trio's own, e.g. <TrioToken.run_sync_soon task>
            names.append(task.name)
    return names
