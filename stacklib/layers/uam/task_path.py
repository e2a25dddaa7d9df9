"""UAM's task path: over any datagram service, with the generic trio driver.

:class:`stacklib.driver.Driver` runs the service's machines: its receive task feeds them the
datagrams from below (acknowledgments take effect at once; handlers wait for a poll, or the
poller with ``background_poll``), its pump fires timers and transmits.  Where the NI models the
host, both charge UAM's costs to its CPU (:class:`~stacklib.layers.uam.paths.HostCosts`).
This is the path over the Myrinet libraries' datagram face, over a service that changes what
U-Net sends (a test's faulty link), and, with ``UamService.event_path = False``, the
reference the event path is compared with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stacklib.compiled import mypyc_attr
from stacklib.driver import Driver
from stacklib.layers.uam.machine import UamMachine
from stacklib.layers.uam.paths import ExecutionPath, Task
from stacklib.services import DatagramService

if TYPE_CHECKING:
    from stacklib.layers.uam.service import UamService

__all__ = ["TaskPath"]


@mypyc_attr(allow_interpreted_subclasses=True)
class TaskPath(ExecutionPath):
    """The task path of ``service`` over ``below``."""

    name = "task"

    def __init__(self, service: UamService, below: DatagramService) -> None:
        super().__init__(service)
        self._unpolled = False  # a machine may have events for poll()
        costs = service.host_costs
        self.driver: Driver[UamMachine] = Driver(
            below,
            service._add_machine,
            machines=service._machines,
            on_input=self._on_input,
            on_timer=self._on_timer,
            on_output=self._on_output,
            on_progress=service._wake,
            charge=self._charge if costs is not None else None,
        )

    def start(self) -> list[Task]:
        """The driver's receive task and pump, and the poller with ``background_poll``."""
        service = self.service
        self.driver.now = service._now
        tasks = list(self.driver.tasks("uam"))
        if service._params.background_poll:
            tasks.append((self.poller, "uam poller"))
        return tasks

    def kick(self, peer: int | None, now: float | None = None) -> None:
        self.driver.kick()

    def poll(self) -> int:
        if not self._unpolled:
            return 0
        service = self.service
        count = 0
        try:
            for peer, machine in service._machine_items:
                if machine.pending:
                    count += service._run_handlers(peer, machine)
            # Everything taken; if a handler raised, the flag stays set for what is left.
            self._unpolled = False
        finally:
            service._current_machine = None
            if count:
                self.driver.kick()
        return count

    # ------------------------------------------------------------------ the driver's hooks

    def _on_input(self, peer: int, machine: UamMachine) -> None:
        if machine.pending:
            self._unpolled = True
            self._arrival.set()

    def _on_timer(self, peer: int, machine: UamMachine) -> None:
        if machine.pending:
            self._unpolled = True
            self._arrival.set()  # a PeerFailed to report
            self.service._wake()

    def _on_output(self, peer: int) -> None:
        self.service._wake()  # the backlog moved: senders waiting for it may go on

    async def _charge(self, datagram: bytes) -> None:
        # Copy into a send buffer, or out of a receive buffer (paper 000 §5.1.2); try_charge
        # is use() without a coroutine when the charge needs no parking.
        costs = self.service._costs
        assert costs is not None
        cost = costs.cost(datagram)
        if not costs.cpu.try_charge(cost):
            await costs.cpu.use(cost)
