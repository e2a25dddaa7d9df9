"""One trio driver for sans-IO machines over a datagram service.

A protocol layer keeps one :class:`~stacklib.sansio.Machine` per peer; :class:`Driver` runs
them over the :class:`~stacklib.services.DatagramService` below with two tasks (start them
with :meth:`Driver.tasks`, e.g. through :func:`stacklib.stack.serve`):

* the *receive task* reads a datagram from below, feeds it to its peer's machine (made on
  first contact) and hands the machine to the layer (``on_input``), then kicks the pump;
* the *pump*, the only task that writes below, fires expired timers (``on_timer``), transmits
  what every machine wants sent, and sleeps until the earliest machine deadline or a
  :meth:`~Driver.kick`.

The layer makes the decisions the protocol leaves to it through hooks, each optional:
``on_event(peer, event)`` receives every event the machines produce (unless ``on_input`` and
``on_timer`` are given, which then take them themselves, e.g. only when the application
polls); ``admit()`` is awaited before each read (flow control: a layer whose application stops
reading stops reading too); ``charge(datagram)`` is awaited for each datagram received and
sent (a layer that charges modeled host CPU time); ``on_output(peer)`` runs before a machine's
datagrams go out and ``on_progress()`` after each input (wake senders waiting for room);
``on_end()`` when the service below ends.

The application's calls feed the machines directly (``driver.machine(peer).send(data,
driver.now())``) and then :meth:`~Driver.kick` the pump: they never transmit themselves, so a
cancelled call has queued nothing or everything.  When the service below lends its
:class:`~stacklib.unet.Endpoint` (:meth:`~stacklib.services.Service.capability`), the tasks use
its ``recv`` and ``send`` directly: the same effect, one coroutine less per datagram.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic

import trio

from stacklib.sansio import MachineT
from stacklib.services import DatagramService
from stacklib.unet.endpoint import Endpoint

__all__ = ["Driver", "Task"]

Task = tuple[Callable[[], Awaitable[None]], str]
"""A background task as :func:`stacklib.stack.serve` takes it: (function, name)."""


class Driver(Generic[MachineT]):
    """Runs one sans-IO machine per peer over ``below`` (see the module docstring).

    ``new_machine(peer)`` makes the machine of a peer first heard from (or first sent to,
    through :meth:`machine`); ``machines`` is the table to keep them in (default: a new dict;
    the layer may share its own).  ``clock`` gives ``now`` (default ``trio.current_time``).
    """

    def __init__(
        self,
        below: DatagramService,
        new_machine: Callable[[int], MachineT],
        *,
        machines: dict[int, MachineT] | None = None,
        on_event: Callable[[int, Any], object] | None = None,
        on_input: Callable[[int, MachineT], object] | None = None,
        on_timer: Callable[[int, MachineT], object] | None = None,
        on_output: Callable[[int], object] | None = None,
        on_progress: Callable[[], object] | None = None,
        admit: Callable[[], Awaitable[object]] | None = None,
        charge: Callable[[bytes], Awaitable[object]] | None = None,
        on_end: Callable[[], object] | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.below = below
        self.machines: dict[int, MachineT] = {} if machines is None else machines
        self.now = clock
        self._new_machine = new_machine
        self._on_event = on_event
        self._on_input = on_input if on_input is not None else self.take_events
        self._on_timer = on_timer if on_timer is not None else self.take_events
        self._on_output = on_output
        self._on_progress = on_progress
        self._admit = admit
        self._charge = charge
        self._on_end = on_end
        self._kick_event = trio.Event()

    def __repr__(self) -> str:
        return f"<Driver over {self.below!r}, {len(self.machines)} machines>"

    def machine(self, peer: int) -> MachineT:
        """The machine for ``peer``, made with ``new_machine`` if there is none yet (the
        caller checks that ``peer`` is one of ``below.peers``)."""
        machine = self.machines.get(peer)
        if machine is None:
            machine = self.machines[peer] = self._new_machine(peer)
        return machine

    def kick(self) -> None:
        """Something may be ready to send, or a timer moved earlier: the pump looks again."""
        self._kick_event.set()

    def take_events(self, peer: int, machine: MachineT) -> int:
        """Hand every event ``machine`` has to ``on_event``; returns how many."""
        on_event = self._on_event
        count = 0
        if on_event is None:
            return count
        while (event := machine.next_event()) is not None:
            count += 1
            on_event(peer, event)
        return count

    def tasks(self, name: str) -> Sequence[Task]:
        """The receive task and the pump, named after the layer (``"arq receive"``, ...)."""
        return [(self.receive_loop, f"{name} receive"), (self.pump, f"{name} pump")]

    async def receive_loop(self) -> None:
        """Feed datagrams from below to their machines until the service below ends."""
        below = self.below
        endpoint = below.capability(Endpoint)
        admit, charge, now = self._admit, self._charge, self.now
        on_input, on_progress = self._on_input, self._on_progress
        while True:
            if admit is not None:
                await admit()
            try:
                if endpoint is not None:
                    message = await endpoint.recv()
                    peer, datagram = message.channel, message.data
                else:
                    peer, datagram = await below.recv()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                if self._on_end is not None:
                    self._on_end()
                return
            if charge is not None:
                await charge(datagram)
            machine = self.machine(peer)
            machine.receive(datagram, now())
            on_input(peer, machine)
            self.kick()  # an acknowledgment to send, or window room for what waits
            if on_progress is not None:
                on_progress()

    async def pump(self) -> None:
        """Fire timers, transmit, and sleep until the next deadline or a kick; forever."""
        below = self.below
        endpoint = below.capability(Endpoint)
        send = endpoint.send if endpoint is not None else below.send
        charge, now = self._charge, self.now
        on_timer, on_output = self._on_timer, self._on_output
        while True:
            # A fresh event before looking at the machines: a kick from now on is not missed.
            kick = self._kick_event = trio.Event()
            deadline = math.inf
            # A snapshot: a machine may be added while this task awaits a send.
            for peer, machine in list(self.machines.items()):
                timer = machine.get_timer()
                if timer is not None and timer <= now():
                    machine.handle_timer(now())
                    on_timer(peer, machine)
                datagrams = machine.datagrams_to_send(now())
                if datagrams:
                    if on_output is not None:
                        on_output(peer)
                    for datagram in datagrams:
                        if charge is not None:
                            await charge(datagram)
                        await send(peer, datagram)
                timer = machine.get_timer()
                if timer is not None and timer < deadline:
                    deadline = timer
            if deadline == math.inf:
                await kick.wait()  # no timer: no cancel scope to build and tear down
            else:
                with trio.move_on_at(deadline):
                    await kick.wait()
