"""The papers' raw U-Net measurements on the simulated network interfaces.

Each experiment runs a shipped recipe (``recipes/<name>.toml``, runnable on its own with
``stacklib run``) with the workload the paper used, and compares the figures the paper states
in its text.  docs/reproduction.md says how each figure was read and which model parameters
were calibrated to which figure (those are marked "calibrated" in the table; the others are
predictions of the model).

Asked for curves (``stacklib reproduce --plots``), each experiment also measures the sizes its
plots draw (:mod:`stacklib.reporting.plots.ni`) in the same recipe runs as its figures: the
figures' sizes first, so the figures come out exactly as without curves, then the others.  The
curves are named ``rtt <recipe>`` (microseconds), ``bandwidth <recipe>`` (MB/s for the SBAs,
Mbit/s for FE and the PCA-200), ``limit <link>`` (the link's payload limit, same unit) and
``paper rtt sba200`` (paper 000 §4.2.3's 120 us at 48 B + 6 us per extra cell).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from stacklib.bench.bandwidth import BandwidthParams
from stacklib.bench.pingpong import PingPongParams
from stacklib.bench.result import Result
from stacklib.recipes import Recipe, load_recipe, parse_recipe, run_recipe
from stacklib.reporting.figures import Experiment, ExperimentResult, Figure, register_experiment
from stacklib.transports.sim.fabric import cells
from stacklib.transports.sim.links import (
    AAL5_TRAILER,
    CELL_PAYLOAD,
    OC3,
    TAXI_140,
    EthernetLink,
    LinkTech,
)

ITERATIONS = 5  # virtual time is exact: a few round trips show the steady state
STREAM = 300  # messages per size in bandwidth runs


def rtts(
    recipe: str | Recipe, sizes: tuple[int, ...] | list[int], **transport: object
) -> dict[int, float]:
    """Mean round-trip time in microseconds per size."""
    loaded = _with_transport(recipe, transport)
    params = PingPongParams(sizes=sizes, iterations=ITERATIONS, warmup=2)  # type: ignore[arg-type]
    result = run_recipe(loaded, workload_params=params)
    return {int(row["size"]): float(row["rtt_us"]) for row in result.rows}  # type: ignore[arg-type]


def bandwidths(
    recipe: str | Recipe,
    sizes: tuple[int, ...] | list[int],
    unit: str = "mb_s",
    **transport: object,
) -> dict[int, float]:
    """Unidirectional bandwidth per size, in MB/s (10^6 bytes) or Mbit/s (``unit="mbit_s"``)."""
    loaded = _with_transport(recipe, transport)
    params = BandwidthParams(
        sizes=tuple(sizes), messages=STREAM, warmup=10, modes=("unidirectional",)
    )
    from stacklib.bench import workload_kind

    result: Result = run_recipe(
        attrs.evolve(loaded, workload=workload_kind("bandwidth")), workload_params=params
    )
    return {int(row["size"]): float(row[unit]) for row in result.rows}  # type: ignore[arg-type]


def _with_transport(recipe: str | Recipe, changes: Mapping[str, object]) -> Recipe:
    loaded = load_recipe(recipe) if isinstance(recipe, str) else recipe
    if not changes:
        return loaded
    from stacklib.config import unstructure

    table: dict[str, Any] = {"kind": loaded.transport.name}
    table.update(unstructure(loaded.transport_params))
    table.update(changes)
    data = {
        "run": {"clock": loaded.run.clock, "seed": loaded.run.seed},
        "transport": table,
        "workload": {"kind": "pingpong"},
    }
    return parse_recipe(data, str(loaded.path), loaded.path)


def slope(points: Mapping[int, float], low: int, high: int) -> float:
    """Increase per byte between two sizes."""
    return (points[high] - points[low]) / (high - low)


# --- the sizes the plots draw ----------------------------------------------------------------


def cell_edges(largest: int) -> list[int]:
    """Sizes up to ``largest`` where the AAL5 cell count changes (last of k cells, first of
    k + 1), so straight lines between them draw the per-cell staircase exactly."""
    sizes = {0}
    edge = CELL_PAYLOAD - AAL5_TRAILER
    while edge <= largest:
        sizes.update((edge, edge + 1))
        edge += CELL_PAYLOAD
    return sorted(size for size in sizes if size <= largest)


def span(*parts: Iterable[int]) -> list[int]:
    """The sizes of all ``parts``, once each, in order."""
    return sorted({size for part in parts for size in part})


#: Paper 000 Fig 3: the staircase to 1000 B and every 4 B to 100 B (the inset).
SBA_RTT_SIZES = span(cell_edges(1000), range(0, 101, 4))
#: Paper 000 Fig 4: 4 B to 5 KB.
SBA_BW_SIZES = span(
    [4, 16, 32, 40, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 800, 1024],
    range(1536, 5121, 512),
)
#: The largest message the simulated U-Net/FE carries (17 header bytes in a 1514-byte frame).
FE_LARGEST = 1497
#: Paper 003 Figs 5-6.
FE_SIZES = span(range(0, 129, 8), [63], range(200, 1401, 100), [FE_LARGEST])
ATM_FE_SIZES = span(cell_edges(1500), [44, 128, 1500])
FE_BW_SIZES = [s for s in FE_SIZES if s >= 8]
ATM_BW_SIZES = span([8], cell_edges(1498)[1:], [1498])


def _then(first: Sequence[int], more: Iterable[int]) -> list[int]:
    """``first`` in its order, then the sizes of ``more`` not in it: the figures' sizes run
    first, so their values do not depend on whether curves were asked for."""
    return [*first, *(size for size in more if size not in first)]


def _limit(link: LinkTech, sizes: Iterable[int], scale: float) -> dict[int, float]:
    """``link``'s payload limit per message size (above 0 bytes), bits/s divided by ``scale``."""
    return {s: link.payload_limit_bps(s) / scale for s in sizes if s > 0}


