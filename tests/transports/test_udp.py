"""The UDP transport: header format, one process, two processes, bad datagrams."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Iterator

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from stacklib.bench.peers.udp import udp_echo_main
from stacklib.sim import RealWorld
from stacklib.transports import TRANSPORTS
from stacklib.transports.udp import (
    HEADER,
    HEADER_SIZE,
    MAX_MESSAGE,
    UdpAddress,
    UdpFormatError,
    UdpHeader,
    UdpNetwork,
    build,
    parse,
)
from stacklib.unet import Endpoint, connect

SIZES = [0, 1, 40, 64, 65, 1000, 1472, 4096, 20000, 65000]

ports = st.integers(min_value=0, max_value=0xFFFF)


@given(dst=ports, src=ports, flags=st.integers(0, 255), payload=st.binary(max_size=64))
def test_fast_codec_agrees_with_construct(dst: int, src: int, flags: int, payload: bytes) -> None:
    header = UdpHeader(dst, src, len(payload), flags)
    wire = build(header, payload)
    spec = HEADER.build({"flags": flags, "dst_port": dst, "src_port": src, "length": len(payload)})
    assert wire[:HEADER_SIZE] == spec
    parsed = HEADER.parse(wire)
    got, data = parse(wire)
    assert (got.dst_port, got.src_port, got.length, got.flags) == (
        parsed.dst_port,
        parsed.src_port,
        parsed.length,
        parsed.flags,
    )
    assert bytes(data) == payload


def test_golden_bytes_and_malformed() -> None:
    assert build(UdpHeader(7, 1, 3), b"abc") == bytes.fromhex("0100 0007 0001 0003") + b"abc"
    for bad in (b"", b"\x01\x00\x00", build(UdpHeader(1, 1, 5), b"abc"), b"\x02" + bytes(7)):
        with pytest.raises(UdpFormatError):
            parse(bad)


@given(st.binary(max_size=32))
def test_parse_never_crashes(data: bytes) -> None:
    try:
        header, payload = parse(data)
    except UdpFormatError:
        return
    assert header.length == len(payload)


@pytest.fixture
def network() -> Iterator[UdpNetwork]:
    with UdpNetwork() as net:
        yield net


def _pair(network: UdpNetwork) -> tuple[Endpoint, Endpoint, int, int]:
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
    ep_b = b.os.create_endpoint(b.os.process("y"), port=2)
    ch_a, ch_b = connect(ep_a, ep_b)
    return ep_a, ep_b, ch_a, ch_b


async def test_all_sizes_in_one_process(network: UdpNetwork) -> None:
    ep_a, ep_b, ch_a, ch_b = _pair(network)
    assert isinstance(ep_b.address, UdpAddress) and ep_b.address.port == 2
    with trio.fail_after(5):
        for size in SIZES:
            payload = bytes(i & 0xFF for i in range(size))
            await ep_a.send(ch_a, payload)
            message = await ep_b.recv()
            assert (message.channel, message.data) == (ch_b, payload)
            await ep_b.send(ch_b, message.data)
            assert (await ep_a.recv()).data == payload
    assert network.dropped() == {}
    assert MAX_MESSAGE == 65499


async def test_blocking_receive_wakes(network: UdpNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(network)

    async def late() -> None:
        await trio.sleep(0.02)
        await ep_a.send(ch_a, b"hello")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(late)
            assert (await ep_b.recv()).data == b"hello"


async def test_bad_datagrams_are_dropped_and_counted(network: UdpNetwork) -> None:
    ep_a, ep_b, _, _ = _pair(network)
    target = ep_b.address
    assert isinstance(target, UdpAddress)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rogue:
        rogue.sendto(b"\x01\x00", (target.host, target.udp_port))  # too short
        rogue.sendto(build(UdpHeader(2, 1, 9), b"abc"), (target.host, target.udp_port))
        # A well-formed message from an address with no channel: unknown tag.
        rogue.sendto(build(UdpHeader(2, 1, 3), b"abc"), (target.host, target.udp_port))
    with trio.fail_after(5):
        while sum(network.dropped().values()) < 3:
            assert ep_b.poll() is None
            await trio.sleep(0.001)
    assert network.dropped() == {"malformed": 2, "unknown-tag": 1}
    assert ep_a.poll() is None and ep_b.statistics().received == 0


def test_registered_transport_builds_nodes() -> None:
    kind = TRANSPORTS["udp"]
    network = kind.build(RealWorld(), kind.Params(), ["p", "q"], None)
    try:
        assert sorted(network.nodes) == ["p", "q"] and kind.clock == "real"
    finally:
        network.close()  # type: ignore[attr-defined]


async def test_two_processes(network: UdpNetwork) -> None:
    node = network.add_node("main")
    endpoint = node.os.create_endpoint(node.os.process("main"), port=1)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    peer = context.Process(target=udp_echo_main, args=(queue, 5), daemon=True)
    peer.start()
    try:
        with trio.fail_after(20):
            remote = await trio.to_thread.run_sync(queue.get, True, 20)
            queue.put(endpoint.address)
            channel = node.os.create_channel(endpoint.owner, endpoint, remote)
            for size in SIZES:
                payload = bytes(i & 0xFF for i in range(size))
                await endpoint.send(channel, payload)
                # UDP can lose a datagram; on loopback it does not unless buffers overflow.
                assert (await endpoint.recv()).data == payload
    finally:
        peer.kill()
        peer.join(5)
