"""The UAM machine's C core against its Python reference: same datagrams, events, timers,
counters and errors for every input.

The C core (``_uamcore.c``) is compiled here into a temporary directory with the compiler
``stacklib compile`` uses; the tests skip, saying why, where there is none.  Each example runs
one random conversation between two machines, A and B, twice: once with the Python core, once
with the C core.  Requests, replies (right and wrong), stores, gets, datagram-face messages,
deliveries with loss, duplication, reordering, bit flips and truncation, garbage, timers and
API misuse are applied to both, and every result, every exception (type and message) and, after
each step, every observable of both machines must be equal.  The machine's scripted tests
(tests/layers/test_uam_machine.py) also run on the C core (test_uam_machine_native.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.layers.uam.machine import (
    GetReceived,
    RequestReceived,
    UamMachine,
    machine_class,
)
from stacklib.layers.uam.machine_core import MachineCore
from tests.c_extension import load_c_extension
from tests.two_forms import step_both


def build_c_core(work: Path) -> Any:
    """The C core's class, compiled in ``work`` (pytest.skip where it cannot be built)."""
    what = "the C core of the UAM machine"
    return load_c_extension("layers/uam/_uamcore.c", work, what).MachineCore


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> type[UamMachine]:
    return machine_class(build_c_core(tmp_path_factory.mktemp("uamcore")))


PARAMS = {"window": 4, "rto": 1.0, "max_retries": 3, "ack_delay": 0.1, "chunk_size": 64}


