"""The ``stacklib`` command.

    stacklib list                      recipes, with a description each
    stacklib run RECIPE [--json]       run a recipe's workload and print its table
    stacklib decode FORMAT HEX         pretty-print a frame or descriptor
    stacklib bench ...                 benchmarks (wall-clock performance of stacklib itself)
    stacklib reproduce                 the papers' experiments: paper vs measured
    stacklib spawn -n N PROGRAM [ARGS] start N ranks of a program on this host (over shm)
    stacklib daemon                    the OS service daemon for shared-memory endpoints

Exit status: 0 on success, 1 when a reproduced figure is outside its tolerance, 2 for a usage or
recipe error (the message names the file, the key and the reason) or a file that cannot be read
or written, 130 when interrupted (Ctrl-C).  Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from stacklib import __version__
from stacklib.commands._common import add_set_option, load_recipe, sizes_type
from stacklib.errors import ConfigError, StacklibError


def cmd_list(args: argparse.Namespace) -> int:
    from stacklib.recipes import list_recipes

    recipes = list_recipes()
    if args.json:
        print(json.dumps([{"name": n, "description": d, "path": str(p)} for n, d, p in recipes]))
        return 0
    if not recipes:
        print("no recipes found (looked in $STACKLIB_RECIPES, ./recipes and the package's)")
        return 0
    from stacklib.reporting.tables import format_listing

    print(format_listing([(name, [description]) for name, description, _ in recipes]))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from stacklib.reporting import progress

    # A rank of a one-node-per-process recipe, started by stacklib spawn, shows nothing: its
    # siblings share the terminal.
    with progress.shown("run", quiet="STACKLIB_RANK" in os.environ):
        outcome = _run(args)
    # Printed once the live line is gone: stdout may be the same terminal.
    if outcome is not None:
        recipe, result = outcome
        if args.json:
            print(result.to_json())
        else:
            print(f"{recipe.name}: {recipe.description}")
            print(result.format_table())
    return 0


def _run(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """Run the recipe ``args`` name: the recipe and its result (None: a rank that does not
    print)."""
    from stacklib.recipes import run_recipe

    recipe = load_recipe(args.recipe, args.set)
    if recipe.transport.per_process:
        # One node per process (ether, xdp): this process is one rank of the recipe, started
        # by stacklib spawn or another launcher; rank 0 prints the result.
        from stacklib.recipes.ranks import run_rank

        if args.pcap is not None:
            raise ConfigError(str(recipe.path), "transport.kind", "has no link to capture")
        rank_result = run_rank(recipe, seed=args.seed)
        if rank_result is None:
            return None
        result = rank_result
    else:
        result = run_recipe(recipe, seed=args.seed, pcap=args.pcap)
    return recipe, result


def cmd_decode(args: argparse.Namespace) -> int:
    from stacklib.wire import registry

    if args.list or args.format is None:
        for name, info in registry.formats().items():
            source = registry.FORMATS.source(name)
            origin = "" if source == "stacklib" else f"  [{source}]"
            print(f"{name.ljust(16)}  {info.summary}{origin}")
        return 0
    known = registry.FORMATS
    if args.format not in known:
        raise ConfigError(
            "decode", args.format, f"unknown format (known: {', '.join(sorted(known))})"
        )
    if not args.hex:
        raise ConfigError("decode", "HEX", "missing the bytes to decode")
    text = "".join(args.hex).replace(":", "").replace(" ", "")
    try:
        data = bytes.fromhex(text)
    except ValueError:
        raise ConfigError("decode", "HEX", f"not hexadecimal: {text[:40]!r}") from None
    print(registry.decode(args.format, data))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from stacklib.reporting import progress

    with progress.shown(f"bench {args.bench}"):
        try:
            result = _bench(args)
        except progress.Interrupted as stop:
            return _interrupted(f"bench {args.bench}", stop, args.json)
    print(result.to_json() if args.json else result.format_table())
    return 0


def _interrupted(command: str, stop: Any, as_json: bool) -> int:
    """Ctrl-C in a job whose results accumulate: print what finished, say what did not;
    the shell's status for SIGINT."""
    print(stop.partial.to_json() if as_json else stop.partial.format_table())
    print(f"stacklib {command}: {stop.detail}", file=sys.stderr)
    return 130


