"""The UAM core's express lane in C against its Python reference.

``express_poll`` and ``express_send`` (``uamcore_express.h``; reference:
:meth:`MachineCore.express_poll`, :meth:`MachineCore.express_send`) read and write the shm
ring's core themselves.  Both C extensions are compiled here into temporary directories with
the compiler ``stacklib compile`` uses; the tests skip, saying why, where there is none.

Each example builds two worlds of two machines, A and B, joined by two rings (A->B, B->A)
built over bytearrays: C machines on C ring cores, and Python machines on Python ring cores.
A fake service per side runs the handlers (the C lane runs them itself, the reference calls
the service's ``_run_handlers``).  Requests, express sends (into rings small enough to fill,
with a ``max_message`` bulk PDUs exceed), express polls, timers, hostile records and broken
rings, a clock that raises and a peer gone silent are applied to both, and every result,
exception, handler call, counter, ring byte and machine observable must be equal after every
step.  Scripted tests then pin the lanes' edges (on both forms where the reference shares
them): a broken ring, a handler or a clock that raises, a failed machine, datagrams the ring
refuses, a queue that is not native, misuse.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.layers.uam.machine import GetReceived, UamMachine, machine_class
from stacklib.layers.uam.machine_core import MachineCore
from stacklib.layers.uam.service import UamService
from stacklib.transports.shm.ring_core import RingCore
from tests.c_extension import load_c_extension
from tests.two_forms import step_both

BASE = 64  # the ring's block of the header page (region.RING_WORD), as test_ring_core.py
TAIL, HEAD, SLEEPING, WAITING = BASE, BASE + 8, BASE + 16, BASE + 24
RTO, MAX_RETRIES = 1.0, 3
PARAMS = {"window": 4, "rto": RTO, "max_retries": MAX_RETRIES, "ack_delay": 0.1, "chunk_size": 64}
REQUEST = 1


@pytest.fixture(scope="module")
def forms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[type[UamMachine], Any]]:
    """Each form's machine class and ring core class: the reference and the C."""
    ring = load_c_extension(
        "transports/shm/_ringcore.c", tmp_path_factory.mktemp("ringcore"), "the C ring core"
    ).RingCore
    core = load_c_extension(
        "layers/uam/_uamcore.c", tmp_path_factory.mktemp("uamcore"), "the C core of UAM"
    ).MachineCore
    return {"python": (machine_class(MachineCore), RingCore), "c": (machine_class(core), ring)}


class Ring:
    """One ring's shared memory with its producer's and its consumer's cores."""

    def __init__(self, core: Any, capacity: int, max_message: int) -> None:
        self.page = bytearray(4096)
        self.records = bytearray(capacity)
        self.words = memoryview(self.page).cast("Q")
        data = memoryview(self.records)
        self.producer = core(self.words, BASE, data, max_message, 0, 0)
        self.consumer = core(self.words, BASE, data, max_message, 0, 0)
        self.wakes = 0

        def wake() -> None:
            self.wakes += 1

        self.consumer.wake = wake

    def state(self) -> tuple[object, ...]:
        return (
            self.producer.tail,
            self.producer.cached_head,
            self.consumer.head,
            self.consumer.failure,
            self.producer.failure,
            self.wakes,
            bytes(self.page),
            bytes(self.records),
        )


class Service:
    """What the lanes touch of a UamService, recording what they do with it."""

    def __init__(self) -> None:
        self._handlers = handler_table(self)
        self._poll_now = -1.0
        self._current_machine: UamMachine | None = None
        self._current_token = 0
        self._current_peer = 0
        self.unknown_handler = 0
        self.log: list[tuple[Any, ...]] = []
        self.names: dict[int, str] = {}  # machines by id: the side each serves

    def _run_handlers(self, peer: int, machine: UamMachine) -> int:
        """UamService._run_handlers itself (the reference's lane calls it; the C lane does
        what it does), run on this stand-in."""
        count: int = UamService._run_handlers(self, peer, machine)  # type: ignore[arg-type]
        return count

    def _dispatch(self, peer: int, machine: UamMachine, event: object) -> None:
        self.log.append(("event", peer, event))
        if isinstance(event, GetReceived):  # answered at once, as the service's handler does
            machine.reply_get(event.token, bytes(event.length), self._poll_now)


