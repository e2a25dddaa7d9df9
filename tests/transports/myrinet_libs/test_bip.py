"""BIP-0.92: data loss without a posted receive, the NI's small-message buffer, the knee."""

from __future__ import annotations

import pytest
import trio

from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import Bip, BipParams, LibraryError
from tests.transports.myrinet_libs.conftest import simulate


def test_a_posted_receive_gets_a_large_message() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[int, bytes]:
        a, b = Bip.open(cluster)
        async with trio.open_nursery() as nursery:
            got: list[tuple[int, bytes]] = []

            async def receive() -> None:
                got.append(await b.recv())

            nursery.start_soon(receive)
            await trio.sleep(1e-6)  # the receive is posted first
            await a.send(1, b"x" * 4096)
        return got[0]

    assert simulate(body) == (0, b"x" * 4096)


def test_a_large_message_without_a_posted_receive_is_lost_by_the_forward_reset() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[dict[str, object], bytes, float]:
        a, b = Bip.open(cluster)
        await a.send(1, b"x" * 1024)  # nobody receives at node 1: STOP, then forward reset
        await a.send(1, b"y" * 8)  # waits behind the stopped link
        await trio.sleep(0.1)
        _, data = await b.recv()
        return dict(b.statistics()), data, cluster.node_list[0].net_tx.busy_until

    stats, data, link_free = simulate(body)
    assert stats["resets"] == 1 and stats["lost.forward_reset"] == 1
    assert data == b"y" * 8  # communication resumed after the reset
    assert link_free > 0.05  # the sender was stopped for the 50 ms (paper 004 §4.1)


def test_small_unposted_messages_wait_in_the_ni_until_its_buffer_is_full() -> None:
    slots = 3

    async def body(cluster: Lanai4Cluster) -> tuple[list[bytes], dict[str, object]]:
        a, b = Bip.open(cluster, BipParams(small_buffer_slots=slots))
        for i in range(slots + 2):
            await a.send(1, bytes([i]) * 16)
        await trio.sleep(1e-3)
        got = [(await b.recv())[1] for _ in range(slots)]
        return got, dict(b.statistics())

    got, stats = simulate(body)
    assert got == [bytes([i]) * 16 for i in range(slots)]
    assert stats["lost.small_buffer_full"] == 2


def test_synchronized_large_messages_are_never_lost() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[int, dict[str, object]]:
        a, b = Bip.open(cluster, synchronize=True)
        count = 0

        async def receive() -> None:
            nonlocal count
            for _ in range(20):
                await b.recv()
                count += 1
                await trio.sleep(50e-6)  # a slow consumer

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            for _ in range(20):
                await a.send(1, bytes(2048))
        return count, dict(b.statistics())

    count, stats = simulate(body)
    assert count == 20 and "resets" not in stats


def rtt_half(size: int) -> float:
    async def body(cluster: Lanai4Cluster) -> float:
        a, b = Bip.open(cluster, synchronize=True)

        async def echo() -> None:
            for _ in range(5):
                _, data = await b.recv()
                await b.send(0, data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            start = trio.current_time()
            for _ in range(5):
                await a.send(1, bytes(size))
                await a.recv()
        return (trio.current_time() - start) / 10

    return simulate(body)


def test_pio_below_256_bytes_dma_from_256() -> None:
    assert 5e-6 < rtt_half(4) < 7e-6  # paper 004 §4.1.1: about 6 us
    assert rtt_half(256) < rtt_half(255)  # the knee: DMA beats non-combined PIO


def test_misuse_names_the_problem() -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        a, _ = Bip.open(cluster)
        with pytest.raises(LibraryError, match="not a peer"):
            await a.send(0, b"self")
        with pytest.raises(LibraryError, match="exceeds"):
            await a.send(1, bytes(a.max_message + 1))

    simulate(body)
