"""The quick awaitable (``_quickawait.c``): ``quick(fast, slow)(obj, *args)`` is
``fast(obj, *args)`` when that is not ``NotImplemented``, else the coroutine
``slow(obj, *args)`` awaited, sends, throws and closes passed on to it; nothing runs before the
first send.  (The shm endpoint's receive calls
in either form: tests/transports/test_shm_await.py.)"""

from __future__ import annotations

import collections.abc
import gc
from typing import Any

import pytest
import trio

from tests.c_extension import load_quick


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_quick(tmp_path_factory.mktemp("quickawait"))


class Box:
    """The ``obj`` of the tests: what fast returns, and a log of the calls."""

    def __init__(self, ready: object, forever: bool = False) -> None:
        self.ready = ready
        self.forever = forever  # slow then waits until cancelled
        self.log: list[str] = []


def fast(box: Box) -> object:
    box.log.append("fast")
    if isinstance(box.ready, BaseException):
        raise box.ready
    return box.ready


async def slow(box: Box) -> str:
    box.log.append("slow")
    try:
        await trio.sleep(0)  # a real suspension: sends pass through the awaitable
        if box.forever:
            await trio.sleep_forever()
        return "waited"
    finally:
        box.log.append("slow done")


async def test_a_ready_result_is_the_await_without_the_coroutine(quick: Any) -> None:
    box = Box(("ch", b"data"))
    awaitable = quick(fast, slow)(box)
    assert box.log == []  # nothing runs before it is awaited
    assert await awaitable == ("ch", b"data")
    assert box.log == ["fast"]
    assert await quick(fast, slow)(Box(None)) is None  # None is a result too


async def test_the_arguments_go_to_both_halves(quick: Any) -> None:
    calls: list[tuple[object, ...]] = []

    def fast_with(box: Box, channel: int, data: bytes) -> object:
        calls.append(("fast", channel, data))
        return box.ready

    async def slow_with(box: Box, channel: int, data: bytes) -> tuple[int, bytes]:
        calls.append(("slow", channel, data))
        return channel, data

    assert await quick(fast_with, slow_with)(Box(None), 3, b"x") is None
    assert await quick(fast_with, slow_with)(Box(NotImplemented), 4, b"y") == (4, b"y")
    assert calls == [("fast", 3, b"x"), ("fast", 4, b"y"), ("slow", 4, b"y")]


async def test_not_implemented_awaits_the_slow_coroutine(quick: Any) -> None:
    box = Box(NotImplemented)
    assert await quick(fast, slow)(box) == "waited"
    assert box.log == ["fast", "slow", "slow done"]


