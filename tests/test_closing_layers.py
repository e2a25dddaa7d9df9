"""Closing trio's way at every layer: after a stack closes, sending raises a
``trio.ClosedResourceError`` and ``async for`` over the service ends cleanly."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import trio

from stacklib.layers.arq import ArqLayer
from stacklib.layers.ip import IpLayer, IpParams
from stacklib.layers.uam import UamLayer
from stacklib.layers.udp import UdpLayer
from stacklib.services import DatagramService
from stacklib.sim import Simulation
from stacklib.stack import Layer
from stacklib.testing import run_virtual, two_nodes


def _ip_udp(node: int) -> Sequence[Layer[Any]]:
    # two_nodes connects the two endpoints first: channel 0 at each end reaches the other.
    other = f"10.0.0.{2 - node}"
    return [IpLayer(IpParams(address=f"10.0.0.{node + 1}", peers={other: 0})), UdpLayer()]


STACKS: dict[str, Callable[[int], Sequence[Layer[Any]]]] = {
    "unet": lambda node: [],
    "arq": lambda node: [ArqLayer()],
    "uam": lambda node: [UamLayer()],
    "udp": _ip_udp,
    "arq over udp": lambda node: [*_ip_udp(node), ArqLayer()],
}


@pytest.mark.parametrize("stack", list(STACKS))
def test_after_close_send_raises_and_async_for_ends(stack: str) -> None:
    seen: dict[str, object] = {}

    async def main(sim: Simulation) -> None:
        async with two_nodes(sim, STACKS[stack]) as (a, b):
            top = a.service
            assert isinstance(top, DatagramService)
            await top.send(a.peer, b"before")
            _, data = await b.service.recv()  # type: ignore[attr-defined]
            seen["delivered"] = data
        if stack == "unet":  # no layer: raw U-Net closes with its endpoint
            assert a.endpoint is not None
            a.endpoint.close()
        with pytest.raises(trio.ClosedResourceError):
            await top.send(a.peer, b"after")
        seen["iterated"] = [data async for _, data in top]

    run_virtual(main)
    assert seen == {"delivered": b"before", "iterated": []}


@pytest.mark.parametrize("stack", [name for name in STACKS if name != "unet"])
def test_a_receiver_iterating_when_the_stack_closes_ends_cleanly(stack: str) -> None:
    received: list[bytes] = []
    ended = trio.Event()

    async def receive_all(service: DatagramService) -> None:
        async for _, data in service:
            received.append(data)
        ended.set()

    async def main(sim: Simulation) -> None:
        async with trio.open_nursery() as nursery:
            async with two_nodes(sim, STACKS[stack]) as (a, b):
                assert isinstance(b.service, DatagramService)
                nursery.start_soon(receive_all, b.service)
                await a.service.send(a.peer, b"one")  # type: ignore[attr-defined]
                while not received:
                    await trio.sleep(0.001)
            with trio.fail_after(1):
                await ended.wait()

    run_virtual(main)
    assert received == [b"one"]
