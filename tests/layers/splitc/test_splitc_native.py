"""Split-C's C request handler (``_splitccore.c``) against the runtime's Python handler.

``ScalarReadHandler`` is the request handler a rank registers over UAM where the C extension is
built: called, it calls the runtime's ``_on_request``; its ``native_handler`` table lets UAM's
express poll answer a read of one whole element of a scalar region without that call.  What
the table answers must be exactly the reply the Python handler makes (and it must answer every
read the Python fast path answers); everything else it declines.  The extension and the UAM
core are compiled here into temporary directories with the compiler ``stacklib compile`` uses;
the tests skip, saying why, where there is none.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.layers.splitc import SplitC
from stacklib.layers.splitc.runtime import Pending, _Region
from stacklib.layers.splitc.wire import Kind, Request, build_request
from stacklib.layers.uam.machine import UamMachine
from tests.c_extension import load_c_extension
from tests.layers.splitc.test_splitc_fast_paths import DTYPES, FakeAm, values
from tests.layers.test_uam_express import World, forms  # noqa: F401 - forms: a fixture

# Element sizes no scalar access has (a 16-byte complex, a 3-byte record): every read declined.
NON_SCALAR = [np.complex128, np.dtype("V3")]


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    return load_c_extension(
        "layers/splitc/_splitccore.c",
        tmp_path_factory.mktemp("splitccore"),
        "Split-C's C request handler",
    )


def ranks(native: ModuleType, arrays: list[np.ndarray[Any, Any]]) -> tuple[SplitC, FakeAm, Any]:
    """Rank 0 of 2 with regions 0.. = ``arrays`` (registered without the collective exchange)
    and a C handler over them whose fallback is the rank's Python request handler."""
    am = FakeAm()
    sc = SplitC(am, 0, {1: 7})  # type: ignore[arg-type]
    handler = native.ScalarReadHandler(sc._on_request)
    handler.reply_handler = sc._reply_handler
    for index, array in enumerate(arrays):
        region = _Region(index, f"r{index}", array, 0, (len(array), len(array)))
        sc._by_index.append(region)
        sc._regions[region.name] = region
        assert handler.add_region(region.raw, region.itemsize) == index
    return sc, am, handler


def python_fast_path_answers(sc: SplitC, words: tuple[int, ...]) -> bool:
    """Whether ``words`` is a read the Python handler's fast path answers (a whole element of
    a scalar region, inside it)."""
    if len(words) != 4:
        return False
    first, offset = words[0], words[1]
    index, size = (first >> 16) & 0xFF, (first >> 24) & 0xF
    if first >> 28 != 1 or index >= len(sc._by_index):
        return False
    region = sc._by_index[index]
    return region.scalar and size == region.itemsize and offset + size <= region.nbytes


word = st.integers(0, 2**32 - 1)


@st.composite
def requests(draw: st.DrawFn, arrays: list[np.ndarray[Any, Any]]) -> tuple[int, ...]:
    """Reads near every region's bounds (of the right size and others, of regions that exist
    and one that does not), other kinds, and any words."""
    choice = draw(st.integers(0, 3))
    if choice == 3:
        return tuple(draw(st.lists(word, max_size=4)))
    index = draw(st.integers(0, len(arrays)))
    nbytes = arrays[index].nbytes if index < len(arrays) else 8
    itemsize = arrays[index].itemsize if index < len(arrays) else 8
    size = draw(st.sampled_from(sorted({1, 2, 4, 8, itemsize & 0xF})))
    offset = draw(st.integers(0, nbytes + 9) | st.just(2**32 - 1))
    op = draw(st.integers(0, 0xFFFF))
    kind = Kind.READ if choice < 2 else Kind.WRITE
    data = bytes(size) if kind is Kind.WRITE else b""
    try:
        built = build_request(Request(kind, size, index, op, offset, data))
    except Exception:  # (a field out of the format's range: any words instead)
        return tuple(draw(st.lists(word, max_size=4)))
    if choice == 1:  # the last two words are not looked at by a read
        built = (*built[:2], draw(word), draw(word))
    return tuple(built)