async def test_what_fast_raises_is_raised_and_slow_never_runs(quick: Any) -> None:
    box = Box(ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        await quick(fast, slow)(box)
    assert box.log == ["fast"]


async def test_a_cancelled_wait_is_thrown_into_the_coroutine(quick: Any) -> None:
    box = Box(NotImplemented, forever=True)
    with trio.move_on_after(0.05) as scope:
        await quick(fast, slow)(box)
    assert scope.cancelled_caught
    assert box.log == ["fast", "slow", "slow done"]  # its finally ran


async def test_trio_starts_a_task_from_it(quick: Any) -> None:
    done: list[object] = []

    async def task() -> None:
        done.append(await quick(fast, slow)(Box(NotImplemented)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(task)
        nursery.start_soon(lambda: quick(fast, slow)(Box(7)))  # the awaitable itself
    assert done == ["waited"]


def test_the_coroutine_protocol_by_hand(quick: Any) -> None:
    awaitable = quick(fast, slow)(Box(3))
    assert isinstance(awaitable, collections.abc.Coroutine)
    with pytest.raises(StopIteration) as stop:
        awaitable.send(None)
    assert stop.value.value == 3
    with pytest.raises(RuntimeError, match="already awaited"):
        awaitable.send(None)
    fresh = quick(fast, slow)(Box(3))
    with pytest.raises(TypeError, match="non-None"):
        fresh.send(1)
    # Thrown into before it started: raised there, and it is done (fast never ran).
    box = Box(3)
    thrown = quick(fast, slow)(box)
    with pytest.raises(KeyError):
        thrown.throw(KeyError("x"))
    with pytest.raises(RuntimeError, match="already awaited"):
        thrown.send(None)
    assert box.log == []


def test_close_closes_the_waiting_coroutine(quick: Any) -> None:
    box = Box(NotImplemented)
    awaitable = quick(fast, slow)(box)
    awaitable.send(None)  # suspended in the coroutine's first sleep (a trio trap)
    assert box.log == ["fast", "slow"]
    awaitable.close()
    assert box.log == ["fast", "slow", "slow done"]
    quick(fast, slow)(box).close()  # before it started: nothing runs
    assert box.log == ["fast", "slow", "slow done"]
    # Thrown into while it waits: into the coroutine, whose finally runs; then it is done.
    thrown = quick(fast, slow)(box)
    thrown.send(None)
    with pytest.raises(KeyError):
        thrown.throw(KeyError("x"))
    assert box.log[-3:] == ["fast", "slow", "slow done"]
    with pytest.raises(RuntimeError, match="already awaited"):
        thrown.send(None)


def test_misuse_names_the_problem(quick: Any) -> None:
    with pytest.raises(TypeError, match=r"quick\(\) missing required argument 'slow'"):
        quick(fast)
    with pytest.raises(TypeError, match="obj and at most 2 more positional arguments"):
        quick(fast, slow)(1, 2, 3, 4)
    with pytest.raises(TypeError, match="no keywords"):
        quick(fast, slow)(Box(1), key=2)
    with pytest.raises(TypeError, match="obj and 1 more positional arguments"):
        quick(fast, slow, arity=1)(Box(1))
    with pytest.raises(ValueError, match="arity must be -1 to 2, not 3"):
        quick(fast, slow, arity=3)
    awaitable = quick(fast, lambda box: "not a coroutine")(Box(NotImplemented))
    with pytest.raises(TypeError, match="slow\\(\\) returned str, not a coroutine"):
        awaitable.send(None)


def test_a_cycle_through_a_waiting_awaitable_is_collected(quick: Any) -> None:
    box = Box(NotImplemented, forever=True)
    log = box.log
    awaitable = quick(fast, slow)(box)
    awaitable.send(None)  # waiting in its coroutine
    box.cycle = awaitable  # type: ignore[attr-defined]  # awaitable -> box -> awaitable
    del box, awaitable
    gc.collect()
    assert log == ["fast", "slow", "slow done"]  # collected: the coroutine was closed


def test_freed_awaitables_are_reused_cleanly(quick: Any) -> None:
    call = quick(fast, slow)
    for round_ in range(100):  # more than the free list keeps
        held = [call(Box(index + round_)) for index in range(40)]
        for index, awaitable in enumerate(held):
            with pytest.raises(StopIteration) as stop:
                awaitable.send(None)
            assert stop.value.value == index + round_


async def test_a_true_test_skips_fast_for_slow(quick: Any) -> None:
    verdicts: list[object] = []

    def test() -> object:
        return verdicts.pop(0)

    box = Box("ready")
    call = quick(fast, slow, test)
    verdicts[:] = [False, 1, 0, True]  # any truth: bool or not
    assert await call(box) == "ready"
    assert await call(box) == "waited"
    assert await call(box) == "ready"
    awaitable = call(box)
    assert verdicts == [True]  # the test runs at the first send, not at the call
    assert box.log == ["fast", "slow", "slow done", "fast"]  # no fast for the true test
    assert await awaitable == "waited"
    assert box.log[4:] == ["slow", "slow done"]


async def test_the_test_runs_at_the_first_send_only_and_its_errors_are_raised(quick: Any) -> None:
    ran: list[str] = []

    def test() -> bool:
        ran.append("test")
        return False

    awaitable = quick(fast, slow, test)(Box(NotImplemented))
    assert ran == []
    assert await awaitable == "waited"
    assert ran == ["test"]  # not again while the coroutine runs

    def broken() -> bool:
        raise OSError("the test failed")

    box = Box(1)
    with pytest.raises(OSError, match="the test failed"):
        await quick(fast, slow, broken)(box)
    assert box.log == []  # neither half ran


async def test_a_builtin_test_is_called_at_its_c_function(quick: Any) -> None:
    assert await quick(fast, slow, bool)(Box("ready")) == "ready"  # bool(): False
    assert await quick(fast, slow, object().__hash__)(Box("ready")) == "waited"  # nonzero


class Service:
    """A class whose ``call`` the quick call replaces (as the shm endpoint's await calls)."""

    def __init__(self, ready: object) -> None:
        self.box = Box(ready)

    async def call(self, channel: int, data: bytes, *, flag: bool = False) -> object:
        """The reference coroutine: its docstring is the quick call's."""
        return ("method", channel, data, flag)


def service_fast(service: Service, channel: int, data: bytes) -> object:
    service.box.log.append("fast")
    return service.box.ready if service.box.ready is NotImplemented else (channel, data)


async def service_slow(service: Service, channel: int, data: bytes) -> object:
    service.box.log.append("slow")
    await trio.sleep(0)
    return ("slow", channel, data)


async def test_standing_in_for_a_method(quick: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    method = Service.call
    call = quick(service_fast, service_slow, None, method, 2)
    assert call.__name__ == "call" and call.__qualname__ == "Service.call"
    assert call.__doc__ == method.__doc__ and call.__wrapped__ is method
    monkeypatch.setattr(Service, "call", call)
    service = Service("ready")
    assert Service.call is call  # on the class: itself
    assert await service.call(1, b"x") == (1, b"x")  # looked up and called (no bound method)
    bound = service.call
    assert bound.__self__ is service and await bound(2, b"y") == (2, b"y")
    # Calls the pair does not take are the method's: keywords, or other argument counts.
    assert await service.call(3, b"z", flag=True) == ("method", 3, b"z", True)
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        service.call(4)
    assert service.box.log == ["fast", "fast"]
    waiting = Service(NotImplemented)
    assert await waiting.call(5, b"w") == ("slow", 5, b"w")
    assert waiting.box.log == ["fast", "slow"]
    plain = quick(fast, slow)
    assert plain.__name__ == "quick" and plain.__doc__ is None
    with pytest.raises(AttributeError, match="wraps none"):
        getattr(plain, "__wrapped__")  # noqa: B009


async def test_a_c_method_as_fast_is_called_at_its_function(quick: Any) -> None:
    # list.sort: a method descriptor of a C class taking fast-call arguments, as a compiled
    # method is; its result (None) is the await's.
    items = [3, 1, 2]
    assert await quick(list.sort, slow)(items) is None
    assert items == [1, 2, 3]
    # An obj not of its class takes the generic call, which names the problem.
    with pytest.raises(TypeError, match=r"'sort' .* 'list' .* 'str'"):
        await quick(list.sort, slow)("not a list")


def test_a_call_in_a_cycle_through_its_class_is_collected(quick: Any) -> None:
    class Holder:
        async def call(self) -> None:
            """Replaced."""

    Holder.call = quick(fast, slow, None, Holder.call, 0)  # type: ignore[method-assign]
    awaitable = Holder.call(Box(5))  # (a Box as obj: the pair takes any)
    del Holder
    gc.collect()  # the class, its dict and the call: a cycle, collected
    with pytest.raises(StopIteration) as stop:
        awaitable.send(None)  # a call made before still runs (it holds the call alive)
    assert stop.value.value == 5
