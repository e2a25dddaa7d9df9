"""The UAM layer's trio driver: GAM operations over the memory transport in real time and over
the simulated SBA-200 and Fast Ethernet in virtual time, a lossy network, the unreachable peer
at the computed instant, explicit polling, reply rules, costs, registration and recipes."""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import pytest
import trio
import trio.lowlevel

from stacklib.config import structure
from stacklib.errors import (
    AssemblyError,
    ConfigError,
    LocalProtocolError,
    PeerUnreachable,
    RemoteProtocolError,
)
from stacklib.experiments import uam as experiments
from stacklib.layers.uam import LeanPath, UamLayer, UamParams, UamService
from stacklib.recipes import load_recipe, parse_recipe, run_recipe
from stacklib.services import (
    ActiveMessageService,
    DatagramService,
    ReliableService,
    StreamService,
    UNetService,
)
from stacklib.sim import Simulation
from stacklib.stack import layer_class, open_stack
from stacklib.testing import Faults, FaultyService
from stacklib.transports.memory import MemoryNetwork
from stacklib.transports.shm import ShmAddress, ShmNetwork
from stacklib.unet import Endpoint, EndpointConfig, connect

REPO = Path(__file__).resolve().parents[2]
BIG = EndpointConfig(segment_size=512 * 1024, tx_buffers=32, rx_buffers=48, free_queue=64)


@attrs.frozen
class Pair:
    ep_a: Endpoint
    ep_b: Endpoint
    ch_a: int  # at a, the channel to b
    ch_b: int  # at b, the channel to a


def make_pair(network: MemoryNetwork) -> Pair:
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("app-a"), BIG)
    ep_b = b.os.create_endpoint(b.os.process("app-b"), BIG)
    ch_a, ch_b = connect(ep_a, ep_b)
    return Pair(ep_a, ep_b, ch_a, ch_b)


def make_lossy(endpoint: Endpoint, seed: int) -> FaultyService:
    """U-Net whose sends are dropped (20%), duplicated or held back until the next one to the
    same peer has gone (5% each), by a generator seeded with ``seed``.  It lends no endpoint,
    so UAM runs over it on the task path."""
    faults = Faults(drop=0.2, duplicate=0.05, reorder=0.05, seed=seed)
    return FaultyService(UNetService(endpoint), faults)