class World:
    """Two machines and the datagrams in flight between them, for one core."""

    def __init__(self, cls: type[UamMachine], initial_seq: int, window: int) -> None:
        params = {**PARAMS, "initial_seq": initial_seq, "window": window}
        self.machines = {"a": cls(**params), "b": cls(**params)}  # type: ignore[arg-type]
        self.wire: dict[str, list[bytes]] = {"a": [], "b": []}  # towards that side
        self.now = 0.0
        self.last: dict[str, object] = {"a": None, "b": None}  # the last event taken

    def _apply(self, op: tuple[Any, ...]) -> object:
        kind, side = op[0], op[1]
        m = self.machines[side]
        other = "b" if side == "a" else "a"
        if kind == "request":
            return m.request(op[2], op[3], self.now)
        if kind == "reply":
            last = self.last[side]
            token = op[4] if op[4] is not None else getattr(last, "token", 0)
            return m.reply(token, op[2], op[3], self.now)
        if kind == "reply_get":
            last = self.last[side]
            if isinstance(last, GetReceived):
                data = None if op[2] else bytes(last.length)
                return m.reply_get(last.token, data, self.now)
            return m.reply_get(op[3], b"", self.now)
        if kind == "store":
            return m.store(op[2], op[3], (bytes(range(256)) * 2)[: op[4]], 7, (1,), self.now)
        if kind == "get":
            return m.get(op[2], op[3], op[4], self.now)
        if kind == "message":
            return m.send_message(b"m" * op[2], self.now)
        if kind == "send":
            datagrams = m.datagrams_to_send(self.now)
            self.wire[other].extend(datagrams)
            return datagrams
        if kind == "deliver":
            queue = self.wire[side]
            if not queue:
                return None
            index = op[2] % len(queue)
            fault = op[3]
            datagram = queue[index] if fault == "dup" else queue.pop(index)
            if fault == "drop":
                return None
            if fault == "flip":
                position = op[4] % (8 * len(datagram))
                flipped = bytearray(datagram)
                flipped[position // 8] ^= 1 << (position % 8)
                datagram = bytes(flipped)
            elif fault == "cut":
                datagram = datagram[: op[4] % (len(datagram) + 1)]
            elif fault == "view":
                return m.receive(memoryview(bytearray(datagram)), self.now)
            return m.receive(datagram, self.now)
        if kind == "garbage":
            return m.receive(op[2], self.now)
        if kind == "take":
            taken = m.take()
            if isinstance(taken, tuple) and taken[0] == 1:
                self.last[side] = RequestReceived(handler=taken[1], args=taken[2], token=taken[3])
            elif taken is not None:
                self.last[side] = taken
            return taken
        if kind == "next_event":
            event = m.next_event()
            if event is not None:
                self.last[side] = event
            return event
        if kind == "timer":
            self.now += op[2]
            return m.handle_timer(self.now)
        if kind == "ack_now":
            return m.acknowledge_now()
        if kind == "silence":  # the peer hears nothing: timeouts until the machine fails
            for _ in range(op[2]):
                self.now += PARAMS["rto"]  # type: ignore[operator]
                m.handle_timer(self.now)
                self.wire[other].extend(m.datagrams_to_send(self.now))
            return None
        if kind == "round":  # both sides send, deliver (faults by op[2]), handle, echo requests
            results: list[object] = []
            faults = op[2]
            for turn, name in enumerate("abab"):
                here, there = self.machines[name], "b" if name == "a" else "a"
                self.wire[there].extend(here.datagrams_to_send(self.now))
                queue, self.wire[name] = self.wire[name], []
                for index, datagram in enumerate(queue):
                    fault = (faults >> ((turn * 5 + index) % 30)) & 7
                    if fault == 1:
                        continue  # lost
                    if fault == 2:
                        self.wire[name].append(datagram)  # duplicated: again next turn
                    if fault == 3 and index + 1 < len(queue):
                        self.wire[name].append(datagram)  # late: after the others
                        continue
                    here.receive(datagram, self.now)
                while (taken := here.take()) is not None:
                    results.append(taken)
                    if isinstance(taken, tuple) and taken[0] == 1:
                        here.reply(taken[3], 2, taken[2], self.now)
                    elif isinstance(taken, GetReceived):
                        here.reply_get(taken.token, bytes(taken.length), self.now)
                self.now += 0.03
            return results
        raise AssertionError(op)

    def observe(self) -> object:
        seen = []
        for side in "ab":
            m = self.machines[side]
            seen.append(
                (
                    m.statistics(),
                    m.get_timer(),
                    m.request_room,
                    m.idle,
                    m.pending,
                    m.arrivals_full,
                    m.has_output,
                    m.backlog,
                    m.state,
                    repr(m),
                )
            )
        return seen


sides = st.sampled_from("ab")
words = st.lists(st.integers(0, 2**32 - 1), max_size=4).map(tuple)
bad_words = st.one_of(
    words,
    st.lists(st.integers(-3, 2**32 + 3), max_size=6).map(tuple),
    st.lists(st.integers(0, 9), max_size=4),  # a list, not a tuple
    st.just((True,)),
    st.just((1.5,)),
)
handlers = st.one_of(st.integers(0, 255), st.sampled_from([-1, 256, True]))
operation = st.one_of(
    st.tuples(st.just("request"), sides, handlers, bad_words),
    st.tuples(st.just("request"), sides, st.integers(0, 255), words),
    st.tuples(
        st.just("reply"), sides, handlers, bad_words, st.one_of(st.none(), st.integers(0, 9))
    ),
    st.tuples(st.just("reply_get"), sides, st.booleans(), st.integers(0, 9)),
    st.tuples(st.just("store"), sides, st.integers(0, 3), st.integers(0, 100), st.integers(0, 300)),
    st.tuples(st.just("get"), sides, st.integers(0, 3), st.integers(0, 100), st.integers(0, 200)),
    st.tuples(st.just("message"), sides, st.integers(0, 150)),
    st.tuples(st.just("send"), sides),
    st.tuples(st.just("send"), sides),
    st.tuples(
        st.just("deliver"),
        sides,
        st.integers(0, 20),
        st.sampled_from(["ok", "ok", "ok", "drop", "dup", "flip", "cut", "view"]),
        st.integers(0, 10_000),
    ),
    st.tuples(st.just("deliver"), sides, st.just(0), st.just("ok"), st.just(0)),
    st.tuples(st.just("garbage"), sides, st.binary(max_size=40)),
    st.tuples(st.just("take"), sides),
    st.tuples(st.just("next_event"), sides),
    st.tuples(st.just("timer"), sides, st.sampled_from([0.0, 0.05, 0.1, 0.5, 1.0, 2.0])),
    st.tuples(st.just("ack_now"), sides),
    st.tuples(st.just("round"), sides, st.integers(0, 2**30)),
    st.tuples(st.just("round"), sides, st.just(0)),
    st.tuples(st.just("silence"), sides, st.integers(1, 5)),
    # Small PDUs with any header: the nargs byte, the type and the fields the small path
    # checks before it takes a datagram.
    st.tuples(
        st.just("garbage"),
        sides,
        st.builds(
            lambda kind, handler, seq, ack, nargs, n: (
                bytes([kind, handler, seq >> 8, seq & 255, ack >> 8, ack & 255, nargs, 0])
                + bytes(4 * n)
            ),
            st.sampled_from([0, 1, 2, 3, 3, 4, 7]),
            st.sampled_from([0, 0, 1, 255]),
            st.sampled_from([0, 0, 1, 2, 65535, 65530]),
            st.sampled_from([0, 1, 2, 3, 65535, 65531]),
            st.sampled_from([0, 0, 1, 4, 5]),
            st.sampled_from([0, 0, 1, 4, 5]),
        ),
    ),
    st.tuples(st.just("request"), sides, st.integers(0, 255), words),
)


def run_both(
    native: type[UamMachine], ops: list[tuple[Any, ...]], initial_seq: int, window: int = 4
) -> None:
    reference = World(machine_class(MachineCore), initial_seq, window)
    under_test = World(native, initial_seq, window)
    step_both(reference, under_test, ops)


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(operation, min_size=10, max_size=120),
    initial_seq=st.sampled_from([0, 65530]),
    window=st.sampled_from([1, 2, 4]),
)
def test_the_c_core_does_what_the_reference_does(
    native: type[UamMachine], ops: list[tuple[Any, ...]], initial_seq: int, window: int
) -> None:
    run_both(native, ops, initial_seq, window)


