"""Paper against measured, as text: the table per experiment, the closing summary and the JSON
report of ``stacklib reproduce``, and the name-and-description listings of the command line.

Text is for a person at a terminal: every line fits :data:`WIDTH` columns (long figure names
wrap, citations go below the table as numbered footnotes), numbers have four significant digits
and no exponent, and yes/no figures read "yes"/"no".  The JSON report keeps every field.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from stacklib.reporting.figures import ExperimentResult, Figure

__all__ = [
    "WIDTH",
    "format_figures",
    "format_listing",
    "format_number",
    "format_summary",
    "json_entry",
    "json_report",
    "wrap",
]

#: The widest line the tables and listings print.
WIDTH = 100

#: The smallest value worth printing in a unit; anything smaller is float noise and prints as 0
#: (a flat cost measured as 3e-10 us).  Units not listed resolve to a millionth.
RESOLUTION: Mapping[str, float] = {"us": 1e-3, "ms": 1e-6, "s": 1e-9}


def format_number(value: float, unit: str = "", digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits in plain notation, then the unit: "65.11 us",
    "0.2007 us/B", "0 us" for values below the unit's resolution; never "-0"."""
    if abs(value) < RESOLUTION.get(unit, 1e-6) or not math.isfinite(value):
        text = "0" if math.isfinite(value) else str(value)
    else:
        decimals = max(digits - 1 - math.floor(math.log10(abs(value))), 0)
        text = f"{value:.{decimals}f}"
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        if text.lstrip("-") == "0":
            text = "0"
    return f"{text} {unit}" if unit else text


def _deviation(figure: Figure) -> str:
    if figure.boolean:
        return ""
    if not figure.paper:
        return "-"  # relative to nothing
    text = f"{figure.deviation:+.1%}"
    return "0.0%" if text in ("+0.0%", "-0.0%") else text


def _tolerance(figure: Figure) -> str:
    if figure.boolean:
        bound = ""
    elif figure.at_least:
        bound = f"≥ -{figure.tolerance:.0%}"
    else:
        bound = f"±{figure.tolerance:.0%}"
    return bound if figure.ok else f"{bound} OUTSIDE".lstrip()


def _values(figure: Figure) -> tuple[str, str]:
    if figure.boolean:
        return ("yes" if figure.paper else "no"), ("yes" if figure.measured else "no")
    return format_number(figure.paper, figure.unit, 6), format_number(figure.measured, figure.unit)


def wrap(text: str, width: int = WIDTH, indent: str = "", first: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` columns: the first starts with ``first``, the
    others with ``indent``; words longer than a line are broken."""
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=indent, break_on_hyphens=False
    ) or [first.rstrip()]


def format_figures(title: str, figures: Sequence[Figure], width: int = WIDTH) -> str:
    """A paper-vs-measured table of at most ``width`` columns: the title, a row per figure
    (a long name wraps within its column) and the citations below, numbered (a citation that
    several figures share gets one number)."""
    notes: dict[str, int] = {}
    rows = []
    for f in figures:
        paper, measured = _values(f)
        mark = f"[{notes.setdefault(f.cite, len(notes) + 1)}]"
        rows.append((f.name, paper, measured, _deviation(f), _tolerance(f), mark))
    headings = ("figure", "paper", "measured", "deviation", "tolerance", "source")
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headings)]
    # The name column takes what the others leave, down to a floor where the others are wide.
    widths[0] = min(widths[0], max(width - sum(widths[1:]) - 2 * (len(widths) - 1), 20))
    lines = wrap(title, width, indent="  ")
    lines.append("  ".join(h.ljust(w) for h, w in zip(headings, widths, strict=True)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        name, *more = wrap(row[0], widths[0], indent="  ")
        cells = (name, *row[1:])
        lines.append("  ".join(v.ljust(w) for v, w in zip(cells, widths, strict=True)).rstrip())
        lines += more
    for cite, number in notes.items():
        mark = f"[{number}] "
        lines += wrap(cite, width, indent=" " * len(mark), first=mark)
    return "\n".join(lines)


def format_summary(results: Mapping[str, ExperimentResult], width: int = WIDTH) -> str:
    """The closing lines of ``stacklib reproduce``: the figures outside tolerance by experiment
    (if any), then "N of M figures within tolerance"."""
    outside = [(name, f) for name, result in results.items() for f in result.figures if not f.ok]
    total = sum(len(result.figures) for result in results.values())
    lines = ["Outside tolerance:"] if outside else []
    for name, f in outside:
        paper, measured = _values(f)
        detail = f"{name}: {f.name} (measured {measured}, paper {paper})"
        lines += wrap(detail, width, indent="    ", first="  ")
    lines.append(f"{total - len(outside)} of {total} figures within tolerance")
    return "\n".join(lines)


def format_listing(
    entries: Sequence[tuple[str, Sequence[str]]], width: int = WIDTH, column: int = 24
) -> str:
    """Names and their descriptions, at most ``width`` columns: each description's paragraphs
    wrap in a column beside the name (below it when the name is longer than ``column``)."""
    names = [name for name, _ in entries]
    indent = " " * (min(max(map(len, names), default=0), column) + 2)
    lines: list[str] = []
    for name, paragraphs in entries:
        first = name.ljust(len(indent))
        if len(first) > len(indent):
            lines.append(name)
            first = indent
        for paragraph in paragraphs or [""]:
            lines += wrap(paragraph, width, indent=indent, first=first)
            first = indent
    return "\n".join(lines)


def json_entry(name: str, title: str, wall: float, result: ExperimentResult) -> dict[str, Any]:
    """One experiment in the JSON report: its figures with deviation and verdict, and its
    curves (when it measured any) as ``{name: {x: y}}``."""
    entry: dict[str, Any] = {
        "name": name,
        "title": title,
        "wall_seconds": wall,
        "figures": [
            {**attrs.asdict(f), "deviation": f.deviation, "ok": f.ok} for f in result.figures
        ],
    }
    if result.curves:
        entry["curves"] = {key: dict(points) for key, points in result.curves.items()}
    return entry


def json_report(entries: Sequence[dict[str, Any]]) -> str:
    """The JSON document ``stacklib reproduce --json`` prints."""
    return json.dumps(list(entries), indent=2)