@pytest.mark.parametrize("dtype", [*DTYPES, *NON_SCALAR], ids=str)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_native_answer_is_the_python_handlers_reply(
    native: ModuleType, dtype: Any, data: st.DataObject
) -> None:
    arrays = [values(dtype), values(np.int64, 3)]
    sc, am, handler = ranks(native, arrays)
    words = data.draw(requests(arrays))
    answer = handler.answer(*words)
    counters = dict(sc.counters)
    handler(7, *words)  # the call: the Python handler, as on every path but the express poll
    if answer is not None:
        reply_handler, reply = answer
        assert am.replies == [(reply_handler, *reply)]
        assert sc.counters == counters  # nothing else changed
    assert (answer is not None) == python_fast_path_answers(sc, words)


@st.composite
def replies(draw: st.DrawFn, ops: list[int]) -> tuple[int, ...]:
    """VALUE and ACK replies (and other codes) of every size, status OK and refusals, for
    operations outstanding and others; and any words."""
    if draw(st.integers(0, 4)) == 0:
        return tuple(draw(st.lists(word, max_size=4)))
    code = draw(st.sampled_from([5, 6, 5, 6, 1, 7, 15]))
    size = draw(st.sampled_from([0, 1, 2, 4, 8, 3, 9, 15]))
    status = draw(st.sampled_from([0, 0, 0, 1, 2, 255]))
    op = draw(st.sampled_from(ops) | st.integers(0, 0xFFFF))
    return ((code << 28) | (size << 24) | (status << 16) | op, draw(word), draw(word), draw(word))


def python_reply_fast_path_takes(sc: SplitC, words: tuple[int, ...]) -> bool:
    """Whether the Python reply handler's fast path completes an operation with ``words``."""
    if len(words) != 4:
        return False
    first = words[0]
    code, size = first >> 28, (first >> 24) & 0xF
    return (
        5 <= code <= 6
        and (first >> 16) & 0xFF == 0
        and ((0 < size <= 8 and not size & (size - 1)) or (size == 0 and code == 6))
        and first & 0xFFFF in sc._ops
    )


def outcome(sc: SplitC, pendings: list[Any]) -> object:
    return (
        sorted(sc._ops),
        sc.counters,
        sc._errors and [str(error) for error in sc._errors],
        [(p.done, p._raw, None if p.error is None else str(p.error)) for p in pendings],
    )


@pytest.mark.parametrize("dtype", [np.int64, np.int16, np.float32, np.uint8], ids=str)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_native_reply_completes_as_the_python_handler_does(
    native: ModuleType, dtype: Any, data: st.DataObject
) -> None:
    """Two identical readers with the same reads outstanding take the same replies: one
    through the C reply handler (its table, and its call where the table declines, as UAM's
    core does), the other through the Python handler; their operations, counters, errors and
    completed values must be equal."""
    arrays = [values(dtype)]
    (sc_c, _, _), (sc_py, am_py, _) = ranks(native, arrays), ranks(native, arrays)
    handler = native.ScalarReadHandler(sc_c._on_reply, sc_c._ops)
    assert handler.ops is sc_c._ops
    pendings_c = [sc_c.get_nowait(sc_c.ptr(1, "r0", i)) for i in range(3)]
    pendings_py = [sc_py.get_nowait(sc_py.ptr(1, "r0", i)) for i in range(3)]
    ops = [request[2] & 0xFFFF for request in am_py.requests]
    for words in data.draw(st.lists(replies(ops), min_size=1, max_size=5)):
        fast = python_reply_fast_path_takes(sc_py, words)
        taken = handler.answer_reply(*words)
        assert taken == fast
        if not taken:
            handler(7, *words)  # declined: the core calls the handler object
        sc_py._on_reply(7, *words)
        assert outcome(sc_c, pendings_c) == outcome(sc_py, pendings_py)
    assert handler.answer(*build_request(Request(Kind.READ, 8, 0, 1, 0))) is None  # not a reader


