"""Paper 003 Table 1 on a process pool: the same numbers as the serial run, longest first, a
progress line per run, and ``stacklib splitc table1``."""

from __future__ import annotations

import json
import re

import pytest

from stacklib.bench.splitc.programs import SMALL_SIZES
from stacklib.cli import main
from stacklib.experiments import splitc as experiment
from stacklib.experiments.splitc import Cell, CellResult

SMALL = {b: SMALL_SIZES[b][1] for b in experiment.TABLE1}


class FakeClock:
    """A clock that advances ``step`` seconds per reading (no wall-clock reads in tests)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.slow
def test_parallel_gives_the_serial_numbers() -> None:
    sizes = {**SMALL, "rsortsm": (64,)}
    cells = experiment.suite(("rsortsm", "mm16", "ssortlg"), ("atm", "fe"), (2, 4), sizes)
    serial = experiment.run_cells(cells, jobs=1)
    parallel = experiment.run_cells(cells, jobs=2)
    assert [r.cell for r in parallel] == cells  # given back in the order asked
    assert [(r.total, r.compute) for r in parallel] == [(r.total, r.compute) for r in serial]
    assert len({r.total for r in serial}) > 1  # not a constant


def test_table1_is_keyed_like_before_and_independent_of_jobs() -> None:
    small = {"ssortlg": SMALL["ssortlg"]}
    one = experiment.table1(("ssortlg",), (2,), sizes=small, jobs=1)
    assert set(one) == {("ssortlg", "atm", 2), ("ssortlg", "fe", 2)}
    total, compute = one["ssortlg", "atm", 2]
    assert 0 < compute < total
    assert experiment.table1(("ssortlg",), (2,), sizes=small, jobs=1) == one


def test_a_failing_run_is_raised_in_the_caller() -> None:
    cells = [Cell("ssortlg", "atm", 2, SMALL["ssortlg"]), Cell("nosuch", "atm", 2, (10,))]
    with pytest.raises(KeyError, match="nosuch"):
        experiment.run_cells(cells, jobs=2)


def test_longest_expected_first_with_a_line_per_run() -> None:
    cells = experiment.suite(("ssortlg", "rsortsm"), ("atm",), (2, 8), {**SMALL, "rsortsm": (64,)})
    lines: list[str] = []
    results = experiment.run_cells(cells, jobs=1, progress=lines.append, clock=FakeClock(1.0))
    assert len(lines) == 4
    assert [line.split("]")[0] for line in lines] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    # rsortsm on 8 nodes sends the most messages: it starts (and, serially, ends) first
    assert lines[0].startswith("[1/4] rsortsm ATM 8 nodes: ")
    assert lines[-1].startswith("[4/4] ssortlg ATM 2 nodes: ")
    assert all("left" in line for line in lines[:-1]) and "left" not in lines[-1]
    assert all("(scaled to " in line for line in lines)
    assert [r.cell for r in results] == cells


def test_expected_cost_orders_the_paper_sizes() -> None:
    def cost(benchmark: str, n: int) -> float:
        return experiment.expected_cost(Cell(benchmark, "atm", n))

    assert cost("rsortsm", 8) > cost("rsortsm", 4) > cost("rsortsm", 2)
    assert cost("rsortsm", 8) > cost("ssortsm", 8) > cost("ssortlg", 8)
    assert cost("mm128", 2) > cost("mm16", 2)
    assert cost("ssortsm", 2) > experiment.expected_cost(Cell("ssortsm", "atm", 2, (1024,)))


def test_the_progress_line() -> None:
    cell = Cell("rsortsm", "fe", 8)
    line = experiment.cell_line(7, 36, CellResult(cell, 90.12, 10.0, 41.3), 312.0, 220.4)
    assert line == (
        "[7/36] rsortsm FE 8 nodes: 90.12 s simulated (paper 90.50, -0.4%), 41.3 s wall; "
        "5:12 elapsed, about 3:40 left"
    )
    scaled = CellResult(Cell("mm16", "atm", 2, (8, 16)), 0.16, 0.1, 0.3)
    assert experiment.cell_line(36, 36, scaled, 59.6, None) == (
        "[36/36] mm16 ATM 2 nodes: 0.16 s simulated (scaled to 8x16), 0.3 s wall; 1:00 elapsed"
    )


def test_the_suite_and_its_arguments() -> None:
    assert len(experiment.suite()) == 36
    clusters = experiment.CLUSTERS_SECONDS
    assert clusters == pytest.approx(814.64)
    assert Cell("mm16", "atm", 2).paper_size and Cell("mm16", "atm", 2, (16, 16)).paper_size
    assert not Cell("mm16", "atm", 2, (8, 16)).paper_size
    assert set(experiment.SCALED_SUITE) == set(experiment.TABLE1)
    with pytest.raises(KeyError, match="no Table 1 benchmark 'mm4x4'"):
        experiment.suite(("mm4x4",))
    with pytest.raises(KeyError, match="no Table 1 network 'myrinet'"):
        experiment.suite(networks=("myrinet",))
    with pytest.raises(KeyError, match="no column for 16 nodes"):
        experiment.suite(nodes=(16,))
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        experiment.run_cells([], jobs=0)


def test_speedup_definition() -> None:
    assert experiment.speedup("mm16", 1.26, 0.56) == pytest.approx(2.25)
    assert experiment.speedup("rsortlg", 4.73, 7.15) == pytest.approx(4 * 4.73 / 7.15)


def test_the_command_prints_both_tables_and_the_wall_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["splitc", "table1", "--small", "--only", "ssortlg", "--nodes", "2,8", "--jobs", "1"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "4 runs of paper 003 Table 1 at test sizes (--small) on 1 process" in err
    assert len(re.findall(r"^\[\d/4\] ssortlg (ATM|FE) [28] nodes: ", err, re.M)) == 4
    rows = re.findall(r"^ssortlg +(ATM|FE) +([28]) +2000 +(2\.03|2\.06|2\.93|3\.22) ", out, re.M)
    assert sorted(rows) == [("ATM", "2", "2.03"), ("ATM", "8", "2.93"), ("FE", "2", "2.06"),
                            ("FE", "8", "3.22")]  # fmt: skip
    assert re.search(r"^ssortlg +ATM +2\.9 +\d\.\d\d +[+-]\d", out, re.M)  # Table 2
    assert "the 1996 clusters took 814.6 s for the 36 runs of Table 1 (10 s for these 4" in out


def test_the_command_json_and_size_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["splitc", "table1", "--only", "rsortlg", "--nodes", "2", "--network", "fe",
            "--size", "rsortlg=1000", "--jobs", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    (run,) = report["runs"]
    assert (run["benchmark"], run["network"], run["nodes"], run["sizes"]) == (
        "rsortlg", "fe", 2, [1000])  # fmt: skip
    assert run["paper_seconds"] == 5.35 and run["deviation"] is None
    assert run["seconds"] == pytest.approx(
        run["computation_seconds"] + run["communication_seconds"]
    )
    assert report["speedups"] == []  # no 8-node run
    assert report["clusters_seconds_all"] == pytest.approx(814.64)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "mm16"], "expected BENCH=N,N"),
        (["--size", "mm16=0"], "sizes must be positive"),
        (["--full", "--small"], "not allowed with argument"),
        (["--nodes", "two"], "expected sizes like 2,4,8"),
    ],
)
def test_the_command_rejects_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["splitc", "table1", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "mm4x4"], "no Table 1 benchmark 'mm4x4'"),
        (["--size", "cg=4,4"], "--size: no Table 1 benchmark 'cg'"),
        (["--nodes", "3"], "no column for 3 nodes"),
        (["--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_the_command_names_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["splitc", "table1", "--small", *argv]) == 2
    assert message in capsys.readouterr().err


def test_live_falls_back_to_lines_without_a_terminal() -> None:
    lines: list[str] = []
    cells = [Cell("ssortlg", "fe", 2, SMALL["ssortlg"])]
    experiment.run_cells(cells, jobs=1, progress=lines.append)
    assert len(lines) == 1 and lines[0].startswith("[1/1] ssortlg FE 2 nodes: ")


@pytest.mark.slow
def test_the_full_experiment_runs_all_36_cells_through_the_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[list[Cell], int | None]] = []

    paper = {(b, *column): t for b, row in experiment.TABLE1.items() for column, t in row.items()}

    def fake(
        cells: list[Cell], jobs: int | None = None, *_: object, **__: object
    ) -> list[CellResult]:
        asked.append((list(cells), jobs))
        # Table 1 cells take the paper's times; the Fig 5 runs any time
        return [CellResult(c, paper.get((c.benchmark, c.network, c.nodes), 1.0), 0.5, 0.0)
                for c in cells]  # fmt: skip

    monkeypatch.setattr(experiment, "run_cells", fake)
    # Building the compiled copy (where mypyc is installed) is not what this test is about.
    monkeypatch.setattr(experiment, "prepare_engine", lambda *_: None)
    figures = {f.name: f for f in experiment.run_experiment(full=True, jobs=2)}
    (table, jobs), (fig5, _) = asked
    assert jobs == 2
    assert sorted(table, key=str) == sorted(experiment.suite(), key=str)
    assert fig5 == experiment.fig5_cells(sizes=experiment.FIG5_SIZES)
    assert figures["Table 1: rsortsm FE 8 nodes (predicted)"].deviation == 0.0
    assert figures["Table 1: mm128 ATM 2 nodes (calibrated)"].ok
    assert figures["Table 1: ssortsm 4 nodes, FE ahead of ATM"].ok  # paper 003 §5.2
    assert figures["Table 1: mm128 8 nodes, ATM ahead of FE"].ok
    assert "Table 2: rsortsm ATM speedup 2 -> 8" in figures


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, call: int) -> None:
    """Ctrl-C in the ``call``-th run simulated in this process."""
    real = experiment.run_cell
    calls = iter(range(1, 100))

    def run_cell(cell: Cell) -> CellResult:
        if next(calls) == call:
            raise KeyboardInterrupt
        return real(cell)

    monkeypatch.setattr(experiment, "run_cell", run_cell)


def test_ctrl_c_gives_back_the_cells_that_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    _interrupt_at(monkeypatch, 2)
    cells = experiment.suite(("ssortlg",), ("atm", "fe"), (2,), SMALL)
    with pytest.raises(experiment.CellsInterrupted) as stop:
        experiment.run_cells(cells, jobs=1, pure=True)
    assert [r.cell for r in stop.value.finished] == [cells[0]]  # the longest expected ran first
    assert isinstance(stop.value, KeyboardInterrupt)


def test_the_command_prints_the_finished_runs_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _interrupt_at(monkeypatch, 2)
    argv = ["splitc", "table1", "--small", "--only", "ssortlg", "--nodes", "2", "--jobs", "1",
            "--pure", "--quiet"]  # fmt: skip
    assert main(argv) == 130
    out, err = capsys.readouterr()
    assert len(re.findall(r"^ssortlg +(ATM|FE) +2 ", out, re.M)) == 1
    assert "interrupted; 1 of 2 runs finished (their tables follow)" in err
    assert "Traceback" not in err


def test_the_runs_under_way_count_by_their_virtual_time() -> None:
    """A run with the paper's expected virtual time counts done in proportion (never all of
    it); one without shows its virtual time only."""
    import io

    from stacklib.experiments.pool import RunsProgress
    from stacklib.reporting.progress import Progress

    shown = Progress(io.StringIO(), clock=lambda: 10.0, ticker=False)
    with (
        shown.task("table1"),
        RunsProgress(
            "runs", ["a", "b", "c"], [1.0, 2.0, 1.0], [10.0, None, 4.0], None, lambda: 0.0
        ) as runs,
    ):
        runs.times = [5.0, 3.0, 0.0]
        runs.finished(2, lambda *_: "")
        line, fraction = shown.line(20.0)
    assert "runs 1/3 done; simulating a t=5/10 s, b t=3 s" in line
    assert fraction == pytest.approx((1.0 + 0.5) / 4.0)


def test_a_worker_publishes_only_while_progress_is_shown() -> None:
    import threading

    from stacklib.experiments import pool

    before = threading.active_count()
    pool.init_worker(None)  # no display: no thread
    assert threading.active_count() == before
    seen: list[int] = []
    assert pool.run_indexed(5, lambda x: seen.append(pool._INDEX) or x * 2, 21) == 42
    assert seen == [5] and pool._INDEX == -1
