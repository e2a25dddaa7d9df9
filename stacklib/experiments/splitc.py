"""Split-C over UAM on the simulated machines: paper 000 Table 3's Split-C store row, paper 003
Tables 1-2 (the bulk programs), paper 000 Fig 5's stated comparisons.

``stacklib reproduce splitc`` runs, in virtual time, a scaled configuration by default
(:func:`run_experiment`; its sizes are printed with the results) and the paper's sizes with
``run_experiment(full=True)``:

* Table 3 (paper 000): the Split-C round trip (a blocking read: one request, one reply) and
  the bandwidth of 4 KB bulk stores, on two SPARCstation-20s with SBA-200s;
* Table 1 (paper 003) for mm 16x16, ssortlg and rsortlg on 2, 4 and 8 nodes of the ATM and FE
  clusters.  Full: at the paper's sizes (512K keys per node; 16x16 blocks of 16x16), each
  time against the paper's; the 2-node times are calibrated
  (stacklib/transports/sim/machines.py), the rest are predictions (tolerance 20%).  mm 128x128
  and the small-message sorts take minutes to simulate at the paper's sizes: :func:`table1`
  runs them on request.  Scaled (:data:`SCALED_TABLE1`): absolute times are not comparable,
  so only what carries over is checked: ATM ahead of FE on each of them at every node count
  (paper 003 §5.2: ATM ahead by bandwidth and the SPARC's floating point), and the
  speedups of Table 2;
* Table 2 (paper 003): the speedup from 2 to 8 nodes, ``(N8 / N2) x T2 / T8`` where N is the
  problem size per run: the matrix is fixed, the sorts' keys grow with the nodes ("the number
  of keys per processor is kept constant", §5.2).  This definition gives every entry of the
  paper's Table 2 from its Table 1 to within 0.15;
* Fig 5 (paper 000): the seven programs on 8 nodes of the CM-5, the Meiko CS-2 and the U-Net
  ATM cluster at scaled sizes (smaller ones by default: :data:`FIG5_FAST`), and each
  comparison §6 states in words, checked (1 = holds).

docs/splitc.md has the results and how each number was obtained.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import trio

from stacklib.bench.splitc.cluster import run_spmd
from stacklib.bench.splitc.programs import make_program
from stacklib.layers.splitc import SplitC
from stacklib.reproduce import Experiment, Figure, register_experiment
from stacklib.transports.sim.machines import MACHINES

__all__ = [
    "FIG5_FAST",
    "FIG5_SIZES",
    "SCALED_TABLE1",
    "TABLE1",
    "TABLE2",
    "draw",
    "fig5",
    "run_experiment",
    "split_c_store",
    "table1",
]

#: paper 003 Table 1, seconds: benchmark -> {(network, nodes): time}.
TABLE1: dict[str, dict[tuple[str, int], float]] = {
    "mm128": {
        ("atm", 2): 56.59, ("fe", 2): 117.00, ("atm", 4): 33.31,
        ("fe", 4): 54.68, ("atm", 8): 29.04, ("fe", 8): 48.52,
    },
    "mm16": {
        ("atm", 2): 1.26, ("fe", 2): 1.67, ("atm", 4): 0.90,
        ("fe", 4): 1.04, ("atm", 8): 0.56, ("fe", 8): 0.67,
    },
    "ssortsm": {
        ("atm", 2): 1.08, ("fe", 2): 0.63, ("atm", 4): 1.26,
        ("fe", 4): 0.78, ("atm", 8): 1.69, ("fe", 8): 1.08,
    },
    "ssortlg": {
        ("atm", 2): 2.03, ("fe", 2): 2.06, ("atm", 4): 2.11,
        ("fe", 4): 2.55, ("atm", 8): 2.93, ("fe", 8): 3.22,
    },
    "rsortsm": {
        ("atm", 2): 48.13, ("fe", 2): 44.61, ("atm", 4): 76.64,
        ("fe", 4): 63.79, ("atm", 8): 88.23, ("fe", 8): 90.50,
    },
    "rsortlg": {
        ("atm", 2): 4.73, ("fe", 2): 5.35, ("atm", 4): 5.01,
        ("fe", 4): 6.30, ("atm", 8): 7.15, ("fe", 8): 7.54,
    },
}  # fmt: skip
#: paper 003 Table 2: speedup from 2 to 8 nodes, (atm, fe).
TABLE2: dict[str, tuple[float, float]] = {
    "mm128": (1.9, 2.4),
    "mm16": (2.2, 2.5),
    "ssortsm": (2.5, 2.4),
    "ssortlg": (2.9, 2.5),
    "rsortsm": (2.2, 2.0),
    "rsortlg": (2.7, 2.9),
}
#: Calibration points (machines.py): these 2-node times are not predictions.
CALIBRATED = {("mm128", "atm", 2), ("mm128", "fe", 2), ("mm16", "atm", 2), ("mm16", "fe", 2),
              ("rsortlg", "atm", 2), ("rsortlg", "fe", 2), ("ssortlg", "atm", 2),
              ("ssortlg", "fe", 2)}  # fmt: skip
CLUSTERS = {"atm": "atm-003", "fe": "fe-003"}
#: What runs by default (the others take minutes of wall time at the paper's sizes).
DEFAULT_TABLE1 = ("mm16", "ssortlg", "rsortlg")
#: Fig 5 at scaled sizes (paper 000 §6 uses 4 by 4 blocks of 128 by 128 and 4M keys in all).
FIG5_SIZES: dict[str, tuple[int, ...]] = {
    "mm4x4": (4, 64),
    "ssortsm": (8192,),
    "ssortlg": (8192,),
    "rsortsm": (4096,),
    "rsortlg": (16384,),
    "cc": (16, 128),
    "cg": (32, 256),
}
#: Fig 5 in the default (fast) run: the smallest sizes at which every §6 comparison keeps its
#: margin (the radix sort of small messages needs 1024 keys per node for ATM and the Meiko to
#: stay within 25% of each other).
FIG5_FAST: dict[str, tuple[int, ...]] = {
    "mm4x4": (4, 32),
    "ssortsm": (1024,),
    "ssortlg": (1024,),
    "rsortsm": (1024,),
    "rsortlg": (4096,),
    "cc": (8, 32),
    "cg": (16, 128),
}
#: Table 1 in the default (fast) run: 8x8 blocks of 16x16 (an eighth of mm 16x16's block
#: multiplies, the same messages) and 32K keys per node (a sixteenth of 512K).
SCALED_TABLE1: dict[str, tuple[int, ...]] = {
    "mm16": (8, 16),
    "ssortlg": (32 * 1024,),
    "rsortlg": (32 * 1024,),
}


def split_c_store(round_trips: int = 20, blocks: int = 100) -> tuple[float, float]:
    """Paper 000 Table 3's Split-C row on two SS-20s with SBA-200s: the round trip of a
    blocking read (microseconds, mean after warm-up) and the bandwidth of ``blocks`` 4160-byte
    bulk stores until the receiver's ``store_sync`` (Mbit/s)."""
    size = 4160

    async def program(sc: SplitC) -> tuple[float, float]:
        await sc.all_alloc("x", 1, np.int64)
        await sc.all_alloc("blocks", blocks * size, np.uint8)
        await sc.barrier()
        rtt = 0.0
        if sc.rank == 0:
            for i in range(round_trips + 2):
                start = trio.current_time()
                await sc.read(sc.ptr(1, "x"))
                if i >= 2:
                    rtt += trio.current_time() - start
        await sc.barrier()
        start = trio.current_time()
        if sc.rank == 0:
            data = np.zeros(size, np.uint8)
            for i in range(blocks):
                await sc.bulk_store(sc.ptr(1, "blocks", i * size), data)
        else:
            await sc.store_sync(blocks * size)
        elapsed = trio.current_time() - start
        return rtt / round_trips * 1e6, blocks * size * 8 / elapsed / 1e6

    run = run_spmd(program, 2, "sim-atm", host="ss20")
    return run.results[0][0], run.results[1][1]


