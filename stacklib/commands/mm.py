"""``stacklib`` subcommands for U-Net/MM (paper 002 §6.2): buffer traces and the TLB simulator.

    stacklib trace record -o FILE RECIPE   run a recipe, record every send/receive buffer
    stacklib trace record -o FILE --splitc PROGRAM [-n N] [--scale S]
                                           the same for a Split-C benchmark (paper 002 §6.2)
    stacklib trace show FILE               summarize a trace
    stacklib tlbsim TRACE... --entries 256,1024 --victim 16 [--plot FILE]
                                           replay traces through NI TLBs (Fig 3)

docs/memory-management.md describes the trace format and the simulation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stacklib.commands._common import add_set_option, load_recipe, matplotlib_missing, sizes_type


def _record(args: argparse.Namespace) -> int:
    """``stacklib trace record``: run and write the trace, with progress on stderr."""
    from stacklib.unet.mm.trace import TraceRecorder

    if (args.recipe is None) == (args.splitc is None):
        print("stacklib trace record: give a RECIPE or --splitc PROGRAM", file=sys.stderr)
        return 2
    if args.splitc is not None:
        from stacklib.bench.splitc.trace import record_splitc
        from stacklib.unet.mm.trace import build_trace

        try:
            records = record_splitc(
                args.splitc,
                args.n,
                scale=args.scale,
                transport=args.transport,
                seed=1 if args.seed is None else args.seed,
            )
        except (KeyError, ValueError) as error:
            print(f"stacklib trace record: {error}", file=sys.stderr)
            return 2
        data = build_trace(records)
        source = f"Split-C {args.splitc} on {args.n} ranks, scale 1/{args.scale}"
        if args.scale != 1:
            source += f" (replay with --page-size {4096 // args.scale} --rx-buffers 0)"
    else:
        from stacklib.recipes import run_recipe

        recipe = load_recipe(args.recipe, args.set)
        recorder = TraceRecorder()
        with recorder.installed():
            run_recipe(recipe, seed=args.seed)
        records, data, source = recorder.records, recorder.to_bytes(), recipe.name
    Path(args.output).write_bytes(data)
    tx = sum(1 for r in records if r.direction == 0)
    print(
        f"{args.output}: {len(records)} buffers ({tx} transmit, "
        f"{len(records) - tx} receive) from {source}"
    )
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from stacklib.unet.mm.trace import parse_trace

    if args.action == "record":
        from stacklib.reporting import progress

        with progress.shown("trace record", quiet=args.quiet):
            return _record(args)
    trace = parse_trace(Path(args.file).read_bytes())
    processes = sorted({r.process for r in trace.records})
    tx = sum(1 for r in trace.records if r.direction == 0)
    print(f"{args.file}: {len(trace.records)} buffers, {trace.dropped} bad records dropped")
    print(f"  transmit {tx}, receive {len(trace.records) - tx}, processes {len(processes)}")
    for record in trace.records[: args.head]:
        kind = "tx" if record.direction == 0 else "rx"
        print(
            f"  {kind} process {record.process} endpoint {record.endpoint} "
            f"address {record.address:#x} length {record.length}"
        )
    return 0


def cmd_tlbsim(args: argparse.Namespace) -> int:
    from stacklib.unet.mm.tlbsim import format_results, simulate
    from stacklib.unet.mm.trace import parse_trace

    if args.plot is not None and matplotlib_missing("tlbsim", "--plot"):
        return 2
    results = []
    for name in args.traces:
        trace = parse_trace(Path(name).read_bytes())
        for entries in args.entries:
            results.append(
                simulate(
                    trace.records,
                    entries=entries,
                    victim=args.victim,
                    ways=args.ways,
                    page_size=args.page_size,
                    rx_buffers=args.rx_buffers,
                    rx_buffer_size=args.rx_buffer_size or args.page_size,
                    label=Path(name).stem,
                )
            )
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "trace": r.label,
                        "entries": r.entries,
                        "victim": r.victim,
                        "translations": r.translations,
                        "pages": r.pages,
                        "hits": r.hits,
                        "tx_compulsory": r.tx_compulsory,
                        "tx_non_compulsory": r.tx_non_compulsory,
                        "rx_compulsory": r.rx_compulsory,
                        "rx_non_compulsory": r.rx_non_compulsory,
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    else:
        print(format_results(results))
    if args.plot is not None:
        from stacklib.reporting.plots.tlb import plot_tlb

        out = plot_tlb(results, args.plot)
        print(f"plot written to {out}", file=sys.stderr if args.json else sys.stdout)
    return 0


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add this part's subcommands to ``commands``."""
    p = commands.add_parser(
        "trace",
        help="record or show buffer traces (U-Net/MM, paper 002 §6.2)",
        description="Record the address, length and direction of every send and receive "
        "buffer of a recipe's run, or summarize a recorded trace.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    r = actions.add_parser("record", help="run RECIPE and write its buffer trace to FILE")
    r.add_argument("recipe", metavar="RECIPE", nargs="?", help="recipe name or path")
    r.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write")
    r.add_argument("--seed", type=int, default=None, help="override the recipe's seed")
    r.add_argument(
        "--splitc",
        metavar="PROGRAM",
        help="trace a Split-C benchmark instead (mm128, mm16, rsortlg, ssortsm, ssortlg: "
        "paper 002 §6.2's sizes; or any of `stacklib splitc list`)",
    )
    r.add_argument("-n", type=int, default=8, help="Split-C ranks (8)")
    r.add_argument(
        "--scale",
        type=int,
        default=1,
        help="divide every Split-C byte count (data, page, UAM buffer) by this (1; 64 runs "
        "in seconds)",
    )
    r.add_argument(
        "--transport",
        default="sim-memory",
        help="Split-C cluster transport (sim-memory: virtual time, deterministic)",
    )
    add_set_option(r)
    r.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (otherwise the elapsed and the simulated time)",
    )
    r.set_defaults(func=cmd_trace)
    s = actions.add_parser("show", help="summarize a trace file")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--head", type=int, default=10, help="records to print (10)")
    s.set_defaults(func=cmd_trace)

    p = commands.add_parser(
        "tlbsim",
        help="replay buffer traces through NI TLBs (paper 002 §6.2, Fig 3)",
        description="Replay each TRACE through a direct-mapped TLB of each size with a fully "
        "associative FIFO victim cache, and report misses as transmit/receive x "
        "compulsory/non-compulsory, in percent of page translations.",
    )
    p.add_argument("traces", metavar="TRACE", nargs="+", help="trace files")
    p.add_argument(
        "--entries",
        type=sizes_type("256,1024"),
        default=[256, 1024],
        metavar="N,N",
        help="primary TLB sizes (256,1024)",
    )
    p.add_argument("--victim", type=int, default=16, help="victim cache entries (16)")
    p.add_argument("--ways", type=int, default=1, help="primary associativity (1: direct)")
    p.add_argument(
        "--rx-buffers",
        type=int,
        default=64,
        help="receive buffers per process (64, paper 002 §6.2); 0 uses the recorded addresses",
    )
    p.add_argument("--rx-buffer-size", type=int, default=None, help="bytes each (one page)")
    p.add_argument(
        "--page-size",
        type=int,
        default=4096,
        help="page size of the trace (4096; a Split-C trace at scale 1/S: 4096/S)",
    )
    p.add_argument("--plot", metavar="FILE", help="draw stacked bars like Fig 3 (matplotlib)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_tlbsim)
