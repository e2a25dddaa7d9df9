"""The plots draw results: PNG files from plain data, no simulation; ``stacklib reproduce
--plots`` draws those of the experiments that ran, or explains a missing matplotlib."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stacklib.reporting.figures import ExperimentResult, Figure
from stacklib.reproduce import run_experiments
from stacklib.unet.mm.tlbsim import TlbSimResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_MAGIC) and len(data) > 1000


def _line(value: float, sizes: tuple[int, ...] = (0, 40, 48, 100, 1000)) -> dict[int, float]:
    return {size: value + size / 10 for size in sizes}


def fake_results() -> dict[str, ExperimentResult]:
    """Results with every curve the reproduce plots read, made up (the plots' contract)."""
    figure = [Figure("x", 1.0, 1.0, "us", "test")]
    sba = {
        name: ExperimentResult(
            figure, {f"rtt {name}": _line(60.0), f"bandwidth {name}": _line(5.0)}
        )
        for name in ("sba200", "fore-firmware", "sba100")
    }
    sba["sba200"] = ExperimentResult(
        figure,
        {
            **sba["sba200"].curves,
            "limit taxi-140": _line(15.0),
            "paper rtt sba200": _line(120.0, (48, 1000)),
        },
    )
    fe = {f"rtt {r}": _line(50.0) for r in ("fe-hub", "fe-bay28115", "fe-fn100")}
    fe |= {"bandwidth fe-hub": _line(90.0), "limit fast-ethernet": _line(97.0)}
    atm = {"rtt pca200-oc3": _line(89.0), "bandwidth pca200-oc3": _line(110.0)}
    atm |= {"limit oc-3": _line(135.0), "limit taxi-140": _line(126.0)}
    tcpip = {
        f"fig{n}: {label}": _line(10.0)
        for n, labels in (
            (6, ("kernel UDP, ATM", "kernel UDP, Ethernet", "kernel TCP, ATM")),
            (7, ("U-Net UDP", "kernel UDP/ATM, sender", "kernel UDP/ATM, received")),
            (8, ("U-Net TCP", "kernel TCP/ATM")),
            (9, ("U-Net UDP", "U-Net TCP", "kernel UDP/ATM", "kernel TCP/ATM")),
        )
        for label in labels
    }
    myrinet = {"fig2: pio h2n": _line(50.0), "limit: NI-to-host": _line(120.0)}
    for column in ("rtt_half_us", "g_us", "os_us", "or_us", "l_us"):
        myrinet[f"{column}: BIP"] = _line(6.0, (4, 64, 4096))
    for mode in ("pingpong", "unidirectional", "simultaneous"):
        myrinet[f"{mode}: BIP"] = _line(100.0, (4, 64, 4096))
    return {
        **sba,
        "fast-ethernet": ExperimentResult(figure, fe),
        "pca200": ExperimentResult(figure, atm),
        "tcpip": ExperimentResult(figure, tcpip),
        "myrinet": ExperimentResult(figure, myrinet),
    }


@pytest.mark.slow
def test_every_reproduce_plot_is_drawn_from_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra stacklib[plot]")
    from stacklib.reporting.plots import PLOTS, draw_results

    written, missing = draw_results(tmp_path / "figures", fake_results())
    assert missing == []
    names = {path.name for path in written}
    for plot in PLOTS:
        if "*" not in plot.file:
            assert plot.file in names
    assert "paper004_fig11-unidirectional.png" in names
    assert len(written) == 8 + 9
    assert all(path.parent == tmp_path / "figures" and _png(path) for path in written)


def test_a_plot_whose_experiment_did_not_run_is_left_out(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra stacklib[plot]")
    from stacklib.reporting.plots import PLOTS, draw_results

    results = fake_results()
    del results["sba100"]
    written, missing = draw_results(tmp_path, results, PLOTS[:4])
    assert [plot.file for plot in missing] == [
        "paper000_fig3_rtt.png",
        "paper000_fig4_bandwidth.png",
    ]
    assert [path.name for path in written] == [plot.file for plot in PLOTS[2:4]]
    assert not (tmp_path / "paper000_fig3_rtt.png").exists()
    assert all(_png(path) for path in written)


def test_the_splitc_and_tlb_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra stacklib[plot]")
    from stacklib.reporting.plots import draw_splitc, plot_tlb

    machines = ("cm5", "meiko", "unet-atm")
    fig5 = {(b, m): (2.0, 1.0) for b in ("mm4x4", "ssortsm") for m in machines}
    paper = {"mm16": {(net, n): 1.0 for net in ("atm", "fe") for n in (2, 4, 8)}}
    table1 = {("mm16", net, n): (1.0, 0.5) for net in ("atm", "fe") for n in (2, 4, 8)}
    paths = draw_splitc(tmp_path, fig5, table1, paper)
    assert [p.name for p in paths] == ["splitc_fig5.png", "splitc_fig7.png"]
    assert all(_png(p) for p in paths)
    bars = TlbSimResult("mm16", 256, 16, 100, 90, 4, 2, 3, 1, 9)
    assert _png(plot_tlb([bars, bars], tmp_path / "fig3.png"))


def test_plots_without_matplotlib_print_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A None entry in sys.modules makes "import matplotlib..." raise ImportError.
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [n for n in sys.modules if n.startswith("stacklib.reporting.plots")]:
        monkeypatch.delitem(sys.modules, name)

    status = run_experiments(only=["sba100"], plots=str(tmp_path))

    assert status == 2
    assert "pip install 'stacklib[plot]'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_importing_reporting_imports_no_matplotlib_and_no_experiment() -> None:
    import subprocess

    code = (
        "import sys, stacklib.reporting, stacklib.reproduce; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] == 'matplotlib' or m.startswith('stacklib.experiments')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
