"""``import stacklib``: the working set, imported on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import stacklib


@pytest.mark.parametrize("name", [n for n in stacklib.__all__ if not n.startswith("_")])
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(stacklib, name) is not None or name == "COMPILED"


def test_the_names_are_the_modules_own() -> None:
    from stacklib.services import ActiveMessageService
    from stacklib.stack import Layer, open_stack

    assert stacklib.Layer is Layer
    assert stacklib.open_stack is open_stack
    assert stacklib.ActiveMessageService is ActiveMessageService
    assert set(stacklib.__all__) <= set(dir(stacklib))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        stacklib.nothing_here  # noqa: B018


def test_importing_stacklib_imports_nothing_else() -> None:
    code = "import json, sys, stacklib; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = [m for m in json.loads(done.stdout) if m.startswith("stacklib")]
    assert loaded == ["stacklib"]
