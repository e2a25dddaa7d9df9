"""``stacklib`` subcommands for the Myrinet libraries of paper 004.

    stacklib libraries [--table 1|2|3]     paper 004 Tables 1-3, from the libraries' declarations
    stacklib libraries --fig2              the platform's host<->NI bandwidths (Fig 2)
    stacklib libraries --logp LIB          LogP of one library by the paper's method (Figs 4-8)
    stacklib libraries --plots DIR         draw Figs 2, 4-8 and 10-12 (matplotlib)

docs/myrinet.md describes the libraries, the method and the figures.
"""

from __future__ import annotations

import argparse
from typing import Any

from stacklib.commands._common import matplotlib_missing, sizes_type

_TITLES = {
    1: "Table 1: programming model (paper 004)",
    2: "Table 2: implementation (paper 004)",
    3: "Table 3: path stage -> LogP parameter (paper 004)",
}


def cmd_libraries(args: argparse.Namespace) -> int:
    from stacklib.transports.sim.myrinet_libs import LIBRARIES, table

    if args.fig2:
        from stacklib.transports.sim.lanai4 import FIG2_CURVES, fig2

        keys = [f"{method} {direction}" for method, direction in FIG2_CURVES]
        print("Fig 2: host <-> NI bandwidth, MB/s (paper 004 §3; values estimated)")
        print("size".rjust(8) + "".join(k.rjust(15) for k in keys))
        for row in fig2():
            print(f"{int(row['size']):8d}" + "".join(f"{row[k]:15.1f}" for k in keys))
        return 0
    if args.plots is not None:
        if matplotlib_missing("libraries", "--plots"):
            return 2
        from stacklib.experiments.myrinet import myrinet_curves
        from stacklib.reporting.plots.myrinet import draw_myrinet

        for path in draw_myrinet(args.plots, myrinet_curves()):
            print(path)
        return 0
    if args.logp is not None:
        from stacklib.experiments.myrinet import LOGP_SIZES, logp_of

        print(logp_of(args.logp, tuple(args.sizes or LOGP_SIZES)).format_table())
        return 0
    libraries = list(LIBRARIES.values())
    for number in args.table or (1, 2, 3):
        print(_TITLES[number])
        print(table(number, libraries))
        print()
    return 0


#: The libraries' command-line names (``stacklib.transports.sim.myrinet_libs.LIBRARIES``,
#: checked by the tests), spelled out so that ``stacklib --help`` need not import them.
LIBRARY_NAMES = ("am", "bip", "fm", "pm", "vmmc")


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add this part's subcommands to ``commands``."""
    p = commands.add_parser(
        "libraries",
        help="the five Myrinet libraries of paper 004: Tables 1-3, Fig 2, LogP",
        description="Print paper 004's Tables 1-3 generated from the libraries' declared "
        "properties, the platform's Fig 2 bandwidths, or one library's LogP parameters.",
    )
    p.add_argument(
        "--table", type=int, choices=(1, 2, 3), action="append", help="print only this table"
    )
    p.add_argument("--fig2", action="store_true", help="print the host<->NI bandwidths (Fig 2)")
    p.add_argument("--logp", choices=LIBRARY_NAMES, help="measure LogP of one library")
    p.add_argument("--plots", metavar="DIR", help="draw Figs 2, 4-8 and 10-12 into DIR")
    p.add_argument(
        "--sizes", type=sizes_type("4,256,4096"), metavar="N,N", help="message sizes for --logp"
    )
    p.set_defaults(func=cmd_libraries)
