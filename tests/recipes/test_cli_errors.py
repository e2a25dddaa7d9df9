"""Bad input on the command line ends in exit status 2 and one line on stderr naming the
problem, never a traceback; Ctrl-C ends a run with status 130."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stacklib import cli
from stacklib.bench.params import MAX_COUNT

REPO = Path(__file__).resolve().parents[2]


def fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``stacklib ARGS`` in this process; it must exit 2 with a one-line message."""
    status = cli.main(list(args))
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stacklib: "), err
    return lines[0]


def test_a_pingpong_size_above_the_stack_maximum(capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(
        capsys,
        "run",
        "unet-memory-pingpong",
        "--set",
        "workload.sizes=[70000]",
        "--set",
        "workload.iterations=2",
    )
    assert "70000" in line and "65535" in line and "workload: sizes" in line


def test_a_recipe_that_is_not_utf8(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    recipe = tmp_path / "latin1.toml"
    recipe.write_bytes('description = "caf\u00e9"\n'.encode("latin-1"))
    line = fails(capsys, "run", str(recipe))
    assert str(recipe) in line and "not UTF-8" in line


def test_list_survives_a_recipe_that_is_not_utf8(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "latin1.toml").write_bytes(b'description = "caf\xe9"\n')
    monkeypatch.setenv("STACKLIB_RECIPES", str(tmp_path))
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "latin1" in out and "unreadable: not UTF-8" in out


def test_tlbsim_on_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nothing.trace"
    line = fails(capsys, "tlbsim", str(missing))
    assert str(missing) in line and "No such file" in line


def test_trace_show_on_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nothing.trace"
    assert str(missing) in fails(capsys, "trace", "show", str(missing))


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_non_finite_float(capsys: pytest.CaptureFixture[str], value: str) -> None:
    line = fails(
        capsys,
        "run",
        "unet-memory-pingpong",
        "--set",
        f"transport.latency_us={value}",
        "--set",
        "workload.iterations=2",
    )
    assert "transport.latency_us" in line and "finite" in line


def test_bench_logp_with_default_sizes_beyond_fast_ethernet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = fails(capsys, "bench", "logp", "fe-hub")
    assert "1497" in line and "--sizes" in line


def test_bench_logp_with_sizes_that_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "logp", "fe-hub", "--sizes", "40", "--iterations", "5"]) == 0
    assert "Os" in capsys.readouterr().out


def test_myrinet_capture_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pcap = tmp_path / "m.pcap"
    line = fails(capsys, "run", "myrinet", "--pcap", str(pcap))
    assert "myrinet links have no capture format" in line
    assert not pcap.exists()


def test_a_capture_file_that_cannot_be_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pcap = tmp_path / "no-such-folder" / "fe.pcap"
    line = fails(capsys, "run", "fe-hub", "--pcap", str(pcap), "--set", "workload.iterations=1")
    assert str(pcap) in line


@pytest.mark.parametrize("key", ["iterations", "warmup"])
def test_a_huge_count_is_refused(capsys: pytest.CaptureFixture[str], key: str) -> None:
    line = fails(capsys, "run", "fe-hub", "--set", f"workload.{key}={10**12}")
    assert f"workload: {key}" in line and f"{MAX_COUNT:,}" in line


@pytest.mark.parametrize(
    ("recipe", "key"),
    [("udp-fe", "iterations"), ("pca200-mm", "iterations"), ("tcp-fe", "rtt_iterations")],
)
def test_every_workload_bounds_its_counts(
    capsys: pytest.CaptureFixture[str], recipe: str, key: str
) -> None:
    line = fails(capsys, "run", recipe, "--set", f"workload.{key}={10**12}")
    assert f"workload: {key}" in line and f"{MAX_COUNT:,}" in line


def test_a_udp_size_above_the_path_limit(capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(capsys, "run", "udp-fe", "--set", "workload.sizes=[1470]")
    assert "1470" in line and "1469" in line


def test_bench_iterations_are_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(capsys, "bench", "pingpong", "fe-hub", "--iterations", str(MAX_COUNT + 1))
    assert "iterations" in line and f"{MAX_COUNT:,}" in line


@pytest.mark.parametrize("grouped", [False, True])
def test_ctrl_c_stops_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, grouped: bool
) -> None:
    import stacklib.recipes

    def interrupted(*args: object, **kwargs: object) -> None:
        if grouped:  # as it leaves a nursery
            raise BaseExceptionGroup("run", [KeyboardInterrupt()])
        raise KeyboardInterrupt

    monkeypatch.setattr(stacklib.recipes, "run_recipe", interrupted)
    assert cli.main(["run", "fe-hub"]) == 130
    assert capsys.readouterr().err == "stacklib: interrupted\n"


def test_an_unexpected_error_still_shows_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only errors of the input are reported in one line: a bug stays visible."""
    import stacklib.recipes

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(stacklib.recipes, "run_recipe", broken)
    with pytest.raises(ZeroDivisionError):
        cli.main(["run", "fe-hub"])


def test_as_a_subprocess_no_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.trace"
    done = subprocess.run(
        [sys.executable, "-m", "stacklib.cli", "tlbsim", str(missing)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and str(missing) in done.stderr


@pytest.mark.parametrize("text", ["inf", "nan", "0", "-1", "soon"])
def test_seconds_on_the_command_line_are_finite_and_positive(text: str) -> None:
    import argparse

    from stacklib.commands._common import seconds_type

    assert seconds_type("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        seconds_type(text)
