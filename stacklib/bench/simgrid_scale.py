"""``stacklib bench simgrid``: the scale path from stacklib's simulator to SimGrid.

One library's LogP (:func:`stacklib.experiments.myrinet.logp_of`, paper 004's method on the
simulated LANai 4.1 platform) is exported to SimGrid (:func:`stacklib.bench.simgrid.export_logp`)
with as many hosts as the largest run needs.  Two checks and the scale runs follow:

* the ping-pong replayed under SMPI against the measured RTT/2 at every LogP size;
* the all-to-all and barrier of :mod:`stacklib.bench.alltoall` on each node count under SMPI,
  and on stacklib's own simulated cluster up to ``stacklib_up_to`` nodes, with the deviation
  of SimGrid's simulated time from stacklib's and the wall time of both.
"""

from __future__ import annotations

import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

from stacklib.bench import smpirun
from stacklib.bench.alltoall import alltoall
from stacklib.bench.result import Cell, Column, Result
from stacklib.bench.simgrid import export_logp

__all__ = ["bench_simgrid"]


def bench_simgrid(
    library: str = "fm",
    nodes: Sequence[int] = (8, 64, 256, 1024),
    *,
    size: int = 8,
    stacklib_up_to: int = 64,
    directory: str | Path | None = None,
) -> Result:
    """Run the checks and the all-to-all on ``nodes``; ``directory`` keeps the exported files
    and the compiled programs (a temporary directory otherwise)."""
    from stacklib.experiments.myrinet import logp_of

    if not nodes or min(nodes) < 2:
        raise ValueError(f"node counts must be >= 2, not {list(nodes)}")
    if size < 2:
        raise ValueError(f"a message carries a 1-byte kind: size must be >= 2, not {size}")
    reason = smpirun.missing_tools()
    if reason is not None:
        raise smpirun.SmpiError(reason)
    with tempfile.TemporaryDirectory(prefix="stacklib-simgrid-") as scratch:
        folder = Path(directory) if directory is not None else Path(scratch)
        export = export_logp(logp_of(library), hosts=max(nodes))
        platform_file, _ = export.write(folder / library)
        pingpong = smpirun.compile_program("pingpong", folder)
        program = smpirun.compile_program("alltoall", folder)
        replayed = smpirun.replay_pingpong(pingpong, platform_file, sorted(export.rtt_half))
        worst = max(abs(replayed[s] / export.rtt_half[s] - 1.0) for s in export.rtt_half)
        rows: list[dict[str, Cell]] = []
        for count in nodes:
            simulated, wall = smpirun.replay_alltoall(program, platform_file, count, size)
            row: dict[str, Cell] = {
                "nodes": count,
                "simgrid_us": simulated * 1e6,
                "simgrid_wall_s": wall,
            }
            if count <= stacklib_up_to:
                own = alltoall(library, count, size)
                row["stacklib_us"] = own.seconds * 1e6
                row["stacklib_wall_s"] = own.wall_seconds
                row["deviation"] = simulated / own.seconds - 1.0 if own.complete else None
            rows.append(row)
    return Result(
        title=f"All-to-all of {size}-byte messages and a barrier: SimGrid (SMPI) on the export "
        f"of {library}'s LogP vs stacklib's simulation",
        columns=[
            Column("nodes", "nodes"),
            Column("simgrid_us", "SimGrid", "us", 1),
            Column("stacklib_us", "stacklib", "us", 1),
            Column("deviation", "deviation", "", 3),
            Column("simgrid_wall_s", "SimGrid wall", "s", 2),
            Column("stacklib_wall_s", "stacklib wall", "s", 2),
        ],
        rows=rows,
        facts={
            "library": library,
            "pingpong_sizes": ",".join(map(str, sorted(export.rtt_half))),
            "pingpong_max_deviation": worst,
            "gaps_in_overheads_us": ",".join(f"{s}:{v * 1e6:.3f}" for s, v in export.gaps.items())
            or "none",
            "folded_into_overheads_us": ",".join(
                f"{s}:{v * 1e6:.3f}" for s, v in export.folded.items()
            )
            or "none",
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        },
        notes=[
            "deviation = SimGrid / stacklib - 1 (empty where stacklib did not run, or lost "
            "messages); wall = seconds of the simulation itself",
        ],
    )
