"""The papers' round-trip and bandwidth figures of the simulated NIs, drawn from the results
of the network-interface experiments (:mod:`stacklib.experiments.network_interfaces`):

* ``paper000_fig3_rtt.png``: raw U-Net round trips on the SBA-200, with the SBA-100 and Fore's
  firmware for comparison (paper 000 Fig 3);
* ``paper000_fig4_bandwidth.png``: raw U-Net bandwidth on the SBA-200 against the AAL-5 limit
  of the 140 Mbit/s TAXI fiber (paper 000 Fig 4);
* ``paper003_fig5_rtt.png``: U-Net/FE (hub, Bay 28115, FN100) and the PCA-200 on OC-3
  (paper 003 Fig 5 = paper 001 Fig 6);
* ``paper003_fig6_bandwidth.png``: U-Net/FE on a hub and the PCA-200 from OC-3 to TAXI, with
  the links' payload limits (paper 003 Fig 6 = paper 001 Fig 7).

The figures' own data is not in the papers' text, so the numbers the text states are overlaid
as stars.  U-Net/FE curves stop at 1497 bytes, the largest message the simulated U-Net/FE
carries (17 header bytes in a 1514-byte frame; paper 003 §4.4.2 says 1498).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from stacklib.reporting.figures import ExperimentResult
from stacklib.reporting.plots._axes import (
    COLOURS,
    LIMIT,
    curve,
    finish,
    legend,
    new,
    paper,
    save,
    upto,
)

__all__ = ["paper000_fig3", "paper000_fig4", "paper003_fig5", "paper003_fig6"]

Results = Mapping[str, ExperimentResult]
#: Paper 000 Figs 3-4: (experiment = recipe, legend, line style).
SBA_CURVES = (
    ("sba200", "SBA-200, U-Net firmware (raw U-Net)", "-"),
    ("fore-firmware", "SBA-200, Fore firmware", "--"),
    ("sba100", "SBA-100, traps + user-level AAL5", ":"),
)


def paper000_fig3(directory: Path, results: Results) -> Path:
    """Paper 000 Fig 3: raw U-Net round trip vs size on the SBA-200, with an inset of 0-100 B;
    needs the experiments ``sba200``, ``fore-firmware`` and ``sba100``."""
    figure, (main, inset) = new(
        "Paper 000 Fig 3: U-Net round-trip time vs message size "
        "(simulated; SPARCstation-20s, 140 Mbit/s TAXI, ASX-200)",
        panels=2,
    )
    for axes, largest in ((main, 1000), (inset, 100)):
        for recipe, label, style in SBA_CURVES:
            points = upto(results[recipe].curves[f"rtt {recipe}"], largest)
            curve(axes, points, label, COLOURS[recipe], linestyle=style)
    blue, orange, green = (COLOURS[r] for r in ("sba200", "fore-firmware", "sba100"))
    stated = ((40, 65, blue), (48, 120, blue), (40, 66, green), (40, 160, orange))
    for size, value, colour in stated:  # values are labelled in the inset
        paper(main, size, value, colour)
    paper(inset, 40, 65, blue, "65 µs single cell (SBA-200)", (12, -28))
    paper(inset, 48, 120, blue, "120 µs at 48 B", (14, 16))
    paper(inset, 40, 66, green, "66 µs single cell (SBA-100)", (10, 22))
    paper(inset, 40, 160, orange, "≈160 µs (Fore firmware)", (12, 14))
    curve(
        main,
        results["sba200"].curves["paper rtt sba200"],
        "paper: 120 µs at 48 B + 6 µs per extra cell",
        "black",
        linestyle=(0, (1, 2)),
        linewidth=1.0,
    )
    finish(main, "message size (bytes)", "round-trip time (µs)")
    finish(inset, "message size (bytes)", "round-trip time (µs)")
    main.set_xlim(0, 1000)
    inset.set_xlim(0, 100)
    inset.set_ylim(0, 220)
    inset.set_title("small messages (0-100 B)", fontsize=10)
    legend(main, "upper left")
    return save(figure, directory, "paper000_fig3_rtt.png")


def paper000_fig4(directory: Path, results: Results) -> Path:
    """Paper 000 Fig 4: raw U-Net bandwidth vs size on the SBA-200, and the AAL-5 limit;
    needs ``sba200``, ``fore-firmware`` and ``sba100``."""
    figure, (axes,) = new(
        "Paper 000 Fig 4: U-Net bandwidth vs message size (simulated; 140 Mbit/s TAXI)"
    )
    limit = results["sba200"].curves["limit taxi-140"]
    curve(axes, limit, "AAL-5 limit (140 Mbit/s TAXI)", **LIMIT)
    largest = 0
    for recipe, label, style in SBA_CURVES:
        points = results[recipe].curves[f"bandwidth {recipe}"]
        largest = max(largest, *points)
        curve(axes, points, label, COLOURS[recipe], linestyle=style, marker=".")
    blue = COLOURS["sba200"]
    paper(axes, 800, 15.2, blue, "15.2 MB/s: fiber saturated at 800 B", (10, -40))
    paper(axes, 4096, 15.2, blue, "15.2 MB/s peak", (-40, 25))
    paper(axes, 4096, 13, COLOURS["fore-firmware"], "13 MB/s at 4 KB (Fore)", (-30, -35))
    paper(axes, 1024, 6.8, COLOURS["sba100"], "6.8 MB/s at 1 KB (SBA-100)", (20, -25))
    finish(axes, "message size (bytes)", "bandwidth (MB/s, 10⁶ bytes/s)")
    axes.set_xlim(0, largest + 60)
    axes.set_ylim(0, 18.5)
    legend(axes, "lower right")
    return save(figure, directory, "paper000_fig4_bandwidth.png")


#: Paper 003 Figs 5-6: (experiment, recipe, legend).
FE_ATM_CURVES = (
    ("fast-ethernet", "fe-hub", "Fast Ethernet, hub"),
    ("fast-ethernet", "fe-bay28115", "Fast Ethernet, Bay 28115 switch"),
    ("fast-ethernet", "fe-fn100", "Fast Ethernet, Cabletron FN100 switch"),
    ("pca200", "pca200-oc3", "ATM, PCA-200 on OC-3 (ASX-200)"),
)


def paper003_fig5(directory: Path, results: Results) -> Path:
    """Paper 003 Fig 5 (paper 001 Fig 6): round trip vs size, Fast Ethernet and ATM; needs
    ``fast-ethernet`` and ``pca200``."""
    figure, (main, inset) = new(
        "Paper 003 Fig 5 / paper 001 Fig 6: round-trip time vs message size "
        "(simulated; 120 MHz Pentiums)",
        panels=2,
    )
    for experiment, recipe, label in FE_ATM_CURVES:
        points = results[experiment].curves[f"rtt {recipe}"]
        curve(main, points, label, COLOURS[recipe])
        curve(inset, upto(points, 128), label, COLOURS[recipe])
    hub, fn100, atm_colour = COLOURS["fe-hub"], COLOURS["fe-fn100"], COLOURS["pca200-oc3"]
    stated = ((40, 57, hub), (40, 91, fn100), (40, 89, atm_colour), (44, 130, atm_colour))
    for size, value, colour in stated:  # values are labelled in the inset
        paper(main, size, value, colour)
    paper(inset, 40, 57, hub, "57 µs (hub)", (14, -22))
    paper(inset, 40, 91, fn100, "91 µs (FN100)", (-75, 14))
    paper(inset, 40, 89, atm_colour, "89 µs (ATM, 1 cell)", (14, -8))
    paper(inset, 44, 130, atm_colour, "130 µs at 44 B (ATM)", (8, 16))
    paper(main, 1500, 351, atm_colour, "351 µs at 1500 B (ATM)", (-120, 30))
    for axes in (main, inset):
        finish(axes, "message size (bytes)", "round-trip time (µs)")
    main.set_xlim(0, 1520)
    inset.set_xlim(0, 128)
    inset.set_ylim(0, 180)
    inset.set_title("small messages (0-128 B)", fontsize=10)
    legend(main, "upper left")
    return save(figure, directory, "paper003_fig5_rtt.png")


def paper003_fig6(directory: Path, results: Results) -> Path:
    """Paper 003 Fig 6 (paper 001 Fig 7): bandwidth vs size, Fast Ethernet and ATM, with the
    links' payload limits; needs ``fast-ethernet`` and ``pca200``."""
    fe, atm = results["fast-ethernet"].curves, results["pca200"].curves
    figure, (axes,) = new(
        "Paper 003 Fig 6 / paper 001 Fig 7: bandwidth vs message size (simulated)"
    )
    curve(axes, atm["limit oc-3"], "limit: OC-3 (AAL5 payload)", **LIMIT)
    curve(
        axes,
        atm["limit taxi-140"],
        "limit: 140 Mbit/s TAXI (AAL5 payload)",
        **{**LIMIT, "linestyle": "--", "color": "black"},
    )
    curve(
        axes,
        fe["limit fast-ethernet"],
        "limit: Fast Ethernet (frame overhead)",
        **{**LIMIT, "linestyle": ":", "color": COLOURS["fe-hub"]},
    )
    curve(axes, fe["bandwidth fe-hub"], "Fast Ethernet, hub", COLOURS["fe-hub"], marker=".")
    curve(
        axes,
        atm["bandwidth pca200-oc3"],
        "ATM, PCA-200: OC-3 sender, TAXI receiver",
        COLOURS["pca200-oc3"],
    )
    paper(axes, 1024, 96.5, COLOURS["fe-hub"], "≈97 Mbit/s from 1 KB (FE)", (-30, -50))
    paper(axes, 1498, 119, COLOURS["pca200-oc3"], "118-120 Mbit/s (ATM)", (-150, -22))
    finish(axes, "message size (bytes)", "bandwidth (Mbit/s)")
    axes.set_xlim(0, 1520)
    axes.set_ylim(0, 160)
    legend(axes, "lower right")
    return save(figure, directory, "paper003_fig6_bandwidth.png")
