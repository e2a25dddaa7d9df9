"""The memory transport in real and virtual time."""

from __future__ import annotations

import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stacklib.errors import UNetError
from stacklib.sim import Simulation
from stacklib.transports.memory import MemoryAddress, MemoryEndpoint, MemoryNetwork
from stacklib.unet import EndpointConfig, connect
from stacklib.unet.endpoint import DropReason, Endpoint
from stacklib.wire.descriptor import DescriptorStatus, Fragment, RecvKind, SendError


def test_latency_in_virtual_time_and_data_captured_at_injection() -> None:
    sim = Simulation(seed=3)
    arrivals: list[tuple[float, bytes]] = []

    async def main() -> None:
        network = MemoryNetwork(sim, latency=25e-6)
        a, b = network.add_node("a"), network.add_node("b")
        config = EndpointConfig(tx_buffers=1, tx_buffer_size=256)
        ep_a = a.os.create_endpoint(a.os.process("x"), config)
        ep_b = b.os.create_endpoint(b.os.process("y"))
        ch_a, _ = connect(ep_a, ep_b)
        await ep_a.send(ch_a, b"1" * 100)
        await ep_a.send(ch_a, b"2" * 100)  # reuses the only send buffer at once
        for _ in range(2):
            message = await ep_b.recv()
            arrivals.append((trio.current_time(), message.data))

    sim.run(main)
    assert arrivals == [(25e-6, b"1" * 100), (25e-6, b"2" * 100)]


def test_latency_is_ignored_in_real_time() -> None:
    async def main() -> None:
        network = MemoryNetwork(latency=1.0)
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"))
        ep_b = b.os.create_endpoint(b.os.process("y"))
        ch_a, _ = connect(ep_a, ep_b)
        await ep_a.send(ch_a, b"now")
        assert ep_b.poll() is not None

    trio.run(main)


def test_addresses_and_statistics() -> None:
    network = MemoryNetwork()
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=7)
    assert ep_a.address == MemoryAddress("a", 7) and str(ep_a.address) == "a:7"
    ep_b = b.os.create_endpoint(b.os.process("y"))
    connect(ep_a, ep_b)
    network.inject("b", "nonsense", b"")
    assert network.dropped() == {"unknown-tag": 1}
    stats = b.ni.statistics()
    assert stats.endpoints == 1 and stats.channels == 1 and stats.dropped == {"unknown-tag": 1}


# --- the one-copy send path -----------------------------------------------------------------


def _pair(
    config: EndpointConfig | None = None, *, queued: bool = False
) -> tuple[MemoryNetwork, Endpoint, Endpoint, int, int]:
    """Two connected endpoints; ``queued`` forces every send through the send queue (an NI with
    a buffer trace takes no shortcut), the reference the one-copy path must agree with."""
    network = MemoryNetwork()
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), config)
    ep_b = b.os.create_endpoint(b.os.process("y"), config)
    if queued:
        for ni in (a.ni, b.ni):
            ni.buffer_trace = lambda endpoint, direction, buffers: None
    ch_a, ch_b = connect(ep_a, ep_b)
    return network, ep_a, ep_b, ch_a, ch_b


def test_a_send_is_one_copy_into_the_receivers_buffer() -> None:
    _, ep_a, ep_b, ch_a, ch_b = _pair()
    assert isinstance(ep_a, MemoryEndpoint)
    payload = bytes(range(256)) * 8
    descriptor = ep_a.send_nowait(ch_a, bytearray(payload))
    # Injected at once, without the send queue or a send buffer.
    assert descriptor.status is DescriptorStatus.INJECTED and descriptor.inline == payload
    assert ep_a.send_queue.pushed == 0
    received = ep_b.poll_descriptor()
    assert received is not None and received.kind is RecvKind.BUFFERS
    assert ep_b.read(received) == payload
    ep_b.release(received)
    assert ep_a.statistics().sent_bytes == ep_b.statistics().received_bytes == len(payload)
    assert ep_a.ni.statistics().sent == ep_b.ni.statistics().received == 1
    # Small messages travel inline, as on the queued path; the reply comes back the same way.
    ep_b.send_nowait(ch_b, b"ack")
    message = ep_a.poll()
    assert message is not None and message.data == b"ack" and message.channel == ch_a