def _bench(args: argparse.Namespace) -> Any:
    """The result of the bench ``args`` name."""
    if args.bench == "core":
        from stacklib.bench import core

        result = core.bench_core(iterations=args.iterations, size=args.size, repeat=args.repeat)
    elif args.bench == "tcp":
        from stacklib.bench import tcp_bulk

        result = tcp_bulk.bench_tcp(size=args.size, chunk=args.chunk, repeat=args.repeat)
    elif args.bench == "real":
        from stacklib.bench import engines, real

        if args.only is None or set(args.only) - {"udp", "udp1"}:
            engines.prepare(args.pure, lambda line: print(line, file=sys.stderr, flush=True))
        result = real.bench_real(
            iterations=args.iterations,
            messages=args.messages,
            bulk_messages=args.bulk_messages,
            repeat=args.repeat,
            only=args.only,
            compare=args.compare,
            pure=args.pure,
        )
    elif args.bench == "cpu":
        from stacklib.bench import cpu, engines

        engines.prepare(args.pure, lambda line: print(line, file=sys.stderr, flush=True))
        result = cpu.bench_cpu(
            iterations=args.iterations, repeat=args.repeat, only=args.only, pure=args.pure
        )
    elif args.bench == "spmd":
        from stacklib.bench.spmd import bench_spmd

        try:
            result = bench_spmd(args.ranks, args.keys, args.rounds, args.seed, args.programs)
        except ValueError as error:
            raise ConfigError("command line", "spmd", str(error)) from None
    elif args.bench == "single-copy":
        from stacklib.bench import single_copy

        result = single_copy.bench_single_copy(
            count=args.count, repeat=args.repeat, window=args.window
        )
    elif args.bench == "xdp":
        from stacklib.bench.xdp import XdpBenchParams, bench_xdp

        try:
            params = XdpBenchParams(args.iterations, args.messages, args.uam_messages, args.window)
        except ValueError as error:
            raise ConfigError("command line", "xdp", str(error)) from None
        result = bench_xdp(params)
    elif args.bench == "simgrid":
        from stacklib.bench.simgrid_scale import bench_simgrid
        from stacklib.bench.smpirun import SmpiError

        try:
            result = bench_simgrid(
                args.library, args.nodes, size=args.size, stacklib_up_to=args.stacklib_up_to
            )
        except (ValueError, SmpiError) as error:
            raise ConfigError("command line", "simgrid", str(error)) from None
    elif args.transport is not None:
        result = _bench_transport(args)
    else:
        result = _bench_workload(args)
    return result


def _bench_transport(args: argparse.Namespace) -> Any:
    """Run the workload ``args.bench`` between two processes over ``args.transport``."""
    from stacklib.bench.remote import bench_transport, make_params

    if args.recipe is not None:
        raise ConfigError(
            "command line", "--transport", "give either a RECIPE or --transport, not both"
        )
    if args.set or args.pcap:
        raise ConfigError("command line", "--set/--pcap", "apply to a RECIPE, not --transport")
    given = {
        name: value
        for name, value in (
            ("sizes", tuple(args.sizes) if args.sizes else None),
            ("iterations", getattr(args, "iterations", None)),
            ("messages", getattr(args, "messages", None)),
            ("modes", tuple(args.modes) if getattr(args, "modes", None) else None),
        )
        if value is not None
    }
    try:
        params = make_params(args.bench, given)
        return bench_transport(
            args.bench,
            params,
            args.transport,
            compare=args.compare == "kernel",
            netns=args.netns,
        )
    except (TypeError, ValueError) as error:
        raise ConfigError("command line", args.bench, str(error)) from None


