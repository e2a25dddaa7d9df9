"""Closing the trio way: a closed endpoint raises a trio.ClosedResourceError, iteration ends."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from stacklib.errors import ChannelError, EndpointClosed, PeerGone, UNetError
from stacklib.services import UNetService
from stacklib.unet import SendDescriptor

from .conftest import Pair


def test_the_closing_errors_are_trio_s_and_stacklib_s() -> None:
    assert issubclass(EndpointClosed, trio.ClosedResourceError)
    assert issubclass(EndpointClosed, UNetError)
    assert issubclass(PeerGone, trio.BrokenResourceError)
    assert issubclass(PeerGone, ChannelError)
    assert not issubclass(PeerGone, trio.ClosedResourceError)


async def test_every_operation_on_a_closed_endpoint_raises_closed_resource(pair: Pair) -> None:
    await pair.ep_b.aclose()
    endpoint, channel = pair.ep_b, pair.ch_b
    with pytest.raises(trio.ClosedResourceError, match="closed"):
        await endpoint.send(channel, b"late")
    with pytest.raises(trio.ClosedResourceError):
        endpoint.send_nowait(channel, b"late")
    with pytest.raises(trio.ClosedResourceError):
        await endpoint.recv()
    with pytest.raises(trio.ClosedResourceError):
        endpoint.recv_nowait()
    with pytest.raises(trio.ClosedResourceError):
        endpoint.post_nowait(SendDescriptor(channel, (), b"late"))
    with pytest.raises(EndpointClosed):
        await endpoint.post(SendDescriptor(channel, (), b"late"))
    assert endpoint.poll() is None  # polling drains; it never raises


async def test_a_blocked_receiver_wakes_with_closed_resource(pair: Pair) -> None:
    caught: list[BaseException] = []

    async def receiver() -> None:
        try:
            await pair.ep_b.recv()
        except trio.ClosedResourceError as error:
            caught.append(error)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await trio.testing.wait_all_tasks_blocked()
        pair.ep_b.close()
    assert len(caught) == 1 and isinstance(caught[0], EndpointClosed)


@pytest.mark.parametrize("over", ["endpoint", "service"])
async def test_async_for_ends_cleanly_when_the_endpoint_closes(pair: Pair, over: str) -> None:
    got: list[bytes] = []
    service = UNetService(pair.ep_b)

    async def consumer() -> None:
        if over == "endpoint":
            async for message in pair.ep_b:
                got.append(message.data)
        else:
            async for _, data in service:
                got.append(data)
        got.append(b"<end>")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.testing.wait_all_tasks_blocked()
        await pair.ep_a.send(pair.ch_a, b"one")
        await pair.ep_a.send(pair.ch_a, b"two")
        await trio.testing.wait_all_tasks_blocked()
        await pair.ep_b.aclose()
    assert got == [b"one", b"two", b"<end>"]


async def test_async_for_over_a_service_does_not_hide_a_peer_that_left(pair: Pair) -> None:
    class Broken(UNetService):
        async def recv(self) -> tuple[int, bytes]:
            raise PeerGone("the peer left")

    with pytest.raises(PeerGone):
        async for _ in Broken(pair.ep_b):
            pass