def handler_table(service: Service) -> list[Callable[..., None] | None]:
    """Slots 1-6 and 200 hold handlers (the rest None): 1 and 3 record, 2 replies with handler
    3, 6 replies with the empty slot 0, 4 raises, 200 replies twice (the second one raises)."""

    def recorder(index: int, replies: tuple[int, ...] = (), raises: bool = False) -> Any:
        def handler(peer: int, *words: int) -> None:
            machine = service._current_machine
            service.log.append(
                (
                    index,
                    peer,
                    words,
                    None if machine is None else service.names[id(machine)],
                    service._current_token,
                    service._current_peer,
                    service._poll_now,
                )
            )
            if raises:
                raise ValueError(f"handler {index} refuses {words}")
            for reply in replies:
                assert machine is not None, "a reply handler's handler replied"
                machine.reply(service._current_token, reply, words, service._poll_now)

        return handler

    table: list[Callable[..., None] | None] = [None] * 256
    table[1], table[3] = recorder(1), recorder(3)
    table[2], table[6] = recorder(2, (3,)), recorder(6, (0,))
    table[4], table[200] = recorder(4, raises=True), recorder(200, (3, 3))
    return table


class World:
    """Two machines of one form, their services, and the two rings between them."""

    def __init__(self, form: tuple[type[UamMachine], Any], capacity: int, max_message: int):
        machine_cls, ring_cls = form
        self.machines: dict[str, UamMachine] = {}
        self.services: dict[str, Service] = {}
        self.tables: dict[str, list[Callable[..., None] | None]] = {}
        for side in "ab":
            service = Service()
            self.tables[side] = service._handlers
            self.machines[side] = machine_cls(**PARAMS)  # type: ignore[arg-type]
            self.services[side] = service
        self.sides = {id(m): side for side, m in self.machines.items()}
        for service in self.services.values():
            service.names = self.sides
        self.rings = {side: Ring(ring_cls, capacity, max_message) for side in "ab"}  # to side
        self.held: dict[str, list[bytes]] = {"a": [], "b": []}  # general sends, to that side
        self.now = 0.0
        self.clock_reads = 0
        self.clock_stops = False  # the next reading raises

    def clock(self) -> float:
        self.clock_reads += 1
        if self.clock_stops:
            self.clock_stops = False
            raise RuntimeError("the clock stopped")
        return self.now

    def _apply(self, op: tuple[Any, ...]) -> object:
        kind, side = op[0], op[1]
        other = "b" if side == "a" else "a"
        m, service = self.machines[side], self.services[side]
        peer = 1 if side == "a" else 0
        if kind == "request":
            m.request(op[2], op[3], self.now)
            return None
        if kind == "store":
            return m.store(0, 0, bytes(range(op[2])), 1, (op[2],), self.now)
        if kind == "message":
            m.send_message(b"m" * op[2], self.now)
            return None
        if kind == "get":
            return m.get(1, 0, op[2], self.now)
        if kind == "send":
            sent = m.express_send(self.rings[other].producer, self.now)
            counts = (m.express_sent, m.express_sent_bytes, m.express_wakes)
            if sent is not None:  # the counts returned are the attributes'
                assert sent[:3] == counts
                self.held[other] += sent[3] or []
            return sent, counts
        if kind == "poll":
            rx = self.rings[side].consumer
            taken = m.express_poll(rx, self.clock, self.tables[side], service, peer)
            return taken, m.express_handled  # (its count only when no handler raised)
        if kind == "exchange":  # the other side sends, this side polls: a turn of a conversation
            return self._apply(("send", other)), self._apply(("poll", side))
        if kind == "general":  # what express_send left, sent the endpoint's general way
            held, self.held[side] = self.held[side], []
            for datagram in held:
                m.receive(datagram, self.now)
            return service._run_handlers(peer, m)
        if kind == "timer":
            self.now += op[2]
            m.handle_timer(self.now)
            return None
        if kind == "hostile":  # a record the peer writes into the ring towards `side`
            return self.rings[side].producer.try_write(op[2])
        if kind == "break":  # the peer publishes an impossible tail (its next write mends it)
            ring = self.rings[side]
            ring.words[TAIL] = ring.producer.tail + op[2]
            return None
        if kind == "silence":  # the peer is heard no more: timeouts until the machine fails
            for _ in range(MAX_RETRIES + 1):
                self.now += RTO
                m.handle_timer(self.now)
            return None
        if kind == "stop_clock":
            self.clock_stops = True
            return None
        if kind == "flag":  # the consumer sleeps, or the producer waits for room
            self.rings[side].words[op[2]] = op[3]
            return None
        raise AssertionError(op)

    def observe(self) -> object:
        seen: list[object] = [self.clock_reads, self.clock_stops, self.held]
        for side in "ab":
            m, service = self.machines[side], self.services[side]
            current = service._current_machine
            seen.append(
                (
                    m.statistics(),
                    m.get_timer(),
                    m.request_room,
                    m.idle,
                    m.pending,
                    m.has_output,
                    m.backlog,
                    m.state,
                    m.express_taken,
                    m.express_bytes,
                    m.express_broken,
                    m.express_sent,
                    m.express_sent_bytes,
                    m.express_wakes,
                    service.log,
                    service._poll_now,
                    None if current is None else self.sides[id(current)],
                    service._current_token,
                    service._current_peer,
                    service.unknown_handler,
                    self.rings[side].state(),
                )
            )
        return seen


