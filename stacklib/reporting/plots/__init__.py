"""Every plot stacklib draws, from results (needs matplotlib: ``pip install 'stacklib[plot]'``;
importing this package imports it, so check :func:`stacklib.reporting.matplotlib_missing`
first).

:data:`PLOTS` are the plots of ``stacklib reproduce --plots DIR``, each naming the experiments
whose results it draws; :func:`draw_results` draws those whose experiments ran, from their
results alone (no simulation).  The other plots are drawn by their commands from the results
they print: ``stacklib libraries --plots`` (:func:`~stacklib.reporting.plots.myrinet.draw_myrinet`),
``stacklib tlbsim --plot`` (:func:`~stacklib.reporting.plots.tlb.plot_tlb`), and
:func:`~stacklib.reporting.plots.splitc.draw_splitc` for the Split-C suite's times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from stacklib.reporting.figures import ExperimentResult
from stacklib.reporting.plots.myrinet import draw_myrinet
from stacklib.reporting.plots.ni import paper000_fig3, paper000_fig4, paper003_fig5, paper003_fig6
from stacklib.reporting.plots.splitc import draw_splitc
from stacklib.reporting.plots.tcpip import (
    paper000_fig6,
    paper000_fig7,
    paper000_fig8,
    paper000_fig9,
)
from stacklib.reporting.plots.tlb import plot_tlb

__all__ = [
    "PLOTS",
    "Plot",
    "draw_myrinet",
    "draw_results",
    "draw_splitc",
    "paper000_fig3",
    "paper000_fig4",
    "paper000_fig6",
    "paper000_fig7",
    "paper000_fig8",
    "paper000_fig9",
    "paper003_fig5",
    "paper003_fig6",
    "plot_tlb",
]

Results = Mapping[str, ExperimentResult]


@attrs.frozen
class Plot:
    """A plot of ``stacklib reproduce --plots``: the file(s) it writes, the experiments whose
    results it reads, and the function that draws it into a directory."""

    file: str
    needs: tuple[str, ...]
    draw: Callable[[Path, Results], Path | Sequence[Path]]


def _myrinet(directory: Path, results: Results) -> list[Path]:
    return draw_myrinet(directory, results["myrinet"].curves, prefix="paper004_")


_SBA = ("sba200", "fore-firmware", "sba100")
_FE_ATM = ("fast-ethernet", "pca200")
#: In the order they are drawn (and listed in docs/reproduction.md).
PLOTS: tuple[Plot, ...] = (
    Plot("paper000_fig3_rtt.png", _SBA, paper000_fig3),
    Plot("paper000_fig4_bandwidth.png", _SBA, paper000_fig4),
    Plot("paper003_fig5_rtt.png", _FE_ATM, paper003_fig5),
    Plot("paper003_fig6_bandwidth.png", _FE_ATM, paper003_fig6),
    Plot("paper000_fig6_rtt.png", ("tcpip",), paper000_fig6),
    Plot("paper000_fig7_udp_bandwidth.png", ("tcpip",), paper000_fig7),
    Plot("paper000_fig8_tcp_bandwidth.png", ("tcpip",), paper000_fig8),
    Plot("paper000_fig9_rtt.png", ("tcpip",), paper000_fig9),
    Plot("paper004_fig*.png (Figs 2, 4-8, 10-12)", ("myrinet",), _myrinet),
)


def draw_results(
    directory: str | Path, results: Results, plots: Sequence[Plot] = PLOTS
) -> tuple[list[Path], list[Plot]]:
    """Draw each of ``plots`` whose experiments are all in ``results`` (experiment name ->
    result, with the curves its ``run_curves`` measured) into ``directory``, created if
    missing: the files written, and the plots left out because an experiment did not run."""
    written: list[Path] = []
    missing: list[Plot] = []
    for plot in plots:
        if not all(name in results for name in plot.needs):
            missing.append(plot)
            continue
        drawn = plot.draw(Path(directory), results)
        written += [drawn] if isinstance(drawn, Path) else list(drawn)
    return written, missing
