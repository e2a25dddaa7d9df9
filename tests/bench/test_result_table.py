"""A benchmark's table as text: numbers right, text left, and lines within 100 columns."""

from __future__ import annotations

from stacklib.bench.result import WIDTH, Column, Result

LONG = "UAM request/reply (4 words), shm, trio await + poller (2 CPUs), compiled"


def _result(measurement: str) -> Result:
    return Result(
        title="a bench",
        columns=[
            Column("measurement", "measurement"),
            Column("value", "value", "us RTT", 2),
            Column("target", "target"),
        ],
        rows=[
            {"measurement": measurement, "value": 48.64, "target": "<= 10 us and >= 10x below"},
            {"measurement": "short", "value": 1234.5, "target": "-"},
        ],
        notes=["compiled: both processes run the mypyc copy in " + "x" * 120],
    )


def test_a_long_text_cell_wraps_so_every_line_fits() -> None:
    wide = LONG + ", " + LONG  # wider than the table may be on its own
    lines = _result(wide).format_table().splitlines()
    assert max(map(len, lines)) <= WIDTH
    rows = [line for line in lines if "48.64" in line]
    assert len(rows) == 1 and rows[0].startswith("UAM request/reply")
    following = lines[lines.index(rows[0]) + 1]
    assert following.startswith("  ") and "48.64" not in following  # the rest of the cell
    assert any(line.startswith("  ") and "xxxx" in line for line in lines)  # a wrapped note


def test_numbers_align_right_and_text_left() -> None:
    lines = _result("short one").format_table().splitlines()
    first, second = (line for line in lines if "short" in line)
    assert first.startswith("short one") and second.startswith("short ")
    assert first.index("48.64") + len("48.64") == second.index("1,234.50") + len("1,234.50")
    assert "<= 10 us" in first and first.index("<= 10 us") == second.index("-")


def test_a_table_that_fits_is_not_wrapped() -> None:
    lines = _result("short one").format_table(width=200).splitlines()
    assert sum("short" in line for line in lines) == 2
