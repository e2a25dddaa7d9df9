"""Paper 000 Figs 6-9 as curves (experiments/tcpip.py) and as the plots of
``stacklib reproduce --plots`` (reporting/plots/tcpip.py): the shapes the text describes, and
PNG files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stacklib.experiments import tcpip
from stacklib.reporting.figures import ExperimentResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_fig6_atm_is_slower_than_ethernet_for_small_messages_only() -> None:
    curves = tcpip.fig6_curves((16, 1000))
    for proto in ("UDP", "TCP"):
        atm, eth = curves[f"kernel {proto}, ATM"], curves[f"kernel {proto}, Ethernet"]
        assert atm[16] > eth[16]  # §7: "larger using ATM than going over Ethernet"
        assert atm[1000] < eth[1000]
    assert set(tcpip.fig6_curves((2000,))["kernel TCP, Ethernet"]) == set()  # beyond one MSS


def test_fig7_saw_tooth_and_unet_above_the_kernel() -> None:
    curves = tcpip.fig7_curves(unet_sizes=(4096,), kernel_sizes=(2559, 2560, 4096))
    sender = curves["kernel UDP/ATM, sender"]
    assert sender[2560] > sender[2559]  # 1 KB clusters vs small mbufs (§7.3)
    assert curves["U-Net UDP"][4096] > curves["kernel UDP/ATM, received"][4096]
    received, sent = curves["kernel UDP/ATM, received"][4096], sender[4096]
    assert received <= sent


def test_fig8_unet_with_8k_beats_the_kernel_with_64k() -> None:
    curves = tcpip.fig8_curves(windows=(8192,), total=256 * 1024)
    kernel = tcpip.fig8_curves(windows=())["kernel TCP/ATM"]
    assert kernel == {}
    assert curves["U-Net TCP"][8192] > tcpip.k.tcp_bandwidth(tcpip.k.ATM, 65535)


def test_fig9_unet_round_trips_are_several_times_shorter() -> None:
    curves = tcpip.fig9_curves((16,))
    assert curves["kernel UDP/ATM"][16] > 3 * curves["U-Net UDP"][16]
    assert curves["kernel TCP/ATM"][16] > 3 * curves["U-Net TCP"][16]


@pytest.mark.parametrize("figure", [6, 7, 8, 9])
def test_the_figures_are_drawn(tmp_path: Path, figure: int) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra stacklib[plot]")
    from stacklib.reporting import plots

    draw: Callable[..., Path] = getattr(plots, f"paper000_fig{figure}")
    assert any(plot.draw is draw for plot in plots.PLOTS)  # stacklib reproduce --plots draws it
    curves = {
        6: lambda: tcpip.fig6_curves([16, 512]),
        7: lambda: tcpip.fig7_curves([16, 512], [16, 512]),
        8: lambda: tcpip.fig8_curves([4096, 8192], total=64 * 1024),
        9: lambda: tcpip.fig9_curves([16, 512]),
    }[figure]()
    # Named as the experiment's result names them: "fig6: kernel UDP, ATM", ...
    result = ExperimentResult((), {f"fig{figure}: {k}": v for k, v in curves.items()})
    path = draw(tmp_path, {"tcpip": result})
    assert path.parent == tmp_path and path.name.startswith(f"paper000_fig{figure}_")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_the_experiment_names_its_curves_as_the_curve_functions_do() -> None:
    names = {key.split(": ", 1)[1] for key in tcpip._fig6((16,))}
    assert names == set(tcpip.fig6_curves((16,)))
    assert set(tcpip._fig9({16: 1.0}, {16: 2.0}, (16,))) == {
        f"fig9: {k}" for k in ("U-Net UDP", "U-Net TCP", "kernel UDP/ATM", "kernel TCP/ATM")
    }
