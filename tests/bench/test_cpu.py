"""``stacklib bench cpu``: UAM request/reply's CPU per round trip, both sides in one process."""

from __future__ import annotations

import pytest

from stacklib.bench import cpu


def test_the_machine_pair_times_round_trips() -> None:
    seconds = cpu.machine_pair(50, warmup=10)
    assert 0 < seconds < 0.01


def test_the_service_pair_times_round_trips_over_shm() -> None:
    seconds = cpu.service_pair(50, warmup=10)
    assert 0 < seconds < 0.01


def test_a_trio_pass_is_timed_between_round_trips() -> None:
    seconds = cpu.trio_pass(20, warmup=5)
    assert 0 < seconds < 0.01


def test_bench_cpu_reports_each_row_on_the_pure_modules() -> None:
    result = cpu.bench_cpu(iterations=20, repeat=1, only=["machine"], pure=True)
    assert [row["measurement"] for row in result.rows] == [cpu.MEASUREMENTS["machine"][0]]
    assert result.rows[0]["vs_pure"] == 1.0
    assert result.facts == {"iterations": 20, "repeat": 1}


def test_bench_cpu_rejects_an_unknown_row_and_no_iterations() -> None:
    with pytest.raises(ValueError, match="no measurement 'wire'"):
        cpu.bench_cpu(only=["wire"], pure=True)
    with pytest.raises(ValueError, match="must be positive"):
        cpu.bench_cpu(iterations=0, pure=True)


def test_the_cli_runs_bench_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    from stacklib.cli import main

    assert main(["bench", "cpu", "--pure", "--iterations", "10", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "UAM machine pair" in out and "UAM service pair" in out
    assert "a trio checkpoint" in out
