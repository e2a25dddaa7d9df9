"""The UAM machine at explicit times: go-back-N under scripted loss, duplication, reordering and
corruption; acknowledgments; the window; bulk chunks; sequence wrap; peer failure."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stacklib.errors import LocalProtocolError
from stacklib.layers.uam.machine import (
    INBOX_REGION,
    Delivered,
    Event,
    GetReceived,
    GetReplyReceived,
    PeerFailed,
    ReplyReceived,
    RequestReceived,
    StoreReceived,
    UamMachine,
    UamState,
)
from stacklib.layers.uam.wire import CHUNK_SIZE, Pdu, PduType, UamFormatError, build, parse
from stacklib.sansio import Machine
from stacklib.testing import Link, Sent

RTO = 1.0  # seconds: round numbers make deadlines easy to check
ACK_DELAY = 0.1
DELAY = 0.01  # one-way delay of the scripted link
ECHO = 1  # request handler that replies with REPLY_TO and the same args
REPLY_TO = 2
SINK = 3  # request handler that records and does not reply


def machine(**kwargs: object) -> UamMachine:
    options: dict[str, object] = {"window": 4, "rto": RTO, "ack_delay": ACK_DELAY}
    options.update(kwargs)
    return UamMachine(**options)  # type: ignore[arg-type]


def events(m: UamMachine) -> list[Event]:
    out = []
    while (event := m.next_event()) is not None:
        out.append(event)
    return out


class UamLink(Link[UamMachine]):
    """stacklib.testing's link between two machines, with an application on each side that
    handles every event at once (ECHO replies, SINK records, replies recorded).

    Datagrams are numbered 1, 2, ... in the order they are put on the link (both directions).
    ``faults`` maps a number to "drop", "dup", "corrupt" (the type byte inverted) or "late:X"
    (arrives X seconds late, so later datagrams overtake it).
    """

    def __init__(
        self, a: UamMachine, b: UamMachine, faults: dict[int, str], silent: str | None
    ) -> None:
        super().__init__(a, b, delay=DELAY, faults=faults, silent=silent, handle=self._handle)
        self.got: dict[str, list[tuple[str, tuple[int, ...]]]] = {"a": [], "b": []}
        self.failed: dict[str, tuple[float, PeerFailed]] = {}
        self.regions = {"a": bytearray(20000), "b": bytearray(20000)}

    def m(self, side: str) -> UamMachine:
        return self.machine(side)

    def request(self, side: str, handler: int, *args: int) -> None:
        self.input(side, lambda machine, now: machine.request(handler, args, now))

    def data_sent(self, source: str) -> list[Sent]:
        return [s for s in self.from_side(source) if pdu(s).type is not PduType.ACK]

    def _handle(self, side: str, m: UamMachine) -> None:
        while (event := m.next_event()) is not None:
            if isinstance(event, RequestReceived):
                self.got[side].append(("request", event.args))
                if event.handler == ECHO:
                    m.reply(event.token, REPLY_TO, event.args, self.now)
            elif isinstance(event, ReplyReceived):
                self.got[side].append(("reply", event.args))
            elif isinstance(event, StoreReceived):
                start = event.offset + event.chunk
                self.regions[side][start : start + len(event.data)] = event.data
                if event.last:
                    self.got[side].append(("stored", (event.offset, event.total, *event.args)))
            elif isinstance(event, GetReceived):
                start = event.offset + event.chunk
                m.reply_get(
                    event.token, bytes(self.regions[side][start : start + event.length]), self.now
                )
            elif isinstance(event, GetReplyReceived):
                self.regions[side][event.chunk : event.chunk + len(event.data)] = event.data
                if event.last:
                    self.got[side].append(("got", (event.xfer, event.total)))
            elif isinstance(event, Delivered):
                self.got[side].append(("message", (len(event.data),)))
            else:
                self.failed[side] = (self.now, event)


def pdu(sent: Sent) -> Pdu:
    return parse(sent.datagram)


def make_link(**kwargs: object) -> UamLink:
    faults = kwargs.pop("faults", {})
    silent = kwargs.pop("silent", None)
    return UamLink(machine(**kwargs), machine(**kwargs), faults, silent)  # type: ignore[arg-type]


def sinks(link: UamLink, n: int, side: str = "a") -> None:
    """Send n SINK requests with args (i,), waiting for window room as a driver would."""
    for i in range(n):
        while not link.m(side).request_room:
            link.run(link.now + DELAY)
        link.request(side, SINK, i)


def requests_seen(link: UamLink, side: str) -> list[tuple[int, ...]]:
    return [args for what, args in link.got[side] if what == "request"]


# --- by hand -------------------------------------------------------------------------------------


def test_request_is_one_single_cell_pdu_and_reply_acks_it() -> None:
    a, b = machine(), machine()
    a.request(ECHO, (1, 2, 3, 4), now=0.0)
    (datagram,) = a.datagrams_to_send(0.0)
    assert len(datagram) == 24  # + 8-byte AAL5 trailer = one 48-byte cell payload
    assert parse(datagram) == Pdu(PduType.REQUEST, 0, 0, ECHO, (1, 2, 3, 4))
    assert a.get_timer() == RTO
    b.receive(datagram, now=0.01)
    (event,) = events(b)
    assert event == RequestReceived(handler=ECHO, args=(1, 2, 3, 4), token=0)
    # events() took the request and the next (None) call closed it, so reply by hand here:
    b2 = machine()
    b2.receive(datagram, now=0.01)
    request = b2.next_event()
    assert isinstance(request, RequestReceived)
    b2.reply(request.token, REPLY_TO, (5,), now=0.01)
    (reply,) = b2.datagrams_to_send(0.01)
    assert parse(reply) == Pdu(PduType.REPLY, 0, 1, REPLY_TO, (5,))  # ack 1: implicit
    a.receive(reply, now=0.02)
    assert a.get_timer() is None  # acknowledged by the reply: no timer
    assert a.request_room == 4
    assert events(a) == [ReplyReceived(handler=REPLY_TO, args=(5,))]


def test_request_without_reply_is_acked_explicitly_after_ack_delay() -> None:
    a, b = machine(), machine()
    a.request(SINK, (), now=0.0)
    b.receive(a.datagrams_to_send(0.0)[0], now=0.01)
    assert len(events(b)) == 1
    assert b.datagrams_to_send(0.01) == []  # the delayed-ack clock starts now
    assert b.get_timer() == pytest.approx(0.01 + ACK_DELAY)
    b.handle_timer(0.01 + ACK_DELAY)
    (ack,) = b.datagrams_to_send(0.01 + ACK_DELAY)
    assert parse(ack) == Pdu(PduType.ACK, ack=1)
    a.receive(ack, now=0.2)
    assert a.idle
    assert b.statistics().acks_sent == 1
    assert a.statistics().acks_received == 1


def test_acknowledge_now_sends_the_owed_ack_without_waiting() -> None:
    a, b = machine(), machine()
    b.acknowledge_now()  # nothing owed: nothing to send
    assert b.datagrams_to_send(0.0) == []
    a.request(SINK, (), now=0.0)
    b.receive(a.datagrams_to_send(0.0)[0], now=0.01)
    b.acknowledge_now()  # received, not handled: not owed yet
    assert b.datagrams_to_send(0.01) == []
    assert len(events(b)) == 1
    b.acknowledge_now()  # the application is about to compute for a while
    (ack,) = b.datagrams_to_send(0.01)
    assert parse(ack) == Pdu(PduType.ACK, ack=1)
    a.receive(ack, now=0.02)
    assert a.idle and a.get_timer() is None
    b.acknowledge_now()  # advertised: owed no more
    assert b.datagrams_to_send(0.02) == []
    assert b.statistics().acks_sent == 1


def test_half_a_window_of_handled_requests_is_acked_at_once() -> None:
    a, b = machine(window=4), machine(window=4)
    for i in range(4):
        a.request(SINK, (i,), now=0.0)
    for datagram in a.datagrams_to_send(0.0):
        b.receive(datagram, now=0.01)
    assert len(events(b)) == 4
    (ack,) = b.datagrams_to_send(0.01)
    assert parse(ack).ack == 4


def test_reply_rules() -> None:
    a, b = machine(), machine()
    a.request(ECHO, (), now=0.0)
    a.request(SINK, (), now=0.0)
    for datagram in a.datagrams_to_send(0.0):
        b.receive(datagram, now=0.01)
    first = b.next_event()
    assert isinstance(first, RequestReceived)
    b.reply(first.token, REPLY_TO, (), now=0.01)
    with pytest.raises(LocalProtocolError, match="once"):
        b.reply(first.token, REPLY_TO, (), now=0.01)  # twice
    second = b.next_event()
    assert isinstance(second, RequestReceived)
    with pytest.raises(LocalProtocolError):
        b.reply(first.token, REPLY_TO, (), now=0.01)  # a handler that has returned
    for datagram in b.datagrams_to_send(0.01):
        a.receive(datagram, now=0.02)
    reply = a.next_event()
    assert isinstance(reply, ReplyReceived)
    with pytest.raises(LocalProtocolError, match="reply handler may not reply"):
        a.reply(0, REPLY_TO, (), now=0.02)


@pytest.mark.parametrize(
    ("handler", "args"),
    [(256, ()), (-1, ()), (1, (1, 2, 3, 4, 5)), (1, (-1,)), (1, (1 << 32,)), (1, (True,))],
)
def test_bad_requests_raise(handler: int, args: tuple[int, ...]) -> None:
    with pytest.raises(LocalProtocolError):
        machine().request(handler, args, now=0.0)


def test_window_full_raises_and_request_room_counts() -> None:
    a = machine(window=2)
    a.request(SINK, (), now=0.0)
    assert a.request_room == 1
    a.request(SINK, (), now=0.0)
    assert a.request_room == 0
    with pytest.raises(LocalProtocolError, match="window"):
        a.request(SINK, (), now=0.0)
    assert len(a.datagrams_to_send(0.0)) == 2
    assert a.statistics().window_used == 2


def test_store_is_split_into_4160_byte_chunks_handler_on_the_last() -> None:
    a = machine(window=8)
    data = bytes(range(256)) * 40  # 10240 bytes: 4160 + 4160 + 1920
    a.store(3, 100, data, 7, (42,), now=0.0)
    pdus = [parse(d) for d in a.datagrams_to_send(0.0)]
    assert [len(p.data) for p in pdus] == [CHUNK_SIZE, CHUNK_SIZE, 10240 - 2 * CHUNK_SIZE]
    assert [p.bulk.chunk for p in pdus if p.bulk] == [0, CHUNK_SIZE, 2 * CHUNK_SIZE]
    assert [(p.handler, p.args) for p in pdus] == [(0, ()), (0, ()), (7, (42,))]
    assert {p.bulk.total for p in pdus if p.bulk} == {10240}
    assert b"".join(p.data for p in pdus) == data


def test_malformed_input_is_counted_and_dropped() -> None:
    b = machine()
    for junk in (b"", b"\x01", b"\x63" * 8, b"\x01\x00\x00\x00\x00\x00\x05\x00", bytes(30)):
        b.receive(junk, now=0.0)
    assert b.statistics().malformed == 5
    assert events(b) == []
    assert b.datagrams_to_send(0.0) == []


def test_failure_after_max_retries_at_the_computed_time() -> None:
    link = make_link(max_retries=3, silent="b")
    link.request("a", ECHO, 1)
    link.run(until=100.0)
    when, failure = link.failed["a"]
    assert when == pytest.approx(RTO * (3 + 1))  # rto * (max_retries + 1)
    assert failure == PeerFailed(retransmissions=3, undelivered=1)
    assert [s.time for s in link.data_sent("a")] == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert link.a.state is UamState.FAILED
    with pytest.raises(LocalProtocolError, match="failed"):
        link.a.request(ECHO, (), now=link.now)
    link.a.receive(build(Pdu(PduType.ACK, ack=1)), now=link.now)
    assert link.a.statistics().ignored == 1


# --- through the scripted link -------------------------------------------------------------------


def test_lose_the_third_packet_go_back_n() -> None:
    link = make_link(faults={3: "drop"})
    sinks(link, 4)  # datagrams 1-4 are the four requests: the 3rd is lost
    link.run(until=10.0)
    assert requests_seen(link, "b") == [(0,), (1,), (2,), (3,)]
    sent = link.data_sent("a")
    # b acknowledged 0 and 1 at once (half a window), so a's timer restarted when that ACK
    # arrived (2 delays); one rto later, go back N: the lost request and the one after it.
    assert [pdu(s).seq for s in sent[4:]] == [2, 3]
    assert [s.time for s in sent[4:]] == pytest.approx([2 * DELAY + RTO] * 2)
    stats_a, stats_b = link.a.statistics(), link.b.statistics()
    assert stats_a.retransmitted == 2
    assert stats_a.timeouts == 1
    assert stats_b.out_of_order == 1  # seq 3 arrived before seq 2
    assert link.a.idle


def test_duplicate_of_the_fifth_packet_is_suppressed() -> None:
    link = make_link(window=8, faults={5: "dup"})
    sinks(link, 6)
    link.run(until=10.0)
    assert requests_seen(link, "b") == [(i,) for i in range(6)]
    assert link.b.statistics().duplicates == 1
    assert link.b.statistics().received == 6
    assert link.a.statistics().retransmitted == 0


def test_reordered_window_is_recovered() -> None:
    # The first request of a window arrives last: the others are out of order and dropped,
    # then go-back-N resends them in order.
    link = make_link(faults={1: "late:0.05"})
    sinks(link, 4)
    link.run(until=10.0)
    assert requests_seen(link, "b") == [(i,) for i in range(4)]
    assert link.b.statistics().out_of_order == 3
    assert link.a.statistics().retransmitted == 3


def test_corrupted_packet_is_counted_and_resent() -> None:
    link = make_link(faults={2: "corrupt"})
    sinks(link, 3)
    link.run(until=10.0)
    assert requests_seen(link, "b") == [(i,) for i in range(3)]
    assert link.b.statistics().malformed == 1


def test_lost_reply_is_resent_and_the_request_not_run_twice() -> None:
    link = make_link(faults={2: "drop"})  # 1: request, 2: its reply
    link.request("a", ECHO, 9)
    link.run(until=10.0)
    assert requests_seen(link, "b") == [(9,)]  # the handler ran once
    assert link.got["a"] == [("reply", (9,))]
    assert link.b.statistics().duplicates == 1  # the retransmitted request
    assert link.b.statistics().retransmitted == 1  # the reply, by b's go-back-N
    assert link.a.idle
    assert link.b.idle


def test_sequence_numbers_wrap() -> None:
    link = make_link(initial_seq=65534, faults={2: "drop"})
    sinks(link, 6)
    link.run(until=10.0)
    assert requests_seen(link, "b") == [(i,) for i in range(6)]
    assert [pdu(s).seq for s in link.data_sent("a")][:4] == [65534, 65535, 0, 1]


def test_store_and_get_move_blocks_of_any_size() -> None:
    link = make_link(window=4)
    data = bytes((i * 7) & 0xFF for i in range(15000))  # 4 chunks
    link.a.store(0, 1000, data, 5, (77,), now=0.0)
    link.run(until=10.0)
    assert link.regions["b"][1000:16000] == data
    assert link.got["b"] == [("stored", (1000, 15000, 77))]
    xfer = link.a.get(0, 1000, 15000, now=link.now)
    link.regions["a"][:] = bytes(20000)
    link.run(until=20.0)
    assert link.got["a"][-1] == ("got", (xfer, 15000))
    assert link.regions["a"][:15000] == data
    assert link.a.idle


def test_datagram_face_reassembles_messages() -> None:
    link = make_link(window=2)
    link.a.send_message(bytes(9000), now=0.0)
    link.run(until=10.0)
    assert ("message", (9000,)) in link.got["b"]
    assert INBOX_REGION == 0xFFFF


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.integers(1, 80),
        st.sampled_from(["drop", "dup", "corrupt", "late:0.02", "late:1.5"]),
        max_size=25,
    ),
    st.integers(1, 25),
    st.integers(0, 3),
)
def test_exactly_once_in_order_under_any_faults(faults: dict[int, str], n: int, w: int) -> None:
    link = make_link(window=1 << w, faults=faults, max_retries=40)
    for i in range(n):
        while not link.a.request_room:
            link.run(link.now + DELAY)
        link.request("a", ECHO if i % 2 else SINK, i)
    link.run(until=link.now + 500.0)
    assert requests_seen(link, "b") == [(i,) for i in range(n)]
    assert link.got["a"] == [("reply", (i,)) for i in range(n) if i % 2]
    assert link.a.idle and link.b.idle
    assert "a" not in link.failed and "b" not in link.failed


# --- the fast receive path (small PDUs decoded in one struct call) agrees with parse() ------


@given(
    st.one_of(
        st.binary(max_size=32),
        st.builds(
            lambda kind, handler, seq, ack, args, nargs, reserved: (
                bytes([kind, handler, seq >> 8, seq & 255, ack >> 8, ack & 255, nargs, reserved])
                + b"".join(a.to_bytes(4, "big") for a in args)
            ),
            st.integers(0, 7),
            st.sampled_from([0, 1, 255]),
            st.sampled_from([0, 1, 0xFFFF]),
            st.sampled_from([0, 1, 5]),
            st.lists(st.integers(0, 2**32 - 1), max_size=5),
            st.integers(0, 6),  # the nargs byte: often not the number of words that follow
            st.sampled_from([0, 0xAB]),
        ),
    )
)
@example(bytes.fromhex("0300000100000000"))  # an ACK with a seq
@example(bytes.fromhex("0301000000000000"))  # an ACK with a handler
@example(bytes.fromhex("030000000000010000000005"))  # an ACK with an argument
@example(bytes.fromhex("010100000000000000000005"))  # a word nargs does not announce
@example(bytes.fromhex("0101000000000200000000050000"))  # not a multiple of 4
def test_any_small_datagram_is_counted_as_parse_sees_it(data: bytes) -> None:
    m = machine()
    m.receive(data, 0.0)
    stats = m.statistics()
    try:
        pdu = parse(data)
    except UamFormatError:
        assert stats.malformed == 1 and stats.received == 0
        return
    assert stats.malformed == 0
    assert stats.stale_acks == (pdu.ack != 0)  # nothing sent: only ack 0 is current
    if pdu.type is PduType.ACK:
        assert stats.acks_received == 1 and stats.received == 0
        return
    distance = pdu.seq % 65536
    assert stats.received == (distance == 0)
    assert stats.duplicates == (distance >= 32768)
    assert stats.out_of_order == (0 < distance < 32768)
    if distance == 0 and pdu.type in (PduType.REQUEST, PduType.REPLY):
        (event,) = events(m)
        if pdu.type is PduType.REQUEST:
            assert event == RequestReceived(handler=pdu.handler, args=pdu.args, token=0)
        else:
            assert event == ReplyReceived(handler=pdu.handler, args=pdu.args)


def test_take_hands_out_requests_and_replies_as_tuples() -> None:
    a, b = machine(), machine()
    a.request(ECHO, (7, 8), 0.0)
    for datagram in a.datagrams_to_send(0.0):
        b.receive(datagram, 0.01)
    taken = b.take()
    assert taken == (int(PduType.REQUEST), ECHO, (7, 8), 0, None, b"")
    b.reply(0, REPLY_TO, (9,), 0.01)  # its token is its seq, element 3
    with pytest.raises(LocalProtocolError, match="once"):
        b.reply(0, REPLY_TO, (9,), 0.01)
    assert b.take() is None
    for datagram in b.datagrams_to_send(0.01):
        a.receive(datagram, 0.02)
    assert a.take() == (int(PduType.REPLY), REPLY_TO, (9,), 0, None, b"")
    assert a.statistics().unacked == 0  # the reply acknowledged the request
    a.send_message(b"hi", 0.02)
    for datagram in a.datagrams_to_send(0.02):
        b.receive(datagram, 0.03)
    assert b.take() == Delivered(data=b"hi")  # anything else comes as its event


# --- has_output: a driver may skip datagrams_to_send when it is False -----------------------


@settings(max_examples=30, deadline=None)
@given(
    st.dictionaries(st.integers(1, 60), st.sampled_from(["drop", "dup", "late:0.02"]), max_size=15),
    st.integers(1, 20),
    st.lists(st.floats(0.0, 0.01), min_size=1, max_size=12),
)
def test_without_output_datagrams_to_send_does_nothing(
    faults: dict[int, str], n: int, steps: list[float]
) -> None:
    link = make_link(window=4, faults=faults, max_retries=40)
    checked = 0
    for i in range(n):
        while not link.a.request_room:
            link.run(link.now + DELAY)
        link.request("a", ECHO if i % 2 else SINK, i)
    for step in [*steps, 1.0, 500.0]:
        link.run(link.now + step)
        for m in (link.a, link.b):
            if m.has_output:
                continue
            before, timer = m.statistics(), m.get_timer()
            assert m.datagrams_to_send(link.now) == []
            assert m.statistics() == before and m.get_timer() == timer
            checked += 1
    assert checked > 0
    assert requests_seen(link, "b") == [(i,) for i in range(n)]


def test_has_output_while_something_waits() -> None:
    link = make_link(window=2)
    assert not link.a.has_output
    link.a.request(SINK, (1,), 0.0)
    assert link.a.has_output  # the request itself
    [datagram] = link.a.datagrams_to_send(0.0)
    assert not link.a.has_output
    link.b.receive(datagram, 0.0)
    assert not link.b.has_output  # nothing owed until the handler has run
    assert isinstance(link.b.next_event(), RequestReceived)
    assert link.b.has_output  # an acknowledgment is owed


def test_the_machine_keeps_the_sans_io_contract() -> None:
    contract: Machine[Event] = UamMachine()  # mypy checks the five signatures here
    assert isinstance(contract, Machine)
