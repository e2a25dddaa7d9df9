"""The papers' raw U-Net measurements on the simulated network interfaces.

Each experiment runs a shipped recipe (``recipes/<name>.toml``, runnable on its own with
``stacklib run``) with the workload the paper used, and compares the figures the paper states
in its text.  docs/reproduction.md says how each figure was read and which model parameters
were calibrated to which figure (those are marked "calibrated" in the table; the others are
predictions of the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from stacklib.bench.bandwidth import BandwidthParams
from stacklib.bench.pingpong import PingPongParams
from stacklib.bench.result import Result
from stacklib.recipes import Recipe, load_recipe, parse_recipe, run_recipe
from stacklib.reproduce import Experiment, Figure, register_experiment

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


def sba100() -> list[Figure]:
    rtt = rtts("sba100", [40])
    bw = bandwidths("sba100", [1024])
    return [
        Figure("single-cell round trip", 66, rtt[40], "us", "paper 000 §4.1 (Table 1 sums)"),
        Figure("bandwidth at 1 KB", 6.8, bw[1024], "MB/s", "paper 000 §4.1 (calibrated)"),
    ]


def sba200() -> list[Figure]:
    rtt = rtts("sba200", [40, 48, 88, 1000])
    bw = bandwidths("sba200", [800, 4096])
    per_cell = (rtt[1000] - rtt[88]) / (21 - 2)  # 88 B -> 2 cells, 1000 B -> 21 cells
    return [
        Figure("single-cell round trip", 65, rtt[40], "us", "paper 000 §4.2.3 (calibrated)"),
        Figure("round trip at 48 bytes", 120, rtt[48], "us", "paper 000 §4.2.3 (calibrated)"),
        Figure("round trip per extra cell", 6, per_cell, "us", "paper 000 §4.2.3"),
        Figure("bandwidth at 800 B (fiber saturated)", 15.2, bw[800], "MB/s", "paper 000 §4.2.3"),
        Figure("peak bandwidth (4 KB)", 15.2, bw[4096], "MB/s", "paper 000 §4.2.1, §4.2.3"),
    ]


def fore_firmware() -> list[Figure]:
    rtt = rtts("fore-firmware", [40])
    bw = bandwidths("fore-firmware", [4096])
    return [
        Figure("round trip", 160, rtt[40], "us", "paper 000 §4.2.1 (calibrated)"),
        Figure("bandwidth at 4 KB", 13, bw[4096], "MB/s", "paper 000 §4.2.1 (calibrated)"),
    ]


def fast_ethernet() -> list[Figure]:
    hub = rtts("fe-hub", [40, 100, 1000])
    fn100 = rtts("fe-fn100", [40])
    bw = bandwidths("fe-hub", [1024], unit="mbit_s")
    return [
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


def pca200() -> list[Figure]:
    rtt = rtts("pca200-oc3", [40, 44, 500, 1500])
    bw = bandwidths("pca200-oc3", [1498], unit="mbit_s", links=["oc-3", "taxi-140"])
    return [
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


for _name, _title, _run in (
    ("sba100", "SBA-100: U-Net by traps and a user-level AAL5 (paper 000 §4.1)", sba100),
    ("sba200", "SBA-200 with U-Net firmware, raw U-Net (paper 000 §4.2, Figs 3-4)", sba200),
    ("fore-firmware", "SBA-200 with Fore's firmware (paper 000 §4.2.1)", fore_firmware),
    ("fast-ethernet", "U-Net/FE on the DC21140 (paper 001 §3, 003 Figs 5-6)", fast_ethernet),
    ("pca200", "PCA-200 on OC-3 with U-Net firmware (paper 001 §3.4, 003 Figs 5-6)", pca200),
):
    register_experiment(Experiment(_name, _title, _run))
