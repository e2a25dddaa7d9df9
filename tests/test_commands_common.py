"""Helpers the ``stacklib`` subcommands share (stacklib/commands/_common.py)."""

from __future__ import annotations

import argparse
import sys

import pytest

from stacklib.commands._common import (
    add_set_option,
    load_recipe,
    matplotlib_missing,
    sizes_type,
)
from stacklib.errors import ConfigError


def test_sizes_parse_and_reject_bad_input() -> None:
    parse = sizes_type("40,1000")
    assert parse("40,1000,") == (40, 1000)
    with pytest.raises(argparse.ArgumentTypeError, match="like 40,1000"):
        parse("forty")
    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        parse("40,0")
    with pytest.raises(argparse.ArgumentTypeError, match="positive"):
        parse(",")


def test_set_overrides_reach_the_recipe() -> None:
    parser = argparse.ArgumentParser()
    add_set_option(parser)
    args = parser.parse_args(["--set", "workload.iterations=7", "--set", "workload.sizes=[8]"])
    recipe = load_recipe("unet-memory-pingpong", args.set)
    assert recipe.workload_params.iterations == 7
    assert tuple(recipe.workload_params.sizes) == (8,)


def test_a_bad_override_names_itself() -> None:
    with pytest.raises(ConfigError, match="no-equals"):
        load_recipe("unet-memory-pingpong", ["no-equals"])


def test_matplotlib_missing_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import raise ImportError
    assert matplotlib_missing("tlbsim", "--plot")
    err = capsys.readouterr().err
    assert "stacklib tlbsim: --plot needs matplotlib" in err
    assert "pip install 'stacklib[plot]'" in err