def run_virtual(sim: Simulation, main: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        with trio.fail_after(60):  # a hang becomes a failure after 60 virtual seconds
            await main()

    sim.run(guarded)


def echo_tables(am_a: UamService, am_b: UamService, got: list[tuple[int, ...]]) -> None:
    """Handler 0 ("ping") replies with handler 1 ("pong"), which records its args."""
    for am in (am_a, am_b):
        am.register_handler(lambda peer, *args, am=am: am.reply("pong", *args), name="ping")
        am.register_handler(lambda peer, *args: got.append(args), name="pong")


# --- real time, memory transport -----------------------------------------------------------


async def test_requests_replies_stores_and_gets_in_real_time() -> None:
    pair = make_pair(MemoryNetwork())
    # The memory transport loses nothing; a 1 s timeout keeps a stall of this process (other
    # load on the machine) from showing as a go-back-N retransmission.
    layer = UamLayer(UamParams(rto_us=1e6))
    async with (
        layer.open(UNetService(pair.ep_a)) as a,
        layer.open(UNetService(pair.ep_b)) as b,
    ):
        assert isinstance(a, ReliableService)
        got: list[tuple[int, ...]] = []
        echo_tables(a, b, got)
        for i in range(200):
            await a.request(pair.ch_a, "ping", i, 1 << 31, 7)
        await a.wait_until(lambda: len(got) == 200)
        assert got == [(i, 1 << 31, 7) for i in range(200)]

        region_a, region_b = bytearray(30000), bytearray(30000)
        assert a.register_region(region_a, name="r") == b.register_region(region_b, name="r")
        stored: list[tuple[int, ...]] = []
        b.register_handler(lambda *args: stored.append(args), index=9)
        a.register_handler(lambda *args: stored.append(args), index=9)
        block = random.Random(1).randbytes(20000)
        await a.store(pair.ch_a, block, ("r", 100), 9, 42)
        await a.wait_until(lambda: bool(stored))
        assert region_b[100:20100] == block
        assert stored == [(pair.ch_b, 0, 100, 20000, 42)]
        await a.get(pair.ch_a, ("r", 100), 20000, ("r", 5000), 9)
        await a.wait_until(lambda: len(stored) == 2)
        assert region_a[5000:25000] == block
        assert stored[1] == (pair.ch_a, 0, 5000, 20000)
        await a.drain()
        stats = a.peer_statistics(pair.ch_a)
        assert stats.retransmitted == 0 and stats.unacked == 0
        assert a.statistics()["failed_peers"] == []


async def test_datagram_face_carries_messages_of_any_size() -> None:
    pair = make_pair(MemoryNetwork())
    async with (
        open_stack(UNetService(pair.ep_a), [UamLayer()]) as a,
        open_stack(UNetService(pair.ep_b), [UamLayer()]) as b,
    ):
        assert isinstance(a, UamService) and isinstance(b, UamService)
        messages = [b"", b"x", bytes(5000), random.Random(2).randbytes(12345)]
        for message in messages:
            await a.send(pair.ch_a, message)
        assert [await b.recv() for _ in messages] == [(pair.ch_b, m) for m in messages]
    with pytest.raises(trio.EndOfChannel):
        await b.recv()
    with pytest.raises(trio.ClosedResourceError):
        await a.send(pair.ch_a, b"late")


async def test_misuse() -> None:
    pair = make_pair(MemoryNetwork())
    async with UamLayer().open(UNetService(pair.ep_a)) as a:
        with pytest.raises(LocalProtocolError, match="no peer 99"):
            await a.request(99, 0)
        with pytest.raises(LocalProtocolError, match="at most 4"):
            await a.request(pair.ch_a, 0, 1, 2, 3, 4, 5)
        with pytest.raises(LocalProtocolError, match="no handler named"):
            await a.request(pair.ch_a, "nope")
        with pytest.raises(LocalProtocolError, match="only from a request handler"):
            a.reply(0)
        with pytest.raises(LocalProtocolError, match="outside the local regions"):
            await a.get(pair.ch_a, (0, 0), 10, (0, 0), 0)
        with pytest.raises(LocalProtocolError, match="writable"):
            a.register_region(memoryview(b"read-only"))
        with pytest.raises(LocalProtocolError):
            a.register_handler(print, index=256)


async def test_exception_in_the_body_is_not_wrapped_in_a_group() -> None:
    pair = make_pair(MemoryNetwork())
    with pytest.raises(KeyError):
        async with UamLayer().open(UNetService(pair.ep_a)):
            raise KeyError("mine")


async def test_explicit_polling_runs_handlers_only_on_poll() -> None:
    pair = make_pair(MemoryNetwork())
    quiet = UamLayer(UamParams(background_poll=False))
    async with quiet.open(UNetService(pair.ep_a)) as a, quiet.open(UNetService(pair.ep_b)) as b:
        got: list[tuple[int, ...]] = []
        echo_tables(a, b, got)
        a.request_nowait(pair.ch_a, "ping", 5)
        for _ in range(10):
            await trio.sleep(0)
        assert got == []  # arrived at b, but nobody polled
        assert b.poll() == 1  # b runs "ping", which replies
        await a.wait_until(lambda: bool(got))  # a polls while it waits
        assert got == [(5,)]
        assert b.poll() == 0


async def test_a_reply_handler_may_not_reply() -> None:
    pair = make_pair(MemoryNetwork())
    quiet = UamLayer(UamParams(background_poll=False))
    async with quiet.open(UNetService(pair.ep_a)) as a, quiet.open(UNetService(pair.ep_b)) as b:
        b.register_handler(lambda peer: b.reply(1), index=0)
        a.register_handler(lambda peer: a.reply(1), index=1)  # a reply handler replying
        a.request_nowait(pair.ch_a, 0)
        await b.wait_until(lambda: b.peer_statistics(pair.ch_b).handled == 1)
        with pytest.raises(LocalProtocolError, match="reply handler may not reply"):
            await a.wait_until(lambda: False)


async def test_a_request_handler_replies_once() -> None:
    pair = make_pair(MemoryNetwork())
    quiet = UamLayer(UamParams(background_poll=False))
    async with quiet.open(UNetService(pair.ep_a)) as a, quiet.open(UNetService(pair.ep_b)) as b:

        def twice(peer: int) -> None:
            b.reply(1)
            b.reply(1)

        b.register_handler(twice, index=0)
        a.request_nowait(pair.ch_a, 0)
        with pytest.raises(LocalProtocolError, match="once"):
            await b.wait_until(lambda: False)


async def test_background_handler_errors_reach_the_application() -> None:
    pair = make_pair(MemoryNetwork())
    async with (
        UamLayer().open(UNetService(pair.ep_a)) as a,
        UamLayer().open(UNetService(pair.ep_b)) as b,
    ):

        def broken(peer: int) -> None:
            raise ValueError("handler bug")

        b.register_handler(broken, index=0)
        await a.request(pair.ch_a, 0)
        with pytest.raises(ValueError, match="handler bug"):
            await b.wait_until(lambda: False)


async def test_bad_remote_addresses_are_counted_and_refused() -> None:
    pair = make_pair(MemoryNetwork())
    async with (
        UamLayer().open(UNetService(pair.ep_a)) as a,
        UamLayer().open(UNetService(pair.ep_b)) as b,
    ):
        b.register_region(bytearray(100))
        a.register_region(bytearray(1000))
        a.register_handler(lambda *args: None, index=0)
        b.register_handler(lambda *args: None, index=0)
        await a.store(pair.ch_a, bytes(200), (0, 0), 0)  # beyond b's region
        await a.store(pair.ch_a, bytes(10), (7, 0), 0)  # no region 7
        await a.drain()
        assert b.statistics()["bad_address"] == 2
        await a.get(pair.ch_a, (0, 50), 100, (0, 0), 0)
        with pytest.raises(RemoteProtocolError, match="refused"):
            await a.wait_until(lambda: False)
        assert a.statistics()["unknown_handler"] == 0
        await a.request(pair.ch_a, 200)  # no such handler at b: counted, acknowledged
        await a.drain()
        assert b.statistics()["unknown_handler"] == 1


# --- virtual time ----------------------------------------------------------------------------


def test_exactly_once_in_order_over_a_lossy_network() -> None:
    sim = Simulation(seed=1)
    result: dict[str, object] = {}

    async def main() -> None:
        pair = make_pair(MemoryNetwork(sim, latency=20e-6))
        layer = UamLayer(UamParams(rto_us=300.0, max_retries=30, ack_delay_us=50.0))
        lossy_a, lossy_b = make_lossy(pair.ep_a, 11), make_lossy(pair.ep_b, 12)
        async with layer.open(lossy_a) as a, layer.open(lossy_b) as b:
            got: list[tuple[int, ...]] = []
            echo_tables(a, b, got)
            region = bytearray(50000)
            b.register_region(region)
            a.register_region(bytearray(1))
            b.register_handler(lambda *args: None, index=5)
            block = random.Random(3).randbytes(50000)

            async def requests() -> None:
                for i in range(300):
                    await a.request(pair.ch_a, "ping", i)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(requests)
                nursery.start_soon(a.store, pair.ch_a, block, (0, 0), 5)
            await a.wait_until(lambda: len(got) == 300)
            await a.drain()
            result.update(
                got=got,
                region=bytes(region),
                block=block,
                stats_a=a.peer_statistics(pair.ch_a),
                stats_b=b.peer_statistics(pair.ch_b),
                faults=dict(lossy_a.faults.counts),
                path=a.path.name,
                end=trio.current_time(),
            )

    run_virtual(sim, main)
    assert result["got"] == [(i,) for i in range(300)]
    assert result["region"] == result["block"]
    stats_a, stats_b = result["stats_a"], result["stats_b"]
    faults = result["faults"]
    assert isinstance(faults, dict) and min(faults.values()) > 0
    assert set(faults) == {"drop", "duplicate", "reorder"}
    assert result["path"] == "task"
    assert stats_a.retransmitted > 0  # type: ignore[attr-defined]
    assert stats_b.duplicates > 0  # type: ignore[attr-defined]


def test_unreachable_peer_is_reported_at_the_computed_instant() -> None:
    sim = Simulation(seed=1)
    seen: dict[str, float] = {}

    async def main() -> None:
        network = MemoryNetwork(sim, latency=20e-6)
        pair = make_pair(network)  # nothing runs UAM at b
        layer = UamLayer(UamParams(rto_us=1000.0, max_retries=3))
        async with layer.open(UNetService(pair.ep_a)) as a:
            await trio.sleep(0.5)
            start = trio.current_time()
            await a.request(pair.ch_a, 0, 1)
            with pytest.raises(PeerUnreachable, match="3 retransmission timeouts"):
                await a.wait_until(lambda: False)
            seen["after"] = trio.current_time() - start
            with pytest.raises(PeerUnreachable):
                await a.request(pair.ch_a, 0)
            seen["retransmitted"] = a.peer_statistics(pair.ch_a).retransmitted

    run_virtual(sim, main)
    assert seen["after"] == pytest.approx(1000e-6 * (3 + 1))  # rto * (max_retries + 1)
    assert seen["retransmitted"] == 3


def test_a_raising_handler_leaves_the_rest_for_the_next_poll_in_virtual_time() -> None:
    sim = Simulation(seed=1)
    got: list[int] = []
    polls: list[int] = []

    async def main() -> None:
        pair = make_pair(MemoryNetwork(sim, latency=20e-6))
        quiet = UamLayer(UamParams(background_poll=False))
        async with (
            quiet.open(UNetService(pair.ep_a)) as a,
            quiet.open(UNetService(pair.ep_b)) as b,
        ):

            def handler(peer: int, value: int) -> None:
                if value == 1:
                    raise ValueError("handler bug")
                got.append(value)

            b.register_handler(handler, index=0)
            for value in range(3):
                a.request_nowait(pair.ch_a, 0, value)
            while b.peer_statistics(pair.ch_b).received < 3:
                await trio.sleep(10e-6)
            assert got == []  # arrived, but nobody polled
            with pytest.raises(ValueError, match="handler bug"):
                b.poll()
            polls.append(b.poll())  # the third request is still there
            polls.append(b.poll())
            await a.drain()

    run_virtual(sim, main)
    assert got == [0, 2]
    assert polls == [1, 0]


def test_single_cell_round_trip_on_the_sba200_is_71_us() -> None:
    rtt = experiments.single_cell_rtt(round_trips=3)
    assert rtt == pytest.approx(71.0, rel=0.02)


def test_costs_are_charged_only_where_the_ni_models_them() -> None:
    async def body(a: UamService, b: UamService, to_b: int, to_a: int) -> float:
        a.register_handler(lambda *args: None, index=0)
        b.register_handler(lambda *args: None, index=0)
        b.register_region(bytearray(10000))
        await a.store(to_b, bytes(8000), (0, 0), 0)
        await a.drain()
        assert a.host_costs is not None
        return float(a.host_costs.cpu.busy_time)

    busy = float(experiments.run_pair(body))  # type: ignore[arg-type]
    # Two chunks copied in (two copies of ~4 KB at 53 MB/s) plus per-PDU costs.
    assert busy > 8000 / 53e6
    free = UamService(UNetService(make_pair(MemoryNetwork()).ep_a), UamParams())
    assert free.host_costs is None


def test_store_and_get_over_fast_ethernet_use_smaller_chunks() -> None:
    async def body(a: UamService, b: UamService, to_b: int, to_a: int) -> tuple[int, bool]:
        ra, rb = bytearray(9000), bytearray(9000)
        a.register_region(ra)
        b.register_region(rb)
        done: list[int] = []
        a.register_handler(lambda *args: done.append(1), index=0)
        b.register_handler(lambda *args: None, index=0)
        block = random.Random(4).randbytes(9000)
        await a.store(to_b, block, (0, 0), 0)
        await a.drain()
        await a.get(to_b, (0, 0), 9000, (0, 0), 0)
        await a.wait_until(lambda: bool(done))
        return a.chunk_size, bytes(ra) == block == bytes(rb)

    result = experiments.run_pair(body, fe=True)
    assert isinstance(result, tuple)
    chunk, same = result
    assert chunk == 1497 - 40  # the FE frame, less the largest UAM header
    assert same


# --- assembly, registration, recipes -------------------------------------------------------------


async def test_assembly_and_registration() -> None:
    assert layer_class("uam") is UamLayer
    assert UamLayer.requires is DatagramService
    assert UamLayer.provides is ActiveMessageService

    class Streams(StreamService):
        async def connect(self, peer: int) -> trio.abc.HalfCloseableStream:
            raise NotImplementedError

        async def accept(self) -> tuple[int, trio.abc.HalfCloseableStream]:
            raise NotImplementedError

    with pytest.raises(AssemblyError, match="'uam'"):
        async with open_stack(Streams(), [UamLayer()]):
            pass
    with pytest.raises(AssemblyError, match="requires a 'datagram'"):
        async with UamLayer().open(Streams()):
            pass


@pytest.mark.parametrize(
    ("key", "value"),
    [("window", 0), ("rto_us", 0.0), ("max_retries", -1), ("chunk_size", 5000), ("proto_us", -1)],
)
def test_params_are_validated(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        structure(UamParams, {key: value}, "test.toml", "layers[0]")


@pytest.mark.parametrize("name", ["unet-atm-uam", "unet-fe-uam"])
def test_recipes_run(name: str) -> None:
    recipe = load_recipe(REPO / "stacklib" / "recipes" / f"{name}.toml")
    assert [cls for cls, _ in recipe.layers] == [UamLayer]
    result = run_recipe(recipe)
    rtts = {row["size"]: row["rtt_us"] for row in result.rows}
    assert all(isinstance(v, float) and v > 0 for v in rtts.values())
    if name == "unet-atm-uam":
        assert 60 < rtts[16] < 100  # type: ignore[operator]


def test_docs_examples_run() -> None:
    text = (REPO / "docs" / "uam.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/uam.md", "exec"), {"__name__": "__main__"})


def test_reliability_bench_counts() -> None:
    result = experiments.bench_reliability(2000, loss=0.1, duplicate=0.05, reorder=0.05, seed=3)
    assert result["delivered"] == 2000
    assert result["retransmitted"] > 0
    assert result["duplicates_suppressed"] > 0
    again = experiments.bench_reliability(2000, loss=0.1, duplicate=0.05, reorder=0.05, seed=3)
    assert {k: v for k, v in again.items() if k != "wall_seconds"} == {
        k: v for k, v in result.items() if k != "wall_seconds"
    }
    # The protocol's decisions, pinned: the counters the machine gave before its fast paths
    # (one-struct small PDUs, in-place acknowledgment and accept) must not move.
    assert (
        result["retransmitted"],
        result["timeouts"],
        result["duplicates_suppressed"],
        result["out_of_order_dropped"],
        result["explicit_acks"],
    ) == (3477, 455, 175, 2968, 430)


@pytest.mark.parametrize("transport", ["sim-myrinet", "memory"])
def test_the_uam_recipe_runs_on_other_transports(transport: str) -> None:
    # Every transport carries UAM, including bulk messages past one 4160-byte buffer.
    data = {
        "run": {"clock": "virtual" if transport.startswith("sim") else "real", "seed": 1},
        "transport": {"kind": transport},
        "endpoint": {"segment_size": 524288, "tx_buffers": 32, "rx_buffers": 48, "free_queue": 64},
        "layers": [{"kind": "uam"}],
        "workload": {"kind": "pingpong", "sizes": [16, 5000], "iterations": 3, "warmup": 1},
    }
    result = run_recipe(parse_recipe(data, "inline"))
    assert [row["size"] for row in result.rows] == [16, 5000]
    assert all(float(row["rtt_us"]) > 0 for row in result.rows)  # type: ignore[arg-type]


# --- the lean path: real transports, receive and handlers in the caller's task ---------------


def make_shm_pair(network: ShmNetwork) -> Pair:
    """Two nodes of one shm network in this process: a real transport (wall-clock time)."""
    endpoints = []
    for name, other in (("a", "b"), ("b", "a")):
        node = network.add_node(name)
        endpoint = node.os.create_endpoint(node.os.process(f"app-{name}"), BIG, port=1)
        channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress(other, 1))
        endpoints.append((endpoint, channel))
    (ep_a, ch_a), (ep_b, ch_b) = endpoints
    return Pair(ep_a, ep_b, ch_a, ch_b)


