"""Raw U-Net on the Myrinet LANai 4.1 model (paper 004 §3): per-stage costs, size slopes,
paper 004 Fig 2's shapes, CRC drops and determinism, all in virtual time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
import trio

from stacklib.bench.result import Result
from stacklib.config import structure
from stacklib.errors import ConfigError
from stacklib.recipes import parse_recipe, run_recipe
from stacklib.sim import Simulation, citations
from stacklib.transports import TransportKind, transport_kind
from stacklib.transports.sim.myrinet import (
    FIG2_CURVES,
    LanaiParams,
    MyrinetNI,
    MyrinetParams,
    build_myrinet,
    host_ni_bandwidth,
    host_ni_time_us,
    lanai_params,
)
from stacklib.transports.sim.params import FaultParams
from stacklib.unet import EndpointConfig, connect

P = LanaiParams()
BYTE_US = 8 / (P.link_gbit_s * 1e3)  # one byte on a 1.28 Gbit/s link, in microseconds
UNREGISTERED = TransportKind(
    "sim-myrinet", MyrinetParams, build_myrinet, "LANai 4.1, raw U-Net", clock="virtual"
)


def run(transport: Mapping[str, Any], workload: Mapping[str, Any], seed: int = 1) -> Result:
    """Run a recipe whose transport is the Myrinet model, registered or not (yet)."""
    data: dict[str, Any] = {
        "run": {"clock": "virtual", "seed": seed},
        "transport": {"kind": "sim-myrinet", **transport},
        "workload": dict(workload),
    }
    try:
        transport_kind("sim-myrinet")
    except KeyError:
        # Parse with a stand-in transport, then put the model in, validated the same way.
        recipe = parse_recipe({**data, "transport": {"kind": "memory"}}, "test")
        params = structure(MyrinetParams, dict(transport), "test", "transport")
        recipe = attrs.evolve(recipe, transport=UNREGISTERED, transport_params=params)
    else:
        recipe = parse_recipe(data, "test")
    return run_recipe(recipe)


def pingpong(transport: Mapping[str, Any], sizes: tuple[int, ...]) -> dict[int, float]:
    """One-way time (RTT/2) in microseconds per size."""
    result = run(transport, {"kind": "pingpong", "sizes": list(sizes), "iterations": 3})
    for row in result.rows:
        # No noise in virtual time, only float rounding of absolute times.
        assert row["min_us"] == pytest.approx(row["rtt_us"], abs=1e-9)
    return {int(row["size"]): float(row["rtt_us"]) / 2 for row in result.rows}  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- per-stage costs


def lcp_us(cycles: float) -> float:
    return cycles / P.clock_mhz


@pytest.mark.parametrize("method", ["pio", "pio-wc", "dma"])
def test_zero_byte_one_way_time_is_the_sum_of_its_stages(method: str) -> None:
    pio_rate = P.pio_write_wc_mb_s if method == "pio-wc" else P.pio_write_mb_s
    descriptor = 16  # an inline send descriptor's header, stored into SRAM by PIO
    stages = [
        P.host_send_us + descriptor / pio_rate,  # host: compose and store the descriptor
        lcp_us(P.lcp_poll_cycles),  # the LCP's loop notices it
        lcp_us(P.lcp_send_cycles),  # LCP send processing
        lcp_us(P.net_dma_setup_cycles),  # start the SRAM->network DMA
        P.packet_header_bytes * BYTE_US,  # the packet (header only) on the link
        3 * BYTE_US,  # one byte of cut-through fill each: uplink, switch output, receive DMA
        P.switch_latency_us,
        lcp_us(P.lcp_recv_cycles),  # LCP receive processing
        P.lanai_dma_setup_us + descriptor / P.dma_n2h_mb_s,  # descriptor DMA to the host
        P.host_recv_us,  # the host takes it off its receive queue
    ]
    one_way = pingpong({"send_method": method}, (0,))[0]
    assert one_way == pytest.approx(sum(stages), abs=1e-6)
    # Just above BIP's ~6 us at 4 bytes (paper 004 §4.1.1), the thinnest measured library.
    assert 6.0 < one_way < 7.5


def test_host_send_cost_is_the_pio_of_what_the_host_stores() -> None:
    sim = Simulation()
    nis = {
        method: build_myrinet(sim, MyrinetParams(send_method=method), ["a"], None).nodes["a"].ni
        for method in ("pio", "pio-wc", "dma")
    }

    def cost_us(method: str, nbytes: int) -> float:
        cost = nis[method].host_send_cost
        assert cost is not None
        return cost(nbytes) * 1e6

    # PIO sends store descriptor (16 + one 8-byte fragment) and data: the CPU pays per byte.
    for method, rate in (("pio", P.pio_write_mb_s), ("pio-wc", P.pio_write_wc_mb_s)):
        assert cost_us(method, 1000) == pytest.approx(P.host_send_us + (24 + 1000) / rate)
        slope = (cost_us(method, 4000) - cost_us(method, 1000)) / 3000
        assert slope == pytest.approx(1 / rate)
    # DMA sends store only the descriptor (without write combining), unless inline.
    assert cost_us("dma", 4000) == cost_us("dma", 100)
    assert cost_us("dma", 100) == pytest.approx(P.host_send_us + 24 / P.pio_write_mb_s)
    assert cost_us("dma", 40) == pytest.approx(P.host_send_us + (16 + 40) / P.pio_write_mb_s)
    recv = nis["dma"].host_recv_cost
    assert recv is not None and recv(4000) == pytest.approx(P.host_recv_us * 1e-6)
    # A 120 MHz Pentium runs the host software 200/120 times longer; PIO is paced by PCI.
    p120 = build_myrinet(sim, MyrinetParams(send_method="pio", host="p120"), ["b"], None)
    cost = p120.nodes["b"].ni.host_send_cost
    assert cost is not None
    expected = P.host_send_us * 200 / 120 + (24 + 1000) / P.pio_write_mb_s
    assert cost(1000) * 1e6 == pytest.approx(expected)


# ---------------------------------------------------------------------------- size slopes


@pytest.mark.parametrize(
    ("transport", "slope_us_per_byte"),
    [
        # H2N DMA and the link overlap; the link (faster) starts late enough not to run dry;
        # the receive DMA to the host (slowest) runs behind the arriving bytes.
        ({"send_method": "dma"}, 1 / P.dma_h2n_mb_s - BYTE_US + 1 / P.dma_n2h_mb_s),
        ({"send_method": "dma", "tx_overlap": False}, 1 / P.dma_h2n_mb_s + 1 / P.dma_n2h_mb_s),
        (
            {"send_method": "dma", "rx_overlap": False},
            1 / P.dma_h2n_mb_s + 1 / P.dma_n2h_mb_s,
        ),
        ({"send_method": "pio-wc"}, 1 / P.pio_write_wc_mb_s + 1 / P.dma_n2h_mb_s),
        ({"send_method": "pio"}, 1 / P.pio_write_mb_s + 1 / P.dma_n2h_mb_s),
    ],
    ids=["dma", "dma-no-tx-overlap", "dma-no-rx-overlap", "pio-wc", "pio"],
)
def test_one_way_time_grows_at_the_rate_of_the_serial_stages(
    transport: Mapping[str, Any], slope_us_per_byte: float
) -> None:
    one_way = pingpong(transport, (1024, 4096))
    slope = (one_way[4096] - one_way[1024]) / 3072
    assert slope == pytest.approx(slope_us_per_byte, rel=1e-6)


def test_streams_run_at_the_bottleneck_stage() -> None:
    sizes = [1024, 4096]
    workload: dict[str, Any] = {"kind": "bandwidth", "modes": ["unidirectional"]}
    workload |= {"sizes": sizes, "messages": 100, "warmup": 5}
    # DMA: the receiver's host DMA engine (data, then the 24-byte descriptor) is the slowest.
    rows = run({"send_method": "dma"}, workload).rows
    for row, size in zip(rows, sizes, strict=True):
        per_message = 2 * P.lanai_dma_setup_us + (size + 24) / P.dma_n2h_mb_s
        assert row["lost"] == 0
        assert row["mb_s"] == pytest.approx(size / per_message, rel=0.02)
    # PIO with write combining: the sending CPU's copy into SRAM is the slowest.
    rows = run({"send_method": "pio-wc"}, workload).rows
    per_message = P.host_send_us + (4096 + 24) / P.pio_write_wc_mb_s
    assert rows[1]["mb_s"] == pytest.approx(4096 / per_message, rel=0.02)
    # One SRAM send buffer and no overlap: the LCP takes the next descriptor only when the
    # last packet has left SRAM, so LCP, H2N DMA and link serialize at the sender.
    slow = {"send_method": "dma", "tx_overlap": False, "overrides": {"sram_tx_buffers": 1}}
    rows = run(slow, workload).rows
    per_message = (
        lcp_us(P.lcp_send_cycles)
        + P.lanai_dma_setup_us
        + 4096 / P.dma_h2n_mb_s
        + lcp_us(P.net_dma_setup_cycles)
        + (4096 + P.packet_header_bytes) * BYTE_US
    )
    assert rows[1]["mb_s"] == pytest.approx(4096 / per_message, rel=0.01)


# ---------------------------------------------------------------------------- paper 004 Fig 2

SIZES = [2**k for k in range(2, 21)]  # 4 bytes to 1 MB


def test_dma_approaches_the_pci_peak_and_is_close_at_one_page() -> None:
    for method in ("dma-host", "dma-lanai"):
        for direction in ("h2n", "n2h"):
            curve = [host_ni_bandwidth(method, direction, n) for n in SIZES]
            assert curve == sorted(curve)
            assert 0.95 * P.pci_mb_s < curve[-1] <= P.pci_mb_s
            assert host_ni_bandwidth(method, direction, 4096) > 0.8 * P.pci_mb_s
    # NI-to-host is the bottleneck direction (paper 004 §4.2).
    assert host_ni_bandwidth("dma-lanai", "n2h", 1 << 20) < host_ni_bandwidth(
        "dma-lanai", "h2n", 1 << 20
    )


def test_lanai_initiated_dma_beats_host_initiated_from_32_bytes_to_4_kbytes() -> None:
    for direction in ("h2n", "n2h"):
        for n in (32, 64, 256, 1024, 2048, 4096):
            lanai = host_ni_bandwidth("dma-lanai", direction, n)
            assert lanai > 1.08 * host_ni_bandwidth("dma-host", direction, n)


def test_pio_write_combining_then_write_then_read() -> None:
    for n in SIZES:
        wc = host_ni_bandwidth("pio-wc", "h2n", n)
        write = host_ni_bandwidth("pio", "h2n", n)
        read = host_ni_bandwidth("pio", "n2h", n)
        assert wc > 3 * write and write > read
    with pytest.raises(ValueError, match="write combining"):
        host_ni_bandwidth("pio-wc", "n2h", 64)


def test_n2h_pio_wins_up_to_16_bytes_and_lanai_dma_from_32() -> None:
    # Paper 004 §4.2: the NI-to-host limit uses N2H PIO up to 16 bytes, LANai DMA beyond.
    for n in (4, 8, 16):
        assert host_ni_bandwidth("pio", "n2h", n) > host_ni_bandwidth("dma-lanai", "n2h", n)
    for n in (32, 64, 4096):
        assert host_ni_bandwidth("pio", "n2h", n) < host_ni_bandwidth("dma-lanai", "n2h", n)


def test_fig2_curves_and_times_are_consistent() -> None:
    for method, direction in FIG2_CURVES:
        for n in (16, 4096):
            time_us = host_ni_time_us(method, direction, n)
            assert host_ni_bandwidth(method, direction, n) == pytest.approx(n / time_us)
    assert host_ni_time_us("dma-host", "h2n", 0) == P.host_dma_setup_us
    faster = LanaiParams(lanai_dma_setup_us=0.5)
    assert host_ni_bandwidth("dma-lanai", "h2n", 64, faster) > host_ni_bandwidth(
        "dma-lanai", "h2n", 64
    )
    with pytest.raises(ValueError, match="positive"):
        host_ni_bandwidth("pio", "h2n", 0)


# ---------------------------------------------------------------------------- faults, stats


def test_corrupted_packets_are_dropped_and_counted() -> None:
    sim = Simulation(seed=5)
    got: list[bytes] = []

    async def main() -> None:
        params = MyrinetParams(faults=FaultParams(corrupt=1.0))
        cluster = build_myrinet(sim, params, ["a", "b"], None)
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        ep_a = a.os.create_endpoint(a.os.process("x"))
        ep_b = b.os.create_endpoint(b.os.process("y"))
        ch_a, _ = connect(ep_a, ep_b)
        for size in (0, 40, 1000, 4000, 10):
            await ep_a.send(ch_a, bytes(size))
        with trio.move_on_after(0.01):
            got.append((await ep_b.recv()).data)
        assert cluster.fabric.statistics().corrupted == 5
        ni = b.ni
        assert isinstance(ni, MyrinetNI)
        assert ni.statistics().dropped == {"corrupted": 5}
        assert ni.statistics().received == 0
        assert ni.sram_rx_bytes == 0 and 0 < ni.sram_rx_peak <= P.sram_bytes
        # The CRC fails after the last byte: the two long messages had already streamed into
        # the host's buffers, the three inline ones never left SRAM; no descriptor was sent.
        assert b.host.resources["bus"].holds == 2

    sim.run(main)
    assert got == []


def test_unknown_tags_are_dropped_by_the_lanai_without_crossing_pci() -> None:
    sim = Simulation(seed=5)

    async def main() -> None:
        cluster = build_myrinet(sim, MyrinetParams(), ["a", "b"], None)
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        ep_a = a.os.create_endpoint(a.os.process("x"))
        ep_b = b.os.create_endpoint(b.os.process("y"))
        ch_a, ch_b = connect(ep_a, ep_b)
        b.os.destroy_channel(ep_b.owner, ep_b, ch_b)
        for size in (8, 3000):
            await ep_a.send(ch_a, bytes(size))
        await trio.sleep(0.001)
        assert b.ni.statistics().dropped == {"unknown-tag": 2}
        assert b.host.resources["ni"].holds == 2  # the LCP looked at both headers
        assert b.host.resources["bus"].holds == 0

    sim.run(main)


def test_direct_deposit_and_dma_resources() -> None:
    sim = Simulation(seed=2)

    async def main() -> None:
        cluster = build_myrinet(sim, MyrinetParams(send_method="dma"), ["a", "b"], None)
        a, b = cluster.nodes["a"], cluster.nodes["b"]
        ep_a = a.os.create_endpoint(a.os.process("x"))
        config = EndpointConfig(direct_access=True)
        ep_b = b.os.create_endpoint(b.os.process("y"), config)
        ch_a, _ = connect(ep_a, ep_b)
        offset = ep_b.direct_window[0]
        await ep_a.send(ch_a, b"deposited" * 100, dest_offset=offset)
        message = await ep_b.recv()
        assert message.dest_offset == offset and message.data == b"deposited" * 100
        # The sender's host DMA engine read it, the receiver's wrote it; both LANais worked.
        for node, engine in ((a, "ni.send-dma"), (b, "ni.recv-dma")):
            resources = node.host.resources
            assert resources["bus"].holds >= 1 and resources["ni"].holds >= 1
            assert resources[engine].busy_time > 900 * BYTE_US * 1e-6

    sim.run(main)


def test_same_seed_same_numbers() -> None:
    # Myrinet faults are drawn per byte (the fabric's unit), so the rates are small.
    transport = {"send_method": "pio-wc", "faults": {"loss": 1e-4, "corrupt": 2.5e-5}}
    workload = {"kind": "bandwidth", "sizes": [64, 2048], "messages": 50, "warmup": 2}
    first = run(transport, workload, seed=7)
    again = run(transport, workload, seed=7)
    assert first.rows == again.rows
    lost = first.facts["messages_lost"]
    assert isinstance(lost, int) and lost > 0 and lost == again.facts["messages_lost"]


# ---------------------------------------------------------------------------- parameters


def test_every_number_is_cited() -> None:
    fields = attrs.fields(LanaiParams)
    numbers = {f.name for f in fields if isinstance(getattr(P, f.name), int | float)}
    cited = {c.name for c in citations(P)}
    assert cited == numbers and len(numbers) == 22
    for citation in citations(P):
        assert citation.cite.startswith(("paper 004", "estimated", "calibrated")), citation


def test_overrides_and_bad_parameters() -> None:
    faster = lanai_params({"clock_mhz": 66.0, "sram_tx_buffers": 4.0})
    assert faster.cycles_us(faster.lcp_send_cycles) == pytest.approx(50 / 66)
    assert faster.sram_tx_buffers == 4 and isinstance(faster.sram_tx_buffers, int)
    with pytest.raises(ConfigError, match="not a LanaiParams"):
        lanai_params({"warp_factor": 9.0})
    with pytest.raises(ConfigError, match="whole"):
        lanai_params({"sram_tx_buffers": 1.5})
    with pytest.raises(ConfigError, match="PCI"):
        lanai_params({"dma_n2h_mb_s": 200.0})
    with pytest.raises(ConfigError, match="unknown host"):
        build_myrinet(Simulation(), MyrinetParams(host="vax"), ["a"], None)
    with pytest.raises(ConfigError, match="send_method"):
        structure(MyrinetParams, {"send_method": "carrier-pigeon"}, "test", "transport")
