"""``stacklib reproduce``: every experiment's figures within tolerance (in this process, one
test per experiment), the runner's selection, and plots drawn from the runs' own results."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stacklib.reporting import figures as registry
from stacklib.reporting.figures import (
    EXPERIMENTS,
    Experiment,
    ExperimentResult,
    Figure,
    register_experiment,
)
from stacklib.reporting.tables import WIDTH, format_figures
from stacklib.reproduce import describe_experiments, run_experiments

REPO = Path(__file__).resolve().parents[1]
#: The experiments that take more than a few seconds (measured with --durations).
SLOW = {"mm-fig3", "myrinet", "splitc"}


def _experiments() -> list[object]:
    return [
        pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else [])
        for name, experiment in EXPERIMENTS.items()
        if experiment.default
    ]


def test_every_default_experiment_is_tested() -> None:
    names = {e.name for e in EXPERIMENTS.values() if e.default}
    assert names >= {"sba100", "sba200", "tcpip", "uam", "mm", "myrinet", "splitc"}
    assert names >= SLOW


@pytest.mark.parametrize("name", _experiments())
def test_experiment_figures_are_within_tolerance(name: str) -> None:
    result = EXPERIMENTS[name].result()
    assert result.figures
    outside = [
        f"{f.name}: {f.measured:.4g} vs {f.paper:g} {f.unit}" for f in result.figures if not f.ok
    ]
    assert not outside, outside
    # The table a person reads fits the width, for every experiment's real names and citations.
    table = format_figures(f"{EXPERIMENTS[name].title}  [12.3 s]", result.figures)
    assert max(map(len, table.splitlines())) <= WIDTH, table


# ------------------------------------------------------------------------ the runner's selection


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., list[str]]]:
    """An empty experiment list (the built-in experiments are not loaded); calling the
    fixture registers a test experiment and returns the list of runs."""
    monkeypatch.setattr(registry, "EXPERIMENTS", registry.experiment_registry({}))
    ran: list[str] = []

    def experiment(name: str, default: bool = True, ok: bool = True, **more: object) -> list[str]:
        def run() -> list[Figure]:
            ran.append(name)
            return [Figure(name, 10.0, 10.0 if ok else 20.0, "us", "test")]

        register_experiment(Experiment(name, f"{name} title", run, default, "why not", **more))  # type: ignore[arg-type]
        return ran

    yield experiment


def test_default_run_skips_and_lists_the_others(
    registered: Callable[..., list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    registered("quick")
    ran = registered("long", default=False, ok=False)
    assert run_experiments() == 0
    assert ran == ["quick"]
    out = capsys.readouterr().out
    assert "Not run by default" in out
    assert "long: long title. why not" in out


def test_the_run_ends_with_the_count_and_names_those_outside(
    registered: Callable[..., list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    registered("quick")
    assert run_experiments() == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 of 1 figures within tolerance"
    registered("bad", ok=False)
    assert run_experiments() == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [
        "Outside tolerance:",
        "  bad: bad (measured 20 us, paper 10 us)",
        "1 of 2 figures within tolerance",
    ]
    assert run_experiments(as_json=True) == 1  # the JSON stays one document
    json.loads(capsys.readouterr().out)


def test_several_names_run_once_each_in_the_order_given(
    registered: Callable[..., list[str]],
) -> None:
    registered("a")
    registered("b")
    ran = registered("c")
    assert run_experiments(only=["c", "a", "c"]) == 0
    assert ran == ["c", "a"]


def test_list_says_what_each_reproduces_and_how_long_it_takes(
    registered: Callable[..., list[str]],
) -> None:
    registered("quick", seconds=0.2)
    registered("sized", seconds=51.0, seconds_full=400.0, run_full=lambda: [])
    registered("long", default=False, seconds=35.0)
    registered("unmeasured")
    lines = describe_experiments().splitlines()
    assert max(map(len, lines)) <= WIDTH
    assert lines[:2] == ["quick       quick title", "            under 1 s"]
    assert lines[2:4] == ["sized       sized title", "            about 51 s; --full: about 7 min"]
    assert lines[4:7] == [
        "long        long title",
        "            about 35 s",
        "            Runs only when named or with --all: why not",
    ]
    assert lines[7:9] == ["unmeasured  unmeasured title", "            time not measured"]
    assert "measured once" in lines[-2]
    assert describe_experiments(["long"]).splitlines()[0] == "long  long title"
    with pytest.raises(KeyError, match="no experiment named 'nope'"):
        describe_experiments(["nope"])


def test_plots_draw_only_what_ran_and_name_the_experiments_the_others_need(
    registered: Callable[..., list[str]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # The runner's side of --plots, without matplotlib: a stand-in plots package that
    # records what it was given and leaves out one plot.
    import types

    import stacklib.reproduce

    given: list[list[str]] = []
    left_out = types.SimpleNamespace(file="fig3.png", needs=("a", "b", "c"))

    def draw_results(directory: str, results: dict[str, ExperimentResult]) -> object:
        given.append(list(results))
        return [Path(directory) / "fig6.png"], [left_out]

    plots = types.ModuleType("stacklib.reporting.plots")
    plots.draw_results = draw_results  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "stacklib.reporting.plots", plots)
    monkeypatch.setattr(stacklib.reproduce, "matplotlib_missing", lambda *args: False)
    for name in ("a", "b", "c"):
        registered(name)

    assert run_experiments(only=["b"], plots=str(tmp_path)) == 0

    assert given == [["b"]]  # only the results of the experiments that ran
    out = capsys.readouterr().out
    assert f"  {tmp_path / 'fig6.png'}" in out
    assert "Not drawn, their experiments did not run (add them to --only):" in out
    assert "  fig3.png: needs a, c\n" in out  # the ones missing, not those that ran
    assert out.splitlines()[-1] == "1 of 1 figures within tolerance"


def test_named_and_all_runs_include_them(registered: Callable[..., list[str]]) -> None:
    registered("quick")
    ran = registered("long", default=False, ok=False)
    assert run_experiments(only=["long"]) == 1
    assert ran == ["long"]
    assert run_experiments(everything=True) == 1
    assert ran == ["long", "quick", "long"]


def test_an_unknown_name_is_refused_with_the_known_ones(
    registered: Callable[..., list[str]],
) -> None:
    registered("quick")
    with pytest.raises(KeyError, match="no experiment named 'nope' \\(known: quick\\)"):
        run_experiments(only=["nope"])


def test_full_runs_the_papers_sizes_where_an_experiment_is_scaled(
    registered: Callable[..., list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []

    def full() -> list[Figure]:
        ran.append("full")
        return [Figure("x", 1.0, 1.0, "s", "test")]

    ran_scaled = registered("sized", run_full=full)
    assert run_experiments() == 0
    assert "Scaled to run quickly: sized" in capsys.readouterr().out
    assert run_experiments(full=True) == 0
    assert ran_scaled == ["sized"] and ran == ["full"]
    assert "Scaled" not in capsys.readouterr().out


def test_json_has_the_figures_and_the_curves_when_measured(
    registered: Callable[..., list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    def with_curves() -> ExperimentResult:
        return ExperimentResult([Figure("x", 2.0, 1.0, "s", "test")], {"rtt": {40: 65.0}})

    register_experiment(Experiment("curved", "curved title", with_curves))
    assert run_experiments(as_json=True) == 1
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["name"] == "curved" and entry["figures"][0]["deviation"] == -0.5
    assert not entry["figures"][0]["ok"]
    assert entry["curves"] == {"rtt": {"40": 65.0}}


# ------------------------------------------------------------------------ results and curves


def test_a_result_holds_figures_and_curves_sorted_by_x() -> None:
    figure = Figure("x", 1.0, 1.0, "s", "test")
    result = ExperimentResult([figure], {"rtt": {100: 2.0, 40: 1.0}})
    assert result.figures == (figure,)
    assert list(result.curves["rtt"].items()) == [(40, 1.0), (100, 2.0)]
    assert ExperimentResult.of([figure]) == ExperimentResult((figure,))
    assert ExperimentResult.of(result) is result


def test_curves_are_asked_for_only_where_they_cost_runs() -> None:
    calls: list[str] = []

    def run() -> list[Figure]:
        calls.append("run")
        return []

    def run_curves() -> ExperimentResult:
        calls.append("curves")
        return ExperimentResult([], {"c": {1: 1.0}})

    experiment = Experiment("e", "e", run, run_curves=run_curves)
    assert experiment.result().curves == {}
    assert experiment.result(curves=True).curves == {"c": {1: 1.0}}
    assert Experiment("f", "f", run).result(curves=True).curves == {}
    assert calls == ["run", "curves", "run"]


@pytest.mark.slow
def test_plots_are_drawn_from_the_runs_results_without_new_simulations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra stacklib[plot]")
    from stacklib.sim import Simulation

    simulations: list[int] = []
    original = Simulation.__init__

    def counting(self: Simulation, *args: object, **kwargs: object) -> None:
        simulations.append(1)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Simulation, "__init__", counting)
    names = ["sba200", "fore-firmware", "sba100"]
    plain = {name: EXPERIMENTS[name].result() for name in names}
    without_plots = len(simulations)
    simulations.clear()

    assert run_experiments(only=names, plots=str(tmp_path)) == 0

    # The plots' curves ride in the figures' runs: as many simulations as without plots ...
    assert len(simulations) == without_plots > 0
    out = capsys.readouterr().out
    assert (tmp_path / "paper000_fig3_rtt.png").stat().st_size > 1000
    assert (tmp_path / "paper000_fig4_bandwidth.png").stat().st_size > 1000
    assert "paper003_fig5_rtt.png: needs fast-ethernet, pca200" in out  # did not run
    # ... and the figures are the same as without curves.
    for name in names:
        with_curves = EXPERIMENTS[name].result(curves=True)
        assert with_curves.figures == plain[name].figures
        assert with_curves.curves


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fast-ethernet", "pca200", "tcpip"])
def test_curves_leave_the_figures_as_they_are(name: str) -> None:
    plain, curved = EXPERIMENTS[name].result(), EXPERIMENTS[name].result(curves=True)
    assert curved.figures == plain.figures
    assert curved.curves and not plain.curves


# ------------------------------------------------------------------------ the command


def test_the_command_prints_the_tables_within_the_width_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stacklib.cli", "reproduce", "--only", "sba100", "fore-firmware"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("SBA-100: U-Net by traps and a user-level AAL5")
    assert "single-cell round trip  66 us" in done.stdout
    assert "SBA-200 with Fore's firmware" in done.stdout
    assert "[1] paper 000 §4.1 (Table 1 sums)" in done.stdout  # the citations, below
    assert "OUTSIDE" not in done.stdout and "Outside tolerance" not in done.stdout
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= WIDTH
    assert lines[-1] == "4 of 4 figures within tolerance"


# ------------------------------------------------------------------------ interrupted


def test_ctrl_c_keeps_what_finished_and_names_what_did_not(
    registered: Callable[..., list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    registered("first")

    def interrupted() -> list[Figure]:
        raise KeyboardInterrupt

    register_experiment(Experiment("second", "second title", interrupted))
    registered("third")
    assert run_experiments(quiet=True) == 130
    out, err = capsys.readouterr()
    assert "first title" in out and "second title" not in out and "third" not in out
    assert "interrupted in second; not run: third; 1 finished" in err


def test_ctrl_c_inside_a_nursery_with_json_keeps_valid_json(
    registered: Callable[..., list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    registered("first")

    def interrupted() -> list[Figure]:
        raise BaseExceptionGroup("nursery", [KeyboardInterrupt()])

    register_experiment(Experiment("second", "second title", interrupted))
    assert run_experiments(as_json=True) == 130
    out, err = capsys.readouterr()
    assert [entry["name"] for entry in json.loads(out)] == ["first"]
    assert "interrupted in second; 1 finished" in err


def test_other_errors_are_not_taken_for_ctrl_c(registered: Callable[..., list[str]]) -> None:
    def broken() -> list[Figure]:
        raise BaseExceptionGroup("nursery", [RuntimeError("broken")])

    register_experiment(Experiment("broken", "broken title", broken))
    with pytest.raises(BaseExceptionGroup):
        run_experiments(quiet=True)


def test_the_progress_reports_from_inside_an_experiment(
    registered: Callable[..., list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A line names the experiment and its own step while it runs, on stderr only."""
    from stacklib.reporting import progress

    seen: list[str] = []

    def stepping() -> list[Figure]:
        with progress.step("points", total=4) as points:
            points.advance()
            active = progress._ACTIVE
            assert active is not None
            seen.append(active.line(active.clock())[0])
        return [Figure("x", 1.0, 1.0, "s", "test")]

    register_experiment(Experiment("stepping", "stepping title", stepping))
    monkeypatch.delenv("STACKLIB_PROGRESS", raising=False)
    assert run_experiments(as_json=True) == 0
    assert seen[0].startswith("reproduce 0/1 > stepping > points 1/4; 0:00 elapsed")
    json.loads(capsys.readouterr().out)
