"""The ether transport on real veth pairs: U-Net/FE frames through AF_PACKET sockets.

Most tests put both ends of one veth pair in this process's namespace, a node on each end (one
process, two "hosts"); the last ones run the realistic set-up, an echo peer process inside a
namespace on the far end.  Every interface and namespace is removed, even on failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio

from stacklib.bench.peers.ether import bench_ether, echo_peer
from stacklib.errors import ChannelError, UNetError
from stacklib.netns import (
    capability_problem,
    links,
    local_veth,
    namespaces,
    netns,
    remove_stale,
    remove_stale_links,
    run_in,
    veth_pair,
)
from stacklib.sim import RealWorld
from stacklib.transports import TRANSPORTS
from stacklib.transports.ether import (
    ETH_P_UNET,
    MAX_MESSAGE,
    EtherAddress,
    EtherNetwork,
    EtherParams,
    in_namespace,
)
from stacklib.unet import Endpoint
from stacklib.wire import unet_eth

PROBLEM = capability_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

PREFIX = "sltether"
SIZES = [0, 1, 39, 40, 41, 43, 64, 65, 100, 1000, 1496, MAX_MESSAGE]


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers_from_killed_runs() -> None:
    if PROBLEM is None:
        remove_stale(PREFIX)
        remove_stale_links("sle")


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    """Both ends of a veth pair in this namespace, up, without addresses."""
    with local_veth("sle") as (a, b):
        yield a, b
    assert a not in links() and b not in links()


@pytest.fixture
def pair(veth: tuple[str, str]) -> Iterator[tuple[EtherNetwork, EtherNetwork]]:
    with EtherNetwork(veth[0]) as net_a, EtherNetwork(veth[1]) as net_b:
        yield net_a, net_b


def endpoints(net_a: EtherNetwork, net_b: EtherNetwork) -> tuple[Endpoint, Endpoint, int, int]:
    a, b = net_a.add_node("a"), net_b.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
    ep_b = b.os.create_endpoint(b.os.process("y"), port=2)
    ch_a = a.os.create_channel(ep_a.owner, ep_a, ep_b.address)
    ch_b = b.os.create_channel(ep_b.owner, ep_b, ep_a.address)
    return ep_a, ep_b, ch_a, ch_b


def raw_sender(interface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind((interface, 0))
    return sock


async def test_every_size_echoes_exactly(pair: tuple[EtherNetwork, EtherNetwork]) -> None:
    ep_a, ep_b, ch_a, ch_b = endpoints(*pair)
    assert isinstance(ep_b.address, EtherAddress) and ep_b.address.port == 2
    with trio.fail_after(10):
        for size in [*SIZES, *range(0, MAX_MESSAGE + 1, 37)]:
            payload = bytes((i * 7 + size) & 0xFF for i in range(size))
            await ep_a.send(ch_a, payload)
            message = await ep_b.recv()
            assert (message.channel, message.data) == (ch_b, payload)
            await ep_b.send(ch_b, message.data)
            assert (await ep_a.recv()).data == payload
    assert pair[0].dropped() == {} and pair[1].dropped() == {}


async def test_frames_on_the_wire_are_unet_fe(
    veth: tuple[str, str], pair: tuple[EtherNetwork, EtherNetwork]
) -> None:
    ep_a, ep_b, ch_a, _ = endpoints(*pair)
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_UNET)) as spy:
        spy.bind((veth[1], ETH_P_UNET))
        spy.settimeout(5)
        await ep_a.send(ch_a, b"hello")
        frame = spy.recv(2048)
    assert len(frame) == unet_eth.MIN_FRAME  # padded to the 60-byte minimum
    parsed = unet_eth.parse(frame)
    assert isinstance(ep_a.address, EtherAddress) and isinstance(ep_b.address, EtherAddress)
    assert parsed == unet_eth.UNetFrame(
        unet_eth.mac(ep_b.address.mac), unet_eth.mac(ep_a.address.mac), 2, b"hello"
    )


async def test_oversized_message_is_a_send_error(pair: tuple[EtherNetwork, EtherNetwork]) -> None:
    ep_a, _, ch_a, _ = endpoints(*pair)
    with pytest.raises(UNetError, match="1498 bytes exceeds"):
        ep_a.send_nowait(ch_a, bytes(MAX_MESSAGE + 1))
    assert ep_a.statistics().sent == 0


async def test_foreign_and_garbage_frames_are_dropped_and_counted(
    veth: tuple[str, str], pair: tuple[EtherNetwork, EtherNetwork]
) -> None:
    ep_a, ep_b, ch_a, ch_b = endpoints(*pair)
    assert isinstance(ep_a.address, EtherAddress) and isinstance(ep_b.address, EtherAddress)
    dst, src = unet_eth.mac(ep_b.address.mac), unet_eth.mac(ep_a.address.mac)
    good = unet_eth.build(unet_eth.UNetFrame(dst, src, 2, b"ok"))
    with raw_sender(veth[0]) as rogue:
        # Another EtherType: the kernel filters it out before the socket (not even counted).
        rogue.send(dst + src + (0x88B6).to_bytes(2, "big") + good[14:])
        # Garbage with U-Net's EtherType: too short, length past the data (twice; a length
        # above 1497 with its data would exceed the veth's 1500-byte MTU).
        rogue.send(dst + src + ETH_P_UNET.to_bytes(2, "big") + b"\x00")
        rogue.send(good[:15] + b"\xff" + good[16:])
        rogue.send(dst + src + ETH_P_UNET.to_bytes(2, "big") + b"\x05\xda\x02" + bytes(1497))
        # Well-formed, but to a port (9) with no channel from this source: unknown tag.
        rogue.send(unet_eth.build(unet_eth.UNetFrame(dst, src, 9, b"lost")))
        # Addressed to another host: ignored, like a NIC's address filter would.
        rogue.send(unet_eth.build(unet_eth.UNetFrame(b"\x02" * 6, src, 2, b"not me")))
    with trio.fail_after(5):
        await ep_a.send(ch_a, b"after")  # the channel still works behind the garbage
        message = await ep_b.recv()
    assert (message.channel, message.data) == (ch_b, b"after")
    assert pair[1].dropped() == {"malformed": 3, "unknown-tag": 1}
    ni_b = pair[1].nodes["b"].ni
    assert ni_b.ignored == 1  # type: ignore[attr-defined]
    assert ni_b.received == 1


def test_channels_are_checked(pair: tuple[EtherNetwork, EtherNetwork]) -> None:
    ep_a, ep_b, _, _ = endpoints(*pair)
    os_a = ep_a.os
    for bad in (
        EtherAddress("not-a-mac", 1),
        EtherAddress("02:00:00:00:00:01", 256),
        object(),
    ):
        with pytest.raises(ChannelError):
            os_a.create_channel(ep_a.owner, ep_a, bad)
    assert isinstance(ep_a.address, EtherAddress)
    with pytest.raises(ChannelError, match="own MAC"):
        os_a.create_channel(ep_a.owner, ep_a, ep_a.address)
    # One channel per remote host per endpoint (paper 001 §3.1): the tag is taken.
    assert isinstance(ep_b.address, EtherAddress)
    with pytest.raises(ChannelError):
        os_a.create_channel(ep_a.owner, ep_a, EtherAddress(ep_b.address.mac, 3))


def test_one_node_per_interface_and_registration(veth: tuple[str, str]) -> None:
    with EtherNetwork(veth[0]) as network:
        network.add_node("a")
        with pytest.raises(ValueError, match="already has node"):
            network.add_node("b")
    with pytest.raises(ValueError, match="no network interface"):
        EtherNetwork("sl-no-such-if")
    kind = TRANSPORTS["ether"]
    assert kind.Params is EtherParams and kind.clock == "real"
    built = kind.build(RealWorld(), EtherParams(interface=veth[1]), ["only"], None)
    try:
        assert list(built.nodes) == ["only"]
    finally:
        built.close()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="one node per process"):
        kind.build(RealWorld(), EtherParams(interface=veth[1]), ["p", "q"], None)
    with pytest.raises(ValueError, match="ip netns exec sl-not-here"):
        kind.build(RealWorld(), EtherParams(veth[1], namespace="sl-not-here"), ["p"], None)


def test_namespace_check() -> None:
    with netns(PREFIX) as ns:
        assert not in_namespace(ns)
        check = f"from stacklib.transports.ether import in_namespace; assert in_namespace({ns!r})"
        run_in(ns, sys.executable, "-c", check)


async def test_blocking_receive_wakes(pair: tuple[EtherNetwork, EtherNetwork]) -> None:
    ep_a, ep_b, ch_a, _ = endpoints(*pair)

    async def late() -> None:
        await trio.sleep(0.02)
        await ep_a.send(ch_a, b"late")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(late)
            assert (await ep_b.recv()).data == b"late"


@pytest.fixture
def far_end() -> Iterator[tuple[str, str, str]]:
    """A namespace with a veth pair: (namespace, local end here, remote end inside)."""
    local = f"sle{os.getpid()}a"
    with netns(PREFIX) as ns:
        veth_pair(None, ns, name_a=local, name_b="eth0")
        try:
            yield ns, local, "eth0"
        finally:
            subprocess.run(["ip", "link", "del", local], check=False, capture_output=True)
    assert ns not in namespaces() and local not in links()


@pytest.mark.parametrize("mode", ["trio", "poll"])
async def test_echo_peer_in_a_namespace(far_end: tuple[str, str, str], mode: str) -> None:
    ns, local, remote = far_end
    with EtherNetwork(local) as network:
        node = network.add_node("client")
        endpoint = node.os.create_endpoint(node.os.process("client"), port=1)
        me = endpoint.address
        assert isinstance(me, EtherAddress)
        with echo_peer(ns, remote, 7, me, mode=mode) as peer:
            channel = node.os.create_channel(endpoint.owner, endpoint, peer.address)
            with trio.fail_after(15):
                for size in SIZES:
                    payload = os.urandom(size)
                    await endpoint.send(channel, payload)
                    assert (await endpoint.recv()).data == payload
            dst, src = unet_eth.mac(peer.address.mac), unet_eth.mac(me.mac)
            with raw_sender(local) as rogue:
                rogue.send(dst + src + ETH_P_UNET.to_bytes(2, "big") + b"\x00")  # malformed
                rogue.send(unet_eth.build(unet_eth.UNetFrame(dst, src, 8, b"x")))  # no channel
            with trio.fail_after(5):
                await endpoint.send(channel, b"last")  # after the garbage, so counted by now
                assert (await endpoint.recv()).data == b"last"
            stats = peer.stop()
        assert peer.process.returncode == 0
    assert stats["dropped"] == {"malformed": 1, "unknown-tag": 1}
    assert stats["received"] == stats["sent"] == len(SIZES) + 1
    assert network.dropped() == {}


def test_benchmark_runs_and_cleans_up() -> None:
    results = bench_ether(iterations=50)
    assert set(results) == {
        "ether, client poll, peer poll",
        "ether, client poll, peer trio",
        "ether, both blocking (trio)",
        "bare AF_PACKET frames",
        "kernel udp",
    }
    assert all(rtt > 0 for rtt in results.values())
    # Only this process's names: other test runs may be making their own meanwhile.
    mine = f"-{os.getpid()}-"
    assert not [ns for ns in namespaces() if ns.startswith("slbench") and mine in ns]
    assert f"slb{os.getpid()}" not in links()
