"""VMMC-2: deposits with no receive call, overwriting without flow control, Or = 0."""

from __future__ import annotations

import pytest
import trio

from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import LibraryError, Vmmc, VmmcParams
from tests.transports.myrinet_libs.conftest import simulate


def test_a_deposit_lands_in_the_exported_buffer_without_a_receive_call() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[bytes, int]:
        a, b = Vmmc.open(cluster)
        exported = b.export("inbox", 64)
        remote = a.import_buffer(1, "inbox")
        await remote.deposit(8, b"hello")
        await trio.sleep(1e-3)
        return bytes(exported.data[:16]), exported.deposits

    data, deposits = simulate(body)
    assert data == bytes(8) + b"hello" + bytes(3)
    assert deposits == 1


def test_a_second_deposit_overwrites_the_first_unseen() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[bytes, int]:
        a, b = Vmmc.open(cluster)
        exported = b.export("slot", 8)
        remote = a.import_buffer(1, "slot")
        await remote.deposit(0, b"AAAAAAAA")
        await remote.deposit(0, b"BBBB")  # no flow control: nothing waits for the reader
        await trio.sleep(1e-3)
        return bytes(exported.data), exported.deposits

    assert simulate(body) == (b"BBBBAAAA", 2)


def test_a_fast_sender_laps_the_datagram_ring_and_the_receiver_counts_it() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[list[bytes], dict[str, object]]:
        a, b = Vmmc.open(cluster, VmmcParams(slots=4))
        for i in range(10):
            await a.send(1, bytes([i]) * 8)
        await trio.sleep(1e-3)
        got = [(await b.recv())[1] for _ in range(4)]
        return got, dict(b.statistics())

    got, stats = simulate(body)
    assert got == [bytes([i]) * 8 for i in range(6, 10)]
    assert stats["lost.overwritten"] == 6


def test_receiving_costs_the_host_nothing() -> None:
    async def body(cluster: Lanai4Cluster) -> float:
        a, b = Vmmc.open(cluster)
        await a.send(1, bytes(4096))
        await b.recv()
        return cluster.node_list[1].cpu.busy_time

    assert simulate(body) == 0.0


def test_misuse_names_the_problem() -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        a, b = Vmmc.open(cluster)
        b.export("x", 16)
        with pytest.raises(LibraryError, match="already exported"):
            b.export("x", 16)
        with pytest.raises(LibraryError, match="no buffer 'y'"):
            a.import_buffer(1, "y")
        with pytest.raises(LibraryError, match="outside"):
            await a.import_buffer(1, "x").deposit(12, b"12345")

    simulate(body)
