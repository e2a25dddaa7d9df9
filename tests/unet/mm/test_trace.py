"""Buffer traces: the format (property tests), the recorder on recipe runs, the TLB replay."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.cli import main
from stacklib.recipes import load_recipe, run_recipe
from stacklib.unet.mm.tlbsim import format_results, simulate
from stacklib.unet.mm.trace import (
    HEADER_SIZE,
    RECORD_SIZE,
    TraceFormatError,
    TraceRecord,
    TraceRecorder,
    build_trace,
    parse_trace,
    parse_trace_reference,
    trace_records,
)
from stacklib.unet.ni import install_buffer_trace

P = 4096


@given(st.lists(trace_records(), max_size=20))
def test_round_trip_and_codec_agrees_with_construct(records: list[TraceRecord]) -> None:
    data = build_trace(records)
    assert len(data) == HEADER_SIZE + RECORD_SIZE * len(records)
    parsed = parse_trace(data)
    assert parsed.records == tuple(records) and parsed.dropped == 0
    assert parse_trace_reference(data) == parsed


@given(st.binary(max_size=200))
def test_any_body_parses_the_same_both_ways_and_never_raises(body: bytes) -> None:
    data = build_trace([]) + body
    assert parse_trace(data) == parse_trace_reference(data)


def test_bad_records_are_dropped_and_counted() -> None:
    good = TraceRecord(0, 1, 0, 0x1000, 64)
    data = bytearray(build_trace([good, good, good]))
    data[HEADER_SIZE + RECORD_SIZE] = 7  # second record: unknown direction
    parsed = parse_trace(bytes(data) + b"\x00\x01")  # and a truncated tail
    assert parsed.records == (good, good)
    assert parsed.dropped == 2


def test_not_a_trace_raises() -> None:
    with pytest.raises(TraceFormatError, match="truncated"):
        parse_trace(b"UMT")
    with pytest.raises(TraceFormatError):
        parse_trace(b"XXXX\x00\x01\x00\x00")
    with pytest.raises(TraceFormatError, match="version"):
        parse_trace(b"UMTR\x00\x09\x00\x00")
    with pytest.raises(ValueError, match="length"):
        build_trace([TraceRecord(0, 0, 0, 0, 0)])


def test_recorder_captures_every_buffer_of_a_udp_run() -> None:
    recipe = load_recipe("udp-atm")
    recorder = TraceRecorder()
    with recorder.installed():
        result = run_recipe(recipe)
    assert install_buffer_trace(None) is None  # uninstalled
    records = recorder.records
    tx = [r for r in records if r.direction == 0]
    rx = [r for r in records if r.direction == 1]
    assert tx and rx
    assert {r.node for r in records} == {0, 1}  # two hosts, two NIs
    assert {r.process for r in records} == {0, 1}
    # Every large ping and pong went out of a buffer and into one (small ones travel inline).
    assert len(tx) == len(rx)
    assert result.rows
    replay = simulate(parse_trace(recorder.to_bytes()).records, entries=1024)
    assert replay.tx_non_compulsory == replay.rx_non_compulsory == 0
    assert replay.translations == replay.hits + replay.misses


def test_cli_record_show_and_tlbsim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "uam.trace"
    args = ["trace", "record", "-o", str(trace), "unet-atm-uam"]
    assert main([*args, "--set", "run.seed=3"]) == 0
    assert trace.stat().st_size > HEADER_SIZE
    assert main(["trace", "show", str(trace), "--head", "2"]) == 0
    assert main(["tlbsim", str(trace), "--entries", "256,1024", "--victim", "16"]) == 0
    out = capsys.readouterr().out
    assert "tx non-comp %" in out and "256+16" in out and "1024+16" in out


def test_cli_rejects_bad_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tlbsim", "x.trace", "--entries", "0"])
    assert "positive" in capsys.readouterr().err


def _synthetic(pages: int, rounds: int, length: int = P) -> list[TraceRecord]:
    """A process sending from ``pages`` pages in turn and receiving as often."""
    out = []
    for _ in range(rounds):
        for page in range(pages):
            out.append(TraceRecord(0, 0, 0, page * P, length))
            out.append(TraceRecord(1, 0, 0, 0, 1024))
    return out


def test_small_working_set_has_only_compulsory_misses_at_256_entries() -> None:
    # Like matrix multiply's 82 pages (paper 002 §6.2): fits 256 entries with the rx ring.
    result = simulate(_synthetic(82, 5), entries=256)
    assert result.tx_non_compulsory == result.rx_non_compulsory == 0
    assert result.tx_compulsory == 82
    assert result.rx_compulsory == 64  # one page per buffer of the 64-buffer receive ring
    assert "256+16" in format_results([result])


def test_large_working_set_misses_at_256_not_at_1024() -> None:
    trace = _synthetic(400, 3)
    small = simulate(trace, entries=256)
    large = simulate(trace, entries=1024)
    assert small.tx_non_compulsory > 0
    assert large.tx_non_compulsory == large.rx_non_compulsory == 0


def test_direct_mapped_conflicts_are_absorbed_up_to_the_victim_size() -> None:
    conflicting = [TraceRecord(0, 0, 0, k * 256 * P, 64) for k in range(17)] * 3
    assert simulate(conflicting, entries=256, victim=16, rx_buffers=0).tx_non_compulsory == 0
    thrash = [TraceRecord(0, 0, 0, k * 256 * P, 64) for k in range(18)] * 3
    assert simulate(thrash, entries=256, victim=16, rx_buffers=0).tx_non_compulsory > 0
