"""Export of LogP parameters to SimGrid, replayed by SimGrid's own ``smpirun``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stacklib import cli
from stacklib.bench import smpirun
from stacklib.bench.alltoall import alltoall
from stacklib.bench.simgrid import (
    SMPI_ENVELOPE,
    evaluate,
    export_logp,
    factors,
    piecewise_linear,
)
from stacklib.bench.simgrid_scale import bench_simgrid
from stacklib.experiments.myrinet import LOGP_SIZES, logp_of

LIBRARIES = ("am", "bip", "fm", "pm", "vmmc")


def test_piecewise_linear_passes_through_every_point() -> None:
    points = [(4, 1e-6), (64, 2e-6), (1024, 10e-6), (4096, 40e-6)]
    spec = piecewise_linear(points)
    assert spec.startswith("0:")
    for size, value in points:
        assert evaluate(spec, size) == pytest.approx(value)
    assert evaluate(spec, 8192) == pytest.approx(40e-6 + 4096 * 30e-6 / 3072)


def test_factors_reach_each_size_on_the_wire() -> None:
    # SMPI looks factors up by message + envelope, taking the last threshold below it.
    spec = factors([(4, 2.0), (255, 3.0), (256, 1.5)])
    assert spec == f"0:2;{4 + SMPI_ENVELOPE}:3;{255 + SMPI_ENVELOPE}:1.5"
    for size, value in ((4, 2.0), (255, 3.0), (256, 1.5), (9000, 1.5)):
        assert evaluate(spec, size + SMPI_ENVELOPE) == value


def test_export_is_a_cluster_of_n_hosts_with_only_simgrid_keys(tmp_path: Path) -> None:
    export = export_logp(logp_of("vmmc"), hosts=1024)
    assert 'radical="0-1023"' in export.platform_xml
    assert 'sharing_policy="SPLITDUPLEX"' in export.platform_xml
    assert export.options["network/model"] == "SMPI"
    assert all(key.split("/")[0] in ("network", "smpi") for key in export.options)
    platform, config = export.write(tmp_path)
    lines = config.read_text().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == list(export.options)
    for key, value in export.options.items():  # the <config> block carries the same options
        assert f'<prop id="{key}" value="{value}"/>' in platform.read_text()
    sidecar = json.loads((tmp_path / "stacklib.json").read_text())
    assert sidecar["method"].startswith("separate") and "4" in sidecar["rtt_half"]


def test_fm_negative_latency_is_folded_into_the_overheads() -> None:
    result = logp_of("fm")
    row = next(r for r in result.rows if r["size"] == 4096)
    assert isinstance(row["l_us"], float) and row["l_us"] < 0.0  # paper 004 §4.1.5's overlap
    # With the gaps charged (g = gr = Or at 4 KB) the deficit grows, and still folds away.
    charged = export_logp(result)
    assert charged.folded[4096] > -row["l_us"] * 1e-6
    o_s = evaluate(charged.options["smpi/os"], 4096) + evaluate(charged.options["smpi/or"], 4096)
    assert o_s == pytest.approx(charged.rtt_half[4096])
    export = export_logp(result, gaps=False)
    assert export.folded[4096] == pytest.approx(-row["l_us"] * 1e-6)
    o_s = evaluate(export.options["smpi/os"], 4096)
    o_r = evaluate(export.options["smpi/or"], 4096)
    assert 0.0 < o_s < row["os_us"] * 1e-6 and 0.0 < o_r < row["or_us"] * 1e-6  # type: ignore[operator]
    # The link takes nothing at 4 KB, so the overheads alone make RTT/2.
    assert o_s + o_r == pytest.approx(export.rtt_half[4096])
    assert evaluate(export.options["smpi/lat-factor"], 4096 + SMPI_ENVELOPE) == 0.0
    assert "folded into Os and Or" in export.platform_xml


def test_export_refuses_a_result_without_latency() -> None:
    result = logp_of("vmmc", (4,))
    with pytest.raises(ValueError, match="two sizes"):
        export_logp(result)


def test_alltoall_counts_what_a_library_without_flow_control_drops() -> None:
    run = alltoall("bip", 16)  # 15 senders fill the small-message slots of BIP's NI
    assert not run.complete and math.isnan(run.seconds)
    with pytest.raises(ValueError, match="no library"):
        alltoall("gm", 4)
    with pytest.raises(ValueError, match="two nodes"):
        alltoall("pm", 1)


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped MPI programs, compiled once with ``smpicc``."""
    reason = smpirun.missing_tools()
    if reason is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("smpi")
    return {name: smpirun.compile_program(name, folder) for name in smpirun.PROGRAMS}


