"""``stacklib compile``: the optional compiled copy of the simulator's hot path
(stacklib/compiled.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stacklib import compiled

__all__ = ["add_commands"]


def cmd_compile(args: argparse.Namespace) -> int:
    if args.clean:
        for path in compiled.remove():
            print(f"removed {path}")
        return 0
    if args.path:
        copy = compiled.available()
        if copy is None:
            print("no compiled copy of these sources", file=sys.stderr)
            return 1
        print(copy)
        return 0
    try:
        copy = compiled.build(lambda line: print(line, file=sys.stderr, flush=True))
    except RuntimeError as error:
        print(f"stacklib compile: {error}", file=sys.stderr)
        return 1
    print(f"compiled {len(compiled.HOT_MODULES)} modules into {copy}")
    print(
        f"runs with {compiled.ENVIRONMENT}=1 use it; stacklib splitc table1 and "
        "stacklib reproduce --full use it in their worker processes, stacklib splitc run "
        "in its real ranks"
    )
    return 0


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    p = commands.add_parser(
        "compile",
        help="compile the simulator's hot modules with mypyc (optional; stacklib[fast])",
        description=(
            "Copy the package's sources into a cache directory named after their hash and "
            "compile the modules every simulated message passes through with mypyc. Processes "
            f"started with {compiled.ENVIRONMENT}=1 run them when they match the sources; the "
            "Table 1 runner's workers do so by themselves."
        ),
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--clean", action="store_true", help="delete every compiled copy")
    group.add_argument(
        "--path", action="store_true", help="print the copy for these sources, if any"
    )
    p.set_defaults(func=cmd_compile)
