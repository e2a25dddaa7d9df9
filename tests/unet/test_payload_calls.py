"""The descriptor-free calls of the U-Net API, ``send_payload`` and ``poll_payload``, on every
kind of transport (the defaults on memory and a simulated NI, the ring path on shm), and the
hand-written value semantics of ``Message`` and ``SendDescriptor``."""

from __future__ import annotations

import pytest
import trio

from stacklib.errors import EndpointClosed, PeerGone, UNetError
from stacklib.transports.shm import ShmEndpoint
from stacklib.unet import (
    DescriptorStatus,
    Message,
    SendDescriptor,
    UpcallCondition,
    polled,
)
from stacklib.unet.polled import cancel_point, cancelled
from tests.unet.test_batch_calls import CONFIG, Rig
from tests.unet.test_batch_calls import rig as rig  # the fixture, over every transport
from tests.unet.test_batch_calls import shm_pair as shm_pair  # two shm endpoints, a channel


def test_payload_calls_carry_messages_in_order(rig: Rig) -> None:
    async def main() -> None:
        rig.ep_a.send_nowait(rig.ch_a, b"first")
        assert rig.ep_a.send_payload(rig.ch_a, b"second") is None
        rig.ep_a.send_payload(rig.ch_a, bytearray(b"third"))
        await rig.settle()
        first = rig.ep_b.poll_payload()
        assert first == (rig.ch_b, b"first")
        message = rig.ep_b.poll()
        assert message == Message(rig.ch_b, b"second")
        third = rig.ep_b.poll_payload()
        assert third is not None and third[0] == rig.ch_b and bytes(third[1]) == b"third"
        assert rig.ep_b.poll_payload() is None
        assert (rig.ep_a.sent, rig.ep_a.sent_bytes) == (3, 16)
        assert (rig.ep_b.received, rig.ep_b.received_bytes) == (3, 16)

    rig.run(main)


def test_send_payload_refuses_what_send_nowait_marks_as_an_error(rig: Rig) -> None:
    descriptor = rig.ep_a.send_nowait(99, b"x")
    if rig.kind == "sim":  # the simulated NI rejects it later: counted, not raised

        async def main() -> None:
            rig.ep_a.send_payload(99, b"x")
            await rig.settle()

        rig.run(main)
        assert descriptor.status is DescriptorStatus.ERROR
        assert sum(rig.ep_a.statistics().send_errors.values()) == 2
        return
    assert descriptor.status is DescriptorStatus.ERROR
    with pytest.raises(UNetError, match="channel 99: the NI rejected the message"):
        rig.ep_a.send_payload(99, b"x")


def test_payload_calls_on_a_closed_endpoint(rig: Rig) -> None:
    rig.ep_a.close()
    with pytest.raises(EndpointClosed):
        rig.ep_a.send_payload(rig.ch_a, b"x")
    assert rig.ep_a.poll() is None and rig.ep_a.poll_payload() is None


# --- the shm ring path ------------------------------------------------------------------------


def test_shm_send_payload_queues_behind_a_full_ring(shm_pair: tuple[ShmEndpoint, ...]) -> None:
    """A full ring sends the message to the descriptor path: queued (send queue of 4), then
    back-pressure; everything arrives once, in order, as the receiver drains."""
    ep_a, ep_b, ch_a, _ = shm_pair
    sent = 0
    with pytest.raises(trio.WouldBlock):
        while True:
            ep_a.send_payload(ch_a, sent.to_bytes(4, "little") * 100)
            sent += 1
    assert len(ep_a.send_queue) == CONFIG.send_queue
    got: list[int] = []
    for _ in range(10 * sent):
        taken = ep_b.poll_payload()
        if taken is None:
            ep_a.shm_ni.progress()  # the sender's NI pushes its queue when it runs
            continue
        got.append(int.from_bytes(taken[1][:4], "little"))
    assert got == list(range(sent))
    assert ep_a.sent == sent


def test_shm_poll_payload_takes_queued_messages_first(shm_pair: tuple[ShmEndpoint, ...]) -> None:
    """With an upcall set the NI queues messages on the receive queue: poll_payload takes them
    through the descriptor path, in order."""
    ep_a, ep_b, ch_a, ch_b = shm_pair
    ep_b.set_upcall(UpcallCondition.NON_EMPTY, lambda endpoint: None)
    for data in (b"one", b"two"):
        ep_a.send_payload(ch_a, data)
    assert ep_b.poll_payload() == (ch_b, b"one")
    assert ep_b.recv_queue  # the second one waits there, moved by the NI
    assert ep_b.poll_payload() == (ch_b, b"two")
    assert ep_b.poll_payload() is None


