"""The simulated fabric: link technologies, switch / hub / direct topologies, faults and taps.

Everything runs in virtual time (stacklib.sim.Simulation), so times are exact and the same seed
gives the same faults on every run.
"""

from __future__ import annotations

import math

import attrs
import pytest
import trio

from stacklib.sim import Host, Simulation
from stacklib.transports.sim import (
    AtmParams,
    FastEthernetParams,
    SimCluster,
    build_atm,
    build_fe,
)
from stacklib.transports.sim.atm import I960NI
from stacklib.transports.sim.fabric import Fabric, Packet, cells
from stacklib.transports.sim.links import OC3, TAXI_140, AtmLink, EthernetLink, MyrinetLink
from stacklib.transports.sim.params import FaultParams, I960Params
from stacklib.unet import DropReason, Endpoint, EndpointConfig, connect

US = 1e-6
TAXI_CELL = 53 * 8 / 140e6  # one 53-byte cell on 140 Mbit/s TAXI: 3.03 us


def _endpoints(cluster: SimCluster, config: EndpointConfig | None = None) -> dict[str, Endpoint]:
    return {
        name: node.os.create_endpoint(node.os.process(f"app@{name}"), config)
        for name, node in cluster.nodes.items()
    }


def _build_fe(sim: Simulation, interconnect: str, names: list[str]) -> SimCluster:
    return build_fe(sim, FastEthernetParams(interconnect=interconnect), names, None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- link shapes


@pytest.mark.parametrize(
    ("size", "expected_cells"),
    [(0, 1), (1, 1), (40, 1), (41, 2), (88, 2), (89, 3), (1000, 21), (4088, 86), (65535, 1366)],
)
def test_atm_cells_are_aal5_pdus_of_48_byte_payloads(size: int, expected_cells: int) -> None:
    assert expected_cells == max(1, math.ceil((size + 8) / 48))
    shape = TAXI_140.shape(size)
    assert shape.units == expected_cells == cells(size)
    assert shape.per_unit == pytest.approx(TAXI_CELL, rel=1e-12)
    assert shape.tail == 0.0
    assert shape.wire_bytes == 53 * expected_cells


def test_taxi_and_oc3_cell_times() -> None:
    assert TAXI_140.shape(0).per_unit == pytest.approx(3.0286e-6, rel=1e-4)
    assert OC3.shape(0).per_unit == pytest.approx(53 * 8 / 149.76e6, rel=1e-12)  # 2.83 us
    assert OC3.shape(0).per_unit == pytest.approx(2.83e-6, rel=1e-3)


def test_ethernet_frame_of_a_small_message_is_one_minimum_slot() -> None:
    link = EthernetLink()
    shape = link.shape(40)
    # 14-byte Ethernet + 3-byte U-Net header + 40 bytes = 57, padded to 60; + 4 FCS = 64;
    # + 8 preamble/SFD = 72 byte times on the wire, then 12 byte times of inter-frame gap.
    assert shape.units == 1
    assert shape.wire_bytes == 84
    assert shape.per_unit == pytest.approx(72 * 8 / 100e6, rel=1e-12)
    assert shape.tail == pytest.approx(12 * 8 / 100e6, rel=1e-12)
    assert shape.per_unit + shape.tail == pytest.approx(84 * 8 / 100e6, rel=1e-12)  # 6.72 us
    # Anything up to 43 bytes pads to the same minimum frame.
    assert link.shape(0) == link.shape(43) == shape
    assert link.shape(44).wire_bytes == 85


def test_ethernet_largest_message_fills_a_maximum_frame() -> None:
    shape = EthernetLink().shape(1497)
    # 17 + 1497 = 1514 bytes: the largest Ethernet frame (1500-byte payload + 14 header).
    assert shape.wire_bytes == 1514 + 4 + 8 + 12
    assert shape.per_unit == pytest.approx((1514 + 4 + 8) * 8 / 100e6, rel=1e-12)


def test_myrinet_bytes_flow_behind_a_route_header() -> None:
    link = MyrinetLink()
    shape = link.shape(100)
    assert shape.units == 108
    assert shape.per_unit == pytest.approx(8 / 1.28e9, rel=1e-12)
    assert shape.tail == 0.0 and shape.wire_bytes == 108


def test_payload_limits() -> None:
    fe = EthernetLink()
    # Paper 001 §3.4 / paper 003 §4.4.2: "the bandwidth approaches the peak of about 97Mbps
    # (taking into account Ethernet frame overhead)" for messages of 1 KB and more.
    assert fe.payload_limit_bps(1024) == pytest.approx(1024 * 8 / (1065 * 8 / 100e6), rel=1e-12)
    assert 95e6 < fe.payload_limit_bps(1024) < 97.5e6
    assert fe.payload_limit_bps(1497) == pytest.approx(97e6, rel=0.01)
    # Small frames waste most of the 84-byte slot.
    assert fe.payload_limit_bps(40) == pytest.approx(40 / 84 * 100e6, rel=1e-12)
    # ATM: the cell tax.  OC-3 carries "not 155Mbps, but rather 135 Mbps" (paper 001 §3.4).
    full = 100 * 48 - 8  # exactly 100 cells
    assert OC3.payload_limit_bps(full) == pytest.approx(135e6, rel=0.01)
    assert TAXI_140.payload_limit_bps(full) == pytest.approx(140e6 * full / 5300, rel=1e-12)
    # One byte more needs a whole extra cell.
    assert OC3.payload_limit_bps(full + 1) < OC3.payload_limit_bps(full)
    for tech in (fe, OC3, TAXI_140, MyrinetLink()):
        for size in (1, 40, 1000, 1497):
            assert 0 < tech.payload_limit_bps(size) < tech.rate_bps


def test_custom_atm_link_rate() -> None:
    slow = AtmLink("slow", 53 * 8 * 1e3)  # one cell per millisecond
    assert slow.shape(100).per_unit == pytest.approx(1e-3)


# ----------------------------------------------------------------------------- fabric set-up


def test_vc_allocation_is_stable_and_one_table_serves_both_directions() -> None:
    fabric = Fabric(Simulation(), TAXI_140)
    ab = fabric.vc("a", "b")
    assert ab == 32  # VCIs 0-31 are reserved
    ba = fabric.vc("b", "a")
    assert ba != ab
    assert fabric.vc("a", "b") == ab and fabric.vc("b", "a") == ba
    ac = fabric.vc("a", "c")
    assert len({ab, ba, ac}) == 3
    assert fabric.vc("a", "b") == ab


def test_atm_channel_is_a_vci_pair_seen_from_both_ends() -> None:
    sim = Simulation()
    cluster = build_atm(sim, AtmParams(), ["a", "b"], None)
    eps = _endpoints(cluster)
    ch_a, ch_b = connect(eps["a"], eps["b"])
    a, b = eps["a"].channel(ch_a), eps["b"].channel(ch_b)
    # a transmits on the VCI that b receives on, and vice versa.
    assert a.tx_tag[1] == b.rx_key  # type: ignore[index]
    assert b.tx_tag[1] == a.rx_key  # type: ignore[index]
    assert a.rx_key != b.rx_key


def test_fabric_rejects_bad_configuration() -> None:
    sim = Simulation()
    with pytest.raises(ValueError):
        Fabric(sim, TAXI_140, latency=-1.0)
    with pytest.raises(ValueError):
        Fabric(sim, TAXI_140, propagation=-1.0)
    direct = Fabric(sim, TAXI_140, topology="direct")
    for name in ("a", "b"):
        I960NI(name, Host(name, sim), direct, I960Params())
    with pytest.raises(ValueError, match="exactly two"):
        I960NI("c", Host("c", sim), direct, I960Params())
    with pytest.raises(ValueError, match="already attached"):
        direct.attach(direct.nis["a"])


def test_fault_params_validate_and_report_any() -> None:
    assert not FaultParams().any
    assert FaultParams(reorder=0.1).any and FaultParams(loss=0.01).any
    for field in ("loss", "corrupt", "duplicate", "reorder"):
        with pytest.raises(ValueError):
            FaultParams(**{field: 1.5})
        with pytest.raises(ValueError):
            FaultParams(**{field: -0.1})


# ----------------------------------------------------------------------------- topologies


def _one_way_tap(fabric: Fabric, size: int = 16) -> float:
    """Send one message between the fabric's two I960 NIs; return the tap's arrival time."""
    sim = fabric.world
    assert isinstance(sim, Simulation)
    cluster = SimCluster(sim, fabric)
    for name in ("a", "b"):
        host = Host(name, sim)
        cluster.add(name, host, I960NI(name, host, fabric, I960Params()))
    eps = _endpoints(cluster)
    ch, _ = connect(eps["a"], eps["b"])
    seen: list[float] = []
    fabric.taps.append(lambda when, packet: seen.append(when))

    async def main() -> None:
        eps["a"].send_nowait(ch, b"x" * size)
        await eps["b"].recv()

    sim.run(main)
    assert len(seen) == 1
    return seen[0]


def test_switch_adds_latency_and_a_second_link_over_a_direct_cable() -> None:
    p = I960Params()
    # Single cell: poll, i960 send, DMA, then the cell on the wire.
    leaves = (p.poll_us + p.tx_single_us + p.dma_cell_us) * US
    direct = _one_way_tap(Fabric(Simulation(), TAXI_140, topology="direct"))
    assert direct == pytest.approx(leaves + TAXI_CELL, rel=1e-9)
    switched = _one_way_tap(Fabric(Simulation(), TAXI_140, latency=7 * US))
    assert switched == pytest.approx(leaves + TAXI_CELL + 7 * US + TAXI_CELL, rel=1e-9)
    # Propagation is paid once per link: twice through a switch, once on a cable.
    far = _one_way_tap(Fabric(Simulation(), TAXI_140, latency=7 * US, propagation=1 * US))
    assert far - switched == pytest.approx(2 * US, rel=1e-6)
    far_direct = _one_way_tap(Fabric(Simulation(), TAXI_140, topology="direct", propagation=US))
    assert far_direct - direct == pytest.approx(1 * US, rel=1e-6)


def _contention(senders: list[str], size: int) -> tuple[list[float], SimCluster]:
    """Nodes in ``senders`` each send one message to node "c" at t=0; tap arrival times."""
    sim = Simulation()
    cluster = build_atm(sim, AtmParams(), ["a", "b", "c"], None)
    eps = _endpoints(cluster)
    channels = {name: connect(eps[name], eps["c"])[0] for name in senders}
    arrivals: list[float] = []
    cluster.fabric.taps.append(lambda when, packet: arrivals.append(when))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for name in senders:
                nursery.start_soon(eps[name].send, channels[name], bytes(size))
        for _ in senders:
            await eps["c"].recv()

    sim.run(main)
    return sorted(arrivals), cluster


def test_switch_output_port_contention_queues_at_the_receivers_downlink() -> None:
    size = 1000  # 21 cells
    alone, _ = _contention(["a"], size)
    both, cluster = _contention(["a", "b"], size)
    message_time = TAXI_140.shape(size).units * TAXI_CELL
    # The first message is not delayed; the second follows one whole message later, because
    # both leave their (private) uplinks at the same instant and meet at c's output port.
    assert both[0] == pytest.approx(alone[0], rel=1e-12)
    assert both[1] - both[0] == pytest.approx(message_time, rel=1e-9)
    c, a, b = (cluster.nodes[n].ni for n in "cab")
    assert c.downlink.holds == 2  # type: ignore[attr-defined]
    assert a.uplink.holds == b.uplink.holds == 1  # type: ignore[attr-defined]


def _mixed_links(params: AtmParams, size: int = 1000) -> tuple[float, float]:
    """Node a (OC-3) sends to node b (TAXI): (b's downlink busy time, tap arrival time)."""
    sim = Simulation()
    cluster = build_atm(sim, params, ["a", "b"], None)
    eps = _endpoints(cluster)
    ch, _ = connect(eps["a"], eps["b"])
    seen: list[float] = []
    cluster.fabric.taps.append(lambda when, packet: seen.append(when))

    async def main() -> None:
        await eps["a"].send(ch, bytes(size))
        await eps["b"].recv()

    sim.run(main)
    a, b = cluster.nodes["a"].ni, cluster.nodes["b"].ni
    assert (a.link, b.link) == (OC3, TAXI_140)  # type: ignore[attr-defined]
    return b.downlink.busy_time, seen[0]  # type: ignore[attr-defined]


def test_each_link_carries_cells_at_its_own_rate() -> None:
    # Paper 003 §4.4.2 measured an OC-3 sender against a TAXI receiver.  The switch's port to
    # the receiver runs at the receiver's link rate, whichever technology is the fabric's
    # default: the same physical set-up must give the same times.
    size = 1000  # 21 cells
    taxi_cells = TAXI_140.shape(size).units * TAXI_CELL
    by_default_oc3 = _mixed_links(AtmParams(link="oc-3", links=["oc-3", "taxi-140"]))
    by_default_taxi = _mixed_links(AtmParams(link="taxi-140", links=["oc-3", "taxi-140"]))
    assert by_default_oc3[0] == pytest.approx(taxi_cells, rel=1e-9)
    assert by_default_taxi[0] == pytest.approx(taxi_cells, rel=1e-9)
    assert by_default_taxi[1] == pytest.approx(by_default_oc3[1], rel=1e-9)


def _exchange(interconnect: str) -> tuple[list[float], float]:
    """a and b send each other a 40-byte message at the same instant over Fast Ethernet."""
    sim = Simulation()
    cluster = _build_fe(sim, interconnect, ["a", "b"])
    eps = _endpoints(cluster)
    ch_a, ch_b = connect(eps["a"], eps["b"])
    arrivals: list[float] = []
    cluster.fabric.taps.append(lambda when, packet: arrivals.append(when))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(eps["a"].send, ch_a, bytes(40))
            nursery.start_soon(eps["b"].send, ch_b, bytes(40))
        await eps["a"].recv()
        await eps["b"].recv()

    sim.run(main)
    shape = cluster.fabric.tech.shape(40)
    return sorted(arrivals), shape.per_unit + shape.tail


def test_hub_is_one_half_duplex_medium_for_both_directions() -> None:
    arrivals, slot = _exchange("hub")
    # The two frames share the medium: the second waits for the first and its gap.
    assert arrivals[1] - arrivals[0] == pytest.approx(slot, rel=1e-9)
    assert slot == pytest.approx(6.72 * US, rel=1e-9)


def test_ethernet_switch_is_full_duplex() -> None:
    arrivals, _ = _exchange("fn100")
    assert arrivals[1] == pytest.approx(arrivals[0], rel=1e-12)


# ----------------------------------------------------------------------------- faults and taps


@attrs.frozen
class Burst:
    sent: list[bytes]
    received: list[bytes]
    taps: list[tuple[float, bytes]]
    recv_times: dict[bytes, float]
    cluster: SimCluster


def _burst(faults: FaultParams, seed: int = 0, n: int = 20) -> Burst:
    """Node a sends ``n`` distinct single-cell messages to node b over an SBA-200 cluster."""
    sim = Simulation(seed=seed)
    cluster = build_atm(sim, AtmParams(faults=faults), ["a", "b"], None)
    eps = _endpoints(cluster)
    ch, _ = connect(eps["a"], eps["b"])
    sent = [bytes([i]) * 16 for i in range(n)]
    received: list[bytes] = []
    taps: list[tuple[float, bytes]] = []
    recv_times: dict[bytes, float] = {}
    cluster.fabric.taps.append(lambda when, packet: taps.append((when, packet.payload)))

    async def receive() -> None:
        async for message in eps["b"]:
            received.append(message.data)
            recv_times.setdefault(message.data, trio.current_time())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            for data in sent:
                await eps["a"].send(ch, data)
            await trio.sleep(0.01)  # far longer than any delivery or reorder hold
            nursery.cancel_scope.cancel()

    sim.run(main)
    return Burst(sent, received, taps, recv_times, cluster)


def test_no_faults_delivers_everything_in_order() -> None:
    burst = _burst(FaultParams())
    assert burst.received == burst.sent
    stats = burst.cluster.fabric.statistics()
    assert (stats.carried, stats.lost, stats.corrupted, stats.duplicated, stats.reordered) == (
        20,
        0,
        0,
        0,
        0,
    )
    assert stats.units == 20 and stats.wire_bytes == 20 * 53


def test_loss_one_drops_everything_and_counts_it() -> None:
    burst = _burst(FaultParams(loss=1.0))
    assert burst.received == [] and burst.taps == []
    stats = burst.cluster.fabric.statistics()
    assert stats.lost == 20 and stats.carried == 0
    assert stats.units == 20  # the cells did leave the sender
    assert burst.cluster.nodes["b"].ni.statistics().received == 0


def test_corrupt_one_reaches_the_ni_and_fails_its_crc() -> None:
    burst = _burst(FaultParams(corrupt=1.0))
    assert burst.received == []
    stats = burst.cluster.fabric.statistics()
    assert stats.corrupted == 20 and stats.carried == 20 and stats.lost == 0
    assert len(burst.taps) == 20  # delivered to the receiving NI ...
    ni = burst.cluster.nodes["b"].ni
    assert ni.statistics().dropped == {DropReason.CORRUPTED: 20}  # ... which drops them
    assert ni.statistics().received == 0


def test_duplicate_one_delivers_every_message_twice() -> None:
    burst = _burst(FaultParams(duplicate=1.0))
    assert sorted(burst.received) == sorted(burst.sent * 2)
    stats = burst.cluster.fabric.statistics()
    assert stats.duplicated == 20 and stats.carried == 40


def test_duplicates_are_never_faster_than_the_network() -> None:
    # A copy made by the network still has to cross the switch and the receiver's link: no
    # copy may reach the NI before the fault-free message would have.  (The twin is made at
    # the switch, so it should leave through the same output port, after the original.)
    clean = {payload: when for when, payload in _burst(FaultParams()).taps}
    burst = _burst(FaultParams(duplicate=1.0))
    early = [
        (payload[0], when, clean[payload]) for when, payload in burst.taps if when < clean[payload]
    ]
    assert not early, f"copies (message, arrival, fault-free arrival) arrived early: {early[:3]}"


def test_reorder_changes_the_order_deterministically() -> None:
    faults = FaultParams(reorder=0.3)
    first = _burst(faults, seed=5)
    assert sorted(first.received) == sorted(first.sent)  # nothing lost or added
    assert first.received != first.sent  # but not in order
    assert first.cluster.fabric.statistics().reordered > 0
    again = _burst(faults, seed=5)
    assert again.received == first.received
    assert again.taps == first.taps


def test_same_seed_same_faults_different_seed_different_faults() -> None:
    faults = FaultParams(loss=0.5)

    def lost(seed: int) -> set[bytes]:
        burst = _burst(faults, seed=seed)
        assert burst.cluster.fabric.statistics().lost == 20 - len(burst.received)
        return set(burst.sent) - set(burst.received)

    one = lost(1)
    assert 0 < len(one) < 20
    assert lost(1) == one
    assert lost(2) != one


def test_taps_see_delivered_packets_with_their_arrival_times() -> None:
    burst = _burst(FaultParams())
    assert [payload for _, payload in burst.taps] == burst.sent
    times = [when for when, _ in burst.taps]
    assert times == sorted(times)
    p = I960Params()
    # Host send overhead (await send), i960 poll and send, DMA, uplink cell, switch, downlink cell.
    first = (p.host_send_us + p.poll_us + p.tx_single_us + p.dma_cell_us + 7.0) * US
    first += 2 * TAXI_CELL
    assert times[0] == pytest.approx(first, rel=1e-9)
    # The tap sees the last unit arrive at the NI, before the receiver has the message.
    for when, payload in burst.taps:
        assert when < burst.recv_times[payload]


def test_tap_packets_carry_route_and_tag() -> None:
    sim = Simulation()
    cluster = build_atm(sim, AtmParams(), ["a", "b"], None)
    eps = _endpoints(cluster)
    ch, _ = connect(eps["a"], eps["b"])
    packets: list[Packet] = []
    cluster.fabric.taps.append(lambda when, packet: packets.append(packet))

    async def main() -> None:
        await eps["a"].send(ch, b"hello")
        await eps["b"].recv()

    sim.run(main)
    (packet,) = packets
    assert (packet.source, packet.destination, packet.payload) == ("a", "b", b"hello")
    assert packet.tag == eps["a"].channel(ch).tx_tag[1]  # type: ignore[index]
    assert packet.shape == TAXI_140.shape(5)
    assert not packet.corrupted
