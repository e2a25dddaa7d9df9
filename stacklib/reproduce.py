"""``stacklib reproduce``: the papers' experiments, paper value vs measured value.

The runner, above the experiments: it loads them (they register in
:mod:`stacklib.reporting.figures` when :mod:`stacklib.experiments` is imported), runs each
selected one once, prints a table per experiment with the deviation of every figure and a
closing count of the figures within tolerance, and draws the plots from the same results
(``--plots``: nothing is simulated twice).  The exit status is 1 if any figure is outside its
tolerance.  ``--list`` (:func:`describe_experiments`) says what each experiment reproduces and
how long it takes.  See docs/reproduction.md.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from stacklib.reporting import figures as registry
from stacklib.reporting import progress
from stacklib.reporting.figures import (
    EXPERIMENTS,
    Experiment,
    ExperimentResult,
    Figure,
    register_experiment,
)
from stacklib.reporting.optional import matplotlib_missing
from stacklib.reporting.tables import (
    WIDTH,
    format_figures,
    format_listing,
    format_summary,
    json_entry,
    json_report,
    wrap,
)

# Figure, Experiment, EXPERIMENTS, register_experiment and format_figures were defined here
# before stacklib.reporting; they stay importable from this module.
__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "ExperimentResult",
    "Figure",
    "describe_experiments",
    "format_figures",
    "register_experiment",
    "run_experiments",
]


def run_experiments(
    only: Sequence[str] | None = None,
    as_json: bool = False,
    plots: str | None = None,
    everything: bool = False,
    full: bool = False,
    quiet: bool = False,
) -> int:
    """Run the selected experiments, print the results; 1 if a figure is out of tolerance.

    ``only`` names experiments to run; otherwise the default ones run (all of them with
    ``everything``).  ``full`` runs scaled experiments at the papers' sizes instead.  ``plots``
    is a directory to draw the plots of the experiments that ran into, from their results.
    The text ends with "N of M figures within tolerance", after the names of those outside.
    Progress goes to stderr (stacklib.reporting.progress) unless ``quiet``.  Interrupted
    (Ctrl-C), it keeps the results of the experiments that finished, names the one
    interrupted and the ones not run, and returns 130.
    """
    # Fail before the runs, not after them.
    if plots is not None and matplotlib_missing("reproduce", "--plots"):
        return 2
    selected, skipped = _select(only, everything)
    if not selected:
        print(
            "stacklib reproduce: no experiments are registered yet. They arrive with the "
            "simulated network interfaces (SBA-100, SBA-200, PCA-200, DC21140, Myrinet); "
            "see docs/reproduction.md."
        )
        return 0
    report: list[dict[str, Any]] = []
    results: dict[str, ExperimentResult] = {}
    interrupted: str | None = None
    # Each experiment weighs what it is expected to take, so the estimate of the time left
    # does not treat a one-second experiment like a minute-long one.
    weights = [_expected_seconds(e, full) for e in selected]
    with progress.shown("reproduce", sum(weights), quiet=quiet) as shown:
        for index, (experiment, weight) in enumerate(zip(selected, weights, strict=True)):
            shown.detail = f"{index}/{len(selected)}"
            start = time.perf_counter()
            try:
                with shown.step(experiment.name, weight=weight):
                    result = experiment.result(full=full, curves=plots is not None)
            except BaseException as error:
                if not progress.is_interrupt(error):
                    raise
                # Ctrl-C: what finished is printed already (or below, as JSON); say the rest.
                interrupted = experiment.name
                break
            wall = time.perf_counter() - start
            shown.advance(weight)
            results[experiment.name] = result
            if as_json:
                report.append(json_entry(experiment.name, experiment.title, wall, result))
            else:
                progress.clear()  # the tables go to stdout, which may share the terminal
                print(format_figures(f"{experiment.title}  [{wall:.1f} s]", result.figures))
                print()
    if interrupted is not None:
        if as_json:
            print(json_report(report))
        not_run = [e.name for e in selected[len(results) + 1 :]]
        print(
            f"stacklib reproduce: interrupted in {interrupted}"
            + (f"; not run: {', '.join(not_run)}" if not_run else "")
            + f"; {len(results)} finished",
            file=sys.stderr,
        )
        return 130
    if as_json:
        print(json_report(report))
    else:
        _notes(selected, skipped, full)
    if plots is not None:
        _draw(plots, results, sys.stderr if as_json else sys.stdout)
    if not as_json:
        print(format_summary(results))
    failures = sum(not f.ok for result in results.values() for f in result.figures)
    return 1 if failures else 0


def _expected_seconds(experiment: Experiment, full: bool) -> float:
    """What ``experiment`` is expected to take (its registered estimate; 1 s unknown)."""
    expected = experiment.seconds_full if full and experiment.run_full else experiment.seconds
    return max(expected or 1.0, 0.1)


def _select(
    only: Sequence[str] | None, everything: bool
) -> tuple[list[Experiment], list[Experiment]]:
    """The experiments to run and the registered ones left out; an unknown name in ``only``
    raises KeyError naming it and the known ones."""
    known = registry.EXPERIMENTS
    if only:
        unknown = [name for name in only if name not in known]
        if unknown:
            names = ", ".join(sorted(known)) or "none yet"
            raise KeyError(f"no experiment named {unknown[0]!r} (known: {names})")
        return [known[name] for name in dict.fromkeys(only)], []
    selected = [e for e in known.values() if e.default or everything]
    return selected, [e for e in known.values() if e not in selected]


def _notes(selected: Sequence[Experiment], skipped: Sequence[Experiment], full: bool) -> None:
    """What the text run did not do: the experiments it scaled down and those it left out."""
    scaled = [e.name for e in selected if e.run_full is not None and not full]
    if scaled:
        print(fill(f"Scaled to run quickly: {', '.join(scaled)} (the papers' sizes: --full)."))
    if skipped:
        print("Not run by default (name one with --only NAME, or run them all with --all):")
        for experiment in skipped:
            text = f"{experiment.name}: {experiment.title}. {experiment.note}"
            print(fill(text, indent="    ", first="  "))


def fill(text: str, indent: str = "", first: str = "") -> str:
    """``text`` wrapped to the width of the tables."""
    return "\n".join(wrap(text, WIDTH, indent=indent, first=first))


def describe_experiments(only: Sequence[str] | None = None) -> str:
    """``stacklib reproduce --list``: each experiment (or those ``only`` names), what it
    reproduces, whether the default run runs it, and about how long it takes."""
    selected = _select(only, everything=True)[0]
    entries = []
    for e in selected:
        paragraphs = [e.title, _duration(e)]
        if not e.default:
            paragraphs.append(f"Runs only when named or with --all: {e.note}")
        entries.append((e.name, paragraphs))
    footer = (
        "Times are wall-clock estimates, each measured once on a 2-core machine; run some with "
        "stacklib reproduce --only NAME [NAME ...]."
    )
    return format_listing(entries) + "\n\n" + fill(footer)


def _duration(experiment: Experiment) -> str:
    if experiment.seconds is None:
        return "time not measured"
    text = _about(experiment.seconds)
    if experiment.run_full is not None:
        full = experiment.seconds_full
        text += f"; --full: {'not measured' if full is None else _about(full)}"
    return text


def _about(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    return f"about {seconds / 60:.0f} min"


def _draw(directory: str, results: dict[str, ExperimentResult], out: TextIO) -> None:
    """Draw the plots of ``results`` (no runs) and list the files; with ``--json`` ``out`` is
    stderr, to keep stdout valid JSON."""
    from stacklib.reporting.plots import draw_results

    start = time.perf_counter()
    written, missing = draw_results(directory, results)
    wall = time.perf_counter() - start
    print(f"plots written to {directory}  [{wall:.1f} s]", file=out)
    for path in written:
        print(f"  {path}", file=out)
    if missing:
        print("Not drawn, their experiments did not run (add them to --only):", file=out)
        for plot in missing:
            absent = ", ".join(name for name in plot.needs if name not in results)
            print(fill(f"{plot.file}: needs {absent}", indent="    ", first="  "), file=out)
        print(file=out)
