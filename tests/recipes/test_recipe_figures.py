"""A recipe and ``stacklib reproduce`` give the same figure for the same configuration: paper
000 Table 3's U-Net UDP and TCP rows from the ``udp-atm``, ``udp-atm-stream`` and ``tcp-atm``
recipes (run as ``stacklib run`` runs them) and from :mod:`stacklib.experiments.tcpip`.  Both
run in virtual time with the layers' own costs (the host model's per-datagram and per-segment
costs), so they agree to rounding: the experiment divides a total by the round trips, the
workload averages the samples."""

from __future__ import annotations

import attrs
import pytest

from stacklib.bench.streams import TcpStreamParams, UdpPingPongParams, UdpStreamParams
from stacklib.experiments import tcpip
from stacklib.recipes import load_recipe, run_recipe

#: Virtual time on both sides: only the last bits of the floating point sums may differ.
SAME = 1e-9


def test_udp_atm_recipe_gives_table_3s_udp_round_trip() -> None:
    recipe = load_recipe("udp-atm")
    assert isinstance(recipe.workload_params, UdpPingPongParams)
    assert tcpip.SMALL in recipe.workload_params.sizes
    params = attrs.evolve(
        recipe.workload_params, sizes=(0, tcpip.SMALL), iterations=tcpip.ROUND_TRIPS, warmup=2
    )
    rows = {row["size"]: row["rtt_us"] for row in run_recipe(recipe, workload_params=params).rows}
    assert rows[tcpip.SMALL] == pytest.approx(tcpip.unet_udp_rtt(tcpip.SMALL), rel=SAME)
    # The per-datagram cost is the UDP layer's: an empty datagram pays it too, four times
    # per round trip (a send and a receive on each side) beyond raw U-Net's path.
    assert rows[0] == pytest.approx(tcpip.unet_udp_rtt(0), rel=SAME)
    free = tcpip.unet_udp_rtt(0, datagram_us=0.0)
    assert rows[0] - free == pytest.approx(4 * tcpip.UDP_DATAGRAM_US, rel=1e-6)


def test_udp_atm_stream_recipe_gives_table_3s_udp_bandwidth() -> None:
    recipe = load_recipe("udp-atm-stream")
    assert isinstance(recipe.workload_params, UdpStreamParams)
    assert 4096 in recipe.workload_params.sizes
    datagrams = 20  # the experiment's 200 shortened: the same measurement
    params = attrs.evolve(recipe.workload_params, sizes=(4096,), datagrams=datagrams)
    (row,) = run_recipe(recipe, workload_params=params).rows
    mb_per_s, lost = tcpip.unet_udp_bandwidth(4096, datagrams)
    assert row["mb_per_s"] == pytest.approx(mb_per_s, rel=SAME)
    assert row["lost"] == lost == 0


def test_tcp_atm_recipe_gives_table_3s_tcp_round_trip_and_bandwidth() -> None:
    recipe = load_recipe("tcp-atm")
    assert isinstance(recipe.workload_params, TcpStreamParams)
    assert recipe.workload_params.request == tcpip.SMALL
    total = 64 * 1024  # the experiment's 1 MB shortened: the same measurement, fewer segments
    params = attrs.evolve(
        recipe.workload_params, size=total, rtt_iterations=tcpip.ROUND_TRIPS, rtt_warmup=2
    )
    (row,) = run_recipe(recipe, workload_params=params).rows
    assert row["rtt_us"] == pytest.approx(tcpip.unet_tcp_rtt(tcpip.SMALL), rel=SAME)
    assert row["mb_per_s"] == pytest.approx(tcpip.unet_tcp_bandwidth(8192, total), rel=SAME)
    # The host model's per-segment cost, as the experiment's calibration names it.
    assert tcpip.unet_tcp_rtt(tcpip.SMALL) == tcpip.unet_tcp_rtt(
        tcpip.SMALL, segment_us=tcpip.TCP_SEGMENT_US
    )