def test_the_handler_calls_its_fallback_and_declines_until_it_knows_the_reply_handler(
    native: ModuleType,
) -> None:
    calls: list[tuple[Any, ...]] = []
    handler = native.ScalarReadHandler(lambda *args, **kwargs: calls.append((args, kwargs)))
    handler.add_region(np.arange(4, dtype=np.int64).data, 8)
    read = build_request(Request(Kind.READ, 8, 0, 3, 8))
    assert handler.reply_handler == -1
    assert handler.answer(*read) is None
    handler.reply_handler = 9
    assert handler.answer(*read) == (9, (0x5800_0003, 0, 0x0100_0000, 0))  # 1, little-endian
    handler(1, 2, three=3)
    assert calls == [((1, 2), {"three": 3})]
    assert handler.regions == 1
    assert type(handler).native_handler is not None  # the table UAM's core looks for


def test_misuse_raises_naming_the_problem(native: ModuleType) -> None:
    with pytest.raises(TypeError, match="callable"):
        native.ScalarReadHandler(3)
    with pytest.raises(TypeError, match="dict of operations"):
        native.ScalarReadHandler(print, [])
    assert native.ScalarReadHandler(print).answer_reply(0x5800_0000, 0, 0, 0) is False
    handler = native.ScalarReadHandler(print)
    with pytest.raises(ValueError, match=r"0\.\.255"):
        handler.reply_handler = 256
    with pytest.raises(TypeError, match="2 arguments"):
        handler.add_region(b"")
    with pytest.raises(TypeError):
        handler.add_region(3, 8)  # not a buffer
    for _ in range(256):
        handler.add_region(b"12345678", 8)
    with pytest.raises(ValueError, match="256 regions"):
        handler.add_region(b"12345678", 8)
    for entry in ("answer", "answer_reply"):
        with pytest.raises(ValueError, match=rf"^{entry}\(\*words\): a word is 32 bits"):
            getattr(handler, entry)(2**32)
        with pytest.raises(TypeError, match=rf"^{entry}\(\*words\) takes at most 4"):
            getattr(handler, entry)(1, 2, 3, 4, 5)


class Bridge(FakeAm):
    """The Split-C rank's service: its replies go to the machine whose request is being
    handled, as UamService.reply does from inside a poll."""

    def __init__(self, service: Any) -> None:
        super().__init__()
        self.service = service

    def reply(self, handler: int, *args: int) -> None:
        service = self.service
        machine: UamMachine = service._current_machine
        machine.reply(service._current_token, handler, args, service._poll_now)
        service._current_machine = None