def test_shm_send_payload_on_a_broken_ring_raises_peer_gone(
    shm_pair: tuple[ShmEndpoint, ...],
) -> None:
    ep_a, _, ch_a, _ = shm_pair
    link = ep_a.ni.link(ep_a, ch_a)
    assert ep_a.send_many(ch_a, [bytes(1000)] * 20) < 20  # full: the next send reads the head
    link.tx._words[link.tx._base + 8] = 3  # an unaligned head
    with pytest.raises(PeerGone, match="corrupt ring"):
        ep_a.send_payload(ch_a, bytes(1000))


# --- value semantics --------------------------------------------------------------------------


def test_message_is_a_value() -> None:
    message = Message(3, b"abc")
    assert message == Message(3, b"abc", None)
    assert message != Message(3, b"abd") and message != Message(4, b"abc")
    assert message != Message(3, b"abc", 64) and message != (3, b"abc", None)
    assert hash(message) == hash(Message(3, b"abc"))
    assert len({message, Message(3, b"abc"), Message(3, b"x")}) == 2
    assert repr(Message(1, b"x", 8)) == "Message(channel=1, data=b'x', dest_offset=8)"
    assert (message.channel, message.data, message.dest_offset) == (3, b"abc", None)


def test_send_descriptor_is_a_queue_entry() -> None:
    first = SendDescriptor(2, inline=b"x")
    assert first != SendDescriptor(2, inline=b"x") and first == first  # by identity
    assert (first.length, first.done, first.fragments, first.dest_offset) == (1, False, (), None)
    first.status = DescriptorStatus.INJECTED  # the NI writes status and error
    assert first.done
    assert repr(first).startswith("SendDescriptor(channel=2, fragments=(), inline=b'x', ")


# --- the await faces ----------------------------------------------------------------------------


def test_await_payload_faces_carry_messages_in_order(rig: Rig) -> None:
    async def main() -> None:
        for index in range(6):
            assert await rig.ep_a.send_payload_async(rig.ch_a, bytes([index]) * 8) is None
        await rig.settle()
        got = [await rig.ep_b.recv_payload() for _ in range(6)]
        assert got == [(rig.ch_b, bytes([index]) * 8) for index in range(6)]
        assert (rig.ep_a.sent, rig.ep_b.received) == (6, 6)

    rig.run(main)


def test_send_payload_async_refuses_what_send_marks_as_an_error(rig: Rig) -> None:
    if rig.kind == "sim":  # the simulated NI rejects it later: counted (above), not raised
        return

    async def main() -> None:
        with pytest.raises(UNetError, match="channel 99: the NI rejected the message"):
            await rig.ep_a.send_payload_async(99, b"x")

    rig.run(main)


async def test_cancel_point_tests_the_calling_task() -> None:
    assert polled._RUN_CONTEXT is not None  # the installed trio has what it reads
    assert cancel_point() is False
    with trio.CancelScope() as scope:
        scope.cancel()
        assert cancel_point() is True  # the caller then awaits checkpoint_if_cancelled
        with pytest.raises(trio.Cancelled):
            await trio.lowlevel.checkpoint_if_cancelled()
    assert cancel_point() is False


def test_cancel_point_outside_trio_sends_the_caller_to_trio() -> None:
    assert cancel_point() is True  # and checkpoint_if_cancelled raises RuntimeError there
    assert cancelled() is True


async def test_cancelled_tests_the_calling_task() -> None:
    assert cancelled() is False
    with trio.CancelScope() as scope:
        scope.cancel()
        assert cancelled() is True
        with trio.CancelScope(shield=True):
            assert cancelled() is False  # a shielded scope inside a cancelled one
    assert cancelled() is False


def test_only_cancel_point_sees_a_keyboard_interrupt_trio_holds() -> None:
    """A Ctrl-C that lands in trio's own code waits in ``ki_pending`` for the main task's
    next checkpoint: :func:`cancel_point` sees it, :func:`cancelled` does not."""

    async def main() -> tuple[bool, bool]:
        runner = polled._RUN_CONTEXT.runner
        runner.ki_pending = True
        try:
            return cancel_point(), cancelled()
        finally:
            runner.ki_pending = False

    assert trio.run(main) == (True, False)