def _bench_workload(args: argparse.Namespace) -> Any:
    """Run the workload ``args.bench`` on RECIPE's stack, whatever workload the recipe names."""
    import attrs

    from stacklib.bench import workload_kind
    from stacklib.recipes import run_recipe

    if args.recipe is None:
        raise ConfigError("command line", args.bench, "give a RECIPE or --transport")
    if args.compare is not None or args.netns:
        raise ConfigError("command line", "--compare/--netns", "apply to --transport runs")
    recipe = load_recipe(args.recipe, args.set)
    kind = workload_kind(args.bench)
    top = recipe.layers[-1][0].provides if recipe.layers else None
    if top is not None and not kind.accepts(top):
        raise ConfigError(str(recipe.path), "layers", f"{kind.name} needs {kind.needs}")
    base = recipe.workload_params if recipe.workload is kind else kind.Params()
    given = {
        name: value
        for name, value in (
            ("sizes", tuple(args.sizes) if args.sizes else None),
            ("iterations", getattr(args, "iterations", None)),
            ("messages", getattr(args, "messages", None)),
            ("modes", tuple(args.modes) if getattr(args, "modes", None) else None),
        )
        if value is not None and hasattr(base, name)
    }
    try:
        params = attrs.evolve(base, **given)
    except (TypeError, ValueError) as error:
        raise ConfigError("command line", args.bench, str(error)) from None
    return run_recipe(attrs.evolve(recipe, workload=kind, workload_params=params), pcap=args.pcap)


def cmd_faults(args: argparse.Namespace) -> int:
    from stacklib.bench.faults import CAMPAIGNS, FaultsParams, ReliabilityError, bench_faults
    from stacklib.reporting import progress

    params = FaultsParams(
        messages=args.messages,
        rate=args.rate,
        fuzz=args.fuzz,
        tcp_bytes=args.tcp_bytes,
        flood=args.flood,
        seed=args.seed,
        campaigns=tuple(args.only or CAMPAIGNS),
    )
    try:
        with progress.shown("bench faults", len(params.campaigns)):
            result = bench_faults(params)
    except progress.Interrupted as stop:
        return _interrupted("bench faults", stop, args.json)
    except ReliabilityError as error:
        failed = error.result  # type: ignore[attr-defined]
        print(failed.to_json() if args.json else failed.format_table())
        print(f"stacklib bench faults: {error}", file=sys.stderr)
        return 1
    print(result.to_json() if args.json else result.format_table())
    return 0


def cmd_spawn(args: argparse.Namespace) -> int:
    from stacklib.launch import cmd_spawn as spawn

    return spawn(args.n, args.program, args.args, args.transport, args.netns, args.pure)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from stacklib.reproduce import describe_experiments, run_experiments

    if args.list:
        print(describe_experiments(args.only))
        return 0
    return run_experiments(
        only=args.only,
        as_json=args.json,
        plots=args.plots,
        everything=args.all,
        full=args.full,
        quiet=args.quiet,
    )


def _wall_clock_options(b: argparse.ArgumentParser, repeat: int) -> None:
    """What every wall-clock bench takes: best of ``repeat`` runs, JSON output."""
    b.add_argument("--repeat", type=int, default=repeat, help="runs of each; the best is kept")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_bench)


