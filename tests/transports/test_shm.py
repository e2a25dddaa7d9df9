"""The shared-memory transport: one process, two processes, back-pressure, protection, death."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.bench.peers.shm import PeerSpec, spawn_peer
from stacklib.transports import TRANSPORTS
from stacklib.transports.shm import (
    KIND_MESSAGE,
    PeerGone,
    ShmAddress,
    ShmEndpoint,
    ShmNetwork,
)
from stacklib.unet import (
    DescriptorStatus,
    Endpoint,
    EndpointConfig,
    SendDescriptor,
    SendError,
    UpcallCondition,
    connect,
)

SIZES = [0, 1, 40, 63, 64, 65, 1000, 4095, 4096, 4097, 20000, 65535]


def _payload(size: int) -> bytes:
    return bytes((i * 7 + size) & 0xFF for i in range(size))


@pytest.fixture
def network() -> Iterator[ShmNetwork]:
    with ShmNetwork() as net:
        yield net


def _pair(network: ShmNetwork) -> tuple[Endpoint, Endpoint, int, int]:
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
    ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
    ch_a, ch_b = connect(ep_a, ep_b)
    return ep_a, ep_b, ch_a, ch_b


async def test_all_sizes_in_one_process(network: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, ch_b = _pair(network)
    assert isinstance(ep_a, ShmEndpoint) and ep_a.address == ShmAddress("a", 1)
    with trio.fail_after(5):
        for size in SIZES:
            await ep_a.send(ch_a, _payload(size))
            message = await ep_b.recv()
            assert (message.channel, message.data) == (ch_b, _payload(size))
            await ep_b.send(ch_b, message.data)
            assert (await ep_a.recv()).data == _payload(size)
    assert ep_b.statistics().received == len(SIZES)
    assert network.dropped() == {}


async def test_generic_path_with_upcalls(network: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(network)
    seen: list[bytes] = []

    def handler(endpoint: Endpoint) -> None:
        while (message := endpoint.recv_queue.pop()) is not None:
            seen.append(endpoint.read(message))
            endpoint.release(message)

    ep_b.set_upcall(UpcallCondition.NON_EMPTY, handler)
    node_b = network.nodes["b"].ni
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node_b.serve)  # type: ignore[attr-defined]
            for size in (10, 3000):
                await ep_a.send(ch_a, _payload(size))
            while len(seen) < 2:
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    assert seen == [_payload(10), _payload(3000)]
    assert ep_b.statistics().upcalls >= 1


async def test_full_ring_is_back_pressure_not_loss() -> None:
    with ShmNetwork(ring_bytes=4096, max_message=1024) as network:
        ep_a, ep_b, ch_a, _ = _pair(network)
        sent = 0
        while True:  # fill the ring, then the send queue behind it
            try:
                ep_a.send_nowait(ch_a, sent.to_bytes(4, "little") * 50)
            except trio.WouldBlock:
                break
            sent += 1
        assert ep_a.send_queue  # the ring is full and descriptors wait behind it
        received = []
        ni_a = network.nodes["a"].ni
        for _ in range(10 * sent):
            message = ep_b.poll()
            if message is None:
                # The sender's NI has no processor of its own: it retries the queued
                # descriptors whenever its process calls into it.
                ni_a.progress()  # type: ignore[attr-defined]
                continue
            received.append(int.from_bytes(message.data[:4], "little"))
            if len(received) == sent:
                break
        assert received == list(range(sent))
        assert network.dropped() == {} and ep_a.statistics().sent == sent


async def test_blocked_sender_resumes_when_receiver_drains() -> None:
    with ShmNetwork(ring_bytes=4096, max_message=1024, spin_time=0.0) as network:
        ep_a, ep_b, ch_a, _ = _pair(network)
        total = 300
        got: list[bytes] = []

        async def sender() -> None:
            for i in range(total):
                await ep_a.send(ch_a, i.to_bytes(2, "little") * 100)

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender)
                while len(got) < total:
                    got.append((await ep_b.recv()).data)
        assert [int.from_bytes(m[:2], "little") for m in got] == list(range(total))


async def test_blocking_receive_sleeps_and_wakes() -> None:
    with ShmNetwork(spin_time=0.0, max_sleep=10.0) as network:
        ep_a, ep_b, ch_a, _ = _pair(network)

        async def late_sender() -> None:
            await trio.sleep(0.05)
            await ep_a.send(ch_a, b"wake up")

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(late_sender)
                assert (await ep_b.recv()).data == b"wake up"
        ni_a = network.nodes["a"].ni
        ni_b = network.nodes["b"].ni
        assert ni_b.sleeps >= 1 and ni_a.wakeups_sent >= 1  # type: ignore[attr-defined]


async def test_garbage_in_own_queues_is_rejected_and_counted(network: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(network)
    c = network.nodes["b"]
    ep_c = c.os.create_endpoint(c.os.process("bystander"), port=2)
    ch_ca, _ = connect(ep_c, ep_a)
    # Bad descriptors in a's own send queue: errors, nothing read or sent.
    bad = SendDescriptor(ch_a, fragments=((ep_a.segment.size - 4, 64),))
    ep_a.post_nowait(bad)
    assert bad.status is DescriptorStatus.ERROR and bad.error is SendError.OUT_OF_BOUNDS
    # A process scribbling on the shared ring it produces into: an impossible record length,
    # then an impossible tail.  The consumer drops and counts; nothing is delivered anywhere.
    link = network.nodes["a"].ni.link(ep_a, ch_a)  # type: ignore[attr-defined]
    ring = link.tx
    words = ring._words
    tail = words[ring._base]
    struct.pack_into("<II", ring.data, tail % ring.capacity, 10**9, KIND_MESSAGE)
    words[ring._base] = tail + 16
    assert ep_b.poll() is None
    # The first impossible value broke the ring for good: later garbage is not even read.
    words[ring._base] = words[ring._base] + 10**12
    assert ep_b.poll() is None
    assert ep_c.poll() is None
    assert ep_b.statistics().dropped == {"malformed": 1}
    assert ep_a.statistics().send_errors == {"OUT_OF_BOUNDS": 1}
    assert ep_c.statistics().received == 0 and ch_ca == 0


@settings(max_examples=60, deadline=None)
@given(garbage=st.binary(min_size=64, max_size=64), tail=st.integers(min_value=0, max_value=2**40))
def test_ring_never_trusts_the_producer(garbage: bytes, tail: int) -> None:
    with ShmNetwork(ring_bytes=4096, max_message=1024) as network:
        ep_a, ep_b, ch_a, _ = _pair(network)
        ring = network.nodes["a"].ni.link(ep_a, ch_a).tx  # type: ignore[attr-defined]
        ring.data[: len(garbage)] = garbage
        ring._words[ring._base] = tail
        for _ in range(3):
            message = ep_b.poll()
            if message is not None:
                assert len(message.data) <= 1024
        assert set(ep_b.statistics().dropped) <= {"malformed"}


def test_registered_transport_builds_nodes() -> None:
    kind = TRANSPORTS["shm"]
    network = kind.build(
        __import__("stacklib.sim", fromlist=["RealWorld"]).RealWorld(),
        kind.Params(ring_bytes=8192, max_message=2048),
        ["p", "q"],
        None,
    )
    try:
        assert sorted(network.nodes) == ["p", "q"] and kind.clock == "real"
    finally:
        network.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- two processes


def _local(network: ShmNetwork, config: EndpointConfig | None = None) -> tuple[Endpoint, int]:
    node = network.add_node("a")
    endpoint = node.os.create_endpoint(node.os.process("main"), config, port=1)
    channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress("b", 1))
    return endpoint, channel


@pytest.mark.parametrize("mode", ["poll", "trio"])
async def test_two_processes_carry_all_sizes(network: ShmNetwork, mode: str) -> None:
    endpoint, channel = _local(network)
    peer = spawn_peer(PeerSpec(network.directory, "b", 1, "a", 1, role="echo", mode=mode))
    try:
        with trio.fail_after(20):
            for size in SIZES:
                await endpoint.send(channel, _payload(size))
                assert (await endpoint.recv()).data == _payload(size)
    finally:
        peer.kill()
        peer.join(5)


async def test_two_processes_stream_to_a_sink(network: ShmNetwork) -> None:
    endpoint, channel = _local(network)
    peer = spawn_peer(PeerSpec(network.directory, "b", 1, "a", 1, role="sink"))
    try:
        with trio.fail_after(20):
            for _ in range(500):
                await endpoint.send(channel, b"x" * 40)
            await endpoint.send(channel, b"")
            count = int.from_bytes((await endpoint.recv()).data, "little")
        assert count == 500
    finally:
        peer.kill()
        peer.join(5)


async def test_peer_death_fails_the_channel(network: ShmNetwork) -> None:
    endpoint, channel = _local(network)
    peer = spawn_peer(PeerSpec(network.directory, "b", 1, "a", 1, role="echo"))
    try:
        with trio.fail_after(20):
            await endpoint.send(channel, b"ping")
            assert (await endpoint.recv()).data == b"ping"
        peer.kill()
        peer.join(5)
        with trio.fail_after(5), pytest.raises(PeerGone, match="died"):
            await endpoint.recv()
        with pytest.raises(PeerGone):
            await endpoint.send(channel, b"anyone?")
    finally:
        peer.kill()
        peer.join(5)


@pytest.mark.slow
def test_real_benchmark_runs_with_tiny_counts() -> None:
    from stacklib.bench.real import bench_real

    result = bench_real(iterations=20, messages=50, bulk_messages=5, repeat=1, pure=True)
    # Eight measurements, the two Split-C read rows, the batched rate row, the payload face's
    # ping-pong and the three faces in one process.
    assert len(result.rows) == 15 and all(
        isinstance(row["value"], float) and row["value"] > 0 for row in result.rows
    )
    assert any("Split-C blocking read" in str(row["measurement"]) for row in result.rows)
