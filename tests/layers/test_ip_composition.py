"""Layers above UDP and TCP: UDP's datagram face (peers are the nodes' ids below IP) carries
ARQ, UAM and a user's layer; TCP's stream service carries a user's framing layer.  Real time
over the memory transport, virtual time over a lossy simulated ATM network."""

from __future__ import annotations

import struct
import typing
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import pytest
import trio

from stacklib.errors import LocalProtocolError
from stacklib.layers.arq import ArqLayer, ArqParams
from stacklib.layers.ip import IpLayer, IpParams
from stacklib.layers.tcp import TcpLayer
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.layers.udp import UdpLayer, UdpStack
from stacklib.services import DatagramService, ReliableService, Service, StreamService, UNetService
from stacklib.sim import Simulation
from stacklib.stack import Layer, open_stack
from stacklib.transports.sim import AtmParams, FastEthernetParams, build_atm, build_fe
from stacklib.transports.sim.params import FaultParams
from stacklib.unet import connect
from tests.layers.test_ip_driver import CONFIG, A, B, make_pair, run_virtual


def stacks(ch_a: int, ch_b: int, above: Sequence[Layer]) -> tuple[list[Layer], list[Layer]]:
    """IP (addresses A and B) and UDP, then ``above``, for node a and node b."""
    a = [IpLayer(IpParams(address=A, peers={B: ch_a})), UdpLayer(), *above]
    b = [IpLayer(IpParams(address=B, peers={A: ch_b})), UdpLayer(), *above]
    return a, b


def messages(n: int, tag: bytes) -> list[bytes]:
    return [tag + b"-%04d-" % i + bytes(i % 200) for i in range(n)]


async def test_udps_datagram_face_reaches_the_peers_by_their_channel_ids() -> None:
    pair = make_pair()
    a_layers, b_layers = stacks(pair.ch_a, pair.ch_b, [])
    async with (
        open_stack(UNetService(pair.ep_a), a_layers) as a,
        open_stack(UNetService(pair.ep_b), b_layers) as b,
    ):
        assert isinstance(a, DatagramService) and isinstance(a, UdpStack)
        assert list(a.peers) == [pair.ch_a] and list(b.peers) == [pair.ch_b]
        assert a.max_message == 65507  # IP fragments beyond the 9180-byte MTU
        with trio.fail_after(5):
            received = b.recv  # binds b's face (the first use)
            async with trio.open_nursery() as nursery:
                got: list[tuple[int, bytes]] = []

                async def take() -> None:
                    got.append(await received())

                nursery.start_soon(take)
                await trio.testing.wait_all_tasks_blocked()
                await a.send(pair.ch_a, b"over udp")
            assert got == [(pair.ch_b, b"over udp")]
            # From a bound socket on another port: not a peer's face, dropped and counted.
            stray = await a.bind(4000)
            await stray.sendto(b"stray", (B, 5995))
            await a.send(pair.ch_a, b"second")
            assert await b.recv() == (pair.ch_b, b"second")
            assert b.statistics()["dropped"] == {"unknown_peer": 1}  # type: ignore[index]
        with pytest.raises(LocalProtocolError, match=r"no peer 99 \(peers: \["):
            await a.send(99, b"x")


async def test_arq_over_udp_in_real_time_delivers_in_order_both_ways() -> None:
    pair = make_pair()
    a_layers, b_layers = stacks(pair.ch_a, pair.ch_b, [ArqLayer(ArqParams(rto_us=20_000.0))])
    sent_a, sent_b = messages(150, b"a"), messages(150, b"b")
    async with (
        open_stack(UNetService(pair.ep_a), a_layers) as a,
        open_stack(UNetService(pair.ep_b), b_layers) as b,
    ):
        assert isinstance(a, ReliableService) and isinstance(b, ReliableService)
        got: dict[str, list[tuple[int, bytes]]] = {"a": [], "b": []}

        async def exchange(me: DatagramService, peer: int, out: list[bytes], name: str) -> None:
            async with trio.open_nursery() as nursery:

                async def send_all() -> None:
                    for message in out:
                        await me.send(peer, message)

                nursery.start_soon(send_all)
                for _ in range(len(out)):
                    got[name].append(await me.recv())

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(exchange, a, pair.ch_a, sent_a, "a")
                nursery.start_soon(exchange, b, pair.ch_b, sent_b, "b")
    assert got["b"] == [(pair.ch_b, m) for m in sent_a]
    assert got["a"] == [(pair.ch_a, m) for m in sent_b]


