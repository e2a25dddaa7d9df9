"""``stacklib`` subcommands for Split-C over UAM (paper 000 §6, paper 003 §5).

    stacklib splitc list                                the benchmarks, machines and transports
    stacklib splitc run BENCHMARK -n N --transport T    run one benchmark, verified and timed
    stacklib splitc table1 [--full] [--jobs N] ...      paper 003 Tables 1-2 on every core

``--transport`` is ``memory`` (one process, real time), a simulated cluster (``sim-atm``,
``sim-fe``, virtual time) or machine (``unet-atm``, ``atm-003``, ``fe-003``, ``cm5``,
``meiko``: computation charged from the machine's costs), or ``shm``/``udp``: N real
processes started like ``stacklib spawn``, which run the compiled hot path of ``stacklib
compile`` where there is a copy (``--pure``: never).  ``--transport udp --netns`` puts each
rank in its own network namespace, the namespaces joined by a bridge (needs CAP_NET_ADMIN;
everything is deleted afterwards); ``--transport xdp --netns`` runs the same ranks over
AF_XDP on their namespace's interface (root; xdp has one node per interface, so on one host
it needs ``--netns``).  ``table1`` simulates the runs of paper 003 Table 1 in a
process pool (stacklib.experiments.splitc.run_cells), at scaled sizes unless ``--full``, and
compares the total wall time with the 814 s the 1996 clusters took.  docs/splitc.md describes
the programs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stacklib.commands._common import seconds_type, sizes_type

if TYPE_CHECKING:
    from stacklib.experiments.splitc import CellResult

REAL = ("shm", "udp", "xdp")


def _print(benchmark: str, transport: str, n: int, rows: list[tuple[bool, float, float]]) -> int:
    ok = all(row[0] for row in rows)
    total = max(row[1] for row in rows)
    compute = sum(row[2] for row in rows) / len(rows)
    clock = "wall" if transport.split()[0] in ("memory", *REAL) else "virtual"
    print(
        f"{benchmark} on {n} ranks over {transport}: {'verified' if ok else 'WRONG RESULT'}; "
        f"{total:.6f} s ({clock}), computation {compute:.6f} s, "
        f"communication {max(0.0, total - compute):.6f} s (mean over ranks)"
    )
    return 0 if ok else 1


def _counters(table: list[list[Any]]) -> int:
    """Print what UAM went through (the rank's JSON rows carry [sent, retransmitted, timeouts,
    dropped] after the result, stacklib.bench.splitc.rank); returns 0."""
    if all(len(row) >= 7 for row in table):
        sent, resent, timeouts, dropped = (sum(int(row[i]) for row in table) for i in range(3, 7))
        print(
            f"(UAM: {sent} PDUs sent, {resent} retransmitted after {timeouts} timeouts; "
            f"{dropped} arrivals dropped by the endpoints)"
        )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from stacklib.bench.splitc.cluster import run_spmd
    from stacklib.bench.splitc.programs import make_program
    from stacklib.transports.sim.machines import MACHINES

    if args.transport in REAL:
        return _run_real(args)
    machine = MACHINES.get(args.transport)
    program = make_program(
        args.benchmark, args.size, machine=machine, small=args.small, seed=args.seed
    )
    started = time.perf_counter()
    run = run_spmd(program, args.n, args.transport, seed=args.seed)
    rows = [(r.ok, r.total, r.compute) for r in run.results]
    status = _print(args.benchmark, args.transport, args.n, rows)
    print(f"(simulated in {time.perf_counter() - started:.2f} s of wall time)")
    return status


def rank_environment(pure: bool) -> dict[str, str]:
    """The real ranks' environment: this process's, with the compiled hot path (``stacklib
    compile``) where a copy of these sources exists, unless ``pure``; says which on stderr."""
    from stacklib import compiled

    env = dict(os.environ)
    extra = None if pure else compiled.worker_environment()
    if extra:
        env.update(extra)
        where = extra[compiled.ENVIRONMENT]
        print(f"ranks run the compiled hot path in {where} (stacklib compile)", file=sys.stderr)
    else:
        env[compiled.ENVIRONMENT] = "0"
        hint = "" if pure else " (`stacklib compile` makes a blocking write faster)"
        print(f"ranks run the pure Python modules{hint}", file=sys.stderr)
    return env


def _run_real(args: argparse.Namespace) -> int:
    from stacklib.launch import spawn

    if args.netns and args.transport == "shm":
        print("stacklib splitc: --netns applies to udp and xdp, not shm", file=sys.stderr)
        return 2
    if args.transport == "xdp" and not args.netns:
        print(
            "stacklib splitc: xdp has one node per interface: on one host the ranks need a "
            "namespace each (--netns)",
            file=sys.stderr,
        )
        return 2
    environment = rank_environment(args.pure)
    rank_args = [args.benchmark, f"--seed={args.seed}"]
    if args.small:
        rank_args.append("--small")
    if args.size:
        rank_args.append("--size=" + ",".join(str(s) for s in args.size))
    if args.netns:
        return _run_netns(args, rank_args, environment)
    with tempfile.TemporaryFile("w+") as out:
        # Rank 0 prints its JSON line; spawn passes the ranks our stdout, so capture it by
        # running spawn in a child whose stdout is the file.
        command = [
            sys.executable,
            "-c",
            "import sys; from stacklib.launch import spawn; "
            f"sys.exit(spawn({args.n}, 'stacklib.bench.splitc.rank', {rank_args!r}, "
            f"transport={args.transport!r}))",
        ]
        status = subprocess.run(command, stdout=out, env=environment, check=False).returncode
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("[")]
    del spawn  # imported to fail early if the launcher is unavailable
    if not lines:
        print(f"stacklib splitc: the ranks exited with status {status}", file=sys.stderr)
        return status or 1
    table = json.loads(lines[-1])
    rows = [(bool(r[0]), float(r[1]), float(r[2])) for r in table]
    return _print(args.benchmark, args.transport, args.n, rows) or _counters(table) or status


#: Prefix of the namespaces ``--netns`` makes (stacklib.netns.remove_stale cleans up after a
#: killed run).
NETNS_PREFIX = "slsplitc"


def _run_netns(args: argparse.Namespace, rank_args: list[str], environment: dict[str, str]) -> int:
    """Run the ranks over udp or xdp, each in its own network namespace; namespaces,
    rendezvous directory and ranks are gone when this returns, also on failure."""
    from stacklib.netns import (
        RANK_INTERFACE,
        NetnsError,
        bridged_namespaces,
        capability_problem,
        netns_argv,
    )

    problem = capability_problem()
    if problem is not None:
        print(f"stacklib splitc: --netns needs network namespaces: {problem}", file=sys.stderr)
        return 2
    if not 1 <= args.n <= 250:
        print(f"stacklib splitc: --netns takes 1..250 ranks, not {args.n}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        rendezvous = tempfile.mkdtemp(prefix="stacklib-splitc-", dir=base)
        stack.callback(shutil.rmtree, rendezvous, True)
        try:
            spaces, addresses = bridged_namespaces(stack, args.n, NETNS_PREFIX)
        except NetnsError as exc:
            print(f"stacklib splitc: {exc}", file=sys.stderr)
            return 2
        out = stack.enter_context(tempfile.TemporaryFile("w+"))
        ranks: list[subprocess.Popen[bytes]] = []
        # Registered after the namespaces, so the ranks are stopped before those are deleted.
        stack.callback(_stop_all, ranks)
        for rank in range(args.n):
            env = dict(
                environment,
                STACKLIB_RANK=str(rank),
                STACKLIB_SIZE=str(args.n),
                STACKLIB_RENDEZVOUS=rendezvous,
                STACKLIB_TRANSPORT=args.transport,
                STACKLIB_HOST=addresses[rank],
                STACKLIB_INTERFACE=RANK_INTERFACE,
            )
            command = [sys.executable, "-m", "stacklib.bench.splitc.rank", *rank_args]
            ranks.append(
                subprocess.Popen(
                    netns_argv(spaces[rank], *command),
                    env=env,
                    stdout=out if rank == 0 else subprocess.DEVNULL,
                )
            )
        status = _wait_all(ranks, args.timeout)
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("[")]
    if not lines:
        print(f"stacklib splitc: the ranks exited with status {status}", file=sys.stderr)
        return status or 1
    table = json.loads(lines[-1])
    rows = [(bool(r[0]), float(r[1]), float(r[2])) for r in table]
    label = f"{args.transport} (netns)"
    return _print(args.benchmark, label, args.n, rows) or _counters(table) or status


def _wait_all(ranks: list[subprocess.Popen[bytes]], timeout: float) -> int:
    """Wait for every rank; the first nonzero status (the others are then stopped) or 0."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = [rank.poll() for rank in ranks]
        for number, status in enumerate(statuses):
            if status:
                print(
                    f"stacklib splitc: rank {number} exited with status {status}; "
                    "stopping the others",
                    file=sys.stderr,
                )
                return status if status > 0 else 128 - status
        if all(status == 0 for status in statuses):
            return 0
        time.sleep(0.02)
    print(f"stacklib splitc: the ranks did not finish within {timeout:.0f} s", file=sys.stderr)
    return 1


