"""The paper 004 §3 platform: Fig 2's shape, link timing, misuse."""

from __future__ import annotations

import pytest

from stacklib.sim import RealWorld, Simulation, citations
from stacklib.transports.sim.lanai4 import Lanai4Cluster, Lanai4Params, fig2

ROWS = {int(row["size"]): row for row in fig2()}


def test_lanai_started_dma_beats_host_started_for_small_and_medium_transfers() -> None:
    for size in (32, 64, 256, 1024, 4096):
        assert ROWS[size]["dma-lanai h2n"] > ROWS[size]["dma-host h2n"]
        assert ROWS[size]["dma-lanai n2h"] > ROWS[size]["dma-host n2h"]


def test_dma_approaches_the_pci_peak_even_for_one_page() -> None:
    assert 0.9 * 133 < ROWS[4096]["dma-lanai h2n"] < 133
    assert 0.95 * 133 < ROWS[65536]["dma-host h2n"] < 133


def test_pio_reads_are_slowest_and_write_combining_fastest() -> None:
    row = ROWS[4096]
    assert row["pio n2h"] < row["pio h2n"] < row["pio-wc h2n"]


def test_ni_to_host_is_slower_than_host_to_ni() -> None:
    for size in (1024, 65536):
        assert ROWS[size]["dma-lanai n2h"] < ROWS[size]["dma-lanai h2n"]


def test_a_packet_crosses_the_link_at_1_28_gbit_s_plus_the_switch() -> None:
    sim = Simulation()
    cluster = Lanai4Cluster(sim)
    a, b = cluster.node_list
    params = cluster.params
    first, last = cluster.wire(a, b, 4096, 0.0, 0.0)
    total = 4096 + params.ni.packet_header_bytes
    wire = total * 8 / 1.28e9
    # The receive DMA engine passes each pipeline unit on once it has all of it.
    unit = wire / -(-total // params.chunk_bytes)
    assert last == pytest.approx(wire + 100e-9 + unit, rel=1e-6)
    assert first < last  # cut-through: the first unit is out long before the last
    # A second packet queues behind the first on the sender's network DMA engine.
    _, last2 = cluster.wire(a, b, 4096, 0.0, 0.0)
    assert last2 == pytest.approx(last + wire, rel=1e-6)


def test_copies_slow_down_past_the_l2_cache() -> None:
    params = Lanai4Params()
    assert params.copy(4096, 512 * 1024) > params.copy(4096, 4096)


def test_every_number_is_cited() -> None:
    names = {c.name for c in citations(Lanai4Params())}
    assert {"l2_cache_bytes", "forward_reset_ms", "ni.link_gbit_s", "ni.pci_mb_s"} <= names


def test_the_platform_needs_virtual_time_and_distinct_nodes() -> None:
    with pytest.raises(ValueError, match="Simulation"):
        Lanai4Cluster(RealWorld())
    with pytest.raises(ValueError, match="distinct"):
        Lanai4Cluster(Simulation(), nodes=["a", "a"])
    with pytest.raises(ValueError, match="unknown host"):
        Lanai4Params(host="cray")
