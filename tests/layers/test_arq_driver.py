"""The ARQ layer's trio driver: over the memory transport in real time, over a lossy network in
virtual time, peer failure at the computed instant, flow control, assembly and registration."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import pytest
import trio
import trio.lowlevel

from stacklib.config import structure
from stacklib.errors import AssemblyError, ConfigError, LocalProtocolError, PeerUnreachable
from stacklib.layers.arq import ArqLayer, ArqParams, ArqService, ArqStatistics
from stacklib.layers.arq.wire import HEADER_SIZE
from stacklib.services import DatagramService, ReliableService, StreamService, UNetService
from stacklib.sim import Simulation
from stacklib.stack import LAYERS, check_fit, layer_class, open_stack
from stacklib.testing import Faults, FaultyService
from stacklib.transports.memory import MemoryNetwork
from stacklib.unet import Endpoint, connect

REPO = Path(__file__).resolve().parents[2]


@attrs.frozen
class Pair:
    ep_a: Endpoint
    ep_b: Endpoint
    ch_a: int  # at a, the channel to b
    ch_b: int  # at b, the channel to a


def make_pair(network: MemoryNetwork) -> Pair:
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("app-a"))
    ep_b = b.os.create_endpoint(b.os.process("app-b"))
    ch_a, ch_b = connect(ep_a, ep_b)
    return Pair(ep_a, ep_b, ch_a, ch_b)


def make_lossy(endpoint: Endpoint, seed: int) -> FaultyService:
    """U-Net whose sends are dropped (20%), duplicated or held back until the next one to the
    same peer has gone (5% each), by a generator seeded with ``seed``."""
    faults = Faults(drop=0.2, duplicate=0.05, reorder=0.05, seed=seed)
    return FaultyService(UNetService(endpoint), faults)


async def exchange(
    a: ArqService, b: ArqService, to_b: int, to_a: int, n: int
) -> tuple[list[bytes], list[bytes]]:
    """Send n messages each way at once; return what b and a received."""
    got_b: list[bytes] = []
    got_a: list[bytes] = []

    async def sender(service: ArqService, peer: int, tag: bytes) -> None:
        for i in range(n):
            await service.send(peer, tag + i.to_bytes(4, "big"))

    async def receiver(service: ArqService, peer: int, into: list[bytes]) -> None:
        for _ in range(n):
            source, data = await service.recv()
            assert source == peer
            into.append(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender, a, to_b, b"a")
        nursery.start_soon(sender, b, to_a, b"b")
        nursery.start_soon(receiver, b, to_a, got_b)
        nursery.start_soon(receiver, a, to_b, got_a)
    return got_b, got_a


def run_virtual(sim: Simulation, main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main`` in virtual time; a hang becomes a failure after 60 virtual seconds."""

    async def guarded() -> None:
        with trio.fail_after(60):
            await main()

    sim.run(guarded)


def expected(tag: bytes, n: int) -> list[bytes]:
    return [tag + i.to_bytes(4, "big") for i in range(n)]


# --- real time, memory transport -----------------------------------------------------------------


async def test_real_time_exchange_over_unet() -> None:
    pair = make_pair(MemoryNetwork())
    layer = ArqLayer()
    async with (
        layer.open(UNetService(pair.ep_a)) as a,
        layer.open(UNetService(pair.ep_b)) as b,
    ):
        assert isinstance(a, ReliableService)
        assert a.peers == [pair.ch_a]
        assert a.max_message == UNetService(pair.ep_a).max_message - HEADER_SIZE
        got_b, got_a = await exchange(a, b, pair.ch_a, pair.ch_b, 200)
        assert got_b == expected(b"a", 200)
        assert got_a == expected(b"b", 200)
        await a.drain(pair.ch_a)
        stats = a.peer_statistics(pair.ch_a)
        assert (stats.sent, stats.acks, stats.delivered, stats.queued) == (200, 200, 200, 0)
        totals = a.statistics()
        assert totals["sent"] == 200
        assert totals["failed_peers"] == []
        assert totals["peers"] == {pair.ch_a: stats}


