"""Paper 000 Figs 6-9: UDP and TCP over U-Net against the modeled SunOS kernel path, drawn
from the result of experiment ``tcpip`` (:mod:`stacklib.experiments.tcpip`; its curves are
named ``"fig6: kernel UDP, ATM"`` and so on)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from stacklib.reporting.figures import ExperimentResult, Points
from stacklib.reporting.plots._axes import Location, curve, finish, legend, named, new, paper, save

__all__ = ["TCPIP_STYLE", "paper000_fig6", "paper000_fig7", "paper000_fig8", "paper000_fig9"]

Results = Mapping[str, ExperimentResult]
#: Each curve's colour and line style.
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
Stated = Sequence[tuple[float, float, str, str, tuple[float, float]]]


def _figure(
    directory: Path,
    name: str,
    title: str,
    curves: Mapping[str, Points],
    labels: tuple[str, str],
    stated: Stated = (),
    location: Location = "upper left",
) -> Path:
    figure, (axes,) = new(title)
    for label, points in curves.items():
        colour, style = TCPIP_STYLE[label]
        marker = "." if len(points) < 20 else None
        curve(axes, points, label, colour, linestyle=style, marker=marker)
    for x, y, colour, text, offset in stated:
        paper(axes, x, y, colour, text, offset)
    finish(axes, *labels)
    legend(axes, location)
    return save(figure, directory, name)


def paper000_fig6(directory: Path, results: Results) -> Path:
    """``paper000_fig6_rtt.png``: kernel UDP/TCP round trips, ATM against Ethernet."""
    return _figure(
        directory,
        "paper000_fig6_rtt.png",
        "Paper 000 Fig 6: kernel TCP and UDP round trips over ATM and Ethernet "
        "(SunOS 4.1.3 cost model)",
        named(results["tcpip"].curves, "fig6: "),
        ("message size (bytes)", "round-trip time (µs)"),
    )


def paper000_fig7(directory: Path, results: Results) -> Path:
    """``paper000_fig7_udp_bandwidth.png``: UDP bandwidth vs size, the kernel's saw-tooth."""
    return _figure(
        directory,
        "paper000_fig7_udp_bandwidth.png",
        "Paper 000 Fig 7: UDP bandwidth vs message size (U-Net simulated; kernel model)",
        named(results["tcpip"].curves, "fig7: "),
        ("message size (bytes)", "bandwidth (MB/s, 10⁶ bytes/s)"),
        [(4096, 15.0, "tab:blue", "120 Mbit/s at 4 KB (U-Net, Table 3)", (-60, -40))],
        "lower right",
    )


def paper000_fig8(directory: Path, results: Results) -> Path:
    """``paper000_fig8_tcp_bandwidth.png``: TCP bandwidth vs window, U-Net and kernel."""
    return _figure(
        directory,
        "paper000_fig8_tcp_bandwidth.png",
        "Paper 000 Fig 8: TCP bandwidth vs window (U-Net simulated, 2048-byte segments; "
        "kernel model)",
        named(results["tcpip"].curves, "fig8: "),
        ("window (bytes)", "bandwidth (MB/s, 10⁶ bytes/s)"),
        [
            (8192, 14.5, "tab:green", "14-15 MB/s, 8 KB window (U-Net)", (25, -40)),
            (65535, 9.5, "tab:purple", "9-10 MB/s even at 64 KB (kernel)", (-150, 25)),
        ],
        "lower right",
    )


def paper000_fig9(directory: Path, results: Results) -> Path:
    """``paper000_fig9_rtt.png``: UDP and TCP round trips, U-Net against the kernel."""
    return _figure(
        directory,
        "paper000_fig9_rtt.png",
        "Paper 000 Fig 9: UDP and TCP round trips (U-Net simulated, SBA-200; kernel model)",
        named(results["tcpip"].curves, "fig9: "),
        ("message size (bytes)", "round-trip time (µs)"),
        [
            (16, 138, "tab:blue", "138 µs UDP (Table 3)", (40, -10)),
            (16, 157, "tab:green", "157 µs TCP (Table 3)", (40, 40)),
        ],
    )
