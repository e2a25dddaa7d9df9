"""Compile and run stacklib's MPI programs under SimGrid's SMPI on an exported platform.

The C sources ship with stacklib (``stacklib/bench/smpi/``): ``pingpong.c`` (the RTT/2 of the
LogP method, all sizes in one run) and ``alltoall.c`` (the all-to-all and barrier of
:mod:`stacklib.bench.alltoall`).  :func:`compile_program` builds one with ``smpicc``;
:func:`run` starts ``smpirun`` on a platform written by
:meth:`stacklib.bench.simgrid.SimGridExport.write`, whose ``<config>`` block carries the SMPI
options, adding only what a replay of stacklib's model needs (:data:`REPLAY_OPTIONS`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import attrs

__all__ = [
    "PROGRAMS",
    "REPLAY_OPTIONS",
    "SmpiError",
    "SmpiRun",
    "compile_program",
    "missing_tools",
    "replay_alltoall",
    "replay_pingpong",
    "run",
]

#: The MPI programs shipped in ``stacklib/bench/smpi/``.
PROGRAMS = ("pingpong", "alltoall")
#: ``smpirun`` options of a replay: stacklib's model has every host cost in Os and Or, so
#: SMPI must not add the measured run time of the C code between MPI calls, nor its 10 ns per
#: ``MPI_Wtime``; only warnings are logged.  ``-no-privatize``: the programs have no globals
#: (and privatization maps one copy of the binary per rank).
REPLAY_OPTIONS = (
    "--cfg=smpi/simulate-computation:no",
    "--cfg=smpi/wtime:0",
    "--log=root.thres:warning",
)


class SmpiError(RuntimeError):
    """``smpicc`` or ``smpirun`` failed (the message carries its output)."""


def missing_tools() -> str | None:
    """Why SMPI programs cannot run here (a tool missing), or None."""
    absent = [tool for tool in ("smpicc", "smpirun") if shutil.which(tool) is None]
    if absent:
        return f"{' and '.join(absent)} not found (SimGrid's SMPI; Debian: libsimgrid-dev)"
    return None


def compile_program(name: str, directory: str | Path) -> Path:
    """Build program ``name`` (one of :data:`PROGRAMS`) with ``smpicc`` into ``directory``."""
    if name not in PROGRAMS:
        raise ValueError(f"no SMPI program {name!r} (known: {', '.join(PROGRAMS)})")
    reason = missing_tools()
    if reason is not None:
        raise SmpiError(reason)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.c"
    source.write_text(resources.files("stacklib.bench").joinpath(f"smpi/{name}.c").read_text())
    binary = folder / name
    done = subprocess.run(
        ["smpicc", "-O2", str(source), "-o", str(binary)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 or not binary.exists():
        raise SmpiError(f"smpicc failed on {name}.c:\n{done.stdout}{done.stderr}")
    return binary


@attrs.frozen
class SmpiRun:
    """What one ``smpirun`` printed, and the wall-clock seconds it took."""

    stdout: str
    wall_seconds: float


def run(
    binary: Path,
    platform: Path,
    ranks: int,
    args: Sequence[str],
    *,
    timeout: float = 600.0,
    options: Sequence[str] = REPLAY_OPTIONS,
) -> SmpiRun:
    """``smpirun -np ranks -platform platform binary args options``; raises :class:`SmpiError`
    when it fails.  The platform must have at least ``ranks`` hosts (one rank each)."""
    command = [
        "smpirun",
        "-no-privatize",
        "-np",
        str(ranks),
        "-platform",
        str(platform),
        str(binary),
        *args,
        *options,
    ]
    start = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=binary.parent
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SmpiError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return SmpiRun(done.stdout, wall)


def _pairs(stdout: str) -> list[tuple[int, float]]:
    out = []
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) == 2:
            try:
                out.append((int(fields[0]), float(fields[1])))
            except ValueError:
                continue
    return out


def replay_pingpong(
    binary: Path, platform: Path, sizes: Sequence[int], iterations: int = 10
) -> dict[int, float]:
    """RTT/2 (seconds) per size of the ping-pong under SMPI, all sizes in one ``smpirun``."""
    done = run(binary, platform, 2, [str(iterations), *map(str, sizes)])
    found = dict(_pairs(done.stdout))
    missing = [s for s in sizes if s not in found]
    if missing:
        raise SmpiError(f"the ping-pong printed no time for sizes {missing}:\n{done.stdout}")
    return found


def replay_alltoall(
    binary: Path, platform: Path, nodes: int, size: int = 8, rounds: int = 1
) -> tuple[float, float]:
    """(simulated seconds until the last rank left the barrier, wall seconds) of the
    all-to-all on ``nodes`` ranks under SMPI."""
    done = run(binary, platform, nodes, [str(size), str(rounds)])
    found = dict(_pairs(done.stdout))
    if nodes not in found:
        raise SmpiError(f"the all-to-all printed no time:\n{done.stdout}")
    return found[nodes], done.wall_seconds
