"""The mpi4py baselines: the runner, its errors, the scripts, and the SPMD comparison."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stacklib.bench import mpi
from stacklib.bench.mpi import MpiRunError, MpiSetup, MpiUnavailable, find_mpi, parse_result
from stacklib.bench.real import bench_real
from stacklib.bench.spmd import bench_spmd

try:
    SETUP: MpiSetup | None = find_mpi()
    REASON = ""
except MpiUnavailable as error:
    SETUP, REASON = None, str(error)

needs_mpi = pytest.mark.skipif(SETUP is None, reason=f"mpi4py baseline unavailable: {REASON}")


def test_missing_mpirun_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("STACKLIB_MPIRUN", raising=False)
    with pytest.raises(MpiUnavailable, match=r"no mpirun on PATH.*openmpi-bin"):
        find_mpi()


def test_python_without_mpi4py_is_named(tmp_path: Path) -> None:
    mpirun = tmp_path / "mpirun"
    mpirun.write_text("#!/bin/sh\n")
    mpirun.chmod(mpirun.stat().st_mode | stat.S_IXUSR)
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": str(tmp_path), "STACKLIB_MPI_PYTHON": str(python)}
    with pytest.raises(MpiUnavailable, match="cannot import mpi4py"):
        find_mpi(env)


def test_bench_real_skips_mpi_rows_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("STACKLIB_MPIRUN", raising=False)
    result = bench_real(iterations=20, repeat=1, only=["udp1"], compare="mpi")
    assert [row["measurement"] for row in result.rows] == [
        "40 B ping-pong, kernel UDP, blocking sockets (1 CPU)"
    ]
    assert any("mpi4py rows skipped: no mpirun" in note for note in result.notes)


def test_bench_real_rejects_an_unknown_comparison() -> None:
    with pytest.raises(ValueError, match="no comparison 'mpich'"):
        bench_real(iterations=20, repeat=1, only=["udp1"], compare="mpich")


def test_parse_result_takes_rank_zeros_last_json_line() -> None:
    text = 'warning: something\n{"buffer": 1.5e-06}\nnoise\n{"buffer": 2e-06, "rate": 0.5}\n'
    assert parse_result(text) == {"buffer": 2e-06, "rate": 0.5}


@pytest.mark.parametrize("text", ["", "no json here\n", "[1, 2]\n"])
def test_parse_result_without_a_result_line(text: str) -> None:
    with pytest.raises(MpiRunError, match="no JSON result line"):
        parse_result(text)


def test_parse_result_malformed_json() -> None:
    with pytest.raises(MpiRunError, match="malformed JSON"):
        parse_result('{"buffer": \n')


def test_command_pins_ranks_to_cores_and_ships_the_script() -> None:
    setup = MpiSetup("/x/mpirun", "/x/python3")
    command = mpi.mpi_command(setup, "p2p", 2, ["--size=40"], pinned=True)
    assert command[0] == "/x/mpirun"
    assert command[command.index("-n") + 1] == "2"
    assert command[command.index("--bind-to") + 1] == "core"
    script = Path(command[-2])
    assert command[-3:] == ["/x/python3", str(script), "--size=40"]
    assert script.is_file() and script.name == "p2p.py"
    assert "stacklib" not in {
        line.split()[1].split(".")[0]
        for line in script.read_text().splitlines()
        if line.startswith(("import ", "from "))
    }
    unbound = mpi.mpi_command(setup, "spmd", 4)
    assert unbound[unbound.index("--bind-to") + 1] == "none"
    with pytest.raises(ValueError, match="no mpi4py script 'nope'"):
        mpi.mpi_command(setup, "nope", 2)
    with pytest.raises(ValueError, match="at least one rank"):
        mpi.mpi_command(setup, "p2p", 0)


def test_a_failing_run_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mpirun = tmp_path / "mpirun"
    mpirun.write_text("#!/bin/sh\necho 'rank 1 died' >&2\nexit 3\n")
    mpirun.chmod(mpirun.stat().st_mode | stat.S_IXUSR)
    setup = MpiSetup(str(mpirun), "/bin/true")
    with pytest.raises(MpiRunError, match="exited 3: rank 1 died"):
        mpi.run_script("p2p", 2, setup=setup)


@pytest.mark.slow
@needs_mpi
def test_p2p_script_runs() -> None:
    args = ["--iterations=50", "--messages=100", "--bulk-messages=10"]
    result = mpi.run_script("p2p", 2, args, pinned=True, setup=SETUP)
    for key in ("buffer", "pickle", "read", "rma", "rate", "bulk"):
        assert result[key] > 0
    assert result["messages"] == 100 and len(result["cpus"]) == 2


@pytest.mark.slow
@needs_mpi
def test_spmd_script_sorts_and_reduces() -> None:
    result = mpi.run_script("spmd", 3, ["--keys=101", "--rounds=5"], setup=SETUP)
    assert result["ranks"] == 3
    assert result["sort"][0] is True and result["reduce"][0] is True


@pytest.mark.slow
def test_spmd_comparison_verifies_both_sides() -> None:
    result = bench_spmd(ranks=[2], keys=64, rounds=3)
    assert [row["program"] for row in result.rows] == ["sort", "collectives"]
    for row in result.rows:
        assert row["sl_ok"] == "yes"
        if SETUP is not None:
            assert row["mpi_ok"] == "yes"
        else:
            assert "mpi_ok" not in row
    assert (SETUP is None) == any("mpi4py columns empty" in n for n in result.notes)


def test_spmd_comparison_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="no SPMD program 'fft'"):
        bench_spmd(programs=["fft"])
    with pytest.raises(ValueError, match="at least 2 ranks"):
        bench_spmd(ranks=[1])


def test_collectives_program_in_one_process() -> None:
    from stacklib.bench.splitc.cluster import run_spmd
    from stacklib.bench.splitc.collectives import barrier_reduce

    run = run_spmd(barrier_reduce(5), 3)
    assert all(result.ok for result in run.results)
    assert run.results[0].detail == "5 rounds"
    with pytest.raises(ValueError, match="at least one round"):
        barrier_reduce(0)
