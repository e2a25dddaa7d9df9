"""The ``stacklib`` command, run as a subprocess the way users run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def stacklib(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stacklib.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=check,
        timeout=600,
    )


@pytest.mark.slow
def test_help_lists_every_command() -> None:
    out = stacklib("--help").stdout
    for command in ("list", "run", "decode", "bench", "reproduce"):
        assert command in out
    for command in ("list", "run", "decode", "bench", "reproduce"):
        sub = stacklib(command, "--help").stdout
        assert "usage: stacklib" in sub and "-h, --help" in sub


def test_list_shows_recipes_with_descriptions() -> None:
    out = stacklib("list").stdout
    assert "unet-memory-pingpong" in out and "memory transport" in out
    listed = json.loads(stacklib("list", "--json").stdout)
    assert {"name", "description", "path"} <= set(listed[0])
    # Long descriptions wrap under their recipe, in a column beside the names.
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == [
        recipe["name"] for recipe in listed
    ]
    assert any(line.startswith(" " * 20) for line in lines)


def test_run_prints_a_table_and_json() -> None:
    out = stacklib("run", "memory-table1-virtual").stdout
    assert "66.00" in out and "round trips/s" in out
    result = json.loads(stacklib("run", "memory-table1-virtual", "--json").stdout)
    assert [round(row["rtt_us"], 6) for row in result["rows"]] == [66.0, 66.0]


def test_run_with_overrides() -> None:
    out = stacklib(
        "run",
        "unet-memory-pingpong",
        "--set",
        "workload.iterations=3",
        "--set",
        "workload.sizes=[40]",
        "--json",
    ).stdout
    assert [row["size"] for row in json.loads(out)["rows"]] == [40]


def test_recipe_error_exits_2_and_names_the_key() -> None:
    done = stacklib("run", "unet-memory-pingpong", "--set", "transport.speed=9", check=False)
    assert done.returncode == 2
    assert "transport.speed" in done.stderr and "unknown key" in done.stderr
    done = stacklib("run", "no-such-recipe", check=False)
    assert done.returncode == 2 and "no such recipe" in done.stderr


@pytest.mark.parametrize(
    ("fmt", "hexdata", "expected"),
    [
        ("atm-cell", "0000000152" + "6a" * 48, "vci"),
    ],
)
def test_decode(fmt: str, hexdata: str, expected: str) -> None:
    out = stacklib("decode", fmt, hexdata).stdout
    assert expected in out.lower()


def test_decode_lists_formats_and_rejects_garbage() -> None:
    out = stacklib("decode", "--list").stdout
    assert "unet-eth" in out and "atm-cell" in out
    done = stacklib("decode", "unet-eth", "00", check=False)
    assert done.returncode == 2 and "stacklib:" in done.stderr
    done = stacklib("decode", "unet-eth", "zz", check=False)
    assert done.returncode == 2 and "not hexadecimal" in done.stderr
    done = stacklib("decode", "no-format", "00", check=False)
    assert done.returncode == 2


def test_bench_core_runs_small() -> None:
    result = json.loads(
        stacklib("bench", "core", "--iterations", "200", "--repeat", "1", "--json").stdout
    )
    assert result["facts"]["ratio_unet_to_trio"] > 0


def test_bench_workload_on_a_transport() -> None:
    done = stacklib(
        "bench", "pingpong", "--transport", "memory", "--sizes", "40",
        "--iterations", "20", "--compare", "kernel", "--json",
    )  # fmt: skip
    result = json.loads(done.stdout)
    assert [row["path"] for row in result["rows"]] == ["memory", "kernel-udp", "kernel-tcp"]
    assert all(row["gain"] > 0 for row in result["rows"][1:])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pingpong"], "give a RECIPE or --transport"),
        (["pingpong", "unet-memory-pingpong", "--transport", "shm"], "not both"),
        (["pingpong", "unet-memory-pingpong", "--compare", "kernel"], "apply to --transport runs"),
        (["pingpong", "--transport", "shm", "--netns"], "--netns applies to udp, ether and xdp"),
        (["pingpong", "--transport", "memory", "--sizes", "-1"], "pingpong"),
    ],
)
def test_bench_transport_misuse_exits_2(args: list[str], message: str) -> None:
    done = stacklib("bench", *args, check=False)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


@pytest.mark.parametrize(
    "words",
    [["--only", "sba100", "uam"], ["--only", "sba100", "--only", "uam"], ["--only", "sba100"]],
)
def test_reproduce_only_takes_several_names_either_way(words: list[str]) -> None:
    from stacklib.cli import build_parser

    args = build_parser(["reproduce"]).parse_args(["reproduce", *words])
    assert args.only == [w for w in words if w != "--only"]


def test_reproduce_help_names_the_experiments(capsys: pytest.CaptureFixture[str]) -> None:
    from stacklib.cli import main
    from stacklib.reporting.figures import EXPERIMENTS

    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    assert "Experiments: " + ", ".join(EXPERIMENTS) + "." in text
    assert "stacklib reproduce --list" in text


def test_reproduce_list_describes_without_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import stacklib.reproduce
    from stacklib.cli import main

    def run_experiments(**options: object) -> int:
        raise AssertionError("--list runs nothing")

    monkeypatch.setattr(stacklib.reproduce, "run_experiments", run_experiments)
    assert main(["reproduce", "--list", "--only", "sba100", "splitc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sba100  SBA-100: U-Net by traps")
    assert lines[1] == "        under 1 s"
    assert lines[2].startswith("splitc  Split-C over UAM")
    assert any(line.strip().startswith("about") and "; --full: " in line for line in lines)
    assert max(map(len, lines)) <= 100


@pytest.mark.parametrize("full", [False, True])
def test_reproduce_passes_its_options_on(monkeypatch: pytest.MonkeyPatch, full: bool) -> None:
    import stacklib.reproduce
    from stacklib.cli import main

    seen: dict[str, object] = {}

    def run_experiments(**options: object) -> int:
        seen.update(options)
        return 0

    monkeypatch.setattr(stacklib.reproduce, "run_experiments", run_experiments)
    argv = ["reproduce", "--only", "splitc", "--json"] + (["--full", "--quiet"] if full else [])
    assert main(argv) == 0
    assert seen == {
        "only": ["splitc"],
        "as_json": True,
        "plots": None,
        "everything": False,
        "full": full,
        "quiet": full,
    }
