"""Captures of simulated links (`--pcap`): parsed back, and dissected by tshark where present."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stacklib.bench.pingpong import PingPongParams
from stacklib.errors import ConfigError
from stacklib.recipes import load_recipe, run_recipe
from stacklib.wire import unet_eth
from stacklib.wire.pcap import LinkType, parse_sunatm, read_pcap

PARAMS = PingPongParams(sizes=(40, 1000), iterations=2, warmup=0)


def test_fast_ethernet_capture_parses_back(tmp_path: Path) -> None:
    path = tmp_path / "fe.pcap"
    run_recipe(load_recipe("fe-hub"), workload_params=PARAMS, pcap=str(path))
    linktype, records = read_pcap(path)
    assert linktype == LinkType.ETHERNET
    assert len(records) == 8  # 2 sizes x 2 round trips x 2 directions
    frames = [unet_eth.parse(record.data) for record in records]
    assert [len(f.payload) for f in frames] == [40] * 4 + [1000] * 4
    assert {f.src for f in frames} == {f.dst for f in frames} and len({f.src for f in frames}) == 2
    times = [record.timestamp for record in records]
    assert times == sorted(times)
    # A 40-byte one-way trip on the hub is half of paper 003's 57 us round trip.
    assert times[1] - times[0] == pytest.approx(28.3e-6, rel=0.02)


def test_atm_capture_parses_back(tmp_path: Path) -> None:
    path = tmp_path / "atm.pcap"
    run_recipe(load_recipe("sba200"), workload_params=PARAMS, pcap=str(path))
    linktype, records = read_pcap(path)
    assert linktype == LinkType.SUNATM
    packets = [parse_sunatm(record.data) for record in records]
    assert [len(p.payload) for p in packets] == [40] * 4 + [1000] * 4
    assert len({p.vci for p in packets}) == 2  # one VCI per direction of the channel


def test_capture_needs_a_simulated_link(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no link to capture"):
        run_recipe(load_recipe("unet-memory-pingpong"), workload_params=PARAMS, pcap="x.pcap")


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_tshark_dissects_a_simulated_fast_ethernet_capture(tmp_path: Path) -> None:
    path = tmp_path / "fe.pcap"
    run_recipe(load_recipe("fe-hub"), workload_params=PARAMS, pcap=str(path))
    out = subprocess.run(
        ["tshark", "-r", str(path), "-T", "fields", "-e", "eth.type", "-e", "frame.len"],
        env={**os.environ, "HOME": str(tmp_path)},  # no personal plugin: Wireshark by itself
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split("\n")
    assert out[0].split("\t") == ["0x88b5", "60"]