def _stop_all(ranks: list[subprocess.Popen[bytes]]) -> None:
    for rank in ranks:
        if rank.poll() is None:
            rank.terminate()
    for rank in ranks:
        try:
            rank.wait(2.0)
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.wait()


def _size_override(text: str) -> tuple[str, tuple[int, ...]]:
    """``--size BENCH=N,N``: one benchmark's size arguments."""
    benchmark, sep, rest = text.partition("=")
    if not sep or not benchmark:
        raise argparse.ArgumentTypeError(f"expected BENCH=N,N (e.g. mm16=8,16), not {text!r}")
    return benchmark, sizes_type("mm16=8,16")(rest)


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, not {text!r}")
    return names


def _table(headings: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headings)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headings, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def cmd_table1(args: argparse.Namespace) -> int:
    from stacklib.bench.splitc.programs import SMALL_SIZES
    from stacklib.experiments import splitc as experiment
    from stacklib.reporting import progress

    if args.small:
        sizes = {b: SMALL_SIZES[b][1] for b in experiment.TABLE1}
        scale = "test sizes (--small)"
    elif args.full:
        sizes = {}
        scale = "the paper's sizes"
    else:
        sizes = dict(experiment.SCALED_SUITE)
        scale = "scaled sizes (--full for the paper's)"
    for benchmark, override in args.size:
        if benchmark not in experiment.TABLE1:
            known = ", ".join(experiment.TABLE1)
            raise KeyError(f"--size: no Table 1 benchmark {benchmark!r} (known: {known})")
        sizes[benchmark] = override
    benchmarks = args.only or tuple(experiment.TABLE1)
    cells = experiment.suite(benchmarks, args.network, args.nodes, sizes)
    jobs = args.jobs if args.jobs is not None else os.cpu_count() or 1
    if jobs < 1:
        print(f"stacklib splitc: --jobs must be at least 1, not {args.jobs}", file=sys.stderr)
        return 2
    processes = min(jobs, len(cells))
    say = progress.message
    say(
        f"stacklib splitc table1: {len(cells)} runs of paper 003 Table 1 at {scale} on "
        f"{processes} process{'es' if processes > 1 else ''}, longest expected first"
    )
    interrupted = False
    with progress.shown("splitc table1", quiet=args.quiet):
        if args.full:
            experiment.prepare_engine(args.pure, say)
        say(experiment.engine_line(args.pure))
        started = time.perf_counter()
        try:
            results = experiment.run_cells(cells, jobs, say, pure=args.pure)
        except experiment.CellsInterrupted as stop:
            # Ctrl-C: the tables of the runs that finished, then the shell's status for it.
            results, interrupted = stop.finished, True
        except RuntimeError as error:
            print(f"stacklib splitc: {error}", file=sys.stderr)
            return 1
    wall = time.perf_counter() - started
    paper_total = sum(r.paper for r in results)
    if interrupted:
        print(
            f"stacklib splitc table1: interrupted; {len(results)} of {len(cells)} runs finished"
            + (" (their tables follow)" if results and not args.json else ""),
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(_table1_json(results, wall, processes, paper_total), indent=2))
        return 130 if interrupted else 0
    if not results:
        return 130
    rows: list[tuple[str, ...]] = []
    for r in results:
        cell = r.cell
        deviation = f"{(r.total - r.paper) / r.paper:+.1%}" if cell.paper_size else "scaled"
        rows.append(
            (
                cell.benchmark,
                cell.network.upper(),
                str(cell.nodes),
                "paper" if cell.paper_size else "x".join(map(str, cell.sizes or ())),
                f"{r.paper:.2f}",
                f"{r.total:.4g}",
                deviation,
                f"{r.compute:.4g}",
                f"{max(0.0, r.total - r.compute):.4g}",
                f"{r.wall:.2f}",
            )
        )
    headings = ("benchmark", "network", "nodes", "sizes", "paper s", "measured s",
                "deviation", "computation s", "communication s", "wall s")  # fmt: skip
    print("paper 003 Table 1, simulated (computation: mean over ranks)")
    print(_table(headings, rows))
    speedups = _speedups(results)
    if speedups:
        print()
        scaled = "" if all(r.cell.paper_size for r in results) else " (scaled sizes)"
        print(f"paper 003 Table 2: speedup from 2 to 8 nodes, (N8/N2) x T2/T8{scaled}")
        rows2: list[tuple[str, ...]] = [
            (b, network.upper(), f"{paper:.1f}", f"{measured:.2f}",
             f"{(measured - paper) / paper:+.1%}")
            for b, network, paper, measured in speedups
        ]  # fmt: skip
        print(_table(("benchmark", "network", "paper", "measured", "deviation"), rows2))
    print()
    whole = experiment.CLUSTERS_SECONDS
    these = "" if len(results) == 36 else f" ({paper_total:.0f} s for these {len(results)} runs)"
    print(
        f"{len(results)} runs in {wall:.1f} s of wall time on {processes} "
        f"process{'es' if processes > 1 else ''} (the runs' own wall times add up to "
        f"{sum(r.wall for r in results):.1f} s); the 1996 clusters took {whole:.1f} s for the "
        f"36 runs of Table 1{these}"
    )
    return 130 if interrupted else 0


