"""Stack assembly: services declared by layers must fit, or assembly names both sides; several
stacks open side by side."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from stacklib.errors import AssemblyError
from stacklib.services import DatagramService, ReliableService, Service, StreamService, UNetService
from stacklib.stack import Layer, check_fit, open_stack, open_stacks

from .unet.conftest import make_pair


@attrs.frozen
class NoParams:
    pass


class Upper(DatagramService):
    """Upper-cases what it sends: a trivial layer to check composition order."""

    def __init__(self, below: DatagramService, tag: bytes) -> None:
        self.below = below
        self.tag = tag

    @property
    def peers(self) -> Sequence[int]:
        return self.below.peers

    @property
    def max_message(self) -> int:
        return self.below.max_message - len(self.tag)

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        await self.below.send(peer, self.tag + bytes(data))

    async def recv(self) -> tuple[int, bytes]:
        peer, data = await self.below.recv()
        return peer, data[len(self.tag) :]


class TagLayer(Layer):
    name = "test-tag"
    requires = DatagramService
    provides = DatagramService
    Params = NoParams

    def __init__(self, tag: bytes, log: list[str]) -> None:
        super().__init__()
        self.tag = tag
        self.log = log

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[Service]:
        assert isinstance(below, DatagramService)
        self.log.append(f"open {self.tag!r}")
        try:
            yield Upper(below, self.tag)
        finally:
            self.log.append(f"close {self.tag!r}")


class NeedsStream(Layer):
    name = "test-needs-stream"
    requires = StreamService
    provides = ReliableService
    Params = NoParams

    def open(self, below: Service) -> object:  # type: ignore[override]
        raise AssertionError("never opened: assembly must fail first")


async def test_layers_open_bottom_up_and_close_top_down() -> None:
    p = make_pair()
    log: list[str] = []
    layers_a = [TagLayer(b"[1]", log), TagLayer(b"[2]", log)]
    layers_b = [TagLayer(b"[1]", []), TagLayer(b"[2]", [])]
    async with (
        open_stack(UNetService(p.ep_a), layers_a) as top_a,
        open_stack(UNetService(p.ep_b), layers_b) as top_b,
    ):
        assert isinstance(top_a, DatagramService) and isinstance(top_b, DatagramService)
        await top_a.send(p.ch_a, b"data")
        # On the wire the lower layer's header comes first.
        raw = p.ep_b.poll()
        assert raw is not None and raw.data == b"[1][2]data"
    assert log == ["open b'[1]'", "open b'[2]'", "close b'[2]'", "close b'[1]'"]


async def test_messages_traverse_the_stack() -> None:
    p = make_pair()
    async with (
        open_stack(UNetService(p.ep_a), [TagLayer(b"<x>", [])]) as top_a,
        open_stack(UNetService(p.ep_b), [TagLayer(b"<x>", [])]) as top_b,
    ):
        assert isinstance(top_a, DatagramService) and isinstance(top_b, DatagramService)
        await top_a.send(p.ch_a, b"hello")
        assert await top_b.recv() == (p.ch_b, b"hello")


def test_misfit_names_both_sides() -> None:
    with pytest.raises(AssemblyError) as caught:
        check_fit(UNetService, [TagLayer(b"", []), NeedsStream()])
    message = str(caught.value)
    assert "'test-needs-stream'" in message and "'stream'" in message
    assert "layer 'test-tag'" in message and "'datagram'" in message


async def test_open_stack_checks_before_opening_anything() -> None:
    p = make_pair()
    log: list[str] = []
    with pytest.raises(AssemblyError):
        async with open_stack(UNetService(p.ep_a), [TagLayer(b"", log), NeedsStream()]):
            pass
    assert log == []


def test_unet_service_is_a_datagram_service() -> None:
    check_fit(UNetService, [TagLayer(b"", [])])
    p = make_pair()
    service = UNetService(p.ep_a)
    assert service.peers == [p.ch_a]
    assert service.max_message == 65535  # the NI's limit; the send pool holds 64 KiB


class MeetLayer(Layer):
    """Opens only when its peer has opened and closes only when its peer is closing, as
    Split-C's barriers do."""

    name = "test-meet"
    requires = DatagramService
    provides = DatagramService
    Params = NoParams

    def __init__(self, me: trio.Event, peer: trio.Event, log: list[str], fail: bool = False):
        super().__init__()
        self.me, self.peer, self.log, self.fail = me, peer, log, fail

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[Service]:
        assert isinstance(below, DatagramService)
        self.me.set()
        try:
            await self.peer.wait()
            if self.fail:
                raise AssemblyError("this node cannot open")
            self.log.append("open")
            yield below
        finally:
            self.log.append("close")


def _meeting(log: list[str], fail: bool = False) -> tuple[list[tuple[Service, list[Layer]]], Any]:
    p = make_pair()
    a, b = trio.Event(), trio.Event()
    stacks: list[tuple[Service, list[Layer]]] = [
        (UNetService(p.ep_a), [MeetLayer(a, b, log)]),
        (UNetService(p.ep_b), [MeetLayer(b, a, log, fail=fail)]),
    ]
    return stacks, p


async def test_open_stacks_opens_side_by_side(autojump_clock: object) -> None:
    log: list[str] = []
    stacks, p = _meeting(log)
    # One after the other, the first stack waits for the second forever.
    with trio.move_on_after(60) as waited:
        async with open_stack(*stacks[0]):
            pass
    assert waited.cancelled_caught
    log.clear()
    stacks, p = _meeting(log)
    async with open_stacks(stacks) as tops:
        assert [top.peers for top in tops] == [[p.ch_a], [p.ch_b]]  # type: ignore[attr-defined]
        assert log == ["open", "open"]
    assert log == ["open", "open", "close", "close"]


async def test_open_stacks_raises_one_nodes_error_as_itself(autojump_clock: object) -> None:
    log: list[str] = []
    stacks, _ = _meeting(log, fail=True)
    with pytest.raises(AssemblyError, match="this node cannot open"):
        async with open_stacks(stacks):
            raise AssertionError("never reached: a stack failed to open")
    assert log.count("close") == 2  # the other stack, opened or not, was closed


async def test_open_stacks_raises_the_blocks_error_as_itself(autojump_clock: object) -> None:
    log: list[str] = []
    stacks, _ = _meeting(log)
    with pytest.raises(KeyError, match="from the block"):
        async with open_stacks(stacks):
            raise KeyError("from the block")
    assert log == ["open", "open", "close", "close"]
    async with open_stacks([]) as none:
        assert none == []
