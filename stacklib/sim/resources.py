"""Named resources of a host and the one interface that charges modeled costs to them.

A modeled cost holds a resource (host CPU ``"cpu"``, NI processor ``"ni"``, I/O bus ``"bus"``,
link ``"link"``, any name) for its duration.  Holds of one resource queue up FIFO; holds of
different resources overlap.  Contention and overlap are therefore not modeled case by case:
they emerge.  That is the difference paper 003 §4.4.3 draws between U-Net/FE, where the host CPU
is busy for the whole send trap, and U-Net/ATM, where the host is free while the i960 works.

In the real world a charge costs nothing (real time is spent for real): holds complete at once
and only the counters move.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stacklib.sim.costs import CostProfile
    from stacklib.sim.world import World

__all__ = ["Host", "Resource"]


class Resource:
    """A server that does one thing at a time, first come first served.

    ``busy_time`` and ``holds`` count every hold (in both worlds: they total the modeled cost);
    ``busy_until`` is when the last reservation ends (virtual worlds only).
    """

    __slots__ = ("busy_time", "busy_until", "holds", "name", "world")

    def __init__(self, name: str, world: World) -> None:
        self.name = name
        self.world = world
        self.busy_until = 0.0
        self.busy_time = 0.0
        self.holds = 0

    def __repr__(self) -> str:
        return (
            f"<Resource {self.name!r} holds={self.holds} busy_time={self.busy_time!r}"
            f" busy_until={self.busy_until!r}>"
        )

    def hold(
        self, duration: float, then: Callable[..., object] | None = None, *args: object
    ) -> float:
        """Reserve the resource for ``duration`` seconds after the holds already queued.

        The hold starts at ``max(now, busy_until)``; ``then(*args)`` is called when it ends.
        Returns the end time.  In the real world ``then`` is called right away and the result
        is ``now``.
        """
        if not 0.0 <= duration < math.inf:
            raise ValueError(
                f"{self.name}: hold duration must be finite and >= 0, not {duration!r}"
            )
        self.holds += 1
        self.busy_time += duration
        world = self.world
        if not world.virtual:
            if then is not None:
                then(*args)
            return world.now()
        now = world.now()
        busy_until = self.busy_until
        end = (busy_until if busy_until > now else now) + duration
        self.busy_until = end
        if then is not None:
            world.call_at(end, then, *args)
        return end

    async def use(self, duration: float) -> None:
        """:meth:`hold` from a trio task: returns when the hold ends.

        Cancelling returns early, but the reservation stays: the resource was committed and
        later holds still queue behind it.  In the real world this returns at once, without a
        checkpoint.  In a simulation a task that nothing else can overtake during the hold
        moves the clock without parking (the inline charge, world.py): the same times, one
        pass of trio's loop fewer.
        """
        world = self.world
        if not world.virtual or not 0.0 <= duration < math.inf:
            self.hold(duration)  # returns at once in the real world; raises on a bad duration
            return
        # hold(duration) inlined for the virtual world (every modeled host cost comes here):
        # the same counters and the same arithmetic, so the same end time.
        self.holds += 1
        self.busy_time += duration
        now = world.now()
        busy_until = self.busy_until
        end = (busy_until if busy_until > now else now) + duration
        self.busy_until = end
        if not world._charge_inline(end):
            await world._park_until(end)

    def try_charge(self, duration: float) -> bool:
        """:meth:`use` when it would not park (the inline charge, world.py), without a
        coroutine: True if the hold is done and the clock moved past it; False, with nothing
        held, if the calling task must ``await use(duration)`` (the real world, a bad duration,
        or a charge that has to park: another task could run, an event or deadline falls
        within it, or a cancellation is pending).  From a heap callback it is always False:
        only a task can be charged this way (a callback holds with :meth:`hold`)."""
        world = self.world
        if not world.virtual or not 0.0 <= duration < math.inf:
            return False
        # use()'s arithmetic; the clock moves only if the inline charge applies, and the
        # counters are updated after it, as nothing reads them in between.
        now = world.now()
        busy_until = self.busy_until
        end = (busy_until if busy_until > now else now) + duration
        if not world._charge_inline(end):
            return False
        self.holds += 1
        self.busy_time += duration
        self.busy_until = end
        return True

    def utilization(self, elapsed: float) -> float:
        """Fraction of ``elapsed`` seconds spent holding (``busy_time / elapsed``).

        Reservations that end after the measurement count in full.
        """
        if not elapsed > 0.0:
            raise ValueError(f"{self.name}: elapsed must be > 0, not {elapsed!r}")
        return self.busy_time / elapsed


class Host:
    """A machine: its named resources and the cost profile that prices its operations.

    ``host.charge("udp.checksum", nbytes)`` is the one interface through which stacklib charges
    modeled costs (docs/architecture.md "Time and cost"); the profile says which resource pays.
    """

    def __init__(self, name: str, world: World, profile: CostProfile | None = None) -> None:
        self.name = name
        self.world = world
        self.profile = profile
        self._resources: dict[str, Resource] = {}
        self.resources: Mapping[str, Resource] = types.MappingProxyType(self._resources)

    def __repr__(self) -> str:
        profile = self.profile.name if self.profile is not None else None
        return f"<Host {self.name!r} profile={profile!r} resources={sorted(self._resources)}>"

    def resource(self, name: str) -> Resource:
        """The host's resource ``name``, created on first use."""
        resource = self._resources.get(name)
        if resource is None:
            resource = self._resources[name] = Resource(name, self.world)
        return resource

    def cost(self, op: str, nbytes: int = 0) -> float:
        """Seconds ``op`` on ``nbytes`` costs by the profile; 0.0 without a profile."""
        profile = self.profile
        if profile is None:
            return 0.0
        return profile.cost(op).seconds(nbytes)

    def charge(
        self,
        op: str,
        nbytes: int = 0,
        then: Callable[..., object] | None = None,
        *args: object,
    ) -> float:
        """Hold the resource the profile names for ``op`` for its cost; see :meth:`Resource.hold`.

        Without a profile nothing is held: ``then(*args)`` is scheduled now and now is returned.
        """
        profile = self.profile
        if profile is None:
            if then is not None:
                self.world.call_at(self.world.now(), then, *args)
            return self.world.now()
        cost = profile.cost(op)
        return self.resource(cost.resource).hold(cost.seconds(nbytes), then, *args)

    async def acharge(self, op: str, nbytes: int = 0) -> None:
        """:meth:`charge` from a trio task: returns when the hold ends (at once without profile)."""
        profile = self.profile
        if profile is None:
            return
        cost = profile.cost(op)
        await self.resource(cost.resource).use(cost.seconds(nbytes))
