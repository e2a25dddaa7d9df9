"""The shm ring's C core against its Python reference: same results, same bytes, same breaks.

The C core (``_ringcore.c``) is compiled here into a temporary directory with the compiler
``stacklib compile`` uses; the test skips, saying why, where there is none.  Each example runs
one random sequence of producer writes, consumer takes and hostile scribbles on the shared
words and records against a ring served by Python cores and a ring served by C cores, and
compares every result, every failure message, the wake-ups and, at the end, every byte of the
shared memory.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.compiled import package_dir
from stacklib.transports.shm import ring_core
from stacklib.transports.shm.ring_core import BROKEN, WRITTEN, WRITTEN_WAKE, RingCore
from tests.c_extension import load_c_extension

CAPACITY = 256  # small: records wrap and pad often
MAX_MESSAGE = 100
BASE = 64  # the first ring's block of the header page (region.RING_WORD)
TAIL, HEAD, SLEEPING, WAITING = BASE, BASE + 8, BASE + 16, BASE + 24


@pytest.fixture(scope="module")
def c_core(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("ringcore")
    return load_c_extension("transports/shm/_ringcore.c", work, "the C ring core").RingCore


class _Side:
    """One ring's shared memory and its producer and consumer cores of one kind."""

    def __init__(self, factory: Any) -> None:
        self.page = bytearray(4096)
        self.records = bytearray(CAPACITY)
        self.words = memoryview(self.page).cast("Q")
        self.data = memoryview(self.records)
        self.producer = factory(self.words, BASE, self.data, MAX_MESSAGE, 0, 0)
        self.consumer = factory(self.words, BASE, self.data, MAX_MESSAGE, 0, 0)
        self.wakes = 0

        def wake() -> None:
            self.wakes += 1

        self.consumer.wake = wake

    def apply(self, op: tuple[Any, ...]) -> object:
        kind = op[0]
        if kind == "write":
            payload = op[2](bytes((i * 7 + op[1]) & 255 for i in range(op[1])))
            return ("write", self.producer.try_write(payload), self.producer.failure)
        if kind == "take":
            taken = self.consumer.take()
            return ("take", taken, self.consumer.failure)
        if kind == "word":  # the peer scribbles on a shared counter or flag
            self.words[op[1]] = op[2]
            return None
        if kind == "record":  # the peer scribbles on a record header
            self.data.cast("Q")[op[1]] = op[2]
            return None
        raise AssertionError(op)

    def state(self) -> tuple[object, ...]:
        return (
            self.producer.tail,
            self.producer.cached_head,
            self.consumer.head,
            self.wakes,
            bytes(self.page),
            bytes(self.records),
        )


payload_types = st.sampled_from([bytes, bytearray, memoryview])
sizes = st.one_of(st.integers(0, MAX_MESSAGE), st.sampled_from([0, 8, 9, MAX_MESSAGE]))


@st.composite
def record_scribbles(draw: st.DrawFn) -> tuple[str, int, int]:
    """A record header the peer rewrites: often a near miss of a sound one."""
    word = draw(st.integers(0, CAPACITY // 8 - 1))
    to_end = CAPACITY - 8 * word
    length = draw(
        st.one_of(
            st.integers(0, 300),
            st.sampled_from([to_end, to_end - 16, to_end + 16, MAX_MESSAGE, MAX_MESSAGE + 1]),
        )
    )
    kind = draw(st.integers(0, 3))
    return (
        "record",
        word,
        # (A length short of the end may be negative: as the 32-bit word the peer writes.)
        draw(st.one_of(st.just((length & 0xFFFFFFFF) | kind << 32), st.integers(0, 2**64 - 1))),
    )


operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), sizes, payload_types),
        st.tuples(st.just("take")),
        st.tuples(st.just("take")),
        st.tuples(
            st.just("word"),
            st.sampled_from([TAIL, HEAD, SLEEPING, WAITING]),
            st.one_of(st.integers(0, 1), st.integers(0, 4096), st.integers(0, 2**64 - 1)),
        ),
        record_scribbles(),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_c_core_matches_reference(c_core: Any, ops: list[tuple[Any, ...]]) -> None:
    reference, native = _Side(RingCore), _Side(c_core)
    for op in ops:
        assert native.apply(op) == reference.apply(op), op
        assert native.state() == reference.state(), op


