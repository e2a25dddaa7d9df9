"""What mypy checks for users of stacklib: a layer's parameters are typed.

mypy is not a test dependency; CI installs it and runs this module again (.ci/run).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _mypy(tmp_path: Path, code: str) -> str:
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (CI installs it)")
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(code))
    out, err, _status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(program)]
    )
    return out + err


@pytest.mark.slow
def test_a_layer_takes_only_its_own_parameters(tmp_path: Path) -> None:
    report = _mypy(
        tmp_path,
        """
        from stacklib.layers.arq import ArqLayer, ArqParams
        from stacklib.layers.uam import UamParams

        good = ArqLayer(ArqParams(rto_us=500.0))
        rto: float = good.params.rto_us
        bad = ArqLayer(UamParams())
        window: int = good.params.window
        """,
    )
    lines = [line for line in report.splitlines() if "error:" in line]
    assert len(lines) == 2, report
    assert 'Argument 1 to "ArqLayer" has incompatible type "UamParams"' in lines[0]
    assert '"ArqParams" has no attribute "window"' in lines[1]
