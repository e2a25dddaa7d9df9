"""The measurement harness between two processes on real transports (stacklib.bench.remote)."""

from __future__ import annotations

import pytest
import trio

from stacklib.bench import remote
from stacklib.bench.remote import (
    KernelTcpService,
    RemoteBenchError,
    bench_transport,
    combine,
    make_params,
)
from stacklib.bench.result import Column, Result
from stacklib.netns import capability_problem

TINY_PINGPONG = {"sizes": (40, 1000), "iterations": 30, "warmup": 2}


def rows_by_path(result: Result) -> dict[str, list[dict[str, object]]]:
    paths: dict[str, list[dict[str, object]]] = {}
    for row in result.rows:
        paths.setdefault(str(row["path"]), []).append(dict(row))
    return paths


def test_pingpong_over_shm_between_two_processes_with_kernel_comparison() -> None:
    params = make_params("pingpong", TINY_PINGPONG)
    result = bench_transport("pingpong", params, "shm", compare=True, timeout=60)
    paths = rows_by_path(result)
    assert list(paths) == ["shm", "kernel-udp", "kernel-tcp"]
    for path, rows in paths.items():
        assert [row["size"] for row in rows] == [40, 1000]
        for row in rows:
            assert float(row["rtt_us"]) > 0  # type: ignore[arg-type]
            if path != "shm":
                # The gain is the kernel's median RTT over shm's at the same size.
                shm = next(r for r in paths["shm"] if r["size"] == row["size"])
                expected = float(row["median_us"]) / float(shm["median_us"])  # type: ignore[arg-type]
                assert row["gain"] == pytest.approx(expected)
    assert result.facts["transport"] == "shm"


def test_bandwidth_over_udp_loopback_counts_what_arrived() -> None:
    params = make_params(
        "bandwidth", {"sizes": (64,), "messages": 50, "warmup": 2, "modes": ("pingpong",)}
    )
    result = bench_transport("bandwidth", params, "udp", timeout=60)
    (row,) = result.rows
    assert row["mode"] == "pingpong" and row["received"] == 50 and row["lost"] == 0
    assert "udp, two processes" in result.title


def test_logp_in_process_over_memory() -> None:
    params = make_params("logp", {"sizes": (16,), "messages": 20, "delay_factors": (1.0, 2.0)})
    result = bench_transport("logp", params, "memory")
    (row,) = result.rows
    assert float(row["rtt_half_us"]) > 0  # type: ignore[arg-type]


def test_a_failing_rank_is_reported() -> None:
    # 70,000 bytes fit no shm endpoint of the bootstrap's default size: rank 0 refuses.
    params = make_params("pingpong", {"sizes": (70_000,), "iterations": 1})
    with pytest.raises(
        RemoteBenchError, match="rank 0: ConfigError: workload: sizes: message size 70000"
    ):
        bench_transport("pingpong", params, "shm", timeout=60)


def test_misuse_is_named() -> None:
    params = make_params("pingpong", {})
    with pytest.raises(ValueError, match="no transport 'carrier-pigeon'"):
        bench_transport("pingpong", params, "carrier-pigeon")
    with pytest.raises(ValueError, match="--netns applies to udp, ether and xdp"):
        bench_transport("pingpong", params, "shm", netns=True)
    with pytest.raises(ValueError, match="no workload 'tcp-stream'"):
        make_params("tcp-stream", {})


def test_namespaces_without_the_capability_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import stacklib.netns

    monkeypatch.setattr(stacklib.netns, "capability_problem", lambda: "not root (uid 1000)")
    params = make_params("pingpong", TINY_PINGPONG)
    with pytest.raises(RemoteBenchError, match=r"two network namespaces .*not root"):
        bench_transport("pingpong", params, "ether")


@pytest.mark.skipif(capability_problem() is not None, reason=f"{capability_problem()}")
@pytest.mark.parametrize("transport", ["udp", "ether"])
def test_pingpong_across_two_namespaces(transport: str) -> None:
    import os

    from stacklib.netns import namespaces

    params = make_params("pingpong", {"sizes": (40,), "iterations": 20, "warmup": 2})
    result = bench_transport(
        "pingpong", params, transport, compare=True, netns=transport == "udp", timeout=60
    )
    assert list(rows_by_path(result)) == [transport, "kernel-udp", "kernel-tcp"]
    # Created and deleted (other runs on the machine may have namespaces of their own).
    assert not [name for name in namespaces() if name.startswith(f"slbench-{os.getpid()}-")]


def test_combine_computes_gains_for_times_and_rates() -> None:
    def table(rate: float) -> Result:
        return Result(
            "bandwidth",
            [Column("mode", "mode"), Column("size", "size"), Column("mb_s", "MB/s")],
            [{"mode": "pingpong", "size": 64, "mb_s": rate}, {"mode": "x", "size": 1}],
        )

    result = combine("shm", "bandwidth", {"shm": table(30.0), "kernel-udp": table(10.0)})
    gains = [row.get("gain") for row in result.rows]
    assert gains == [None, None, 3.0, None]  # shm rows have none; a missing figure gives none
    assert result.columns[0].key == "path" and result.columns[-1].key == "gain"


async def test_kernel_tcp_service_keeps_message_boundaries() -> None:
    udp, tcp = await remote._kernel_pair("127.0.0.1")
    a, b = tcp
    assert isinstance(a, KernelTcpService)
    sizes = [0, 1, 40, 70_000, 3]
    for size in sizes:
        await a.send(0, bytes([size & 0xFF]) * size)
    for size in sizes:
        assert await b.recv() == (0, bytes([size & 0xFF]) * size)
    await udp[1].send(0, b"over udp")
    with trio.fail_after(5):
        assert await udp[0].recv() == (0, b"over udp")


def test_ether_bootstrap_needs_an_interface(tmp_path: object) -> None:
    from stacklib.launch import LaunchError, bootstrap

    env = {
        "STACKLIB_RANK": "0",
        "STACKLIB_SIZE": "2",
        "STACKLIB_RENDEZVOUS": str(tmp_path),
        "STACKLIB_TRANSPORT": "ether",
    }
    with pytest.raises(LaunchError, match="needs STACKLIB_INTERFACE"):
        bootstrap(env)
    with pytest.raises(LaunchError, match="knows shm, udp, ether and xdp"):
        bootstrap({**env, "STACKLIB_TRANSPORT": "carrier-pigeon"})


def test_bench_real_runs_only_the_named_measurements() -> None:
    from stacklib.bench.real import bench_real

    result = bench_real(iterations=200, repeat=1, only=["uam"], pure=True)
    (row,) = result.rows
    assert str(row["measurement"]).startswith("UAM request/reply")
    assert row["met"] in ("yes", "no") and float(row["value"]) > 0  # type: ignore[arg-type]
    assert "udp_to_shm_rtt_ratio" not in result.facts  # needs both ping-pongs
    with pytest.raises(ValueError, match="no measurement 'uam2'"):
        bench_real(only=["uam2"])
