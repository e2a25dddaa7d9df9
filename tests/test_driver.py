"""stacklib.driver.Driver: one trio driver for any sans-IO machine over a datagram service."""

from __future__ import annotations

from collections import deque

import trio
import trio.lowlevel

from stacklib.driver import Driver
from stacklib.services import DatagramService
from stacklib.sim import Simulation
from stacklib.testing import run_virtual, two_nodes


class Echo:
    """A machine that echoes every datagram once (prefixed b"re:"), and reports what it got;
    ``timer`` fires once and sends b"tick"."""

    def __init__(self, timer: float | None = None) -> None:
        self.outbox: list[bytes] = []
        self.events: deque[bytes] = deque()
        self.timer = timer

    def receive(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        data = bytes(datagram)
        self.events.append(data)
        if not data.startswith((b"re:", b"tick")):
            self.outbox.append(b"re:" + data)

    def datagrams_to_send(self, now: float) -> list[bytes]:
        out, self.outbox = self.outbox, []
        return out

    def get_timer(self) -> float | None:
        return self.timer

    def handle_timer(self, now: float) -> None:
        if self.timer is not None and now >= self.timer:
            self.timer = None
            self.outbox.append(b"tick")

    def next_event(self) -> bytes | None:
        return self.events.popleft() if self.events else None


def test_the_driver_feeds_machines_fires_timers_and_surfaces_events() -> None:
    seen: dict[str, list[tuple[float, int, bytes]]] = {"a": [], "b": []}
    charged: list[bytes] = []
    admitted = [0]
    peers: list[int] = []

    async def main(sim: Simulation) -> None:
        async with two_nodes(sim) as (a, b), trio.open_nursery() as nursery:

            async def admit() -> None:
                admitted[0] += 1

            async def charge(datagram: bytes) -> None:
                charged.append(datagram)

            drivers = {}
            for name, node, timer in (("a", a, None), ("b", b, 0.5)):
                drivers[name] = Driver(
                    node.service,  # type: ignore[arg-type]
                    lambda peer, timer=timer: Echo(timer),
                    on_event=lambda peer, event, name=name: seen[name].append(
                        (trio.current_time(), peer, event)
                    ),
                    admit=admit,
                    charge=charge,
                )
                for function, task in drivers[name].tasks(f"echo {name}"):
                    nursery.start_soon(function, name=task)
            peers.append(b.peer)
            drivers["b"].machine(b.peer)  # b knows a before a says anything: its timer runs
            machine = drivers["a"].machine(a.peer)
            machine.outbox.append(b"hello")
            drivers["a"].kick()
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()

    run_virtual(main)
    assert [(peer, data) for _, peer, data in seen["b"]] == [(peers[0], b"hello")]
    assert [data for _, _, data in seen["a"]] == [b"re:hello", b"tick"]
    assert seen["a"][1][0] == 0.5  # b's timer fired at exactly 0.5 (no latency by default)
    assert sorted(charged) == sorted([b"hello", b"hello", b"re:hello", b"re:hello"] + [b"tick"] * 2)
    assert admitted[0] == 2 + 3  # once before each read, and once more for each waiting one


class Ended(DatagramService):
    """A service whose input has ended."""

    peers = (1, 2)
    max_message = 10

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        raise AssertionError("nothing to send")

    async def recv(self) -> tuple[int, bytes]:
        await trio.lowlevel.checkpoint()
        raise trio.EndOfChannel


async def test_the_receive_task_ends_with_the_service_below() -> None:
    ended: list[bool] = []
    driver = Driver(Ended(), lambda peer: Echo(), on_end=lambda: ended.append(True))
    with trio.fail_after(1):
        await driver.receive_loop()
    assert ended == [True]


def test_machine_makes_each_peer_once_and_shares_the_callers_table() -> None:
    made: list[int] = []
    table: dict[int, Echo] = {}

    def new(peer: int) -> Echo:
        made.append(peer)
        return Echo()

    driver = Driver(Ended(), new, machines=table)
    assert driver.machine(1) is driver.machine(1) is table[1]
    driver.machine(2)
    assert made == [1, 2]
    table[1].events.append(b"kept")
    assert driver.take_events(1, table[1]) == 0  # no on_event: events stay with the machine
    assert table[1].next_event() == b"kept"