def test_uams_express_poll_answers_reads_natively_with_the_same_datagrams(
    native: ModuleType,
    forms: dict[str, tuple[type[UamMachine], Any]],  # noqa: F811 - the fixture
) -> None:
    """Side a reads (and writes) side b's region: b's request handler 5 and a's reply handler
    3 are the C handlers.  On the C machines the express polls answer the reads and complete
    the replies themselves; on the reference the handlers are called for each.  The rings
    carry the same bytes and a's operations complete alike; the C form's fallbacks ran only
    for what the tables declined."""
    array = np.arange(6, dtype=np.int64) * 7
    requests = [
        build_request(Request(Kind.READ, 8, 0, 1, 16)),
        build_request(Request(Kind.READ, 8, 0, 2, 48)),  # out of bounds: the Python handlers
        build_request(Request(Kind.WRITE, 8, 0, 4, 8, bytes(range(8)))),  # the Python handler
        build_request(Request(Kind.READ, 8, 0, 5, 40)),
    ]  # (the window is 4)
    seen = {}
    for name, form in forms.items():
        world = World(form, 4096, 256)
        service = world.services["b"]
        sc = SplitC(Bridge(service), 1, {0: 0})  # type: ignore[arg-type]
        sc._reply_handler = 3  # a's reply handler
        region = _Region(0, "x", array.copy(), 0, (6, 6))
        sc._by_index.append(region)
        sc._regions["x"] = region
        fallback_calls: list[tuple[int, ...]] = []

        def fallback(peer: int, *words: int, sc: SplitC = sc, log: list[Any] = fallback_calls):
            log.append(words)
            sc._on_request(peer, *words)

        handler = native.ScalarReadHandler(fallback)
        handler.reply_handler = 3
        handler.add_region(region.raw, region.itemsize)
        world.tables["b"][5] = handler
        # a: the reader, its four operations outstanding (as get_nowait and put leave them)
        reader = SplitC(Bridge(world.services["a"]), 0, {1: 1})  # type: ignore[arg-type]
        mine = _Region(0, "x", np.zeros(6, np.int64), 0, (6, 6))
        reader._by_index.append(mine)
        reader._regions["x"] = mine
        pendings = {op: Pending("get", op, mine.dtype, mine.decode) for op in (1, 2, 5)}
        pendings[4] = Pending("put", 4)
        reader._ops.update(pendings)
        reply_calls: list[tuple[int, ...]] = []

        def on_reply(peer: int, *words: int, sc: SplitC = reader, log: list[Any] = reply_calls):
            log.append(words)
            sc._on_reply(peer, *words)

        world.tables["a"][3] = native.ScalarReadHandler(on_reply, reader._ops)
        for words in requests:
            world._apply(("request", "a", 5, words))
        world._apply(("exchange", "b"))  # a sends, b polls and replies
        world._apply(("exchange", "a"))  # b sends its replies, a polls
        world._apply(("exchange", "b"))
        assert world.held == {"a": [], "b": []}
        seen[name] = (
            {op: (p.done, p._raw, str(p.error)) for op, p in pendings.items()},
            world.rings["a"].state(),
            world.rings["b"].state(),
            world.machines["a"].statistics(),
            world.machines["b"].statistics(),
            bytes(region.raw),
            reader.counters,
        )
        if name == "python":
            assert fallback_calls == requests and len(reply_calls) == 4
        else:  # the tables declined the read out of bounds (both halves) and the write
            assert fallback_calls == [requests[1], requests[2]]
            assert [words[0] & 0xFFFF for words in reply_calls] == [2]
    assert seen["c"] == seen["python"]
    assert not reader._ops and pendings[1].value == 14 and pendings[5].value == 35
    assert pendings[4].done and pendings[4].error is None
    assert "out of bounds" in str(pendings[2].error)


def test_a_cycle_through_the_handler_is_collected_cleanly(native: ModuleType) -> None:
    """A rank's handler and its regions' memoryviews die together in a cycle (the fallback
    is a bound method of the rank, which holds the regions): the collector must not clear a
    memoryview whose buffer the handler still holds (it drops the buffer, and the handler's
    release then touches freed memory).  Run in a child process: the failure is a crash."""
    script = f"""
import gc, importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("_splitccore", {native.__file__!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
errors = []
sys.unraisablehook = lambda unraisable: errors.append(repr(unraisable.exc_value))

class Rank:
    def on_request(self, *words):
        pass

for _ in range(20):
    # The memoryviews first: the collector clears in the order it tracks, and the crash
    # needs one cleared before the rank lets go of the handler.
    raws = [np.arange(4, dtype=np.int64).view(np.uint8).data for _ in range(3)]
    rank = Rank()
    rank.raws = raws
    rank.handler = module.ScalarReadHandler(rank.on_request)
    for raw in raws:
        rank.handler.add_region(raw, 8)
    del rank, raws, raw
    gc.collect()
print(errors)
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
