"""Closing over shm: a closed endpoint is trio's ClosedResourceError, a peer that left is
PeerGone (a trio.BrokenResourceError), and an SPMD program that handles it exits 0."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from stacklib.errors import EndpointClosed, PeerGone
from stacklib.transports.shm import ShmNetwork
from stacklib.unet import Endpoint, connect


@pytest.fixture
def network() -> Iterator[ShmNetwork]:
    with ShmNetwork() as net:
        yield net


def _pair(network: ShmNetwork) -> tuple[Endpoint, Endpoint, int, int]:
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("a"), port=1)
    ep_b = b.os.create_endpoint(b.os.process("b"), port=1)
    ch_a, ch_b = connect(ep_a, ep_b)
    return ep_a, ep_b, ch_a, ch_b


async def test_a_closed_shm_endpoint_raises_closed_resource(network: ShmNetwork) -> None:
    ep_a, _, ch_a, _ = _pair(network)
    await ep_a.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await ep_a.send(ch_a, b"small")  # the inline fast path
    with pytest.raises(trio.ClosedResourceError):
        ep_a.send_nowait(ch_a, bytes(4000))  # the descriptor path
    with trio.fail_after(5), pytest.raises(EndpointClosed):
        await ep_a.recv()


async def test_async_for_over_a_shm_endpoint_ends_when_it_closes(network: ShmNetwork) -> None:
    ep_a, ep_b, ch_a, _ = _pair(network)
    got: list[bytes] = []

    async def consumer() -> None:
        async for message in ep_b:
            got.append(message.data)
        got.append(b"<end>")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await ep_a.send(ch_a, b"one")
            while not got:
                await trio.sleep(0.001)
            ep_b.close()
    assert got == [b"one", b"<end>"]


async def test_a_peer_that_leaves_is_peer_gone_after_its_last_message(
    network: ShmNetwork,
) -> None:
    ep_a, ep_b, ch_a, ch_b = _pair(network)
    await ep_b.send(ch_b, b"last words")
    ep_b.close()
    got: list[bytes] = []
    with trio.fail_after(5), pytest.raises(trio.BrokenResourceError) as info:
        async for message in ep_a:
            got.append(message.data)
    assert isinstance(info.value, PeerGone) and "closed" in str(info.value)
    assert got == [b"last words"]  # nothing the peer sent is lost to the error
    with pytest.raises(PeerGone):
        await ep_a.send(ch_a, b"anyone?")


#: An SPMD echo: rank 0 sends and leaves as soon as it has its replies; rank 1 serves in the
#: ``async for`` loop the app tutorial teaches, ending when rank 0 is gone.
SPMD = """
import trio
from stacklib.errors import PeerGone
from stacklib.launch import bootstrap

async def main() -> None:
    with bootstrap() as me:
        channel = me.channels[1 - me.rank]
        if me.rank == 0:
            for index in range(5):
                await me.endpoint.send(channel, b"%d" % index)
                await me.endpoint.recv()
            return
        served = 0
        HANDLED
        print("served", served, flush=True)

trio.run(main)
"""
HANDLED = """try:
            async for message in me.endpoint:
                await me.endpoint.send(message.channel, message.data)
                served += 1
        except PeerGone:  # rank 0 finished and left
            pass"""
UNHANDLED = """async for message in me.endpoint:
            await me.endpoint.send(message.channel, message.data)
            served += 1"""


def _spawn(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "echo.py"
    program.write_text(SPMD.replace("HANDLED", body))
    return subprocess.run(
        [sys.executable, "-m", "stacklib.launch", "-n", "2", str(program)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_spmd_program_that_handles_peer_gone_exits_0(tmp_path: Path) -> None:
    done = _spawn(tmp_path, HANDLED)
    assert done.returncode == 0, done.stderr
    assert "served 5" in done.stdout


def test_without_the_handler_the_documented_error_surfaces(tmp_path: Path) -> None:
    done = _spawn(tmp_path, UNHANDLED)
    assert done.returncode != 0
    assert "PeerGone" in done.stderr
