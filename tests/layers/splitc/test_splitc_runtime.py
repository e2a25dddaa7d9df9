"""The Split-C runtime over UAM: scalar, split-phase, one-way and bulk accesses, bounds errors,
collectives under loss, both faces, the layer, determinism of simulated times."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio

from stacklib.bench.splitc.cluster import run_spmd
from stacklib.errors import AssemblyError, LocalProtocolError
from stacklib.layers.splitc import (
    GlobalPtr,
    SplitC,
    SplitcAccessError,
    SplitcLayer,
    SplitcParams,
    SpreadArray,
)
from stacklib.layers.uam import UamParams
from stacklib.services import UNetService
from stacklib.stack import layer_class, open_stack
from stacklib.transports.memory import MemoryNetwork
from stacklib.transports.sim.params import FaultParams
from stacklib.unet import connect


async def scalars(sc: SplitC) -> dict[str, Any]:
    await sc.all_spread("a", 8, np.int64)
    await sc.all_alloc("f", 4, np.float64)
    sc.local("a")[:] = np.arange(8) + 100 * sc.rank
    await sc.barrier()
    peer = (sc.rank + 1) % sc.size
    out: dict[str, Any] = {"read": await sc.read(sc.ptr(peer, "a", 3))}
    await sc.write(sc.ptr(peer, "f", 1), 0.5 + sc.rank)
    pending = await sc.get(sc.ptr(peer, "a") + 5)
    put = await sc.put(sc.ptr(peer, "a", 6), -1 - sc.rank)
    await sc.sync()
    out["get"] = pending.value
    out["put_done"] = put.done
    await sc.store(sc.ptr(peer, "a", 7), 7000 + sc.rank)
    await sc.store_sync(8)
    out["sum"] = await sc.all_reduce(sc.rank + 1)
    out["max"] = await sc.all_reduce(np.array([sc.rank, -sc.rank]), "max")
    out["bcast"] = await sc.broadcast(42 if sc.rank == 2 else 0, root=2)
    out["gather"] = await sc.all_gather(sc.rank * 10)
    await sc.barrier()
    out["a"] = sc.local("a").tolist()
    out["f"] = sc.local("f").tolist()
    return out


@pytest.mark.parametrize("transport", ["memory", "sim-atm", "sim-fe"])
def test_scalar_accesses_and_collectives(transport: str) -> None:
    run = run_spmd(scalars, 3, transport)
    for rank, out in enumerate(run.results):
        before = (rank - 1) % 3
        assert out["read"] == 100 * ((rank + 1) % 3) + 3
        assert out["get"] == 100 * ((rank + 1) % 3) + 5
        assert out["put_done"]
        assert out["a"][6] == -1 - before
        assert out["a"][7] == 7000 + before
        assert out["f"][1] == 0.5 + before
        assert out["sum"] == 6
        assert out["max"].tolist() == [2, 0]
        assert out["bcast"] == 42
        assert out["gather"] == [0, 10, 20]


async def bulk(sc: SplitC) -> dict[str, Any]:
    n = 20_000  # 160 KB: many 4160-byte UAM chunks
    await sc.all_alloc("buf", 3 * n, np.float64)
    peer = (sc.rank + 1) % sc.size
    data = np.arange(n, dtype=np.float64) * (sc.rank + 1)
    await sc.bulk_write(sc.ptr(peer, "buf", 0), data)
    put = await sc.bulk_put(sc.ptr(peer, "buf", n), data[::-1])
    states = [put.done]  # remote: acknowledged only at sync
    await sc.sync()
    states.append(put.done)
    assert states == [False, True]
    await sc.barrier()
    got = await sc.bulk_get(sc.ptr(sc.rank, "buf", 2 * n), sc.ptr(peer, "buf", 0), n)
    await sc.sync()
    assert got.done
    await sc.bulk_store(sc.ptr(peer, "buf", 2 * n - 10), np.full(10, 9.0))
    await sc.store_sync(80)
    await sc.barrier()
    return {"buf": sc.local("buf").copy()}


@pytest.mark.parametrize("transport", ["memory", "sim-atm"])
def test_bulk_transfers(transport: str) -> None:
    n = 20_000
    run = run_spmd(bulk, 3, transport)
    for rank, out in enumerate(run.results):
        before = (rank - 1) % 3
        buf = out["buf"]
        expected = np.arange(n, dtype=np.float64) * (before + 1)
        assert np.array_equal(buf[:n], expected)
        assert np.array_equal(buf[n : 2 * n - 10], expected[::-1][:-10])
        assert np.all(buf[2 * n - 10 : 2 * n] == 9.0)
        # our own get of the next rank's first block: what we wrote there
        assert np.array_equal(buf[2 * n :], np.arange(n, dtype=np.float64) * (rank + 1))


def test_a_get_is_not_complete_before_sync() -> None:
    async def program(sc: SplitC) -> list[bool]:
        await sc.all_alloc("x", 4, np.int32)
        sc.local("x")[:] = sc.rank + 1
        await sc.barrier()
        seen = []
        if sc.rank == 0:
            pending = await sc.get(sc.ptr(1, "x", 2))
            seen.append(pending.done)
            with pytest.raises(LocalProtocolError, match="sync"):
                _ = pending.value
            seen.append(sc.done)
            await sc.sync()
            seen.append(pending.done and pending.value == 2 and sc.done)
        return seen

    run = run_spmd(program, 2, "sim-atm")
    assert run.results[0] == [False, False, True]


def test_store_sync_counts_bytes() -> None:
    async def program(sc: SplitC) -> list[Any]:
        await sc.all_alloc("x", 100, np.int64)
        seen: list[Any] = []
        if sc.rank == 1:
            for i in range(3):
                await sc.store(sc.ptr(0, "x", i), i + 1)
            await sc.bulk_store(sc.ptr(0, "x", 10), np.arange(50))
        else:
            # 3 x 8 + 400 bytes are coming; more than that never arrives
            with trio.move_on_after(0.05) as scope:
                await sc.store_sync(3 * 8 + 400 + 8)
            seen.append(scope.cancelled_caught)
            seen.append(sc.stored)
            await sc.store_sync(3 * 8 + 400)
            seen.append(sc.stored)
            seen.append(sc.local("x")[:3].tolist())
            seen.append(sc.local("x")[10:60].tolist() == list(range(50)))
        await sc.all_store_sync()
        seen.append(sc.stored)
        return seen

    run = run_spmd(program, 2, "sim-atm")
    assert run.results[0] == [True, 424, 0, [1, 2, 3], True, 0]


def test_remote_access_outside_the_region_is_an_error_and_the_target_is_unharmed() -> None:
    async def program(sc: SplitC) -> Any:
        await sc.all_alloc("x", 4, np.int64)
        await sc.all_alloc("small", 2, np.int64)
        sc.local("x")[:] = [1, 2, 3, 4]
        sc.local("small")[:] = [5, 6]
        await sc.barrier()
        if sc.rank == 0:
            with pytest.raises(SplitcAccessError, match="out of bounds"):
                await sc.read(sc.ptr(1, "x", 4))
            with pytest.raises(SplitcAccessError, match="out of bounds"):
                await sc.write(sc.ptr(1, "small", 2), 99)
            pending = await sc.get(sc.ptr(1, "x", 1000))
            with pytest.raises(SplitcAccessError):
                await sc.sync()
            with pytest.raises(SplitcAccessError):
                _ = pending.value
            with pytest.raises(SplitcAccessError, match="negative"):
                await sc.read(sc.ptr(1, "x", -1))
            with pytest.raises(SplitcAccessError, match="outside its 4 elements"):
                await sc.bulk_put(sc.ptr(1, "x", 2), np.zeros(3))
            with pytest.raises(SplitcAccessError):
                await sc.bulk_get(sc.ptr(0, "x", 0), sc.ptr(1, "small", 1), 2)
            with pytest.raises(SplitcAccessError):
                await sc.store(sc.ptr(1, "small", 2), 1)
            await sc.sync()  # errors were reported once
            assert await sc.read(sc.ptr(1, "x", 3)) == 4  # still works
        await sc.barrier()
        return sc.local("x").tolist(), sc.local("small").tolist(), sc.counters["refused"]

    run = run_spmd(program, 2, "sim-atm")
    assert run.results[1][:2] == ([1, 2, 3, 4], [5, 6])
    assert run.results[1][2] == 3  # the target refused read, write and get


def test_local_accesses_never_touch_the_network() -> None:
    async def program(sc: SplitC) -> Any:
        await sc.all_alloc("x", 100, np.int64)
        await sc.barrier()
        sent = int(sc.am.statistics()["sent"])  # type: ignore[call-overload]
        me = sc.ptr(sc.rank, "x")
        await sc.write(me + 1, 5)
        value = await sc.read(me + 1)
        pending = await sc.get(me + 1)
        assert pending.done  # a local get completes at once
        await sc.put(me + 2, 6)
        await sc.store(me + 3, 7)
        await sc.bulk_write(me + 10, np.arange(20))
        await sc.bulk_read(me + 50, me + 10, 20)
        await sc.sync()
        await sc.store_sync(8)
        now_sent = int(sc.am.statistics()["sent"])  # type: ignore[call-overload]
        return value, now_sent - sent, sc.local("x")[50:70].tolist()

    for value, sent, copied in run_spmd(program, 2, "sim-atm").results:
        assert (value, sent, copied) == (5, 0, list(range(20)))


@pytest.mark.parametrize(("transport", "loss"), [("sim-atm", 0.004), ("sim-fe", 0.05)])
def test_barrier_and_all_reduce_under_loss(transport: str, loss: float) -> None:
    async def program(sc: SplitC) -> list[Any]:
        out = []
        for i in range(5):
            await sc.barrier()
            out.append(await sc.all_reduce(np.arange(300) * (sc.rank + i), "sum"))
        return out

    # Loss is per unit: on ATM per cell, so a 2.4 KB reduction PDU (51 cells) is lost 1 time
    # in 5; on Fast Ethernet per frame.
    run = run_spmd(program, 4, transport, faults=FaultParams(loss=loss), seed=3)
    for out in run.results:
        for i, total in enumerate(out):
            assert total.tolist() == (np.arange(300) * (6 + 4 * i)).tolist()
    retransmitted = sum(s["uam"]["retransmitted"] for s in run.statistics)
    assert retransmitted > 0


def test_simulated_times_are_deterministic() -> None:
    first = run_spmd(scalars, 3, "sim-atm", seed=5).elapsed
    second = run_spmd(scalars, 3, "sim-atm", seed=5).elapsed
    assert first == second > 0


def test_compute_holds_the_simulated_cpu() -> None:
    async def program(sc: SplitC) -> float:
        start = trio.current_time()
        await sc.compute(0.25)
        return trio.current_time() - start

    run = run_spmd(program, 2, "sim-atm")
    assert run.results == pytest.approx([0.25, 0.25], rel=0.01)  # plus protocol work
    with pytest.raises(LocalProtocolError, match="negative"):
        run_spmd(lambda sc: sc.compute(-1.0), 1, "sim-atm")


def test_polling_face_without_background_poll() -> None:
    async def program(sc: SplitC) -> Any:
        await sc.all_alloc("x", 64, np.int32)
        sc.local("x")[:] = np.arange(64) * (sc.rank + 1)
        await sc.barrier()
        peer = 1 - sc.rank

        def retry(start: Any) -> Any:
            async def attempt() -> Any:
                while True:
                    try:
                        return start()
                    except trio.WouldBlock:
                        sc.poll()
                        await trio.sleep(1e-5)  # virtual time passes only while we wait

            return attempt()

        handles = [await retry(lambda i=i: sc.get_nowait(sc.ptr(peer, "x", i))) for i in range(64)]
        await retry(lambda: sc.put_nowait(sc.ptr(peer, "x", 0), -5))
        await retry(lambda: sc.store_nowait(sc.ptr(peer, "x", 1), -6))
        while not sc.done:
            sc.poll()
            await trio.sleep(1e-5)
        await sc.store_sync(4)
        await sc.barrier()
        return [h.value for h in handles], sc.local("x")[:2].tolist()

    run = run_spmd(program, 2, "sim-atm", uam=UamParams(background_poll=False, window=4))
    for rank, (values, head) in enumerate(run.results):
        peer = 1 - rank
        assert values == [i * (peer + 1) for i in range(64)]
        assert head == [-5, -6]


def test_split_phase_context_manager_and_spread_arrays() -> None:
    async def program(sc: SplitC) -> Any:
        spread = await sc.all_spread("s", 5, np.int64)
        sc.local("s")[:] = [sc.rank * 100 + i for i in range(5)]
        await sc.barrier()
        async with sc.split_phase() as same:
            assert same is sc
            handles = [await sc.get(spread[i]) for i in range(len(spread))]
        assert all(h.done for h in handles)
        # An error inside the block leaves without the sync: the refused get's error is
        # still for the next sync to raise.
        with pytest.raises(KeyError, match="inside"):
            async with sc.split_phase():
                await sc.get(sc.ptr((sc.rank + 1) % 3, "s", 99))
                raise KeyError("inside")
        with pytest.raises(SplitcAccessError, match="refused"):
            await sc.sync()
        return [h.value for h in handles]

    run = run_spmd(program, 3, "memory")
    # cyclic: element i on rank i % 3 at i // 3
    assert run.results[0] == [(i % 3) * 100 + i // 3 for i in range(15)]
    block = SpreadArray("s", 3, 5, "block")
    assert block[7] == GlobalPtr(1, "s", 2)
    with pytest.raises(IndexError):
        block[15]
    assert GlobalPtr(1, "s", 2) - 2 == GlobalPtr(1, "s", 0)


def test_misuse_raises_naming_the_problem() -> None:
    async def program(sc: SplitC) -> None:
        await sc.all_alloc("x", 4, np.int64)
        await sc.all_alloc("wide", 4, np.complex128)
        with pytest.raises(LocalProtocolError, match="no region 'y'"):
            sc.ptr(0, "y")
        with pytest.raises(LocalProtocolError, match="already registered"):
            await sc.all_alloc("x", 4, np.int64)
        with pytest.raises(LocalProtocolError, match="1, 2, 4, 8"):
            await sc.read(sc.ptr(1 - sc.rank, "wide"))
        with pytest.raises(LocalProtocolError, match="not on this rank"):
            await sc.bulk_get(sc.ptr(1 - sc.rank, "x"), sc.ptr(sc.rank, "x"), 1)
        with pytest.raises(LocalProtocolError, match="unknown reduction"):
            await sc.all_reduce(1, "median")
        with pytest.raises(LocalProtocolError, match="C-contiguous"):
            await sc.all_register("strided", np.zeros((4, 4))[:, 1])

    run_spmd(program, 2, "memory")


def test_the_layer_in_a_stack() -> None:
    assert layer_class("splitc") is SplitcLayer
    with pytest.raises(ValueError, match="rank"):
        SplitcParams(rank=-1)

    async def main() -> list[int]:
        network = MemoryNetwork()
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("r0"))
        ep_b = b.os.create_endpoint(b.os.process("r1"))
        connect(ep_a, ep_b)
        from stacklib.layers.uam import UamLayer

        results = [0, 0]

        async def rank(r: int, ep: Any) -> None:
            layers = [UamLayer(), SplitcLayer(SplitcParams(rank=r))]
            async with open_stack(UNetService(ep), layers) as service:
                assert isinstance(service, SplitC)
                await service.all_alloc("v", 1, np.int64)
                service.local("v")[0] = 10 + r
                await service.barrier()
                results[r] = await service.read(service.ptr(1 - r, "v"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rank, 0, ep_a)
            nursery.start_soon(rank, 1, ep_b)
        return results

    assert trio.run(main) == [11, 10]

    async def wrong() -> None:
        network = MemoryNetwork()
        node = network.add_node("a")
        ep = node.os.create_endpoint(node.os.process("p"))
        async with SplitcLayer().open(UNetService(ep)):
            pass

    with pytest.raises(AssemblyError):
        trio.run(wrong)
