"""Upcalls on "receive queue non-empty" and "almost full" (paper 000 §3.1)."""

from __future__ import annotations

import pytest

from stacklib.errors import UNetError
from stacklib.unet import Endpoint, EndpointConfig, Message, UpcallCondition

from .conftest import Pair, make_pair


async def test_non_empty_upcall_runs_on_arrival_and_may_consume_everything(pair: Pair) -> None:
    seen: list[list[bytes]] = []

    def handler(ep: Endpoint) -> None:
        batch = []
        while (message := ep.poll()) is not None:
            batch.append(message.data)
        seen.append(batch)

    pair.ep_b.set_upcall(UpcallCondition.NON_EMPTY, handler)
    await pair.ep_a.send(pair.ch_a, b"1")
    await pair.ep_a.send(pair.ch_a, b"2")
    assert seen == [[b"1"], [b"2"]]
    assert pair.ep_b.statistics().upcalls == 2


async def test_disabled_upcalls_form_a_critical_section_and_fire_once_on_exit(pair: Pair) -> None:
    seen: list[list[bytes]] = []

    def handler(ep: Endpoint) -> None:
        seen.append([m.data for m in iter(ep.poll, None)])

    pair.ep_b.set_upcall(UpcallCondition.NON_EMPTY, handler)
    with pair.ep_b.upcalls_disabled():
        for i in range(3):
            await pair.ep_a.send(pair.ch_a, bytes([i]))
        assert seen == []  # atomic with respect to message reception
        with pair.ep_b.upcalls_disabled():  # nests
            pass
        assert seen == []
    assert seen == [[b"\x00", b"\x01", b"\x02"]]  # one upcall consumed all pending messages
    assert pair.ep_b.statistics().upcalls == 1


async def test_almost_full_upcall_takes_precedence_at_the_threshold() -> None:
    p = make_pair(EndpointConfig(recv_queue=8, almost_full=3))
    events: list[tuple[str, int]] = []
    p.ep_b.set_upcall(UpcallCondition.NON_EMPTY, lambda ep: events.append(("non-empty", 0)))

    def drain(ep: Endpoint) -> None:
        events.append(("almost-full", len(ep.recv_queue)))
        while ep.poll() is not None:
            pass

    p.ep_b.set_upcall(UpcallCondition.ALMOST_FULL, drain)
    for i in range(4):
        await p.ep_a.send(p.ch_a, bytes([i]))
    # The non-empty handler leaves messages queued; at three queued, almost-full fires.
    assert events == [("non-empty", 0), ("non-empty", 0), ("almost-full", 3), ("non-empty", 0)]


async def test_reply_from_an_upcall_does_not_recurse_or_duplicate() -> None:
    p = make_pair()
    log: list[tuple[str, bytes]] = []

    def bounce(name: str, channel: int, limit: int) -> object:
        def handler(ep: Endpoint) -> None:
            while (message := ep.poll()) is not None:
                log.append((name, message.data))
                count = int.from_bytes(message.data, "big")
                if count < limit:
                    ep.send_nowait(channel, (count + 1).to_bytes(2, "big"))

        return handler

    p.ep_a.set_upcall(UpcallCondition.NON_EMPTY, bounce("a", p.ch_a, 200))
    p.ep_b.set_upcall(UpcallCondition.NON_EMPTY, bounce("b", p.ch_b, 200))
    await p.ep_a.send(p.ch_a, (0).to_bytes(2, "big"))
    counts = [int.from_bytes(data, "big") for _, data in log]
    assert counts == list(range(201))  # each exchanged exactly once, in order
    assert [name for name, _ in log[:4]] == ["b", "a", "b", "a"]


async def test_handler_errors_are_counted_and_reported_to_the_owner(pair: Pair) -> None:
    def broken(ep: Endpoint) -> None:
        raise RuntimeError("bug in handler")

    pair.ep_b.set_upcall(UpcallCondition.NON_EMPTY, broken)
    await pair.ep_a.send(pair.ch_a, b"x")  # the sender is not disturbed
    assert pair.ep_b.statistics().upcall_errors == 1
    with pytest.raises(UNetError, match="bug in handler"):
        pair.ep_b.poll()
    pair.ep_b.set_upcall(UpcallCondition.NON_EMPTY, None)
    message = pair.ep_b.poll()
    assert isinstance(message, Message) and message.data == b"x"


async def test_registering_an_upcall_with_messages_pending_fires_it(pair: Pair) -> None:
    await pair.ep_a.send(pair.ch_a, b"early")
    got: list[bytes] = []
    pair.ep_b.set_upcall(
        UpcallCondition.NON_EMPTY, lambda ep: got.extend(m.data for m in iter(ep.poll, None))
    )
    assert got == [b"early"]
