"""The papers' round-trip and bandwidth figures, redrawn from the simulated NIs.

``stacklib reproduce --plots DIR`` draws them (needs matplotlib: ``pip install 'stacklib[plot]'``):

* ``paper000_fig3_rtt.png``: raw U-Net round trips on the SBA-200, with the SBA-100 and Fore's
  firmware for comparison (paper 000 Fig 3);
* ``paper000_fig4_bandwidth.png``: raw U-Net bandwidth on the SBA-200 against the AAL-5 limit of
  the 140 Mbit/s TAXI fiber (paper 000 Fig 4);
* ``paper003_fig5_rtt.png``: U-Net/FE (hub, Bay 28115, FN100) and the PCA-200 on OC-3
  (paper 003 Fig 5 = paper 001 Fig 6);
* ``paper003_fig6_bandwidth.png``: U-Net/FE on a hub and the PCA-200 from OC-3 to TAXI, with
  the links' payload limits (paper 003 Fig 6 = paper 001 Fig 7);
* ``paper000_fig6_rtt.png`` to ``paper000_fig9_rtt.png``: UDP and TCP over U-Net against the
  modeled SunOS kernel path (paper 000 Figs 6-9; the curves of :mod:`stacklib.experiments.tcpip`).

Curves are measured in virtual time with the recipes of :mod:`stacklib.experiments`; the
figures' own data is not in the papers' text, so the numbers the text states are overlaid as
markers.  U-Net/FE curves stop at 1497 bytes, the largest message the simulated U-Net/FE
carries (17 header bytes in a 1514-byte frame; paper 003 §4.4.2 says 1498).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from stacklib.experiments import tcpip
from stacklib.experiments.network_interfaces import bandwidths, rtts
from stacklib.transports.sim.fabric import cells
from stacklib.transports.sim.links import (
    AAL5_TRAILER,
    CELL_PAYLOAD,
    OC3,
    TAXI_140,
    EthernetLink,
    LinkTech,
)

Sizes = Sequence[int] | None
Points = Mapping[int, float]

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
LIMIT: dict[str, Any] = {"color": "0.45", "linewidth": 0.9}
Location = Literal["upper left", "lower right"]


def cell_edges(largest: int) -> list[int]:
    """Sizes up to ``largest`` where the AAL5 cell count changes (last of k cells, first of
    k + 1), so straight lines between them draw the per-cell staircase exactly."""
    sizes = {0}
    edge = CELL_PAYLOAD - AAL5_TRAILER
    while edge <= largest:
        sizes.update((edge, edge + 1))
        edge += CELL_PAYLOAD
    return sorted(size for size in sizes if size <= largest)


def _span(*parts: Iterable[int]) -> list[int]:
    return sorted({size for part in parts for size in part})


FE_LARGEST = 1497
FE_SIZES = _span(range(0, 129, 8), [63], range(200, 1401, 100), [FE_LARGEST])
ATM_FE_SIZES = _span(cell_edges(1500), [44, 128, 1500])


# ---------------------------------------------------------------------------- drawing helpers


def _new(title: str, panels: int = 1) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(11.0, 5.2) if panels == 2 else (8.0, 5.2), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(
        1, panels, squeeze=False, width_ratios=[1.7, 1.0] if panels == 2 else None
    )[0]
    figure.suptitle(title, fontsize=11)
    return figure, list(axes)


def _curve(axes: Axes, points: Points, label: str, colour: str, **style: Any) -> None:
    sizes = sorted(points)
    axes.plot(sizes, [points[s] for s in sizes], label=label, color=colour, **style)


def _limit(axes: Axes, link: LinkTech, sizes: Iterable[int], label: str, scale: float) -> None:
    xs = [s for s in sizes if s > 0]
    axes.plot(xs, [link.payload_limit_bps(s) / scale for s in xs], label=label, **LIMIT)


def _paper(
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


def _legend(axes: Axes, location: Location) -> None:
    handles, labels = axes.get_legend_handles_labels()
    star = Line2D(
        [], [], marker="*", markersize=11, color="0.6", markeredgecolor="black", linestyle="none"
    )
    axes.legend([*handles, star], [*labels, "stated in the paper's text"], loc=location, fontsize=8)


def _finish(axes: Axes, xlabel: str, ylabel: str) -> None:
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)


def _save(figure: Figure, directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    figure.savefig(path, dpi=110)
    return path


# ---------------------------------------------------------------------------- figures


def paper000_fig3(directory: Path, sizes: Sizes = None) -> Path:
    """Paper 000 Fig 3: raw U-Net round trip vs size on the SBA-200, with an inset of 0-100 B."""
    large = list(sizes) if sizes else cell_edges(1000)
    small = list(sizes) if sizes else _span(range(0, 101, 4), cell_edges(100))
    curves = (
        ("sba200", "SBA-200, U-Net firmware (raw U-Net)", "-"),
        ("fore-firmware", "SBA-200, Fore firmware", "--"),
        ("sba100", "SBA-100, traps + user-level AAL5", ":"),
    )
    figure, (main, inset) = _new(
        "Paper 000 Fig 3: U-Net round-trip time vs message size "
        "(simulated; SPARCstation-20s, 140 Mbit/s TAXI, ASX-200)",
        panels=2,
    )
    for axes, span in ((main, large), (inset, small)):
        for recipe, label, style in curves:
            _curve(axes, rtts(recipe, span), label, COLOURS[recipe], linestyle=style)
    blue, orange, green = (COLOURS[r] for r in ("sba200", "fore-firmware", "sba100"))
    stated = ((40, 65, blue), (48, 120, blue), (40, 66, green), (40, 160, orange))
    for size, value, colour in stated:  # values are labelled in the inset
        _paper(main, size, value, colour)
    _paper(inset, 40, 65, blue, "65 µs single cell (SBA-200)", (12, -28))
    _paper(inset, 48, 120, blue, "120 µs at 48 B", (14, 16))
    _paper(inset, 40, 66, green, "66 µs single cell (SBA-100)", (10, 22))
    _paper(inset, 40, 160, orange, "≈160 µs (Fore firmware)", (12, 14))
    longer = [s for s in cell_edges(1000) if s >= 41]
    main.plot(
        longer,
        [120 + 6 * (cells(s) - 2) for s in longer],
        label="paper: 120 µs at 48 B + 6 µs per extra cell",
        color="black",
        linestyle=(0, (1, 2)),
        linewidth=1.0,
    )
    _finish(main, "message size (bytes)", "round-trip time (µs)")
    _finish(inset, "message size (bytes)", "round-trip time (µs)")
    main.set_xlim(0, 1000)
    inset.set_xlim(0, 100)
    inset.set_ylim(0, 220)
    inset.set_title("small messages (0-100 B)", fontsize=10)
    _legend(main, "upper left")
    return _save(figure, directory, "paper000_fig3_rtt.png")


def paper000_fig4(directory: Path, sizes: Sizes = None) -> Path:
    """Paper 000 Fig 4: raw U-Net bandwidth vs size on the SBA-200, and the AAL-5 limit."""
    span = (
        list(sizes)
        if sizes
        else _span(
            [4, 16, 32, 40, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 800, 1024],
            range(1536, 5121, 512),
        )
    )
    figure, (axes,) = _new(
        "Paper 000 Fig 4: U-Net bandwidth vs message size (simulated; 140 Mbit/s TAXI)"
    )
    _limit(axes, TAXI_140, _span([4], cell_edges(max(span))), "AAL-5 limit (140 Mbit/s TAXI)", 8e6)
    for recipe, label, style in (
        ("sba200", "SBA-200, U-Net firmware (raw U-Net)", "-"),
        ("fore-firmware", "SBA-200, Fore firmware", "--"),
        ("sba100", "SBA-100, traps + user-level AAL5", ":"),
    ):
        _curve(axes, bandwidths(recipe, span), label, COLOURS[recipe], linestyle=style, marker=".")
    blue = COLOURS["sba200"]
    _paper(axes, 800, 15.2, blue, "15.2 MB/s: fiber saturated at 800 B", (10, -40))
    _paper(axes, 4096, 15.2, blue, "15.2 MB/s peak", (-40, 25))
    _paper(axes, 4096, 13, COLOURS["fore-firmware"], "13 MB/s at 4 KB (Fore)", (-30, -35))
    _paper(axes, 1024, 6.8, COLOURS["sba100"], "6.8 MB/s at 1 KB (SBA-100)", (20, -25))
    _finish(axes, "message size (bytes)", "bandwidth (MB/s, 10⁶ bytes/s)")
    axes.set_xlim(0, max(span) + 60)
    axes.set_ylim(0, 18.5)
    _legend(axes, "lower right")
    return _save(figure, directory, "paper000_fig4_bandwidth.png")


def paper003_fig5(directory: Path, sizes: Sizes = None) -> Path:
    """Paper 003 Fig 5 (paper 001 Fig 6): round trip vs size, Fast Ethernet and ATM."""
    fe = list(sizes) if sizes else FE_SIZES
    atm = list(sizes) if sizes else ATM_FE_SIZES
    curves = (
        ("fe-hub", "Fast Ethernet, hub", fe),
        ("fe-bay28115", "Fast Ethernet, Bay 28115 switch", fe),
        ("fe-fn100", "Fast Ethernet, Cabletron FN100 switch", fe),
        ("pca200-oc3", "ATM, PCA-200 on OC-3 (ASX-200)", atm),
    )
    figure, (main, inset) = _new(
        "Paper 003 Fig 5 / paper 001 Fig 6: round-trip time vs message size "
        "(simulated; 120 MHz Pentiums)",
        panels=2,
    )
    for recipe, label, span in curves:
        points = rtts(recipe, span)
        _curve(main, points, label, COLOURS[recipe])
        _curve(inset, {s: v for s, v in points.items() if s <= 128}, label, COLOURS[recipe])
    hub, fn100, atm_colour = COLOURS["fe-hub"], COLOURS["fe-fn100"], COLOURS["pca200-oc3"]
    stated = ((40, 57, hub), (40, 91, fn100), (40, 89, atm_colour), (44, 130, atm_colour))
    for size, value, colour in stated:  # values are labelled in the inset
        _paper(main, size, value, colour)
    _paper(inset, 40, 57, hub, "57 µs (hub)", (14, -22))
    _paper(inset, 40, 91, fn100, "91 µs (FN100)", (-75, 14))
    _paper(inset, 40, 89, atm_colour, "89 µs (ATM, 1 cell)", (14, -8))
    _paper(inset, 44, 130, atm_colour, "130 µs at 44 B (ATM)", (8, 16))
    _paper(main, 1500, 351, atm_colour, "351 µs at 1500 B (ATM)", (-120, 30))
    for axes in (main, inset):
        _finish(axes, "message size (bytes)", "round-trip time (µs)")
    main.set_xlim(0, 1520)
    inset.set_xlim(0, 128)
    inset.set_ylim(0, 180)
    inset.set_title("small messages (0-128 B)", fontsize=10)
    _legend(main, "upper left")
    return _save(figure, directory, "paper003_fig5_rtt.png")


def paper003_fig6(directory: Path, sizes: Sizes = None) -> Path:
    """Paper 003 Fig 6 (paper 001 Fig 7): bandwidth vs size, Fast Ethernet and ATM."""
    fe = list(sizes) if sizes else [s for s in FE_SIZES if s >= 8]
    atm = list(sizes) if sizes else _span([8], cell_edges(1498)[1:], [1498])
    figure, (axes,) = _new(
        "Paper 003 Fig 6 / paper 001 Fig 7: bandwidth vs message size (simulated)"
    )
    edges = _span([1], cell_edges(max(atm)))  # the AAL5 limit is linear between cell edges
    _limit(axes, OC3, edges, "limit: OC-3 (AAL5 payload)", 1e6)
    _limit(axes, TAXI_140, edges, "limit: 140 Mbit/s TAXI (AAL5 payload)", 1e6)
    axes.lines[-1].set(linestyle="--", color="black")
    frames = _span(range(1, FE_LARGEST, 8), [FE_LARGEST])
    _limit(axes, EthernetLink(), frames, "limit: Fast Ethernet (frame overhead)", 1e6)
    axes.lines[-1].set(linestyle=":", color=COLOURS["fe-hub"])
    _curve(
        axes,
        bandwidths("fe-hub", fe, unit="mbit_s"),
        "Fast Ethernet, hub",
        COLOURS["fe-hub"],
        marker=".",
    )
    _curve(
        axes,
        bandwidths("pca200-oc3", atm, unit="mbit_s", links=["oc-3", "taxi-140"]),
        "ATM, PCA-200: OC-3 sender, TAXI receiver",
        COLOURS["pca200-oc3"],
    )
    _paper(axes, 1024, 96.5, COLOURS["fe-hub"], "≈97 Mbit/s from 1 KB (FE)", (-30, -50))
    _paper(axes, 1498, 119, COLOURS["pca200-oc3"], "118-120 Mbit/s (ATM)", (-150, -22))
    _finish(axes, "message size (bytes)", "bandwidth (Mbit/s)")
    axes.set_xlim(0, 1520)
    axes.set_ylim(0, 160)
    _legend(axes, "lower right")
    return _save(figure, directory, "paper003_fig6_bandwidth.png")


# ------------------------------------------------ paper 000 §7: kernel and U-Net IP


#: Paper 000 Figs 6-9: each curve of stacklib.experiments.tcpip's colour and line style.
TCPIP_STYLE = {
    "U-Net UDP": ("tab:blue", "-"),
    "U-Net TCP": ("tab:green", "-"),
    "kernel UDP, ATM": ("tab:red", "-"),
    "kernel UDP, Ethernet": ("tab:red", "--"),
    "kernel TCP, ATM": ("tab:purple", "-"),
    "kernel TCP, Ethernet": ("tab:purple", "--"),
    "kernel UDP/ATM": ("tab:red", "-"),
    "kernel TCP/ATM": ("tab:purple", "-"),
    "kernel UDP/ATM, sender": ("tab:orange", ":"),
    "kernel UDP/ATM, received": ("tab:red", "-"),
}


def _tcpip_figure(
    directory: Path,
    name: str,
    title: str,
    curves: Mapping[str, Points],
    labels: tuple[str, str],
    stated: Sequence[tuple[float, float, str, str, tuple[float, float]]] = (),
    legend: Location = "upper left",
) -> Path:
    """One figure of paper 000 §7's curves (stacklib.experiments.tcpip)."""
    figure, (axes,) = _new(title)
    for label, points in curves.items():
        colour, style = TCPIP_STYLE[label]
        marker = "." if len(points) < 20 else None
        _curve(axes, points, label, colour, linestyle=style, marker=marker)
    for x, y, colour, text, offset in stated:
        _paper(axes, x, y, colour, text, offset)
    _finish(axes, *labels)
    _legend(axes, legend)
    return _save(figure, directory, name)


