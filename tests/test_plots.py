"""``stacklib reproduce --plots``: the figures are drawn, or a missing matplotlib is explained."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stacklib.reproduce import run_experiments

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_figure_is_written_as_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra stacklib[plot]")
    from stacklib.plots import paper000_fig3

    path = paper000_fig3(tmp_path / "figures", sizes=[0, 40, 48, 100])
    assert path == tmp_path / "figures" / "paper000_fig3_rtt.png"
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 1000


def test_plots_without_matplotlib_print_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A None entry in sys.modules makes "import matplotlib..." raise ImportError.
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "stacklib.plots", raising=False)

    status = run_experiments(only=["sba100"], plots=str(tmp_path))

    assert status == 2
    assert "pip install 'stacklib[plot]'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
