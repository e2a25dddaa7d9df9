"""The generic LogP and bandwidth harness on the paper 004 libraries (Figs 3-12)."""

from __future__ import annotations

import pytest

from stacklib.bench.bandwidth import BandwidthParams, run_bandwidth
from stacklib.bench.result import Result
from stacklib.experiments.myrinet import logp_of, open_session
from tests.bench.test_bandwidth import number, rows_of


def column(result: Result, key: str) -> dict[int, float]:
    return {int(number(row, "size")): number(row, key) for row in result.rows}


def test_vmmc_receive_overhead_is_zero_and_its_send_overhead_flat() -> None:
    result = logp_of("vmmc", (64, 4096))
    assert max(abs(v) for v in column(result, "or_us").values()) < 0.05
    os_ = column(result, "os_us")
    assert os_[4096] == pytest.approx(os_[64], rel=0.2)
    rtt, latency = column(result, "rtt_half_us"), column(result, "l_us")
    assert latency[4096] == pytest.approx(rtt[4096] - os_[4096], rel=0.01)


def test_bip_gap_jumps_at_256_bytes_with_the_synchronization() -> None:
    g = column(logp_of("bip", (128, 255, 256)), "g_us")
    assert g[256] > 1.3 * g[255]


def test_am_is_measured_request_reply_and_has_the_highest_small_latency() -> None:
    am = logp_of("am", (4,))
    assert am.facts["method"] == "request-reply (AM)"
    others = [column(logp_of(n, (4,)), "rtt_half_us")[4] for n in ("bip", "fm", "pm", "vmmc")]
    assert column(am, "rtt_half_us")[4] > max(others)
    assert all(5.0 <= v <= 17.0 for v in others)


def test_three_bandwidths_on_a_zero_copy_library() -> None:
    sim, session = open_session("vmmc")
    params = BandwidthParams(sizes=(256, 65536), messages=20, warmup=2)
    result = sim.run(run_bandwidth, session, params)
    uni, ping = rows_of(result, "unidirectional"), rows_of(result, "pingpong")
    both = rows_of(result, "simultaneous")
    # Large messages run at the NI-to-host DMA limit; small ones pay per-message costs.
    assert 110 < number(uni[65536], "mb_s") < 128
    assert number(ping[256], "mb_s") < number(uni[256], "mb_s")
    assert number(both[65536], "mb_s") >= number(uni[65536], "mb_s") * 0.95
    assert all(number(row, "lost") == 0 for row in result.rows if row["mode"] != "unidirectional")


def test_same_seed_same_numbers() -> None:
    first = logp_of.__wrapped__("pm", (16,))  # bypass the cache: two fresh simulations
    second = logp_of.__wrapped__("pm", (16,))
    assert first.rows == second.rows


def test_am_pays_a_round_trip_per_long_message_yet_streams_long_ones_at_copy_speed() -> None:
    am = logp_of("am", (4096,))
    g, os_ = column(am, "g_us")[4096], column(am, "os_us")[4096]
    # One bulk buffer held until the reply: g is the round trip, well above the send's cost.
    assert g > os_ + 30.0
    sim, session = open_session("am")
    params = BandwidthParams(sizes=(4096, 131072), messages=6, warmup=1, modes=("unidirectional",))
    uni = rows_of(sim.run(run_bandwidth, session, params), "unidirectional")
    # 128 KB stores are copied and DMAed fragment by fragment: the copy sets the rate.
    assert number(uni[131072], "mb_s") > 1.8 * number(uni[4096], "mb_s")
    assert number(uni[131072], "mb_s") > 50.0
