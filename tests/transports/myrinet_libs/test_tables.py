"""Paper 004 Tables 1-3 are generated from the libraries' declared properties."""

from __future__ import annotations

import pytest

from stacklib.transports.sim.myrinet_libs import LIBRARIES, Bip, Fm, Gam, Pm, Vmmc, table

ALL = list(LIBRARIES.values())


def row(text: str, heading: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(heading))
    return line[len(heading) :].split()


def test_table1_rows_match_the_paper() -> None:
    text = table(1, ALL)
    assert text.splitlines()[0].split() == [
        "Generic",
        "AM",
        "BIP-0.92",
        "FM-2.02",
        "PM-1.2",
        "VMMC-2",
    ]
    assert row(text, "Buffer Overflows") == [
        "Prevented",
        "Data",
        "Loss",
        "Prevented",
        "Tolerated",
        "Impossible",
    ]
    assert row(text, "Multi-programming") == ["No", "No", "No", "Yes", "Yes"]
    assert row(text, "Net Errors") == ["Catastrophic"] * 4 + ["Tolerated"]


def test_table2_rows_match_the_paper() -> None:
    text = table(2, ALL)
    assert row(text, "Send Data") == [
        "DMA+Copy",
        "DMA+v2p",
        "trans",
        "PIO(WC)",
        "DMA+Copy",
        "DMA+v2p",
        "trans",
    ]
    assert row(text, "Reliability") == ["Library+Copy", "None", "None", "None", "Firmware"]
    assert row(text, "Notification") == ["Polling", "None", "Polling", "Polling", "N/A"]


def test_declarations_are_the_source() -> None:
    assert (Bip.MODEL.buffer_overflows, Vmmc.IMPL.notification) == ("Data Loss", "N/A")
    assert Pm.IMPL.protection == "Gang Scheduling" and Fm.IMPL.send_data == "PIO(WC)"
    assert Gam.TABLE3[:2] == ("Os", "Os") and Vmmc.TABLE3[3] == "L"
    assert "Firmware" in table(2, [Vmmc]) and "Firmware" not in table(2, [Bip])


def test_there_is_no_table_4() -> None:
    with pytest.raises(ValueError, match="Tables 1, 2 and 3"):
        table(4, ALL)


def test_the_libraries_command_prints_the_tables_and_fig2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stacklib.cli import main

    assert main(["libraries"]) == 0
    out = capsys.readouterr().out
    assert "Table 1" in out and "Table 2" in out and "Table 3" in out
    assert "Direct Deposit" in out and "Gang Scheduling" in out
    assert main(["libraries", "--table", "2"]) == 0
    out = capsys.readouterr().out
    assert "Table 1" not in out and "Firmware" in out
    assert main(["libraries", "--fig2"]) == 0
    assert "dma-lanai h2n" in capsys.readouterr().out
