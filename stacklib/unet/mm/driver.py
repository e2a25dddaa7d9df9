"""A thin trio driver for the U-Net/MM core: charges its steps and runs the page-in thread.

An NI model holds one :class:`MmDriver` per NI.  :meth:`MmDriver.send` translates a send buffer,
charging every step to the host's resources in sequence (the i960 busy-waits a miss, paper 002
§5.1.1), and waits while its endpoint is suspended for a page-in; other endpoints' calls proceed
meanwhile.  :meth:`MmDriver.run` is the in-kernel thread of paper 002 §5.1.1: it sleeps until the
core's next page-in deadline, completes it, charges the pinning and wakes the endpoint.
"""

from __future__ import annotations

import trio

from stacklib.sim import Host
from stacklib.unet.mm.core import (
    Arrival,
    BufferReturned,
    MemoryManager,
    PageInDone,
    Resumed,
    Status,
    Translation,
)
from stacklib.unet.mm.costs import acharge_steps

__all__ = ["MmDriver"]


class MmDriver:
    """Drive a :class:`MemoryManager` in (virtual or real) trio time on ``host``."""

    def __init__(self, host: Host, mm: MemoryManager) -> None:
        self.host = host
        self.mm = mm
        self.returned: list[BufferReturned] = []
        self._resumed: dict[int, trio.Event] = {}
        self._timer_changed = trio.Event()
        self._completed = trio.Event()

    async def run(self) -> None:
        """The page-in thread; run it in a nursery for as long as the NI lives."""
        while True:
            deadline = self.mm.get_timer()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self._timer_changed.wait()
            if self._timer_changed.is_set():
                self._timer_changed = trio.Event()
            self.mm.handle_timer(trio.current_time())
            await self.drain()

    async def drain(self) -> None:
        """Handle the core's events: charge page-in pinning, wake resumed endpoints."""
        while (event := self.mm.next_event()) is not None:
            if isinstance(event, PageInDone):
                await acharge_steps(self.host, event.steps)
            elif isinstance(event, Resumed):
                waiter = self._resumed.pop(event.endpoint, None)
                if waiter is not None:
                    waiter.set()
            else:
                self.returned.append(event)

    async def send(self, endpoint: int, address: int, length: int) -> Translation:
        """Translate a send buffer, waiting through page-ins and full TLBs; OK or ERROR."""
        while True:
            result = self.mm.translate_send(trio.current_time(), endpoint, address, length)
            await acharge_steps(self.host, result.steps)
            if result.status in (Status.OK, Status.ERROR):
                return result
            if result.status is Status.NO_ROOM:
                await self._completed.wait()
                continue
            # DEFERRED or SUSPENDED: sleep until this endpoint's page-in is done.
            waiter = self._resumed.setdefault(endpoint, trio.Event())
            self._timer_changed.set()
            await waiter.wait()

    async def pretranslate(self, endpoint: int) -> None:
        """Pre-translate ``endpoint``'s free buffers, charging the work."""
        steps = self.mm.pretranslate(trio.current_time(), endpoint)
        self._timer_changed.set()
        await acharge_steps(self.host, steps)
        await self.drain()

    async def arrival(self, endpoint: int, length: int) -> Arrival:
        """Choose the buffers of an arriving message, charging the lookups."""
        result = self.mm.arrival(trio.current_time(), endpoint, length)
        await acharge_steps(self.host, result.steps)
        await self.drain()
        return result

    async def complete(self, transfer: int) -> None:
        """A DMA is done: release its pages (and charge any unpinning that frees)."""
        await acharge_steps(self.host, self.mm.complete(transfer))
        self._completed.set()
        self._completed = trio.Event()