async def test_uam_over_udp_in_real_time_runs_handlers_and_carries_messages_in_order() -> None:
    pair = make_pair()
    uam = UamLayer(UamParams(rto_us=20_000.0))
    a_layers, b_layers = stacks(pair.ch_a, pair.ch_b, [uam])
    async with (
        open_stack(UNetService(pair.ep_a), a_layers) as a,
        open_stack(UNetService(pair.ep_b), b_layers) as b,
    ):
        from stacklib.layers.uam import UamService

        assert isinstance(a, UamService) and isinstance(b, UamService)
        assert a.chunk_size <= 9180 - 28  # cut to UDP's largest datagram
        answers: list[tuple[int, int]] = []
        for node in (a, b):
            node.register_handler(
                lambda peer, x, node=node: node.reply("answer", x * 2), name="double"
            )
            node.register_handler(lambda peer, x: answers.append((peer, x)), name="answer")
        with trio.fail_after(30):
            for x in range(20):
                await a.request(pair.ch_a, "double", x)
            await a.wait_until(lambda: len(answers) == 20)
            sent = [*messages(40, b"m"), bytes(20_000)]  # the last in several chunks
            for message in sent:
                await a.send(pair.ch_a, message)
            got = [await b.recv() for _ in sent]
            await a.drain()
    assert answers == [(pair.ch_a, 2 * x) for x in range(20)]
    assert got == [(pair.ch_b, m) for m in sent]


def test_arq_over_udp_over_a_lossy_simulated_network_delivers_exactly_once_in_order() -> None:
    sim = Simulation(seed=3)
    faults = FaultParams(loss=0.05, duplicate=0.02, reorder=0.05)
    out = messages(200, b"x")
    result: dict[str, object] = {}

    async def main() -> None:
        cluster = build_atm(sim, AtmParams(host="ss20", faults=faults), ["a", "b"], None)
        na, nb = cluster.nodes["a"], cluster.nodes["b"]
        ep_a = na.os.create_endpoint(na.os.process("a"), CONFIG)
        ep_b = nb.os.create_endpoint(nb.os.process("b"), CONFIG)
        ch_a, ch_b = connect(ep_a, ep_b)
        arq = ArqLayer(ArqParams(rto_us=2000.0, max_retries=20))
        a_layers, b_layers = stacks(ch_a, ch_b, [arq])
        async with (
            open_stack(UNetService(ep_a), a_layers) as a,
            open_stack(UNetService(ep_b), b_layers) as b,
        ):

            async def send_all() -> None:
                for message in out:
                    await a.send(ch_a, message)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_all)
                result["got"] = [await b.recv() for _ in out]
            arq_a = typing.cast(typing.Any, a)
            result["retransmitted"] = arq_a.peer_statistics(ch_a).retransmitted
            result["ch_b"] = ch_b

    run_virtual(sim, main)
    assert result["got"] == [(result["ch_b"], m) for m in out]
    assert typing.cast(int, result["retransmitted"]) > 0  # the network did lose some