def paper000_fig6(directory: Path, sizes: Sizes = None) -> Path:
    """``paper000_fig6_rtt.png``: kernel UDP/TCP round trips, ATM against Ethernet."""
    return _tcpip_figure(
        directory,
        "paper000_fig6_rtt.png",
        "Paper 000 Fig 6: kernel TCP and UDP round trips over ATM and Ethernet "
        "(SunOS 4.1.3 cost model)",
        tcpip.fig6_curves(sizes or tcpip.RTT_SIZES),
        ("message size (bytes)", "round-trip time (µs)"),
    )


def paper000_fig7(directory: Path, sizes: Sizes = None) -> Path:
    """``paper000_fig7_udp_bandwidth.png``: UDP bandwidth vs size, the kernel's saw-tooth."""
    curves = tcpip.fig7_curves(sizes or tcpip.UDP_BW_SIZES, sizes or tcpip.KERNEL_UDP_SIZES)
    return _tcpip_figure(
        directory,
        "paper000_fig7_udp_bandwidth.png",
        "Paper 000 Fig 7: UDP bandwidth vs message size (U-Net simulated; kernel model)",
        curves,
        ("message size (bytes)", "bandwidth (MB/s, 10⁶ bytes/s)"),
        [(4096, 15.0, "tab:blue", "120 Mbit/s at 4 KB (U-Net, Table 3)", (-60, -40))],
        "lower right",
    )


