"""FM-2.02: gather sends, a handler that starts on the first packet, sender-receiver credits."""

from __future__ import annotations

import pytest
import trio

from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import Fm, FmParams, LibraryError
from stacklib.transports.sim.myrinet_libs.fm import FmReceive
from tests.transports.myrinet_libs.conftest import send_overheads, simulate


def test_a_message_gathered_from_pieces_arrives_whole() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[int, bytes]:
        a, b = Fm.open(cluster)
        message = await a.begin_message(1, 9, 0)
        for piece in (b"abc", b"", b"defghi"):
            await message.piece(piece)
        await message.end()
        return await b.recv()

    assert simulate(body) == (0, b"abcdefghi")


def test_the_handler_starts_on_the_first_packet_while_the_rest_is_in_flight() -> None:
    size = 8 * 1024  # eight packets

    async def body(cluster: Lanai4Cluster) -> tuple[float, float, bytes]:
        a, b = Fm.open(cluster)
        seen: dict[str, float] = {}
        data = bytearray()

        async def handler(stream: FmReceive) -> None:
            seen["start"] = trio.current_time()
            data.extend(await stream.receive(stream.length))
            seen["end"] = trio.current_time()

        index = b.register(handler)
        a.register(handler)
        sent: dict[str, float] = {}

        async def sender() -> None:
            message = await a.begin_message(1, size, index)
            await message.piece(bytes(range(256)) * (size // 256))
            await message.end()
            sent["end"] = trio.current_time()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            while not await b.extract():
                await trio.sleep(1e-7)
        return seen["start"], sent["end"], bytes(data)

    start, send_end, data = simulate(body)
    assert start < send_end  # the sender is still writing later packets
    assert data == bytes(range(256)) * 32


def test_credits_stop_a_sender_whose_receiver_does_not_extract() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[int, int]:
        a, b = Fm.open(cluster, FmParams(credits=3))
        sent = 0

        async def sender() -> None:
            nonlocal sent
            for _ in range(5):
                await a.send(1, b"x" * 16)
                sent += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            await trio.sleep(1e-3)
            stalled = sent
            for _ in range(5):
                await b.recv()
        return stalled, sent

    assert simulate(body) == (3, 5)


def test_pieces_must_add_up_to_the_stated_length() -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        a, _ = Fm.open(cluster)
        message = await a.begin_message(1, 4, 0)
        with pytest.raises(LibraryError, match="exceed"):
            await message.piece(b"12345")
        await message.piece(b"12")
        with pytest.raises(LibraryError, match="2 of its 4"):
            await message.end()

    simulate(body)


def test_send_overhead_grows_with_size_because_every_byte_is_pio() -> None:
    async def body(cluster: Lanai4Cluster) -> list[float]:
        a, _ = Fm.open(cluster, FmParams(credits=1000))
        return await send_overheads(a, (16, 4096))

    small, large = simulate(body)
    assert large - small == pytest.approx(4080 / 88e6, rel=0.1)  # write-combined PIO rate
