"""The ``mm-pingpong`` workload: virtual buffers through the U-Net/MM NIs of a recipe add
paper 002 Table 1's costs; its parameters and transports are checked."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from stacklib.errors import ConfigError
from stacklib.recipes import parse_recipe, run_recipe

REPO_RECIPES = Path(__file__).resolve().parents[2] / "stacklib" / "recipes"

#: Table 1's sums per one-way trip (us) with a full TLB: hit, send miss, receive miss (the
#: terms as in stacklib.experiments.mm.integrated_figures).
TABLE1 = {
    "pca200-mm": (1 + 2, 24 + 10 + 11 + 4 + 2, 1 + 24 + 10 + 11 + 4 + 2),
    "dc21140-nt-mm": (1 + 1 + 1, 16 + 4 + 1 + 1, 1 + 37 + 4 + 1),
}
#: Table 1's unpin, which a miss pays only when it evicts an entry.
UNPIN = {"pca200-mm": 4, "dc21140-nt-mm": 4}


def _recipe(name: str, **transport_mm: int) -> dict[str, Any]:
    data = tomllib.loads((REPO_RECIPES / f"{name}.toml").read_text())
    data["transport"]["mm"].update(transport_mm)
    return data


def _added(data: dict[str, Any]) -> dict[str, Any]:
    result = run_recipe(parse_recipe(data, "mm.toml"))
    return {row["mode"]: row for row in result.rows}


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_a_full_tlb_adds_table1s_sums(name: str) -> None:
    rows = _added(_recipe(name, entries=16, victim=8))
    assert rows["segment"]["added_us"] == 0
    hit, send_miss, recv_miss = TABLE1[name]
    assert rows["hit"]["added_us"] == pytest.approx(hit, abs=0.01)
    assert rows["send-miss"]["added_us"] == pytest.approx(send_miss, abs=0.01)
    assert rows["recv-miss"]["added_us"] == pytest.approx(recv_miss, abs=0.01)
    assert rows["hit"]["evictions"] == 0
    assert rows["send-miss"]["evictions"] > 0 and rows["send-miss"]["misses"] >= 24


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_the_papers_tlb_is_not_filled_so_misses_unpin_nothing(name: str) -> None:
    rows = _added(_recipe(name))
    hit, send_miss, recv_miss = TABLE1[name]
    assert rows["hit"]["added_us"] == pytest.approx(hit, abs=0.01)
    assert rows["send-miss"]["evictions"] == rows["recv-miss"]["evictions"] == 0
    assert rows["send-miss"]["added_us"] == pytest.approx(send_miss - UNPIN[name], abs=0.01)
    assert rows["recv-miss"]["added_us"] == pytest.approx(recv_miss - UNPIN[name], abs=0.01)


def test_modes_run_alone_and_without_a_baseline() -> None:
    data = _recipe("pca200-mm")
    data["workload"].update(modes=["hit"], iterations=2, warmup=0)
    rows = _added(data)
    assert list(rows) == ["hit"] and rows["hit"]["added_us"] is None
    assert rows["hit"]["rtt_us"] > 0


def test_a_transport_without_memory_management_is_refused() -> None:
    data = {
        "run": {"clock": "virtual"},
        "transport": {"kind": "sim-atm", "ni": "pca200", "link": "oc-3"},
        "workload": {"kind": "mm-pingpong"},
    }
    with pytest.raises(ConfigError, match="mm-pingpong needs a U-Net/MM transport"):
        run_recipe(parse_recipe(data, "plain.toml"))


@pytest.mark.parametrize(
    ("workload", "reason"),
    [
        ({"modes": ["hit", "swap"]}, "modes must be some of segment, hit, send-miss, recv-miss"),
        ({"modes": []}, "modes must be some of"),
        ({"size": 40}, "size"),
        ({"size": 8192}, "size"),
        ({"iterations": 0}, "iterations"),
    ],
)
def test_bad_parameters_are_config_errors(workload: dict[str, object], reason: str) -> None:
    data = _recipe("pca200-mm")
    data["workload"].update(workload)
    with pytest.raises(ConfigError, match=reason) as caught:
        parse_recipe(data, "bad.toml")
    assert caught.value.key.startswith("workload")
