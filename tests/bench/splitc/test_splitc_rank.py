"""The Split-C rank program: its UAM parameters and the JSON line rank 0 prints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stacklib.bench.splitc.rank import RTO_US, START_UP_S, uam_params


def test_uam_params_outlast_the_start_up() -> None:
    params = uam_params()
    assert params.rto_us == RTO_US
    assert params.rto_us * (params.max_retries + 1) * 1e-6 >= START_UP_S
    assert uam_params(4000.0).max_retries == round(START_UP_S * 1e6 / 4000.0)
    with pytest.raises(ValueError, match="rto_us must be positive"):
        uam_params(0.0)


@pytest.mark.slow
def test_rank_zero_prints_results_and_protocol_counters() -> None:
    code = (
        "import sys; from stacklib.launch import spawn; "
        "sys.exit(spawn(2, 'stacklib.bench.splitc.rank', ['ssortlg', '--small'], "
        "transport='shm'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads([line for line in done.stdout.splitlines() if line.startswith("[")][-1])
    assert len(rows) == 2
    for ok, total, compute, sent, resent, timeouts, dropped in rows:
        assert ok is True and 0 <= compute <= total
        assert sent > 0 and resent >= 0 and timeouts >= 0 and dropped >= 0
