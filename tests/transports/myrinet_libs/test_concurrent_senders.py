"""Two tasks sending long messages to the same peer at once: every library delivers each
message whole (a library that cuts messages into packets sends one message's packets
together), and a piece out of order is dropped, never joined to another message."""

from __future__ import annotations

import pytest
import trio

from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import LIBRARIES
from stacklib.transports.sim.myrinet_libs.transport import open_library
from tests.transports.myrinet_libs.conftest import simulate


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_concurrent_long_messages_to_one_peer_arrive_whole(name: str) -> None:
    cls = LIBRARIES[name]

    async def body(cluster: Lanai4Cluster) -> tuple[list[bytes], list[bytes]]:
        a, b = open_library(cluster, cls)
        size = min(a.max_message, 40_000)  # several packets or pieces in every library
        sent = [bytes([1]) * size, bytes([2]) * (size - 7), b"short"]
        got: list[bytes] = []

        async def receive() -> None:
            for _ in sent:
                got.append((await b.recv())[1])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            for message in sent:
                nursery.start_soon(a.send, 1, message)
        return got, sent

    got, sent = simulate(body)
    assert sorted(got) == sorted(sent)


def test_join_piece_drops_a_piece_out_of_order() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[list[bytes | None], object]:
        lib = open_library(cluster, LIBRARIES["pm"])[1]
        joined = [
            lib.join_piece(0, (0, 2), b"a"),
            lib.join_piece(0, (0, 3), b"x"),  # a new first piece: "a" is dropped
            lib.join_piece(0, (1, 3), b"y"),
            lib.join_piece(0, (2, 3), b"z"),
            lib.join_piece(0, (1, 2), b"b"),  # nothing before it
            lib.join_piece(1, (0, 1), b"alone"),
        ]
        return joined, lib.statistics()["lost.piece_out_of_order"]

    assert simulate(body) == ([None, None, None, b"xyz", None, b"alone"], 2)
