"""What an experiment returns, and the list of experiments ``stacklib reproduce`` runs.

An experiment checks :class:`Figure`\\ s, numbers a paper states against the values measured
for them, and measures the curves its plots draw; both come back in one
:class:`ExperimentResult` of plain data (no matplotlib, no simulation), which
:mod:`stacklib.reporting.tables` prints and :mod:`stacklib.reporting.plots` draws.  Experiments
import this module to register (:func:`register_experiment`, one call per experiment); the
runner, :mod:`stacklib.reproduce`, reads :data:`EXPERIMENTS`, a
:class:`~stacklib.registry.Registry`: stacklib's experiments (declared in
:mod:`stacklib.builtin`, in the order they print in) and other distributions' through entry
points in the ``stacklib.experiments`` group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from stacklib import builtin
from stacklib.registry import Registry

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "ExperimentResult",
    "Figure",
    "Points",
    "Run",
    "experiment_registry",
    "register_experiment",
]


@attrs.frozen
class Figure:
    """One number the paper states and the value measured for it.

    A yes/no claim ("FM's L drops at 2 KB") is a ``boolean`` figure: paper and measured are
    1.0 (holds) or 0.0 (does not), the tolerance is 0, and the tables print "yes"/"no" instead
    of numbers; :meth:`claim` makes one.
    """

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
    #: A yes/no claim, not a quantity: paper and measured are 1.0 (yes) or 0.0 (no).
    boolean: bool = attrs.field(default=False, kw_only=True)

    @boolean.validator
    def _check_boolean(self, _: attrs.Attribute[bool], boolean: bool) -> None:
        if boolean and not (self.paper in (0.0, 1.0) and self.measured in (0.0, 1.0)):
            raise ValueError(
                f"boolean figure {self.name!r} needs paper and measured 1.0 (yes) or 0.0 (no), "
                f"not {self.paper!r} and {self.measured!r}"
            )

    @classmethod
    def claim(cls, name: str, holds: bool, cite: str, unit: str = "holds") -> Figure:
        """A yes/no claim of the paper (it says the claim holds) and whether it ``holds``
        here; ``unit`` only shows in ``--json``."""
        return cls(name, 1.0, 1.0 if holds else 0.0, unit, cite, tolerance=0.0, boolean=True)

    @property
    def deviation(self) -> float:
        """Relative deviation of the measured value from the paper's."""
        return (self.measured - self.paper) / self.paper if self.paper else 0.0

    @property
    def ok(self) -> bool:
        if self.boolean:
            return self.measured == self.paper
        if self.at_least:
            return self.deviation >= -self.tolerance
        return abs(self.deviation) <= self.tolerance


#: One curve: x (a message size in bytes, a window) -> y, drawn in the order of x.
Points = Mapping[int, float]


def _figures(figures: Sequence[Figure]) -> tuple[Figure, ...]:
    return tuple(figures)


def _curves(curves: Mapping[str, Points]) -> dict[str, dict[int, float]]:
    return {
        name: {int(x): float(y) for x, y in sorted(points.items())}
        for name, points in curves.items()
    }


@attrs.frozen
class ExperimentResult:
    """An experiment's figures and the curves its plots draw, by name (sorted by x).

    Curves are empty unless the run was asked for them (``stacklib reproduce --plots``) or
    they came for free; each plot of :mod:`stacklib.reporting.plots` names the curves it reads.
    """

    figures: tuple[Figure, ...] = attrs.field(converter=_figures)
    curves: Mapping[str, Points] = attrs.field(factory=dict, converter=_curves)

    @classmethod
    def of(cls, outcome: Sequence[Figure] | ExperimentResult) -> ExperimentResult:
        """``outcome`` as a result: a plain list of figures has no curves."""
        return outcome if isinstance(outcome, ExperimentResult) else cls(outcome)


#: What an experiment's run returns: its figures, or its figures and curves.
Run = Callable[[], Sequence[Figure] | ExperimentResult]


@attrs.frozen
class Experiment:
    """A registered experiment: a name, what it reproduces, and the functions that run it."""

    name: str
    title: str
    run: Run
    #: Whether a plain ``stacklib reproduce`` runs it.  An experiment that takes minutes, or
    #: whose calibration is still in progress, runs only when named (``--only NAME``) or with
    #: ``--all``; ``note`` says why, and the default run lists it at the end.
    default: bool = True
    note: str = ""
    #: The experiment at the papers' full sizes, where the default run is scaled down to keep
    #: ``stacklib reproduce`` quick (``--full``); None when the default run is already full.
    run_full: Run | None = None
    #: The run that also measures the curves of the experiment's plots (``--plots``), in the
    #: same simulations as its figures, so the figures come out the same; None when ``run``
    #: returns its curves already, or the experiment has no plots.
    run_curves: Run | None = None
    #: Roughly how long the default run takes, in seconds of wall time, and the ``--full`` run
    #: (where there is one): estimates for ``stacklib reproduce --list``, measured once (the
    #: ``wall_seconds`` of ``--json``) on a 2-core machine; None when not measured.
    seconds: float | None = None
    seconds_full: float | None = None

    def result(self, *, full: bool = False, curves: bool = False) -> ExperimentResult:
        """Run it: at the papers' sizes with ``full`` (where it is scaled), measuring its
        plots' curves too with ``curves`` (where that costs more runs)."""
        if full and self.run_full is not None:
            run = self.run_full
        elif curves and self.run_curves is not None:
            run = self.run_curves
        else:
            run = self.run
        return ExperimentResult.of(run())


def experiment_registry(declared: Mapping[str, str] = builtin.EXPERIMENTS) -> Registry[Experiment]:
    """A registry of experiments whose built-in ones are ``declared`` (name -> module)."""
    return Registry.of_instances("experiment", Experiment, declared)


#: Every experiment by name, in the order they print in: stacklib's, then other
#: distributions' (entry points in ``stacklib.experiments``), then those registered at run time.
EXPERIMENTS: Registry[Experiment] = experiment_registry()


def register_experiment(experiment: Experiment) -> Experiment:
    """Add an experiment to ``stacklib reproduce`` (its module calls this at import)."""
    return EXPERIMENTS.register(experiment)
