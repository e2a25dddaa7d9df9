"""UAM's lean poll and sends over shm against the general forms (``LeanPath.fast = False``),
with and without the express lane (the machine reading and writing the rings itself,
``LeanPath.express``): the same scripted exchanges, with loss and duplication, give the same
datagrams on the wire, the same handler calls and the same counters; arrivals another task
took, and the rest after a raising handler, still run at the next poll."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import stacklib
from stacklib.errors import PeerGone, UNetError
from stacklib.layers.uam import LeanPath, UamLayer, UamParams, UamService
from stacklib.services import UNetService
from stacklib.transports.shm import ShmAddress, ShmNetwork
from stacklib.unet import Endpoint, EndpointConfig

BIG = EndpointConfig(segment_size=512 * 1024, tx_buffers=32, rx_buffers=48, free_queue=64)
RTO = 4e-3


def shm_pair(network: ShmNetwork) -> list[tuple[Endpoint, int]]:
    pair = []
    for name, other in (("a", "b"), ("b", "a")):
        node = network.add_node(name)
        endpoint = node.os.create_endpoint(node.os.process(f"app-{name}"), BIG, port=1)
        channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress(other, 1))
        pair.append((endpoint, channel))
    return pair


#: How a service's lean path runs: (fast, express).
MODES = {"general": (False, False), "lean": (True, False), "express": (True, True)}


def set_mode(am: UamService, mode: str) -> None:
    path = am.path
    assert isinstance(path, LeanPath)
    path.fast, path.express = MODES[mode]


class Wire:
    """Records every datagram an endpoint sends and drops or duplicates the ones the script
    names (by their index among that endpoint's sends), whether it goes through the endpoint's
    ``send_payload`` or straight into the queue the express lane writes."""

    def __init__(self, endpoint: Endpoint, log: list[tuple[str, bytes]], side: str) -> None:
        self.send = endpoint.send_payload
        self.log, self.side = log, side
        self.count = 0
        self.faults: dict[int, str] = {}
        self.express_writes = 0
        self.uncounted = (0, 0)  # sends the endpoint did not count: (messages, bytes)
        endpoint.send_payload = self.send_payload  # type: ignore[method-assign]
        express_tx = endpoint.express_tx  # type: ignore[attr-defined]

        def lend(channel: int) -> Any:
            queue = express_tx(channel)
            return None if queue is None else FaultyQueue(self, queue)

        endpoint.express_tx = lend  # type: ignore[attr-defined]

    def send_payload(self, channel: int, data: Any) -> None:
        index, self.count = self.count, self.count + 1
        fault = self.faults.pop(index, None)
        self.log.append((self.side + ("-" + fault if fault else ""), bytes(data)))
        if fault == "refuse":  # the endpoint's queue is full: the pump offers it again
            raise trio.WouldBlock
        if fault == "reject":  # the NI rejects it at once: lost, go-back-N resends it
            raise UNetError("the NI rejected the message (test)")
        if fault == "gone":  # the peer is gone: the application hears of it
            raise PeerGone("the peer is gone (test)")
        if fault == "drop":
            return
        if fault == "dup":
            self.send(channel, data)
        self.send(channel, data)


class FaultyQueue:
    """The queue the express lane writes, with the wire's faults: a drop or a duplicate here;
    the faults that only the endpoint's send can show (a full send queue, a rejection, a gone
    peer) refuse the datagram, which then goes to ``send_payload`` and meets them there."""

    def __init__(self, wire: Wire, queue: Any) -> None:
        self.wire, self.queue = wire, queue
        self.max_message = queue.max_message

    def take(self) -> Any:
        raise AssertionError("the express lane only writes the send queue")

    def try_write(self, data: bytes) -> int:
        wire = self.wire
        fault = wire.faults.get(wire.count)
        if fault in ("refuse", "reject", "gone"):
            return 0
        wire.faults.pop(wire.count, None)
        wire.count += 1
        wire.express_writes += 1
        wire.log.append((wire.side + ("-" + fault if fault else ""), bytes(data)))
        # The endpoint counts what the express lane wrote, a drop here too and a duplicate
        # once; the general path's drops and duplicates are before the endpoint's count.
        if fault == "drop":
            wire.uncounted = (wire.uncounted[0] - 1, wire.uncounted[1] - len(data))
            return 1
        if fault == "dup":
            wire.uncounted = (wire.uncounted[0] + 1, wire.uncounted[1] + len(data))
            self.queue.try_write(data)
        written: int = self.queue.try_write(data)
        return written


async def settle(clock: trio.testing.MockClock, seconds: float = 0.0) -> None:
    """Let the background tasks run (timers due after ``seconds`` of the run's clock)."""
    clock.jump(seconds)
    for _ in range(10):
        await trio.sleep(0)


async def exchange(mode: str, clock: trio.testing.MockClock) -> dict[str, Any]:
    """A scripted conversation between a (requests) and b (replies), with faults; returns
    everything observable."""
    logs: dict[str, list[tuple[str, bytes]]] = {"a": [], "b": []}  # each side in order
    calls: list[tuple[str, tuple[int, ...]]] = []
    polls: list[int] = []
    # b's timeout is longer, so that the two sides' timers never expire together (their tasks
    # would then run in trio's order, which varies).
    params = UamParams(background_poll=False, window=4, rto_us=RTO * 1e6, max_retries=50)
    slow = attrs.evolve(params, rto_us=3.3 * RTO * 1e6)
    with ShmNetwork(spin_time=0.0) as network:
        (ep_a, ch_a), (ep_b, ch_b) = shm_pair(network)
        wire_a, wire_b = Wire(ep_a, logs["a"], "a"), Wire(ep_b, logs["b"], "b")
        async with (
            UamLayer(params).open(UNetService(ep_a)) as a,
            UamLayer(slow).open(UNetService(ep_b)) as b,
        ):
            for am in (a, b):
                set_mode(am, mode)
            b.register_handler(lambda peer, *args: b.reply(1, *args), 0)
            b.register_handler(lambda peer, *args: calls.append(("note", args)), 2)
            a.register_handler(lambda peer, *args: calls.append(("pong", args)), 1)

            def step(*requests: tuple[int, ...]) -> None:
                for words in requests:
                    a.request_nowait(ch_a, words[0], *words[1:])
                polls.append(b.poll())
                polls.append(a.poll())

            for i in range(3):  # plain ping-pong
                step((0, i, 2, 3, 4))
            step((0, 10), (2, 11), (0, 12), (0,))  # a full window in one burst
            wire_a.faults[wire_a.count] = "drop"  # a request lost: go-back-N resends it
            step((0, 20), (0, 21))
            await settle(clock, 1.5 * RTO)
            step()
            wire_a.faults[wire_a.count] = "dup"  # a request twice: handled once, ACKed again
            step((0, 30))
            wire_b.faults[wire_b.count] = "drop"  # a reply lost: a resends its request first,
            step((0, 40))
            await settle(clock, 1.5 * RTO)  # which b acknowledges again,
            step()
            await settle(clock, 2 * RTO)  # then b resends the reply
            step()
            await settle(clock, 2 * RTO)  # delayed acknowledgments go out
            step()
            wire_a.faults[wire_a.count] = "refuse"  # the endpoint refuses a request for now
            step((0, 50), (0, 51))
            await settle(clock, 1e-4)
            step()
            wire_b.faults[wire_b.count] = "reject"  # the NI rejects a reply: lost, resent
            step((0, 60))
            await settle(clock, 2 * RTO)  # a's request goes again, b acknowledges it again,
            step()
            await settle(clock, 2 * RTO)  # then b resends the reply
            step()
            stats = [attrs.asdict(am.peer_statistics(ch)) for am, ch in ((a, ch_a), (b, ch_b))]
            rejected = [am.statistics()["rejected"] for am in (a, b)]
            counters = [
                (
                    ep.received,
                    ep.received_bytes,
                    ep.sent + wire.uncounted[0],
                    ep.sent_bytes + wire.uncounted[1],
                )
                for ep, wire in ((ep_a, wire_a), (ep_b, wire_b))
            ]
    # The express lane wrote (most of) what it sent itself; the other modes never.
    express_writes = wire_a.express_writes + wire_b.express_writes
    assert express_writes > 20 if mode == "express" else express_writes == 0
    return {
        "wire": logs,
        "calls": calls,
        "polls": polls,
        "stats": stats,
        "rejected": rejected,
        "counters": counters,
    }


def run_exchange(mode: str) -> dict[str, Any]:
    clock = trio.testing.MockClock()
    result: dict[str, Any] = trio.run(exchange, mode, clock, clock=clock)
    return result


@pytest.mark.skipif(stacklib.COMPILED is not None, reason="replaces methods of a compiled endpoint")
@pytest.mark.parametrize("mode", ["lean", "express"])
def test_the_lean_forms_match_the_general_ones_on_the_wire(mode: str) -> None:
    lean, general = run_exchange(mode), run_exchange("general")
    assert lean == general
    stats_a, stats_b = lean["stats"]
    # The script did what it says (else the comparison would prove little).
    assert stats_a["retransmitted"] >= 2 and stats_b["retransmitted"] >= 1
    assert stats_b["duplicates"] >= 2
    assert [entry[0] for entry in lean["wire"]["a"]].count("a-refuse") == 1
    assert [entry[0] for entry in lean["wire"]["b"]].count("b-reject") == 1
    assert lean["rejected"] == [0, 1]  # counted, and otherwise a loss: no error raised
    pongs = [args for what, args in lean["calls"] if what == "pong"]
    assert pongs == [(i, 2, 3, 4) for i in range(3)] + [(10,), (12,), ()] + [
        (20,),
        (21,),
        (30,),
        (40,),
        (50,),
        (51,),
        (60,),
    ]
    assert ("note", (11,)) in lean["calls"]


def count_general_polls(am: UamService) -> list[int]:
    path = am.path
    assert isinstance(path, LeanPath)
    counter = [0]
    general: Callable[[], int] = path._poll_all

    def counted() -> int:
        counter[0] += 1
        return general()

    path._poll_all = counted  # type: ignore[method-assign]
    return counter


@pytest.mark.parametrize("express", [True, False])
async def test_a_plain_round_trip_takes_only_the_lean_forms(express: bool) -> None:
    quiet = UamLayer(UamParams(background_poll=False))
    with ShmNetwork(spin_time=1000.0) as network:  # the receive tasks never take anything
        (ep_a, ch_a), (ep_b, _) = shm_pair(network)
        async with quiet.open(UNetService(ep_a)) as a, quiet.open(UNetService(ep_b)) as b:
            b.register_handler(lambda peer, *args: b.reply(1, *args), 0)
            got: list[tuple[int, ...]] = []
            a.register_handler(lambda peer, *args: got.append(args), 1)
            general = count_general_polls(a), count_general_polls(b)
            express_polls = [0]
            for am in (a, b):
                set_mode(am, "express" if express else "lean")
                path = am.path
                assert isinstance(path, LeanPath)
                lane = path._poll_express

                def counted(*args: Any, lane: Any = lane) -> int:
                    express_polls[0] += 1
                    result: int = lane(*args)
                    return result

                path._poll_express = counted  # type: ignore[method-assign]
            for i in range(20):
                a.request_nowait(ch_a, 0, i)
                assert a.poll() == 0  # nothing yet: one look at the endpoint
                assert b.poll() == 1
                assert a.poll() == 1
            assert got == [(i,) for i in range(20)]
            assert [counter[0] for counter in general] == [0, 0]
            # Every poll but b's first (which makes b's machine, the ordinary way).
            assert express_polls[0] == (59 if express else 0)


async def test_arrivals_the_receive_task_took_run_at_the_next_poll() -> None:
    # b's receive task takes the request from the endpoint (its handler waits for a poll);
    # b.poll() then finds the endpoint empty and must still run it.  (A long timeout: a
    # retransmission would put the request at the endpoint again.)
    quiet = UamLayer(UamParams(background_poll=False, rto_us=10e6))
    with ShmNetwork(spin_time=0.0) as network, trio.fail_after(10):
        (ep_a, ch_a), (ep_b, ch_b) = shm_pair(network)
        async with quiet.open(UNetService(ep_a)) as a, quiet.open(UNetService(ep_b)) as b:
            seen: list[int] = []
            b.register_handler(lambda peer, i: seen.append(i), 0)
            a.request_nowait(ch_a, 0, 7)
            while b.peer_statistics(ch_b).received == 0:
                await trio.sleep(1e-3)
            assert seen == []
            assert b.poll() == 1
            assert seen == [7]


@pytest.mark.parametrize("mode", MODES)
async def test_after_a_raising_handler_the_rest_runs_at_the_next_poll(mode: str) -> None:
    quiet = UamLayer(UamParams(background_poll=False))
    with ShmNetwork(spin_time=1000.0) as network:
        (ep_a, ch_a), (ep_b, _) = shm_pair(network)
        async with quiet.open(UNetService(ep_a)) as a, quiet.open(UNetService(ep_b)) as b:
            set_mode(b, mode)
            seen: list[int] = []

            def note(peer: int, i: int) -> None:
                seen.append(i)
                if i == 1:
                    raise ValueError("handler 1 fails")

            b.register_handler(note, 0)
            for i in range(4):
                a.request_nowait(ch_a, 0, i)
            with pytest.raises(ValueError, match="handler 1 fails"):
                b.poll()
            assert seen == [0, 1]
            assert b.poll() == 2
            assert seen == [0, 1, 2, 3]


async def test_the_service_reads_trio_s_default_clock_without_calling_it() -> None:
    from time import perf_counter

    from stacklib.layers.uam import service as service_module

    clock = trio.lowlevel.current_clock()
    offset = service_module._clock_offset(clock)
    assert offset is not None
    assert abs(offset + perf_counter() - trio.current_time()) < 1e-3
    # Any other clock (virtual time, a test's) is called, not read around.
    assert service_module._clock_offset(trio.testing.MockClock()) is None

    class Lookalike(trio.abc.Clock):  # right name, wrong module: not trio's
        offset = 5.0

        def start_clock(self) -> None:
            pass

        def current_time(self) -> float:
            return 0.0

        def deadline_to_sleep_time(self, deadline: float) -> float:
            return 0.0

    Lookalike.__name__ = "SystemClock"
    assert service_module._clock_offset(Lookalike()) is None


@pytest.mark.skipif(
    stacklib.COMPILED is not None, reason="replaces a method of a compiled endpoint"
)
@pytest.mark.parametrize("mode", MODES)
async def test_a_gone_peer_is_raised_where_a_rejection_is_a_loss(mode: str) -> None:
    # send_payload raises UNetError where send_nowait returned a descriptor marked ERROR: UAM
    # counts that datagram and resends it (above); its subclasses (a closed endpoint, a gone
    # peer) reach the caller, as send_nowait raised them.
    quiet = UamLayer(UamParams(background_poll=False))
    with ShmNetwork(spin_time=1000.0) as network:
        (ep_a, ch_a), (ep_b, _) = shm_pair(network)
        wire = Wire(ep_a, [], "a")
        async with quiet.open(UNetService(ep_a)) as a, quiet.open(UNetService(ep_b)) as b:
            set_mode(a, mode)
            b.register_handler(lambda peer, *args: None, 0)
            wire.faults[0] = "reject"
            a.request_nowait(ch_a, 0, 1)
            assert a.statistics()["rejected"] == 1
            wire.faults[1] = "gone"
            with pytest.raises(PeerGone, match="gone"):
                a.request_nowait(ch_a, 0, 2)
            assert a.statistics()["rejected"] == 1
