"""U-Net/FE frames: golden bytes, round trips, agreement with construct, bad input, FCS, MACs."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.wire import unet_eth as u
from stacklib.wire.unet_eth import UNetEthFormatError, UNetFrame

DST = bytes.fromhex("020000000002")
SRC = bytes.fromhex("020000000001")

# A 40-byte message (paper 003 Fig 3: "60 bytes with the Ethernet and U-Net headers").
GOLDEN_40 = bytes.fromhex(
    "020000000002"  # destination MAC
    "020000000001"  # source MAC
    "88b5"  # EtherType: Local Experimental 1
    "0028"  # message length 40
    "07"  # U-Net port 7
    "000102030405060708090a0b0c0d0e0f1011121314151617"  # the message: bytes 0..39
    "18191a1b1c1d1e1f2021222324252627"
    "000000"  # padding to the 46-byte minimum payload
)
FRAME_40 = UNetFrame(DST, SRC, 7, bytes(range(40)))


def test_constants() -> None:
    assert u.ETHERTYPE_UNET == 0x88B5
    assert u.MAX_MESSAGE == 1497
    assert u.HEADER_SIZE == 17 == u.HEADER_CODEC.size == u.HEADER_FORMAT.sizeof()
    assert u.MIN_FRAME == 60
    assert UNetFrame.ethertype == 0x88B5
    assert u.HEADER_CODEC.names == ("dst", "src", "length", "port")


def test_golden_40_byte_message_is_a_60_byte_frame() -> None:
    assert len(GOLDEN_40) == 60
    assert u.build(FRAME_40) == GOLDEN_40
    assert u.parse(GOLDEN_40) == FRAME_40
    assert u.parse_reference(GOLDEN_40) == FRAME_40
    assert u.parse(bytearray(GOLDEN_40)) == FRAME_40
    assert u.parse(memoryview(GOLDEN_40)) == FRAME_40


def test_golden_empty_and_maximum() -> None:
    empty = u.build(UNetFrame(DST, SRC, 0, b""))
    assert empty == DST + SRC + bytes.fromhex("88b5000000") + bytes(43)
    largest = u.build(UNetFrame(DST, SRC, 255, b"\xaa" * 1497))
    assert len(largest) == 1514  # the longest Ethernet frame without FCS
    assert largest[14:17] == bytes.fromhex("05d9ff")
    assert (
        u.build(UNetFrame(DST, SRC, 0, b"x" * 43))
        == DST + SRC + b"\x88\xb5\x00\x2b\x00" + b"x" * 43
    )


def test_unpadded_build_and_lenient_parse() -> None:
    short = u.build(FRAME_40, pad=False)
    assert short == GOLDEN_40[:57]
    with pytest.raises(UNetEthFormatError, match="minimum"):
        u.parse(short)
    assert u.parse(short, strict_min=False) == FRAME_40
    assert u.parse_reference(short, strict_min=False) == FRAME_40


@given(u.frames())
def test_round_trip(frame: UNetFrame) -> None:
    raw = u.build(frame)
    assert len(raw) == max(60, 17 + len(frame.payload))
    assert u.parse(raw) == frame == u.parse_reference(raw)
    assert u.parse(u.build(frame, pad=False), strict_min=False) == frame


@given(u.frames(max_payload=100), st.binary(min_size=1, max_size=20))
def test_bytes_after_the_message_are_padding(frame: UNetFrame, extra: bytes) -> None:
    raw = u.build(frame) + extra
    assert u.parse(raw) == frame == u.parse_reference(raw)


@given(u.frames())
def test_build_equals_construct_build(frame: UNetFrame) -> None:
    length = len(frame.payload)
    header = {"dst": frame.dst, "src": frame.src, "length": length, "port": frame.port}
    assert u.HEADER_CODEC.pack(frame.dst, frame.src, length, frame.port) == u.HEADER_FORMAT.build(
        header
    )
    padding = bytes(max(0, 43 - length))
    container = {"header": header, "payload": frame.payload, "padding": padding}
    assert u.build(frame) == u.FRAME_FORMAT.build(container)


# --- bad input ---------------------------------------------------------------------------------


def _outcome(parse: Any, raw: bytes | bytearray, strict_min: bool) -> Any:
    try:
        return parse(raw, strict_min=strict_min)
    except UNetEthFormatError:
        return UNetEthFormatError


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    raw = bytearray(u.build(draw(u.frames(max_payload=80))))
    how = draw(st.sampled_from(["set", "cut", "header"]))
    if how == "set":
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        del raw[draw(st.integers(0, len(raw))) :]
    else:  # one bit of the EtherType or the length field
        raw[draw(st.integers(12, 15))] ^= 1 << draw(st.integers(0, 7))
    return bytes(raw)


@given(st.binary(max_size=80) | damaged(), st.booleans())
def test_any_input_gives_a_frame_or_the_format_error_and_both_parsers_agree(
    raw: bytes, strict_min: bool
) -> None:
    frozen = bytearray(raw)
    fast = _outcome(u.parse, frozen, strict_min)
    assert frozen == raw  # the parser never mutates its input
    assert fast == _outcome(u.parse_reference, raw, strict_min)


@given(st.binary(min_size=1, max_size=2000))
def test_lengths_past_the_maximum_agree(payload: bytes) -> None:
    # Length fields of up to 2000 with the data present: only MAX_MESSAGE stops them.
    raw = DST + SRC + b"\x88\xb5" + len(payload).to_bytes(2, "big") + b"\x00" + payload
    fast = _outcome(u.parse, raw, False)
    assert fast == _outcome(u.parse_reference, raw, False)
    assert (fast is UNetEthFormatError) == (len(payload) > u.MAX_MESSAGE)


BAD = [
    ("shorter than 60", GOLDEN_40[:59], True, "minimum"),
    ("shorter than the header", GOLDEN_40[:16], False, "header"),
    ("wrong EtherType", GOLDEN_40[:12] + b"\x08\x00" + GOLDEN_40[14:], True, "U-Net"),
    ("length past the data", GOLDEN_40[:14] + b"\x00\x2c" + GOLDEN_40[16:], True, "follow"),
    (
        "length above MAX_MESSAGE",
        DST + SRC + b"\x88\xb5\x05\xda\x00" + bytes(1498),
        True,
        "MAX_MESSAGE",
    ),
]


@pytest.mark.parametrize(("why", "raw", "strict_min", "match"), BAD, ids=[b[0] for b in BAD])
def test_rejects(why: str, raw: bytes, strict_min: bool, match: str) -> None:
    with pytest.raises(UNetEthFormatError, match=match):
        u.parse(raw, strict_min=strict_min)
    with pytest.raises(UNetEthFormatError, match=match):
        u.parse_reference(raw, strict_min=strict_min)


@pytest.mark.parametrize(
    "frame",
    [
        UNetFrame(DST, SRC, 0, bytes(1498)),
        UNetFrame(DST[:5], SRC, 0, b""),
        UNetFrame(DST, SRC + b"\x00", 0, b""),
        UNetFrame(DST, SRC, 256, b""),
        UNetFrame(DST, SRC, -1, b""),
    ],
)
def test_build_refuses(frame: UNetFrame) -> None:
    with pytest.raises(ValueError):
        u.build(frame)


# --- FCS ---------------------------------------------------------------------------------------


def test_fcs_is_the_standard_crc32() -> None:
    assert u.fcs(b"123456789") == 0xCBF43926  # the CRC-32 check value


@given(st.binary(max_size=200))
def test_fcs_round_trip_and_ethernet_residue(frame: bytes) -> None:
    sent = u.with_fcs(frame)
    assert len(sent) == len(frame) + 4
    assert u.check_fcs(sent) == frame
    # Sent least significant byte first, the CRC over frame and FCS is the Ethernet residue.
    assert zlib.crc32(sent) == 0x2144DF1C


@given(st.binary(min_size=1, max_size=100), st.data())
def test_check_fcs_catches_any_single_bit_error(frame: bytes, data: st.DataObject) -> None:
    sent = bytearray(u.with_fcs(frame))
    sent[data.draw(st.integers(0, len(sent) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(UNetEthFormatError, match="FCS"):
        u.check_fcs(bytes(sent))


def test_check_fcs_too_short() -> None:
    with pytest.raises(UNetEthFormatError):
        u.check_fcs(b"\x00\x00\x00")


# --- MAC helpers -------------------------------------------------------------------------------


def test_mac_helpers() -> None:
    assert u.mac("02:00:5e:00:00:01") == bytes.fromhex("02005e000001")
    assert u.mac("02-00-5E-00-00-01") == bytes.fromhex("02005e000001")
    assert u.mac_str(bytes.fromhex("02005E0000ff")) == "02:00:5e:00:00:ff"


@given(st.binary(min_size=6, max_size=6))
def test_mac_round_trip(raw: bytes) -> None:
    assert u.mac(u.mac_str(raw)) == raw


@pytest.mark.parametrize(
    "text",
    [
        "",
        "02:00:5e:00:00",
        "02:00:5e:00:00:01:02",
        "02:00-5e:00:00:01",
        "0g:00:5e:00:00:01",
        "2:00:5e:00:00:01",
        "02005e000001",
        " 02:00:5e:00:00:01",
    ],
)
def test_mac_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        u.mac(text)


@pytest.mark.parametrize("raw", [b"", b"\x00" * 5, b"\x00" * 7])
def test_mac_str_refuses(raw: bytes) -> None:
    with pytest.raises(ValueError):
        u.mac_str(raw)