def _speedups(results: list[CellResult]) -> list[tuple[str, str, float, float]]:
    """(benchmark, network, paper, measured) for each pair of 2- and 8-node runs."""
    from stacklib.experiments import splitc as experiment

    times = {(r.cell.benchmark, r.cell.network, r.cell.nodes): r.total for r in results}
    out = []
    for (benchmark, network, n), t2 in times.items():
        t8 = times.get((benchmark, network, 8))
        if n == 2 and t8 is not None:
            column = tuple(experiment.CLUSTERS).index(network)
            paper = experiment.TABLE2[benchmark][column]
            out.append((benchmark, network, paper, experiment.speedup(benchmark, t2, t8)))
    return out


def _table1_json(
    results: list[CellResult], wall: float, processes: int, paper_total: float
) -> dict[str, Any]:
    from stacklib.experiments import splitc as experiment

    runs = [
        {
            "benchmark": r.cell.benchmark,
            "network": r.cell.network,
            "nodes": r.cell.nodes,
            "sizes": list(r.cell.sizes) if r.cell.sizes else None,
            "paper_size": r.cell.paper_size,
            "paper_seconds": r.paper,
            "seconds": r.total,
            "deviation": (r.total - r.paper) / r.paper if r.cell.paper_size else None,
            "computation_seconds": r.compute,
            "communication_seconds": max(0.0, r.total - r.compute),
            "wall_seconds": r.wall,
        }
        for r in results
    ]
    speedups = [
        {"benchmark": b, "network": network, "paper": paper, "measured": measured}
        for b, network, paper, measured in _speedups(results)
    ]
    return {
        "runs": runs,
        "speedups": speedups,
        "wall_seconds": wall,
        "processes": processes,
        "clusters_seconds": paper_total,
        "clusters_seconds_all": experiment.CLUSTERS_SECONDS,
    }


