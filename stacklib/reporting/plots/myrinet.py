"""Paper 004 Figs 2, 4-8 and 10-12, drawn from the curves of experiment ``myrinet``
(:func:`stacklib.experiments.myrinet.myrinet_curves`): ``fig2: <method> <direction>`` (the
host<->NI bandwidths), ``<LogP column>: <library>`` (Figs 4-8), ``<mode>: <library>``
(Figs 10-12) and ``limit: NI-to-host`` (the solid line of §4.2)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as Plot

from stacklib.reporting.figures import Points
from stacklib.reporting.plots._axes import curve, named, save

__all__ = ["BW_PLOTS", "LOGP_PLOTS", "draw_myrinet"]

#: Figs 4-8: (LogP column, title, file).
LOGP_PLOTS = (
    ("rtt_half_us", "Fig 4: one-way latency (RTT/2)", "fig4-rtt.png"),
    ("g_us", "Fig 5: gap (g)", "fig5-gap.png"),
    ("os_us", "Fig 6: send overhead (Os)", "fig6-os.png"),
    ("or_us", "Fig 7: receive overhead (Or)", "fig7-or.png"),
    ("l_us", "Fig 8: latency (L)", "fig8-latency.png"),
)
#: Figs 10-12: (bandwidth mode, title, file).
BW_PLOTS = (
    ("pingpong", "Fig 10: bidirectional ping-pong bandwidth", "fig10-pingpong.png"),
    ("unidirectional", "Fig 11: unidirectional bandwidth", "fig11-unidirectional.png"),
    ("simultaneous", "Fig 12: simultaneous bidirectional bandwidth", "fig12-simultaneous.png"),
)


def _new(title: str, ylabel: str) -> tuple[Plot, Axes]:
    plot = Plot(figsize=(7.5, 4.8), layout="constrained")
    FigureCanvasAgg(plot)
    axes = plot.subplots()
    axes.set_title(title, fontsize=10)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("message size (bytes)")
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    return plot, axes


def draw_myrinet(
    directory: str | Path, curves: Mapping[str, Points], prefix: str = ""
) -> list[Path]:
    """Draw Figs 2, 4-8 and 10-12 of paper 004 as PNG files named ``prefix`` + ``fig2-host-ni.png``
    and so on into ``directory`` (created if missing); the files written."""
    folder = Path(directory)
    written: list[Path] = []
    plot, axes = _new("Fig 2: host <-> NI transfer bandwidth (estimated rates)", "MB/s")
    for key, points in named(curves, "fig2: ").items():
        curve(axes, points, key, marker=".")
    axes.legend(fontsize=8)
    written.append(save(plot, folder, f"{prefix}fig2-host-ni.png", dpi=100))
    for column, title, name in LOGP_PLOTS:
        plot, axes = _new(title, "us")
        for library, points in named(curves, f"{column}: ").items():
            curve(axes, points, library, marker=".")
        axes.legend(fontsize=8)
        written.append(save(plot, folder, prefix + name, dpi=100))
    for mode, title, name in BW_PLOTS:
        plot, axes = _new(title, "MB/s")
        curve(axes, curves["limit: NI-to-host"], "NI-to-host limit", "black")
        for library, points in named(curves, f"{mode}: ").items():
            curve(axes, points, library, marker=".")
        axes.legend(fontsize=8)
        written.append(save(plot, folder, prefix + name, dpi=100))
    return written
