"""TCP segment format: golden bytes, round trips, options, malformed input, checksum, and the
fast codec against the construct definition."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.layers.tcp import wire
from stacklib.layers.tcp.wire import (
    HEADER_CODEC,
    HEADER_FORMAT,
    Segment,
    TcpErrorKind,
    TcpFlags,
    TcpFormatError,
    TcpOptions,
    build,
    checksum,
    internet_checksum,
    parse,
    parse_reference,
)

SRC = bytes([10, 0, 0, 1])
DST = bytes([10, 0, 0, 2])

# A SYN from 10.0.0.1:40000 to 10.0.0.2:80, ISN 1000, window 8192, MSS 2048.  The checksum was
# computed by hand: pseudo-header 0a00+0001+0a00+0002+0006+0018 = 0x1421; header words
# 9c40+0050+03e8+6002+2000+0204+0800 = 0x12a7e; 0x1421+0x12a7e = 0x13e9f -> fold 0x3ea0 ->
# complement 0xc15f.
GOLDEN_SYN = bytes.fromhex("9c400050000003e80000000060022000c15f000002040800")
SYN = Segment(
    src_port=40000,
    dst_port=80,
    seq=1000,
    flags=TcpFlags.SYN,
    window=8192,
    checksum=0xC15F,
    options=TcpOptions(mss=2048),
)


def test_golden_syn() -> None:
    assert build(SYN, SRC, DST) == GOLDEN_SYN
    assert build(SYN) == GOLDEN_SYN  # no addresses: the checksum field is written as given
    assert parse(GOLDEN_SYN, SRC, DST) == SYN
    assert parse_reference(GOLDEN_SYN, SRC, DST) == SYN
    assert checksum(GOLDEN_SYN, SRC, DST) == 0
    assert checksum(GOLDEN_SYN, 0x0A000001, 0x0A000002) == 0  # addresses as ints


def test_golden_rst_ack_with_payload() -> None:
    seg = Segment(
        src_port=1,
        dst_port=2,
        seq=0xFFFFFFFF,
        ack=7,
        flags=TcpFlags.RST | TcpFlags.ACK | TcpFlags.NS,
        window=0,
        urgent=3,
        payload=b"xy",
    )
    data = build(seg)
    assert (
        data
        == bytes.fromhex("00010002ffffffff00000007" + "5114" + "0000" + "0000" + "0003") + b"xy"
    )


def test_internet_checksum_rfc1071_example() -> None:
    # RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to 0xddf2; the checksum is its complement.
    assert internet_checksum(bytes.fromhex("0001f203f4f5f6f7")) == 0xFFFF - 0xDDF2
    assert internet_checksum(b"\x01") == 0xFFFF - 0x0100  # odd length: padded with a zero byte
    assert internet_checksum(b"") == 0xFFFF


@given(st.binary(max_size=64))
def test_internet_checksum_matches_naive(data: bytes) -> None:
    padded = data + b"\x00" * (len(data) & 1)
    total = sum(struct.unpack(f">{len(padded) // 2}H", padded))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    assert internet_checksum(data) == ~total & 0xFFFF


@given(wire.segments())
def test_round_trip(seg: Segment) -> None:
    data = build(seg)
    for form in (data, bytearray(data), memoryview(data)):
        assert parse(form) == seg
        assert parse_reference(form) == seg
    with_sum = build(seg, SRC, DST)
    assert checksum(with_sum, SRC, DST) == 0
    parsed = parse(with_sum, SRC, DST)
    assert attrs_evolve_checksum(parsed, seg.checksum) == seg


def attrs_evolve_checksum(seg: Segment, value: int) -> Segment:
    import attrs

    return attrs.evolve(seg, checksum=value)


@given(wire.segments(max_payload=16), st.integers(0, 10_000), st.integers(0, 7))
def test_corruption_caught_by_checksum(seg: Segment, where: int, bit: int) -> None:
    data = bytearray(build(seg, SRC, DST))
    data[where % len(data)] ^= 1 << bit
    with pytest.raises(TcpFormatError) as info:
        parse(bytes(data), SRC, DST)
    # Flipping the data offset may be caught before the checksum is looked at.
    assert info.value.kind in (TcpErrorKind.CHECKSUM, TcpErrorKind.BAD_OFFSET)


@given(st.binary(max_size=80))
def test_malformed_raises_only_tcp_format_error(data: bytes) -> None:
    for parser in (parse, parse_reference):
        with contextlib.suppress(TcpFormatError):
            parser(data)
        with contextlib.suppress(TcpFormatError):
            parser(data, SRC, DST)


@given(st.binary(min_size=20, max_size=20))
def test_codec_agrees_with_construct(head: bytes) -> None:
    fields = HEADER_CODEC.unpack(head)
    reference = HEADER_FORMAT.parse(head)
    names = HEADER_CODEC.names
    values = dict(zip(names, fields, strict=True))
    assert values["src_port"] == reference.src_port
    assert values["seq"] == reference.seq
    assert values["data_offset"] == reference.control.data_offset
    for flag in ("ns", "cwr", "ece", "urg", "ack_flag", "psh", "rst", "syn", "fin"):
        assert values[flag] == reference.control[flag]
    assert (values["window"], values["checksum"], values["urgent"]) == (
        reference.window,
        reference.checksum,
        reference.urgent,
    )
    # The codec writes reserved bits as zero, as construct does when given zero.
    packed = HEADER_CODEC.pack(*fields)
    assert packed == HEADER_FORMAT.build(
        {**reference, "control": {**reference.control, "_reserved": 0}}
    )


@given(wire.segments())
def test_fast_parse_agrees_with_codec(seg: Segment) -> None:
    data = build(seg)
    values = dict(zip(HEADER_CODEC.names, HEADER_CODEC.unpack(data), strict=True))
    bits = ("ns", "cwr", "ece", "urg", "ack_flag", "psh", "rst", "syn", "fin")
    flags = 0
    for name in bits:
        flags = (flags << 1) | values[name]
    assert TcpFlags(flags) == seg.flags
    assert values["data_offset"] * 4 == len(data) - len(seg.payload)


def header(offset: int, options: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">HHIIHHHH", 1, 2, 3, 4, (offset << 12) | 0x10, 5, 0, 0) + options + payload


def test_unknown_options_skipped_and_nop_eol() -> None:
    opts = bytes([1, 99, 4, 0xAA, 0xBB, 2, 4, 0x05, 0xB4]) + bytes([0, 0, 0])
    seg = parse(header(8, opts))
    assert seg.options == TcpOptions(mss=1460)
    # SACK blocks (kind 5) are skipped too; bytes after EOL are ignored.
    opts = bytes([5, 10]) + bytes(8) + bytes([0, 0x77])
    assert parse(header(8, opts)).options == TcpOptions()


def test_all_options_parse() -> None:
    opts = TcpOptions(mss=2048, window_scale=7, sack_permitted=True, timestamps=(1, 2))
    encoded = opts.encode()
    assert len(encoded) % 4 == 0
    assert parse(header(5 + len(encoded) // 4, encoded)).options == opts


@pytest.mark.parametrize(
    "opts",
    [
        bytes([1, 2, 4, 0]),  # MSS runs past the options area
        bytes([99, 1, 0, 0]),  # length below 2
        bytes([99, 0, 0, 0]),
        bytes([2, 3, 0, 0]),  # MSS with the wrong length
        bytes([3, 4, 0, 0]),  # window scale with the wrong length
        bytes([1, 1, 1, 8]),  # a kind with no length byte
    ],
)
def test_malformed_options(opts: bytes) -> None:
    with pytest.raises(TcpFormatError) as info:
        parse(header(6, opts))
    assert info.value.kind is TcpErrorKind.BAD_OPTION
    with pytest.raises(TcpFormatError):
        parse_reference(header(6, opts))


@pytest.mark.parametrize(("offset", "size"), [(4, 20), (0, 20), (6, 20), (15, 59)])
def test_bad_data_offset(offset: int, size: int) -> None:
    data = header(offset, b"")[:20] + bytes(size - 20)
    with pytest.raises(TcpFormatError) as info:
        parse(data)
    assert info.value.kind is TcpErrorKind.BAD_OFFSET


def test_short() -> None:
    with pytest.raises(TcpFormatError) as info:
        parse(GOLDEN_SYN[:19])
    assert info.value.kind is TcpErrorKind.SHORT
    with pytest.raises(TcpFormatError):
        HEADER_CODEC.unpack(b"\x00" * 19)


def test_build_rejects_caller_mistakes() -> None:
    with pytest.raises(ValueError, match="out of range"):
        build(Segment(src_port=70000, dst_port=1, seq=0))
    with pytest.raises(ValueError, match="out of range"):
        build(Segment(src_port=1, dst_port=1, seq=1 << 32))
    with pytest.raises(ValueError, match="4 bytes"):
        build(SYN, b"\x01\x02\x03", DST)


def test_trailing_bytes_are_payload() -> None:
    seg = parse(GOLDEN_SYN + b"abc")
    assert seg.payload == b"abc"
    assert seg.seg_len == 4  # SYN counts one
    assert "SYN" in str(seg)


# --- the per-connection header template and the one-call checksum check ------------------------

_U16 = st.integers(0, 0xFFFF)
_U32 = st.integers(0, 0xFFFFFFFF)
# Payloads on both sides of the checksum's numpy threshold (1024 bytes), odd and even.
_PAYLOADS = st.binary(max_size=40) | st.binary(min_size=1000, max_size=2100)


_ADDRESS = st.binary(min_size=4, max_size=4)


@given(_U16, _U16, _U32, _U32, st.integers(0, 0x1FF), _U16, _PAYLOADS, _ADDRESS, st.data())
def test_header_template_builds_what_build_fields_builds(
    sport: int,
    dport: int,
    seq: int,
    ack: int,
    flags: int,
    window: int,
    payload: bytes,
    src: bytes,
    data: st.DataObject,
) -> None:
    dst = data.draw(_ADDRESS | st.just(src))
    summed = wire.HeaderTemplate(sport, dport, src, dst).build(seq, ack, flags, window, payload)
    assert summed == wire.build_fields(sport, dport, seq, ack, flags, window, payload, src, dst)
    assert checksum(summed, src, dst) == 0
    assert wire.sum_ok(summed, wire.pseudo_sum(src, dst))
    plain = wire.HeaderTemplate(sport, dport).build(seq, ack, flags, window, bytearray(payload))
    assert plain == wire.build_fields(sport, dport, seq, ack, flags, window, payload)


@given(wire.segments(max_payload=1100), st.integers(0, 10_000), st.integers(0, 7))
def test_sum_ok_agrees_with_checksum(seg: Segment, where: int, bit: int) -> None:
    pair = wire.pseudo_sum(SRC, DST)
    data = bytearray(build(seg, SRC, DST))
    assert wire.sum_ok(data, pair)
    data[where % len(data)] ^= 1 << bit
    assert wire.sum_ok(data, pair) == (checksum(data, SRC, DST) == 0)
    assert not wire.sum_ok(data, pair)  # a single flipped bit always changes the sum


def test_header_template_rejects_caller_mistakes() -> None:
    with pytest.raises(ValueError, match="out of range"):
        wire.HeaderTemplate(70000, 1)
    template = wire.HeaderTemplate(1, 2, SRC, DST)
    for seq, flags, window in ((1 << 32, 0x10, 0), (-(1 << 40), 0x10, 0), (0, 0x200, 0)):
        with pytest.raises(ValueError, match="out of range"):
            template.build(seq, 0, flags, window, b"")
    with pytest.raises(ValueError, match="out of range"):
        template.build(0, 0, 0x10, 1 << 16, b"x")
