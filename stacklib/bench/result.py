"""Results of workloads and benchmarks: a titled table with units, printable or JSON."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence

import attrs

Cell = int | float | str | None

#: The columns a table aims to fit (as stacklib reproduce's do).
WIDTH = 100


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

    def format_table(self, width: int = WIDTH) -> str:
        """The result as an aligned plain-text table (what ``stacklib run`` prints): numbers
        right-aligned, text left-aligned; the widest text column wraps, and notes wrap, so a
        line stays within ``width`` columns where the numbers leave room."""
        headings = [f"{c.heading} ({c.unit})" if c.unit else c.heading for c in self.columns]
        body = [[_format(row.get(c.key), c.digits) for c in self.columns] for row in self.rows]
        text = [
            any(isinstance(row.get(c.key), str) for row in self.rows)
            and all(not isinstance(row.get(c.key), int | float) for row in self.rows)
            for c in self.columns
        ]
        widths = [max([len(h)] + [len(line[i]) for line in body]) for i, h in enumerate(headings)]
        spare = width - (sum(widths) + 2 * (len(widths) - 1))
        texts = [i for i, is_text in enumerate(text) if is_text]
        if spare < 0 and texts:
            # The widest text column gives up what the line is over, down to a floor.
            widest = max(texts, key=lambda i: widths[i])
            widths[widest] = max(widths[widest] + spare, len(headings[widest]), 16)
        lines = [self.title, ""]

        def cells(values: list[str]) -> str:
            return "  ".join(
                (v.ljust(w) if is_text else v.rjust(w))
                for v, w, is_text in zip(values, widths, text, strict=True)
            ).rstrip()

        lines.append(cells(headings))
        lines.append("  ".join("-" * w for w in widths))
        for line in body:
            wrapped = [
                textwrap.wrap(v, w, subsequent_indent="  ", break_on_hyphens=False) or [""]
                if is_text and len(v) > w
                else [v]
                for v, w, is_text in zip(line, widths, text, strict=True)
            ]
            for k in range(max(map(len, wrapped))):
                lines.append(cells([(part[k] if k < len(part) else "") for part in wrapped]))
        if self.facts:
            lines.append("")
            for key, value in self.facts.items():
                lines.append(f"{key}: {_format(value, 3)}")
        for note in self.notes:
            lines += textwrap.wrap(f"note: {note}", width, subsequent_indent="  ") or ["note:"]
        return "\n".join(lines)


def _format(value: Cell, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
