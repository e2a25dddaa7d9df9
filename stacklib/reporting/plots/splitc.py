"""The Split-C figures, drawn from simulated times (:mod:`stacklib.experiments.splitc`'s
``fig5`` and ``table1``): ``splitc_fig5.png`` (paper 000 Fig 5: the programs on the three
machines, normalized to the CM-5) and ``splitc_fig7.png`` (paper 003 Fig 7: Table 1 normalized
to the paper's 2-node ATM time, the paper's values as marks), each bar split into computation
(solid) and communication (hatched)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as Plot

__all__ = ["FIG5_MACHINES", "draw_splitc"]

#: (total, computation) seconds of a run.
Times = tuple[float, float]
FIG5_MACHINES = ("cm5", "unet-atm", "meiko")


def _fig5(out: Path, fig5_times: Mapping[tuple[str, str], Times]) -> Path:
    plot = Plot(figsize=(9, 4))
    FigureCanvasAgg(plot)
    axes = plot.add_subplot()
    benchmarks = list(dict.fromkeys(b for b, _ in fig5_times))  # in the order given
    for column, machine in enumerate(FIG5_MACHINES):
        xs = [i + (column - 1) * 0.27 for i in range(len(benchmarks))]
        base = [fig5_times[b, "cm5"][0] for b in benchmarks]
        compute = [fig5_times[b, machine][1] / t for b, t in zip(benchmarks, base, strict=True)]
        total = [fig5_times[b, machine][0] / t for b, t in zip(benchmarks, base, strict=True)]
        comm = [t - c for t, c in zip(total, compute, strict=True)]
        bars = axes.bar(xs, compute, 0.25, label=machine)
        colour = bars.patches[0].get_facecolor()
        axes.bar(xs, comm, 0.25, bottom=compute, color=colour, alpha=0.4, hatch="//")
    axes.set_xticks(range(len(benchmarks)), benchmarks)
    axes.set_ylabel("time / CM-5 time (solid: computation)")
    axes.set_title("Split-C on 8 nodes (paper 000 Fig 5), scaled sizes, simulated")
    axes.legend()
    path = out / "splitc_fig5.png"
    plot.savefig(path, dpi=100)
    return path


def _fig7(
    out: Path,
    table1_times: Mapping[tuple[str, str, int], Times],
    paper: Mapping[str, Mapping[tuple[str, int], float]],
) -> Path:
    plot = Plot(figsize=(9, 4))
    FigureCanvasAgg(plot)
    axes = plot.add_subplot()
    runs = [b for b in paper if any(key[0] == b for key in table1_times)]
    columns = [(network, n) for n in (2, 4, 8) for network in ("atm", "fe")]
    width = 0.8 / len(columns)
    for k, (network, n) in enumerate(columns):
        xs = [i + (k - len(columns) / 2 + 0.5) * width for i in range(len(runs))]
        base = [paper[b]["atm", 2] for b in runs]
        total = [table1_times[b, network, n][0] / t for b, t in zip(runs, base, strict=True)]
        compute = [table1_times[b, network, n][1] / t for b, t in zip(runs, base, strict=True)]
        comm = [t - c for t, c in zip(total, compute, strict=True)]
        bars = axes.bar(xs, compute, width, label=f"{network.upper()} {n}")
        colour = bars.patches[0].get_facecolor()
        axes.bar(xs, comm, width, bottom=compute, color=colour, alpha=0.4, hatch="//")
        marks = [paper[b][network, n] / t for b, t in zip(runs, base, strict=True)]
        axes.plot(xs, marks, "k_", markersize=12)
    axes.set_xticks(range(len(runs)), runs)
    axes.set_ylabel("time / paper's 2-node ATM time")
    axes.set_title("paper 003 Table 1 / Fig 7, simulated (bars) and paper (black marks)")
    axes.legend(ncol=3, fontsize="small")
    path = out / "splitc_fig7.png"
    plot.savefig(path, dpi=100)
    return path


def draw_splitc(
    directory: str | Path,
    fig5_times: Mapping[tuple[str, str], Times],
    table1_times: Mapping[tuple[str, str, int], Times],
    paper: Mapping[str, Mapping[tuple[str, int], float]],
) -> list[Path]:
    """Draw ``splitc_fig5.png`` from ``fig5_times`` ((benchmark, machine) -> times, the
    benchmarks in the order to draw) and ``splitc_fig7.png`` from ``table1_times``
    ((benchmark, network, nodes) -> times) against ``paper`` (paper 003 Table 1:
    benchmark -> {(network, nodes): seconds}, in the order to draw) into ``directory``
    (created if missing); the files written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    return [_fig5(out, fig5_times), _fig7(out, table1_times, paper)]
