"""The UDP and TCP workloads from the shipped recipes (tiny sizes), and the TCP bulk benchmark."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

from stacklib.bench.streams import TcpStreamParams, UdpPingPongParams, UdpStreamParams
from stacklib.bench.tcp_bulk import bench_tcp, kernel_transfer, stacklib_transfer
from stacklib.recipes import load_recipe, run_recipe

RECIPES = Path(__file__).resolve().parents[2] / "stacklib" / "recipes"


@pytest.mark.parametrize(
    ("name", "sizes"),
    [("udp-atm", (0, 1000, 8000)), ("udp-fe", (0, 1469))],
)
def test_udp_recipes_run(name: str, sizes: tuple[int, ...]) -> None:
    recipe = load_recipe(RECIPES / f"{name}.toml")
    assert isinstance(recipe.workload_params, UdpPingPongParams)
    params = attrs.evolve(recipe.workload_params, sizes=sizes, iterations=2, warmup=1)
    result = run_recipe(recipe, workload_params=params)
    assert [row["size"] for row in result.rows] == list(sizes)
    assert result.facts["lost"] == 0
    assert result.facts["server"] == "10.0.0.2:7"
    rtts = [row["rtt_us"] for row in result.rows if isinstance(row["rtt_us"], float)]
    assert len(rtts) == len(sizes) and rtts[0] > 0
    assert rtts == sorted(rtts)  # virtual time: bigger datagrams take longer


def test_udp_size_over_the_path_limit_is_refused() -> None:
    recipe = load_recipe(RECIPES / "udp-fe.toml")
    params = attrs.evolve(recipe.workload_params, sizes=(1470,), iterations=1, warmup=0)
    with pytest.raises(ValueError, match="1469"):
        run_recipe(recipe, workload_params=params)


def test_udp_stream_recipe_runs_and_counts_losses() -> None:
    recipe = load_recipe(RECIPES / "udp-atm-stream.toml")
    assert isinstance(recipe.workload_params, UdpStreamParams)
    params = attrs.evolve(recipe.workload_params, sizes=(1024, 4096), datagrams=10)
    result = run_recipe(recipe, workload_params=params)
    assert [row["size"] for row in result.rows] == [1024, 4096]
    assert all(row["received"] == 10 and row["lost"] == 0 for row in result.rows)
    rates = [row["mb_per_s"] for row in result.rows]
    assert all(isinstance(rate, float) for rate in rates)
    assert rates == sorted(rates)  # virtual time: bigger datagrams amortise the fixed costs
    # U-Net's receiver keeps up (paper 000 §7.6: no losses); with no room in the receive
    # buffer every datagram is dropped, and the stream reports them lost and no bandwidth.
    none = attrs.evolve(params, sizes=(4096,), rcvbuf_datagrams=0, drain=0.01)
    (row,) = run_recipe(recipe, workload_params=none).rows
    assert (row["received"], row["lost"], row["mb_per_s"]) == (0, 10, None)


def test_udp_stream_size_over_the_path_limit_is_refused() -> None:
    recipe = load_recipe(RECIPES / "udp-atm-stream.toml")
    params = attrs.evolve(recipe.workload_params, sizes=(65000,), datagrams=1)
    with pytest.raises(ValueError, match="maximum message"):
        run_recipe(recipe, workload_params=params)


@pytest.mark.parametrize("name", ["tcp-atm", "tcp-fe", "tcp-memory"])
def test_tcp_recipes_run(name: str) -> None:
    recipe = load_recipe(RECIPES / f"{name}.toml")
    assert isinstance(recipe.workload_params, TcpStreamParams)
    params = TcpStreamParams(size=50_000, chunk=3000, rtt_iterations=3, request=4)
    result = run_recipe(recipe, workload_params=params)
    (row,) = result.rows
    assert result.facts["received"] == 50_000
    assert result.facts["server"] == "10.0.0.2"
    assert isinstance(row["mb_per_s"], float) and row["mb_per_s"] > 0
    assert isinstance(row["rtt_us"], float) and row["rtt_us"] > 0
    segments = result.facts["segments_sent_by_node0"]
    assert isinstance(segments, int) and segments >= 50_000 // 2048


def test_tcp_atm_is_deterministic_and_uses_2048_byte_segments() -> None:
    recipe = load_recipe(RECIPES / "tcp-atm.toml")
    params = TcpStreamParams(size=20_480, chunk=8192, rtt_iterations=2)
    first = run_recipe(recipe, workload_params=params)
    second = run_recipe(recipe, workload_params=params)
    assert first.rows == second.rows
    assert recipe.layers[1][1].mss == 2048
    assert recipe.layers[1][1].receive_buffer == 8192


def test_stacklib_bulk_transfer_counts_segments() -> None:
    elapsed, segments = trio.run(stacklib_transfer, 64 * 2048, 16384, 2048)
    assert elapsed > 0
    assert segments == 64
    # Acknowledging every second segment changes what the receiver sends, not the data.
    elapsed, segments = trio.run(stacklib_transfer, 64 * 2048, 16384, 2048, 0.001)
    assert elapsed > 0
    assert segments == 64


def test_kernel_loopback_transfer() -> None:
    assert trio.run(kernel_transfer, 100_000, 8192) > 0


def test_bench_tcp_reports_four_paths() -> None:
    result = bench_tcp(size=9140 * 4, chunk=8192, repeat=1)
    assert [row["mss"] for row in result.rows] == [2048, 2048, 9140, None]
    assert "ACK every 2nd" in str(result.rows[1]["path"])
    segments = result.rows[2]["segments"]
    assert isinstance(segments, int) and 4 <= segments <= 8
    rate = result.facts["segments_per_s_2048_ack_every_2nd"]
    assert isinstance(rate, float) and rate > 0
    assert result.facts["meets_target"] in ("yes", "no")