def _progress(line: str) -> None:
    print(f"splitc: {line}", file=sys.stderr, flush=True)


def table1(
    benchmarks: Sequence[str] = DEFAULT_TABLE1,
    nodes: Sequence[int] = (2, 4, 8),
    progress: Callable[[str], None] | None = None,
    sizes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[tuple[str, str, int], tuple[float, float]]:
    """Simulated paper 003 Table 1 entries at the paper's sizes (or ``sizes[benchmark]``):
    (benchmark, network, nodes) -> (total, computation) seconds (the slowest rank's total,
    the ranks' mean computation).  ``progress`` gets a line per run."""
    out = {}
    for benchmark in benchmarks:
        for network, machine_name in CLUSTERS.items():
            machine = MACHINES[machine_name]
            for n in nodes:
                started = time.perf_counter()
                scaled = (sizes or {}).get(benchmark)
                program = make_program(benchmark, scaled, machine=machine)
                run = run_spmd(program, n, machine_name)
                if not all(r.ok for r in run.results):
                    raise RuntimeError(f"{benchmark} on {n} {network} nodes: wrong result")
                total = max(r.total for r in run.results)
                compute = sum(r.compute for r in run.results) / n
                out[benchmark, network, n] = (total, compute)
                if progress is not None:
                    wall = time.perf_counter() - started
                    progress(
                        f"{benchmark} {network.upper()} {n} nodes: {total:.3f} s ({wall:.1f} s)"
                    )
    return out


def fig5(
    nodes: int = 8,
    progress: Callable[[str], None] | None = None,
    sizes: Mapping[str, tuple[int, ...]] = FIG5_SIZES,
) -> dict[tuple[str, str], tuple[float, float]]:
    """Paper 000 Fig 5 at ``sizes`` (:data:`FIG5_SIZES`, or :data:`FIG5_FAST`):
    (benchmark, machine) -> (total, computation)."""
    out = {}
    for benchmark in FIG5_SIZES:
        program_sizes = sizes[benchmark]
        for name in ("cm5", "meiko", "unet-atm"):
            program = make_program(benchmark, program_sizes, machine=MACHINES[name])
            run = run_spmd(program, nodes, name)
            if not all(r.ok for r in run.results):
                raise RuntimeError(f"{benchmark} on the {name}: wrong result")
            total = max(r.total for r in run.results)
            out[benchmark, name] = (total, sum(r.compute for r in run.results) / nodes)
            if progress is not None:
                progress(f"Fig 5: {benchmark} on the {name}: {total:.4f} s")
    return out


def _fig5_claims(times: dict[tuple[str, str], tuple[float, float]]) -> list[tuple[str, bool]]:
    """Each comparison paper 000 §6 states about Fig 5, evaluated on ``times``."""

    def t(benchmark: str, machine: str) -> float:
        return times[benchmark, machine][0]

    def c(benchmark: str, machine: str) -> float:
        return times[benchmark, machine][1]

    def close(a: float, b: float) -> bool:
        return abs(a - b) / max(a, b) <= 0.25

    return [
        ("mm: CM-5 slowest (CPU and bandwidth)", t("mm4x4", "cm5") > max(
            t("mm4x4", "meiko"), t("mm4x4", "unet-atm"))),
        ("ssortsm: CM-5 computes slowest", c("ssortsm", "cm5") > max(
            c("ssortsm", "meiko"), c("ssortsm", "unet-atm"))),
        ("ssortsm: ATM and Meiko roughly equal", close(
            t("ssortsm", "meiko"), t("ssortsm", "unet-atm"))),
        ("ssortlg: bulk improves ATM and Meiko relative to the CM-5",
         t("ssortlg", "unet-atm") / t("ssortlg", "cm5")
         < t("ssortsm", "unet-atm") / t("ssortsm", "cm5")
         and t("ssortlg", "meiko") / t("ssortlg", "cm5")
         < t("ssortsm", "meiko") / t("ssortsm", "cm5")),
        ("rsortsm: ATM slower than the CM-5", t("rsortsm", "unet-atm") > t("rsortsm", "cm5")),
        ("cc: ATM slower than the CM-5", t("cc", "unet-atm") > t("cc", "cm5")),
        ("rsortlg: ATM faster than the CM-5", t("rsortlg", "unet-atm") < t("rsortlg", "cm5")),
        ("rsortsm: ATM roughly equal to the Meiko", close(
            t("rsortsm", "meiko"), t("rsortsm", "unet-atm"))),
    ]  # fmt: skip


def draw(
    directory: str | Path,
    fig5_times: dict[tuple[str, str], tuple[float, float]],
    table1_times: dict[tuple[str, str, int], tuple[float, float]],
) -> list[Path]:
    """Draw ``splitc_fig5.png`` (paper 000 Fig 5: the programs on the three machines,
    normalized to the CM-5) and ``splitc_fig7.png`` (paper 003 Fig 7: Table 1 normalized to 2
    ATM nodes, paper values as markers), each bar split into computation (solid) and
    communication (hatched).  Needs matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as Plot

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    machines = ("cm5", "unet-atm", "meiko")
    plot = Plot(figsize=(9, 4))
    FigureCanvasAgg(plot)
    axes = plot.add_subplot()
    benchmarks = sorted({b for b, _ in fig5_times}, key=list(FIG5_SIZES).index)
    for column, machine in enumerate(machines):
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
    paths.append(out / "splitc_fig5.png")
    plot.savefig(paths[-1], dpi=100)
    plot = Plot(figsize=(9, 4))
    FigureCanvasAgg(plot)
    axes = plot.add_subplot()
    runs = sorted({b for b, _, _ in table1_times}, key=list(TABLE1).index)
    columns = [(network, n) for n in (2, 4, 8) for network in ("atm", "fe")]
    width = 0.8 / len(columns)
    for k, (network, n) in enumerate(columns):
        xs = [i + (k - len(columns) / 2 + 0.5) * width for i in range(len(runs))]
        base = [TABLE1[b]["atm", 2] for b in runs]
        total = [table1_times[b, network, n][0] / t for b, t in zip(runs, base, strict=True)]
        compute = [table1_times[b, network, n][1] / t for b, t in zip(runs, base, strict=True)]
        comm = [t - c for t, c in zip(total, compute, strict=True)]
        bars = axes.bar(xs, compute, width, label=f"{network.upper()} {n}")
        colour = bars.patches[0].get_facecolor()
        axes.bar(xs, comm, width, bottom=compute, color=colour, alpha=0.4, hatch="//")
        paper = [TABLE1[b][network, n] / t for b, t in zip(runs, base, strict=True)]
        axes.plot(xs, paper, "k_", markersize=12)
    axes.set_xticks(range(len(runs)), runs)
    axes.set_ylabel("time / paper's 2-node ATM time")
    axes.set_title("paper 003 Table 1 / Fig 7, simulated (bars) and paper (black marks)")
    axes.legend(ncol=3, fontsize="small")
    paths.append(out / "splitc_fig7.png")
    plot.savefig(paths[-1], dpi=100)
    return paths


def _sizes(sizes: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{b} {'x'.join(map(str, v))}" for b, v in sizes.items())


def run_experiment(full: bool = False) -> list[Figure]:
    """The figures of ``stacklib reproduce splitc``: a scaled configuration (about 17 s of
    wall time) or, with ``full``, paper 003 Table 1 at the paper's sizes (about 100 s)."""
    started = time.perf_counter()
    rtt, bandwidth = split_c_store()
    figures = [
        Figure("Table 3: Split-C round trip", 72.0, rtt, "us", "paper 000 Table 3", 0.20),
        Figure("Table 3: Split-C store bandwidth", 118.0, bandwidth, "Mbit/s",
               "paper 000 Table 3", 0.20),
    ]  # fmt: skip
    if full:
        _progress(
            "paper 003 Table 1 at the paper's sizes for mm16, ssortlg, rsortlg (mm128 and the "
            "small-message sorts: splitc.table1(...) on request); paper 000 Fig 5 at "
            f"{_sizes(FIG5_SIZES)} per rank"
        )
        results = table1(progress=_progress)
    else:
        _progress(
            f"scaled sizes (run_experiment(full=True) for the paper's): paper 003 Table 1 at "
            f"{_sizes(SCALED_TABLE1)} (orderings and Table 2's speedups only); paper 000 "
            f"Fig 5 at {_sizes(FIG5_FAST)} per rank"
        )
        results = table1(progress=_progress, sizes=SCALED_TABLE1)
    scale = "" if full else " (scaled)"
    if full:  # scaled times are not the paper's: only orderings and speedups carry over
        for (benchmark, network, n), (total, _) in results.items():
            paper = TABLE1[benchmark][network, n]
            calibrated = (benchmark, network, n) in CALIBRATED
            label = "calibrated" if calibrated else "predicted"
            figures.append(
                Figure(
                    f"Table 1: {benchmark} {network.upper()} {n} nodes ({label})",
                    paper,
                    total,
                    "s",
                    "paper 003 Table 1",
                    0.05 if calibrated else 0.20,
                )
            )
    for benchmark in DEFAULT_TABLE1:
        for n in (2, 4, 8):
            ahead = results[benchmark, "atm", n][0] < results[benchmark, "fe", n][0]
            figures.append(
                Figure(
                    f"Table 1: {benchmark} {n} nodes, ATM ahead of FE{scale}",
                    1.0,
                    float(ahead),
                    "",
                    "paper 003 §5.2",
                    0.0,
                )
            )
    for benchmark in DEFAULT_TABLE1:
        for column, network in enumerate(("atm", "fe")):
            t2, t8 = results[benchmark, network, 2][0], results[benchmark, network, 8][0]
            growth = 1.0 if benchmark.startswith("mm") else 4.0
            figures.append(
                Figure(
                    f"Table 2: {benchmark} {network.upper()} speedup 2 -> 8{scale}",
                    TABLE2[benchmark][column],
                    growth * t2 / t8,
                    "x",
                    "paper 003 Table 2 (N8/N2 x T2/T8)",
                    0.20,
                )
            )
    times = fig5(progress=_progress, sizes=FIG5_SIZES if full else FIG5_FAST)
    for claim, holds in _fig5_claims(times):
        figures.append(Figure(f"Fig 5: {claim}", 1.0, float(holds), "", "paper 000 §6", 0.0))
    _progress(f"simulated in {time.perf_counter() - started:.0f} s of wall time")
    return figures


register_experiment(
    Experiment(
        "splitc",
        "Split-C over UAM: paper 000 Table 3 and Fig 5, paper 003 Tables 1-2 (bulk programs)",
        run_experiment,
        default=True,
        run_full=functools.partial(run_experiment, full=True),
    )
)
