"""The scalar read's fast paths against the wire specification: the request words a get builds,
the reply a target sends for a read, the completion of a reply, and the value a completed get
decodes (struct where it can, numpy otherwise) are what the construct formats and numpy say."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import stacklib
from stacklib.layers.splitc import SplitC
from stacklib.layers.splitc.runtime import Pending, _Region
from stacklib.layers.splitc.wire import (
    Kind,
    Reply,
    Request,
    Status,
    build_reply,
    build_request,
)
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.services import UNetService
from stacklib.transports.shm import ShmNetwork

DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.float16,
    np.int32,
    np.uint32,
    np.float32,
    np.int64,
    np.uint64,
    np.float64,
    np.complex64,  # 8 bytes: a scalar access, decoded by numpy
    np.dtype(">i8"),  # byte-swapped: numpy
    np.dtype("datetime64[s]"),  # numpy
]


class FakeAm:
    """Records what Split-C sends; enough of an ActiveMessageService for the scalar paths."""

    def __init__(self) -> None:
        self.handlers: list[Any] = []
        self.requests: list[tuple[int, ...]] = []
        self.replies: list[tuple[int, ...]] = []

    def register_handler(self, handler: Any, index: int | None = None, name: str = "") -> int:
        self.handlers.append(handler)
        return len(self.handlers) - 1

    def register_region(self, buffer: Any, name: str = "") -> int:
        return 0

    def request_nowait(self, peer: int, handler: int, *args: int) -> None:
        self.requests.append((peer, handler, *args))

    def reply(self, handler: int, *args: int) -> None:
        self.replies.append((handler, *args))

    async def request(self, peer: int, handler: int | str, *args: int) -> None:
        self.requests.append((peer, handler, *args))  # type: ignore[arg-type]


def rank_with(array: np.ndarray[Any, Any]) -> tuple[SplitC, FakeAm]:
    """Rank 0 of 2 with region "x" = ``array`` on both ranks (registered without the
    collective exchange, which needs a peer)."""
    am = FakeAm()
    sc = SplitC(am, 0, {1: 7})  # type: ignore[arg-type]
    region = _Region(0, "x", array, 0, (len(array), len(array)))
    sc._by_index.append(region)
    sc._regions["x"] = region
    return sc, am


def element(array: np.ndarray[Any, Any], i: int) -> bytes:
    return array[i : i + 1].tobytes()


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def values(dtype: Any, n: int = 6) -> np.ndarray[Any, Any]:
    raw = np.random.default_rng(1).integers(0, 256, n * np.dtype(dtype).itemsize, np.uint8)
    if np.dtype(dtype) == np.bool_:
        raw[:] = [0, 1, 2, 255, 1, 0]  # any nonzero byte is True
    return np.frombuffer(raw.tobytes(), dtype).copy()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_get_sends_the_specified_request_and_decodes_the_specified_reply(dtype: Any) -> None:
    array = values(dtype)
    sc, am = rank_with(np.zeros_like(array))
    size = array.itemsize
    for i in range(len(array)):
        pending = sc.get_nowait(sc.ptr(1, "x", i))
        peer, handler, *words = am.requests[-1]
        op = words[0] & 0xFFFF
        assert (peer, handler) == (7, sc._request_handler)
        assert tuple(words) == build_request(Request(Kind.READ, size, 0, op, i * size))
        reply = build_reply(Reply(Kind.VALUE, size, Status.OK, op, element(array, i)))
        sc._on_reply(7, *reply)
        expected = np.frombuffer(element(array, i), array.dtype, count=1)[0].item()
        assert pending.done
        assert same(pending.value, expected)
    assert sc.done
    assert sc.counters["malformed"] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_target_answers_a_read_as_specified(dtype: Any) -> None:
    array = values(dtype)
    sc, am = rank_with(array)
    size = array.itemsize
    nbytes = array.nbytes
    # Every offset that fits (aligned or not), one past the end, and far out.
    for offset in [*range(nbytes - size + 1), nbytes - size + 1, nbytes, 0xFFFFFFFF]:
        words = build_request(Request(Kind.READ, size, 0, offset & 0xFFFF, offset))
        sc._on_request(7, *words)
        handler, *answer = am.replies.pop()
        assert handler == sc._reply_handler
        if offset + size <= nbytes:
            value = array.view(np.uint8)[offset : offset + size].tobytes()
            expected = Reply(Kind.VALUE, size, Status.OK, offset & 0xFFFF, value)
        else:
            expected = Reply(Kind.VALUE, size, Status.OUT_OF_BOUNDS, offset & 0xFFFF, b"")
        assert tuple(answer) == build_reply(expected)
    assert sc.counters["refused"] == 3


def test_reads_of_the_wrong_size_or_region_are_refused_as_before() -> None:
    sc, am = rank_with(np.arange(4, dtype=np.int64))
    for size, region, status in [(4, 0, Status.OUT_OF_BOUNDS), (8, 1, Status.NO_REGION)]:
        sc._on_request(7, *build_request(Request(Kind.READ, size, region, 9, 0)))
        expected = build_reply(Reply(Kind.VALUE, size, status, 9, b""))
        assert tuple(am.replies.pop()[1:]) == expected
    sc._on_request(7, True, 0, 0, 0)  # not a word: dropped and counted, no reply
    sc._on_request(7, 0x1800_0000, 0)
    assert am.replies == []
    assert sc.counters["malformed"] == 2


def test_replies_that_complete_nothing_or_carry_a_refusal() -> None:
    sc, am = rank_with(np.zeros(4, np.int64))
    pending = sc.get_nowait(sc.ptr(1, "x", 2))
    op = am.requests[-1][2] & 0xFFFF
    stray = build_reply(Reply(Kind.VALUE, 8, Status.OK, (op + 1) & 0xFFFF, bytes(8)))
    sc._on_reply(7, *stray)  # no such operation: counted, nothing completes
    assert sc.counters["malformed"] == 1 and not pending.done
    sc._on_reply(7, *build_reply(Reply(Kind.VALUE, 8, Status.OUT_OF_BOUNDS, op, b"")))
    assert pending.done and isinstance(pending.error, Exception)
    with pytest.raises(Exception, match="refused it"):
        pending.value  # noqa: B018
    put = sc.put_nowait(sc.ptr(1, "x", 1), 5)
    op = am.requests[-1][2] & 0xFFFF
    sc._on_reply(7, *build_reply(Reply(Kind.ACK, 0, Status.OK, op, b"")))
    assert put.done and put.error is None and put.value is None


def test_a_short_value_decodes_through_numpy_and_fails_as_numpy_does() -> None:
    pending = Pending("get", "somewhere", np.dtype(np.int64), None)
    pending._complete(b"\x01")
    with pytest.raises(ValueError):
        pending.value  # noqa: B018
    sc, am = rank_with(np.zeros(2, np.int64))
    pending = sc.get_nowait(sc.ptr(1, "x", 0))
    op = am.requests[-1][2] & 0xFFFF
    sc._on_reply(7, *build_reply(Reply(Kind.VALUE, 1, Status.OK, op, b"\x01")))
    with pytest.raises(ValueError):
        pending.value  # noqa: B018


def test_a_local_get_decodes_like_numpy() -> None:
    async def main() -> None:
        array = values(np.float32)
        sc, _ = rank_with(array)
        for i in range(len(array)):
            got = await sc.get(sc.ptr(0, "x", i))
            assert same(got.value, array[i].item())

    trio.run(main)


def test_a_get_the_service_cannot_send_yet_is_forgotten() -> None:
    sc, am = rank_with(np.zeros(4, np.int64))

    def full(peer: int, handler: int, *args: int) -> None:
        raise trio.WouldBlock

    sc._request_nowait = full
    with pytest.raises(trio.WouldBlock):
        sc.get_nowait(sc.ptr(1, "x", 1))
    assert sc.done and sc.counters["gets"] == 0
    sc._request_nowait = am.request_nowait
    assert not sc.get_nowait(sc.ptr(1, "x", 1)).done
    assert sc.counters["gets"] == 1


@pytest.mark.parametrize(
    "words",
    [
        (1, 2, 3, 4),
        (0, 0, 0, 0xFFFFFFFF),
        (0, 0, 0, 1 << 32),
        (-1, 0, 0, 0),
        (True, 0, 0, 0),
        (0, np.int64(1), 0, 0),
        (0, 0, 1.0, 0),
        (0, 0, 0),
        (0, 0, 0, 0, 0),
        (),
    ],
    ids=repr,
)
def test_a_handlers_word_tuple_is_plain_exactly_when_plain_words_says(words: Any) -> None:
    from stacklib.layers.splitc.wire import plain_word_tuple, plain_words

    expected = len(words) == 4 and all(type(w) is int and 0 <= w <= 0xFFFFFFFF for w in words)
    assert plain_word_tuple(words) == expected
    if stacklib.COMPILED is None:  # compiled, plain_words takes ints only (Sequence[int])
        assert plain_words(words) == expected


def test_a_handler_given_fewer_words_takes_the_general_path_and_counts_them() -> None:
    from stacklib.layers.splitc.runtime import _given

    # The handlers take four word parameters (None: not given); _given rebuilds the tuple the
    # general paths parse, as *words was.
    assert _given(None, None, None, None) == ()
    assert _given(1, None, None, None) == (1,)
    assert _given(1, 2, None, None) == (1, 2)
    assert _given(1, 2, 3, None) == (1, 2, 3)
    assert _given(1, 2, 3, 4) == (1, 2, 3, 4)
    sc, am = rank_with(np.arange(4, dtype=np.int64))
    pending = sc.get_nowait(sc.ptr(1, "x", 0))
    first = am.requests[-1][2]
    sc._on_request(7)
    sc._on_request(7, first, 0, 0)  # a read's first three words: malformed, no reply
    sc._on_reply(7)
    sc._on_reply(7, (5 << 28) | (8 << 24) | (first & 0xFFFF), 0, 0)
    assert am.replies == [] and not pending.done
    assert sc.counters["malformed"] == 4


def test_split_c_calls_a_uam_service_directly_and_any_other_through_its_methods() -> None:
    async def main() -> None:
        with ShmNetwork(spin_time=0.0) as network:
            node = network.add_node("a")
            endpoint = node.os.create_endpoint(node.os.process("app"), port=1)
            async with UamLayer(UamParams(background_poll=False)).open(UNetService(endpoint)) as am:
                assert SplitC(am, 0, {1: 7})._uam is am

    trio.run(main)
    sc, _ = rank_with(np.zeros(2, np.int64))
    assert sc._uam is None


def test_a_global_pointer_is_a_value() -> None:
    from stacklib.layers.splitc import GlobalPtr

    gp = GlobalPtr(1, "x", 5)
    assert gp == GlobalPtr(1, "x", 5) and hash(gp) == hash(GlobalPtr(1, "x", 5))
    assert gp != GlobalPtr(1, "x", 6) and gp != GlobalPtr(0, "x", 5) and gp != GlobalPtr(1, "y", 5)
    assert gp != (1, "x", 5)
    assert {gp: 1}[(gp + 2) - 2] == 1
    assert repr(gp) == "GlobalPtr(rank=1, region='x', offset=5)"
    assert GlobalPtr(2, "x") == GlobalPtr(2, "x", 0)


def test_the_target_answers_a_write_as_specified_beside_the_read_path() -> None:
    # The general path (a write) in the handler that also holds the read's fast path.
    sc, am = rank_with(np.zeros(4, np.int64))
    data = np.int64(-3).tobytes()
    sc._on_request(7, *build_request(Request(Kind.WRITE, 8, 0, 11, 16, data)))
    assert tuple(am.replies.pop()[1:]) == build_reply(Reply(Kind.ACK, 8, Status.OK, 11, b""))
    assert sc.local("x").tolist() == [0, 0, -3, 0]
    sc._on_request(7, *build_request(Request(Kind.READ, 8, 0, 12, 16)))
    assert tuple(am.replies.pop()[1:]) == build_reply(Reply(Kind.VALUE, 8, Status.OK, 12, data))


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.integers(-(2**63), 2**63 - 1).map(np.int64),
        st.floats(allow_nan=False).map(np.float64),
        st.booleans().map(np.bool_),
        st.integers(-(2**31), 2**31 - 1).map(np.int32),
        st.integers(0, 2**64 - 1).map(np.uint64),
        st.integers(0, 2**32 - 1).map(np.uint32),
        st.floats(width=32, allow_nan=False).map(np.float32),
        st.lists(st.integers(-100, 100), max_size=5).map(lambda xs: np.array(xs, np.int64)),
        st.integers(0, 255).map(np.uint8),  # a scalar of a dtype without the short form
    )
)
def test_collective_payloads_round_trip(value: Any) -> None:
    """A collective's payload gives back the value: dtype, shape and data; scalars of the
    common dtypes in 10 bytes or less, so a reduction of one number fits one request."""
    from stacklib.layers.splitc.runtime import _COLL_IN_WORDS, _pack_array, _unpack_array

    array = np.asarray(value)
    data = _pack_array(array)
    back = _unpack_array(data)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()
    if array.ndim == 0 and array.dtype != np.uint8:
        assert len(data) <= _COLL_IN_WORDS


def test_small_collectives_travel_in_one_request_and_bad_words_are_counted() -> None:
    from stacklib.layers.splitc.runtime import _H_COLL_WORDS

    sc, am = rank_with(np.arange(4, dtype=np.int64))
    handler = sc._on_coll_words
    handler(7, 3, 0x61626300, 0, 0)  # from rank 1 (channel 7): b"abc"
    handler(7, 0, 0, 0, 0)  # an empty payload
    assert list(sc._coll_in[1]) == [b"abc", b""]
    handler(7, 13, 0, 0, 0)  # longer than three words
    handler(7, 3, 0, 0)  # a word short
    handler(7, 3, "x", 0, 0)  # not a word
    handler(99, 3, 0, 0, 0)  # no rank on that channel
    assert sc.counters["malformed"] == 4 and len(sc._coll_in[1]) == 2

    async def send() -> None:
        await sc._send_coll(1, b"\x01\x02\x03\x04\x05")

    trio.run(send)
    assert am.requests[-1] == (7, _H_COLL_WORDS, 5, 0x01020304, 0x05000000, 0)