sides = st.sampled_from("ab")
words = st.lists(st.integers(0, 2**32 - 1), max_size=4).map(tuple)
small_pdus = st.builds(
    lambda kind, handler, seq, nargs, n, cut: (
        bytes([kind, handler, seq >> 8, seq & 255, 0, 0, nargs, 0]) + bytes(4 * n)
    )[: len(bytes(8 + 4 * n)) - cut],
    st.sampled_from([0, 1, 2, 3, 4, 7]),
    st.sampled_from([0, 1, 2, 255]),
    st.sampled_from([0, 1, 2, 65535]),
    st.sampled_from([0, 1, 4, 5]),
    st.sampled_from([0, 1, 4]),
    st.sampled_from([0, 0, 1, 3, 4]),
)
operation = st.one_of(
    st.tuples(st.just("request"), sides, st.sampled_from([0, 1, 2, 3, 4, 6, 200, 9]), words),
    st.tuples(st.just("request"), sides, st.sampled_from([1, 2]), words),
    st.tuples(st.just("store"), sides, st.integers(0, 150)),
    st.tuples(st.just("message"), sides, st.integers(0, 40)),
    st.tuples(st.just("get"), sides, st.integers(0, 100)),
    st.tuples(st.just("send"), sides),
    st.tuples(st.just("poll"), sides),
    st.tuples(st.just("exchange"), sides),
    st.tuples(st.just("exchange"), sides),
    st.tuples(st.just("exchange"), sides),
    st.tuples(st.just("general"), sides),
    st.tuples(st.just("timer"), sides, st.sampled_from([0.0, 0.05, 0.1, 0.5, 1.0, 2.0])),
    st.tuples(st.just("hostile"), sides, st.one_of(st.binary(max_size=40), small_pdus)),
    st.tuples(st.just("flag"), sides, st.sampled_from([SLEEPING, WAITING]), st.integers(0, 1)),
    st.one_of(  # what ends or breaks a conversation: rarer than the rest together
        st.tuples(st.just("break"), sides, st.sampled_from([8, 4096, 2**63])),
        st.tuples(st.sampled_from(["stop_clock", "silence"]), sides),
    ),
)


def run_both(
    forms: dict[str, tuple[type[UamMachine], Any]],
    ops: list[tuple[Any, ...]],
    capacity: int,
    max_message: int,
) -> None:
    reference = World(forms["python"], capacity, max_message)
    under_test = World(forms["c"], capacity, max_message)
    step_both(reference, under_test, ops)


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(operation, min_size=20, max_size=60),
    capacity=st.sampled_from([128, 256, 4096]),
    max_message=st.sampled_from([64, 200]),
)
def test_the_c_lane_does_what_the_reference_does(
    forms: dict[str, tuple[type[UamMachine], Any]],
    ops: list[tuple[Any, ...]],
    capacity: int,
    max_message: int,
) -> None:
    run_both(forms, ops, capacity, max_message)


# ---------------------------------------------------------------- the C lane's edges, scripted


def request_pdu(seq: int, handler: int, *words: int) -> bytes:
    """A REQUEST as the peer's machine sends it (ack 0: nothing of ours to acknowledge)."""
    header = bytes([REQUEST, handler, seq >> 8, seq & 255, 0, 0, len(words), 0])
    return header + b"".join(word.to_bytes(4, "big") for word in words)


