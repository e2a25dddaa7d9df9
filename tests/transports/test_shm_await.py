"""The ``await`` faces of the shm endpoint (``send``/``recv`` and the descriptor-free
``send_payload_async``/``recv_payload``): each call a cancellation point, other tasks run
within :data:`YIELD_EVERY` calls, and nothing lost or reordered, cancelled calls included."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest
import trio

from stacklib.errors import EndpointClosed
from stacklib.transports.shm import ShmEndpoint, ShmNetwork
from stacklib.transports.shm.endpoint import YIELD_EVERY
from stacklib.unet import EndpointConfig, connect

Pair = tuple[ShmEndpoint, ShmEndpoint, int, int]


@pytest.fixture
def pair() -> Iterator[Pair]:
    # 4 KiB rings and a send queue of 4: a burst of 200-byte messages fills both.
    config = EndpointConfig(send_queue=4, recv_queue=64, free_queue=64, rx_buffers=16)
    with ShmNetwork(ring_bytes=4096, max_message=1024, spin_time=0.0) as network:
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"), config, port=1)
        ep_b = b.os.create_endpoint(b.os.process("y"), config, port=1)
        assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
        ch_a, ch_b = connect(ep_a, ep_b)
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
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        seen: list[int] = []
        for index in range(3 * YIELD_EVERY):  # one message in the ring at a time: no waits
            await send(index.to_bytes(2, "little"))
            seen.append(ticks)
            assert await receive() == index.to_bytes(2, "little")
            seen.append(ticks)
        nursery.cancel_scope.cancel()
    # Every YIELD_EVERY calls of an endpoint let the ticker run (each endpoint counts its own
    # calls, so both yield once per YIELD_EVERY round trips), and no more often.
    for start in range(0, len(seen) - 2 * YIELD_EVERY):
        assert seen[start + 2 * YIELD_EVERY] > seen[start]
    assert ticks - seen[0] <= 2 * 3 + 2


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
