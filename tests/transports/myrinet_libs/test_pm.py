"""PM-1.2: one gang-scheduled job owns the NI at a time; DMA always."""

from __future__ import annotations

import pytest
import trio

from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import LibraryError, Pm, PmDaemon
from tests.transports.myrinet_libs.conftest import send_overheads, simulate


def test_only_the_scheduled_job_may_use_the_ni() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[bytes, bytes]:
        daemon = PmDaemon(cluster)
        a1, b1 = daemon.open("one")
        a2, b2 = daemon.open("two")
        assert daemon.scheduled == "one"
        await a1.send(1, b"first")
        with pytest.raises(LibraryError, match="'two' is not scheduled"):
            await a2.send(1, b"too early")
        daemon.schedule("two")
        with pytest.raises(LibraryError, match="'one' is not scheduled"):
            await a1.send(1, b"too late")
        await a2.send(1, b"second")
        # Each job's messages land in its own system buffers.
        return (await b1.recv())[1], (await b2.recv())[1]

    assert simulate(body) == (b"first", b"second")


def test_unknown_and_duplicate_jobs_are_refused() -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        daemon = PmDaemon(cluster)
        daemon.open("one")
        with pytest.raises(LibraryError, match="already open"):
            daemon.open("one")
        with pytest.raises(LibraryError, match="no job 'nine'"):
            daemon.schedule("nine")

    simulate(body)


def test_long_messages_are_packetized_and_reassembled() -> None:
    async def body(cluster: Lanai4Cluster) -> bytes:
        a, b = Pm.open(cluster)
        data = bytes(range(256)) * 400  # 102,400 bytes: 13 packets
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.send, 1, data)
            _, got = await b.recv()
        return got

    assert simulate(body) == bytes(range(256)) * 400


def test_sends_are_asynchronous_so_overhead_does_not_grow_with_size() -> None:
    async def body(cluster: Lanai4Cluster) -> list[float]:
        a, _ = Pm.open(cluster)
        return await send_overheads(a, (16, 8192))

    small, large = simulate(body)
    assert large == pytest.approx(small)
