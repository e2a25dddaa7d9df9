"""The text of ``stacklib reproduce``: numbers a person reads, yes/no figures in words,
citations as footnotes, every line within the width, and the closing count."""

from __future__ import annotations

import json

import pytest

from stacklib.reporting.figures import ExperimentResult, Figure
from stacklib.reporting.tables import (
    WIDTH,
    format_figures,
    format_listing,
    format_number,
    format_summary,
    json_entry,
)

LONG_CITE = "paper 004 §4.1.4 and Table 3 " + "say why at some length " * 12
LONG_NAME = (
    "PCA-200 U-Net/MM NI ping-pong: added per one-way trip by a pre-translate miss on arrival"
)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (66.00000000000004, "us", "66 us"),
        (65.11428571428577, "us", "65.11 us"),
        (0.20067727302609745, "us/B", "0.2007 us/B"),
        (123456.7, "us", "123457 us"),  # no exponent for large values either
        (2.9605947323337506e-10, "us", "0 us"),  # below the unit's resolution
        (-2.9605947323337506e-10, "us", "0 us"),  # and never "-0"
        (-0.00001, "", "-0.00001"),
        (-0.0, "ratio", "0 ratio"),
        (0.9787179487179487, "ratio", "0.9787 ratio"),
        (9.99996, "MB/s", "10 MB/s"),
        (5.0, "", "5"),
    ],
)
def test_numbers_have_four_significant_digits_and_no_noise(
    value: float, unit: str, text: str
) -> None:
    assert format_number(value, unit) == text


def test_paper_values_keep_up_to_six_digits() -> None:
    assert format_number(0.9787179487179487, "ratio", 6) == "0.978718 ratio"


def _row(table: str, name: str) -> str:
    (line,) = [line for line in table.splitlines() if line.startswith(name)]
    return line


def test_a_boolean_figure_reads_yes_or_no() -> None:
    table = format_figures(
        "claims",
        [Figure.claim("FM's L drops at 2 KB", True, "c"), Figure.claim("AM wins", False, "c")],
    )
    assert _row(table, "FM's L").split()[-3:] == ["yes", "yes", "[1]"]
    assert _row(table, "AM wins").split() == ["AM", "wins", "yes", "no", "OUTSIDE", "[1]"]
    assert "holds" not in table and "%" not in table


def test_a_boolean_figure_must_be_yes_or_no() -> None:
    with pytest.raises(ValueError, match=r"boolean figure 'x' needs paper and measured 1\.0"):
        Figure("x", 1.0, 0.5, "holds", "c", 0.0, boolean=True)
    claim = Figure.claim("x", False, "c")
    assert (claim.paper, claim.measured, claim.unit, claim.ok) == (1.0, 0.0, "holds", False)
    # A claim the paper says does not hold is met when it does not.
    assert Figure("y", 0.0, 0.0, "holds", "c", 0.0, boolean=True).ok
    assert not Figure("y", 0.0, 1.0, "holds", "c", 0.0, boolean=True).ok


def test_deviations_never_print_minus_zero() -> None:
    table = format_figures(
        "t",
        [
            Figure("tiny below", 100.0, 99.99, "us", "c"),
            Figure("tiny above", 100.0, 100.01, "us", "c"),
            Figure("nothing stated", 0.0, 3e-10, "us", "c"),
        ],
    )
    assert "-0.0%" not in table and "+0.0%" not in table and "-0.00" not in table
    assert _row(table, "tiny below").split()[6] == "0.0%"
    assert _row(table, "nothing stated").split()[2:6] == ["0", "us", "0", "us"]
    assert "e-" not in table


def test_citations_are_numbered_footnotes_shared_by_figures_citing_the_same() -> None:
    table = format_figures(
        "t",
        [
            Figure("a", 1.0, 1.0, "us", "paper 000 §4.1"),
            Figure("b", 1.0, 1.0, "us", "paper 000 Table 3"),
            Figure("c", 1.0, 1.0, "us", "paper 000 §4.1"),
        ],
    )
    lines = table.splitlines()
    assert [line.split()[-1] for line in lines[3:6]] == ["[1]", "[2]", "[1]"]
    assert lines[6:] == ["[1] paper 000 §4.1", "[2] paper 000 Table 3"]


def test_every_line_fits_the_width_however_long_the_names() -> None:
    figures = [
        Figure(LONG_NAME, 0.978718, 0.9940293543165786, "ratio", LONG_CITE, 0.05),
        Figure("short", 125.0, 60.0, "Mbit/s", "c", 0.08, at_least=True),
        Figure.claim(LONG_NAME + " again", True, LONG_CITE),
    ]
    title = "Split-C over UAM: paper 000 Table 3 and Fig 5, paper 003 Tables 1-2 (bulk programs)"
    table = format_figures(title + " [50.9 s]", figures)
    lines = table.splitlines()
    assert max(map(len, lines)) <= WIDTH
    # Nothing is lost to the wrapping: the name and the citation read whole across lines.
    start = next(i for i, line in enumerate(lines) if line.startswith("PCA-200"))
    name = [lines[start].split("  ")[0], *(line.strip() for line in lines[start + 1 : start + 3])]
    assert " ".join(name).startswith(LONG_NAME)
    assert " ".join(LONG_CITE.split()) in " ".join(line.strip() for line in lines)
    assert "OUTSIDE" in _row(table, "short")
    # A narrower table wraps more.
    assert max(map(len, format_figures(title, figures, width=90).splitlines())) <= 90


def test_an_experiment_without_figures_prints_the_headings() -> None:
    assert format_figures("none", []).splitlines()[1].split() == [
        "figure",
        "paper",
        "measured",
        "deviation",
        "tolerance",
        "source",
    ]


def test_the_summary_counts_and_names_those_outside() -> None:
    good = Figure("rtt", 66.0, 66.0, "us", "c")
    bad = Figure("bandwidth at 1 KB", 6.8, 5.0, "MB/s", "c")
    results = {"sba100": ExperimentResult([good, bad]), "uam": ExperimentResult([good])}
    lines = format_summary(results).splitlines()
    assert lines[-1] == "2 of 3 figures within tolerance"
    assert lines[:-1] == [
        "Outside tolerance:",
        "  sba100: bandwidth at 1 KB (measured 5 MB/s, paper 6.8 MB/s)",
    ]
    assert format_summary({"uam": ExperimentResult([good])}) == "1 of 1 figures within tolerance"


def test_a_listing_wraps_descriptions_beside_or_below_the_name() -> None:
    text = format_listing(
        [("short", ["word " * 40, "second paragraph"]), ("a-name-longer-than-the-column", ["d"])],
        column=10,
    )
    lines = text.splitlines()
    assert max(map(len, lines)) <= WIDTH
    assert lines[0].startswith("short       word word")
    assert lines[1].startswith(" " * 12 + "word")
    assert " " * 12 + "second paragraph" in lines
    assert lines[-2:] == ["a-name-longer-than-the-column", " " * 12 + "d"]


def test_json_keeps_every_field_and_adds_the_boolean_flag() -> None:
    entry = json_entry("e", "title", 1.5, ExperimentResult([Figure.claim("x", True, "cite")]))
    (figure,) = json.loads(json.dumps(entry))["figures"]
    assert figure == {
        "name": "x",
        "paper": 1.0,
        "measured": 1.0,
        "unit": "holds",
        "cite": "cite",
        "tolerance": 0.0,
        "at_least": False,
        "boolean": True,
        "deviation": 0.0,
        "ok": True,
    }
