"""``--set KEY=VALUE``: overrides applied to a recipe before validation, layers included."""

from __future__ import annotations

import re

import pytest

from stacklib.commands._common import load_recipe
from stacklib.errors import ConfigError


def _uam_window(recipe: object) -> int:
    (_, params), *_ = recipe.layers  # type: ignore[attr-defined]
    return int(params.window)


def test_a_layer_parameter_by_index_and_by_kind() -> None:
    assert _uam_window(load_recipe("unet-atm-uam", [])) == 8
    assert _uam_window(load_recipe("unet-atm-uam", ["layers.0.window=4"])) == 4
    assert _uam_window(load_recipe("unet-atm-uam", ["layers.uam.window=2"])) == 2


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("layers.3.window=4", "layers has 1 items: no index 3"),
        ("layers.-1.window=4", "no index -1"),
        ("layers.arq.window=4", "no item of layers has kind 'arq' (kinds: ['uam']"),
        ("layers.0.windo=4", "layers[0].windo: unknown key"),
        ("layers.uam=4", "layers is an array: name an item"),
        ("layers.0.window=0", "layers[0]: window must be an integer"),
        ("workload=4", "workload"),
        ("nonsense", "expected KEY=VALUE"),
    ],
)
def test_a_bad_override_names_the_problem(assignment: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe("unet-atm-uam", [assignment])


def test_a_kind_shared_by_two_layers_needs_an_index() -> None:
    with pytest.raises(
        ConfigError, match=r"2 items of layers have kind 'arq' \(indices \[0, 1\]\)"
    ):
        load_recipe(
            "unet-memory-pingpong",
            ["layers=[{kind = 'arq'}, {kind = 'arq'}]", "layers.arq.rto_us=5"],
        )
