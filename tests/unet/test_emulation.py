"""Kernel-emulated endpoints (paper 000 §3.5): the same API, multiplexed over one real one."""

from __future__ import annotations

import trio

from stacklib.transports.memory import MemoryNetwork
from stacklib.unet import DropReason, Endpoint, EndpointConfig, Node, UpcallCondition, connect
from stacklib.unet.emulation import build_frame


def emulated(node: Node, name: str) -> Endpoint:
    return node.os.create_endpoint(node.os.process(name), emulated=True)


async def test_many_emulated_endpoints_share_one_real_endpoint() -> None:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    senders = [emulated(a, f"a{i}") for i in range(3)]
    receivers = [emulated(b, f"b{i}") for i in range(3)]
    channels = [connect(s, r) for s, r in zip(senders, receivers, strict=True)]
    for i, (sender, (ch, _)) in enumerate(zip(senders, channels, strict=True)):
        await sender.send(ch, f"hello {i}".encode() * (1 + 100 * i))
    for i, receiver in enumerate(receivers):
        message = await receiver.recv()
        assert message.data == f"hello {i}".encode() * (1 + 100 * i)
        assert message.channel == channels[i][1]
    # One real endpoint per host carried everything.
    assert a.ni.statistics().endpoints == 1 and b.ni.statistics().endpoints == 1
    real_a = a.os.emulation.real  # type: ignore[attr-defined]
    assert real_a.statistics().sent == 3


async def test_emulated_and_real_endpoints_coexist_and_talk_back() -> None:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    em_a, em_b = emulated(a, "telnet-a"), emulated(b, "telnet-b")
    ch_a, _ch_b = connect(em_a, em_b)
    real_a = a.os.create_endpoint(a.os.process("fast-a"))
    real_b = b.os.create_endpoint(b.os.process("fast-b"))
    rch_a, _rch_b = connect(real_a, real_b)

    async def echo(ep: Endpoint) -> None:
        for _ in range(20):
            message = await ep.recv()
            await ep.send(message.channel, message.data[::-1])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo, em_b)
        nursery.start_soon(echo, real_b)
        for i in range(20):
            await em_a.send(ch_a, b"emulated %d" % i)
            await real_a.send(rch_a, b"real %d" % i)
            assert (await em_a.recv()).data == (b"emulated %d" % i)[::-1]
            assert (await real_a.recv()).data == (b"real %d" % i)[::-1]


async def test_emulated_endpoints_have_upcalls_and_statistics() -> None:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    em_a, em_b = emulated(a, "x"), emulated(b, "y")
    ch_a, _ = connect(em_a, em_b)
    got: list[bytes] = []
    em_b.set_upcall(
        UpcallCondition.NON_EMPTY, lambda ep: got.extend(m.data for m in iter(ep.poll, None))
    )
    await em_a.send(ch_a, b"up")
    assert got == [b"up"]
    assert em_b.statistics().received == 1 and em_a.statistics().sent == 1


async def test_kernel_drops_malformed_and_unknown_emulated_traffic() -> None:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    em_a, em_b = emulated(a, "x"), emulated(b, "y")
    connect(em_a, em_b)
    kernel_b = b.os.emulation  # type: ignore[attr-defined]
    real_a = a.os.emulation.real  # type: ignore[attr-defined]
    kernel_channel = next(iter(real_a.channels))
    # Straight onto the kernels' real channel: a one-byte frame and a frame for no endpoint.
    real_a.send_nowait(kernel_channel, b"\x01")
    real_a.send_nowait(kernel_channel, build_frame(77, 88, b"nobody"))
    assert kernel_b.dropped[DropReason.MALFORMED] == 1
    assert kernel_b.dropped[DropReason.UNKNOWN_TAG] == 1
    assert em_b.poll() is None


async def test_emulated_back_pressure_when_the_real_endpoint_is_backed_up() -> None:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    a.os.emulation_config = EndpointConfig(send_queue=2)
    em_a, em_b = emulated(a, "x"), emulated(b, "y")
    ch_a, _ = connect(em_a, em_b)
    a.ni.pause_transmit()
    for i in range(4):
        em_a.send_nowait(ch_a, bytes([i]))
    assert len(em_a.send_queue) == 2  # two went into the real send queue, two wait
    a.ni.resume_transmit()
    assert [m.data for m in iter(em_b.poll, None)] == [bytes([i]) for i in range(4)]
