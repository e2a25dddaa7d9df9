"""The ``await`` faces of the shm endpoint (``send``/``recv`` and the descriptor-free
``send_payload_async``/``recv_payload``): each call a cancellation point, other tasks run
within :data:`YIELD_EVERY` calls, and nothing lost or reordered, cancelled calls included."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import trio

from stacklib.errors import EndpointClosed
from stacklib.transports.shm import ShmEndpoint, ShmNetwork
from stacklib.transports.shm import endpoint as endpoint_module
from stacklib.transports.shm.endpoint import YIELD_EVERY
from stacklib.unet import EndpointConfig, connect, polled
from tests.c_extension import load_quick
from tests.transports.ticker import Ticker

Pair = tuple[ShmEndpoint, ShmEndpoint, int, int]


@pytest.fixture(scope="module")
def quick_form(tmp_path_factory: pytest.TempPathFactory) -> object:
    """``quick`` of ``_quickawait.c``, built here (the compiled copy's receive calls use it)."""
    return load_quick(tmp_path_factory.mktemp("quickawait"))


@pytest.fixture(params=["coroutine", "quick"])
def pair(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    """Two endpoints joined by a channel, their receive calls in either form: the coroutine
    (the reference; the pure modules) or the quick awaitable over it (the compiled copy)."""
    if request.param == "coroutine" and endpoint_module.QUICK is not None:
        pytest.skip("the compiled copy's calls always take the quick form")
    if request.param == "quick":
        calls = endpoint_module.quick_calls(request.getfixturevalue("quick_form"))
        names = ("_QUICK_SEND", "_QUICK_SEND_PAYLOAD", "_QUICK_RECV", "_QUICK_RECV_PAYLOAD")
        for name, call in zip(names, calls, strict=True):
            monkeypatch.setattr(endpoint_module, name, call)
        for name, call in zip(endpoint_module._METHODS, calls, strict=True):
            monkeypatch.setattr(ShmEndpoint, name, call)  # as install_quick_calls does
    # 4 KiB rings and a send queue of 4: a burst of 200-byte messages fills both.
    config = EndpointConfig(send_queue=4, recv_queue=64, free_queue=64, rx_buffers=16)
    with ShmNetwork(ring_bytes=4096, max_message=1024, spin_time=0.0) as network:
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"), config, port=1)
        ep_b = b.os.create_endpoint(b.os.process("y"), config, port=1)
        assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
        ch_a, ch_b = connect(ep_a, ep_b)
        form = "QuickAwait" if request.param == "quick" else "coroutine"
        for call in (
            ep_a.recv(),
            ep_a.recv_payload(),
            ep_a.send(ch_a, b""),
            ep_a.send_payload_async(ch_a, b""),
        ):
            assert type(call).__name__ == form
            call.close()
        yield ep_a, ep_b, ch_a, ch_b


def _receive(face: str, endpoint: ShmEndpoint) -> Callable[[], Awaitable[bytes]]:
    async def message() -> bytes:
        return (await endpoint.recv()).data

    async def payload() -> bytes:
        return (await endpoint.recv_payload())[1]

    return message if face == "message" else payload


def _send(face: str, endpoint: ShmEndpoint, channel: int) -> Callable[[bytes], Awaitable[None]]:
    async def message(data: bytes) -> None:
        await endpoint.send(channel, data)

    async def payload(data: bytes) -> None:
        await endpoint.send_payload_async(channel, data)

    return message if face == "message" else payload


FACES = ["message", "payload"]


@pytest.mark.parametrize("face", FACES)
async def test_every_call_is_a_cancellation_point(face: str, pair: Pair) -> None:
    """Whatever the count towards the next yield, a call in a cancelled scope raises
    ``trio.Cancelled`` (the calls that do not yield still test for cancellation)."""
    ep_a, ep_b, ch_a, ch_b = pair
    send, receive = _send(face, ep_a, ch_a), _receive(face, ep_b)
    for index in range(2 * YIELD_EVERY + 1):
        await send(index.to_bytes(2, "little"))
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await receive()
            with pytest.raises(trio.Cancelled):
                await send(b"never")
        assert await receive() == index.to_bytes(2, "little")
    assert ep_b.poll_payload() is None
    await ep_a.send_payload_async(ch_a, b"pair")
    assert await ep_b.recv_payload() == (ch_b, b"pair")


@pytest.mark.parametrize("face", FACES)
async def test_a_cancelled_call_raises_at_once_and_takes_or_sends_nothing(
    face: str, pair: Pair
) -> None:
    ep_a, ep_b, ch_a, _ = pair
    send, receive = _send(face, ep_a, ch_a), _receive(face, ep_b)
    await send(b"kept")
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await receive()
        with pytest.raises(trio.Cancelled):
            await send(b"not sent")
    assert await receive() == b"kept"  # the cancelled receive took nothing
    assert ep_b.poll_payload() is None  # and the cancelled send sent nothing
    assert ep_a.sent == 1


@pytest.mark.parametrize("face", FACES)
async def test_a_waiting_receive_is_cancelled_promptly(face: str, pair: Pair) -> None:
    _, ep_b, _, _ = pair
    receive = _receive(face, ep_b)
    start = trio.current_time()
    with trio.fail_after(5), trio.move_on_after(0.02) as scope:
        await receive()
    assert scope.cancelled_caught
    assert trio.current_time() - start < 1.0  # woken out of its sleep, not after max_sleep


@pytest.mark.parametrize("face", FACES)
async def test_other_tasks_run_within_yield_every_calls(face: str, pair: Pair) -> None:
    ep_a, ep_b, ch_a, _ = pair
    send, receive = _send(face, ep_a, ch_a), _receive(face, ep_b)
    ticker = Ticker()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.run)
        await trio.lowlevel.checkpoint()
        seen: list[int] = []
        for index in range(3 * YIELD_EVERY):  # one message in the ring at a time: no waits
            await send(index.to_bytes(2, "little"))
            seen.append(ticker.ticks)
            assert await receive() == index.to_bytes(2, "little")
            seen.append(ticker.ticks)
        nursery.cancel_scope.cancel()
    # Every YIELD_EVERY calls of an endpoint let the ticker run (each endpoint counts its own
    # calls, so both yield once per YIELD_EVERY round trips), and no more often.
    for start in range(0, len(seen) - 2 * YIELD_EVERY):
        assert seen[start + 2 * YIELD_EVERY] > seen[start]
    assert ticker.ticks - seen[0] <= 2 * 3 + 2


@pytest.mark.parametrize("face", FACES)
async def test_nothing_is_lost_or_reordered_through_full_rings_and_cancelled_receives(
    face: str, pair: Pair
) -> None:
    ep_a, ep_b, ch_a, _ = pair
    send, receive = _send(face, ep_a, ch_a), _receive(face, ep_b)
    count = 300  # 200-byte messages: the ring holds 19 and the send queue 4
    got: list[int] = []
    cancelled = 0

    async def receiver() -> None:
        nonlocal cancelled
        while len(got) < count:
            with trio.move_on_after(0.0002) as scope:  # cancelled while the sender pauses
                data = await receive()
                got.append(int.from_bytes(data[:2], "little"))
            cancelled += scope.cancelled_caught
            if len(got) % 50 == 0:
                await trio.sleep(0.002)  # the sender fills the ring and the send queue

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            for index in range(count):
                await send(index.to_bytes(2, "little") * 100)
                assert not ep_a.send_queue  # each send returns with its message in the ring
                if index % 40 == 0:
                    await trio.sleep(0.002)
    assert got == list(range(count))
    assert cancelled  # the test did cancel receives
    assert ep_a.statistics().send_queue_high_water  # and sends did wait behind a full ring


async def test_the_payload_faces_on_a_closed_endpoint(pair: Pair) -> None:
    ep_a, ep_b, ch_a, _ = pair
    ep_b.close()
    with trio.fail_after(5), pytest.raises(EndpointClosed):
        await ep_b.recv_payload()
    ep_a.close()
    with pytest.raises(EndpointClosed):
        await ep_a.send_payload_async(ch_a, b"x")


@trio.lowlevel.enable_ki_protection
def _ctrl_c_in_trio_code() -> None:
    """A Ctrl-C landing where trio's own code runs: trio holds it for the main task's next
    checkpoint (``ki_pending``) instead of raising it there."""
    signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("face", FACES)
def test_a_ctrl_c_trio_holds_is_raised_within_yield_every_calls(face: str, pair: Pair) -> None:
    """Calls that do not yield still deliver a held ``KeyboardInterrupt``: the call that
    would yield raises it before it takes or sends anything."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("trio installs its Ctrl-C handler only over Python's default one")
    ep_a, ep_b, ch_a, ch_b = pair
    ep_a.yield_every = ep_b.yield_every = 8
    count = 40  # 2-byte messages: all fit the ring

    async def main() -> int:
        send, receive = _send(face, ep_a, ch_a), _receive(face, ep_b)
        await send_all(send, count)
        _ctrl_c_in_trio_code()
        assert polled._RUN_CONTEXT.runner.ki_pending
        calls = 0
        with pytest.raises(KeyboardInterrupt):
            while True:
                assert await receive() == calls.to_bytes(2, "little")
                calls += 1
        return calls

    async def send_all(send: Callable[[bytes], Awaitable[None]], n: int) -> None:
        for index in range(n):
            await send(index.to_bytes(2, "little"))

    taken = trio.run(main)
    assert taken < 8  # delivered by the eighth call at the latest
    assert ep_b.poll_payload() == (ch_b, taken.to_bytes(2, "little"))  # and nothing lost

    # The send faces the same way: the interrupted send sent nothing.
    ep_b.recv_many(count)

    async def sends() -> int:
        send = _send(face, ep_a, ch_a)
        _ctrl_c_in_trio_code()
        calls = 0
        with pytest.raises(KeyboardInterrupt):
            while True:
                await send(calls.to_bytes(2, "little"))
                calls += 1
        return calls

    sent = trio.run(sends)
    assert sent < 8
    assert [message.data for message in ep_b.recv_many(count)] == [
        index.to_bytes(2, "little") for index in range(sent)
    ]


@pytest.mark.parametrize("face", FACES)
async def test_yield_every_sets_how_often_other_tasks_run(face: str, pair: Pair) -> None:
    ep_a, ep_b, ch_a, _ = pair
    ep_a.yield_every = ep_b.yield_every = 5
    send, receive = _send(face, ep_a, ch_a), _receive(face, ep_b)
    ticker = Ticker()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.run)
        await trio.lowlevel.checkpoint()
        start = ticker.ticks
        for index in range(50):  # 50 calls of each endpoint: 10 yields each
            await send(index.to_bytes(2, "little"))
            assert await receive() == index.to_bytes(2, "little")
        ran = ticker.ticks - start
        nursery.cancel_scope.cancel()
    assert 2 * 10 - 2 <= ran <= 2 * 10 + 2


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("hot_spin", [5.0, 0.0])  # 5 s: slack for a loaded machine
async def test_a_reply_within_hot_spin_is_taken_without_yielding(
    face: str, hot_spin: float
) -> None:
    """A receive polls ``hot_spin`` seconds without yielding (a reply from another process
    comes sooner than a scheduler pass); with ``hot_spin=0`` it goes straight to the spin
    with checkpoints, where other tasks run."""
    with ShmNetwork(ring_bytes=4096, max_message=1024, spin_time=1.0, hot_spin=hot_spin) as network:
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
        ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
        assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
        ch_a, _ = connect(ep_a, ep_b)
        receive = _receive(face, ep_b)
        ticker = Ticker()

        def reply_soon() -> None:  # the peer: another thread, as another process would be
            time.sleep(0.005)
            ep_a.send_payload(ch_a, b"reply")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker.run)
            await trio.lowlevel.checkpoint()
            peer = threading.Thread(target=reply_soon)
            peer.start()
            before = ticker.ticks
            assert await receive() == b"reply"
            ran = ticker.ticks - before
            peer.join()
            nursery.cancel_scope.cancel()
    if hot_spin:
        assert ran == 0
    else:
        assert ran > 0
