"""``bench real`` on the pure modules and the compiled copy: which runs, where, and the rows."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

import stacklib
from stacklib import compiled
from stacklib.bench import engines, real
from stacklib.bench.engines import PURE, Engine
from stacklib.cli import main


@pytest.fixture
def a_copy(monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setattr(stacklib, "COMPILED", None)
    monkeypatch.setattr(compiled, "available", lambda: Path("/copy"))
    return Engine("compiled", "/copy")


def test_compiled_rows_by_default_where_a_copy_exists(a_copy: Engine) -> None:
    assert engines.engines(pure=False) == [PURE, a_copy]
    assert engines.engines(pure=True) == [PURE]


def test_pure_only_without_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacklib, "COMPILED", None)
    monkeypatch.setattr(compiled, "available", lambda: None)
    assert engines.engines(pure=False) == [PURE]


def test_prepare_builds_a_copy_unless_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    lines: list[str] = []
    monkeypatch.setattr(stacklib, "COMPILED", None)
    monkeypatch.setattr(compiled, "available", lambda: None)
    monkeypatch.setattr(compiled, "can_build", lambda: True)
    monkeypatch.setattr(compiled, "build", lambda progress=None: built.append(1))
    engines.prepare(True, lines.append)
    assert (built, lines) == ([], [])
    engines.prepare(False, lines.append)
    assert built == [1] and "compiling" in lines[-1]
    monkeypatch.setattr(compiled, "can_build", lambda: False)
    engines.prepare(False, lines.append)
    assert built == [1] and "pip install 'stacklib[fast]'" in lines[-1]


def _environment_seen() -> float:
    return float(os.environ[compiled.ENVIRONMENT])


def test_this_process_measures_its_own_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacklib, "COMPILED", None)
    monkeypatch.delenv(compiled.ENVIRONMENT, raising=False)
    # The peers a measurement spawns inherit the environment: they run the pure modules too.
    assert engines.measure(PURE, _environment_seen) == 0.0
    assert compiled.ENVIRONMENT not in os.environ


def test_a_worker_that_runs_other_modules_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacklib, "COMPILED", None)
    # No copy there: the spawned worker warns and runs the pure modules, so its figure would
    # be mislabelled.
    with pytest.raises(RuntimeError, match="ran the modules in None"):
        engines.measure(Engine("compiled", "/nonexistent-copy"), time.perf_counter)


def test_bench_real_puts_each_compiled_row_after_its_pure_row(
    a_copy: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake(engine: Engine, fn: Any, *args: object) -> float:
        return 2e-6 if engine.copy is None else 1e-6

    monkeypatch.setattr(real, "measure", fake)
    monkeypatch.setattr(real, "udp_pingpong", lambda *args: 20e-6)
    result = real.bench_real(iterations=20, repeat=1, only=["shm", "udp", "bulk"])
    names = [str(row["measurement"]) for row in result.rows]
    assert names == [
        "40 B ping-pong, shm, busy-poll (2 CPUs)",
        "40 B ping-pong, shm, busy-poll (2 CPUs), compiled",
        "40 B ping-pong, kernel UDP, blocking sockets (2 CPUs)",
        "bulk bandwidth, shm, 64 KiB messages",
        "bulk bandwidth, shm, 64 KiB messages, compiled",
    ]
    assert [row["value"] for row in result.rows[:2]] == pytest.approx([2.0, 1.0])
    assert any("compiled: both processes run the mypyc copy in /copy" in n for n in result.notes)
    pure = real.bench_real(iterations=20, repeat=1, only=["shm"], pure=True)
    assert [row["measurement"] for row in pure.rows] == names[:1]


def test_the_command_builds_first_and_passes_pure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[str, bool]] = []
    monkeypatch.setattr(engines, "prepare", lambda pure, progress: calls.append(("prep", pure)))

    def bench(**kwargs: Any) -> Any:
        calls.append(("bench", kwargs["pure"]))
        return real.Result(title="t", columns=[], rows=[], facts={}, notes=[])

    monkeypatch.setattr(real, "bench_real", bench)
    assert main(["bench", "real", "--only", "shm", "--repeat", "1"]) == 0
    assert main(["bench", "real", "--only", "shm", "--pure"]) == 0
    assert main(["bench", "real", "--only", "udp1"]) == 0  # nothing to compile: no build
    assert calls == [
        ("prep", False),
        ("bench", False),
        ("prep", True),
        ("bench", True),
        ("bench", False),
    ]
