"""``stacklib reproduce``: the papers' experiments, paper value vs measured value.

The runner, above the experiments: it loads them (they register in
:mod:`stacklib.reporting.figures` when :mod:`stacklib.experiments` is imported), runs each
selected one once, prints a table per experiment with the deviation of every figure, and draws
the plots from the same results (``--plots``: nothing is simulated twice).  The exit status is
1 if any figure is outside its tolerance.  See docs/reproduction.md.
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
from stacklib.reporting.tables import format_figures, json_entry, json_report

# Figure, Experiment, EXPERIMENTS, register_experiment and format_figures were defined here
# before stacklib.reporting; they stay importable from this module.
__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "ExperimentResult",
    "Figure",
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
    Progress goes to stderr (stacklib.reporting.progress) unless ``quiet``.  Interrupted
    (Ctrl-C), it keeps the results of the experiments that finished, names the one
    interrupted and the ones not run, and returns 130.
    """
    # Fail before the runs, not after them.
    if plots is not None and matplotlib_missing("reproduce", "--plots"):
        return 2
    known = registry.EXPERIMENTS
    selected = [e for e in known.values() if e.default or everything]
    skipped = [e for e in known.values() if e not in selected]
    if only:
        unknown = [name for name in only if name not in known]
        if unknown:
            names = ", ".join(sorted(known)) or "none yet"
            raise KeyError(f"no experiment named {unknown[0]!r} (known: {names})")
        selected = [known[name] for name in only]
        skipped = []
    if not selected:
        print(
            "stacklib reproduce: no experiments are registered yet. They arrive with the "
            "simulated network interfaces (SBA-100, SBA-200, PCA-200, DC21140, Myrinet); "
            "see docs/reproduction.md."
        )
        return 0
    failures = 0
    report: list[dict[str, Any]] = []
    results: dict[str, ExperimentResult] = {}
    interrupted: str | None = None
    with progress.shown("reproduce", len(selected), quiet=quiet) as shown:
        for experiment in selected:
            start = time.perf_counter()
            try:
                with shown.step(experiment.name):
                    result = experiment.result(full=full, curves=plots is not None)
            except BaseException as error:
                if not progress.is_interrupt(error):
                    raise
                # Ctrl-C: what finished is printed already (or below, as JSON); say the rest.
                interrupted = experiment.name
                break
            wall = time.perf_counter() - start
            shown.advance()
            results[experiment.name] = result
            failures += sum(not f.ok for f in result.figures)
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
    elif failures:
        print(f"{failures} figure(s) outside tolerance")
    scaled = [e.name for e in selected if e.run_full is not None and not full]
    if scaled and not as_json:
        print(f"Scaled to run quickly: {', '.join(scaled)} (the papers' sizes: --full).")
    if skipped and not as_json:
        print("Not run by default (name one with --only NAME, or run them all with --all):")
        for experiment in skipped:
            print(f"  {experiment.name}: {experiment.title}. {experiment.note}")
    if plots is not None:
        _draw(plots, results, sys.stderr if as_json else sys.stdout)
    return 1 if failures else 0


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
        print("Not drawn (their experiments did not run):", file=out)
        for plot in missing:
            print(f"  {plot.file}: needs {', '.join(plot.needs)}", file=out)
