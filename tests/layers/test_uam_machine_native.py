"""The UAM machine's scripted tests (test_uam_machine.py) again, on the C core.

Every test of that module runs here a second time with its ``UamMachine`` replaced by the
machine over the C core (``_uamcore.c``, compiled into a temporary directory as
test_uam_machine_core.py does; skipped where it cannot be built).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stacklib.layers.uam.machine import UamMachine, machine_class
from tests.layers import test_uam_machine as scripted
from tests.layers.test_uam_machine import *  # noqa: F403 - the same tests, collected here
from tests.layers.test_uam_machine_core import build_c_core


@pytest.fixture(scope="module")
def native_class(tmp_path_factory: pytest.TempPathFactory) -> type[UamMachine]:
    return machine_class(build_c_core(tmp_path_factory.mktemp("uamcore")))


@pytest.fixture(autouse=True)
def on_the_c_core(
    native_class: type[UamMachine], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.setattr(scripted, "UamMachine", native_class)
    yield
    assert scripted.UamMachine is native_class  # every test above ran on the C core


def test_the_scripted_tests_run_on_the_c_core(native_class: type[UamMachine]) -> None:
    assert scripted.machine().native