async def test_misuse_and_close() -> None:
    pair = make_pair(MemoryNetwork())
    async with ArqLayer().open(UNetService(pair.ep_a)) as a:
        with pytest.raises(LocalProtocolError, match="no peer 99"):
            await a.send(99, b"x")
        with pytest.raises(LocalProtocolError, match="max_message"):
            await a.send(pair.ch_a, bytes(a.max_message + 1))
        assert a.peer_statistics(pair.ch_a) == a.peer_statistics(12345)  # all zero
    with pytest.raises(trio.ClosedResourceError):
        await a.send(pair.ch_a, b"x")
    with pytest.raises(trio.EndOfChannel):
        await a.recv()
    assert [m async for m in a] == []  # async iteration ends cleanly


async def test_exception_in_the_body_is_not_wrapped_in_a_group() -> None:
    pair = make_pair(MemoryNetwork())
    with pytest.raises(KeyError):
        async with ArqLayer().open(UNetService(pair.ep_a)):
            raise KeyError("mine")


# --- virtual time ------------------------------------------------------------------------------


def test_500_messages_each_way_exactly_once_in_order_over_a_lossy_network() -> None:
    sim = Simulation(seed=1)
    result: dict[str, object] = {}

    async def main() -> None:
        pair = make_pair(MemoryNetwork(sim, latency=20e-6))
        lossy_a, lossy_b = make_lossy(pair.ep_a, 11), make_lossy(pair.ep_b, 12)
        layer = ArqLayer(ArqParams(rto_us=200.0, max_retries=12))
        async with layer.open(lossy_a) as a, layer.open(lossy_b) as b:
            got_b, got_a = await exchange(a, b, pair.ch_a, pair.ch_b, 500)
            await a.drain(pair.ch_a)
            await b.drain(pair.ch_b)
            result.update(
                got_b=got_b,
                got_a=got_a,
                a=a.peer_statistics(pair.ch_a),
                b=b.peer_statistics(pair.ch_b),
                lossy=(lossy_a.faults.counts, lossy_b.faults.counts),
                elapsed=trio.current_time(),
            )

    run_virtual(sim, main)
    assert result["got_b"] == expected(b"a", 500)
    assert result["got_a"] == expected(b"b", 500)
    for side in ("a", "b"):
        stats = result[side]
        assert isinstance(stats, ArqStatistics)
        assert (stats.sent, stats.acks, stats.delivered) == (500, 500, 500)
        assert stats.retransmitted > 50  # 20% loss each way: about a third of rounds lose one
        assert stats.duplicates > 0
        assert stats.queued == 0
    lossy = result["lossy"]
    assert isinstance(lossy, tuple)
    for counts in lossy:
        assert min(counts["drop"], counts["duplicate"], counts["reorder"]) > 0


def test_lossy_run_is_deterministic() -> None:
    def run() -> tuple[float, ArqStatistics]:
        sim = Simulation(seed=3)
        out: list[tuple[float, ArqStatistics]] = []

        async def main() -> None:
            pair = make_pair(MemoryNetwork(sim, latency=20e-6))
            layer = ArqLayer(ArqParams(rto_us=200.0, max_retries=12))
            lossy_a, lossy_b = make_lossy(pair.ep_a, 5), make_lossy(pair.ep_b, 6)
            async with layer.open(lossy_a) as a, layer.open(lossy_b) as b:
                await exchange(a, b, pair.ch_a, pair.ch_b, 100)
                await a.drain(pair.ch_a)
                out.append((trio.current_time(), a.peer_statistics(pair.ch_a)))

        run_virtual(sim, main)
        return out[0]

    assert run() == run()


