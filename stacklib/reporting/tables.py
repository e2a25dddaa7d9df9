"""Paper against measured, as text: the table per experiment and the JSON report of
``stacklib reproduce``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from stacklib.reporting.figures import ExperimentResult, Figure

__all__ = ["format_figures", "json_entry", "json_report"]


def format_figures(title: str, figures: Sequence[Figure]) -> str:
    """A paper-vs-measured table."""
    headings = ("figure", "paper", "measured", "deviation", "tolerance", "source")
    rows = [
        (
            f.name,
            f"{f.paper:g} {f.unit}",
            f"{f.measured:.4g} {f.unit}",
            f"{f.deviation:+.1%}",
            (f"≥ -{f.tolerance:.0%}" if f.at_least else f"±{f.tolerance:.0%}")
            + ("" if f.ok else "  OUTSIDE"),
            f.cite,
        )
        for f in figures
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headings)]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(headings, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
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