#: Scripted breaks, one per check: (writes first, then what the peer scribbles).
SCRIPTED = {
    "tail behind head": [("write", 40, bytes), ("take",), ("word", TAIL, 0), ("take",)],
    "tail unaligned": [("write", 40, bytes), ("word", TAIL, 8), ("take",)],
    "tail too far": [("word", TAIL, CAPACITY + 16), ("take",)],
    "pad too long": [("record", 0, (CAPACITY + 16) | 2 << 32), ("word", TAIL, 16), ("take",)],
    "pad past tail": [("record", 0, CAPACITY | 2 << 32), ("word", TAIL, 16), ("take",)],
    "message too long": [
        ("write", 40, bytes),
        ("record", 0, (MAX_MESSAGE + 1) | 1 << 32),
        ("take",),
    ],
    "longest message": [("write", MAX_MESSAGE, bytes), ("take",)],
    "unknown kind": [("write", 40, bytes), ("record", 0, 40 | 3 << 32), ("take",)],
    "record past tail": [("write", 8, bytes), ("record", 0, 40 | 1 << 32), ("take",)],
    "pad then message": [
        *[("write", 100, bytes), ("take",)] * 3,
        ("write", 100, memoryview),
        ("take",),
    ],
    "head unaligned": [("write", 100, bytes)] * 3 + [("word", HEAD, 8), ("write", 100, bytes)],
    "head past tail": [("write", 100, bytes)] * 2
    + [("word", HEAD, 4096), ("write", 100, bytes), ("write", 100, bytes)],
}


@pytest.mark.parametrize("script", SCRIPTED.values(), ids=SCRIPTED.keys())
def test_scripted_breaks_match_reference(c_core: Any, script: list[tuple[Any, ...]]) -> None:
    reference, native = _Side(RingCore), _Side(c_core)
    results = []
    for op in script:
        expected = reference.apply(op)
        assert native.apply(op) == expected, op
        assert native.state() == reference.state(), op
        results.append(expected)
    assert results[-1] is not None  # the script ends with a result worth comparing


def test_round_trip_and_wake_up(c_core: Any) -> None:
    side = _Side(c_core)
    assert side.producer.try_write(b"hello") == WRITTEN
    side.words[SLEEPING] = 1
    assert side.producer.try_write(bytearray(b"world")) == WRITTEN_WAKE
    side.words[WAITING] = 1
    assert side.consumer.take() == b"hello"
    assert side.wakes == 1 and side.words[WAITING] == 0
    assert side.consumer.take() == b"world"
    assert side.consumer.take() is None


def test_full_ring_refuses_and_bad_head_breaks(c_core: Any) -> None:
    side = _Side(c_core)
    while side.producer.try_write(bytes(40)) != 0:
        pass
    side.words[HEAD] = 8  # unaligned: the consumer is lying
    assert side.producer.try_write(bytes(40)) == BROKEN
    assert side.producer.failure == f"the consumer published head 8 (tail {side.producer.tail})"


def test_released_core_raises_instead_of_touching_memory(c_core: Any) -> None:
    side = _Side(c_core)
    side.producer.release()
    with pytest.raises(ValueError, match="released"):
        side.producer.try_write(b"x")


def test_new_core_picks_and_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    side_words = memoryview(bytearray(4096)).cast("Q")
    data = memoryview(bytearray(CAPACITY))
    monkeypatch.setattr(ring_core, "C_CORE", None)
    assert isinstance(ring_core.new_core(side_words, BASE, data, MAX_MESSAGE, 0, 0), RingCore)
    with pytest.raises(RuntimeError, match="stacklib compile"):
        ring_core.new_core(side_words, BASE, data, MAX_MESSAGE, 0, 0, native=True)


