"""``stacklib bench faults``: the reliability run finds what it exists to find."""

from __future__ import annotations

import pytest

from stacklib.bench.faults import (
    FaultsParams,
    ReliabilityError,
    bench_faults,
    daemon_campaign,
    fuzz_formats,
    tcp_campaign,
    uam_campaign,
)
from stacklib.errors import FormatError
from stacklib.wire import registry


def test_uam_through_faults_of_every_kind_loses_nothing_and_is_deterministic() -> None:
    first = uam_campaign(1500, 0.05, seed=3)
    assert first["delivered"] == 1500 and first["lost"] == 0 and first["corrupt"] == 0
    assert first["retransmitted"] > 0  # the faults did bite
    assert uam_campaign(1500, 0.05, seed=3) == first


def test_every_registered_format_survives_the_fuzzing() -> None:
    row = fuzz_formats(300, seed=5)
    assert row["corrupt"] == 0, row["first_crash"]
    assert row["tried"] == 300 * len(registry.formats())
    assert row["rejected"] > 0


class ToyError(FormatError):
    pass


def test_a_parser_that_crashes_is_named() -> None:
    def crashy(data: bytes) -> int:
        if len(data) < 1:
            raise ToyError("empty")
        return data[5]  # IndexError on short input: not the documented error

    registry.register("test-crashy", crashy, lambda v: [], "crashes", error=ToyError)
    try:
        with pytest.raises(ReliabilityError, match=r"formats: 0 lost, [1-9][0-9]* corrupt") as info:
            bench_faults(FaultsParams(fuzz=50, campaigns=("formats",)))
        (row,) = info.value.result.rows  # type: ignore[attr-defined]
        assert "test-crashy: IndexError" in row["first_crash"]
    finally:
        registry.FORMATS.unregister("test-crashy")


def test_unknown_campaign_is_refused() -> None:
    with pytest.raises(ValueError, match="no campaign 'carrier-pigeon'"):
        bench_faults(FaultsParams(campaigns=("carrier-pigeon",)))


def test_tcp_through_faults_of_every_kind_arrives_intact() -> None:
    row = tcp_campaign(256 << 10, 0.05, seed=2)
    assert row["delivered"] == 256 << 10 and row["lost"] == 0 and row["corrupt"] == 0
    assert row["retransmitted"] > 0


def test_the_daemon_lives_through_a_flood_and_its_channel_loses_nothing() -> None:
    row = daemon_campaign(2000, seed=3)
    assert row["corrupt"] == 0, "the daemon died"
    assert row["lost"] == 0 and row["delivered"] == 40
    assert row["daemon_counters"]["malformed"] > 0


def test_ctrl_c_prints_the_campaigns_that_finished_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stacklib.bench import faults
    from stacklib.cli import main

    def finished(params: FaultsParams) -> dict[str, object]:
        return {"tried": 7, "delivered": 7, "lost": 0, "corrupt": 0, "retransmitted": 0}

    def interrupted(params: FaultsParams) -> dict[str, object]:
        raise KeyboardInterrupt

    runners = {"uam": finished, "tcp": interrupted, "formats": finished, "daemon": finished}
    monkeypatch.setattr(faults, "CAMPAIGN_RUNNERS", runners)
    assert main(["bench", "faults", "--only", "uam", "tcp", "daemon"]) == 130
    out, err = capsys.readouterr()
    assert out.count("uam") == 1 and "daemon" not in out
    assert "stacklib bench faults: interrupted in tcp; not run: daemon" in err
    assert "Traceback" not in err