def test_the_lean_path_is_taken_only_on_real_transports() -> None:
    memory = UamService(UNetService(make_pair(MemoryNetwork()).ep_a), UamParams())
    assert isinstance(memory.path, LeanPath) and memory.path.spin == 0.0
    with ShmNetwork(spin_time=25e-6) as network:
        shm = UamService(UNetService(make_shm_pair(network).ep_a), UamParams())
        assert isinstance(shm.path, LeanPath)
        assert shm.path.spin == 25e-6  # the PolledNI's documented spin_time
    sim = Simulation(seed=1)
    virtual = UamService(UNetService(make_pair(MemoryNetwork(sim)).ep_a), UamParams())
    assert virtual.path.name == "event"
    wrapped = UamService(make_lossy(make_pair(MemoryNetwork()).ep_a, 1), UamParams())
    assert wrapped.path.name == "task"  # a faulty service lends no endpoint


async def test_a_round_trip_needs_no_task_hand_off() -> None:
    # Explicit polling over shm: the request goes into b's ring at once, b.poll() takes it and
    # runs the handler, whose reply goes into a's ring at once: no checkpoint in between.
    quiet = UamLayer(UamParams(background_poll=False))
    with ShmNetwork() as network:
        pair = make_shm_pair(network)
        async with (
            quiet.open(UNetService(pair.ep_a)) as a,
            quiet.open(UNetService(pair.ep_b)) as b,
        ):
            got: list[tuple[int, ...]] = []
            echo_tables(a, b, got)
            for i in range(50):
                a.request_nowait(pair.ch_a, "ping", i, 2, 3, 4)
                assert b.poll() == 1
                assert a.poll() == 1
                assert got[-1] == (i, 2, 3, 4)
            assert got == [(i, 2, 3, 4) for i in range(50)]
            await a.drain()
            await b.drain()
            assert b.peer_statistics(pair.ch_b).handled == 50


