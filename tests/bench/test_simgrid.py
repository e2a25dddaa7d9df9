"""Export of LogP parameters to SimGrid, and a SimGrid replay of the ping-pong."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stacklib.bench.simgrid import (
    REPLAY_SCRIPT,
    evaluate,
    export_logp,
    factors,
    piecewise_linear,
)
from stacklib.experiments.myrinet import logp_of

SIZES = (4, 64, 1024, 4096)


def test_piecewise_linear_passes_through_every_point() -> None:
    points = [(4, 1e-6), (64, 2e-6), (1024, 10e-6), (4096, 40e-6)]
    spec = piecewise_linear(points)
    assert spec.startswith("0:")
    for size, value in points:
        assert evaluate(spec, size) == pytest.approx(value)
    assert evaluate(spec, 8192) == pytest.approx(40e-6 + 4096 * 30e-6 / 3072)
    assert evaluate(factors([(4, 2.0), (1024, 1.5)]), 2000) == 1.5


def test_export_describes_two_hosts_and_the_measured_overheads() -> None:
    result = logp_of("vmmc", SIZES)
    export = export_logp(result)
    assert export.platform_xml.count("<host ") == 2 and "<route " in export.platform_xml
    rows = {int(row["size"]): row for row in result.rows}  # type: ignore[arg-type]
    for size in SIZES:
        os_us = rows[size]["os_us"]
        assert isinstance(os_us, float)
        assert evaluate(export.options["smpi/os"], size) == pytest.approx(os_us * 1e-6)
    assert export.options["network/model"] == "CM02"


def test_export_refuses_a_result_without_latency() -> None:
    result = logp_of("vmmc", (4,))
    with pytest.raises(ValueError, match="two sizes"):
        export_logp(result)


def simgrid_python() -> str | None:
    for python in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if python and Path(python).exists():
            done = subprocess.run([python, "-c", "import simgrid"], capture_output=True, timeout=30)
            if done.returncode == 0:
                return python
    return None


def test_a_simgrid_replay_agrees_with_stacklib(tmp_path: Path) -> None:
    python = simgrid_python()
    if python is None:
        pytest.skip("SimGrid's Python module is not installed (Debian: python3-simgrid)")
    export = export_logp(logp_of("pm", SIZES))
    platform, config = export.write(tmp_path)
    script = tmp_path / "replay.py"
    script.write_text(REPLAY_SCRIPT)
    for size in SIZES:
        done = subprocess.run(
            [python, str(script), str(platform), str(config), str(size)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        replayed = float(done.stdout.strip().splitlines()[-1])
        assert replayed == pytest.approx(export.rtt_half[size], rel=0.05), size