def _add_list(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib list``."""
    p = commands.add_parser("list", help="list the recipes with a description each")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_list)


def _add_run(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib run``."""
    p = commands.add_parser(
        "run",
        help="run a recipe's workload and print its results",
        description="Load RECIPE (a name from `stacklib list` or a path), validate it strictly, "
        "build the stack on its transport and run its workload.",
    )
    p.add_argument("recipe", metavar="RECIPE", help="recipe name or path to a .toml file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--seed", type=int, default=None, help="override the recipe's seed")
    add_set_option(p)
    p.add_argument(
        "--pcap",
        metavar="FILE",
        help="write the simulated link's traffic to a pcap file for Wireshark/tshark",
    )
    p.set_defaults(func=cmd_run)


def _add_decode(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib decode``."""
    p = commands.add_parser(
        "decode",
        help="pretty-print a frame or descriptor given in hex",
        description="Decode HEX as FORMAT and print its fields. Without FORMAT, or with --list, "
        "list the known formats.",
    )
    p.add_argument("format", metavar="FORMAT", nargs="?", help="format name (see --list)")
    p.add_argument("hex", metavar="HEX", nargs="*", help="the bytes, in hex (spaces allowed)")
    p.add_argument("--list", action="store_true", help="list the known formats")
    p.set_defaults(func=cmd_decode)


def _add_bench(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib bench`` and its benchmarks."""
    p = commands.add_parser(
        "bench",
        help="benchmarks of stacklib's own speed (wall clock)",
        description="Wall-clock benchmarks. Figures belong in docs/performance.md with the "
        "command that produced them; compare ratios measured in one run.",
    )
    benches = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    b = benches.add_parser(
        "core",
        help="raw U-Net ping-pong over the memory transport vs a bare trio memory channel",
    )
    b.add_argument("--iterations", type=int, default=20000, help="round trips per run")
    b.add_argument("--size", type=int, default=40, help="message size in bytes")
    _wall_clock_options(b, repeat=3)
    b = benches.add_parser(
        "tcp",
        help="TCP bulk transfer over the memory transport vs the kernel's TCP loopback",
        description="One process, one run: stacklib TCP (ip + tcp over U-Net endpoints on the "
        "memory transport) with 2048- and 9140-byte segments, and the kernel's TCP on 127.0.0.1 "
        "through trio sockets, moving the same bytes; wall-clock MB/s and segments/s.",
    )
    b.add_argument("--size", type=int, default=4 << 20, help="bytes per transfer")
    b.add_argument("--chunk", type=int, default=65536, help="bytes per write")
    _wall_clock_options(b, repeat=3)
    b = benches.add_parser(
        "real",
        help="U-Net over shared memory vs kernel UDP sockets between two processes",
        description="Two processes, one run: a 40-byte ping-pong over the shm transport and "
        "over kernel UDP sockets, UAM request/reply and a Split-C read over shm, the one-way "
        "message rate and 64 KiB bulk bandwidth over shm (docs/transports.md).",
    )
    b.add_argument("--iterations", type=int, default=20000, help="round trips per ping-pong")
    b.add_argument("--messages", type=int, default=200000, help="messages in the rate test")
    b.add_argument("--bulk-messages", type=int, default=20000, help="64 KiB messages")
    b.add_argument(
        "--only",
        nargs="+",
        choices=[
            "shm",
            "udp",
            "trio",
            "triopay",
            "await",
            "udp1",
            "uam",
            "uamtrio",
            "splitc",
            "splitctrio",
            "rate",
            "bulk",
        ],
        help="run only these measurements (trio: await send/recv; triopay: await "
        "send_payload_async/recv_payload; await: those and busy-poll in one process; uam: UAM "
        "request/reply with explicit polling; splitc: a Split-C blocking read, polled)",
    )
    b.add_argument(
        "--compare",
        choices=["mpi"],
        help="mpi: also mpi4py over Open MPI between the same two CPUs (mpirun and the "
        "system Python's mpi4py; the rows are skipped with the reason when missing)",
    )
    b.add_argument(
        "--pure",
        action="store_true",
        help="measure the pure Python modules only (by default the stacklib rows are also "
        "measured on the compiled copy, built first when mypyc is installed)",
    )
    _wall_clock_options(b, repeat=3)
    b = benches.add_parser(
        "cpu",
        help="UAM request/reply's CPU per round trip, both sides in one process",
        description="One process, one thread: two UAM protocol machines handing each other "
        "their datagrams, and two UAM services over an in-process shm endpoint pair polled "
        "explicitly; per round trip, on the pure modules and the compiled copy; and what a "
        "trio checkpoint costs the application polling them (docs/performance.md).",
    )
    b.add_argument("--iterations", type=int, default=50000, help="round trips per run")
    b.add_argument(
        "--only", nargs="+", choices=["machine", "service", "pass"], help="run only these rows"
    )
    b.add_argument(
        "--pure",
        action="store_true",
        help="measure the pure Python modules only (by default also the compiled copy, "
        "built first when mypyc is installed)",
    )
    _wall_clock_options(b, repeat=5)
    b = benches.add_parser(
        "spmd",
        help="Split-C over shm vs mpi4py: the small-message radix sort and a barrier/"
        "all-reduce loop on N ranks",
        description="One run: on each number of ranks, stacklib's Split-C rsortsm-store and a "
        "barrier/all-reduce loop over shm (stacklib spawn) against the same programs in mpi4py "
        "(mpirun on the system Python), verified on both sides; times and their ratio "
        "(docs/performance.md).",
    )
    b.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="rank counts")
    b.add_argument("--keys", type=int, default=1024, help="keys per rank in the sort")
    b.add_argument("--rounds", type=int, default=100, help="barrier/all-reduce rounds")
    b.add_argument("--seed", type=int, default=1, help="seed of the keys")
    b.add_argument(
        "--programs", nargs="+", choices=["sort", "collectives"], default=["sort", "collectives"]
    )
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_bench)
    b = benches.add_parser(
        "single-copy",
        help="U-Net/MM single-copy transfers by the OS service vs the shm ring path",
        description="64 KiB and 1 MiB transfers copied once by the daemon with cross-memory "
        "attach (requests on its socket or its polled queue) vs the shm ring path, in one run "
        "(paper 002 §7.2; docs/single-copy.md).",
    )
    b.add_argument("--count", type=int, default=400, help="transfers per size and path")
    b.add_argument("--window", type=int, default=8, help="transfers in flight")
    _wall_clock_options(b, repeat=5)
    b = benches.add_parser(
        "xdp",
        help="the xdp transport's targets: raw U-Net and UAM over AF_XDP vs kernel UDP (root)",
        description="Two network namespaces joined by a veth, one run: 40-byte ping-pong "
        "(median, p99) against blocking kernel UDP on one and two CPUs, 64-byte and "
        "full-frame streams against kernel UDP, and a UAM stream that must arrive whole and "
        "in order; each row with its target and whether it holds (docs/performance.md).",
    )
    b.add_argument("--iterations", type=int, default=20000, help="round trips per ping-pong")
    b.add_argument("--messages", type=int, default=500_000, help="messages per raw stream")
    b.add_argument("--uam-messages", type=int, default=50_000, help="messages of the UAM stream")
    b.add_argument("--window", type=int, default=64, help="the UAM stream's window")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_bench)
    b = benches.add_parser(
        "simgrid",
        help="the scale path: an all-to-all on 8-1024 nodes in SimGrid (SMPI) from a Myrinet "
        "library's exported LogP, against stacklib's own simulation",
        description="Export one paper 004 library's LogP to SimGrid, check the ping-pong "
        "replay, then run an all-to-all of small messages and a barrier under smpirun on each "
        "node count and on stacklib's simulated cluster where it runs; simulated times, their "
        "deviation and the wall time of both (docs/myrinet.md).",
    )
    b.add_argument("--library", choices=("am", "bip", "fm", "pm", "vmmc"), default="fm")
    b.add_argument(
        "--nodes", type=sizes_type("8,64"), default=(8, 64, 256, 1024), help="node counts"
    )
    b.add_argument("--size", type=int, default=8, help="bytes per message (8: a pair of keys)")
    b.add_argument(
        "--stacklib-up-to", type=int, default=64, help="run stacklib's simulation up to N nodes"
    )
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_bench)
    b = benches.add_parser(
        "faults",
        help="the standing reliability run: UAM and TCP through faults, formats fuzzed, the "
        "daemon flooded",
        description="Move UAM requests and a TCP stream through a faulty simulated fabric "
        "(loss, corruption, duplication, reordering), fuzz every registered wire format and "
        "flood the OS-service daemon; exit 1 if anything is lost, delivered corrupt, or "
        "crashes (docs/reliability.md).",
    )
    b.add_argument("--messages", type=int, default=100_000, help="UAM requests (100000)")
    b.add_argument("--rate", type=float, default=0.05, help="rate of each fault (0.05)")
    b.add_argument("--fuzz", type=int, default=20_000, help="inputs per format (20000)")
    b.add_argument("--seed", type=int, default=1, help="seed of faults and inputs")
    b.add_argument("--tcp-bytes", type=int, default=10 << 20, help="bytes over TCP (10 MiB)")
    b.add_argument("--flood", type=int, default=20_000, help="malformed daemon requests")
    b.add_argument(
        "--only", nargs="+", choices=["uam", "tcp", "formats", "daemon"], help="these only"
    )
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=cmd_faults)
    for name, summary in (
        ("pingpong", "round-trip time vs message size (paper 000 Fig 3)"),
        ("bandwidth", "unidirectional, ping-pong and simultaneous bandwidth (paper 004 §4.2)"),
        ("logp", "LogP parameters RTT/2, Os, Or, g, L by delay injection (paper 004 §4.1)"),
    ):
        b = benches.add_parser(
            name,
            help=summary,
            description=f"{summary}, measured on RECIPE's transport and stack (its own "
            "workload is replaced; its parameters are used if it is the same workload), or "
            "with --transport between two processes on a real transport over raw U-Net "
            "(docs/transports.md). Simulated transports report virtual time; real ones "
            "wall-clock time.",
        )
        b.add_argument("recipe", metavar="RECIPE", nargs="?", help="recipe name or path")
        b.add_argument(
            "--transport",
            choices=["shm", "udp", "ether", "xdp", "memory"],
            help="instead of a recipe: raw U-Net between two processes (shm, udp over "
            "loopback), two network namespaces (ether, xdp, udp --netns; root), or in this "
            "process (memory)",
        )
        b.add_argument(
            "--compare",
            nargs="?",
            const="kernel",
            choices=["kernel"],
            help="with --transport: also run over kernel UDP and TCP sockets between the "
            "same two processes and print the gains (the value may be left out: kernel); "
            "with xdp also the kernel at its best (blocking UDP, the ranks on two CPUs and "
            "on one) and the ether transport",
        )
        b.add_argument(
            "--netns",
            action="store_true",
            help="with --transport udp: two network namespaces joined by a veth (root; "
            "ether and xdp always use them)",
        )
        b.add_argument("--sizes", type=int, nargs="+", help="message sizes in bytes")
        if name in ("pingpong", "logp"):
            b.add_argument("--iterations", type=int, help="round trips per size")
        if name in ("bandwidth", "logp"):
            b.add_argument("--messages", type=int, help="messages streamed per size")
        if name == "bandwidth":
            b.add_argument(
                "--modes",
                nargs="+",
                choices=["unidirectional", "pingpong", "simultaneous"],
                help="which bandwidths",
            )
        add_set_option(b)
        b.add_argument("--pcap", metavar="FILE", help="capture the simulated link to FILE")
        b.add_argument("--json", action="store_true", help="print JSON")
        b.set_defaults(func=cmd_bench)


