"""``stacklib bench xdp``: every row between two namespaces (tiny counts), and its table logic.

The run itself needs root, network namespaces, AF_XDP and bpf(2), and skips with the reason
otherwise.  Timings are never asserted: the rows' values are whatever the machine gives; what
is checked is that every measurement ran, counted what it sent, and that UAM delivered every
message once and in order (its go-back-N guarantees that whatever the timing).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacklib.bench import xdp
from stacklib.bench.peers.xdp import Role, _round_trips
from stacklib.bench.xdp import XdpBenchError, XdpBenchParams, bench_xdp, xdp_bench_problem
from stacklib.cli import main
from stacklib.netns import remove_stale

PROBLEM = xdp_bench_problem()
needs_xdp = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")
TINY = XdpBenchParams(iterations=50, messages=300, uam_messages=200, window=16)


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers_from_killed_runs() -> None:
    if PROBLEM is None:
        remove_stale("slxdp")


@needs_xdp
@pytest.mark.slow
def test_every_row_runs_between_two_namespaces() -> None:
    result = bench_xdp(TINY)
    rows = {str(row["what"]): row for row in result.rows}
    assert len(rows) == 8
    for row in result.rows:
        assert row.get("holds") in (None, "yes", "NO")
    median = next(r for w, r in rows.items() if w.startswith("40 B round trip, median"))
    assert isinstance(median["xdp"], float) and median["xdp"] > 0
    assert isinstance(median["kernel"], float) and median["kernel"] > 0
    streams = [r for w, r in rows.items() if w.startswith("stream of") and "absolute" not in w]
    assert len(streams) == 2
    for row in streams:
        # Losses are counted, never negative: nothing arrives that was not sent.
        for lost in str(row["lost"]).split(" / "):
            assert 0 <= int(lost.replace(",", "")) <= TINY.messages
    uam = next(r for w, r in rows.items() if w.startswith("UAM stream"))
    assert uam["holds"] == "yes"
    assert uam["lost"] == "0"
    assert result.facts["uam delivered in order"] == "200 of 200"
    assert "program redirected=" in str(result.facts["stream xdp 64: receiver counters"])


@needs_xdp
@pytest.mark.slow
def test_the_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "xdp", "--iterations", "20", "--messages", "100", "--uam-messages", "50"]
    assert main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [c["key"] for c in printed["columns"]][:3] == ["what", "xdp", "kernel"]
    assert len(printed["rows"]) == 8
    assert printed["facts"]["uam delivered in order"] == "50 of 50"


def test_a_missing_capability_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(xdp, "xdp_bench_problem", lambda: "AF_XDP sockets need CAP_NET_RAW")
    with pytest.raises(XdpBenchError, match="cannot run here: AF_XDP sockets need CAP_NET_RAW"):
        bench_xdp(TINY)
    assert main(["bench", "xdp"]) == 2  # one line on stderr, no traceback


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="messages"):
        XdpBenchParams(messages=1)
    assert main(["bench", "xdp", "--window", "0"]) == 2


def test_round_trip_statistics() -> None:
    samples = [1000 * n for n in range(1, 101)]  # 1..100 us
    stats = _round_trips(samples)
    assert stats["median_us"] == 51.0
    assert stats["p99_us"] == 100.0
    assert stats["mean_us"] == 50.5


def test_a_role_becomes_its_command_line() -> None:
    argv = Role("udp-ping", "eth0", cpu=1, count=5, size=7, address="10.0.0.2").argv()
    assert argv[3:] == [
        "udp-ping", "--interface", "eth0", "--count", "5", "--size", "7", "--window", "64",
        "--port", "1", "--address", "10.0.0.2", "--cpu", "1",
    ]  # fmt: skip


def _reports(
    xdp_median: float, kernel_medians: tuple[float, float], rates: dict[str, float | None]
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    ni = {"received": 9, "dropped": {}, "socket": {"rx_dropped": 0, "rx_ring_full": 0}}
    ni["socket"]["rx_fill_ring_empty_descs"] = 0

    def ping(median: float) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"echoed": 10}, {"median_us": median, "p99_us": 2 * median}

    def stream(rate: float | None, received: int = 10) -> tuple[dict[str, Any], dict[str, Any]]:
        return {"received": received, "rate": rate, "size": 1497, "ni": ni}, {"sent": 10}

    uam_sink = {"received": 10, "in_order": 10, "rate": 5.0, "ni": ni}
    return {
        "ping xdp": ping(xdp_median),
        "ping udp 1cpu": ping(kernel_medians[0]),
        "ping udp 2cpu": ping(kernel_medians[1]),
        "stream xdp 64": stream(rates["xdp 64"], received=9),
        "stream udp 64": stream(rates["udp 64"]),
        "stream xdp full": stream(rates["xdp full"]),
        "stream udp full": stream(rates["udp full"]),
        "uam": (uam_sink, {"sent": 10, "uam": {"retransmitted": 0}}),
    }


def test_targets_are_judged_against_the_kernels_best() -> None:
    params = XdpBenchParams(uam_messages=10)
    rates: dict[str, float | None] = {
        "xdp 64": 2_000_000.0,
        "udp 64": 900_000.0,
        "xdp full": 100.0,
        "udp full": 100.0,
    }
    result = xdp._table(params, _reports(5.0, (8.0, 12.0), rates), (0, 1))
    median = result.rows[0]
    assert "1 CPU" in str(median["what"])  # the kernel's best placement
    assert median["kernel"] == 8.0 and median["holds"] == "NO"  # 5 > 0.5 * 8
    stream = result.rows[4]
    assert stream["what"] == "stream of 64 B, at the receiver"
    assert stream["holds"] == "yes" and stream["lost"] == "1 / 0"  # 2.2x the kernel
    assert result.rows[5]["holds"] == "yes"  # >= 1,000,000 frames/s
    full = next(r for r in result.rows if "1514-byte" in str(r["what"]))
    assert full["ratio"] == 1.0 and full["holds"] == "NO"
    assert result.rows[-1]["holds"] == "yes"
    assert any("NO" in note for note in result.notes)
    result = xdp._table(params, _reports(3.0, (8.0, 6.0), {**rates, "udp full": None}), (0, 1))
    assert "2 CPUs" in str(result.rows[0]["what"])
    assert result.rows[0]["holds"] == "yes"  # 3 <= 0.5 * 6
    full = next(r for r in result.rows if "1514-byte" in str(r["what"]))
    assert full["ratio"] is None and full["holds"] == "NO"  # no baseline: not shown to hold
