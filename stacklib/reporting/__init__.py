"""Reporting: experiments' results as paper-vs-measured tables, JSON and plots.

* :mod:`~stacklib.reporting.figures`: the plain data an experiment returns (``Figure``,
  ``ExperimentResult``), ``Experiment`` and the list ``stacklib reproduce`` runs; experiments
  import it, so it imports nothing of theirs;
* :mod:`~stacklib.reporting.tables`: the tables and the JSON report;
* :mod:`~stacklib.reporting.plots`: every plot, drawn from results (needs matplotlib, an
  optional extra: import it only after :func:`matplotlib_missing` said no);
* :mod:`~stacklib.reporting.optional`: the check for matplotlib.

Importing this package imports neither matplotlib nor any experiment.
"""

from __future__ import annotations

from stacklib.reporting.figures import (
    EXPERIMENTS,
    Experiment,
    ExperimentResult,
    Figure,
    Points,
    register_experiment,
)
from stacklib.reporting.optional import matplotlib_missing
from stacklib.reporting.tables import format_figures, json_entry, json_report

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "ExperimentResult",
    "Figure",
    "Points",
    "format_figures",
    "json_entry",
    "json_report",
    "matplotlib_missing",
    "register_experiment",
]
