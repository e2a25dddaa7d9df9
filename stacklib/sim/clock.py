"""Virtual time for trio: a :class:`trio.abc.Clock` that never waits for real.

A simulation is ``trio.run(main, clock=sim.clock)``: the same clock is trio's notion of time
(``trio.current_time()``, ``trio.sleep``, ``move_on_after``) and the simulator's ``now``, so trio
timers and modeled costs live on one time line (docs: ARCHITECTURE.md "Time and cost",
PERFORMANCE-NOTES.md "Virtual time").

Time only moves forward, and only when nothing can run at the current instant:

* trio asks the clock how long to sleep (``deadline_to_sleep_time``) only when its run queue is
  empty.  With no simulated events pending the clock jumps straight to trio's next deadline and
  answers 0 ("autojump"), which makes plain ``trio.sleep`` exact and instant.
* With events pending the owning :class:`~stacklib.sim.world.Simulation` answers instead: its
  driver task moves the clock from event to event (see ``world.py``).

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
from typing import Protocol

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

    def _sleep_time(self, deadline: float) -> float | None: ...


class _RunGuard(trio.abc.Instrument):
    """Restores trio's scheduler randomness when a simulated run ends (``after_run``)."""

    def __init__(self, clock: VirtualClock, saved: tuple[object, ...] | None) -> None:
        self._clock = clock
        self._saved = saved

    def after_run(self) -> None:
        _restore_scheduler(self._saved)
        owner = self._clock._owner
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

    __slots__ = ("_guard", "_now", "_owner", "seed")

    def __init__(self, seed: int = 0) -> None:
        self._now = 0.0
        self.seed = seed
        self._owner: _ClockOwner | None = None
        self._guard: _RunGuard | None = None

    def __repr__(self) -> str:
        return f"<VirtualClock t={self._now!r}s seed={self.seed}>"

    def _attach(self, owner: _ClockOwner) -> None:
        if self._owner is not None and self._owner is not owner:
            raise RuntimeError("this VirtualClock already belongs to another Simulation")
        self._owner = owner

    def _advance(self, when: float) -> None:
        """Move time forward to ``when`` (never backwards)."""
        if when > self._now:
            self._now = when

    # trio.abc.Clock

    def start_clock(self) -> None:
        # Called inside trio.run before any task exists: no task can be spawned here, but
        # instruments can be installed.
        self._guard = _RunGuard(self, _seed_scheduler(self.seed))
        trio.lowlevel.add_instrument(self._guard)
        if self._owner is not None:
            self._owner._on_run_start()

    def current_time(self) -> float:
        return self._now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        # trio calls this only when no task is runnable.  Returning 0 while nothing expires
        # would starve wait_all_tasks_blocked (trio would never see the loop idle), so either
        # make the deadline due now (autojump) or report the true virtual distance to it.
        owner = self._owner
        if owner is not None:
            answer = owner._sleep_time(deadline)
            if answer is not None:
                return answer
        if math.isinf(deadline):
            return math.inf  # nothing will ever happen: a deadlock hangs, as in any trio program
        self._advance(deadline)
        return 0.0
