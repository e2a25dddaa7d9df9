"""The xdp transport in the two-process benchmarks, beside the kernel's paths
(stacklib.bench.remote, stacklib.bench.kernel_paths)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stacklib.bench import remote
from stacklib.bench.kernel_paths import STOP, blocking_echo, blocking_pingpong, blocking_socket
from stacklib.bench.pingpong import PingPongParams, percentile, round_trip_row
from stacklib.bench.remote import (
    BLOCKING,
    KERNEL,
    RemoteBenchError,
    bench_transport,
    combine_best,
    make_params,
    phases,
)
from stacklib.bench.result import Column, Result
from stacklib.netns import capability_problem
from stacklib.transports.xdp.bpf import bpf_problem
from stacklib.transports.xdp.xsk import xdp_problem

REPO = Path(__file__).resolve().parents[2]


def _problem() -> str | None:
    return capability_problem() or bpf_problem() or xdp_problem()


needs_xdp = pytest.mark.skipif(_problem() is not None, reason=f"xdp unusable: {_problem()}")


# ==================================================================== the pieces


def test_percentile_is_the_nearest_rank() -> None:
    samples = [float(value) for value in range(1, 101)]  # 1 .. 100
    assert percentile(samples, 0.99) == 99.0
    assert percentile(samples, 0.5) == 50.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 1.0) == 3.0


def test_a_round_trip_row_carries_median_and_p99() -> None:
    samples = [10e-6] * 98 + [500e-6, 900e-6]
    row = round_trip_row(40, samples)
    assert row["median_us"] == pytest.approx(10.0)
    assert row["p99_us"] == pytest.approx(500.0)
    assert row["min_us"] == pytest.approx(10.0)


def test_the_phases_of_xdp() -> None:
    unet = ["xdp", "xdp-trio", "xdp-trio-1cpu"]
    assert phases("xdp", "pingpong", False) == unet
    assert phases("xdp", "pingpong", True) == [*unet, *BLOCKING, *KERNEL, "ether"]
    # One CPU: no two-CPU row; bandwidth and logp have no blocking ping-pong.
    assert phases("xdp", "pingpong", True, (None, None)) == [
        "xdp",
        "xdp-trio",
        "kernel-udp-blocking-1cpu",
        *KERNEL,
        "ether",
    ]
    assert phases("xdp", "logp", True) == [*unet, *KERNEL, "ether"]
    assert phases("shm", "pingpong", True) == ["shm", *KERNEL]


def _result(rows: list[dict[str, object]]) -> Result:
    return Result(
        title="t",
        columns=[Column("size", "size"), Column("median_us", "median")],
        rows=rows,  # type: ignore[arg-type]
    )


def test_combine_best_takes_each_size_s_best_kernel_row() -> None:
    results = {
        "xdp": _result([{"size": 40, "median_us": 20.0}, {"size": 1000, "median_us": 40.0}]),
        "kernel-udp-blocking-1cpu": _result(
            [{"size": 40, "median_us": 10.0}, {"size": 1000, "median_us": 80.0}]
        ),
        "kernel-udp": _result([{"size": 40, "median_us": 30.0}, {"size": 1000, "median_us": 60.0}]),
    }
    table = combine_best("xdp", "pingpong", results)
    gains = {(row["path"], row["size"]): row["gain"] for row in table.rows}
    assert gains[("xdp", 40)] == pytest.approx(10.0 / 20.0)
    assert gains[("xdp", 1000)] == pytest.approx(60.0 / 40.0)
    assert gains[("kernel-udp-blocking-1cpu", 40)] == pytest.approx(1.0)
    assert gains[("kernel-udp", 40)] == pytest.approx(10.0 / 30.0)
    assert table.facts["kernel_best"] == "40: kernel-udp-blocking-1cpu, 1000: kernel-udp"


def test_combine_best_for_rates_and_without_kernel_rows() -> None:
    def rate(value: float) -> Result:
        return Result(title="b", columns=[], rows=[{"mode": "pingpong", "size": 64, "mb_s": value}])

    table = combine_best("xdp", "bandwidth", {"xdp": rate(30.0), "kernel-tcp": rate(10.0)})
    assert table.rows[0]["gain"] == pytest.approx(3.0)
    alone = combine_best("xdp", "bandwidth", {"xdp": rate(30.0)})
    assert alone.rows[0]["gain"] is None


# ==================================================================== blocking kernel UDP


def test_blocking_pingpong_against_a_blocking_echo() -> None:
    with blocking_socket("127.0.0.1", 2.0) as server, blocking_socket("127.0.0.1", 2.0) as client:
        echoed: list[int] = []
        thread = threading.Thread(target=lambda: echoed.append(blocking_echo(server)))
        thread.start()
        params = PingPongParams(sizes=(0, 40, 1000), iterations=20, warmup=2)
        result = blocking_pingpong(client, server.getsockname(), params)
        thread.join(10)
        assert not thread.is_alive(), "the echo did not stop on STOP"
    assert echoed == [3 * 22]
    assert [row["size"] for row in result.rows] == [0, 40, 1000]
    for row in result.rows:
        assert 0 < float(row["min_us"]) <= float(row["median_us"]) <= float(row["p99_us"])  # type: ignore[arg-type]


def test_a_blocking_echo_whose_peer_went_away_stops() -> None:
    with (
        blocking_socket("127.0.0.1", 0.05) as server,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client,
    ):
        client.settimeout(2)
        client.sendto(b"one", server.getsockname())
        echoed: list[int] = []
        thread = threading.Thread(target=lambda: echoed.append(blocking_echo(server)))
        thread.start()
        assert client.recv(100) == b"one"
        thread.join(10)  # no STOP: two receive timeouts without an arrival end it
        assert not thread.is_alive()
    assert echoed == [1]
    assert STOP[0] == 0xFF  # never the first byte of a ping-pong message (0, 1, 2, ...)


def test_a_blocking_pingpong_without_an_echo_times_out() -> None:
    with blocking_socket("127.0.0.1", 0.05) as client, blocking_socket("127.0.0.1", 1) as mute:
        params = PingPongParams(sizes=(40,), iterations=2, warmup=0)
        with pytest.raises(TimeoutError, match="no reply"):
            blocking_pingpong(client, mute.getsockname(), params)


# ==================================================================== the command


def test_xdp_without_what_it_needs_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import stacklib.transports.xdp.xsk

    monkeypatch.setattr(stacklib.transports.xdp.xsk, "xdp_problem", lambda: "no AF_XDP here")
    monkeypatch.setattr(remote, "_two_processes", None)  # never reached
    import stacklib.netns
    import stacklib.transports.xdp.bpf

    monkeypatch.setattr(stacklib.netns, "capability_problem", lambda: None)
    monkeypatch.setattr(stacklib.transports.xdp.bpf, "bpf_problem", lambda: None)
    params = make_params("pingpong", {"sizes": (40,), "iterations": 1})
    with pytest.raises(RemoteBenchError, match="xdp transport cannot run here: no AF_XDP here"):
        bench_transport("pingpong", params, "xdp", compare=True)


def test_compare_without_a_value_means_the_kernel() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stacklib.cli", "bench", "pingpong", "--transport", "memory",
         "--sizes", "40", "--iterations", "10", "--compare", "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=True,
    )  # fmt: skip
    rows = json.loads(done.stdout)["rows"]
    assert [row["path"] for row in rows] == ["memory", "kernel-udp", "kernel-tcp"]
    assert all("p99_us" in row and "median_us" in row for row in rows)


# ==================================================================== between two namespaces


def _run(workload: str, given: dict[str, object]) -> dict[str, list[dict[str, object]]]:
    params = make_params(workload, given)
    result = bench_transport(workload, params, "xdp", compare=True, timeout=120)
    paths: dict[str, list[dict[str, object]]] = {}
    for row in json.loads(result.to_json())["rows"]:
        paths.setdefault(row["path"], []).append(row)
    assert result.facts["transport"] == "xdp"
    return paths


@needs_xdp
@pytest.mark.slow
def test_pingpong_over_xdp_against_the_kernel() -> None:
    paths = _run("pingpong", {"sizes": (40, 1000), "iterations": 30, "warmup": 2})
    assert list(paths) == phases("xdp", "pingpong", True, remote._cpus())
    for rows in paths.values():
        assert [row["size"] for row in rows] == [40, 1000]
        for row in rows:
            assert row["median_us"] > 0 and row["p99_us"] >= row["median_us"]  # type: ignore[operator]
            assert row["gain"] > 0  # type: ignore[operator]


@needs_xdp
@pytest.mark.slow
def test_bandwidth_over_xdp_against_the_kernel() -> None:
    given = {"sizes": (64,), "messages": 40, "warmup": 2, "modes": ("pingpong",)}
    workload = "bandwidth"
    paths = _run(workload, given)
    assert list(paths) == phases("xdp", workload, True, remote._cpus())
    for rows in paths.values():
        (row,) = rows
        assert row["mode"] == "pingpong" and row["received"] == 40


@needs_xdp
@pytest.mark.slow
def test_logp_over_xdp_against_the_kernel() -> None:
    given = {"sizes": (16,), "messages": 20, "delay_factors": (1.0, 2.0)}
    workload = "logp"
    paths = _run(workload, given)
    assert list(paths) == phases("xdp", workload, True, remote._cpus())
    for rows in paths.values():
        (row,) = rows
        assert row["rtt_half_us"] > 0  # type: ignore[operator]