@pytest.mark.parametrize("library", LIBRARIES)
def test_smpirun_replays_the_ping_pong(
    library: str, programs: dict[str, Path], tmp_path: Path
) -> None:
    export = export_logp(logp_of(library))
    platform, _ = export.write(tmp_path)
    replayed = smpirun.replay_pingpong(programs["pingpong"], platform, LOGP_SIZES)
    for size in LOGP_SIZES:
        assert replayed[size] == pytest.approx(export.rtt_half[size], rel=0.05), size


def test_smpirun_takes_the_cfg_on_the_command_line(
    programs: dict[str, Path], tmp_path: Path
) -> None:
    # A platform of one's own (no <config> block) and the .cfg's lines as --cfg options.
    export = export_logp(logp_of("fm"))
    platform, config = export.write(tmp_path)
    text = platform.read_text()
    bare = tmp_path / "bare.xml"
    bare.write_text(text[: text.index("  <config>")] + text[text.index("</config>") + 10 :])
    assert "<config>" not in bare.read_text()
    options = [f"--cfg={line}" for line in config.read_text().splitlines()]
    done = smpirun.run(
        programs["pingpong"],
        bare,
        2,
        ["10", "4", "4096"],
        options=[*smpirun.REPLAY_OPTIONS, *options],
    )
    replayed = {int(a): float(b) for a, b in (line.split() for line in done.stdout.splitlines())}
    for size in (4, 4096):
        assert replayed[size] == pytest.approx(export.rtt_half[size], rel=0.05), size


def test_export_charges_the_gaps_and_keeps_the_round_trip() -> None:
    result = logp_of("pm")
    row = next(r for r in result.rows if r["size"] == 4)
    g, gr, o_s, o_r = (float(row[k]) * 1e-6 for k in ("g_us", "gr_us", "os_us", "or_us"))  # type: ignore[arg-type]
    assert g > o_s and gr > o_r  # PM's NI, not its host, sets the pace
    export = export_logp(result)
    assert evaluate(export.options["smpi/os"], 4) == pytest.approx(g)
    assert evaluate(export.options["smpi/or"], 4) == pytest.approx(gr)
    assert export.gaps[4] == pytest.approx(g + gr - o_s - o_r)
    link = export_logp(result, gaps=False)
    assert not link.gaps and evaluate(link.options["smpi/os"], 4) == pytest.approx(o_s)
    # AM's request-reply result has no gr: LogP's one g serves receptions too.
    am = export_logp(logp_of("am"))
    assert evaluate(am.options["smpi/or"], 4) == pytest.approx(evaluate(am.options["smpi/os"], 4))


@pytest.mark.parametrize(
    ("library", "low", "high"),
    # Measured: AM +8.7%, BIP -16.8%, FM -1.4%, PM -3.9%, VMMC +0.5% (docs/myrinet.md).
    [
        ("am", 0.0, 0.10),
        ("bip", -0.20, -0.10),
        ("fm", -0.05, 0.05),
        ("pm", -0.05, 0.05),
        ("vmmc", -0.05, 0.05),
    ],
)
def test_all_to_all_on_8_nodes_agrees_with_stacklib(
    library: str, low: float, high: float, programs: dict[str, Path], tmp_path: Path
) -> None:
    # With the gaps in Os and Or, each rank spends its NI's per-message time one message after
    # another, as stacklib's LANai does.  BIP stays low: its messages arrive before their
    # receives are posted, and a late receive (4.0 us) costs more than LogP's gr (2.7 us).
    platform, _ = export_logp(logp_of(library), hosts=8).write(tmp_path / library)
    simulated, _ = smpirun.replay_alltoall(programs["alltoall"], platform, 8)
    own = alltoall(library, 8)
    assert low < simulated / own.seconds - 1.0 < high


def test_bench_runs_64_nodes_in_simgrid(programs: dict[str, Path], tmp_path: Path) -> None:
    result = bench_simgrid("fm", (8, 64), stacklib_up_to=8, directory=tmp_path)
    eight, sixty_four = result.rows
    assert isinstance(eight["deviation"], float) and abs(eight["deviation"]) < 0.05
    assert "stacklib_us" not in sixty_four
    assert isinstance(sixty_four["simgrid_us"], float)
    assert isinstance(eight["simgrid_us"], float)
    assert sixty_four["simgrid_us"] > 4 * eight["simgrid_us"]
    assert result.facts["pingpong_max_deviation"] < 0.05  # type: ignore[operator]
    assert 'radical="0-63"' in (tmp_path / "fm" / "stacklib.xml").read_text()


@pytest.mark.parametrize(("option", "value"), [("--nodes", "1,8"), ("--size", "1")])
def test_bench_refuses_bad_counts_in_one_line(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["bench", "simgrid", option, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ">= 2" in err[0], err
