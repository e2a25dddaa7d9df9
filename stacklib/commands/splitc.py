"""``stacklib`` subcommands for Split-C over UAM (paper 000 §6, paper 003 §5).

    stacklib splitc list                                the benchmarks, machines and transports
    stacklib splitc run BENCHMARK -n N --transport T    run one benchmark, verified and timed

``--transport`` is ``memory`` (one process, real time), a simulated cluster (``sim-atm``,
``sim-fe``, virtual time) or machine (``unet-atm``, ``atm-003``, ``fe-003``, ``cm5``,
``meiko``: computation charged from the machine's costs), or ``shm``/``udp``: N real
processes started like ``stacklib spawn``.  ``--transport udp --netns`` puts each rank in its
own network namespace, the namespaces joined by a bridge (needs CAP_NET_ADMIN; everything is
deleted afterwards).  docs/splitc.md describes the programs.
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
from typing import Any

from stacklib.commands._common import sizes_type

REAL = ("shm", "udp")


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


def _run_real(args: argparse.Namespace) -> int:
    from stacklib.launch import spawn

    if args.netns and args.transport != "udp":
        print(f"stacklib splitc: --netns applies to udp, not {args.transport}", file=sys.stderr)
        return 2
    rank_args = [args.benchmark, f"--seed={args.seed}"]
    if args.small:
        rank_args.append("--small")
    if args.size:
        rank_args.append("--size=" + ",".join(str(s) for s in args.size))
    if args.netns:
        return _run_netns(args, rank_args)
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
        status = subprocess.run(command, stdout=out, check=False).returncode
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("[")]
    del spawn  # imported to fail early if the launcher is unavailable
    if not lines:
        print(f"stacklib splitc: the ranks exited with status {status}", file=sys.stderr)
        return status or 1
    rows = [(bool(r[0]), float(r[1]), float(r[2])) for r in json.loads(lines[-1])]
    return _print(args.benchmark, args.transport, args.n, rows) or status


#: Prefix of the namespaces ``--netns`` makes (stacklib.netns.remove_stale cleans up after a
#: killed run).
NETNS_PREFIX = "slsplitc"


def _bridged_namespaces(stack: contextlib.ExitStack, n: int) -> tuple[list[str], list[str]]:
    """``n`` namespaces, each with one veth whose other end is on a bridge in a hub namespace
    (one Ethernet segment, like the paper's switch); returns the namespaces and addresses."""
    from stacklib.netns import netns, run_in, veth_pair

    hub = stack.enter_context(netns(NETNS_PREFIX))
    spaces = [stack.enter_context(netns(NETNS_PREFIX)) for _ in range(n)]
    # The bridge and the hub ends of the veths go when the hub namespace is deleted.
    run_in(hub, "ip", "link", "add", "slbr", "type", "bridge")
    run_in(hub, "ip", "link", "set", "slbr", "up")
    # A subnet per coordinator process, so two runs at once do not meet.
    subnet = f"10.97.{os.getpid() % 250}"
    addresses = [f"{subnet}.{rank + 1}" for rank in range(n)]
    for rank, space in enumerate(spaces):
        _, port = veth_pair(
            space, hub, f"{addresses[rank]}/24", None, name_a="sc0", name_b=f"sc{rank}"
        )
        run_in(hub, "ip", "link", "set", port, "master", "slbr")
    return spaces, addresses


def _run_netns(args: argparse.Namespace, rank_args: list[str], timeout: float = 120.0) -> int:
    """Run the ranks over udp, each in its own network namespace; namespaces, rendezvous
    directory and ranks are gone when this returns, also on failure."""
    from stacklib.netns import NetnsError, capability_problem, netns_argv

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
            spaces, addresses = _bridged_namespaces(stack, args.n)
        except NetnsError as exc:
            print(f"stacklib splitc: {exc}", file=sys.stderr)
            return 2
        out = stack.enter_context(tempfile.TemporaryFile("w+"))
        ranks: list[subprocess.Popen[bytes]] = []
        # Registered after the namespaces, so the ranks are stopped before those are deleted.
        stack.callback(_stop_all, ranks)
        for rank in range(args.n):
            env = dict(
                os.environ,
                STACKLIB_RANK=str(rank),
                STACKLIB_SIZE=str(args.n),
                STACKLIB_RENDEZVOUS=rendezvous,
                STACKLIB_TRANSPORT="udp",
                STACKLIB_HOST=addresses[rank],
            )
            command = [sys.executable, "-m", "stacklib.bench.splitc.rank", *rank_args]
            ranks.append(
                subprocess.Popen(
                    netns_argv(spaces[rank], *command),
                    env=env,
                    stdout=out if rank == 0 else subprocess.DEVNULL,
                )
            )
        status = _wait_all(ranks, timeout)
        out.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("[")]
    if not lines:
        print(f"stacklib splitc: the ranks exited with status {status}", file=sys.stderr)
        return status or 1
    rows = [(bool(r[0]), float(r[1]), float(r[2])) for r in json.loads(lines[-1])]
    return _print(args.benchmark, "udp (netns)", args.n, rows) or status


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
        "shm or udp",
    )
    run.add_argument("--small", action="store_true", help="test sizes instead of the paper's")
    run.add_argument(
        "--size", type=sizes_type("8,128"), metavar="N,N", help="the program's size arguments"
    )
    run.add_argument("--seed", type=int, default=1)
    run.add_argument(
        "--netns",
        action="store_true",
        help="udp: each rank in its own network namespace, joined by a bridge (needs root)",
    )
    run.set_defaults(func=cmd_run)
    listing = sub.add_parser("list", help="the benchmarks, machines and transports")
    listing.set_defaults(func=cmd_list)
