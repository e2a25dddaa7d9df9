"""Generic AM: the reply rules, token flow control, handlers run by polling."""

from __future__ import annotations

import trio

from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import Gam, GamParams, LibraryError
from stacklib.transports.sim.myrinet_libs.gam import Token
from tests.transports.myrinet_libs.conftest import simulate


def test_a_request_handler_replies_and_the_reply_handler_runs_at_the_requester() -> None:
    async def body(cluster: Lanai4Cluster) -> list[tuple[int, bytes]]:
        a, b = Gam.open(cluster)
        replies: list[tuple[int, bytes]] = []
        got = a.register_reply(lambda token, data: replies.append((token.src, data)))
        double = b.register_request(lambda token, data: token.reply(got, data * 2))
        a.register_request(lambda token, data: None)
        b.register_reply(lambda token, data: None)
        await a.request(1, double, b"ab")
        while not b.statistics().get("requests", 0) and not replies:
            await trio.sleep(1e-6)
            await b.poll()
            await a.poll()
        return replies

    assert simulate(body) == [(1, b"abab")]


def test_the_reply_rules_are_enforced() -> None:
    async def body(cluster: Lanai4Cluster) -> list[str]:
        a, b = Gam.open(cluster)
        errors: list[str] = []

        def twice(token: Token, data: bytes) -> None:
            token.reply(0)
            try:
                token.reply(0)
            except LibraryError as error:
                errors.append(str(error))

        def answer(token: Token, data: bytes) -> None:
            token.reply(echo_back)

        def from_reply(token: Token, data: bytes) -> None:
            try:
                token.reply(0)
            except LibraryError as error:
                errors.append(str(error))

        h_twice = b.register_request(twice)
        h_answer = b.register_request(answer)
        echo_back = a.register_reply(from_reply)
        await a.request(1, h_twice)
        await a.request(1, h_answer)
        for _ in range(50):
            await trio.sleep(2e-6)
            await b.poll()
            await a.poll()
        return errors

    errors = simulate(body)
    assert any("reply only once" in e for e in errors)
    assert any("reply handler may not reply" in e for e in errors)


def test_handlers_may_not_send_requests() -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        a, b = Gam.open(cluster)
        caught: list[BaseException] = []

        def greedy(token: Token, data: bytes) -> None:
            # A handler cannot await, and the library refuses a request from inside one.
            coroutine = b.request(0, 0, b"")
            try:
                coroutine.send(None)
            except LibraryError as error:
                caught.append(error)
            finally:
                coroutine.close()

        handler = b.register_request(greedy)
        await a.request(1, handler)
        await trio.sleep(1e-3)
        await b.poll()
        assert caught and "may not send a request" in str(caught[0])

    simulate(body)


def test_tokens_hold_back_a_sender_until_replies_return() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[float, float]:
        a, b = Gam.open(cluster, GamParams(tokens=2))
        start = trio.current_time()
        await a.request(1, 0, b"1")
        await a.request(1, 0, b"2")
        two = trio.current_time() - start

        async def serve() -> None:
            await trio.sleep(1e-3)  # the receiver polls only after 1 ms
            await b.poll()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await a.request(1, 0, b"3")  # no token left: polls until a reply is back
        return two, trio.current_time() - start

    two, three = simulate(body)
    assert two < 20e-6
    assert three > 1e-3


def test_an_unanswered_request_gets_an_automatic_reply() -> None:
    async def body(cluster: Lanai4Cluster) -> dict[str, object]:
        a, b = Gam.open(cluster, GamParams(tokens=1))
        for _ in range(3):  # would block forever without replies
            await a.request(1, 0, b"x")
            await trio.sleep(1e-4)
            await b.poll()
        return dict(b.statistics())

    assert simulate(body)["automatic_replies"] == 3


def test_a_request_for_an_unknown_handler_is_dropped_and_counted() -> None:
    async def body(cluster: Lanai4Cluster) -> dict[str, object]:
        a, b = Gam.open(cluster)
        await a.request(1, 99, b"?")
        await trio.sleep(1e-3)
        await b.poll()
        return dict(b.statistics())

    assert simulate(body)["lost.unknown_handler"] == 1


def test_a_long_request_holds_the_bulk_buffer_until_its_reply_returns() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[float, float]:
        a, b = Gam.open(cluster)
        start = trio.current_time()
        await a.request(1, 0, bytes(4096))
        first = trio.current_time() - start

        async def serve() -> None:
            await trio.sleep(1e-3)  # the receiver polls only after 1 ms
            await b.poll()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await a.request(1, 0, bytes(4096))  # waits for the first store's reply
        return first, trio.current_time() - start

    first, second = simulate(body)
    assert first < 200e-6  # copy and DMA out, no round trip
    assert second > 1e-3


def test_short_requests_do_not_wait_for_the_bulk_buffer() -> None:
    async def body(cluster: Lanai4Cluster) -> float:
        a, _ = Gam.open(cluster)
        await a.request(1, 0, bytes(4096))
        start = trio.current_time()
        await a.request(1, 0, b"short")
        return trio.current_time() - start

    assert simulate(body) < 20e-6


def test_messages_over_one_store_arrive_whole_while_both_nodes_send_and_receive() -> None:
    message = bytes(range(256)) * 1024  # 256 KB: two stores of eight fragments each

    async def body(cluster: Lanai4Cluster) -> list[bytes]:
        libs = Gam.open(cluster)
        got: list[bytes] = []

        async def sender(lib: Gam) -> None:
            for data in (message, message[::-1]):
                await lib.send(1 - lib.index, data)

        async def node(lib: Gam) -> None:
            # The receiving task's polls take the replies the sending task waits for.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender, lib)
                for _ in range(2):
                    got.append((await lib.recv())[1])

        with trio.fail_after(1.0):
            async with trio.open_nursery() as nursery:
                for lib in libs:
                    nursery.start_soon(node, lib)
        return got

    got = simulate(body)
    assert got.count(message) == 2 and got.count(message[::-1]) == 2


def test_a_request_over_the_largest_store_is_refused() -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        a, _ = Gam.open(cluster)
        await a.request(1, 0, bytes(a.params.max_request + 1))

    try:
        simulate(body)
    except LibraryError as error:
        assert "at most" in str(error)
    else:
        raise AssertionError("an oversized request was sent")


def test_a_piece_out_of_order_is_dropped_not_joined() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[list[bytes], object]:
        _, b = Gam.open(cluster)

        def piece(index: int, count: int, data: bytes) -> None:
            b._deliver(Token(b, 0, True, (index, count)), data)

        piece(0, 2, b"a")
        piece(0, 3, b"x")  # a new message's first piece: the half-joined one is dropped
        piece(1, 3, b"y")
        piece(2, 3, b"z")
        piece(1, 2, b"b")  # a middle piece with nothing before it
        got = [data for _, data in b._inbox]
        return got, b.statistics()["lost.piece_out_of_order"]

    assert simulate(body) == ([b"xyz"], 2)
