"""Drawing helpers the paper figures share: one look for every plot (matplotlib's Agg
backend, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from stacklib.reporting.figures import Points

#: One colour per NI, the same in every figure.
COLOURS = {
    "sba200": "tab:blue",
    "fore-firmware": "tab:orange",
    "sba100": "tab:green",
    "fe-hub": "tab:blue",
    "fe-bay28115": "tab:purple",
    "fe-fn100": "tab:brown",
    "pca200-oc3": "tab:red",
}
#: A link's payload limit: a thin grey line.
LIMIT: dict[str, Any] = {"color": "0.45", "linewidth": 0.9}
Location = Literal["upper left", "lower right"]


def upto(points: Points, largest: float) -> dict[int, float]:
    """The points of a curve with x at most ``largest`` (an inset's range)."""
    return {x: y for x, y in points.items() if x <= largest}


def new(title: str, panels: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure with ``panels`` side by side (two: a main plot and a narrower inset)."""
    figure = Figure(figsize=(11.0, 5.2) if panels == 2 else (8.0, 5.2), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(
        1, panels, squeeze=False, width_ratios=[1.7, 1.0] if panels == 2 else None
    )[0]
    figure.suptitle(title, fontsize=11)
    return figure, list(axes)


def curve(axes: Axes, points: Points, label: str, colour: str | None = None, **style: Any) -> None:
    """A line through ``points`` in the order of x."""
    sizes = sorted(points)
    if colour is not None:
        style["color"] = colour
    axes.plot(sizes, [points[s] for s in sizes], label=label, **style)


def paper(
    axes: Axes,
    size: float,
    value: float,
    colour: str,
    text: str | None = None,
    offset: tuple[float, float] = (0, 0),
) -> None:
    """A number the paper's text states, as a star with its value beside it (if ``text``)."""
    axes.plot(
        [size],
        [value],
        marker="*",
        markersize=13,
        color=colour,
        markeredgecolor="black",
        linestyle="none",
        zorder=5,
    )
    if text is None:
        return
    axes.annotate(
        text,
        (size, value),
        xytext=offset,
        textcoords="offset points",
        fontsize=8,
        arrowprops={"arrowstyle": "-", "color": "0.4", "linewidth": 0.6},
        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "0.7"},
        zorder=6,
    )


def legend(axes: Axes, location: Location) -> None:
    """The legend, with an entry for the stars (values stated in the text)."""
    handles, labels = axes.get_legend_handles_labels()
    star = Line2D(
        [], [], marker="*", markersize=11, color="0.6", markeredgecolor="black", linestyle="none"
    )
    axes.legend([*handles, star], [*labels, "stated in the paper's text"], loc=location, fontsize=8)


def finish(axes: Axes, xlabel: str, ylabel: str) -> None:
    """Axis labels, a light grid, both axes from 0."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)


def save(figure: Figure, directory: Path, name: str, dpi: int = 110) -> Path:
    """Write ``figure`` as ``directory/name`` (the directory is created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    figure.savefig(path, dpi=dpi)
    return path


def named(curves: Mapping[str, Points], prefix: str) -> dict[str, Points]:
    """The curves whose names start with ``prefix``, by the rest of their names."""
    return {key[len(prefix) :]: points for key, points in curves.items() if key.startswith(prefix)}
