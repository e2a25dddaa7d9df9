"""What ``stacklib`` and its per-part subcommands share: recipe loading with ``--set``
overrides, a sizes argument type, and the check for the optional matplotlib (which lives in
stacklib.reporting.optional)."""

from __future__ import annotations

import argparse
import math
import tomllib
from collections.abc import Callable, Sequence
from typing import Any

from stacklib.errors import ConfigError
from stacklib.reporting.optional import matplotlib_missing

__all__ = ["add_set_option", "load_recipe", "matplotlib_missing", "seconds_type", "sizes_type"]


def _parse_assignment(text: str) -> tuple[list[str], object]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError("--set", text, "expected KEY=VALUE, e.g. workload.iterations=100")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word is taken as a string: --set run.clock=virtual
    return key.split("."), value


def _apply_overrides(data: dict[str, Any], assignments: Sequence[str]) -> None:
    for text in assignments:
        path, value = _parse_assignment(text)
        table: Any = data
        for depth, part in enumerate(path[:-1]):
            if isinstance(table, list):
                table = _array_item(table, part, ".".join(path[:depth]), text)
                continue
            table = table.setdefault(part, {})
            if not isinstance(table, dict | list):
                raise ConfigError("--set", text, f"{part} is not a table")
        if isinstance(table, list):
            raise ConfigError("--set", text, f"{'.'.join(path[:-1])} is an array: name an item")
        table[path[-1]] = value


def _array_item(items: list[Any], part: str, where: str, text: str) -> dict[str, Any]:
    """The table of an array of tables (``[[layers]]``) that ``part`` names: its index, or
    the ``kind`` of exactly one of them (``layers.arq.rto_us``)."""
    if part.lstrip("-").isdigit():
        index = int(part)
        if not 0 <= index < len(items):
            raise ConfigError(
                "--set", text, f"{where} has {len(items)} items: no index {index} (0-based)"
            )
        item = items[index]
    else:
        matches = [
            i for i, item in enumerate(items) if isinstance(item, dict) and item.get("kind") == part
        ]
        kinds = [item.get("kind") for item in items if isinstance(item, dict)]
        if not matches:
            raise ConfigError(
                "--set",
                text,
                f"no item of {where} has kind {part!r} (kinds: {kinds}; or give an index)",
            )
        if len(matches) > 1:
            raise ConfigError(
                "--set",
                text,
                f"{len(matches)} items of {where} have kind {part!r} "
                f"(indices {matches}): give an index",
            )
        item = items[matches[0]]
    if not isinstance(item, dict):
        raise ConfigError("--set", text, f"{where}.{part} is not a table")
    return item


def load_recipe(recipe: str, assignments: Sequence[str]) -> Any:
    """The recipe named ``recipe`` with each ``KEY=VALUE`` of ``assignments`` applied before
    validation (a bad one raises :class:`~stacklib.errors.ConfigError`)."""
    from stacklib.recipes import find_recipe, parse_recipe, read_recipe_file

    path = find_recipe(recipe)
    data = read_recipe_file(path)
    _apply_overrides(data, assignments)
    return parse_recipe(data, str(path), path)


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable): the overrides :func:`load_recipe` applies."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe value before validation, KEY=VALUE with a dotted key and a TOML "
        "value, e.g. --set workload.iterations=100; a layer by index or kind: "
        "--set layers.0.rto_us=500 or --set layers.arq.rto_us=500 (repeatable)",
    )


def seconds_type(text: str) -> float:
    """An argparse type for a duration in seconds: a finite number above 0 (``inf`` and
    ``nan`` parse as floats but would wait forever or never)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {text!r}") from None
    if not 0.0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected finite seconds above 0, not {text!r}")
    return value


def sizes_type(example: str) -> Callable[[str], tuple[int, ...]]:
    """An argparse type for comma-separated positive sizes (``example`` shows the form)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            sizes = tuple(int(part) for part in text.split(",") if part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected sizes like {example}, not {text!r}"
            ) from None
        if not sizes or any(size <= 0 for size in sizes):
            raise argparse.ArgumentTypeError(f"sizes must be positive, not {text!r}")
        return sizes

    return parse
