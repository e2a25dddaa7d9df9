"""The README and tutorials stay true: their commands match CI and their examples run."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def code_blocks(path: Path, language: str) -> list[str]:
    text = path.read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second() -> None:
    first_block = code_blocks(REPO / "README.md", "sh")[0].strip().splitlines()
    assert len(first_block) == 2
    install_and_run, install_and_test = first_block
    assert install_and_run.endswith("stacklib reproduce")
    assert "pytest" in install_and_test
    ci = (REPO / ".ci" / "run").read_text()
    assert install_and_test in ci.splitlines()


@pytest.mark.parametrize(
    "document", ["README.md", "docs/tutorial-app.md"], ids=lambda name: name.replace("/", "-")
)
def test_python_examples_run(document: str) -> None:
    blocks = code_blocks(REPO / document, "python")
    assert blocks, f"{document} has no python example"
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, document, "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("transport", ["shm", "udp"])
def test_real_transport_tutorial_program_runs_as_two_ranks(transport: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    program = tmp_path / "pingpong.py"
    program.write_text(code_blocks(REPO / "docs" / "tutorial-real.md", "python")[0])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stacklib.launch",
            "-n",
            "2",
            "--transport",
            transport,
            str(program),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"{transport}: " in done.stdout and "us per 40-byte round trip" in done.stdout
