"""One rank of a Split-C benchmark started by ``stacklib spawn`` (``python -m
stacklib.bench.splitc.rank BENCHMARK [--small] [--size N,N] [--seed S]``).

It bootstraps from the environment (stacklib.launch), opens UAM and Split-C over its endpoint,
runs the program and, on rank 0, prints one line of JSON with every rank's result.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import trio

from stacklib.bench.splitc.programs import RankResult, make_program
from stacklib.launch import bootstrap
from stacklib.layers.splitc import open_splitc
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.services import UNetService

__all__ = ["main", "run_rank"]

#: Ranks start seconds apart (each imports numpy and trio), and a message to a rank whose
#: endpoint nobody reads yet is lost: retransmit for up to 20 s (5000 x 4 ms) before giving up.
START_UP = UamParams(max_retries=5000)


def run_rank(benchmark: str, sizes: tuple[int, ...] | None, small: bool, seed: int) -> int:
    """Run this process's rank of ``benchmark``; rank 0 prints the results as JSON."""
    with bootstrap() as rank:
        program = make_program(benchmark, sizes, small=small, seed=seed)

        async def main() -> list[RankResult]:
            async with (
                UamLayer(START_UP).open(UNetService(rank.endpoint)) as am,
                open_splitc(am, rank.rank, rank.channels) as sc,
            ):
                result = await program(sc)
                rows = await sc.all_gather([result.ok, result.total, result.compute])
                return [RankResult(bool(r[0]), float(r[1]), float(r[2])) for r in rows]

        results = trio.run(main)
        if rank.rank == 0:
            print(json.dumps([[r.ok, r.total, r.compute] for r in results]), flush=True)
        return 0 if all(r.ok for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stacklib.bench.splitc.rank")
    parser.add_argument("benchmark")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--size", default="")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.size.split(",") if s) or None
    return run_rank(args.benchmark, sizes, args.small, args.seed)


if __name__ == "__main__":
    sys.exit(main())