def _sba(
    recipe: str, rtt_sizes: Sequence[int], bw_sizes: Sequence[int], curves: bool
) -> tuple[dict[int, float], dict[int, float], dict[str, dict[int, float]]]:
    """Round trips and bandwidths (MB/s) of one SBA recipe; with ``curves`` at paper 000
    Figs 3-4's sizes too, returned as its curves."""
    rtt = rtts(recipe, _then(rtt_sizes, SBA_RTT_SIZES if curves else ()))
    bw = bandwidths(recipe, _then(bw_sizes, SBA_BW_SIZES if curves else ()))
    drawn = {f"rtt {recipe}": rtt, f"bandwidth {recipe}": bw} if curves else {}
    return rtt, bw, drawn


def sba100(curves: bool = False) -> ExperimentResult:
    rtt, bw, drawn = _sba("sba100", [40], [1024], curves)
    figures = [
        Figure("single-cell round trip", 66, rtt[40], "us", "paper 000 §4.1 (Table 1 sums)"),
        Figure("bandwidth at 1 KB", 6.8, bw[1024], "MB/s", "paper 000 §4.1 (calibrated)"),
    ]
    return ExperimentResult(figures, drawn)


def sba200(curves: bool = False) -> ExperimentResult:
    rtt, bw, drawn = _sba("sba200", [40, 48, 88, 1000], [800, 4096], curves)
    per_cell = (rtt[1000] - rtt[88]) / (21 - 2)  # 88 B -> 2 cells, 1000 B -> 21 cells
    figures = [
        Figure("single-cell round trip", 65, rtt[40], "us", "paper 000 §4.2.3 (calibrated)"),
        Figure("round trip at 48 bytes", 120, rtt[48], "us", "paper 000 §4.2.3 (calibrated)"),
        Figure("round trip per extra cell", 6, per_cell, "us", "paper 000 §4.2.3"),
        Figure("bandwidth at 800 B (fiber saturated)", 15.2, bw[800], "MB/s", "paper 000 §4.2.3"),
        Figure("peak bandwidth (4 KB)", 15.2, bw[4096], "MB/s", "paper 000 §4.2.1, §4.2.3"),
    ]
    if curves:
        drawn["limit taxi-140"] = _limit(TAXI_140, span([4], cell_edges(max(bw))), 8e6)
        longer = [s for s in cell_edges(1000) if s >= 41]
        drawn["paper rtt sba200"] = {s: 120.0 + 6 * (cells(s) - 2) for s in longer}
    return ExperimentResult(figures, drawn)


def fore_firmware(curves: bool = False) -> ExperimentResult:
    rtt, bw, drawn = _sba("fore-firmware", [40], [4096], curves)
    figures = [
        Figure("round trip", 160, rtt[40], "us", "paper 000 §4.2.1 (calibrated)"),
        Figure("bandwidth at 4 KB", 13, bw[4096], "MB/s", "paper 000 §4.2.1 (calibrated)"),
    ]
    return ExperimentResult(figures, drawn)


