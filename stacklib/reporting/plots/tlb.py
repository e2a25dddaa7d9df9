"""Paper 002 Fig 3: the simulated NI TLB's misses as stacked bars, drawn from replays
(:func:`stacklib.unet.mm.tlbsim.simulate`; ``stacklib tlbsim --plot``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from stacklib.unet.mm.tlbsim import TlbSimResult

__all__ = ["SEGMENTS", "plot_tlb"]

#: Fig 3's four bar segments, bottom to top, with their legend text.
SEGMENTS: Mapping[str, str] = {
    "tx_compulsory": "Transmit compulsory misses",
    "rx_compulsory": "Receive compulsory misses",
    "tx_non_compulsory": "Transmit non-comp. misses",
    "rx_non_compulsory": "Receive non-comp misses",
}


def plot_tlb(results: Sequence[TlbSimResult], path: str | Path) -> Path:
    """Stacked bars like paper 002 Fig 3, one per replay; the file written."""
    figure = Figure(figsize=(max(4.0, 0.9 * len(results) + 2), 4.0))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    labels = [f"{r.label}\nTLB {r.entries}" for r in results]
    bottoms = [0.0] * len(results)
    colours = ("0.15", "0.55", "tab:red", "tab:orange")
    for (field, legend), colour in zip(SEGMENTS.items(), colours, strict=True):
        values = [r.pct(getattr(r, field)) for r in results]
        axes.bar(labels, values, bottom=bottoms, label=legend, color=colour)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    axes.set_ylabel("misses, % of translations")
    axes.set_title("Simulated NI TLB (paper 002 Fig 3)")
    axes.legend(fontsize="small")
    axes.tick_params(axis="x", labelsize="small")
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out)
    return out