def cmd_wireshark(args: argparse.Namespace) -> int:
    from stacklib import wireshark

    if args.install is not None:
        destination = wireshark.install(args.install or None)
        print(destination)
        print(
            "Wireshark and tshark load it at their next start (check: tshark -G protocols "
            "| grep -w uam)",
            file=sys.stderr,
        )
    else:
        print(wireshark.dissector_path())
    return 0


def _add_wireshark(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib wireshark``."""
    p = commands.add_parser(
        "wireshark",
        help="the Wireshark dissector for U-Net/FE, UAM and Split-C: its path, or install it",
        description="stacklib ships a Lua dissector for the U-Net/FE header, UAM PDUs and "
        "Split-C messages (docs/captures.md). --path prints its file, for tshark -X "
        "lua_script:FILE; --install copies it into Wireshark's personal Lua plugins folder "
        "(~/.local/lib/wireshark/plugins) or into DIR, and prints the copy's path.",
    )
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--path", action="store_true", help="print the dissector's path")
    action.add_argument(
        "--install",
        metavar="DIR",
        nargs="?",
        const="",
        help="copy the dissector into DIR (default: ~/.local/lib/wireshark/plugins)",
    )
    p.set_defaults(func=cmd_wireshark)


def _add_reproduce(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib reproduce``."""
    from stacklib.reporting.figures import EXPERIMENTS

    p = commands.add_parser(
        "reproduce",
        help="run the papers' experiments and print paper vs measured",
        description="Run every reproduced experiment on the simulated NIs and print, per "
        "figure, the paper's value, the measured value and the deviation, and at the end how "
        "many figures are within tolerance. Exits 1 if one is outside its stated tolerance.",
        # The names only: listing them imports no experiment (--list imports them all).
        epilog=f"Experiments: {', '.join(EXPERIMENTS)}. `stacklib reproduce --list` says what "
        "each reproduces and how long it takes.",
    )
    p.add_argument(
        "--only",
        metavar="NAME",
        nargs="+",
        action="extend",
        help="run only these experiments (--only a b, or --only a --only b)",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the experiments (or those of --only): what each reproduces and its time",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="also run the experiments that run only when named (long, or being calibrated)",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="run scaled experiments at the papers' sizes (Split-C: minutes instead of seconds)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plots", metavar="DIR", help="also draw plots into DIR (needs matplotlib)")
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (otherwise a live bar on a terminal, a line every 5 s "
        "elsewhere)",
    )
    p.set_defaults(func=cmd_reproduce)


def _add_spawn(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib spawn``."""
    p = commands.add_parser(
        "spawn",
        help="start N ranks of a program on this host, connected over shm",
        description="Start N ranks of PROGRAM (a Python file, or a module run with -m) with "
        "STACKLIB_RANK, STACKLIB_SIZE, STACKLIB_RENDEZVOUS and STACKLIB_TRANSPORT set; a rank "
        "calls stacklib.launch.bootstrap() to get a channel to every other rank. Waits for "
        "all; when one fails, stops the others and exits with its status (docs/launching.md).",
    )
    p.add_argument("-n", type=int, required=True, metavar="N", help="number of ranks")
    p.add_argument(
        "--transport",
        choices=["shm", "udp", "ether", "xdp"],
        default="shm",
        help="how ranks connect (shm; ether and xdp need --netns on one host)",
    )
    p.add_argument(
        "--netns",
        action="store_true",
        help="each rank in a network namespace of its own, the namespaces bridged (root)",
    )
    p.add_argument(
        "--pure",
        action="store_true",
        help="the ranks run the pure Python modules even where a compiled copy (stacklib "
        "compile) exists",
    )
    p.add_argument("program", metavar="PROGRAM", help="a Python file or a module name")
    p.add_argument("args", metavar="ARGS", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(func=cmd_spawn)


def _add_daemon(commands: argparse._SubParsersAction[Any]) -> None:
    """``stacklib daemon`` (its options come from the daemon package)."""
    from stacklib.daemon import build_parser as daemon_options
    from stacklib.daemon import cmd_daemon

    p = commands.add_parser(
        "daemon",
        help="run the U-Net OS service daemon (shm channel set-up, SO_PEERCRED, SCM_RIGHTS)",
        description="Run this host's OS service daemon (paper 000 §3.2): it creates shm "
        "endpoints and channels for authenticated processes and passes each channel's memory "
        "to its two owners only. See docs/daemon.md.",
    )
    daemon_options(p)
    p.set_defaults(func=cmd_daemon)


#: Every subcommand: its line in ``stacklib --help`` and the function (``module:name``) that
#: adds its parser.  Only the chosen command's function runs, so ``stacklib --help`` and
#: ``stacklib run ...`` import nothing of the parts they do not use.  A function may add
#: several commands (``trace`` and ``tlbsim``); a part with commands of its own keeps them in
#: ``stacklib/commands/<part>.py``.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("list the recipes with a description each", "stacklib.cli:_add_list"),
    "run": ("run a recipe's workload and print its results", "stacklib.cli:_add_run"),
    "decode": ("pretty-print a frame or descriptor given in hex", "stacklib.cli:_add_decode"),
    "bench": ("benchmarks of stacklib's own speed (wall clock)", "stacklib.cli:_add_bench"),
    "reproduce": (
        "run the papers' experiments and print paper vs measured",
        "stacklib.cli:_add_reproduce",
    ),
    "spawn": (
        "start N ranks of a program on this host, connected over shm",
        "stacklib.cli:_add_spawn",
    ),
    "daemon": (
        "run the U-Net OS service daemon (shm channel set-up, SO_PEERCRED, SCM_RIGHTS)",
        "stacklib.cli:_add_daemon",
    ),
    "splitc": (
        "Split-C over UAM: run the benchmark programs of paper 000 §6 / paper 003 §5",
        "stacklib.commands.splitc:add_commands",
    ),
    "libraries": (
        "the five Myrinet libraries of paper 004: Tables 1-3, Fig 2, LogP",
        "stacklib.commands.myrinet:add_commands",
    ),
    "trace": (
        "record or show buffer traces (U-Net/MM, paper 002 §6.2)",
        "stacklib.commands.mm:add_commands",
    ),
    "tlbsim": (
        "replay buffer traces through NI TLBs (paper 002 §6.2, Fig 3)",
        "stacklib.commands.mm:add_commands",
    ),
    "compile": (
        "compile the simulator's hot modules with mypyc (optional; stacklib[fast])",
        "stacklib.commands.compile:add_commands",
    ),
    "wireshark": (
        "the Wireshark dissector for U-Net/FE, UAM and Split-C: its path, or install it",
        "stacklib.cli:_add_wireshark",
    ),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``stacklib`` parser.  Given the command line ``argv``, only the command it names
    gets its full parser (the others are listed by name and help); without ``argv``, every
    command does."""
    parser = argparse.ArgumentParser(
        prog="stacklib",
        description=(
            "Composable user-level network protocol stacks: U-Net, its network interfaces "
            "and protocols, simulated in virtual time and run for real."
        ),
        epilog="Docs: README.md and docs/ in the source tree.",
    )
    parser.add_argument("--version", action="version", version=f"stacklib {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    chosen = _chosen_command(argv) if argv is not None else None
    added: set[str] = set()
    for name, (summary, target) in COMMANDS.items():
        if name in added:
            continue
        if argv is None or name == chosen or (chosen is not None and COMMANDS[chosen][1] == target):
            before = set(commands.choices)
            _load(target)(commands)
            added |= set(commands.choices) - before
        else:
            commands.add_parser(name, help=summary)
            added.add(name)
    return parser


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def _load(target: str) -> Callable[[argparse._SubParsersAction[Any]], None]:
    module, _, function = target.partition(":")
    add: Callable[[argparse._SubParsersAction[Any]], None] = getattr(
        importlib.import_module(module), function
    )
    return add


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:
        # Ctrl-C stops a long run cleanly: one line, the shell's status for SIGINT.
        print("stacklib: interrupted", file=sys.stderr)
        return 130
    except BaseExceptionGroup as group:
        # An error raised inside a workload's nursery arrives wrapped in a group.
        if group.subgroup(KeyboardInterrupt) is not None:
            print("stacklib: interrupted", file=sys.stderr)
            return 130
        error = _first(group, (StacklibError, KeyError, OSError))
        if error is None:
            raise
        print(f"stacklib: {_one_line(error)}", file=sys.stderr)
        return 2
    except (StacklibError, KeyError, OSError) as error:
        print(f"stacklib: {_one_line(error)}", file=sys.stderr)
        return 2
    return status


def _first(
    group: BaseExceptionGroup[BaseException], kinds: tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception of ``kinds`` in ``group``, however deeply nested."""
    found: BaseException | None = group.subgroup(lambda e: isinstance(e, kinds))
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


def _one_line(error: BaseException) -> str:
    """The message for an error the command line reports instead of a traceback: a
    ConfigError names its file, key and reason; a file error its file and the reason."""
    if isinstance(error, OSError):
        # A file that is missing or unwritable, a capture or plot path, a transport's socket.
        name = error.filename if error.filename is not None else ""
        reason = error.strerror or str(error)
        return f"{name}: {reason}" if name else reason
    if isinstance(error, KeyError) and not isinstance(error, StacklibError) and error.args:
        return str(error.args[0])  # an unknown name; str(KeyError) would quote it
    return str(error)


if __name__ == "__main__":
    sys.exit(main())