def ping_pong(rounds: int, lose_every: int) -> list[tuple[Any, ...]]:
    """A scripted conversation: requests, replies, lost datagrams, timeouts."""
    ops: list[tuple[Any, ...]] = []
    for i in range(rounds):
        ops += [("request", "a", 1, (i & 0xFFFF, 2**32 - 1)), ("send", "a")]
        fault = "drop" if i % lose_every == 0 else "ok"
        ops += [("deliver", "b", 0, fault, 0), ("take", "b"), ("reply", "b", 2, (i,), None)]
        ops += [("send", "b"), ("deliver", "a", 0, "ok", 0), ("take", "a"), ("send", "a")]
        if fault == "drop":
            ops += [("timer", "a", 1.0), ("send", "a"), ("deliver", "b", 0, "ok", 0)]
            ops += [("take", "b"), ("reply", "b", 2, (i,), None), ("send", "b")]
            ops += [("deliver", "a", 0, "ok", 0), ("take", "a")]
        ops += [("timer", "b", 0.1), ("send", "b"), ("deliver", "a", 0, "ok", 0)]
    return ops


def test_a_conversation_across_the_sequence_wrap_goes_the_same(
    native: type[UamMachine],
) -> None:
    run_both(native, ping_pong(200, lose_every=7), initial_seq=65_436)


def small_pdu(kind: int, seq: int, ack: int = 0, handler: int = 0, nargs: int = 0) -> bytes:
    return bytes([kind, handler, seq >> 8, seq & 255, ack >> 8, ack & 255, nargs, 0]) + bytes(
        4 * nargs
    )


def test_a_hostile_peer_meets_the_same_machine(native: type[UamMachine]) -> None:
    """What an honest peer never sends: more in-order PDUs than there are arrival buffers,
    ACKs with a seq or a handler, PDUs whose nargs byte disagrees with their size."""
    flood = [("garbage", "b", small_pdu(1, seq, nargs=seq % 5)) for seq in range(12)]
    odd = [
        ("garbage", "b", small_pdu(3, 5, ack=0)),
        ("garbage", "b", small_pdu(3, 0, ack=0, handler=9)),
        ("garbage", "b", small_pdu(3, 0, ack=0, nargs=1)),
        ("garbage", "b", small_pdu(1, 12, nargs=2)[:-4]),
        ("garbage", "b", small_pdu(2, 12, nargs=1) + bytes(4)),
    ]
    takes = [("take", "b")] * 14
    for window in (1, 2, 4):
        run_both(native, [*flood, *odd, *takes, *flood, ("send", "b")], 0, window)


def test_the_native_flag_and_the_default_class() -> None:
    reference = machine_class(MachineCore)()
    assert not reference.native
    assert UamMachine().native is (UamMachine.__mro__[2] is not MachineCore)


def test_the_core_does_not_take_the_machines_checks(native: type[UamMachine]) -> None:
    """The C core raises the machine's own errors (one copy of each message)."""
    for cls in (machine_class(MachineCore), native):
        m = cls()
        with pytest.raises(Exception, match=r"handler index 256 is not in 0\.\.255"):
            m.request(256, (), 0.0)
        with pytest.raises(Exception, match="argument -1 is not a 32-bit unsigned word"):
            m.request(1, (-1,), 0.0)
        with pytest.raises(Exception, match="a reply is allowed only from a request handler"):
            m.reply(0, 1, (), 0.0)
        with pytest.raises(ValueError, match="window must be in"):
            cls(window=0)
