"""The batch calls of the U-Net API, ``send_many`` and ``recv_many``, on every kind of transport:
memory (the default loops), shm (the one-pass ring path) and a simulated NI (virtual time)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from typing import Any

import attrs
import pytest
import trio

from stacklib.errors import ChannelError, EndpointClosed, PeerGone, UNetError
from stacklib.sim import Simulation
from stacklib.transports.memory import MemoryNetwork
from stacklib.transports.shm import ShmEndpoint, ShmNetwork
from stacklib.transports.sim import FastEthernetParams, build_fe
from stacklib.unet import Endpoint, EndpointConfig, connect

CONFIG = EndpointConfig(send_queue=4, recv_queue=64, free_queue=64, rx_buffers=16, tx_buffers=4)


@attrs.define
class Rig:
    kind: str
    ep_a: Endpoint
    ep_b: Endpoint
    ch_a: int
    ch_b: int
    run: Callable[[Callable[[], Awaitable[Any]]], Any]

    async def settle(self) -> None:
        """Let sent messages arrive (virtual time passes only in the simulation)."""
        await trio.sleep(0.01 if self.kind == "sim" else 0)


@pytest.fixture(params=["memory", "shm", "sim"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with ExitStack() as stack:
        kind = request.param
        if kind == "sim":
            sim = Simulation()
            nodes = build_fe(sim, FastEthernetParams(), ["a", "b"], None).nodes
            a, b = nodes["a"], nodes["b"]
            run: Callable[[Callable[[], Awaitable[Any]]], Any] = sim.run
        else:
            network: Any = (
                stack.enter_context(ShmNetwork(ring_bytes=4096, max_message=1024))
                if kind == "shm"
                else MemoryNetwork()
            )
            a, b = network.add_node("a"), network.add_node("b")
            run = trio.run
        ep_a = a.os.create_endpoint(a.os.process("x"), CONFIG)
        ep_b = b.os.create_endpoint(b.os.process("y"), CONFIG)
        ch_a, ch_b = connect(ep_a, ep_b)
        yield Rig(kind, ep_a, ep_b, ch_a, ch_b, run)


def _messages(count: int, size: int = 8) -> list[bytes]:
    return [i.to_bytes(4, "big") + bytes(size - 4) for i in range(count)]


def test_order_and_counts(rig: Rig) -> None:
    async def main() -> None:
        batch = _messages(4)
        assert rig.ep_a.send_many(rig.ch_a, iter(batch)) == 4  # any iterable
        await rig.settle()
        got = rig.ep_b.recv_many(3)
        got += rig.ep_b.recv_many(3)
        assert [m.data for m in got] == batch
        assert {m.channel for m in got} == {rig.ch_b}
        assert rig.ep_b.recv_many() == []
        assert (rig.ep_a.sent, rig.ep_a.sent_bytes) == (4, 32)
        assert (rig.ep_b.received, rig.ep_b.received_bytes) == (4, 32)

    rig.run(main)


def test_batch_interleaves_with_single_calls(rig: Rig) -> None:
    async def main() -> None:
        rig.ep_a.send_nowait(rig.ch_a, b"first")
        assert rig.ep_a.send_many(rig.ch_a, [b"second", b"third"]) >= 1
        await rig.settle()
        first = rig.ep_b.poll()
        assert first is not None and first.data == b"first"
        rest = [m.data for m in rig.ep_b.recv_many()]
        assert rest[:1] == [b"second"] and len(rest) <= 2

    rig.run(main)


def test_oversize_raises_before_anything_is_sent(rig: Rig) -> None:
    largest = rig.ep_a.ni.max_message
    with pytest.raises(UNetError, match="nothing of the batch was sent"):
        rig.ep_a.send_many(rig.ch_a, [b"fine", bytes(largest + 1)])
    assert rig.ep_a.sent == 0 and not rig.ep_a.send_queue


def test_misuse_raises_naming_the_problem(rig: Rig) -> None:
    with pytest.raises(ChannelError, match="no channel 99"):
        rig.ep_a.send_many(99, [b"x"])
    with pytest.raises(ValueError, match="at least 1"):
        rig.ep_b.recv_many(0)
    assert rig.ep_a.send_many(rig.ch_a, []) == 0


def test_closed_endpoint(rig: Rig) -> None:
    rig.ep_a.close()
    with pytest.raises(EndpointClosed):
        rig.ep_a.send_many(rig.ch_a, [b"x"])
    with pytest.raises(EndpointClosed):
        rig.ep_a.recv_many()


def test_partial_take_when_the_queue_fills(rig: Rig) -> None:
    """A prefix is taken; the message that did not fit and the rest are not sent."""
    if rig.kind == "memory":
        # The memory NI injects at once: pause it, so the send queue (4) fills.
        rig.ep_a.ni.pause_transmit()
    # shm: 4096-byte ring of 16-byte records holds 256; the others hold their send queue of 4.
    count = 300 if rig.kind == "shm" else 10
    batch = _messages(count)

    async def main() -> None:
        taken = rig.ep_a.send_many(rig.ch_a, batch)
        assert 0 < taken < count
        if rig.kind == "shm":
            assert taken == 256 and rig.ep_a.sent == 256
        else:
            assert taken == len(rig.ep_a.send_queue) == 4
        if rig.kind == "memory":
            return
        await rig.settle()
        got = [m.data for m in rig.ep_b.recv_many(1000)]
        assert got == batch[:taken]  # the ring path takes no receive queue slots
        if rig.kind == "shm":  # the rest goes once the receiver made room
            more = rig.ep_a.send_many(rig.ch_a, batch[taken:])
            assert more == count - taken
            got += [m.data for m in rig.ep_b.recv_many(1000)]
            assert got == batch

    rig.run(main)


# --- the shm one-pass path ------------------------------------------------------------------


@pytest.fixture
def shm_pair() -> Iterator[tuple[ShmEndpoint, ShmEndpoint, int, int]]:
    with ShmNetwork(ring_bytes=4096, max_message=1024) as network:
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"), CONFIG)
        ep_b = b.os.create_endpoint(b.os.process("y"), CONFIG)
        assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
        ch_a, ch_b = connect(ep_a, ep_b)
        yield ep_a, ep_b, ch_a, ch_b


def test_shm_batches_wrap_around_the_ring(shm_pair: tuple[ShmEndpoint, ...]) -> None:
    """Batches of odd sizes go round the 4096-byte ring many times (pad records at its end),
    mixed with single sends and polls; every message arrives once, in order."""
    ep_a, ep_b, ch_a, _ = shm_pair
    sent: list[bytes] = []
    got: list[bytes] = []
    for round_ in range(200):
        batch = [bytes([round_ & 0xFF]) * ((round_ * 37 + i * 11) % 900) for i in range(5)]
        taken = ep_a.send_many(ch_a, batch)
        sent += batch[:taken]
        if round_ % 3 == 0:
            with contextlib.suppress(trio.WouldBlock):
                ep_a.send_nowait(ch_a, b"single")
                sent.append(b"single")
        got += [m.data for m in ep_b.recv_many(4)]
        message = ep_b.poll()
        if message is not None:
            got.append(message.data)
    got += [m.data for m in ep_b.recv_many(1000)]
    assert got == sent and len(sent) > 600
    assert ep_a.ni.network is not None and ep_b.ni.corrupt_rings == 0


@pytest.mark.parametrize("receive", ["recv_many", "poll"])
def test_shm_full_ring_sets_producer_waiting_and_the_receiver_wakes_it(
    shm_pair: tuple[ShmEndpoint, ...], receive: str
) -> None:
    ep_a, ep_b, ch_a, ch_b = shm_pair
    link = ep_a.ni.link(ep_a, ch_a)
    batch = [bytes(1000)] * 20
    taken = ep_a.send_many(ch_a, batch)
    assert 0 < taken < 20 and link.tx.producer_waiting
    assert ep_a.send_many(ch_a, batch[taken:]) == 0  # still full: nothing taken
    woken: list[bool] = []
    ep_b.ni.link(ep_b, ch_b).rx.wake_producer = lambda: woken.append(True)
    if receive == "poll":
        assert ep_b.poll() is not None
    else:
        assert len(ep_b.recv_many(2)) == 2
    assert not link.tx.producer_waiting  # the receiver saw the flag and cleared it
    if receive == "poll":
        assert woken == [True]
    assert ep_a.send_many(ch_a, batch[taken:]) >= 1


def test_shm_recv_many_takes_turns_between_channels() -> None:
    with ShmNetwork(ring_bytes=4096, max_message=256) as network:
        a, b, c = (network.add_node(n) for n in "abc")
        ep_b = b.os.create_endpoint(b.os.process("y"), CONFIG)
        ep_a = a.os.create_endpoint(a.os.process("x"), CONFIG)
        ep_c = c.os.create_endpoint(c.os.process("z"), CONFIG)
        ch_ab, ch_ba = connect(ep_a, ep_b)
        ch_cb, ch_bc = connect(ep_c, ep_b)
        assert ep_a.send_many(ch_ab, [b"a"] * 10) == 10
        assert ep_c.send_many(ch_cb, [b"c"] * 10) == 10
        first = ep_b.recv_many(10)
        second = ep_b.recv_many(10)
        assert {m.channel for m in first} != {m.channel for m in second}
        assert sorted(m.channel for m in first + second) == [ch_ba] * 10 + [ch_bc] * 10


def test_shm_broken_ring_fails_the_batch(shm_pair: tuple[ShmEndpoint, ...]) -> None:
    """A consumer head the peer scribbled breaks the ring: the batch raises PeerGone."""
    ep_a, _, ch_a, _ = shm_pair
    link = ep_a.ni.link(ep_a, ch_a)
    assert ep_a.send_many(ch_a, [bytes(1000)] * 20) < 20  # full: the next batch reads the head
    link.tx._words[link.tx._base + 8] = 3  # an unaligned head
    with pytest.raises(PeerGone, match="corrupt ring"):
        ep_a.send_many(ch_a, [bytes(1000)])
    assert ep_a.ni.corrupt_rings == 1


def test_shm_recv_many_stops_at_a_bad_record(shm_pair: tuple[ShmEndpoint, ...]) -> None:
    """The sound messages before a record the peer scribbled arrive; the ring breaks there,
    counted as a malformed drop, and the channel fails."""
    ep_a, ep_b, ch_a, ch_b = shm_pair
    assert ep_a.send_many(ch_a, _messages(4)) == 4
    ring = ep_b.ni.link(ep_b, ch_b).rx
    struct_kind_offset = 2 * 16 + 4  # the third 16-byte record's kind field
    ring.data[struct_kind_offset] = 7
    assert [m.data for m in ep_b.recv_many()] == _messages(2)
    assert ring.error is not None and "kind 7" in ring.error
    assert ep_b.ni.corrupt_rings == 1 and ep_b.dropped["malformed"] == 1
    assert ep_b.recv_many() == []