@pytest.mark.parametrize("max_retries", [0, 3, 8])
def test_peer_that_never_answers_is_reported_at_the_computed_time(max_retries: int) -> None:
    sim = Simulation(seed=1)
    rto_us = 500.0
    seen: dict[str, object] = {}

    async def main() -> None:
        pair = make_pair(MemoryNetwork(sim, latency=20e-6))
        # b's endpoint exists and receives, but nothing runs ARQ on it: no ACK ever comes.
        layer = ArqLayer(ArqParams(rto_us=rto_us, max_retries=max_retries))
        async with layer.open(UNetService(pair.ep_a)) as a:
            await trio.sleep(0.01)
            start = trio.current_time()
            await a.send(pair.ch_a, b"hello?")
            await a.send(pair.ch_a, b"anyone?")
            with pytest.raises(PeerUnreachable, match="2 message"):
                await a.recv()
            seen["elapsed"] = trio.current_time() - start
            with pytest.raises(PeerUnreachable):
                await a.send(pair.ch_a, b"x")
            with pytest.raises(PeerUnreachable):
                await a.drain(pair.ch_a)
            seen["stats"] = a.statistics()
            seen["peer"] = pair.ch_a
        seen["b_received"] = pair.ep_b.statistics().received

    run_virtual(sim, main)
    # Timeouts rto, 2 rto, ..., 2**max_retries rto, one after the other.
    assert seen["elapsed"] == pytest.approx(rto_us * 1e-6 * (2 ** (max_retries + 1) - 1), abs=1e-9)
    stats = seen["stats"]
    assert isinstance(stats, dict)
    assert stats["failed_peers"] == [seen["peer"]]
    assert (stats["sent"], stats["retransmitted"]) == (1, max_retries)
    assert seen["b_received"] == max_retries + 1  # every copy of the first DATA


def test_peer_that_stops_midway_is_reported_and_earlier_messages_were_delivered() -> None:
    sim = Simulation(seed=2)
    seen: dict[str, object] = {}

    async def main() -> None:
        pair = make_pair(MemoryNetwork(sim, latency=20e-6))
        layer = ArqLayer(ArqParams(rto_us=1000.0, max_retries=4))
        async with layer.open(UNetService(pair.ep_a)) as a:
            async with layer.open(UNetService(pair.ep_b)) as b:
                for i in range(10):
                    await a.send(pair.ch_a, bytes([i]))
                await a.drain(pair.ch_a)
                seen["got"] = [(await b.recv())[1] for _ in range(10)]
            # b's layer is closed: nothing answers any more.
            start = trio.current_time()
            await a.send(pair.ch_a, b"after")
            with pytest.raises(PeerUnreachable):
                await a.recv()
            seen["elapsed"] = trio.current_time() - start

    run_virtual(sim, main)
    assert seen["got"] == [bytes([i]) for i in range(10)]
    assert seen["elapsed"] == pytest.approx(1e-3 * 31, abs=1e-9)


def test_send_waits_while_max_queue_messages_are_unacknowledged() -> None:
    sim = Simulation(seed=1)
    seen: dict[str, object] = {}

    async def main() -> None:
        pair = make_pair(MemoryNetwork(sim, latency=20e-6))
        layer = ArqLayer(ArqParams(rto_us=1000.0, max_retries=2, max_queue=2))
        async with layer.open(UNetService(pair.ep_a)) as a:
            await a.send(pair.ch_a, b"1")
            await a.send(pair.ch_a, b"2")
            with trio.move_on_after(1e-3) as scope:
                await a.send(pair.ch_a, b"3")  # no room: waits, then is cancelled
            seen["blocked"] = scope.cancelled_caught
            seen["queued"] = a.peer_statistics(pair.ch_a).queued  # the cancelled one is not
            start = trio.current_time()
            with pytest.raises(PeerUnreachable):
                await a.send(pair.ch_a, b"3")  # woken by the failure
            seen["waited"] = trio.current_time() - start

    run_virtual(sim, main)
    assert seen["blocked"] is True
    assert seen["queued"] == 2
    # Failure 7 rto after the first send, which was 1 ms before the second attempt.
    assert seen["waited"] == pytest.approx(6e-3, abs=1e-9)


def test_a_receiver_that_does_not_read_holds_back_at_max_queue_then_catches_up() -> None:
    sim = Simulation(seed=1)
    seen: dict[str, object] = {}

    async def main() -> None:
        pair = make_pair(MemoryNetwork(sim, latency=20e-6))
        layer = ArqLayer(ArqParams(rto_us=1000.0, max_retries=8, max_queue=4))
        async with layer.open(UNetService(pair.ep_a)) as a, layer.open(UNetService(pair.ep_b)) as b:

            async def send_all() -> None:
                for i in range(20):
                    await a.send(pair.ch_a, bytes([i]))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_all)
                await trio.sleep(0.005)
                seen["delivered_while_idle"] = b.peer_statistics(pair.ch_b).delivered
                seen["got"] = [(await b.recv())[1] for _ in range(20)]

    run_virtual(sim, main)
    assert seen["delivered_while_idle"] == 4
    assert seen["got"] == [bytes([i]) for i in range(20)]


