"""Results of workloads and benchmarks: a titled table with units, printable or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

Cell = int | float | str | None


@attrs.frozen
class Column:
    """A result column: its key in each row, a heading, and a unit."""

    key: str
    heading: str
    unit: str = ""
    #: Decimal places when printing floats.
    digits: int = 1


@attrs.frozen
class Result:
    """A table of measurements plus free-form facts about the run."""

    title: str
    columns: Sequence[Column]
    rows: Sequence[Mapping[str, Cell]]
    facts: Mapping[str, Cell] = attrs.field(factory=dict)
    notes: Sequence[str] = ()

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "title": self.title,
            "columns": [attrs.asdict(c) for c in self.columns],
            "rows": [dict(r) for r in self.rows],
            "facts": dict(self.facts),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format_table(self) -> str:
        """The result as an aligned plain-text table (what ``stacklib run`` prints)."""
        headings = [f"{c.heading} ({c.unit})" if c.unit else c.heading for c in self.columns]
        body = [[_format(row.get(c.key), c.digits) for c in self.columns] for row in self.rows]
        widths = [max([len(h)] + [len(line[i]) for line in body]) for i, h in enumerate(headings)]
        lines = [self.title, ""]
        lines.append("  ".join(h.rjust(w) for h, w in zip(headings, widths, strict=True)))
        lines.append("  ".join("-" * w for w in widths))
        for line in body:
            lines.append("  ".join(v.rjust(w) for v, w in zip(line, widths, strict=True)))
        if self.facts:
            lines.append("")
            for key, value in self.facts.items():
                lines.append(f"{key}: {_format(value, 3)}")
        for note in self.notes:
            lines.append(f"note: {note}")
        return "\n".join(lines)


def _format(value: Cell, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
