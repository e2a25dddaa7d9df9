"""Two sans-IO machines joined by a scripted faulty link, run at explicit times.

:class:`Link` is the test loop of docs/testing.md: machines ``a`` and ``b`` (any
:class:`~stacklib.sansio.Machine`), a fixed one-way ``delay``, and :class:`Faults` on every
datagram either sends.  :meth:`Link.run` processes arrivals and timers in time order
(arrivals first on ties, then ``a``'s timer before ``b``'s), so "drop the 3rd datagram" and
"the retransmission goes out at exactly 2 delays + rto" are plain assertions::

    link = Link(ArqMachine(rto=1.0), ArqMachine(rto=1.0), delay=0.01,
                faults=Faults(script={3: "drop"}))
    link.input("a", lambda machine, now: machine.send(b"hello", now))
    link.run(until=10.0)

After every input and every arrival or timer, each side's events are handled (``handle``;
by default collected in :attr:`Link.events`) and then its datagrams are put on the link.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import Generic

import attrs

from stacklib.sansio import MachineT
from stacklib.testing.faults import CORRUPT, DROP, DUPLICATE, REORDER, Faults, late_by

__all__ = ["SIDES", "Link", "Sent"]

SIDES = ("a", "b")


@attrs.frozen
class Sent:
    """One datagram put on the link: its number (from 1, both directions together), when,
    by which side, its bytes as sent, and the fault decided for it (None: unharmed)."""

    number: int
    time: float
    source: str
    datagram: bytes
    fault: str | None


class Link(Generic[MachineT]):
    """Machines ``a`` and ``b`` joined by a link (see the module docstring).

    ``faults`` is a :class:`Faults` or a script (datagram number -> fault name); ``silent``
    names a side whose datagrams are all lost (still numbered).  ``handle(side, machine)``
    takes a side's events after each step; the default appends ``(now, event)`` to
    ``events[side]``.
    """

    def __init__(
        self,
        a: MachineT,
        b: MachineT,
        *,
        delay: float,
        faults: Faults | Mapping[int, str] | None = None,
        silent: str | None = None,
        handle: Callable[[str, MachineT], object] | None = None,
    ) -> None:
        if not delay >= 0:
            raise ValueError(f"delay must not be negative, got {delay!r}")
        if silent is not None and silent not in SIDES:
            raise ValueError(f"silent must be 'a', 'b' or None, got {silent!r}")
        self.a, self.b = a, b
        self.delay = delay
        self.faults = faults if isinstance(faults, Faults) else Faults(script=faults or {})
        self.silent = silent
        self.now = 0.0
        self.sent: list[Sent] = []
        self.events: dict[str, list[tuple[float, object]]] = {side: [] for side in SIDES}
        self._handle = handle if handle is not None else self._collect_events
        self._flight: list[tuple[float, int, str, bytes]] = []
        self._held: dict[str, bytes] = {}
        self._order = 0

    def __repr__(self) -> str:
        return f"<Link at {self.now}: {len(self.sent)} sent, {len(self._flight)} in flight>"

    def machine(self, side: str) -> MachineT:
        """Machine ``"a"`` or ``"b"``."""
        if side not in SIDES:
            raise ValueError(f"a side is 'a' or 'b', got {side!r}")
        return self.a if side == "a" else self.b

    def input(self, side: str, action: Callable[[MachineT, float], object]) -> None:
        """Apply an application input now (``action(machine, now)``), then step the link."""
        action(self.machine(side), self.now)
        self.flush()

    def flush(self) -> None:
        """Handle each side's events and put its datagrams on the link (after input by hand)."""
        for side, other in (("a", "b"), ("b", "a")):
            machine = self.machine(side)
            self._handle(side, machine)
            for datagram in machine.datagrams_to_send(self.now):
                fault = self.faults.next()
                if self.silent == side:
                    fault = DROP
                self.sent.append(Sent(len(self.sent) + 1, self.now, side, datagram, fault))
                self._put(other, datagram, fault)

    def run(self, until: float) -> None:
        """Process arrivals and timers in time order up to ``until``; ``now`` ends there."""
        self.flush()
        while True:
            arrival = self._flight[0][0] if self._flight else None
            timers = [
                (deadline, side)
                for side in SIDES
                if (deadline := self.machine(side).get_timer()) is not None
            ]
            timer = min(timers) if timers else None
            if arrival is not None and (timer is None or arrival <= timer[0]):
                if arrival > until:
                    break
                self.now, _, destination, datagram = heapq.heappop(self._flight)
                self.machine(destination).receive(datagram, self.now)
            elif timer is not None and timer[0] <= until:
                self.now = timer[0]
                self.machine(timer[1]).handle_timer(self.now)
            else:
                break
            self.flush()
        self.now = max(self.now, until)

    def from_side(self, source: str) -> list[Sent]:
        """What ``source`` put on the link, in order."""
        return [sent for sent in self.sent if sent.source == source]

    def in_flight(self) -> int:
        """Datagrams on their way (held ones not counted)."""
        return len(self._flight)

    def _collect_events(self, side: str, machine: MachineT) -> None:
        events = self.events[side]
        while (event := machine.next_event()) is not None:
            events.append((self.now, event))

    def _put(self, destination: str, datagram: bytes, fault: str | None) -> None:
        if fault == REORDER and destination in self._held:
            fault = None  # one datagram held per direction: this one passes
        self.faults.tally(fault)
        if fault == DROP:
            return
        if fault == REORDER:
            self._held[destination] = datagram
            return
        arrival = self.now + self.delay
        if fault == CORRUPT:
            datagram = self.faults.corrupter(datagram)
        late = late_by(fault)
        if late is not None:
            arrival += late
        for _ in range(2 if fault == DUPLICATE else 1):
            self._push(arrival, destination, datagram)
        held = self._held.pop(destination, None)
        if held is not None:
            self._push(arrival, destination, held)  # right behind the one that overtook it

    def _push(self, arrival: float, destination: str, datagram: bytes) -> None:
        self._order += 1
        heapq.heappush(self._flight, (arrival, self._order, destination, datagram))
