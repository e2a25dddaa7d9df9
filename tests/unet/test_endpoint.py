"""Endpoints over the memory transport: queues, buffers, inline messages, back-pressure."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from stacklib.errors import EndpointClosed, UNetError
from stacklib.unet import (
    DescriptorStatus,
    DropReason,
    EndpointConfig,
    Fragment,
    RecvKind,
    SendDescriptor,
    SendError,
)

from .conftest import Pair, make_pair


async def test_send_and_recv_small_message_travels_inline(pair: Pair) -> None:
    descriptor = await pair.ep_a.send(pair.ch_a, b"ping")
    assert descriptor.status is DescriptorStatus.INJECTED
    assert descriptor.inline == b"ping"
    received = pair.ep_b.poll_descriptor()
    assert received is not None
    assert received.kind is RecvKind.INLINE and received.inline == b"ping"
    assert received.channel == pair.ch_b


async def test_large_message_fills_several_free_buffers_and_they_come_back() -> None:
    config = EndpointConfig(rx_buffers=8, rx_buffer_size=1024, tx_buffer_size=1024)
    p = make_pair(config)
    payload = bytes(range(256)) * 11  # 2816 bytes: three 1 KiB buffers
    free_before = len(p.ep_b.free_queue)
    await p.ep_a.send(p.ch_a, payload)
    assert len(p.ep_b.free_queue) == free_before - 3
    message = await p.ep_b.recv()
    assert message.data == payload and message.channel == p.ch_b
    assert len(p.ep_b.free_queue) == free_before


async def test_message_uses_scatter_gather_send_buffers() -> None:
    config = EndpointConfig(tx_buffer_size=512, rx_buffer_size=4096)
    p = make_pair(config)
    descriptor = await p.ep_a.send(p.ch_a, b"z" * 1300)
    assert [f.length for f in descriptor.fragments] == [512, 512, 276]
    assert (await p.ep_b.recv()).data == b"z" * 1300


async def test_descriptor_level_send_from_application_area(pair: Pair) -> None:
    ep = pair.ep_a
    ep.segment.write(ep.app_area, b"head-")
    ep.segment.write(ep.app_area + 512, b"tail" * 30)
    descriptor = SendDescriptor(
        pair.ch_a, fragments=(Fragment(ep.app_area, 5), Fragment(ep.app_area + 512, 120))
    )
    ep.post_nowait(descriptor)
    assert descriptor.status is DescriptorStatus.INJECTED
    received = await pair.ep_b.recv_descriptor()
    assert received.kind is RecvKind.BUFFERS
    assert pair.ep_b.read(received) == b"head-" + b"tail" * 30
    free = len(pair.ep_b.free_queue)
    pair.ep_b.release(received)
    assert len(pair.ep_b.free_queue) == free + len(received.fragments)


async def test_full_send_queue_exerts_back_pressure() -> None:
    p = make_pair(EndpointConfig(send_queue=4))
    p.a.ni.pause_transmit()  # the network is backed up
    for i in range(4):
        p.ep_a.send_nowait(p.ch_a, bytes([i]))
    with pytest.raises(trio.WouldBlock):
        p.ep_a.send_nowait(p.ch_a, b"x")
    assert p.ep_a.send_queue.full

    finished = trio.Event()

    async def blocked_sender() -> None:
        await p.ep_a.send(p.ch_a, b"late")
        finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocked_sender)
        await trio.testing.wait_all_tasks_blocked()
        assert not finished.is_set()
        p.a.ni.resume_transmit()
        await finished.wait()
    received = [p.ep_b.poll() for _ in range(5)]
    assert [m.data for m in received if m] == [b"\x00", b"\x01", b"\x02", b"\x03", b"late"]
    assert p.ep_a.statistics().send_queue_high_water == 4


async def test_send_buffers_exhausted_is_back_pressure_too() -> None:
    p = make_pair(EndpointConfig(tx_buffers=2, tx_buffer_size=256))
    p.a.ni.pause_transmit()
    p.ep_a.send_nowait(p.ch_a, b"a" * 200)
    p.ep_a.send_nowait(p.ch_a, b"b" * 200)
    with pytest.raises(trio.WouldBlock):
        p.ep_a.send_nowait(p.ch_a, b"c" * 200)
    p.a.ni.resume_transmit()
    p.ep_a.send_nowait(p.ch_a, b"c" * 200)  # buffers were reclaimed once injected
    assert [p.ep_b.recv_nowait().data[:1] for _ in range(3)] == [b"a", b"b", b"c"]


async def test_message_too_big_for_send_pool_is_misuse() -> None:
    p = make_pair(EndpointConfig(tx_buffers=2, tx_buffer_size=1024))
    with pytest.raises(UNetError, match="send buffers"):
        p.ep_a.send_nowait(p.ch_a, bytes(3000))
    with pytest.raises(UNetError, match="maximum"):
        p.ep_a.send_nowait(p.ch_a, bytes(70000))


async def test_no_free_buffer_drops_and_counts() -> None:
    p = make_pair(EndpointConfig(rx_buffers=2, rx_buffer_size=128))
    for _ in range(3):
        await p.ep_a.send(p.ch_a, b"q" * 100)
    stats = p.ep_b.statistics()
    assert stats.received == 2
    assert stats.dropped == {DropReason.NO_FREE_BUFFER: 1}
    assert stats.free_queue_empty_drops == 1
    # The application returns buffers by consuming messages; traffic flows again.
    assert p.ep_b.poll() is not None
    await p.ep_a.send(p.ch_a, b"r" * 100)
    assert p.ep_b.statistics().received == 3


async def test_full_receive_queue_drops_and_counts() -> None:
    p = make_pair(EndpointConfig(recv_queue=2))
    for i in range(4):
        await p.ep_a.send(p.ch_a, bytes([i]))
    stats = p.ep_b.statistics()
    assert stats.received == 2 and stats.dropped == {DropReason.RECV_QUEUE_FULL: 2}
    assert stats.recv_queue_high_water == 2


async def test_receiver_cannot_choose_the_buffer_the_ni_fills() -> None:
    p = make_pair(EndpointConfig(rx_buffers=0))
    base = p.ep_b.app_area
    for i in range(3):
        p.ep_b.post_free(Fragment(base + 256 * i, 256))
    await p.ep_a.send(p.ch_a, b"m" * 100)
    descriptor = await p.ep_b.recv_descriptor()
    assert descriptor.fragments == (Fragment(base, 256),)  # the NI took the oldest


async def test_bad_free_buffers_are_discarded_by_the_ni() -> None:
    p = make_pair(EndpointConfig(rx_buffers=0))
    size = p.ep_b.segment.size
    p.ep_b.post_free(Fragment(size - 10, 256))  # runs off the end of the segment
    p.ep_b.post_free(Fragment(p.ep_b.app_area + 3, 256))  # misaligned
    p.ep_b.post_free(Fragment(p.ep_b.app_area, 256))
    await p.ep_a.send(p.ch_a, b"k" * 200)
    message = p.ep_b.poll()
    assert message is not None and message.data == b"k" * 200
    assert p.ep_b.statistics().dropped == {DropReason.BAD_FREE_BUFFER: 2}


async def test_send_errors_are_a_status_on_the_descriptor(pair: Pair) -> None:
    ep = pair.ep_a
    cases = {
        SendError.UNKNOWN_CHANNEL: SendDescriptor(7, inline=b"x"),
        SendError.OUT_OF_BOUNDS: SendDescriptor(pair.ch_a, fragments=(Fragment(-4, 8),)),
        SendError.INLINE_TOO_LONG: SendDescriptor(pair.ch_a, inline=bytes(65)),
        SendError.BAD_SHAPE: SendDescriptor(pair.ch_a),
    }
    for error, descriptor in cases.items():
        ep.post_nowait(descriptor)
        assert descriptor.status is DescriptorStatus.ERROR and descriptor.error is error
    assert pair.ep_b.poll() is None
    assert ep.statistics().send_errors == {e.name: 1 for e in cases}
    assert ep.statistics().sent == 0


async def test_async_iteration_ends_when_the_endpoint_closes(pair: Pair) -> None:
    got = []

    async def consumer() -> None:
        async for message in pair.ep_b:
            got.append(message.data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.testing.wait_all_tasks_blocked()
        await pair.ep_a.send(pair.ch_a, b"one")
        await pair.ep_a.send(pair.ch_a, b"two")
        await trio.testing.wait_all_tasks_blocked()
        await pair.ep_b.aclose()
    assert got == [b"one", b"two"]
    with pytest.raises(EndpointClosed):
        await pair.ep_b.recv()
    await pair.ep_b.aclose()  # idempotent


async def test_recv_is_cancellable(pair: Pair) -> None:
    with trio.move_on_after(0.01) as scope:
        await pair.ep_b.recv()
    assert scope.cancelled_caught
    await pair.ep_a.send(pair.ch_a, b"after")
    assert (await pair.ep_b.recv()).data == b"after"


async def test_ping_pong_between_tasks(pair: Pair) -> None:
    async def echo() -> None:
        for _ in range(50):
            message = await pair.ep_b.recv()
            await pair.ep_b.send(message.channel, message.data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        for i in range(50):
            data = i.to_bytes(2, "big") * (i * 10 + 1)
            await pair.ep_a.send(pair.ch_a, data)
            assert (await pair.ep_a.recv()).data == data


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="rx_buffers"):
        EndpointConfig(rx_buffers=100, free_queue=10)
    with pytest.raises(ValueError, match="almost_full"):
        EndpointConfig(almost_full=0)
    with pytest.raises(ValueError, match="do not fit"):
        EndpointConfig(segment_size=4096, tx_buffers=1, rx_buffers=1)


async def test_descriptors_the_ni_produces_fit_the_byte_layout() -> None:
    from stacklib.wire.descriptor import build_recv, build_send, parse_recv, parse_send

    p = make_pair(EndpointConfig(rx_buffer_size=512, tx_buffer_size=512))
    sent = [await p.ep_a.send(p.ch_a, bytes(size)) for size in (0, 10, 64, 65, 512, 513, 1500)]
    for descriptor in sent:
        again = parse_send(build_send(descriptor))
        assert (again.channel, again.fragments, again.inline, again.status) == (
            descriptor.channel,
            descriptor.fragments,
            descriptor.inline,
            descriptor.status,
        )
    while (received := p.ep_b.poll_descriptor()) is not None:
        assert parse_recv(build_recv(received)) == received
        p.ep_b.release(received)
