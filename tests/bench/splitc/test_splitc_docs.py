"""docs/splitc.md's tutorial runs: simulated in this process, then as two real processes."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def blocks() -> list[str]:
    text = (REPO / "docs" / "splitc.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_simulated_tutorial_runs() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks()[0], "docs/splitc.md", "exec"), {"__name__": "__main__"})
    assert out.getvalue().startswith("[210.0, 210.0, 210.0, 210.0]")


def test_the_real_tutorial_runs_as_two_ranks(tmp_path: Path) -> None:
    program = tmp_path / "ring.py"
    program.write_text(blocks()[1])
    done = subprocess.run(
        [sys.executable, "-m", "stacklib.launch", "-n", "2", str(program)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # two ranks: rank r holds its left neighbour's r' and 10 r' + 1..3
    assert "sum: 43.0" in done.stdout