def fast_ethernet(curves: bool = False) -> ExperimentResult:
    more = FE_SIZES if curves else ()
    hub = rtts("fe-hub", _then([40, 100, 1000], more))
    fn100 = rtts("fe-fn100", _then([40], more))
    bw = bandwidths("fe-hub", _then([1024], FE_BW_SIZES if curves else ()), unit="mbit_s")
    figures = [
        Figure("40-byte round trip, hub", 57, hub[40], "us", "paper 003 §4.4.2 (calibrated)"),
        Figure("40-byte round trip, FN100", 91, fn100[40], "us", "paper 003 §4.4.2 (calibrated)"),
        Figure(
            "round trip per 100 bytes, hub",
            25,
            100 * slope(hub, 100, 1000),
            "us",
            "paper 003 §4.4.2 (calibrated)",
        ),
        Figure("bandwidth at 1 KB", 96.5, bw[1024], "Mbit/s", "paper 001 §3.4, 003 §4.4.2"),
    ]
    drawn: dict[str, dict[int, float]] = {}
    if curves:
        frames = span(range(1, FE_LARGEST, 8), [FE_LARGEST])
        drawn = {
            "rtt fe-hub": hub,
            # The Bay 28115 has no figure (no number in the text), only its curve in Fig 5.
            "rtt fe-bay28115": rtts("fe-bay28115", FE_SIZES),
            "rtt fe-fn100": fn100,
            "bandwidth fe-hub": bw,
            "limit fast-ethernet": _limit(EthernetLink(), frames, 1e6),
        }
    return ExperimentResult(figures, drawn)


def pca200(curves: bool = False) -> ExperimentResult:
    rtt = rtts("pca200-oc3", _then([40, 44, 500, 1500], ATM_FE_SIZES if curves else ()))
    bw = bandwidths(
        "pca200-oc3",
        _then([1498], ATM_BW_SIZES if curves else ()),
        unit="mbit_s",
        links=["oc-3", "taxi-140"],
    )
    figures = [
        Figure("single-cell round trip", 89, rtt[40], "us", "paper 001 §3.4 (calibrated)"),
        Figure("round trip at 44 bytes", 130, rtt[44], "us", "paper 003 §4.4.2 (calibrated)"),
        Figure("round trip at 1500 bytes", 351, rtt[1500], "us", "paper 003 §4.4.2 (calibrated)"),
        Figure(
            "round trip per 100 bytes (500-1500 B)",
            17,
            100 * slope(rtt, 500, 1500),
            "us",
            "paper 001 §3.4, 003 §4.4.2",
        ),
        Figure(
            "bandwidth, OC-3 sender to TAXI receiver",
            119,
            bw[1498],
            "Mbit/s",
            "paper 003 §4.4.2 (118-120)",
        ),
    ]
    drawn: dict[str, dict[int, float]] = {}
    if curves:
        edges = span([1], cell_edges(max(bw)))  # the AAL5 limit is linear between cell edges
        drawn = {
            "rtt pca200-oc3": rtt,
            "bandwidth pca200-oc3": bw,
            "limit oc-3": _limit(OC3, edges, 1e6),
            "limit taxi-140": _limit(TAXI_140, edges, 1e6),
        }
    return ExperimentResult(figures, drawn)


for _name, _title, _run in (
    ("sba100", "SBA-100: U-Net by traps and a user-level AAL5 (paper 000 §4.1)", sba100),
    ("sba200", "SBA-200 with U-Net firmware, raw U-Net (paper 000 §4.2, Figs 3-4)", sba200),
    ("fore-firmware", "SBA-200 with Fore's firmware (paper 000 §4.2.1)", fore_firmware),
    ("fast-ethernet", "U-Net/FE on the DC21140 (paper 001 §3, 003 Figs 5-6)", fast_ethernet),
    ("pca200", "PCA-200 on OC-3 with U-Net firmware (paper 001 §3.4, 003 Figs 5-6)", pca200),
):
    register_experiment(
        Experiment(
            _name,
            _title,
            _run,
            run_curves=functools.partial(_run, curves=True),
            seconds=0.3,  # wall time, measured once on a 2-core machine (--json wall_seconds)
        )
    )
