"""mpi4py baselines: standalone scripts run by ``mpirun`` on the system Python, and their runner.

The scripts here (:data:`SCRIPTS`) do not import stacklib: mpi4py is a system package (Debian:
``apt-get install openmpi-bin python3-mpi4py``), usually not in stacklib's virtual environment.
:func:`find_mpi` finds ``mpirun`` and an interpreter that imports mpi4py (``STACKLIB_MPIRUN``
and ``STACKLIB_MPI_PYTHON`` override the search) or raises :class:`MpiUnavailable` saying which
is missing; :func:`run_script` runs a script on N ranks and returns the one JSON line rank 0
prints (:func:`parse_result`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from stacklib.errors import StacklibError

__all__ = [
    "SCRIPTS",
    "MpiRunError",
    "MpiSetup",
    "MpiUnavailable",
    "find_mpi",
    "mpi_command",
    "parse_result",
    "run_script",
    "script_path",
]

#: The scripts of this package: p2p (two ranks: ping-pong, rate, bulk), spmd (N ranks: the
#: small-message radix sort and a barrier/all-reduce loop).
SCRIPTS = ("p2p", "spmd")

_INSTALL = "Debian/Ubuntu: apt-get install openmpi-bin python3-mpi4py"


class MpiUnavailable(StacklibError):
    """mpirun or mpi4py cannot be found: the message says which, and how to install them."""


class MpiRunError(StacklibError):
    """An mpirun run failed or printed no result."""


@attrs.frozen
class MpiSetup:
    """The ``mpirun`` executable and the interpreter with mpi4py that it starts."""

    mpirun: str
    python: str


def find_mpi(env: Mapping[str, str] | None = None) -> MpiSetup:
    """``mpirun`` (``STACKLIB_MPIRUN``, else on ``PATH``) and a Python that imports mpi4py
    (``STACKLIB_MPI_PYTHON``, else /usr/bin/python3, else ``python3`` on ``PATH``); raises
    :class:`MpiUnavailable` naming what is missing."""
    env = os.environ if env is None else env
    path = env.get("PATH", os.defpath)
    mpirun = env.get("STACKLIB_MPIRUN") or shutil.which("mpirun", path=path)
    if not mpirun or not os.access(mpirun, os.X_OK):
        raise MpiUnavailable(f"no mpirun on PATH ({_INSTALL})")
    python = env.get("STACKLIB_MPI_PYTHON")
    if not python:
        system = "/usr/bin/python3"
        python = system if os.access(system, os.X_OK) else shutil.which("python3", path=path)
    if not python:
        raise MpiUnavailable(f"no python3 to run mpi4py with ({_INSTALL})")
    probe = subprocess.run(
        [python, "-c", "import mpi4py.MPI"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        raise MpiUnavailable(f"{python} cannot import mpi4py ({_INSTALL})")
    return MpiSetup(mpirun, python)


def script_path(name: str) -> Path:
    """The file of script ``name`` (one of :data:`SCRIPTS`)."""
    if name not in SCRIPTS:
        raise ValueError(f"no mpi4py script {name!r} (known: {', '.join(SCRIPTS)})")
    return Path(__file__).with_name(f"{name}.py")


def mpi_command(
    setup: MpiSetup,
    script: str,
    n: int,
    args: Sequence[str] = (),
    pinned: bool = False,
) -> list[str]:
    """The ``mpirun`` command line of ``n`` ranks of ``script``; ``pinned``: rank r bound to
    core r (``--map-by core --bind-to core``; ``--cpu-set`` would bind each rank to the whole
    set), else unbound."""
    if n < 1:
        raise ValueError(f"mpirun needs at least one rank, got {n}")
    command = [setup.mpirun]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += ["--oversubscribe", "-n", str(n)]
    if pinned:
        command += ["--map-by", "core", "--bind-to", "core"]
    else:
        command += ["--bind-to", "none"]
    return [*command, setup.python, str(script_path(script)), *args]


def parse_result(output: str) -> dict[str, Any]:
    """The last line of ``output`` that is a JSON object (rank 0's result)."""
    for line in reversed(output.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise MpiRunError(f"rank 0 printed malformed JSON: {error}") from None
            if isinstance(value, dict):
                return value
    raise MpiRunError("rank 0 printed no JSON result line")


def run_script(
    script: str,
    n: int,
    args: Sequence[str] = (),
    *,
    pinned: bool = False,
    setup: MpiSetup | None = None,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run ``script`` on ``n`` ranks through ``mpirun`` (``pinned``: see :func:`mpi_command`)
    and return rank 0's JSON result."""
    setup = setup or find_mpi()
    env = dict(os.environ)
    # Open MPI refuses root unless told twice (the option above, these for older versions).
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = mpi_command(setup, script, n, args, pinned)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise MpiRunError(f"mpirun {script} on {n} ranks ran over {timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MpiRunError(f"mpirun {script} on {n} ranks exited {done.returncode}: {last}")
    return parse_result(done.stdout)