def test_the_queued_path_is_kept_where_it_is_needed() -> None:
    config = EndpointConfig(direct_access=True)
    _, ep_a, ep_b, ch_a, _ = _pair(config)
    ni = ep_a.ni
    ni.pause_transmit()
    first = ep_a.send_nowait(ch_a, b"1" * 100)
    second = ep_a.send_nowait(ch_a, b"2" * 100)  # behind a queued one: queued too
    assert first.status is DescriptorStatus.POSTED and second.status is DescriptorStatus.POSTED
    assert ep_b.poll() is None
    ni.resume_transmit()
    assert [m.data[:1] for m in (ep_b.poll(), ep_b.poll()) if m is not None] == [b"1", b"2"]
    # Direct access (paper 000 §3.6) goes through the NI's checks.
    start = ep_b.direct_window[0]
    ep_a.send_nowait(ch_a, b"d" * 100, dest_offset=start)
    deposit = ep_b.poll()
    assert deposit is not None and deposit.dest_offset == start and deposit.data == b"d" * 100
    # An unknown channel is the NI's error, counted, exactly as before.
    bad = ep_a.send_nowait(99, b"x" * 100)
    assert bad.status is DescriptorStatus.ERROR and bad.error is SendError.UNKNOWN_CHANNEL
    assert ep_a.statistics().send_errors == {"UNKNOWN_CHANNEL": 1}
    with pytest.raises(UNetError, match="maximum"):
        ep_a.send_nowait(ch_a, bytes(ep_a.ni.max_message + 1))
    _, ep_c, _, ch_c, _ = _pair(EndpointConfig(tx_buffers=2, tx_buffer_size=512))
    with pytest.raises(UNetError, match="send buffers"):
        ep_c.send_nowait(ch_c, bytes(1025))


def _exercise(queued: bool, sizes: list[int], polls: list[bool]) -> tuple[object, ...]:
    config = EndpointConfig(recv_queue=4, free_queue=6, rx_buffers=6, rx_buffer_size=512)
    network, ep_a, ep_b, ch_a, _ = _pair(config, queued=queued)
    log: list[object] = []
    for size, poll in zip(sizes, polls, strict=True):
        data = bytes([size % 251]) * size
        try:
            log.append(ep_a.send_nowait(ch_a, data).status)
        except (UNetError, trio.WouldBlock) as error:
            log.append(type(error).__name__)
        if poll:
            message = ep_b.poll()
            log.append(None if message is None else (message.channel, message.data))
    while (message := ep_b.poll()) is not None:
        log.append((message.channel, message.data))
    a, b = ep_a.statistics(), ep_b.statistics()
    counters = (a.sent, a.sent_bytes, a.send_errors, b.received, b.received_bytes, b.dropped)
    return tuple(log), counters, network.dropped(), ep_b.free_queue.space


_SIZES = st.integers(0, 600) | st.integers(0, 9000)  # mostly one buffer (512 bytes) or less


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_SIZES, st.booleans()), max_size=30))
@example([(100, False)] * 6)  # a receive queue (4) that overflows
@example([(500, False), (40, False)] * 4)  # the free queue (6 buffers) runs dry
def test_the_one_copy_path_agrees_with_the_queued_path(ops: list[tuple[int, bool]]) -> None:
    sizes = [size for size, _ in ops]
    polls = [poll for _, poll in ops]
    # Messages inline, in one or several receive buffers, from one or several send buffers;
    # receive-queue and free-queue overflows: the same messages, statuses, counters and drops
    # either way.
    assert _exercise(False, sizes, polls) == _exercise(True, sizes, polls)


def test_a_bad_free_buffer_is_dropped_and_counted_on_the_one_copy_path() -> None:
    config = EndpointConfig(rx_buffers=0, free_queue=4)
    _, ep_a, ep_b, ch_a, _ = _pair(config)
    ep_b.post_free(Fragment(ep_b.segment.size - 8, 4096))  # runs off the segment's end
    ep_b.post_free(Fragment(ep_b.app_area, 4096))
    ep_a.send_nowait(ch_a, b"z" * 1000)
    held = ep_b.poll_descriptor()  # kept: its buffer does not go back to the free queue
    assert held is not None and ep_b.read(held) == b"z" * 1000
    assert ep_b.statistics().dropped == {DropReason.BAD_FREE_BUFFER: 1}
    ep_a.send_nowait(ch_a, b"y" * 1000)  # the free queue is empty: dropped, counted
    assert ep_b.poll() is None
    assert ep_b.statistics().dropped == {
        DropReason.BAD_FREE_BUFFER: 1,
        DropReason.NO_FREE_BUFFER: 1,
    }
