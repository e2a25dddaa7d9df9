"""``stacklib reproduce``'s selection: default experiments, named ones, and --all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stacklib import reproduce
from stacklib.reproduce import Experiment, Figure, register_experiment, run_experiments


@pytest.fixture
def only_test_experiments(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Two registered experiments, one run by default and one only when named; the runs."""
    ran: list[str] = []
    monkeypatch.setattr(reproduce, "EXPERIMENTS", {})
    monkeypatch.setattr(reproduce, "_load_builtin", lambda: None)

    def experiment(name: str, default: bool, ok: bool) -> None:
        def run() -> list[Figure]:
            ran.append(name)
            return [Figure(name, 10.0, 10.0 if ok else 20.0, "us", "test")]

        register_experiment(Experiment(name, f"{name} title", run, default, "why not default"))

    experiment("quick", default=True, ok=True)
    experiment("long", default=False, ok=False)
    yield ran


def test_default_run_skips_and_lists_the_others(
    only_test_experiments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_experiments() == 0
    assert only_test_experiments == ["quick"]
    out = capsys.readouterr().out
    assert "Not run by default" in out
    assert "long: long title. why not default" in out


def test_named_and_all_runs_include_them(only_test_experiments: list[str]) -> None:
    assert run_experiments(only=["long"]) == 1
    assert only_test_experiments == ["long"]
    assert run_experiments(everything=True) == 1
    assert only_test_experiments == ["long", "quick", "long"]


def test_full_runs_the_papers_sizes_where_an_experiment_is_scaled(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(reproduce, "EXPERIMENTS", {})
    monkeypatch.setattr(reproduce, "_load_builtin", lambda: None)
    ran: list[str] = []

    def scaled() -> list[Figure]:
        ran.append("scaled")
        return [Figure("x", 1.0, 1.0, "s", "test")]

    def full() -> list[Figure]:
        ran.append("full")
        return [Figure("x", 1.0, 1.0, "s", "test")]

    register_experiment(Experiment("sized", "sized", scaled, run_full=full))
    assert run_experiments() == 0
    assert "Scaled to run quickly: sized" in capsys.readouterr().out
    assert run_experiments(full=True) == 0
    assert ran == ["scaled", "full"]
    assert "Scaled" not in capsys.readouterr().out
