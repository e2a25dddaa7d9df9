"""The shm bulk paths: bytes sent straight from the caller's object, receive-into a buffer,
views lent out of the ring (their lifetime), across wrap-around and a full ring; and how
often ``await recv()`` yields."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from stacklib.errors import UNetError
from stacklib.transports.shm import ShmEndpoint, ShmNetwork
from stacklib.unet import DescriptorStatus, connect
from tests.transports.ticker import Ticker


def _payload(size: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + size + seed) & 0xFF for i in range(size))


@pytest.fixture
def small() -> Iterator[ShmNetwork]:
    # 4 KiB rings: a few records of a few hundred bytes wrap around often.
    with ShmNetwork(ring_bytes=4096, max_message=1500) as net:
        yield net


#: The ``yield_every`` these tests set: twice its number of small messages fit a ring.
EVERY = 64


def _pair(network: ShmNetwork) -> tuple[ShmEndpoint, ShmEndpoint, int, int]:
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
    ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
    assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
    ch_a, ch_b = connect(ep_a, ep_b)
    return ep_a, ep_b, ch_a, ch_b


def test_large_bytes_go_straight_from_the_callers_object(small: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, ch_b = _pair(small)
    data = _payload(1500)
    pool = len(ep_a._tx_pool)
    descriptor = ep_a.send_nowait(ch_a, data)
    assert descriptor.status is DescriptorStatus.INJECTED
    assert descriptor.inline is data  # no copy into the segment, nor of the object
    assert len(ep_a._tx_pool) == pool and not ep_a._tx_inflight  # the segment was not used
    message = ep_b.poll()
    assert message is not None and (message.channel, message.data) == (ch_b, data)
    assert ep_a.statistics().sent_bytes == 1500
    with pytest.raises(UNetError, match="exceeds the NI's maximum"):
        ep_a.send_nowait(ch_a, bytes(1501))


def test_poll_into_copies_into_the_buffer_and_refuses_a_short_one(small: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, ch_b = _pair(small)
    buffer = bytearray(1500)
    assert ep_b.poll_into(buffer) is None
    ep_a.send_nowait(ch_a, _payload(300))
    ep_a.send_nowait(ch_a, b"")
    with pytest.raises(ValueError, match="300 bytes does not fit a 100-byte buffer"):
        ep_b.poll_into(bytearray(100))
    # The message stayed in its ring: a buffer that fits gets it, then the empty one.
    assert ep_b.poll_into(memoryview(buffer)[10:]) == (ch_b, 300)
    assert bytes(buffer[10:310]) == _payload(300)
    assert ep_b.poll_into(buffer) == (ch_b, 0)
    assert ep_b.poll_into(buffer) is None
    stats = ep_b.statistics()
    assert (stats.received, stats.received_bytes) == (2, 300)


def test_a_view_lives_until_the_next_receive_call(small: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, ch_b = _pair(small)
    for seed in range(3):
        ep_a.send_nowait(ch_a, _payload(200, seed))
    got = ep_b.poll_view()
    assert got is not None
    channel, view = got
    assert channel == ch_b and view.readonly and bytes(view) == _payload(200, 0)
    with pytest.raises(TypeError):
        view[0] = 1  # type: ignore[index]
    message = ep_b.poll()  # the next receive call frees the record and releases the view
    assert message is not None and message.data == _payload(200, 1)
    with pytest.raises(ValueError):
        bytes(view)
    got = ep_b.poll_view()
    assert got is not None and bytes(got[1]) == _payload(200, 2)
    ep_b.release_view()
    with pytest.raises(ValueError):
        bytes(got[1])
    ep_b.release_view()  # no view: nothing to do
    assert ep_b.poll_view() is None


def test_a_held_record_is_not_reused_until_released(small: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(small)
    first = _payload(1000, 1)
    ep_a.send_nowait(ch_a, first)
    got = ep_b.poll_view()
    assert got is not None
    view = got[1]
    # The 4 KiB ring (four records of 1008 bytes) fills behind the held record: the producer
    # never writes over it.
    batch = [_payload(1000, 10 + seed) for seed in range(5)]
    assert ep_a.send_many(ch_a, batch) == 3
    assert bytes(view) == first
    ep_b.release_view()
    received = []
    while (message := ep_b.poll()) is not None:
        received.append(message.data)
    assert ep_a.send_many(ch_a, batch[3:]) == 2  # room again once the view was released
    while (message := ep_b.poll()) is not None:
        received.append(message.data)
    assert received == batch


def test_views_and_receive_into_across_wrap_around(small: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(small)
    buffer = bytearray(1500)
    # Sizes that leave every offset of the ring's end in turn: PAD records often.
    sizes = [(i * 277) % 1400 + 1 for i in range(60)]
    for index, size in enumerate(sizes):
        data = _payload(size, index)
        ep_a.send_many(ch_a, [data])  # any buffer type, straight into the ring
        if index % 2:
            got = ep_b.poll_view()
            assert got is not None and bytes(got[1]) == data
        else:
            assert ep_b.poll_into(buffer) is not None
            assert bytes(buffer[:size]) == data
    ring = small.nodes["b"].ni.link(ep_b, 0).rx  # type: ignore[attr-defined]
    assert ring.corrupt == 0 and ring.error is None


def test_the_nis_progress_never_delivers_a_held_message_twice(small: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(small)
    for seed in range(2):
        ep_a.send_nowait(ch_a, _payload(100, seed))
    got = ep_b.poll_view()
    assert got is not None
    ep_b.shm_ni.progress()  # frees the held record first, then queues the next message
    with pytest.raises(ValueError):
        bytes(got[1])
    message = ep_b.poll()
    assert message is not None and message.data == _payload(100, 1)
    assert ep_b.poll() is None


def test_closing_with_a_view_out(small: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(small)
    ep_a.send_nowait(ch_a, _payload(64))
    got = ep_b.poll_view()
    assert got is not None
    ep_b.close()
    with pytest.raises(ValueError):
        bytes(got[1])


async def test_recv_yields_now_and_then_and_is_always_a_cancellation_point(
    small: ShmNetwork,
) -> None:
    ep_a, ep_b, ch_a, _ = _pair(small)
    ep_b.yield_every = EVERY
    count = 2 * EVERY
    for index in range(count):
        ep_a.send_nowait(ch_a, bytes([index]))
    ticker = Ticker()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.run)
        await trio.lowlevel.checkpoint()
        before = ticker.ticks
        for index in range(count):
            assert (await ep_b.recv()).data == bytes([index])
        # Other tasks ran, but not after every message (a scheduler pass per message would
        # cost as much as the round trip): twice, and the ticker may have one run pending
        # from before (trio runs a batch in either order).
        assert 1 <= ticker.ticks - before <= 3
        nursery.cancel_scope.cancel()
    ep_a.send_nowait(ch_a, b"kept")
    reached = False
    with trio.CancelScope() as scope:
        scope.cancel()
        await ep_b.recv()
        reached = True
    assert not reached
    message = ep_b.poll()  # the cancelled recv took nothing
    assert message is not None and message.data == b"kept"


def test_hot_spin_is_checked() -> None:
    with pytest.raises(ValueError, match="hot_spin must be >= 0"):
        ShmNetwork(hot_spin=-1e-6)


async def test_send_yields_now_and_then_and_returns_with_the_message_in_the_ring() -> None:
    # A 32 KiB ring holds 157 of these 200-byte messages (2 * EVERY fit): the rest wait
    # in the send queue, and each ``await send`` returns only once its message is in the ring.
    assert 2 * EVERY * 208 <= 32768
    with ShmNetwork(ring_bytes=32768, max_message=1024, spin_time=0.0) as network:
        ep_a, ep_b, ch_a, _ = _pair(network)
        ep_a.yield_every = EVERY
        ticks = 0
        got: list[bytes] = []

        async def receiver() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                while (message := ep_b.poll()) is not None:
                    got.append(message.data)
                await trio.lowlevel.checkpoint()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receiver)
                await trio.lowlevel.checkpoint()
                before = ticks
                for index in range(2 * EVERY):  # fits the ring: no waiting
                    descriptor = await ep_a.send(ch_a, bytes([index & 0xFF]) * 200)
                    assert descriptor.status is DescriptorStatus.INJECTED
                assert 1 <= ticks - before <= 3
                for index in range(2 * EVERY, 300):
                    descriptor = await ep_a.send(ch_a, bytes([index & 0xFF]) * 200)
                    assert descriptor.status is DescriptorStatus.INJECTED
                    assert not ep_a.send_queue
                while len(got) < 300:
                    await trio.lowlevel.checkpoint()
                nursery.cancel_scope.cancel()
        assert [message[0] for message in got] == [index & 0xFF for index in range(300)]
