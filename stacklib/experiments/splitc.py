"""Split-C over UAM on the simulated machines: paper 000 Table 3's Split-C store row, paper 003
Tables 1-2, paper 000 Fig 5's stated comparisons.

``stacklib reproduce splitc`` runs, in virtual time, a scaled configuration by default
(:func:`run_experiment`; its sizes are printed with the results) and the paper's sizes with
``stacklib reproduce --full`` (``run_experiment(full=True)``).  Every run is an independent
deterministic simulation, so the runs go to a process pool (:func:`run_cells`: one process per
CPU, the longest expected first, a progress line per finished run, the same numbers as in one
process); ``stacklib splitc table1`` runs any part of Table 1 the same way.

* Table 3 (paper 000): the Split-C round trip (a blocking read: one request, one reply) and
  the bandwidth of 4 KB bulk stores, on two SPARCstation-20s with SBA-200s;
* Table 1 (paper 003) on 2, 4 and 8 nodes of the ATM and FE clusters.  Full: all 36 runs at
  the paper's sizes (512K keys per node; 8x8 blocks of 128x128, 16x16 blocks of 16x16), each
  time against the paper's; the 2-node times are calibrated
  (stacklib/transports/sim/machines.py), the rest are predictions (tolerance 20%); which
  cluster is ahead at each node count (paper 003 §5.2: ATM on the matrix multiplies and bulk
  sorts by bandwidth and the SPARC's floating point, FE on the small-message sorts by lower
  overhead); the wall time of the 36 runs against the 814.6 s the 1996 clusters took (their
  sum).  Scaled (:data:`SCALED_TABLE1`: mm 16x16, ssortlg, rsortlg): absolute times are not
  comparable, so only what carries over is checked: ATM ahead of FE at every node count, and
  the speedups of Table 2;
* Table 2 (paper 003): the speedup from 2 to 8 nodes, ``(N8 / N2) x T2 / T8`` where N is the
  problem size per run: the matrix is fixed, the sorts' keys grow with the nodes ("the number
  of keys per processor is kept constant", §5.2).  This definition gives every entry of the
  paper's Table 2 from its Table 1 to within 0.15;
* Fig 5 (paper 000): the seven programs on 8 nodes of the CM-5, the Meiko CS-2 and the U-Net
  ATM cluster at scaled sizes (smaller ones by default: :data:`FIG5_FAST`), and each
  comparison §6 states in words, checked (a yes/no figure, 1 = holds in ``--json``).

docs/splitc.md has the results and how each number was obtained.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing.context import BaseContext
from typing import Any

import attrs
import numpy as np
import trio

import stacklib
from stacklib import compiled
from stacklib.bench.splitc.cluster import run_spmd
from stacklib.bench.splitc.programs import PAPER_SIZES, make_program
from stacklib.experiments.pool import RunsProgress, init_worker, run_indexed
from stacklib.layers.splitc import SplitC
from stacklib.reporting import progress as progress_display
from stacklib.reporting.figures import Experiment, Figure, register_experiment
from stacklib.reporting.progress import is_interrupt
from stacklib.reporting.tables import wrap
from stacklib.transports.sim.machines import MACHINES

__all__ = [
    "CLUSTERS_SECONDS",
    "FIG5_FAST",
    "FIG5_SIZES",
    "SCALED_SUITE",
    "SCALED_TABLE1",
    "TABLE1",
    "TABLE2",
    "Cell",
    "CellResult",
    "cell_line",
    "engine_line",
    "expected_cost",
    "fig5",
    "fig5_cells",
    "prepare_engine",
    "run_cell",
    "run_cells",
    "run_experiment",
    "speedup",
    "split_c_store",
    "suite",
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
    "rsortsm-store": (4096,),
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
    "rsortsm-store": (1024,),
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
    # Wrapped like stacklib reproduce's tables, to be read in a terminal.
    progress_display.message("\n".join(wrap(f"splitc: {line}", indent="    ")))


#: The sum of paper 003 Table 1: the wall time the two 1996 clusters took to run the suite.
CLUSTERS_SECONDS = sum(sum(row.values()) for row in TABLE1.values())
#: Table 1 at scaled sizes for all six benchmarks (``stacklib splitc table1`` without
#: ``--full``): :data:`SCALED_TABLE1`, mm 128x128 as 8x8 blocks of 32x32, and 4K and 1K keys
#: per node for the small-message sorts (a 128th and a 512th of 512K).
SCALED_SUITE: dict[str, tuple[int, ...]] = {
    "mm128": (8, 32),
    "mm16": SCALED_TABLE1["mm16"],
    "ssortsm": (4 * 1024,),
    "ssortlg": SCALED_TABLE1["ssortlg"],
    "rsortsm": (1024,),
    "rsortlg": SCALED_TABLE1["rsortlg"],
}


@attrs.frozen
class Cell:
    """One simulated run: a benchmark on ``nodes`` nodes of a paper 003 cluster (``network``
    ``atm`` or ``fe``: a cell of Table 1) or of a machine (``cm5``, ``unet-atm``, ...: Fig 5),
    at ``sizes`` (None: the paper's)."""

    benchmark: str
    network: str
    nodes: int
    sizes: tuple[int, ...] | None = None

    @property
    def machine(self) -> str:
        return CLUSTERS.get(self.network, self.network)

    @property
    def paper_size(self) -> bool:
        """Whether this is a Table 1 cell at the paper's sizes, comparable with the paper."""
        if self.network not in CLUSTERS:
            return False
        return self.sizes is None or self.sizes == PAPER_SIZES[self.benchmark][1]

    @property
    def label(self) -> str:
        return f"{self.benchmark} {self.network.upper()} {self.nodes} nodes"


@attrs.frozen
class CellResult:
    """A finished :class:`Cell`: the slowest rank's total and the ranks' mean computation
    (simulated seconds), and the wall-clock seconds the simulation took."""

    cell: Cell
    total: float
    compute: float
    wall: float

    @property
    def paper(self) -> float:
        return TABLE1[self.cell.benchmark][self.cell.network, self.cell.nodes]


def run_cell(cell: Cell) -> CellResult:
    """Simulate one cell (a fresh simulation with seed 1: the same numbers in any process and
    in any order).  Module-level, so that a process pool can run it."""
    started = time.perf_counter()
    program = make_program(cell.benchmark, cell.sizes, machine=MACHINES[cell.machine])
    run = run_spmd(program, cell.nodes, cell.machine)
    if not all(r.ok for r in run.results):
        raise RuntimeError(f"{cell.label}: wrong result")
    total = max(r.total for r in run.results)
    compute = sum(r.compute for r in run.results) / cell.nodes
    return CellResult(cell, total, compute, time.perf_counter() - started)


#: The wall time of moving 1 KB in bulk against that of one small message (both through UAM,
#: the NI models and the fabric), measured at the paper's sizes: mm 128x128 on 2 FE nodes moves
#: 2 x 128 KB per block step and takes 107 ms per step, small-message stores take about 0.1 ms.
BULK_KB_COST = 4.0


def expected_cost(cell: Cell) -> float:
    """A rough estimate of a cell's wall time, in small UAM messages' worth (about 0.1 ms each
    when measured), to start the longest cells first.

    It counts the programs' traffic (stacklib/bench/splitc/programs.py): a small-message sort
    sends one store per two keys (the radix sort's four passes send some keys singly: 0.75
    stores per key, estimated); a bulk sort sends the keys that leave their node, charged per
    KB (:data:`BULK_KB_COST`), plus its numpy sorting (about one message's worth per 1000
    keys); the matrix multiply fetches two blocks per block step and meets at a barrier (some
    six messages).  A message costs more with more peers to serve, ``1 + nodes / 8`` (measured:
    ssortsm at 2K keys per node takes 1.6 times as long per store on 8 nodes as on 2).
    Connected components and conjugate gradient (Fig 5) are scaled to their wall times at
    :data:`FIG5_FAST` against the sorts'.  Against measured wall times (paper sizes, mm128 and
    ssortsm on 2 nodes, mm16, ssortlg, rsortlg on 2 to 8) it is within a factor of two.
    """
    sizes = cell.sizes or PAPER_SIZES[cell.benchmark][1]
    n = cell.nodes
    peers = 1 + n / 8
    remote = (n - 1) / n
    if cell.benchmark in ("cc", "cg"):
        rows, cols = sizes
        return rows * cols * n * (2.0 if cell.benchmark == "cc" else 0.125) * peers
    if cell.benchmark.startswith("mm"):
        blocks, block = sizes
        kb = block * block * 8 / 1024
        return float(blocks**3) * (6 * peers + 2 * kb * remote * BULK_KB_COST)
    keys = sizes[0] * n
    passes = 4 if cell.benchmark.startswith("rsort") else 1
    if cell.benchmark.endswith("sm"):
        return passes * keys * (0.75 if passes > 1 else 0.5) * peers
    return passes * keys * 4 / 1024 * remote * BULK_KB_COST + keys / 1000


def _minutes(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def cell_line(
    index: int, count: int, result: CellResult, elapsed: float, left: float | None
) -> str:
    """The progress line of a finished cell: ``[7/36] rsortsm FE 8 nodes: 90.12 s simulated
    (paper 90.50, -0.4%), 41.3 s wall; 5:12 elapsed, about 3:40 left``."""
    cell = result.cell
    if cell.paper_size:
        deviation = (result.total - result.paper) / result.paper
        versus = f"paper {result.paper:.2f}, {deviation:+.1%}"
    else:
        versus = f"scaled to {'x'.join(map(str, cell.sizes or ()))}"
    line = (
        f"[{index}/{count}] {cell.label}: {result.total:.2f} s simulated ({versus}), "
        f"{result.wall:.1f} s wall; {_minutes(elapsed)} elapsed"
    )
    if left is not None:
        line += f", about {_minutes(left)} left"
    return line


def expected_seconds(cell: Cell) -> float | None:
    """The virtual time a cell is expected to simulate: the paper's, for a Table 1 cell at
    the paper's sizes (the progress display counts a run under way done in proportion)."""
    return TABLE1[cell.benchmark][cell.network, cell.nodes] if cell.paper_size else None


class CellsInterrupted(progress_display.Interrupted):
    """Ctrl-C during :func:`run_cells`: ``finished`` (also ``partial``) holds the cells that
    were done, in the order they were given."""

    def __init__(self, finished: list[CellResult]) -> None:
        super().__init__(finished, f"{len(finished)} runs finished")
        self.finished = finished


def _context(compiled_copy: bool = False) -> BaseContext:
    """Fresh worker processes (never a fork of this one, whose trio and threads a fork would
    copy): from a fork server that has imported the simulator once, where there is one
    (about 0.1 s per pool after the first, against some 2 s for two spawned workers that each
    import it), else spawned.  Workers that run the compiled copy are always spawned: they
    must start with ``$STACKLIB_COMPILED`` set, which a fork server started earlier lacks."""
    if not compiled_copy and "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        return context
    return multiprocessing.get_context("spawn")


def _worker_environment(pure: bool) -> Mapping[str, str] | None:
    """What workers need to run the compiled copy (None: this process, or pure modules)."""
    return None if pure or stacklib.COMPILED else compiled.worker_environment()


def engine_line(pure: bool = False) -> str:
    """Which modules :func:`run_cells` will simulate with, for the user."""
    environment = _worker_environment(pure)
    if stacklib.COMPILED:
        return f"simulating with the compiled hot path in {stacklib.COMPILED}"
    if environment is not None:
        return (
            "simulating with the compiled hot path in "
            f"{environment[compiled.ENVIRONMENT]} (stacklib compile)"
        )
    return (
        "simulating with the pure Python modules (`stacklib compile`, with mypyc, makes "
        "the simulation several times faster)"
    )


def prepare_engine(pure: bool, progress: Callable[[str], None]) -> None:
    """Before a run at the papers' sizes: build the compiled copy (``stacklib compile``, about
    a minute) if mypyc is installed and no copy matches the sources, since on two cores only
    the compiled simulation beats the 1996 clusters' 814.6 s; say why not otherwise."""
    if pure or stacklib.COMPILED or compiled.available() is not None:
        return
    if not compiled.can_build():
        progress(
            "no compiled hot path: `pip install 'stacklib[fast]'` (mypyc) and it is built "
            "before a full run, several times faster; running the pure Python modules"
        )
        return
    progress(
        "compiling the simulator's hot path with mypyc first (stacklib compile), about a minute"
    )
    try:
        compiled.build()
    except RuntimeError as error:
        progress(f"stacklib compile failed, running the pure Python modules: {error}")


@contextlib.contextmanager
def _environment(extra: Mapping[str, str] | None) -> Iterator[None]:
    """``os.environ`` with ``extra`` while the block runs (spawned workers inherit it)."""
    saved = {name: os.environ.get(name) for name in extra or {}}
    os.environ.update(extra or {})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _workers(pool: ProcessPoolExecutor) -> list[Any]:
    """The pool's worker processes, to end them on Ctrl-C: a worker takes Ctrl-C in its cell
    as that cell's result and goes on to the cells already handed to it (the pool queues one
    more than it has workers), which ``cancel_futures`` cannot take back; each may take
    minutes.  There is no public way before Python 3.14's ``terminate_workers``."""
    return list((getattr(pool, "_processes", None) or {}).values())


def run_cells(
    cells: Sequence[Cell],
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    pure: bool = False,
) -> list[CellResult]:
    """Simulate ``cells`` (in the order given back) on ``jobs`` processes (None: one per
    CPU; 1: in this process), the longest expected first so that every process stays busy
    to the end.  ``progress`` gets a line per finished cell (:func:`cell_line`); the
    progress display of the command, if one is shown (stacklib.reporting.progress), also
    gets the runs under way and their virtual time (stacklib.experiments.pool).  ``clock`` times the
    progress lines only.  Ctrl-C raises :class:`CellsInterrupted` with the cells done.

    When ``stacklib compile`` has built a compiled copy of these sources
    (stacklib/compiled.py) and ``pure`` is False, every cell runs in a worker process that
    uses it (with ``jobs=1`` too): the same numbers, sooner."""
    if jobs is None:
        jobs = os.cpu_count() or 1
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    environment = _worker_environment(pure)
    display = RunsProgress(
        "runs",
        [cell.label for cell in cells],
        [expected_cost(cell) for cell in cells],
        [expected_seconds(cell) for cell in cells],
        progress,
        clock,
    )
    results: dict[int, CellResult] = {}
    order = sorted(range(len(cells)), key=lambda i: -expected_cost(cells[i]))

    def finished(i: int) -> None:
        display.finished(i, lambda *args: cell_line(args[0], args[1], results[i], *args[2:]))

    try:
        with display:
            if environment is None and (jobs == 1 or len(cells) <= 1):
                for i in order:
                    display.running(i)
                    results[i] = run_cell(cells[i])
                    display.running(None)
                    finished(i)
            else:
                workers = min(jobs, len(cells))
                context = _context(environment is not None)
                with (
                    _environment(environment),
                    ProcessPoolExecutor(
                        workers,
                        mp_context=context,
                        initializer=init_worker,
                        initargs=(display.shared(context),),
                    ) as pool,
                ):
                    futures = {pool.submit(run_indexed, i, run_cell, cells[i]): i for i in order}
                    try:
                        for future in as_completed(futures):
                            results[futures[future]] = future.result()
                            finished(futures[future])
                    except BaseException as error:
                        # A failed cell or an interrupt: do not start the cells still queued.
                        workers_now = _workers(pool)  # before shutdown forgets them
                        pool.shutdown(wait=False, cancel_futures=True)
                        if is_interrupt(error):
                            for worker in workers_now:
                                worker.terminate()
                        raise
    except BaseException as error:
        if is_interrupt(error):
            raise CellsInterrupted([results[i] for i in sorted(results)]) from None
        raise
    return [results[i] for i in range(len(cells))]


def suite(
    benchmarks: Sequence[str] = tuple(TABLE1),
    networks: Sequence[str] = tuple(CLUSTERS),
    nodes: Sequence[int] = (2, 4, 8),
    sizes: Mapping[str, tuple[int, ...]] | None = None,
) -> list[Cell]:
    """The cells of Table 1 for ``benchmarks`` x ``networks`` x ``nodes``, each at
    ``sizes[benchmark]`` or the paper's sizes; unknown names raise KeyError."""
    for benchmark in benchmarks:
        if benchmark not in TABLE1:
            raise KeyError(f"no Table 1 benchmark {benchmark!r} (known: {', '.join(TABLE1)})")
    for network in networks:
        if network not in CLUSTERS:
            raise KeyError(f"no Table 1 network {network!r} (known: {', '.join(CLUSTERS)})")
    for n in nodes:
        if ("atm", n) not in TABLE1["mm16"]:
            raise KeyError(f"Table 1 has no column for {n} nodes (known: 2, 4, 8)")
    return [
        Cell(benchmark, network, n, (sizes or {}).get(benchmark))
        for benchmark in benchmarks
        for network in networks
        for n in nodes
    ]


def table1(
    benchmarks: Sequence[str] = DEFAULT_TABLE1,
    nodes: Sequence[int] = (2, 4, 8),
    progress: Callable[[str], None] | None = None,
    sizes: Mapping[str, tuple[int, ...]] | None = None,
    *,
    jobs: int | None = None,
) -> dict[tuple[str, str, int], tuple[float, float]]:
    """Simulated paper 003 Table 1 entries at the paper's sizes (or ``sizes[benchmark]``):
    (benchmark, network, nodes) -> (total, computation) seconds (the slowest rank's total,
    the ranks' mean computation).  The runs go to ``jobs`` processes (:func:`run_cells`;
    None: one per CPU, 1: this process; the numbers are the same); ``progress`` gets a line
    per run."""
    cells = suite(benchmarks, tuple(CLUSTERS), nodes, sizes)
    return {
        (r.cell.benchmark, r.cell.network, r.cell.nodes): (r.total, r.compute)
        for r in run_cells(cells, jobs, progress)
    }


FIG5_MACHINES = ("cm5", "meiko", "unet-atm")


def fig5_cells(nodes: int = 8, sizes: Mapping[str, tuple[int, ...]] = FIG5_SIZES) -> list[Cell]:
    """The runs of paper 000 Fig 5: every program on each machine."""
    return [Cell(b, name, nodes, sizes[b]) for b in FIG5_SIZES for name in FIG5_MACHINES]


def fig5(
    nodes: int = 8,
    progress: Callable[[str], None] | None = None,
    sizes: Mapping[str, tuple[int, ...]] = FIG5_SIZES,
    *,
    jobs: int | None = None,
) -> dict[tuple[str, str], tuple[float, float]]:
    """Paper 000 Fig 5 at ``sizes`` (:data:`FIG5_SIZES`, or :data:`FIG5_FAST`):
    (benchmark, machine) -> (total, computation), on ``jobs`` processes like
    :func:`run_cells`."""
    results = run_cells(fig5_cells(nodes, sizes), jobs, progress)
    return {(r.cell.benchmark, r.cell.network): (r.total, r.compute) for r in results}


def _fig5_claims(times: dict[tuple[str, str], tuple[float, float]]) -> list[tuple[str, bool]]:
    """Each comparison paper 000 §6 states about Fig 5, evaluated on ``times``."""

    def t(benchmark: str, machine: str) -> float:
        return times[benchmark, machine][0]

    def c(benchmark: str, machine: str) -> float:
        return times[benchmark, machine][1]

    def close(a: float, b: float) -> bool:
        return abs(a - b) / max(a, b) <= 0.25

    rs = "rsortsm-store"  # paper 000's small-message radix sort: one-way stores (docs/splitc.md)
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
        ("rsortsm: ATM slower than the CM-5", t(rs, "unet-atm") > t(rs, "cm5")),
        ("cc: ATM slower than the CM-5", t("cc", "unet-atm") > t("cc", "cm5")),
        ("rsortlg: ATM faster than the CM-5", t("rsortlg", "unet-atm") < t("rsortlg", "cm5")),
        ("rsortsm: ATM roughly equal to the Meiko", close(
            t(rs, "meiko"), t(rs, "unet-atm"))),
    ]  # fmt: skip


def _sizes(sizes: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{b} {'x'.join(map(str, v))}" for b, v in sizes.items())


def speedup(benchmark: str, t2: float, t8: float) -> float:
    """Paper 003 Table 2's speedup from 2 to 8 nodes, ``(N8 / N2) x T2 / T8``: the matrix is
    the same on every node count, the sorts' keys per node are."""
    growth = 1.0 if benchmark.startswith("mm") else 4.0
    return growth * t2 / t8


#: Where paper 003 §5.2 has ATM ahead of FE (matrix multiply and bulk sorts: bandwidth and
#: floating point) and where FE is ahead (small-message sorts: lower overhead).
ATM_AHEAD = ("mm128", "mm16", "ssortlg", "rsortlg")


def run_experiment(full: bool = False, jobs: int | None = None) -> list[Figure]:
    """The figures of ``stacklib reproduce splitc``: a scaled configuration (about 15 s of
    wall time) or, with ``full``, all 36 runs of paper 003 Table 1 at the paper's sizes on
    ``jobs`` processes (None: one per CPU; mm 128x128 and the small-message sorts take minutes
    each)."""
    started = time.perf_counter()
    workers = jobs or os.cpu_count() or 1
    rtt, bandwidth = split_c_store()
    figures = [
        Figure("Table 3: Split-C round trip", 72.0, rtt, "us", "paper 000 Table 3", 0.20),
        Figure("Table 3: Split-C store bandwidth", 118.0, bandwidth, "Mbit/s",
               "paper 000 Table 3", 0.20),
    ]  # fmt: skip
    benchmarks: Sequence[str] = tuple(TABLE1) if full else DEFAULT_TABLE1
    if full:
        _progress(
            f"paper 003 Table 1: all {len(benchmarks) * 6} runs at the paper's sizes on "
            f"{workers} processes, longest expected first (the 1996 clusters took "
            f"{CLUSTERS_SECONDS:.1f} s); paper 000 Fig 5 at {_sizes(FIG5_SIZES)} per rank"
        )
        prepare_engine(False, _progress)
        _progress(engine_line())
        suite_started = time.perf_counter()
        runs = run_cells(suite(benchmarks), jobs, _progress)
        _progress(
            f"paper 003 Table 1: {len(runs)} runs at the paper's sizes in "
            f"{time.perf_counter() - suite_started:.0f} s of wall time on {workers} processes; "
            f"the 1996 clusters took {CLUSTERS_SECONDS:.1f} s"
        )
        runs += run_cells(fig5_cells(sizes=FIG5_SIZES), jobs, _progress)
    else:
        _progress(
            f"scaled sizes (stacklib reproduce --full for the paper's): paper 003 Table 1 at "
            f"{_sizes(SCALED_TABLE1)} (orderings and Table 2's speedups only); paper 000 "
            f"Fig 5 at {_sizes(FIG5_FAST)} per rank; on {workers} processes"
        )
        # One pool for Table 1 and Fig 5, longest first, so both cores stay busy to the end.
        cells = suite(benchmarks, sizes=SCALED_TABLE1) + fig5_cells(sizes=FIG5_FAST)
        runs = run_cells(cells, jobs, _progress)
    results = {
        (r.cell.benchmark, r.cell.network, r.cell.nodes): (r.total, r.compute)
        for r in runs
        if r.cell.network in CLUSTERS
    }
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
    for benchmark in benchmarks:
        for n in (2, 4, 8):
            atm, fe = results[benchmark, "atm", n][0], results[benchmark, "fe", n][0]
            order, ahead = ("ATM", "FE"), atm < fe
            if benchmark not in ATM_AHEAD:
                order, ahead = ("FE", "ATM"), fe < atm
            name = f"Table 1: {benchmark} {n} nodes, {order[0]} ahead of {order[1]}{scale}"
            figures.append(Figure.claim(name, ahead, "paper 003 §5.2", unit=""))
    for benchmark in benchmarks:
        for column, network in enumerate(("atm", "fe")):
            t2, t8 = results[benchmark, network, 2][0], results[benchmark, network, 8][0]
            figures.append(
                Figure(
                    f"Table 2: {benchmark} {network.upper()} speedup 2 -> 8{scale}",
                    TABLE2[benchmark][column],
                    speedup(benchmark, t2, t8),
                    "x",
                    "paper 003 Table 2 (N8/N2 x T2/T8)",
                    0.20,
                )
            )
    times = {
        (r.cell.benchmark, r.cell.network): (r.total, r.compute)
        for r in runs
        if r.cell.network not in CLUSTERS
    }
    for claim, holds in _fig5_claims(times):
        figures.append(Figure.claim(f"Fig 5: {claim}", holds, "paper 000 §6", unit=""))
    _progress(f"simulated in {time.perf_counter() - started:.0f} s of wall time")
    return figures


register_experiment(
    Experiment(
        "splitc",
        "Split-C over UAM: paper 000 Table 3 and Fig 5, paper 003 Tables 1-2 (bulk programs; "
        "all six with --full)",
        run_experiment,
        default=True,
        run_full=functools.partial(run_experiment, full=True),
        # Wall time on the 2-core machine: the default run measured once (--json wall_seconds);
        # --full as docs/splitc.md measured it, with the compiled hot path (pure Python: 2.6x).
        seconds=51.0,
        seconds_full=480.0,
    )
)
