"""The IP layers: ping, MTU, reassembly of a peer's fragments, drops counted by reason, fuzzing
of the receive path, the Ethernet mode with ARP, over the memory transport (real time) and a
simulated U-Net ATM / Fast Ethernet pair (virtual time)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.errors import AssemblyError, LocalProtocolError
from stacklib.layers.ip import (
    FrameService,
    IpEtherLayer,
    IpEtherParams,
    IpLayer,
    IpParams,
    IpService,
    UNetIpStack,
    wire,
)
from stacklib.layers.ip.machine import FragmentationNeeded
from stacklib.layers.ip.wire import IcmpMessage, IcmpType, Ipv4Packet
from stacklib.services import StreamService, UNetService
from stacklib.sim import Simulation
from stacklib.stack import LAYERS, layer_class
from stacklib.transports.memory import MemoryNetwork
from stacklib.transports.sim import AtmParams, FastEthernetParams, build_atm, build_fe
from stacklib.unet import Endpoint, EndpointConfig, connect

A, B = "10.0.0.1", "10.0.0.2"
CONFIG = EndpointConfig(segment_size=512 * 1024, tx_buffers=32, rx_buffers=48, free_queue=64)


@attrs.frozen
class Pair:
    ep_a: Endpoint
    ep_b: Endpoint
    ch_a: int  # at a, the channel to b
    ch_b: int  # at b, the channel to a


def make_pair(network: object | None = None, *, kind: str = "memory") -> Pair:
    """Two connected endpoints: over the memory transport, or a simulated ATM / FE pair."""
    if kind == "memory":
        net = network if isinstance(network, MemoryNetwork) else MemoryNetwork()
        a, b = net.add_node("a"), net.add_node("b")
    else:
        assert isinstance(network, Simulation)
        cluster = (
            build_atm(network, AtmParams(host="ss20"), ["a", "b"], None)
            if kind == "atm"
            else build_fe(network, FastEthernetParams(host="p120"), ["a", "b"], None)
        )
        a, b = cluster.nodes["a"], cluster.nodes["b"]
    ep_a = a.os.create_endpoint(a.os.process("ip-a"), CONFIG)
    ep_b = b.os.create_endpoint(b.os.process("ip-b"), CONFIG)
    ch_a, ch_b = connect(ep_a, ep_b)
    return Pair(ep_a, ep_b, ch_a, ch_b)


def ip_layers(pair: Pair, **kw: object) -> tuple[IpLayer, IpLayer]:
    return (
        IpLayer(IpParams(address=A, peers={B: pair.ch_a}, **kw)),  # type: ignore[arg-type]
        IpLayer(IpParams(address=B, peers={A: pair.ch_b}, **kw)),  # type: ignore[arg-type]
    )


@asynccontextmanager
async def ip_pair(pair: Pair, **kw: object) -> AsyncIterator[tuple[UNetIpStack, UNetIpStack]]:
    la, lb = ip_layers(pair, **kw)
    async with la.open(UNetService(pair.ep_a)) as a, lb.open(UNetService(pair.ep_b)) as b:
        yield a, b


def run_virtual(sim: Simulation, main: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        with trio.fail_after(120):  # a hang becomes a failure after 120 virtual seconds
            await main()

    sim.run(guarded)


async def ping(ip: IpService, dst: str, seq: int, data: bytes = b"ping") -> IcmpMessage:
    icmp = ip.open_protocol(wire.IpProtocol.ICMP)
    try:
        await ip.send(
            dst, wire.IpProtocol.ICMP, wire.build_icmp(IcmpMessage.echo_request(9, seq, data))
        )
        with trio.fail_after(5):
            src, _, payload = await icmp.recv()
        assert src == dst
        return wire.parse_icmp(payload)
    finally:
        icmp.close()


# --- over U-Net, real time -----------------------------------------------------------------


async def test_ping_both_ways_and_protocol_delivery() -> None:
    pair = make_pair()
    async with ip_pair(pair) as (a, b):
        reply = await ping(a, B, 1, b"hello")
        assert (reply.type, reply.sequence, reply.data) == (IcmpType.ECHO_REPLY, 1, b"hello")
        reply = await ping(b, A, 2)
        assert reply.type == IcmpType.ECHO_REPLY
        assert b.statistics()["echo_replies"] == 1
        tcp_b = b.open_protocol(6)
        with pytest.raises(LocalProtocolError, match="already open"):
            b.open_protocol(6)
        await a.send(B, 6, b"segment", ttl=3)
        assert await tcp_b.recv() == (A, B, b"segment")
        await a.send(A, 6, b"loopback")  # to ourselves: not via the channel
        assert a.statistics()["dropped"] == {"no_protocol": 1}


async def test_send_fragments_beyond_the_mtu_and_honours_df() -> None:
    pair = make_pair()
    async with ip_pair(pair) as (a, b):
        assert a.mtu(B) == 9180  # paper 000 §7.5, below the memory transport's 65535
        proto = b.open_protocol(200)
        await a.send(B, 200, bytes(9160))
        assert len((await proto.recv())[2]) == 9160
        assert a.statistics()["fragmented"] == 0
        big = bytes(range(251)) * 261  # 65,511 bytes: 8 fragments at 9180
        await a.send(B, 200, big)
        assert await proto.recv() == (A, B, big)
        assert a.statistics()["fragmented"] == 1 and a.statistics()["fragments_sent"] == 8
        assert b.statistics()["reassembled"] == 1
        with pytest.raises(FragmentationNeeded, match="MTU of 9180") as refused:
            await a.send(B, 200, bytes(9161), dont_fragment=True)
        assert refused.value.size == 9181 and refused.value.mtu == 9180
        await a.send(B, 200, bytes(9160), dont_fragment=True)  # fits: sent whole
        assert len((await proto.recv())[2]) == 9160
        with pytest.raises(LocalProtocolError, match="65535"):
            await a.send(B, 200, bytes(65516))
        await a.send(A, 200, big)  # loopback fragments and reassembles too
        assert a.statistics()["fragmented"] == 2
        with pytest.raises(LocalProtocolError, match=r"no channel to 10\.0\.0\.9"):
            await a.send("10.0.0.9", 200, b"")
        with pytest.raises(ValueError):
            a.mtu("not an address")


async def test_fragments_from_a_peer_are_reassembled() -> None:
    # The peer is raw U-Net: it sends a fragmented datagram, out of order, one fragment twice.
    pair = make_pair()
    async with IpLayer(IpParams(address=A, peers={B: pair.ch_a})).open(UNetService(pair.ep_a)) as a:
        proto = a.open_protocol(17)
        data = bytes(range(256)) * 20
        pieces = [
            wire.build_ipv4(
                Ipv4Packet(B, A, 17, data[o : o + 1480], identification=99,
                           more_fragments=o + 1480 < len(data), fragment_offset=o)
            )
            for o in range(0, len(data), 1480)
        ]  # fmt: skip
        raw = UNetService(pair.ep_b)
        for piece in [pieces[3], pieces[0], pieces[2], pieces[0], pieces[1]]:
            await raw.send(pair.ch_b, piece)
        assert await proto.recv() == (B, A, data)
        stats = a.statistics()
        assert stats["reassembled"] == 1
        assert stats["reassembly"].duplicates == 1  # type: ignore[attr-defined]


async def test_bad_input_is_dropped_and_counted_by_reason() -> None:
    pair = make_pair()
    async with IpLayer(IpParams(address=A, peers={B: pair.ch_a})).open(UNetService(pair.ep_a)) as a:
        proto = a.open_protocol(17)
        good = wire.build_ipv4(Ipv4Packet(B, A, 17, b"good"))
        bad_sum = bytearray(good)
        bad_sum[11] ^= 0xFF
        raw = UNetService(pair.ep_b)
        for datagram in [
            b"\x45",
            b"\x65" + good[1:],
            b"\x43" + good[1:],
            good[:2] + b"\xff\xff" + good[4:],
            bytes(bad_sum),
            wire.build_ipv4(Ipv4Packet(B, "10.9.9.9", 17, b"elsewhere")),
            wire.build_ipv4(Ipv4Packet(B, A, 99, b"nobody")),
            good,
        ]:
            await raw.send(pair.ch_b, datagram)
        assert await proto.recv() == (B, A, b"good")
        assert a.statistics()["dropped"] == {
            "short": 1,
            "version": 1,
            "header_length": 1,
            "total_length": 1,
            "checksum": 1,
            "not_for_us": 1,
            "no_protocol": 1,
        }


async def test_peers_are_learned_and_can_be_added() -> None:
    pair = make_pair()
    la = IpLayer(IpParams(address=A))  # knows nobody
    lb = IpLayer(IpParams(address=B, peers={A: pair.ch_b}))
    async with la.open(UNetService(pair.ep_a)) as a, lb.open(UNetService(pair.ep_b)) as b:
        with pytest.raises(LocalProtocolError):
            a.mtu(B)
        reply = await ping(b, A, 1)  # a learns B's channel from the request, and answers
        assert reply.type == IcmpType.ECHO_REPLY
        assert a.routes == {B: pair.ch_a}
        a.add_peer("10.0.0.3", pair.ch_a)
        with pytest.raises(LocalProtocolError):
            a.add_peer("10.0.0.4", 999)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=64), wire.ipv4_packets(max_payload=32).map(
    lambda p: wire.build_ipv4(attrs.evolve(p, dst=A)))), max_size=20))  # fmt: skip
def test_receive_path_never_raises_and_counts_everything(inputs: list[bytes]) -> None:
    pair = make_pair()

    async def main() -> None:
        stack = UNetIpStack(UNetService(pair.ep_a), IpParams(address=A))
        stack.open_protocol(17)
        for data in inputs:
            stack._input(data, pair.ch_a)
        stats = stack.statistics()
        dropped = sum(stats["dropped"].values())  # type: ignore[attr-defined]
        reasm = stats["reassembly"]
        fragments = reasm.fragments - reasm.reassembled  # type: ignore[attr-defined]
        # Every input was dropped, delivered, answered, or absorbed into a reassembly.
        assert (
            stats["received"]
            == len(inputs)
            == (
                dropped + stats["delivered"] + stats["echo_requests"] + fragments  # type: ignore[operator]
            )
        )

    trio.run(main)


# --- virtual time: simulated U-Net ATM and Fast Ethernet ---------------------------------------


def test_reassembly_timeout_in_virtual_time() -> None:
    sim = Simulation(seed=1)
    pair = make_pair(sim, kind="atm")
    seen: dict[str, object] = {}

    async def main() -> None:
        params = IpParams(address=A, peers={B: pair.ch_a}, reassembly_timeout=2.0)
        async with IpLayer(params).open(UNetService(pair.ep_a)) as a:
            first = Ipv4Packet(B, A, 17, bytes(64), identification=5, more_fragments=True)
            await UNetService(pair.ep_b).send(pair.ch_b, wire.build_ipv4(first))
            await trio.sleep(1.0)
            seen["at 1s"] = a.statistics()["reassembly"].timeouts  # type: ignore[attr-defined]
            await trio.sleep(1.01)
            seen["at 2s"] = a.statistics()["reassembly"].timeouts  # type: ignore[attr-defined]

    run_virtual(sim, main)
    assert seen == {"at 1s": 0, "at 2s": 1}


def test_mtu_is_9180_over_atm_and_the_frame_size_over_fast_ethernet() -> None:
    for kind, mtu in (("atm", 9180), ("fe", 1497)):
        sim = Simulation(seed=1)
        pair = make_pair(sim, kind=kind)
        got: list[int] = []

        async def main(pair: Pair = pair, got: list[int] = got) -> None:
            async with ip_pair(pair) as (a, b):
                got.append(a.mtu(B))
                proto = b.open_protocol(17)
                await a.send(B, 17, bytes(a.mtu(B) - 20))
                got.append(len((await proto.recv())[2]) + 20)
                reply = await ping(b, A, 1)
                got.append(reply.type)

        run_virtual(sim, main)
        assert got == [mtu, mtu, IcmpType.ECHO_REPLY]


# --- Ethernet mode -----------------------------------------------------------------------------


class WireFrames(FrameService):
    """One end of an in-test Ethernet segment: every frame goes to every other end."""

    def __init__(self, mac: bytes, segment: list[WireFrames]) -> None:
        self._mac = mac
        self.segment = segment
        segment.append(self)
        self.sent: list[bytes] = []
        self._send, self._recv = trio.open_memory_channel[bytes](100)

    @property
    def mac(self) -> bytes:
        return self._mac

    @property
    def mtu(self) -> int:
        return 1500

    async def send(self, frame: bytes | bytearray | memoryview) -> None:
        self.sent.append(bytes(frame))
        for other in self.segment:
            if other is not self:
                other._send.send_nowait(bytes(frame))

    async def recv(self) -> bytes:
        return await self._recv.receive()


MAC_A = bytes.fromhex("020000000001")
MAC_B = bytes.fromhex("020000000002")
MAC_HOST = bytes.fromhex("02000000000f")


async def test_ethernet_mode_resolves_with_arp_and_answers_a_real_hosts_ping() -> None:
    segment: list[WireFrames] = []
    fa, fb, host = (
        WireFrames(MAC_A, segment),
        WireFrames(MAC_B, segment),
        WireFrames(MAC_HOST, segment),
    )
    async with (
        IpEtherLayer(IpEtherParams(address=A)).open(fa) as a,
        IpEtherLayer(IpEtherParams(address=B)).open(fb) as b,
    ):
        assert a.mtu(B) == 1500
        proto = b.open_protocol(17)
        await a.send(B, 17, b"over ethernet")
        with trio.fail_after(5):
            assert await proto.recv() == (A, B, b"over ethernet")
        assert a.statistics()["arp"].requests_sent == 1  # type: ignore[attr-defined]
        # A "real host" (frames built by hand, as Linux would send them) ARPs for b and pings.
        request = wire.ArpPacket(1, MAC_HOST, "10.0.0.15", bytes(6), B)
        eth = wire.EthernetFrame(wire.BROADCAST_MAC, MAC_HOST, wire.ETHERTYPE_ARP,
                                 wire.build_arp(request))  # fmt: skip
        await host.send(wire.build_ethernet(eth))
        with trio.fail_after(5):
            frame = wire.parse_ethernet(await host.recv())
            while frame.src != MAC_B:  # a's traffic may be on the segment too
                frame = wire.parse_ethernet(await host.recv())
        reply = wire.parse_arp(frame.payload)
        assert (reply.operation, reply.sender_mac, reply.sender_ip) == (2, MAC_B, B)
        echo = wire.build_icmp(IcmpMessage.echo_request(0x1234, 1, b"abcdefgh"))
        packet = wire.build_ipv4(Ipv4Packet("10.0.0.15", B, 1, echo))
        await host.send(wire.build_ethernet(wire.EthernetFrame(MAC_B, MAC_HOST, 0x0800, packet)))
        with trio.fail_after(5):
            while True:
                frame = wire.parse_ethernet(await host.recv())
                if frame.src == MAC_B and frame.ethertype == 0x0800:
                    break
        assert frame.dst == MAC_HOST
        answer = wire.parse_icmp(wire.parse_ipv4(frame.payload).payload)
        assert (answer.type, answer.identifier, answer.data) == (0, 0x1234, b"abcdefgh")
        # Junk on the wire is counted, not fatal.
        await host.send(b"\x01" * 10)
        await host.send(wire.build_ethernet(wire.EthernetFrame(MAC_B, MAC_HOST, 0x86DD, b"")))
        await host.send(wire.build_ethernet(wire.EthernetFrame(MAC_B, MAC_HOST, 0x0806, b"x")))
        await host.send(wire.build_ethernet(wire.EthernetFrame(MAC_HOST, MAC_A, 0x0800, b"")))
        await trio.testing.wait_all_tasks_blocked()
        dropped = b.statistics()["dropped"]
        assert dropped == {
            "ethernet_malformed": 1,
            "unknown_ethertype": 1,
            "arp_unsupported": 1,  # "x" padded to 46 bytes: hardware type 0x7800
            "not_our_mac": 1,  # the frame for the host
        }


# --- assembly and registration -----------------------------------------------------------------


class Streams(StreamService):
    async def connect(self, peer: int) -> trio.abc.HalfCloseableStream:
        raise NotImplementedError

    async def accept(self) -> tuple[int, trio.abc.HalfCloseableStream]:
        raise NotImplementedError


async def test_assembly_and_registration() -> None:
    assert layer_class("ip") is IpLayer and layer_class("ip-ether") is IpEtherLayer
    assert LAYERS["ip"].provides is IpService
    with pytest.raises(AssemblyError):
        async with IpLayer().open(Streams()):
            pass
    with pytest.raises(AssemblyError, match="channel 7"):
        async with IpLayer(IpParams(peers={B: 7})).open(UNetService(make_pair().ep_a)):
            pass
    with pytest.raises(AssemblyError):
        async with IpEtherLayer().open(UNetService(make_pair().ep_a)):
            pass
    bads: list[dict[str, Any]] = [
        {"address": "10.0.0"}, {"mtu": 20}, {"peers": {"x": 1}}, {"ttl": 0}
    ]  # fmt: skip
    for bad in bads:
        with pytest.raises(ValueError):
            IpParams(**bad)