@pytest.mark.parametrize("background", [False, True])
async def test_lean_requests_are_handled_exactly_once_in_order(background: bool) -> None:
    layer = UamLayer(UamParams(background_poll=background, window=4))
    with ShmNetwork() as network, trio.fail_after(30):
        pair = make_shm_pair(network)
        async with layer.open(UNetService(pair.ep_a)) as a, layer.open(UNetService(pair.ep_b)) as b:
            got: list[tuple[int, ...]] = []
            seen: list[int] = []
            echo_tables(a, b, got)
            for am in (a, b):  # SPMD: both tables name it
                am.register_handler(lambda peer, i: seen.append(i), name="note")
            done = False

            async def b_polls() -> None:
                while not done:
                    b.poll()
                    await trio.sleep(0)

            async with trio.open_nursery() as nursery:
                if not background:
                    nursery.start_soon(b_polls)
                for i in range(300):  # the window (4) fills: request polls and waits
                    await a.request(pair.ch_a, "ping", i)
                    if i % 3 == 0:
                        await a.request(pair.ch_a, "note", i)
                await a.wait_until(lambda: len(got) == 300)
                await a.drain()
                done = True
            # Exactly once, in order (real time: a stalled process may retransmit, and the
            # receiver then drops the duplicates).
            assert got == [(i,) for i in range(300)]
            assert seen == list(range(0, 300, 3))
            assert b.peer_statistics(pair.ch_b).handled == 400


