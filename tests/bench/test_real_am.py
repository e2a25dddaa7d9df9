"""Split-C's blocking read between two processes over shm (stacklib/bench/real_am.py) and its
rows in ``bench real``."""

from __future__ import annotations

import pytest

from stacklib.bench.real import MEASUREMENTS, bench_real
from stacklib.bench.real_am import splitc_read, splitc_read_cpu


@pytest.mark.parametrize("mode", ["poll", "trio"])
def test_splitc_read_runs_with_tiny_counts(mode: str) -> None:
    # The client checks every value it reads (a wrong one raises).
    assert 0 < splitc_read(20, mode, warmup=5) < 1


def test_splitc_read_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="no Split-C read benchmark in mode 'busy'"):
        splitc_read(20, "busy")


def test_splitc_read_cpu_times_both_ranks_in_one_process() -> None:
    # Every read's value is checked (a wrong one raises), every UAM round trip's reply awaited.
    result = splitc_read_cpu(20, runs=2)
    assert set(result) == {"uam", "splitc", "share"}
    assert 0 < result["uam"] < 1 and 0 < result["splitc"] < 1
    assert result["share"] == result["splitc"] - result["uam"]
    with pytest.raises(ValueError, match="must be positive"):
        splitc_read_cpu(0)


def test_bench_real_has_a_splitc_read_row() -> None:
    assert {"splitc", "splitctrio"} <= set(MEASUREMENTS)
    result = bench_real(iterations=100, repeat=1, only=["splitc"], pure=True)
    (row,) = result.rows
    assert str(row["measurement"]).startswith("Split-C blocking read")
    assert row["unit"] == "us RTT" and float(row["value"]) > 0  # type: ignore[arg-type]
    assert row["met"] == "-"  # judged only against mpi4py (--compare mpi)


def test_the_command_offers_every_measurement_and_no_other() -> None:
    """The parser lists the keys itself (importing the benchmark would slow every command's
    start), so this keeps the two lists in step."""
    import argparse

    from stacklib.cli import build_parser

    parser = build_parser(["bench", "real"])
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bench = commands.choices["bench"]
    benches = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    only = next(a for a in benches.choices["real"]._actions if a.dest == "only")
    assert tuple(only.choices or ()) == MEASUREMENTS


def test_bench_real_measures_the_await_faces_in_one_process_and_between_two() -> None:
    result = bench_real(iterations=200, repeat=1, only=["await", "triopay"], pure=True)
    names = [str(row["measurement"]) for row in result.rows]
    assert len(names) == 4
    assert "await send_payload_async/recv_payload (2 CPUs)" in names[0]
    assert [name.rpartition(", ")[2] for name in names[1:]] == [
        "send_payload/poll_payload",
        "await send/recv",
        "await send_payload_async/recv_payload",
    ]
    assert all(float(row["value"]) > 0 for row in result.rows)  # type: ignore[arg-type]
    assert result.rows[0]["target"] == result.rows[0]["met"] == "-"  # no busy-poll row to judge by


def test_the_await_faces_are_judged_against_busy_poll_in_the_same_run() -> None:
    from stacklib.bench.real import AWAIT_FACTOR, AWAIT_TARGET

    result = bench_real(iterations=200, repeat=1, only=["shm", "trio", "triopay"], pure=True)
    rows = {str(row["measurement"]): row for row in result.rows}
    busy = next(row for name, row in rows.items() if "busy-poll" in name)
    faces = [row for name, row in rows.items() if "trio await" in name]
    assert len(faces) == 2
    for face in faces:
        assert face["target"] == AWAIT_TARGET
        within = float(face["value"]) <= AWAIT_FACTOR * float(busy["value"])  # type: ignore[arg-type]
        assert face["met"] == ("yes" if within else "no")


def test_shm_await_cpu_rejects_an_unknown_face() -> None:
    from stacklib.bench.real import shm_await_cpu

    with pytest.raises(ValueError, match="no face 'busy'"):
        shm_await_cpu(10, "busy")
