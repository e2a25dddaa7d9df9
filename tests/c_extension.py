"""Build one of stacklib's C extensions for a test that runs it against its Python reference."""

from __future__ import annotations

import collections.abc
import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stacklib.compiled import _compile_c, package_dir


def load_c_extension(relative: str, work: Path, what: str) -> ModuleType:
    """Compile the package's C source ``relative`` (with the headers beside it, and the
    package's shared ones) in ``work`` with the compiler ``stacklib compile`` uses, and import
    it; ``pytest.skip`` naming ``what`` where it cannot be built."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip(f"no C compiler: {what} cannot be built here")
    original = package_dir() / relative
    for part in original.parent.glob("*.[ch]"):  # the source and its headers
        shutil.copy(part, work / part.name)
    try:
        built = _compile_c(work / original.name, package_dir())
    except RuntimeError as error:
        pytest.skip(f"{what} does not build here: {error}")
    spec = importlib.util.spec_from_file_location(original.stem, built)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop(original.stem, None)
    return module


def load_quick(work: Path) -> Any:
    """``quick`` of ``unet/_quickawait.c``, built in ``work``, its awaitables registered as
    coroutines (as :data:`stacklib.unet.polled.QUICK` registers them)."""
    module = load_c_extension("unet/_quickawait.c", work, "the quick awaitable")
    collections.abc.Coroutine.register(module.QuickAwait)
    return module.quick