async def test_a_lean_poll_leaves_what_does_not_fit_at_the_endpoint() -> None:
    # More in-order PDUs wait at the endpoint than the 2w arrivals a machine holds (a peer with
    # a larger window sends them): poll takes 2w, runs their handlers, then takes the rest.
    # Nothing is dropped for want of a buffer, so nothing waits for go-back-N's timeout.
    with ShmNetwork() as network:
        pair = make_shm_pair(network)
        small, large = UamParams(background_poll=False, window=2), UamParams(window=8)
        async with (
            UamLayer(small).open(UNetService(pair.ep_a)) as a,
            UamLayer(large).open(UNetService(pair.ep_b)) as b,
        ):
            seen: list[int] = []
            for am in (a, b):
                am.register_handler(lambda peer, i: seen.append(i), name="note")
            for i in range(8):
                b.request_nowait(pair.ch_b, "note", i)
            assert a.poll() == 8
            assert seen == list(range(8))
            statistics = a.peer_statistics(pair.ch_a)
            assert (statistics.handled, statistics.no_buffer) == (8, 0)


@pytest.mark.parametrize("acknowledge", [False, True])
async def test_acknowledge_before_a_long_computation(acknowledge: bool) -> None:
    # b handles a request and then computes without polling.  Its acknowledgment is delayed
    # (ack_delay), so without acknowledge() a's request stays unacknowledged meanwhile and a's
    # timer runs; with it the ACK is already at a before the computation starts.
    quiet = UamLayer(UamParams(background_poll=False))
    with ShmNetwork() as network:
        pair = make_shm_pair(network)
        async with (
            quiet.open(UNetService(pair.ep_a)) as a,
            quiet.open(UNetService(pair.ep_b)) as b,
        ):
            seen: list[int] = []
            for am in (a, b):
                am.register_handler(lambda peer, i: seen.append(i), name="note")
            a.request_nowait(pair.ch_a, "note", 7)
            if acknowledge:
                assert b.acknowledge() == 1
            else:
                assert b.poll() == 1
            assert seen == [7]
            a.poll()  # takes whatever b sent
            assert a.peer_statistics(pair.ch_a).unacked == (0 if acknowledge else 1)
            assert b.peer_statistics(pair.ch_b).acks_sent == (1 if acknowledge else 0)


