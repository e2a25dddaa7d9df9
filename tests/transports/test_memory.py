"""The memory transport in real and virtual time."""

from __future__ import annotations

import trio

from stacklib.sim import Simulation
from stacklib.transports.memory import MemoryAddress, MemoryNetwork
from stacklib.unet import EndpointConfig, connect


def test_latency_in_virtual_time_and_data_captured_at_injection() -> None:
    sim = Simulation(seed=3)
    arrivals: list[tuple[float, bytes]] = []

    async def main() -> None:
        network = MemoryNetwork(sim, latency=25e-6)
        a, b = network.add_node("a"), network.add_node("b")
        config = EndpointConfig(tx_buffers=1, tx_buffer_size=256)
        ep_a = a.os.create_endpoint(a.os.process("x"), config)
        ep_b = b.os.create_endpoint(b.os.process("y"))
        ch_a, _ = connect(ep_a, ep_b)
        await ep_a.send(ch_a, b"1" * 100)
        await ep_a.send(ch_a, b"2" * 100)  # reuses the only send buffer at once
        for _ in range(2):
            message = await ep_b.recv()
            arrivals.append((trio.current_time(), message.data))

    sim.run(main)
    assert arrivals == [(25e-6, b"1" * 100), (25e-6, b"2" * 100)]


def test_latency_is_ignored_in_real_time() -> None:
    async def main() -> None:
        network = MemoryNetwork(latency=1.0)
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"))
        ep_b = b.os.create_endpoint(b.os.process("y"))
        ch_a, _ = connect(ep_a, ep_b)
        await ep_a.send(ch_a, b"now")
        assert ep_b.poll() is not None

    trio.run(main)


def test_addresses_and_statistics() -> None:
    network = MemoryNetwork()
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=7)
    assert ep_a.address == MemoryAddress("a", 7) and str(ep_a.address) == "a:7"
    ep_b = b.os.create_endpoint(b.os.process("y"))
    connect(ep_a, ep_b)
    network.inject("b", "nonsense", b"")
    assert network.dropped() == {"unknown-tag": 1}
    stats = b.ni.statistics()
    assert stats.endpoints == 1 and stats.channels == 1 and stats.dropped == {"unknown-tag": 1}
