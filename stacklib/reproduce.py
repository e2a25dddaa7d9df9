"""``stacklib reproduce``: the papers' experiments, paper value vs measured value.

Experiments register here with the figures they reproduce; each figure carries the paper's
value, where it comes from, and a tolerance.  Running them prints a table per experiment and the
deviation of every figure, and the exit status is 1 if any figure is outside its tolerance.
See docs/reproduction.md.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence

import attrs

from stacklib.commands._common import matplotlib_missing


@attrs.frozen
class Figure:
    """One number the paper states and the value measured for it."""

    name: str
    paper: float
    measured: float
    unit: str
    cite: str
    #: Allowed relative deviation (0.10 = 10%).
    tolerance: float = 0.10
    #: The paper states a floor ("at least"): only falling short by more than the tolerance
    #: counts; exceeding it is reported, not failed.
    at_least: bool = False

    @property
    def deviation(self) -> float:
        """Relative deviation of the measured value from the paper's."""
        return (self.measured - self.paper) / self.paper if self.paper else 0.0

    @property
    def ok(self) -> bool:
        if self.at_least:
            return self.deviation >= -self.tolerance
        return abs(self.deviation) <= self.tolerance


@attrs.frozen
class Experiment:
    """A registered experiment: a name, what it reproduces, and the function that runs it."""

    name: str
    title: str
    run: Callable[[], Sequence[Figure]]
    #: Whether a plain ``stacklib reproduce`` runs it.  An experiment that takes minutes, or
    #: whose calibration is still in progress, runs only when named (``--only NAME``) or with
    #: ``--all``; ``note`` says why, and the default run lists it at the end.
    default: bool = True
    note: str = ""
    #: The experiment at the papers' full sizes, where the default run is scaled down to keep
    #: ``stacklib reproduce`` quick (``--full``); None when the default run is already full.
    run_full: Callable[[], Sequence[Figure]] | None = None


EXPERIMENTS: dict[str, Experiment] = {}


def register_experiment(experiment: Experiment) -> Experiment:
    """Add an experiment to ``stacklib reproduce``."""
    EXPERIMENTS[experiment.name] = experiment
    return experiment


def _load_builtin() -> None:
    # Experiments register when their modules are imported.
    import stacklib.experiments  # noqa: F401


def format_figures(title: str, figures: Sequence[Figure]) -> str:
    """A paper-vs-measured table."""
    headings = ("figure", "paper", "measured", "deviation", "tolerance", "source")
    rows = [
        (
            f.name,
            f"{f.paper:g} {f.unit}",
            f"{f.measured:.4g} {f.unit}",
            f"{f.deviation:+.1%}",
            (f"≥ -{f.tolerance:.0%}" if f.at_least else f"±{f.tolerance:.0%}")
            + ("" if f.ok else "  OUTSIDE"),
            f.cite,
        )
        for f in figures
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headings)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headings, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def run_experiments(
    only: Sequence[str] | None = None,
    as_json: bool = False,
    plots: str | None = None,
    everything: bool = False,
    full: bool = False,
) -> int:
    """Run the selected experiments, print the results; 1 if a figure is out of tolerance.

    ``only`` names experiments to run; otherwise the default ones run (all of them with
    ``everything``).  ``full`` runs scaled experiments at the papers' sizes instead.
    """
    _load_builtin()
    # Fail before the runs, not after them.
    if plots is not None and matplotlib_missing("reproduce", "--plots"):
        return 2
    selected = [e for e in EXPERIMENTS.values() if e.default or everything]
    skipped = [e for e in EXPERIMENTS.values() if e not in selected]
    if only:
        unknown = [name for name in only if name not in EXPERIMENTS]
        if unknown:
            known = ", ".join(sorted(EXPERIMENTS)) or "none yet"
            raise KeyError(f"no experiment named {unknown[0]!r} (known: {known})")
        selected = [EXPERIMENTS[name] for name in only]
        skipped = []
    if not selected:
        print(
            "stacklib reproduce: no experiments are registered yet. They arrive with the "
            "simulated network interfaces (SBA-100, SBA-200, PCA-200, DC21140, Myrinet); "
            "see docs/reproduction.md."
        )
        return 0
    failures = 0
    report = []
    progress = sys.stderr.isatty() and not as_json
    for index, experiment in enumerate(selected, 1):
        if progress:
            print(f"[{index}/{len(selected)}] {experiment.name} ...", end="\r", file=sys.stderr)
        start = time.perf_counter()
        run = experiment.run_full if full and experiment.run_full is not None else experiment.run
        figures = list(run())
        wall = time.perf_counter() - start
        failures += sum(not f.ok for f in figures)
        if as_json:
            report.append(
                {
                    "name": experiment.name,
                    "title": experiment.title,
                    "wall_seconds": wall,
                    "figures": [
                        {**attrs.asdict(f), "deviation": f.deviation, "ok": f.ok} for f in figures
                    ],
                }
            )
        else:
            print(format_figures(f"{experiment.title}  [{wall:.1f} s]", figures))
            print()
    if as_json:
        print(json.dumps(report, indent=2))
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
        from stacklib.plots import draw_figures

        start = time.perf_counter()
        written = draw_figures(plots)
        wall = time.perf_counter() - start
        # Keep stdout valid JSON with --json: the list of plots goes to stderr then.
        out = sys.stderr if as_json else sys.stdout
        print(f"plots written to {plots}  [{wall:.1f} s]", file=out)
        for path in written:
            print(f"  {path}", file=out)
    return 1 if failures else 0