def cmd_list(args: argparse.Namespace) -> int:
    from stacklib.bench.splitc.cluster import TRANSPORTS
    from stacklib.bench.splitc.programs import PAPER_SIZES, PROGRAMS
    from stacklib.transports.sim.machines import MACHINES

    print("benchmarks (paper sizes):")
    for name, (program, sizes) in PAPER_SIZES.items():
        print(f"  {name:8s} {PROGRAMS[program][1]}, sizes {','.join(map(str, sizes))}")
    print("machines:")
    for machine in MACHINES.values():
        print(f"  {machine.name:8s} {machine.description} ({machine.cite})")
    print("transports:", ", ".join((*TRANSPORTS, *REAL)))
    return 0


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add this part's subcommands to ``commands``."""
    p = commands.add_parser(
        "splitc",
        help="Split-C over UAM: run the benchmark programs of paper 000 §6 / paper 003 §5",
        description="Run the Split-C benchmark programs on simulated machines (virtual time) "
        "or as real processes. See docs/splitc.md.",
    )
    sub = p.add_subparsers(dest="splitc_command", required=True)
    run = sub.add_parser("run", help="run one benchmark, verified and timed")
    run.add_argument("benchmark", help="mm4x4, mm128, mm16, ssortsm, ssortlg, rsortsm, ...")
    run.add_argument("-n", type=int, default=2, help="number of ranks (default 2)")
    run.add_argument(
        "--transport",
        default="memory",
        help="memory, sim-atm, sim-fe, a machine (unet-atm, atm-003, fe-003, cm5, meiko), "
        "shm, udp or xdp (with --netns)",
    )
    run.add_argument("--small", action="store_true", help="test sizes instead of the paper's")
    run.add_argument(
        "--size", type=sizes_type("8,128"), metavar="N,N", help="the program's size arguments"
    )
    run.add_argument("--seed", type=int, default=1)
    run.add_argument(
        "--netns",
        action="store_true",
        help="udp, xdp: each rank in its own network namespace, joined by a bridge (needs root)",
    )
    run.add_argument(
        "--timeout",
        type=seconds_type,
        default=1800.0,
        help="--netns: seconds before the ranks are stopped (default 1800; 8 ranks of the "
        "paper-size sorts on 2 cores take minutes)",
    )
    run.add_argument(
        "--pure",
        action="store_true",
        help="shm/udp: the ranks never run the compiled hot path of `stacklib compile`",
    )
    run.set_defaults(func=cmd_run)
    table = sub.add_parser(
        "table1",
        help="paper 003 Tables 1-2: the 36 runs on every core, with progress",
        description="Simulate the runs of paper 003 Table 1 (six benchmarks on 2, 4 and 8 "
        "nodes of the ATM and Fast Ethernet clusters) in a process pool, longest first, with "
        "a line per finished run on stderr; print Table 1 (paper vs measured, computation and "
        "communication), Table 2 (speedups) and the total wall time against the 814 s the "
        "1996 clusters took. Scaled sizes unless --full.",
    )
    scale = table.add_mutually_exclusive_group()
    scale.add_argument("--full", action="store_true", help="the paper's sizes (minutes per run)")
    scale.add_argument("--small", action="store_true", help="test sizes (seconds in all)")
    table.add_argument(
        "--size",
        type=_size_override,
        action="append",
        default=[],
        metavar="BENCH=N,N",
        help="one benchmark's size arguments, e.g. rsortsm=4096 (repeatable)",
    )
    table.add_argument(
        "--only", type=_names, metavar="BENCH,...", help="mm128, mm16, ssortsm, ssortlg, ..."
    )
    table.add_argument(
        "--nodes", type=sizes_type("2,4,8"), default=(2, 4, 8), metavar="N,...", help="2,4,8"
    )
    table.add_argument(
        "--network", type=_names, default=("atm", "fe"), metavar="NET,...", help="atm,fe"
    )
    table.add_argument("--jobs", type=int, help="processes (default: one per CPU)")
    table.add_argument(
        "--pure",
        action="store_true",
        help="never the compiled hot path of `stacklib compile`, even where there is one",
    )
    table.add_argument("--json", action="store_true", help="the results as JSON on stdout")
    table.add_argument(
        "--quiet",
        action="store_true",
        help="no progress display on stderr (the line per finished run stays)",
    )
    table.set_defaults(func=cmd_table1)
    listing = sub.add_parser("list", help="the benchmarks, machines and transports")
    listing.set_defaults(func=cmd_list)