# --- assembly, registration, parameters ------------------------------------------------------


class Streams(StreamService):
    async def connect(self, peer: int) -> trio.abc.HalfCloseableStream:
        raise NotImplementedError

    async def accept(self) -> tuple[int, trio.abc.HalfCloseableStream]:
        raise NotImplementedError


async def test_open_stack_over_unet_and_arq_over_arq() -> None:
    pair = make_pair(MemoryNetwork())
    layers = [ArqLayer()]
    async with (
        open_stack(UNetService(pair.ep_a), layers) as a,
        open_stack(UNetService(pair.ep_b), [ArqLayer(), ArqLayer()]) as b,
    ):
        assert isinstance(a, ArqService)
        assert isinstance(b, ArqService)
        assert b.max_message == a.max_message - HEADER_SIZE
        # a's one layer talks to b's lower layer; a's payload is a PDU for b's upper layer,
        # whose ACK comes back to a as a message.
        await a.send(pair.ch_a, b"\x01\x00\x00ping")  # DATA seq 0 "ping"
        assert await b.recv() == (pair.ch_b, b"ping")
        assert await a.recv() == (pair.ch_a, b"\x02\x00\x00")  # ACK seq 0


async def test_open_stack_over_a_non_datagram_service_fails() -> None:
    with pytest.raises(AssemblyError, match=r"'arq'.*datagram"):
        async with open_stack(Streams(), [ArqLayer()]):
            pass  # pragma: no cover
    with pytest.raises(AssemblyError):
        async with ArqLayer().open(Streams()):
            pass  # pragma: no cover
    check_fit(UNetService, [ArqLayer(), ArqLayer()])  # reliable is a datagram service


def test_registered_as_arq() -> None:
    assert LAYERS["arq"] is ArqLayer
    assert layer_class("arq") is ArqLayer
    assert (ArqLayer.requires, ArqLayer.provides) == (DatagramService, ReliableService)


def test_params_from_a_recipe_table() -> None:
    params = structure(ArqParams, {"rto_us": 500, "max_retries": 3}, "r.toml", "layers[0]")
    assert params == ArqParams(rto_us=500.0, max_retries=3, max_queue=64)
    with pytest.raises(ConfigError, match="unknown key"):
        structure(ArqParams, {"rto": 1}, "r.toml", "layers[0]")
    with pytest.raises(ConfigError, match="rto_us"):
        structure(ArqParams, {"rto_us": 0}, "r.toml", "layers[0]")


@pytest.mark.parametrize(
    "options",
    [
        {"rto_us": 0.0},
        {"rto_us": -1.0},
        {"rto_us": float("nan")},
        {"rto_us": True},
        {"max_retries": -1},
        {"max_retries": 1.5},
        {"max_queue": 0},
        {"max_queue": False},
    ],
)
def test_params_validated(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ArqParams(**options)  # type: ignore[arg-type]


# --- docs/writing-a-layer.md stays true --------------------------------------------------------

TUTORIAL = REPO / "docs" / "writing-a-layer.md"
SOURCES = "\n".join(
    path.read_text()
    for path in [
        *(REPO / "stacklib" / "layers" / "arq").glob("*.py"),
        REPO / "stacklib" / "sansio.py",
        REPO / "stacklib" / "driver.py",
        *(REPO / "stacklib" / "testing").glob("*.py"),
        *(REPO / "tests" / "layers").glob("test_arq_*.py"),
    ]
)


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", TUTORIAL.read_text(), flags=re.DOTALL)


def test_tutorial_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    examples = blocks("python")
    assert examples
    for example in examples:
        exec(compile(example, str(TUTORIAL), "exec"), {"__name__": "__main__"})
    assert "delivered" in capsys.readouterr().out


def test_tutorial_excerpts_match_the_source() -> None:
    excerpts = blocks("py")
    assert len(excerpts) >= 5
    for excerpt in excerpts:
        for line in excerpt.splitlines():
            text = line.strip()
            if text and text != "...":
                assert text in SOURCES, f"tutorial line not in the arq source: {text!r}"
