"""The ARQ machine at explicit times: scripted exchanges, loss, duplication, reordering,
corruption, backoff, sequence wrap and peer failure."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.errors import LocalProtocolError
from stacklib.layers.arq.machine import (
    ArqMachine,
    ArqState,
    ArqStatistics,
    Delivered,
    Event,
    PeerFailed,
)
from stacklib.layers.arq.wire import Pdu, PduType, build, parse
from stacklib.sansio import Machine
from stacklib.testing import SIDES, Link, Sent

RTO = 1.0  # seconds; round numbers make the deadlines easy to check
DELAY = 0.01  # one-way network delay of the scripted link


def data(seq: int, payload: bytes) -> bytes:
    return build(Pdu.data(seq, payload))


def ack(seq: int) -> bytes:
    return build(Pdu.ack(seq))


def state(machine: ArqMachine) -> ArqState:
    # A call, not the property: mypy would narrow the property across calls that change it.
    return machine.state


def events(machine: ArqMachine) -> list[Event]:
    out = []
    while (event := machine.next_event()) is not None:
        out.append(event)
    return out


# --- two machines over stacklib.testing's scripted link ------------------------------------------


class ArqLink(Link[ArqMachine]):
    """The shared test link in ARQ's words: send a message, what was delivered, who failed.

    Datagrams are numbered 1, 2, 3, ... in the order they are put on the link (both directions
    together); the faults of a script apply by number ("drop", "dup", "corrupt": the type byte
    inverted, "late:X": X seconds late, so later datagrams overtake it).
    """

    def send(self, side: str, payload: bytes) -> None:
        self.input(side, lambda machine, now: machine.send(payload, now))

    @property
    def delivered(self) -> dict[str, list[bytes]]:
        return {
            side: [e.data for _, e in self.events[side] if isinstance(e, Delivered)]
            for side in SIDES
        }

    @property
    def failed(self) -> dict[str, tuple[float, PeerFailed]]:
        return {
            side: (when, e)
            for side in SIDES
            for when, e in self.events[side]
            if isinstance(e, PeerFailed)
        }

    def transmissions(self, source: str, kind: PduType) -> list[Sent]:
        return [s for s in self.from_side(source) if pdu(s).type is kind]


def pdu(sent: Sent) -> Pdu:
    return parse(sent.datagram)


def make_link(
    *,
    max_retries: int = 8,
    max_queue: int = 64,
    initial_seq: int = 0,
    faults: dict[int, str] | None = None,
    drop_all_from: str | None = None,
) -> ArqLink:
    def machine() -> ArqMachine:
        return ArqMachine(
            rto=RTO, max_retries=max_retries, max_queue=max_queue, initial_seq=initial_seq
        )

    return ArqLink(machine(), machine(), delay=DELAY, faults=faults, silent=drop_all_from)


def messages(n: int, tag: bytes = b"m") -> list[bytes]:
    return [tag + str(i).encode() for i in range(n)]


# --- one machine, scripted by hand ---------------------------------------------------------------


def test_send_transmits_once_and_starts_the_timer() -> None:
    a = ArqMachine(rto=RTO)
    assert state(a) is ArqState.IDLE
    assert a.get_timer() is None
    a.send(b"hello", now=5.0)
    assert state(a) is ArqState.WAITING
    assert a.datagrams_to_send(5.0) == [data(0, b"hello")]
    assert a.datagrams_to_send(5.0) == []  # each datagram is handed out once
    assert a.get_timer() == 5.0 + RTO
    a.receive(ack(0), now=5.5)
    assert state(a) is ArqState.IDLE
    assert a.get_timer() is None
    assert a.datagrams_to_send(5.5) == []
    assert a.statistics() == ArqStatistics(
        sent=1,
        retransmitted=0,
        acks=1,
        acks_sent=0,
        delivered=0,
        duplicates=0,
        malformed=0,
        out_of_window=0,
        stale_acks=0,
        ignored=0,
        queued=0,
    )


def test_receiver_delivers_acks_and_reacks_duplicates() -> None:
    b = ArqMachine(rto=RTO)
    b.receive(data(0, b"x"), now=0.0)
    assert events(b) == [Delivered(data=b"x")]
    assert b.datagrams_to_send(0.0) == [ack(0)]
    b.receive(data(0, b"x"), now=0.1)  # our ACK was lost: confirm again, deliver nothing
    assert events(b) == []
    assert b.datagrams_to_send(0.1) == [ack(0)]
    b.receive(data(5, b"?"), now=0.2)  # neither expected nor the previous one: drop silently
    assert events(b) == []
    assert b.datagrams_to_send(0.2) == []
    b.receive(data(1, b"y"), now=0.3)
    assert events(b) == [Delivered(data=b"y")]
    stats = b.statistics()
    assert (stats.delivered, stats.duplicates, stats.out_of_window, stats.acks_sent) == (2, 1, 1, 3)
    assert b.get_timer() is None  # a receiver alone never needs a timer


def test_fresh_receiver_does_not_take_the_seq_before_its_first_as_a_duplicate() -> None:
    b = ArqMachine(rto=RTO)
    b.receive(data(0xFFFF, b"stale"), now=0.0)
    assert b.datagrams_to_send(0.0) == []
    assert b.statistics().out_of_window == 1
    assert b.statistics().duplicates == 0


def test_exponential_backoff_then_peer_failed() -> None:
    a = ArqMachine(rto=RTO, max_retries=3)
    a.send(b"x", now=0.0)
    a.send(b"y", now=0.0)
    first = a.datagrams_to_send(0.0)
    deadlines = [a.get_timer()]
    a.handle_timer(0.999)  # early: nothing happens
    assert a.datagrams_to_send(0.999) == []
    assert a.get_timer() == 1.0
    for _ in range(3):
        now = a.get_timer()
        assert now is not None
        a.handle_timer(now)
        assert a.datagrams_to_send(now) == first  # the very same DATA again
        deadlines.append(a.get_timer())
    # rto, then 2, 4, 8 rto after each retransmission.
    assert deadlines == [1.0, 3.0, 7.0, 15.0]
    assert events(a) == []
    a.handle_timer(15.0)
    # Give-up time is rto * (2 ** (max_retries + 1) - 1) after the first transmission.
    assert events(a) == [PeerFailed(retransmissions=3, undelivered=2)]
    assert state(a) is ArqState.FAILED
    assert a.get_timer() is None
    assert a.datagrams_to_send(15.0) == []
    assert a.send_room == 0
    stats = a.statistics()
    assert (stats.sent, stats.retransmitted, stats.queued) == (1, 3, 0)
    with pytest.raises(LocalProtocolError):
        a.send(b"z", now=16.0)
    a.receive(ack(0), now=16.0)  # too late: ignored, counted
    a.receive(data(0, b"late"), now=16.0)
    assert events(a) == []
    assert a.datagrams_to_send(16.0) == []
    assert a.statistics().ignored == 2


def test_max_retries_zero_fails_at_the_first_timeout() -> None:
    a = ArqMachine(rto=0.5, max_retries=0)
    a.send(b"x", now=2.0)
    a.handle_timer(2.5)
    assert events(a) == [PeerFailed(retransmissions=0, undelivered=1)]


def test_late_timer_call_backs_off_from_the_actual_time() -> None:
    a = ArqMachine(rto=RTO)
    a.send(b"x", now=0.0)
    a.handle_timer(1.5)  # the driver woke late
    assert a.get_timer() == 1.5 + 2 * RTO


def test_queue_sends_one_at_a_time_in_order() -> None:
    a = ArqMachine(rto=RTO, max_queue=3)
    for payload in (b"p", b"q", b"r"):
        a.send(payload, now=0.0)
    assert a.queued == 3
    assert a.send_room == 0
    with pytest.raises(LocalProtocolError):
        a.send(b"s", now=0.0)
    assert a.datagrams_to_send(0.0) == [data(0, b"p")]
    a.receive(ack(0), now=0.2)
    assert a.datagrams_to_send(0.2) == [data(1, b"q")]
    assert a.get_timer() == 0.2 + RTO  # the timer restarts for the new DATA
    a.receive(ack(0), now=0.3)  # stale: the next DATA is not confirmed by it
    assert a.datagrams_to_send(0.3) == []
    assert a.statistics().stale_acks == 1
    a.receive(ack(1), now=0.4)
    assert a.datagrams_to_send(0.4) == [data(2, b"r")]
    assert a.send_room == 2


def test_send_copies_the_callers_buffer() -> None:
    a = ArqMachine(rto=RTO)
    buffer = bytearray(b"abc")
    a.send(memoryview(buffer), now=0.0)
    a.send(buffer, now=0.0)
    buffer[:] = b"xyz"
    assert a.datagrams_to_send(0.0) == [data(0, b"abc")]
    a.receive(ack(0), now=0.1)
    assert a.datagrams_to_send(0.1) == [data(1, b"abc")]


def test_max_payload() -> None:
    a = ArqMachine(rto=RTO, max_payload=4)
    a.send(b"1234", now=0.0)
    with pytest.raises(LocalProtocolError):
        a.send(b"12345", now=0.0)
    assert a.queued == 1


@pytest.mark.parametrize(
    "options",
    [
        {"rto": 0.0},
        {"rto": -1.0},
        {"rto": float("nan")},
        {"max_retries": -1},
        {"max_queue": 0},
        {"max_payload": -1},
        {"initial_seq": 0x10000},
        {"initial_seq": -1},
    ],
)
def test_bad_parameters(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ArqMachine(**options)  # type: ignore[arg-type]


@given(st.lists(st.binary(max_size=8), max_size=30))
def test_any_input_is_dropped_or_handled_never_raises(inputs: list[bytes]) -> None:
    a = ArqMachine(rto=RTO)
    a.send(b"x", now=0.0)
    a.datagrams_to_send(0.0)
    for i, datagram in enumerate(inputs):
        a.receive(datagram, now=float(i))
        a.datagrams_to_send(float(i))
    stats = a.statistics()
    # Every input is accounted for exactly once.
    accounted = (
        stats.delivered
        + stats.duplicates
        + stats.out_of_window
        + stats.acks
        + stats.stale_acks
        + stats.malformed
        + stats.ignored
    )
    assert accounted == len(inputs)
    assert stats.delivered == len(events(a))


# --- two machines over the scripted link -------------------------------------------------------


def test_lossless_exchange_both_ways() -> None:
    link = make_link()
    for m in messages(10, b"a"):
        link.send("a", m)
    for m in messages(7, b"b"):
        link.send("b", m)
    link.run(until=10.0)
    assert link.delivered == {"b": messages(10, b"a"), "a": messages(7, b"b")}
    assert link.a.statistics().retransmitted == 0
    assert link.b.statistics().retransmitted == 0
    # Stop-and-wait: one round trip per message.
    assert link.transmissions("a", PduType.DATA)[-1].time == pytest.approx(9 * 2 * DELAY)


def test_drop_the_third_datagram() -> None:
    # a sends 5 messages: datagrams go DATA0, ACK0, DATA1, ACK1, ... so the 3rd is DATA1.
    link = make_link(faults={3: "drop"})
    for m in messages(5):
        link.send("a", m)
    link.run(until=10.0)
    assert link.delivered["b"] == messages(5)
    assert pdu(link.sent[2]) == Pdu.data(1, b"m1")
    data1 = [s for s in link.transmissions("a", PduType.DATA) if pdu(s).seq == 1]
    # First sent when ACK0 arrived (2 delays), retransmitted one rto later.
    assert [s.time for s in data1] == pytest.approx([2 * DELAY, 2 * DELAY + RTO])
    stats = link.a.statistics()
    assert (stats.sent, stats.retransmitted, stats.acks) == (5, 1, 5)
    assert link.b.statistics().duplicates == 0


def test_drop_an_ack_makes_a_duplicate_that_is_reacked_not_redelivered() -> None:
    link = make_link(faults={4: "drop"})  # ACK1
    for m in messages(5):
        link.send("a", m)
    link.run(until=10.0)
    assert link.delivered["b"] == messages(5)
    assert link.a.statistics().retransmitted == 1
    assert link.b.statistics().duplicates == 1
    assert [pdu(s).seq for s in link.transmissions("b", PduType.ACK)] == [0, 1, 1, 2, 3, 4]


def test_duplicate_the_fifth_datagram() -> None:
    link = make_link(faults={5: "dup"})  # DATA2 arrives twice
    for m in messages(5):
        link.send("a", m)
    link.run(until=10.0)
    assert link.delivered["b"] == messages(5)
    assert link.b.statistics().duplicates == 1
    # The second ACK2 finds DATA3 in flight: stale, ignored.
    assert link.a.statistics().stale_acks == 1
    assert link.a.statistics().retransmitted == 0


def test_reordered_data_overtaken_by_its_retransmission() -> None:
    # DATA1 arrives 1.5 rto late: its retransmission gets there first, then the original
    # arrives after later DATA and is dropped, not delivered twice.
    link = make_link(faults={3: "late:1.5"})
    for m in messages(5):
        link.send("a", m)
    link.run(until=10.0)
    assert link.delivered["b"] == messages(5)
    b = link.b.statistics()
    assert b.duplicates + b.out_of_window == 1
    assert link.a.statistics().retransmitted == 1


def test_reordered_ack_arrives_after_its_duplicate() -> None:
    link = make_link(faults={4: "late:1.5"})  # ACK1 late: a retransmits DATA1, b re-ACKs
    for m in messages(5):
        link.send("a", m)
    link.run(until=10.0)
    assert link.delivered["b"] == messages(5)
    assert link.b.statistics().duplicates == 1
    assert link.a.statistics().stale_acks == 1


def test_corrupted_datagram_is_counted_and_recovered() -> None:
    link = make_link(faults={3: "corrupt"})
    for m in messages(5):
        link.send("a", m)
    link.run(until=10.0)
    assert link.delivered["b"] == messages(5)
    assert link.b.statistics().malformed == 1
    assert link.a.statistics().retransmitted == 1


def test_sequence_numbers_wrap() -> None:
    link = make_link(initial_seq=0xFFFD, faults={8: "drop"})  # ACK of seq 0 (after 65535)
    for m in messages(6):
        link.send("a", m)
    link.run(until=10.0)
    assert link.delivered["b"] == messages(6)
    seqs = [pdu(s).seq for s in link.transmissions("a", PduType.DATA)]
    assert seqs == [0xFFFD, 0xFFFE, 0xFFFF, 0, 0, 1, 2]  # seq 0 retransmitted
    assert link.b.statistics().duplicates == 1  # 0 re-ACKed across the wrap


def test_wrap_from_zero_without_knobs() -> None:
    a, b = ArqMachine(rto=RTO), ArqMachine(rto=RTO)
    n = 0x10000 + 300
    delivered = 0
    for i in range(n):
        payload = i.to_bytes(3, "big")
        a.send(payload, now=0.0)
        (datagram,) = a.datagrams_to_send(0.0)
        if i == 0x10000 + 5:
            b.receive(datagram, now=0.0)  # duplicated just after the wrap
        b.receive(datagram, now=0.0)
        event = b.next_event()
        assert event == Delivered(data=payload)
        delivered += 1
        for reply in b.datagrams_to_send(0.0):
            a.receive(reply, now=0.0)
    assert delivered == n
    assert b.statistics().duplicates == 1
    assert a.statistics().stale_acks == 1
    assert a.statistics().acks == n


def test_peer_that_never_answers_is_reported_after_max_retries() -> None:
    link = make_link(max_retries=4, drop_all_from="b")
    link.run(until=0.25)
    for m in messages(3):
        link.send("a", m)
    link.run(until=100.0)
    # b got every retransmission of DATA0, delivered it once; its ACKs all vanished.
    assert link.delivered["b"] == [b"m0"]
    assert link.b.statistics().duplicates == 4
    when, event = link.failed["a"]
    assert when == pytest.approx(0.25 + RTO * (2**5 - 1))
    assert event == PeerFailed(retransmissions=4, undelivered=3)
    assert [s.time for s in link.transmissions("a", PduType.DATA)] == pytest.approx(
        [0.25, 1.25, 3.25, 7.25, 15.25]
    )


FAULT_KINDS = st.sampled_from(["drop", "dup", "corrupt", "late:0.5", "late:2.5", "late:0.001"])


@settings(max_examples=60, deadline=None)
@given(
    faults=st.dictionaries(st.integers(1, 80), FAULT_KINDS, max_size=25),
    n_a=st.integers(0, 20),
    n_b=st.integers(0, 20),
)
def test_exactly_once_in_order_under_any_fault_script(
    faults: dict[int, str], n_a: int, n_b: int
) -> None:
    link = make_link(faults=faults, max_retries=30)
    for m in messages(n_a, b"a"):
        link.send("a", m)
    for m in messages(n_b, b"b"):
        link.send("b", m)
    link.run(until=1e6)
    assert link.delivered == {"b": messages(n_a, b"a"), "a": messages(n_b, b"b")}
    assert link.failed == {}
    assert link.a.queued == link.b.queued == 0


def test_random_loss_and_duplication_at_scale() -> None:
    rng = random.Random(7)
    faults = {}
    for i in range(1, 3000):
        roll = rng.random()
        if roll < 0.2:
            faults[i] = "drop"
        elif roll < 0.25:
            faults[i] = "dup"
        elif roll < 0.3:
            faults[i] = f"late:{rng.uniform(0, 3):.3f}"
    link = make_link(faults=faults, max_retries=20, max_queue=300)
    for m in messages(300, b"a"):
        link.send("a", m)
    for m in messages(300, b"b"):
        link.send("b", m)
    link.run(until=1e7)
    assert link.delivered == {"b": messages(300, b"a"), "a": messages(300, b"b")}
    assert link.a.statistics().retransmitted > 0


def test_the_machine_keeps_the_sans_io_contract() -> None:
    machine: Machine[Event] = ArqMachine()  # mypy checks the five signatures here
    assert isinstance(machine, Machine)
