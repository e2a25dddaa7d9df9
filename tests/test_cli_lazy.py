"""The command starts fast: ``stacklib --help`` and a command's own parser import only what
they need (checked by the modules imported, not by a clock)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from stacklib.cli import COMMANDS, build_parser

# trio is not in the list: stacklib.errors subclasses trio's closed- and broken-resource
# errors, and the command reports stacklib's errors (about 0.15 s of a 0.2 s start).
HEAVY = (
    "numpy",
    "construct",
    "stacklib.sim",
    "stacklib.unet",
    "stacklib.layers",
    "stacklib.transports",
    "stacklib.daemon",
    "stacklib.experiments",
    "stacklib.recipes",
)


def _imported_after(code: str) -> list[str]:
    program = textwrap.dedent(
        f"""
        import json, sys
        {code}
        print(json.dumps(sorted(sys.modules)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120
    )
    return list(json.loads(done.stdout.splitlines()[-1]))


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_help_imports_no_part_of_stacklib_it_does_not_show() -> None:
    modules = _imported_after(
        """
        from stacklib.cli import build_parser
        build_parser(["--help"]).format_help()
        """
    )
    assert _heavy(modules) == []


@pytest.mark.parametrize("command", ["run", "list", "decode", "reproduce", "bench"])
def test_a_command_s_parser_imports_only_what_it_needs(command: str) -> None:
    modules = _imported_after(
        f"""
        from stacklib.cli import build_parser
        build_parser([{command!r}, "--help"]).format_help()
        """
    )
    assert _heavy(modules) == []


def test_the_help_lines_match_the_commands_own() -> None:
    # The table's help lines are what `stacklib --help` shows; each command's own parser
    # gives the same line when built in full.
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    own = {action.dest: action.help for action in commands._choices_actions}
    assert own == {name: summary for name, (summary, _) in COMMANDS.items()}


def test_every_command_parses_its_help_lazily() -> None:
    for name in COMMANDS:
        parser = build_parser([name, "--help"])
        with pytest.raises(SystemExit) as info:
            parser.parse_args([name, "--help"])
        assert info.value.code == 0
