"""One rank of a Split-C benchmark started by ``stacklib spawn`` (``python -m
stacklib.bench.splitc.rank BENCHMARK [--small] [--size N,N] [--seed S] [--rto-us T]``);
BENCHMARK is one of stacklib.bench.splitc.programs or ``collectives`` (a barrier/all-reduce
loop, stacklib.bench.splitc.collectives).

It bootstraps from the environment (stacklib.launch), opens UAM and Split-C over its endpoint,
runs the program and, on rank 0, prints one line of JSON: a row per rank, ``[ok, total,
compute, sent, retransmitted, timeouts, dropped]`` (seconds; UAM PDUs sent and resent, UAM
timer expiries, and arrivals the endpoint dropped).  The first three are the result; the
counters say what the protocol went through to get it.  ``--rto-us`` (or
``STACKLIB_SPLITC_RTO_US``, which ``stacklib splitc run`` passes through the environment) sets
UAM's retransmission timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import trio

from stacklib.bench.splitc.cluster import endpoint_config
from stacklib.bench.splitc.collectives import DEFAULT_ROUNDS, SMALL_ROUNDS, barrier_reduce
from stacklib.bench.splitc.programs import Program, make_program
from stacklib.errors import ChannelError, PeerUnreachable
from stacklib.launch import bootstrap, rank_from_environment
from stacklib.layers.splitc import open_splitc
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.services import UNetService

__all__ = ["RTO_US", "START_UP_S", "main", "rank_program", "run_rank", "uam_params"]

#: UAM's retransmission timeout for real ranks, microseconds.  UAM's default 4 ms is shorter
#: than a runnable process can wait for a core when ranks outnumber cores (8 CPU-bound ranks on
#: 2 cores): mm4x4 on 8 shm ranks then resends 3,000-3,900 of its 5,316 PDUs, against 640-670
#: with 20 ms, in the same time (best of 3: 1.26 s and 1.23 s).  Where the endpoint really
#: drops arrivals (udp with the launcher's default 16 receive buffers) the short timeout
#: recovers sooner (rsortlg, 64K keys, 4 udp ranks: 0.18 s against 0.30 s); with endpoints
#: sized for every peer's window (stacklib.bench.splitc.cluster.endpoint_config) nothing is
#: dropped and the two are equal (0.14 s and 0.15 s).  20 ms is also the simulated clusters'
#: timeout (SPLITC_UAM).
RTO_US = 20_000.0

#: Ranks start seconds apart (each imports numpy and trio, eight of them on two cores take
#: several seconds), and a message to a rank whose endpoint nobody reads yet is lost: keep
#: retransmitting for this long before reporting the peer unreachable.
START_UP_S = 60.0


#: How long a waiting rank polls before it yields to trio (UAM's ``hot_spin_us``), where its
#: NI spins at all: a collective's message follows some microseconds of the peer's own work,
#: and a wait that outlasts the NI's 20 us goes on at a pass of trio's loop per poll, which
#: makes the peer's next wait outlast its own (an all-reduce of one number between two
#: processes: median 171-218 us with 20 us, 38 us with 200).
HOT_SPIN_US = 200.0


def uam_params(rto_us: float = RTO_US) -> UamParams:
    """UAM for a real rank: timeout ``rto_us``, retries enough to outlast :data:`START_UP_S`,
    the hot spin :data:`HOT_SPIN_US`."""
    if rto_us <= 0:
        raise ValueError(f"rto_us must be positive, got {rto_us}")
    return UamParams(
        rto_us=rto_us,
        max_retries=max(8, round(START_UP_S * 1e6 / rto_us)),
        hot_spin_us=HOT_SPIN_US,
    )


def rank_program(benchmark: str, sizes: tuple[int, ...] | None, small: bool, seed: int) -> Program:
    """The program of ``benchmark``: a Split-C benchmark (:func:`make_program`) or
    ``collectives`` (:func:`barrier_reduce`, ``sizes`` = (rounds,))."""
    if benchmark == "collectives":
        rounds = sizes[0] if sizes else (SMALL_ROUNDS if small else DEFAULT_ROUNDS)
        return barrier_reduce(rounds, seed=seed)
    return make_program(benchmark, sizes, small=small, seed=seed)


def run_rank(
    benchmark: str,
    sizes: tuple[int, ...] | None,
    small: bool,
    seed: int,
    rto_us: float = RTO_US,
) -> int:
    """Run this process's rank of ``benchmark``; rank 0 prints the results as JSON."""
    params = uam_params(rto_us)
    # Long enough for UAM's delayed acknowledgments and one retransmission (as run_spmd).
    linger = (params.ack_delay_us + params.rto_us) * 1e-6
    rows: list[list[object]] = []
    # Room for a window from every peer at once, as on the simulated clusters.
    size = rank_from_environment(os.environ)[1]
    with bootstrap(config=endpoint_config(size - 1)) as rank:
        program = rank_program(benchmark, sizes, small, seed)

        async def main() -> None:
            async with (
                UamLayer(params).open(UNetService(rank.endpoint)) as am,
                open_splitc(am, rank.rank, rank.channels, linger=linger) as sc,
            ):
                result = await program(sc)
                uam = am.statistics()
                dropped = sum(rank.endpoint.statistics().dropped.values())
                mine: list[object] = [result.ok, result.total, result.compute]
                mine += [uam["sent"], uam["retransmitted"], uam["timeouts"], dropped]
                gathered = await sc.all_gather(mine)
                rows.extend(
                    [bool(r[0]), float(r[1]), float(r[2]), *map(int, r[3:])] for r in gathered
                )

        try:
            trio.run(main)
        except* (ChannelError, PeerUnreachable):
            # Every rank has every result once the gather is done; a peer that closed its
            # endpoint while this one still acknowledged a late retransmission is no failure.
            if not rows:
                raise
        if rank.rank == 0:
            print(json.dumps(rows), flush=True)
        return 0 if all(row[0] for row in rows) else 1


#: One BLAS thread per rank: a rank stands for one of the papers' single-CPU workstations, and
#: OpenBLAS's default of a thread per core makes ranks that share cores spin against each other
#: (mm4x4, 4 shm ranks on 2 cores: computation 0.49-0.60 s per rank with the default, 2 ms
#: with one thread; the whole run 1.6-1.8 s against 0.31-0.35 s).
BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _exec_with_one_blas_thread() -> None:
    """Start this rank again with :data:`BLAS_THREADS` unless they are set: OpenBLAS reads
    them when numpy loads it, which importing stacklib has done already."""
    if all(name in os.environ for name in BLAS_THREADS):
        return
    env = {**BLAS_THREADS, **os.environ}
    os.execve(
        sys.executable, [sys.executable, "-m", "stacklib.bench.splitc.rank", *sys.argv[1:]], env
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stacklib.bench.splitc.rank")
    parser.add_argument("benchmark")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--size", default="")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rto-us",
        type=float,
        default=float(os.environ.get("STACKLIB_SPLITC_RTO_US", RTO_US)),
        help=f"UAM retransmission timeout, microseconds (default {RTO_US:.0f})",
    )
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.size.split(",") if s) or None
    return run_rank(args.benchmark, sizes, args.small, args.seed, args.rto_us)


if __name__ == "__main__":
    _exec_with_one_blas_thread()
    sys.exit(main())