def paper000_fig8(directory: Path, sizes: Sizes = None) -> Path:
    """``paper000_fig8_tcp_bandwidth.png``: TCP bandwidth vs window, U-Net and kernel."""
    return _tcpip_figure(
        directory,
        "paper000_fig8_tcp_bandwidth.png",
        "Paper 000 Fig 8: TCP bandwidth vs window (U-Net simulated, 2048-byte segments; "
        "kernel model)",
        tcpip.fig8_curves(sizes or tcpip.WINDOWS),
        ("window (bytes)", "bandwidth (MB/s, 10⁶ bytes/s)"),
        [
            (8192, 14.5, "tab:green", "14-15 MB/s, 8 KB window (U-Net)", (25, -40)),
            (65535, 9.5, "tab:purple", "9-10 MB/s even at 64 KB (kernel)", (-150, 25)),
        ],
        "lower right",
    )


def paper000_fig9(directory: Path, sizes: Sizes = None) -> Path:
    """``paper000_fig9_rtt.png``: UDP and TCP round trips, U-Net against the kernel."""
    return _tcpip_figure(
        directory,
        "paper000_fig9_rtt.png",
        "Paper 000 Fig 9: UDP and TCP round trips (U-Net simulated, SBA-200; kernel model)",
        tcpip.fig9_curves(sizes or tcpip.RTT_SIZES),
        ("message size (bytes)", "round-trip time (µs)"),
        [
            (16, 138, "tab:blue", "138 µs UDP (Table 3)", (40, -10)),
            (16, 157, "tab:green", "157 µs TCP (Table 3)", (40, 40)),
        ],
    )


FIGURES: tuple[Callable[[Path], Path], ...] = (
    paper000_fig3,
    paper000_fig4,
    paper003_fig5,
    paper003_fig6,
    paper000_fig6,
    paper000_fig7,
    paper000_fig8,
    paper000_fig9,
)


def draw_figures(directory: str | Path) -> list[Path]:
    """Draw every figure into ``directory`` (created if missing); the files written."""
    return [draw(Path(directory)) for draw in FIGURES]