async def test_lean_reply_rules_hold() -> None:
    quiet = UamLayer(UamParams(background_poll=False))
    with ShmNetwork() as network:
        pair = make_shm_pair(network)
        async with (
            quiet.open(UNetService(pair.ep_a)) as a,
            quiet.open(UNetService(pair.ep_b)) as b,
        ):
            b.register_handler(lambda peer: b.reply(1), index=0)
            a.register_handler(lambda peer: a.reply(1), index=1)  # a reply handler replying
            a.request_nowait(pair.ch_a, 0)
            assert b.poll() == 1
            with pytest.raises(LocalProtocolError, match="reply handler may not reply"):
                a.poll()
            with pytest.raises(LocalProtocolError, match="only from a request handler"):
                a.reply(1)


async def test_lean_message_face_keeps_order() -> None:
    layer = UamLayer()
    with ShmNetwork() as network, trio.fail_after(30):
        pair = make_shm_pair(network)
        async with layer.open(UNetService(pair.ep_a)) as a, layer.open(UNetService(pair.ep_b)) as b:
            sizes = [0, 1, 40, 5000, 40, 70000, 3]
            for index, size in enumerate(sizes):
                await a.send(pair.ch_a, bytes([index]) * size)
            for index, size in enumerate(sizes):
                assert await b.recv() == (pair.ch_b, bytes([index]) * size)


def test_uam_benchmark_runs_with_tiny_counts() -> None:
    from stacklib.bench.real import uam_pingpong

    assert 0 < uam_pingpong(20, "message", "trio", warmup=5) < 1
    with pytest.raises(ValueError, match="no UAM benchmark"):
        uam_pingpong(20, "message", "poll")