def one_side(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> tuple[UamMachine, Service, Ring, Ring]:
    """A machine of ``form``, its service, the ring it reads (rx) and the one it writes (tx)."""
    machine_cls, ring_cls = forms[form]
    machine = machine_cls(**PARAMS)  # type: ignore[arg-type]
    service = Service()
    service.names = {id(machine): "a"}
    return machine, service, Ring(ring_cls, 256, 64), Ring(ring_cls, 256, 64)


def poll(machine: UamMachine, service: Service, rx: Ring, now: float = 5.0) -> object:
    return machine.express_poll(rx.consumer, lambda: now, service._handlers, service, 7)


@pytest.mark.parametrize("form", ["c", "python"])
def test_a_float_clock_is_the_offset_of_trios_default_clock(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> None:
    """The lean path passes trio's default clock as its offset from ``perf_counter``: the
    poll reads ``perf_counter() + offset`` (the C form without a Python call)."""
    machine, service, rx, _ = one_side(forms, form)
    assert rx.producer.try_write(request_pdu(0, 1, 5)) == 1
    before = time.perf_counter()
    assert machine.express_poll(rx.consumer, 1000.0, service._handlers, service, 7) == 1
    after = time.perf_counter()
    assert 1000.0 + before <= service._poll_now <= 1000.0 + after
    assert service.log[0][6] == service._poll_now  # the handler saw that reading


@pytest.mark.parametrize("form", ["c", "python"])
def test_the_current_request_is_set_through_the_services_own_descriptors(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> None:
    """The C lane sets the service's fields as an assignment would, through the data
    descriptor the service's class holds for them, also when the class is not the one the
    lane saw before (it keeps the setter it found per class)."""
    machine, service, rx, _ = one_side(forms, form)
    assert rx.producer.try_write(request_pdu(0, 1, 5)) == 1
    assert poll(machine, service, rx) == 1  # plain attributes
    seen: list[int] = []

    class Watched(Service):
        @property  # type: ignore[override]
        def _current_peer(self) -> int:
            peer: int = self.__dict__.get("peer", 0)
            return peer

        @_current_peer.setter
        def _current_peer(self, value: int) -> None:
            seen.append(value)
            self.__dict__["peer"] = value

    service.__class__ = Watched
    assert rx.producer.try_write(request_pdu(1, 1, 6)) == 1
    assert poll(machine, service, rx, now=6.0) == 1
    assert seen == [7]
    assert [entry[2:] for entry in service.log] == [((5,), "a", 0, 7, 5.0), ((6,), "a", 1, 7, 6.0)]


@pytest.mark.parametrize("form", ["c", "python"])
def test_a_broken_ring_stops_the_poll_after_what_came_before(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> None:
    machine, service, rx, _ = one_side(forms, form)
    assert rx.producer.try_write(request_pdu(0, 1, 11)) == 1
    assert rx.producer.try_write(request_pdu(1, 1, 12)) == 1
    rx.records[32:40] = (40 | 3 << 32).to_bytes(8, "little")  # the second record: kind 3
    assert rx.producer.try_write(request_pdu(2, 1, 13)) == 1
    assert poll(machine, service, rx) == -2  # broken, after one message
    assert machine.express_broken and machine.express_handled == 1
    assert (machine.express_taken, machine.express_bytes) == (1, 12)
    assert service.log == [(1, 7, (11,), "a", 0, 7, 5.0)]  # nothing after the bad record
    assert rx.consumer.failure == "a record of kind 3 and length 40 at offset 32"
    assert rx.consumer.head == 32
    assert poll(machine, service, rx) == -1  # broken it stays, taking nothing
    assert machine.express_broken and machine.express_taken == 0


@pytest.mark.parametrize("form", ["c", "python"])
def test_a_handler_that_raises_leaves_the_rest_for_the_next_poll(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> None:
    machine, service, rx, _ = one_side(forms, form)
    for seq, handler in enumerate((1, 4, 1)):
        assert rx.producer.try_write(request_pdu(seq, handler, seq)) == 1
    with pytest.raises(ValueError, match=r"handler 4 refuses \(1,\)"):
        poll(machine, service, rx, now=2.0)
    # Two taken (the second one's handler raised), their bytes counted, the third waiting.
    assert (machine.express_taken, machine.express_bytes, machine.express_broken) == (2, 24, False)
    assert rx.consumer.head == 64
    # As in UamService._run_handlers: the raising request stays current.
    assert (service._current_machine, service._current_token) == (machine, 1)
    assert machine.statistics().handled == 2
    assert poll(machine, service, rx, now=3.0) == 1
    assert (machine.express_taken, machine.express_bytes) == (1, 12)
    assert [entry[2:] for entry in service.log] == [
        ((0,), "a", 0, 7, 2.0),
        ((1,), "a", 1, 7, 2.0),
        ((2,), "a", 2, 7, 3.0),
    ]
    assert service._current_machine is None and machine.statistics().handled == 3


@pytest.mark.parametrize("form", ["c", "python"])
def test_a_clock_that_raises_costs_the_message_it_was_read_for(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> None:
    """As in the general lean poll, which takes a datagram before it reads the clock: that
    datagram is lost, uncounted (the peer resends it), and the next poll goes on after it."""
    machine, service, rx, _ = one_side(forms, form)
    for seq in (0, 1):
        assert rx.producer.try_write(request_pdu(seq, 1, seq)) == 1

    def stopped() -> float:
        raise RuntimeError("the clock stopped")

    with pytest.raises(RuntimeError, match="the clock stopped"):
        machine.express_poll(rx.consumer, stopped, service._handlers, service, 7)
    assert (machine.express_taken, machine.express_bytes, rx.consumer.head) == (0, 0, 32)
    assert service._poll_now == -1.0 and machine.statistics().received == 0
    assert poll(machine, service, rx) == 1  # seq 1 is out of order now: counted, not handled
    assert machine.express_handled == 0 and machine.statistics().out_of_order == 1
    assert service.log == [] and rx.consumer.head == 64


@pytest.mark.parametrize("form", ["c", "python"])
def test_a_failed_machine_takes_what_arrives_and_ignores_it(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> None:
    machine, service, rx, tx = one_side(forms, form)
    machine.request(1, (), 0.0)
    assert machine.express_send(tx.producer, 0.0) == (1, 8, 0, None)
    for retry in range(MAX_RETRIES + 1):
        machine.handle_timer(RTO * (1 + retry))
    assert machine.state.value == "failed"
    assert rx.producer.try_write(request_pdu(0, 1, 5)) == 1
    assert poll(machine, service, rx) == 1  # the PeerFailed event, dispatched
    assert (machine.express_taken, machine.express_bytes) == (1, 12)
    assert machine.statistics().ignored == 1 and machine.statistics().received == 0
    assert [type(entry[2]).__name__ for entry in service.log] == ["PeerFailed"]
    assert machine.express_send(tx.producer, 9.0) is None and machine.express_sent == 0


@pytest.mark.parametrize("form", ["c", "python"])
def test_a_datagram_longer_than_the_queue_takes_comes_back_with_the_rest(
    forms: dict[str, tuple[type[UamMachine], Any]], form: str
) -> None:
    machine, _, _, tx = one_side(forms, form)
    machine.request(1, (1, 2), 0.0)
    machine.store(0, 0, bytes(60), 1, (), 0.0)  # one PDU of 8 + 16 + 60 bytes: over 64
    machine.request(1, (), 0.0)
    sent = machine.express_send(tx.producer, 0.0)
    assert sent is not None and sent[:3] == (1, 16, 0)
    rest = sent[3]
    assert rest is not None and [len(datagram) for datagram in rest] == [84, 8]
    assert (machine.express_sent, machine.express_sent_bytes) == (1, 16)
    assert tx.consumer.take() == request_pdu(0, 1, 1, 2)
    assert tx.consumer.take() is None
    tx.words[SLEEPING] = 1  # the consumer sleeps: the write that fits says to wake it
    machine.request(2, (), 0.0)
    assert machine.express_send(tx.producer, 0.0) == (1, 8, 1, None)
    assert (machine.express_sent, machine.express_sent_bytes, machine.express_wakes) == (1, 8, 1)
    assert machine.express_send(tx.producer, 0.0) is None  # nothing left to send


def test_the_c_lane_takes_only_native_queues(
    forms: dict[str, tuple[type[UamMachine], Any]],
) -> None:
    machine, service, _, _ = one_side(forms, "c")
    python_ring = Ring(RingCore, 256, 64)
    with pytest.raises(TypeError, match=r"needs a native queue .* not RingCore"):
        poll(machine, service, python_ring)
    with pytest.raises(TypeError, match=r"needs a native queue .* not RingCore"):
        machine.express_send(python_ring.producer, 0.0)


def test_the_c_lane_names_a_wrong_argument_count(
    forms: dict[str, tuple[type[UamMachine], Any]],
) -> None:
    machine, service, rx, tx = one_side(forms, "c")
    lane: Any = machine  # (called wrongly on purpose)
    with pytest.raises(TypeError, match=r"express_poll\(rx, .*\) takes 5 arguments \(4 given\)"):
        lane.express_poll(rx.consumer, float, service._handlers, service)
    with pytest.raises(TypeError, match=r"express_send\(tx, now\) takes 2 arguments \(1 given\)"):
        lane.express_send(tx.producer)
    with pytest.raises(TypeError, match=r"takes 2 arguments \(3 given\)"):
        lane.express_send(tx.producer, 0.0, None)
    assert rx.consumer.head == tx.producer.tail == 0  # and touches nothing
