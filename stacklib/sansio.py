"""The sans-IO contract: what every protocol machine offers its driver.

A protocol machine (docs/architecture.md, "A protocol = format + sans-IO core + trio driver")
holds the state of one conversation and makes every decision, but does no I/O and reads no
clock: the driver passes ``now`` (seconds on whatever clock it runs) into each call that may
start or fire a timer.  :class:`Machine` writes the shape down, in the aioquic style:

* input: :meth:`~Machine.receive` a datagram from the peer (any bytes: a machine never raises
  on bad input, it drops and counts it), :meth:`~Machine.handle_timer` when the deadline from
  :meth:`~Machine.get_timer` has passed (calling it early does nothing);
* output, pulled: :meth:`~Machine.datagrams_to_send` (each handed out once, in order),
  :meth:`~Machine.next_event` (events for the application, None when there are none) and
  :meth:`~Machine.get_timer` (the next deadline, None when no timer runs).

Application inputs (send a message, a request, ...) are each protocol's own and take ``now``
too.  :class:`stacklib.driver.Driver` runs any :class:`Machine` over a datagram service;
:mod:`stacklib.testing` joins two of them by a scripted faulty link.  This module imports
nothing but the standard library, so machines and tests may use it without trio.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["Machine", "MachineT"]

E_co = TypeVar("E_co", covariant=True)


@runtime_checkable
class Machine(Protocol[E_co]):
    """A sans-IO protocol machine for one peer; ``E_co`` is the type of its events.

    ``isinstance(x, Machine)`` checks that the five methods exist (not their signatures: mypy
    checks those, e.g. ``machine: Machine[Event] = ArqMachine()``).
    """

    def receive(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        """Feed one datagram from the peer; bad input is dropped and counted, never raised."""
        ...

    def datagrams_to_send(self, now: float) -> list[bytes]:
        """The datagrams to transmit now, oldest first; each is returned once."""
        ...

    def get_timer(self) -> float | None:
        """When to call :meth:`handle_timer` next, or None if no timer is running."""
        ...

    def handle_timer(self, now: float) -> None:
        """Act on the timers that have expired at ``now`` (nothing if none has)."""
        ...

    def next_event(self) -> E_co | None:
        """The next event for the application, or None."""
        ...


MachineT = TypeVar("MachineT", bound="Machine[object]")
"""A type variable for code generic over machines (drivers, test links)."""