def test_uam_over_udp_over_a_lossy_simulated_fast_ethernet_delivers_in_order() -> None:
    sim = Simulation(seed=5)
    faults = FaultParams(loss=0.03, reorder=0.03)
    out = [*messages(150, b"u"), bytes(6000)]  # the last in five chunks of UDP's 1469 bytes
    result: dict[str, object] = {}

    async def main() -> None:
        cluster = build_fe(sim, FastEthernetParams(host="p120", faults=faults), ["a", "b"], None)
        na, nb = cluster.nodes["a"], cluster.nodes["b"]
        ep_a = na.os.create_endpoint(na.os.process("a"), CONFIG)
        ep_b = nb.os.create_endpoint(nb.os.process("b"), CONFIG)
        ch_a, ch_b = connect(ep_a, ep_b)
        uam = UamLayer(UamParams(rto_us=4000.0, max_retries=30))
        a_layers, b_layers = stacks(ch_a, ch_b, [uam])
        async with (
            open_stack(UNetService(ep_a), a_layers) as a,
            open_stack(UNetService(ep_b), b_layers) as b,
        ):

            async def send_all() -> None:
                for message in out:
                    await a.send(ch_a, message)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_all)
                result["got"] = [await b.recv() for _ in out]
            result["stats"] = typing.cast(typing.Any, a).peer_statistics(ch_a)
            result["ch_b"] = ch_b

    run_virtual(sim, main)
    assert result["got"] == [(result["ch_b"], m) for m in out]
    assert typing.cast(typing.Any, result["stats"]).retransmitted > 0  # go-back-N resent


# --- a user's layer over TCP's stream service ---------------------------------------------------


@attrs.frozen
class FramedParams:
    pass


class FramedService(ReliableService):
    """Length-prefixed messages over one TCP connection per peer, opened at the first send."""

    def __init__(self, below: StreamService, peers: Sequence[int]) -> None:
        self._below = below
        self._peers = list(peers)
        self._out: dict[int, trio.abc.HalfCloseableStream] = {}
        self._send, self._recv = trio.open_memory_channel[tuple[int, bytes]](100)

    @property
    def peers(self) -> Sequence[int]:
        return self._peers

    @property
    def max_message(self) -> int:
        return 1 << 20

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        stream = self._out.get(peer)
        if stream is None:
            stream = self._out[peer] = await self._below.connect(peer)
        await stream.send_all(struct.pack("!I", len(data)) + bytes(data))

    async def recv(self) -> tuple[int, bytes]:
        return await self._recv.receive()

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                peer, stream = await self._below.accept()
                nursery.start_soon(self._read, peer, stream)

    async def _read(self, peer: int, stream: trio.abc.HalfCloseableStream) -> None:
        buffer = b""
        while chunk := await stream.receive_some():
            buffer += chunk
            while len(buffer) >= 4 and len(buffer) >= 4 + (n := struct.unpack("!I", buffer[:4])[0]):
                await self._send.send((peer, buffer[4 : 4 + n]))
                buffer = buffer[4 + n :]


class FramedLayer(Layer):
    name = "framed-test"
    requires = StreamService
    provides = ReliableService
    Params = FramedParams

    def __init__(self, peers: Sequence[int]) -> None:
        super().__init__()
        self.peers = peers

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[FramedService]:
        self.require_below(below)
        service = FramedService(typing.cast(StreamService, below), self.peers)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service.serve)
            yield service
            nursery.cancel_scope.cancel()


async def test_a_users_layer_runs_over_tcps_stream_service_by_peer_id() -> None:
    pair = make_pair()
    a_layers = [IpLayer(IpParams(address=A, peers={B: pair.ch_a})), TcpLayer()]
    b_layers = [IpLayer(IpParams(address=B, peers={A: pair.ch_b})), TcpLayer()]
    sent = [*messages(100, b"t"), bytes(100000)]
    async with (
        open_stack(UNetService(pair.ep_a), [*a_layers, FramedLayer([pair.ch_a])]) as a,
        open_stack(UNetService(pair.ep_b), [*b_layers, FramedLayer([pair.ch_b])]) as b,
    ):
        with trio.fail_after(30):
            for message in sent:
                await a.send(pair.ch_a, message)
            got = [await b.recv() for _ in sent]
            await b.send(pair.ch_b, b"back")  # the other way: b connects to a by a's id
            assert await a.recv() == (pair.ch_a, b"back")
    assert got == [(pair.ch_b, m) for m in sent]  # b knows a by its channel id, not 10.0.0.1
