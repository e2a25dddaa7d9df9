"""A hostile peer writing garbage into a shm channel's shared memory.

The peer is played by a second mapping of the channel's region file (what another process
sees): whatever it writes into the counters and records, the receiver's calls return nothing
or raise the documented ``PeerGone``, the channel fails with a clear error, and it is counted.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.errors import SegmentError
from stacklib.transports.shm import (
    HEADER_BYTES,
    KIND_MESSAGE,
    KIND_PAD,
    PeerGone,
    Ring,
    ShmAddress,
    ShmNetwork,
)
from stacklib.transports.shm.region import RING_WORD
from stacklib.unet import Endpoint, connect
from stacklib.wire.descriptor import Fragment

RING = 4096


class Hostile:
    """The peer process: its own mapping of the region, writing whatever it likes."""

    def __init__(self, path: str, ring: int) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.ring = ring  # the ring index (= the side that produces into it)

    def word(self, offset: int) -> int:
        value: int = struct.unpack_from("<Q", self.map, (RING_WORD[self.ring] + offset) * 8)[0]
        return value

    def set_word(self, offset: int, value: int) -> None:
        struct.pack_into("<Q", self.map, (RING_WORD[self.ring] + offset) * 8, value)

    @property
    def tail(self) -> int:
        return self.word(0)

    @tail.setter
    def tail(self, value: int) -> None:
        self.set_word(0, value)

    @property
    def head(self) -> int:
        return self.word(8)

    @head.setter
    def head(self, value: int) -> None:
        self.set_word(8, value)

    def record(self, position: int, length: int, kind: int) -> None:
        base = HEADER_BYTES + self.ring * RING
        struct.pack_into("<II", self.map, base + position % RING, length, kind)


@pytest.fixture
def network() -> Iterator[ShmNetwork]:
    with ShmNetwork(ring_bytes=RING, max_message=1024) as net:
        yield net


def _victim(network: ShmNetwork) -> tuple[Endpoint, int, Hostile, Hostile]:
    """Endpoint b:1 (the victim) and its channel to a:1, and the hostile side's view of the
    ring a produces into (b receives) and of the ring b produces into."""
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
    ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
    _, ch_b = connect(ep_a, ep_b)
    link = b.ni.link(ep_b, ch_b)  # type: ignore[attr-defined]
    ep_a.close()  # the honest side steps back: only the hostile mapping writes now
    return ep_b, ch_b, Hostile(link.path, 1 - link.side), Hostile(link.path, link.side)


async def _assert_failed(network: ShmNetwork, endpoint: Endpoint, channel: int, why: str) -> None:
    ni = network.nodes["b"].ni
    assert endpoint.poll() is None
    with trio.fail_after(5), pytest.raises(PeerGone, match=why):
        await endpoint.recv()
    with pytest.raises(PeerGone, match=why):
        endpoint.send_nowait(channel, b"still there?")
    assert ni.corrupt_rings == 1  # type: ignore[attr-defined]


async def test_unaligned_tail_near_the_end_fails_the_channel(network: ShmNetwork) -> None:
    endpoint, channel, rx, _ = _victim(network)
    # An unaligned tail that, adopted as the head, would put the next record header across
    # the end of the ring (struct.error out of poll before).
    rx.tail = RING - 4
    assert endpoint.poll() is None
    rx.tail = RING - 4 + 16
    assert endpoint.poll() is None
    assert endpoint.statistics().dropped == {"malformed": 1}
    await _assert_failed(network, endpoint, channel, "corrupt ring: the producer published tail")


async def test_tail_beyond_the_ring_fails_the_channel(network: ShmNetwork) -> None:
    endpoint, channel, rx, _ = _victim(network)
    rx.record(0, 8, KIND_MESSAGE)
    rx.tail = RING + 16
    await _assert_failed(network, endpoint, channel, f"tail {RING + 16}")
    assert endpoint.statistics().dropped == {"malformed": 1}


@pytest.mark.parametrize(
    ("length", "kind", "why"),
    [
        (10**9, KIND_MESSAGE, "kind 1 and length 1000000000"),
        (1025, KIND_MESSAGE, "length 1025"),  # over max_message
        (RING, KIND_PAD, "pad record of length 4096"),
        (40, 99, "kind 99"),
    ],
)
async def test_lengths_beyond_the_buffer_fail_the_channel(
    network: ShmNetwork, length: int, kind: int, why: str
) -> None:
    endpoint, channel, rx, _ = _victim(network)
    rx.record(0, length, kind)
    rx.tail = 64
    await _assert_failed(network, endpoint, channel, why)


async def test_messages_before_the_garbage_are_delivered(network: ShmNetwork) -> None:
    endpoint, channel, rx, _ = _victim(network)
    base = HEADER_BYTES + rx.ring * RING
    rx.record(0, 5, KIND_MESSAGE)
    rx.map[base + 8 : base + 13] = b"hello"
    rx.record(16, 10**6, KIND_MESSAGE)
    rx.tail = 48
    message = endpoint.poll()
    assert message is not None and message.data == b"hello"
    await _assert_failed(network, endpoint, channel, "length 1000000")


async def test_head_moving_backwards_fails_the_sender(network: ShmNetwork) -> None:
    endpoint, channel, _, tx = _victim(network)
    for _ in range(RING // 48):  # 48-byte records: the ring is full
        endpoint.send_nowait(channel, b"x" * 40)
    tx.head = 96  # the consumer took two records
    endpoint.send_nowait(channel, b"x" * 40)  # the producer reads that head here
    tx.head = 48  # and gives one back
    with pytest.raises(PeerGone, match=r"corrupt ring: the consumer published head 48"):
        for _ in range(10):
            endpoint.send_nowait(channel, b"x" * 40)
    assert network.nodes["b"].ni.corrupt_rings == 1  # type: ignore[attr-defined]


async def test_head_ahead_of_the_tail_fails_the_sender(network: ShmNetwork) -> None:
    endpoint, channel, _, tx = _victim(network)
    tx.head = 1 << 40
    with pytest.raises(PeerGone, match="head 1099511627776"):
        for _ in range(1000):
            endpoint.send_nowait(channel, b"x" * 40)


async def test_garbage_counters_before_the_peer_attaches_fail_its_channel(
    network: ShmNetwork,
) -> None:
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
    a.os.create_channel(ep_a.owner, ep_a, ShmAddress("b", 1))  # a makes the region first
    Hostile(a.ni.link(ep_a, 0).path, 1).tail = 40  # type: ignore[attr-defined]
    ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
    ch_b = b.os.create_channel(ep_b.owner, ep_b, ShmAddress("a", 1))
    with pytest.raises(PeerGone, match="found tail 40 and head 0 when attaching"):
        ep_b.send_nowait(ch_b, b"hello")
    assert b.ni.corrupt_rings == 1  # type: ignore[attr-defined]


def test_garbage_counters_when_attaching_break_the_ring() -> None:
    words = memoryview(bytearray(HEADER_BYTES)).cast("Q")
    words[RING_WORD[0]] = 40  # tail: unaligned
    ring = Ring(words, RING_WORD[0], memoryview(bytearray(RING)), 1024)
    assert ring.error is not None and "when attaching" in ring.error and ring.corrupt == 1
    words[RING_WORD[0]] = words[RING_WORD[0] + 8] = (1 << 64) - 16  # would overflow
    assert Ring(words, RING_WORD[0], memoryview(bytearray(RING)), 1024).error is not None
    assert ring.peek() is None and not ring.pending
    assert ring.try_write(b"x") is None
    with pytest.raises(ValueError, match="multiple of 16"):
        Ring(words, RING_WORD[0], memoryview(bytearray(40)), 16)


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=RING // 8 - 1),  # where a record header goes
            st.integers(min_value=0, max_value=2**32 - 1),  # its length
            st.sampled_from([KIND_MESSAGE, KIND_PAD, 0, 7]),
            st.integers(min_value=0, max_value=2**64 - 1),  # a tail
            st.booleans(),  # a plausible tail (a few records ahead) instead
        ),
        min_size=1,
        max_size=8,
    )
)
def test_no_garbage_escapes_the_receiver(
    steps: list[tuple[int, int, int, int, bool]],
) -> None:
    with ShmNetwork(ring_bytes=RING, max_message=1024) as network:
        endpoint, channel, rx, _ = _victim(network)
        for slot, length, kind, tail, plausible in steps:
            rx.record(slot * 8, length, kind)
            rx.tail = (rx.tail + 16 * (tail % 8)) % (1 << 64) if plausible else tail
            for _ in range(3):
                message = endpoint.poll()
                assert message is None or len(message.data) <= 1024
        ring = network.nodes["b"].ni.link(endpoint, channel).rx  # type: ignore[attr-defined]
        dropped = endpoint.statistics().dropped
        assert dropped == ({"malformed": 1} if ring.error else {})
        if ring.error:
            with pytest.raises(PeerGone, match="corrupt ring"):
                endpoint.send_nowait(channel, b"x")


@pytest.mark.parametrize(
    ("buffer", "why"),
    [
        (Fragment(-8, 64), "outside"),
        (Fragment(0, 0), "length positive"),
        (Fragment(0, -64), "length positive"),
        (Fragment(1 << 40, 64), "outside"),
        (Fragment(3, 64), "aligned"),
        (Fragment(0, 1.5), "integers"),  # type: ignore[arg-type]
        ((0, 64, 1), "Fragment"),
    ],
)
def test_post_free_refuses_bad_offsets_and_lengths(
    network: ShmNetwork, buffer: Fragment, why: str
) -> None:
    node = network.add_node("a")
    endpoint = node.os.create_endpoint(node.os.process("x"), port=1)
    before = len(endpoint.free_queue)
    with pytest.raises(SegmentError, match=why):
        endpoint.post_free(buffer)
    assert len(endpoint.free_queue) == before
    endpoint.free_queue.pop()
    endpoint.post_free(Fragment(endpoint.app_area, 64))  # a good one is still taken
    assert len(endpoint.free_queue) == before
