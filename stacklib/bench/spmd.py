"""The SPMD comparison a user would make: stacklib Split-C over shm against mpi4py, one run.

``stacklib bench spmd --ranks 2 4 8`` runs two programs on each number of ranks, both ways:

* ``sort``: the small-message radix sort's communication (paper 003 §5.1; all-to-all, two keys
  per message): stacklib's ``rsortsm-store`` (one-way Split-C stores) and the same algorithm in
  mpi4py (stacklib/bench/mpi/spmd.py: a nonblocking ``Isend`` per message);
* ``collectives``: rounds of a barrier then an all-reduce (stacklib.bench.splitc.collectives
  and ``Barrier``/``allreduce``).

The stacklib ranks are processes started by ``stacklib spawn`` over the shm transport (the
pure Python modules unless the environment selects the compiled ones); the mpi4py ranks are
started by ``mpirun`` on the system Python.  Every result is verified on both sides; the
times are the longest a rank spent from a barrier to a barrier, and the part that was not
local computation.  Without mpirun or mpi4py the mpi4py columns are empty and a note says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from stacklib.bench.result import Cell, Column, Result

__all__ = ["PROGRAMS", "SpmdTime", "bench_spmd", "run_stacklib"]

#: Comparison -> the stacklib rank benchmark (stacklib.bench.splitc.rank).
PROGRAMS = {"sort": "rsortsm-store", "collectives": "collectives"}

SpmdTime = tuple[bool, float, float]  #: (verified, seconds, of which computation)


def run_stacklib(benchmark: str, n: int, size: int, seed: int = 1) -> SpmdTime:
    """Run ``benchmark`` on ``n`` shm ranks through ``stacklib spawn``; rank 0's rows made
    into (all verified, the longest time, the mean computation)."""
    rank_args = [benchmark, f"--size={size}", f"--seed={seed}"]
    code = (
        "import sys; from stacklib.launch import spawn; "
        f"sys.exit(spawn({n}, 'stacklib.bench.splitc.rank', {rank_args!r}, transport='shm'))"
    )
    with tempfile.TemporaryFile("w+") as out:
        # spawn hands the ranks its stdout: a child whose stdout is this file keeps rank 0's
        # JSON line away from ours.
        done = subprocess.run([sys.executable, "-c", code], stdout=out, check=False)
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("[")]
    if not lines:
        raise RuntimeError(f"{benchmark} on {n} shm ranks exited {done.returncode}, no result")
    table = json.loads(lines[-1])
    return (
        all(bool(row[0]) for row in table),
        max(float(row[1]) for row in table),
        sum(float(row[2]) for row in table) / len(table),
    )


def bench_spmd(
    ranks: Sequence[int] = (2, 4, 8),
    keys: int = 1024,
    rounds: int = 100,
    seed: int = 1,
    programs: Sequence[str] = ("sort", "collectives"),
) -> Result:
    """Each program of ``programs`` on each of ``ranks``, stacklib then mpi4py; ``keys`` per
    rank for the sort, ``rounds`` of the collectives."""
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        raise ValueError(f"no SPMD program {unknown[0]!r} (known: {', '.join(PROGRAMS)})")
    if any(n < 2 for n in ranks):
        raise ValueError(f"the SPMD comparison needs at least 2 ranks, got {list(ranks)}")
    if keys < 2 or rounds < 1:
        raise ValueError(f"need keys >= 2 and rounds >= 1, got {keys} and {rounds}")
    from stacklib.bench.mpi import MpiUnavailable, find_mpi, run_script

    notes = [
        "time: the longest a rank spent from a barrier to a barrier; comm: that less the "
        "mean local computation; ratio: stacklib time over mpi4py time",
        "stacklib: stacklib spawn over shm; mpi4py: mpirun, Open MPI shared memory, unbound",
    ]
    try:
        setup = find_mpi()
    except MpiUnavailable as error:
        setup = None
        notes.append(f"mpi4py columns empty: {error}")
    rows: list[dict[str, Cell]] = []
    for n in ranks:
        for program in programs:
            size = keys if program == "sort" else rounds
            ok, total, compute = run_stacklib(PROGRAMS[program], n, size, seed)
            row: dict[str, Cell] = {
                "ranks": n,
                "program": program,
                "size": f"{keys} keys/rank" if program == "sort" else f"{rounds} rounds",
                "sl_ok": "yes" if ok else "NO",
                "sl_time": total * 1e3,
                "sl_comm": max(0.0, total - compute) * 1e3,
            }
            if setup is not None:
                only = "sort" if program == "sort" else "reduce"
                args = [f"--keys={keys}", f"--rounds={rounds}", f"--seed={seed}", f"--only={only}"]
                mpi_ok, mpi_total, mpi_compute = run_script("spmd", n, args, setup=setup)[only]
                row.update(
                    mpi_ok="yes" if mpi_ok else "NO",
                    mpi_time=mpi_total * 1e3,
                    mpi_comm=max(0.0, mpi_total - mpi_compute) * 1e3,
                    ratio=total / mpi_total if mpi_total > 0 else None,
                )
            rows.append(row)
    return Result(
        title="SPMD on one host: stacklib Split-C over shm vs mpi4py (one run)",
        columns=[
            Column("ranks", "ranks"),
            Column("program", "program"),
            Column("size", "size"),
            Column("sl_ok", "stacklib ok"),
            Column("sl_time", "stacklib time", "ms", 1),
            Column("sl_comm", "stacklib comm", "ms", 1),
            Column("mpi_ok", "mpi4py ok"),
            Column("mpi_time", "mpi4py time", "ms", 1),
            Column("mpi_comm", "mpi4py comm", "ms", 1),
            Column("ratio", "ratio", "", 1),
        ],
        rows=rows,
        facts={"keys": keys, "rounds": rounds, "seed": seed},
        notes=notes,
    )