def test_the_c_source_ships_with_the_package() -> None:
    source = Path(package_dir()) / "transports" / "shm" / "_ringcore.c"
    assert "PyInit__ringcore" in source.read_text()


# ---------------------------------------------------------------- the rings of real channels


@pytest.fixture
def native_rings(c_core: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Channels opened from now on run their rings on the C core."""
    monkeypatch.setattr(ring_core, "C_CORE", c_core)
    return c_core


def test_channels_run_the_c_core_through_every_receive_call(native_rings: Any) -> None:
    """Wrapping batches, single sends, and every receive call over rings on the C core: every
    message arrives once, in order, and both rings of the channel say they are native."""
    from stacklib.transports.shm import ShmEndpoint, ShmNetwork
    from stacklib.unet import connect

    with ShmNetwork(ring_bytes=4096, max_message=1024) as network:
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
        ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
        assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
        ch_a, _ = connect(ep_a, ep_b)
        link = a.ni.link(ep_a, ch_a)  # type: ignore[attr-defined]
        assert link.tx.native and link.rx.native
        sent: list[bytes] = []
        got: list[bytes] = []
        into = bytearray(1024)
        for round_ in range(150):
            batch = [bytes([round_ & 0xFF]) * ((round_ * 37 + i * 11) % 900) for i in range(3)]
            sent += batch[: ep_a.send_many(ch_a, batch)]
            ep_a.send_payload(ch_a, b"single")
            sent.append(b"single")
            way = round_ % 4
            while True:
                if way == 0:
                    arrival = ep_b.poll_payload()
                    data = None if arrival is None else arrival[1]
                elif way == 1:
                    message = ep_b.poll()
                    data = None if message is None else message.data
                elif way == 2:
                    taken = ep_b.poll_into(into)
                    data = None if taken is None else bytes(into[: taken[1]])
                else:
                    view = ep_b.poll_view()
                    data = None if view is None else bytes(view[1])
                if data is None:
                    break
                got.append(data)
        got += [message.data for message in ep_b.recv_many(1000)]
        assert got == sent


async def test_a_hostile_peer_breaks_a_c_core_ring_as_a_python_one(
    native_rings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hostile-peer checks with the C core: the same failures, with the same messages."""
    from stacklib.transports.shm import KIND_MESSAGE, KIND_PAD, ShmNetwork
    from stacklib.transports.shm import ring as ring_module
    from tests.transports import test_shm_hostile as hostile

    made: list[object] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(ring_core.new_core(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ring_module, "new_core", counted)

    cases: list[tuple[Callable[..., Awaitable[None]], tuple[Any, ...]]] = [
        (hostile.test_tail_beyond_the_ring_fails_the_channel, ()),
        (hostile.test_messages_before_the_garbage_are_delivered, ()),
        (hostile.test_head_moving_backwards_fails_the_sender, ()),
        (hostile.test_head_ahead_of_the_tail_fails_the_sender, ()),
        (hostile.test_garbage_counters_before_the_peer_attaches_fail_its_channel, ()),
        *(
            (hostile.test_lengths_beyond_the_buffer_fail_the_channel, case)
            for case in [
                (10**9, KIND_MESSAGE, "kind 1 and length 1000000000"),
                (1025, KIND_MESSAGE, "length 1025"),
                (hostile.RING, KIND_PAD, "pad record of length 4096"),
                (40, 99, "kind 99"),
            ]
        ),
    ]
    for test, args in cases:
        with ShmNetwork(ring_bytes=hostile.RING, max_message=1024) as network:
            made.clear()
            await test(network, *args)
            assert made and all(isinstance(core, native_rings) for core in made)
