"""pcap captures: golden bytes, round trips, hand-built files of every flavour, malformed files,
the SunATM pseudo-header, and (when tshark is installed) what Wireshark's dissectors make of it."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import struct
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stacklib.wire import aal5, atm, pcap, unet_eth
from stacklib.wire.pcap import (
    LinkType,
    PcapFormatError,
    PcapReader,
    PcapWriter,
    Record,
    SunAtmPacket,
    SunAtmTraffic,
)

NS = 1_000_000_000
MAX_NS = (2**32) * NS - 1  # the last nanosecond a u32 seconds field can carry

GOLDEN_GLOBAL_HEADER = bytes.fromhex(
    "4d3cb2a1"  # magic 0xA1B23C4D (nanosecond), little-endian
    "0200"  # version major 2
    "0400"  # version minor 4
    "00000000"  # thiszone
    "00000000"  # sigfigs
    "ffff0000"  # snaplen 65535
    "01000000"  # LINKTYPE_ETHERNET
)
GOLDEN_RECORD = bytes.fromhex(
    "01000000"  # 1 s
    "07000000"  # + 7 ns
    "03000000"  # caplen 3
    "05000000"  # orig_len 5
    "aabbcc"
)


def write_bytes(records: list[tuple[int, bytes]], **options: object) -> bytes:
    """A capture of ``records`` (nanoseconds, data) written to memory."""
    stream = io.BytesIO()
    with PcapWriter(stream, LinkType.ETHERNET, **options) as writer:  # type: ignore[arg-type]
        for ns, data in records:
            writer.write_ns(ns, data)
    return stream.getvalue()


def hand_built(order: str, nanosecond: bool, records: list[tuple[int, int, bytes, int]]) -> bytes:
    """A capture built with :mod:`struct` alone, independent of the module's codecs.

    ``records``: (seconds, fraction, data, orig_len).
    """
    magic = 0xA1B23C4D if nanosecond else 0xA1B2C3D4
    out = [struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, 123)]
    for seconds, fraction, data, orig_len in records:
        out.append(struct.pack(order + "IIII", seconds, fraction, len(data), orig_len) + data)
    return b"".join(out)


# --- the format ---------------------------------------------------------------------------------


def test_construct_definitions_are_the_sizes_and_fields() -> None:
    for header in (pcap.GLOBAL_HEADER_LE, pcap.GLOBAL_HEADER_BE):
        assert header.sizeof() == pcap.GLOBAL_HEADER_SIZE == 24
    for header in (pcap.RECORD_HEADER_LE, pcap.RECORD_HEADER_BE):
        assert header.sizeof() == pcap.RECORD_HEADER_SIZE == 16
    assert pcap.SUNATM_HEADER.sizeof() == pcap.SUNATM_HEADER_SIZE == 4
    assert (int(LinkType.ETHERNET), int(LinkType.SUNATM)) == (1, 123)


def test_golden_global_header() -> None:
    assert write_bytes([]) == GOLDEN_GLOBAL_HEADER
    parsed = pcap.GLOBAL_HEADER_LE.parse(GOLDEN_GLOBAL_HEADER)
    assert (parsed.magic, parsed.snaplen, parsed.linktype) == (0xA1B23C4D, 65535, 1)


def test_golden_microsecond_big_endian_header() -> None:
    data = write_bytes([], nanosecond=False, byteorder="big", snaplen=1500)
    assert data == bytes.fromhex("a1b2c3d4 0002 0004 00000000 00000000 000005dc 00000001")


def test_golden_record() -> None:
    stream = io.BytesIO()
    with PcapWriter(stream, LinkType.ETHERNET) as writer:
        writer.write_ns(NS + 7, b"\xaa\xbb\xcc", orig_len=5)
    assert stream.getvalue() == GOLDEN_GLOBAL_HEADER + GOLDEN_RECORD
    linktype, records = pcap.parse_pcap(GOLDEN_GLOBAL_HEADER + GOLDEN_RECORD)
    assert linktype is LinkType.ETHERNET
    assert records == [Record(1.000000007, b"\xaa\xbb\xcc", 5, NS + 7)]


@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, NS - 1),
    st.binary(max_size=20),
    st.integers(0, 100),
    st.sampled_from(["little", "big"]),
)
def test_writer_records_match_the_construct_definition(
    seconds: int, fraction: int, data: bytes, extra: int, order: str
) -> None:
    spec = pcap.RECORD_HEADER_LE if order == "little" else pcap.RECORD_HEADER_BE
    stream = io.BytesIO()
    writer = PcapWriter(stream, LinkType.ETHERNET, byteorder=order)  # type: ignore[arg-type]
    writer.write_ns(seconds * NS + fraction, data, orig_len=len(data) + extra)
    head = spec.parse(stream.getvalue()[24:40])
    assert (head.ts_sec, head.ts_frac) == (seconds, fraction)
    assert (head.caplen, head.orig_len) == (len(data), len(data) + extra)
    assert stream.getvalue()[40:] == data
    fields = {"ts_sec": seconds, "ts_frac": fraction, "caplen": len(data), "orig_len": 0}
    byte_order = "<" if order == "little" else ">"
    assert spec.build(fields) == struct.pack(byte_order + "IIII", seconds, fraction, len(data), 0)


# --- round trips --------------------------------------------------------------------------------

records_strategy = st.lists(st.tuples(st.integers(0, MAX_NS), st.binary(max_size=200)), max_size=8)


@given(records_strategy, st.sampled_from(["little", "big"]))
def test_round_trip_nanosecond(records: list[tuple[int, bytes]], order: str) -> None:
    linktype, got = pcap.parse_pcap(write_bytes(records, byteorder=order))
    assert linktype == LinkType.ETHERNET
    assert [(r.timestamp_ns, r.data, r.orig_len) for r in got] == [
        (ns, data, len(data)) for ns, data in records
    ]
    for record in got:
        assert record.timestamp == pytest.approx(record.timestamp_ns / NS, rel=1e-15)


@given(records_strategy, st.sampled_from(["little", "big"]))
def test_round_trip_microsecond_rounds_to_the_nearest_microsecond(
    records: list[tuple[int, bytes]], order: str
) -> None:
    records = [(min(ns, MAX_NS - 500), data) for ns, data in records]
    _, got = pcap.parse_pcap(write_bytes(records, byteorder=order, nanosecond=False))
    assert [r.timestamp_ns for r in got] == [(ns + 500) // 1000 * 1000 for ns, _ in records]
    assert [r.data for r in got] == [data for _, data in records]


@given(st.floats(min_value=0, max_value=2**32 - 1, allow_nan=False))
@example(1.000000007)
@example(0.000002700)
@example(1_700_000_000.123456789)  # wall-clock scale: the float holds ~240 ns steps there
def test_float_timestamps_keep_nanosecond_precision(t: float) -> None:
    stream = io.BytesIO()
    with PcapWriter(stream, LinkType.SUNATM) as writer:
        writer.write(t, b"x")
    (record,) = pcap.parse_pcap(stream.getvalue())[1]
    assert abs(record.timestamp_ns - Fraction(t) * NS) <= Fraction(1, 2) + Fraction(1, 10**6)
    assert record.timestamp == pytest.approx(t, abs=1e-9)


def test_snaplen_cuts_data_and_keeps_orig_len() -> None:
    stream = io.BytesIO()
    with PcapWriter(stream, LinkType.ETHERNET, snaplen=10) as writer:
        writer.write(0.5, bytes(range(60)))
        writer.write(0.75, bytes(range(4)), orig_len=64)
        assert writer.records == 2
    reader = PcapReader(io.BytesIO(stream.getvalue()))
    assert reader.snaplen == 10
    assert [(r.data, r.orig_len) for r in reader] == [(bytes(range(10)), 60), (bytes(range(4)), 64)]


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("nanosecond", [True, False], ids=["ns", "us"])
def test_hand_built_files_of_both_magics_and_byte_orders(order: str, nanosecond: bool) -> None:
    fraction = 123_456_789 if nanosecond else 123_456
    data = hand_built(order, nanosecond, [(5, fraction, b"\x00\x00\x00\x20abc", 9), (6, 0, b"", 0)])
    reader = PcapReader(io.BytesIO(data))
    assert reader.linktype is LinkType.SUNATM
    assert reader.byteorder == ("little" if order == "<" else "big")
    assert reader.nanosecond is nanosecond
    assert (reader.version, reader.snaplen) == ((2, 4), 65535)
    first, second = list(reader)
    assert first.timestamp_ns == 5 * NS + (123_456_789 if nanosecond else 123_456_000)
    assert (first.data, first.orig_len) == (b"\x00\x00\x00\x20abc", 9)
    assert (second.timestamp_ns, second.data, second.orig_len) == (6 * NS, b"", 0)
    assert pcap.parse_sunatm(first.data) == SunAtmPacket(0, 32, b"abc")


def test_unknown_link_type_is_kept_as_an_int() -> None:
    stream = io.BytesIO()
    PcapWriter(stream, 147).close()  # LINKTYPE_USER0
    linktype, records = pcap.parse_pcap(stream.getvalue())
    assert (linktype, records) == (147, [])
    assert not isinstance(linktype, LinkType)


def test_open_writes_a_file_and_read_pcap_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "link.pcap"
    with PcapWriter.open(path, LinkType.ETHERNET) as writer:
        writer.write(0.001, b"frame")
    assert writer.closed
    assert path.read_bytes().startswith(GOLDEN_GLOBAL_HEADER)
    assert pcap.read_pcap(path) == (LinkType.ETHERNET, [Record(0.001, b"frame", 5, 1_000_000)])
    assert pcap.read_pcap(str(path))[1][0].timestamp_ns == 1_000_000


def test_close_flushes_but_leaves_a_borrowed_stream_open() -> None:
    stream = io.BytesIO()
    writer = PcapWriter(stream, LinkType.ETHERNET)
    writer.write(0, b"a")
    writer.close()
    writer.close()  # idempotent
    assert not stream.closed
    assert "1 records, closed" in repr(writer)
    with pytest.raises(ValueError, match="closed"):
        writer.write(1, b"b")


@pytest.mark.parametrize(
    ("timestamp", "data", "orig_len"),
    [
        (-1e-9, b"", None),
        (float("nan"), b"", None),
        (float("inf"), b"", None),
        (2.0**32, b"", None),
        (0.0, b"abc", 2),
        (0.0, b"", 2**32),
    ],
)
def test_writer_misuse_raises_value_error(
    timestamp: float, data: bytes, orig_len: int | None
) -> None:
    writer = PcapWriter(io.BytesIO(), LinkType.ETHERNET)
    with pytest.raises(ValueError):
        writer.write(timestamp, data, orig_len)
    assert writer.records == 0


@pytest.mark.parametrize(
    "options",
    [{"linktype": -1}, {"linktype": 2**32}, {"snaplen": 0}, {"byteorder": "middle"}],
)
def test_writer_rejects_bad_parameters(options: dict[str, object]) -> None:
    arguments: dict[str, object] = {"linktype": 1} | options
    with pytest.raises(ValueError):
        PcapWriter(io.BytesIO(), **arguments)  # type: ignore[arg-type]


# --- malformed files ----------------------------------------------------------------------------

VALID = hand_built("<", True, [(1, 2, b"hello", 5), (3, 4, b"world!", 10)])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty file"),
        (b"\xd4\xc3\xb2", "bad magic"),
        (b"GIF89a" + bytes(18), "bad magic"),
        (bytes.fromhex("0a0d0d0a") + bytes(20), "pcapng"),
        (VALID[:23], "truncated global header"),
        (VALID[:4] + b"\x01\x00" + VALID[6:], "version 1.4"),
        (VALID[: 24 + 15], "record 0: truncated header"),
        (VALID[: 24 + 16 + 4], "record 0: truncated data"),
        (VALID[: len(VALID) - 1], "record 1: truncated data"),
        (hand_built("<", True, [(0, 0, bytes(65536), 65536)]), "exceeds snaplen"),
        (hand_built(">", False, [(0, 0, b"abc", 2)]), "caplen 3 > orig_len 2"),
        (hand_built("<", True, [(0, NS, b"", 0)]), "fraction"),
        (hand_built(">", False, [(0, 1_000_000, b"", 0)]), "fraction"),
    ],
)
def test_malformed_files_raise_pcap_format_error(data: bytes, message: str) -> None:
    with pytest.raises(PcapFormatError, match=message):
        pcap.parse_pcap(data)


def test_caplen_over_the_hard_limit_is_refused_even_without_snaplen() -> None:
    data = bytearray(hand_built("<", True, []))
    data[16:20] = bytes(4)  # snaplen 0: "not set"
    record = struct.pack("<IIII", 0, 0, pcap.MAX_CAPLEN + 1, pcap.MAX_CAPLEN + 1)
    with pytest.raises(PcapFormatError, match="limit"):
        pcap.parse_pcap(bytes(data) + record)
    small = struct.pack("<IIII", 0, 0, 70000, 70000) + bytes(70000)
    assert len(pcap.parse_pcap(bytes(data) + small)[1][0].data) == 70000


@given(st.integers(0, len(VALID)))
def test_truncation_anywhere_is_an_error_or_a_record_boundary(cut: int) -> None:
    boundaries = {24, 24 + 16 + 5, len(VALID)}
    if cut in boundaries:
        assert len(pcap.parse_pcap(VALID[:cut])[1]) == sorted(boundaries).index(cut)
    else:
        with pytest.raises(PcapFormatError):
            pcap.parse_pcap(VALID[:cut])


@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=6))
def test_mutated_files_raise_only_pcap_format_error(edits: list[tuple[int, int]]) -> None:
    data = bytearray(VALID)
    for position, value in edits:
        data[position] = value
    try:
        _, records = pcap.parse_pcap(data)
    except PcapFormatError:
        return
    assert all(len(r.data) <= r.orig_len for r in records)


@given(st.binary(max_size=120))
def test_random_bytes_raise_only_pcap_format_error(data: bytes) -> None:
    for candidate in (data, GOLDEN_GLOBAL_HEADER + data):
        with contextlib.suppress(PcapFormatError):
            pcap.parse_pcap(candidate)


def test_reader_reads_from_a_stream_that_returns_short_reads() -> None:
    class Trickle(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._data = data

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
            size = min(3, len(buffer))
            chunk, self._data = self._data[:size], self._data[size:]
            buffer[: len(chunk)] = chunk
            return len(chunk)

    reader = PcapReader(Trickle(VALID))  # type: ignore[arg-type]
    assert [r.data for r in reader] == [b"hello", b"world!"]


# --- SunATM -------------------------------------------------------------------------------------


def test_golden_sunatm_records() -> None:
    assert pcap.sunatm_record(0, 32, b"msg", outgoing=True) == bytes.fromhex("80000020") + b"msg"
    assert pcap.sunatm_record(5, 0x1234, b"", traffic=SunAtmTraffic.LLC) == bytes.fromhex(
        "02051234"
    )
    assert pcap.parse_sunatm(bytes.fromhex("8f ff ffff") + b"z") == SunAtmPacket(
        255, 0xFFFF, b"z", True, 15
    )


@given(
    st.integers(0, 255),
    st.integers(0, 0xFFFF),
    st.binary(max_size=100),
    st.booleans(),
    st.integers(0, 15),
)
def test_sunatm_round_trip(vpi: int, vci: int, payload: bytes, outgoing: bool, kind: int) -> None:
    record = pcap.sunatm_record(vpi, vci, payload, outgoing=outgoing, traffic=kind)
    assert len(record) == 4 + len(payload)
    assert pcap.SUNATM_HEADER.parse(record[:4]).flags.traffic == kind
    packet = pcap.parse_sunatm(record)
    assert packet == SunAtmPacket(vpi, vci, payload, outgoing, kind)
    assert isinstance(packet.traffic, SunAtmTraffic) == (kind <= 6)


def test_sunatm_record_from_pdu_drops_padding_and_trailer() -> None:
    message = b"U-Net/ATM message"
    pdu = aal5.build_pdu(message, uu=3)
    assert len(pdu) == 48
    assert pcap.sunatm_record_from_pdu(1, 40, pdu) == pcap.sunatm_record(1, 40, message)
    corrupt = pdu[:-1] + bytes([pdu[-1] ^ 1])
    assert pcap.parse_sunatm(pcap.sunatm_record_from_pdu(1, 40, corrupt)).payload == message
    with pytest.raises(aal5.Aal5FormatError):
        pcap.sunatm_record_from_pdu(1, 40, corrupt, check_crc=True)
    with pytest.raises(aal5.Aal5FormatError):
        pcap.sunatm_record_from_pdu(1, 40, pdu[:47])


@pytest.mark.parametrize(
    ("vpi", "vci", "kind"), [(256, 0, 0), (-1, 0, 0), (0, 65536, 0), (0, 0, 16)]
)
def test_sunatm_record_range_errors(vpi: int, vci: int, kind: int) -> None:
    with pytest.raises(ValueError):
        pcap.sunatm_record(vpi, vci, b"", traffic=kind)


def test_parse_sunatm_short_record() -> None:
    with pytest.raises(PcapFormatError, match="pseudo-header"):
        pcap.parse_sunatm(b"\x80\x00\x00")


# --- Wireshark ----------------------------------------------------------------------------------

TSHARK = shutil.which("tshark")
needs_tshark = pytest.mark.skipif(
    TSHARK is None, reason="tshark is not installed (apt-get install tshark to run this test)"
)

DST = bytes.fromhex("020000000002")
SRC = bytes.fromhex("020000000001")


def ipv4_udp_frame(payload: bytes) -> bytes:
    """An Ethernet frame carrying IPv4/UDP 10.0.0.1:5000 -> 10.0.0.2:6000 (UDP checksum 0)."""
    udp = struct.pack("!HHHH", 5000, 6000, 8 + len(payload), 0) + payload
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, bytes([10, 0, 0, 1]),
        bytes([10, 0, 0, 2]),
    )  # fmt: skip
    total = sum(struct.unpack("!10H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    header = header[:10] + struct.pack("!H", ~total & 0xFFFF) + header[12:]
    return DST + SRC + b"\x08\x00" + header + udp


def without_plugins(home: Path) -> dict[str, str]:
    """The environment of a tshark that loads no personal plugin: HOME is ``home``, a folder
    without one (``stacklib wireshark --install`` puts stacklib's dissector in the real HOME's,
    and these tests check what Wireshark shows by itself)."""
    return {**os.environ, "HOME": str(home)}


def tshark_fields(path: Path, *fields: str) -> list[list[str]]:
    assert TSHARK is not None
    command = [TSHARK, "-n", "-r", str(path), "-T", "fields"]
    for field in fields:
        command += ["-e", field]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=without_plugins(path.parent),
    )
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines()]


@needs_tshark
@pytest.mark.parametrize("byteorder", ["little", "big"])
@pytest.mark.parametrize("nanosecond", [True, False], ids=["ns", "us"])
def test_tshark_dissects_unet_fe_and_ipv4_frames(
    tmp_path: Path, byteorder: str, nanosecond: bool
) -> None:
    path = tmp_path / "fe.pcap"
    unet = unet_eth.build(unet_eth.UNetFrame(DST, SRC, 7, b"hello over U-Net/FE"))
    with PcapWriter.open(
        path,
        LinkType.ETHERNET,
        nanosecond=nanosecond,
        byteorder=byteorder,  # type: ignore[arg-type]
    ) as writer:
        writer.write(0.000001234, unet)
        writer.write(0.000002, ipv4_udp_frame(b"udp payload"))
    rows = tshark_fields(path, "frame.time_epoch", "frame.protocols", "eth.type", "frame.len")
    first_time = "0.000001234" if nanosecond else "0.000001000"
    assert rows == [
        [first_time, "eth:ethertype:data", "0x88b5", "60"],
        ["0.000002000", "eth:ethertype:ip:udp:data", "0x0800", "53"],
    ]


@needs_tshark
def test_tshark_dissects_sunatm_aal5(tmp_path: Path) -> None:
    path = tmp_path / "atm.pcap"
    message = b"U-Net/ATM message, two cells long ......"  # not IP/LLC-looking: shown as data
    pdu = aal5.build_pdu(message + b"!" * 10)
    # The VC as a cell carries it: the record's VPI/VCI come from the last cell's header.
    last_cell = atm.parse(atm.build(atm.Cell(0, 32, atm.PTI_AUU, payload=pdu[-48:])))
    with PcapWriter.open(path, LinkType.SUNATM) as writer:
        writer.write(0.0000027, pcap.sunatm_record_from_pdu(last_cell.vpi, last_cell.vci, pdu))
        writer.write(0.0000054, pcap.sunatm_record(0, 33, b"U-Net/ATM reply", outgoing=True))
    rows = tshark_fields(
        path,
        "frame.time_epoch",
        "frame.protocols",
        "atm.vpi",
        "atm.vci",
        "atm.aal",
        "atm.channel",
        "frame.len",
    )
    assert rows == [
        ["0.000002700", "atm:data", "0", "32", "4", "1", str(len(message) + 10)],
        ["0.000005400", "atm:data", "0", "33", "4", "0", "15"],
    ]
