"""Recipes: strict validation with errors naming file, key and reason; running; determinism."""

from __future__ import annotations

from pathlib import Path

import pytest

from stacklib.errors import ConfigError
from stacklib.recipes import list_recipes, load_recipe, parse_recipe, run_recipe

REPO_RECIPES = Path(__file__).resolve().parents[2] / "stacklib" / "recipes"

MINIMAL = {
    "transport": {"kind": "memory"},
    "workload": {"kind": "pingpong", "sizes": [8], "iterations": 5, "warmup": 1},
}


def with_(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {k: dict(v) for k, v in MINIMAL.items()}  # type: ignore[call-overload]
    for dotted, value in changes.items():
        section, _, key = dotted.partition("__")
        if key:
            data.setdefault(section, {})[key] = value  # type: ignore[index]
        else:
            data[section] = value
    return data


@pytest.mark.parametrize(
    ("data", "key", "reason"),
    [
        (with_(colour="blue"), "colour", "unknown key"),
        (with_(transport__latency_us="fast"), "transport.latency_us", "expected a number"),
        (with_(transport__latncy_us=1.0), "transport.latncy_us", "unknown key"),
        (with_(transport__kind="carrier-pigeon"), "transport.kind", "no transport named"),
        (with_(transport__latency_us=-1.0), "transport", "latency_us"),
        (with_(workload__iterations=0), "workload", "iterations"),
        (with_(workload__sizes=[1, "x"]), "workload.sizes[1]", "expected an integer"),
        (with_(workload__kind="nap"), "workload.kind", "no workload named"),
        (with_(run={"clock": "sundial"}), "run.clock", "must be one of"),
        (with_(endpoint={"rx_buffers": True}), "endpoint.rx_buffers", "expected an integer"),
        (with_(endpoint={"emulated": "yes"}), "endpoint.emulated", "true or false"),
        (with_(layers=[{"kind": "nonesuch"}]), "layers[0].kind", "no layer named"),
        (with_(layers={"kind": "x"}), "layers", "array of tables"),
        (
            with_(host={"profile": {"name": "p", "ops": {"x": {"fixed_us": 1}}}}),
            "host.profile",
            "resource",
        ),
    ],
)
def test_bad_values_name_file_key_and_reason(
    data: dict[str, object], key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_recipe(data, "bad.toml")
    message = str(caught.value)
    assert message.startswith("bad.toml: ")
    assert key in message and reason in message


def test_invalid_toml_and_missing_recipe(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("transport = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_recipe(broken)
    with pytest.raises(ConfigError, match="no such recipe"):
        load_recipe("no-such-recipe-anywhere")


def test_every_shipped_recipe_loads() -> None:
    names = [name for name, _, _ in list_recipes()]
    assert "unet-memory-pingpong" in names
    for path in sorted(REPO_RECIPES.glob("*.toml")):
        recipe = load_recipe(path)
        assert recipe.description, f"{path.name} has no description"


def test_running_a_recipe_in_real_time() -> None:
    result = run_recipe(parse_recipe(MINIMAL, "inline"))
    assert [row["size"] for row in result.rows] == [8]
    assert result.facts["clock"] == "real"


def test_virtual_time_recipe_charges_table1_costs_exactly() -> None:
    recipe = load_recipe(REPO_RECIPES / "memory-table1-virtual.toml")
    result = run_recipe(recipe)
    # paper 000 Table 1: 7 us send + 21 us across the switch + 5 us receive, each way.
    assert [row["rtt_us"] for row in result.rows] == pytest.approx([66.0, 66.0])


def test_same_recipe_and_seed_same_numbers() -> None:
    recipe = load_recipe(REPO_RECIPES / "memory-table1-virtual.toml")
    first = run_recipe(recipe)
    second = run_recipe(recipe)
    assert first.rows == second.rows
    assert first.facts["seed"] == second.facts["seed"] == 1
