"""ARQ PDU format: golden bytes, round trips, malformed input, fast codec vs construct."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import FormatError
from stacklib.layers.arq import wire
from stacklib.layers.arq.wire import (
    HEADER_CODEC,
    HEADER_FORMAT,
    ArqErrorKind,
    ArqFormatError,
    Pdu,
    PduType,
    build,
    parse,
    parse_reference,
)
from stacklib.wire import registry

GOLDEN = [
    (Pdu.data(0, b""), "010000"),
    (Pdu.data(1, b"hi"), "0100016869"),
    (Pdu.data(0xABCD, b"\x00\xff"), "01abcd00ff"),
    (Pdu.ack(0), "020000"),
    (Pdu.ack(0xFFFF), "02ffff"),
    (Pdu.ack(0x0102), "020102"),
]


@pytest.mark.parametrize(("pdu", "hex_bytes"), GOLDEN)
def test_golden_bytes(pdu: Pdu, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes)
    assert build(pdu) == data
    assert parse(data) == pdu
    assert parse_reference(data) == pdu
    assert HEADER_FORMAT.build({"type": data[0], "seq": pdu.seq}) == data[:3]


@given(wire.pdus())
def test_round_trip(pdu: Pdu) -> None:
    data = build(pdu)
    assert len(data) == wire.HEADER_SIZE + len(pdu.payload)
    for form in (data, bytearray(data), memoryview(data)):
        parsed = parse(form)
        assert parsed == pdu
        assert type(parsed.payload) is bytes
        assert parse_reference(form) == pdu


@given(wire.pdus(), st.binary(min_size=1, max_size=20))
def test_trailing_bytes(pdu: Pdu, extra: bytes) -> None:
    # No length field: after a DATA header everything is payload; an ACK must end after seq.
    data = build(pdu) + extra
    if pdu.type is PduType.DATA:
        assert parse(data) == Pdu.data(pdu.seq, pdu.payload + extra)
    else:
        with pytest.raises(ArqFormatError) as info:
            parse(data)
        assert info.value.kind is ArqErrorKind.ACK_PAYLOAD


@given(wire.pdus(max_payload=8))
def test_every_prefix_shorter_than_the_header_is_short(pdu: Pdu) -> None:
    data = build(pdu)
    for size in range(wire.HEADER_SIZE):
        with pytest.raises(ArqFormatError) as info:
            parse(data[:size])
        assert info.value.kind is ArqErrorKind.SHORT
        with pytest.raises(ArqFormatError):
            parse_reference(data[:size])


@pytest.mark.parametrize(
    ("hex_bytes", "kind"),
    [
        ("", ArqErrorKind.SHORT),
        ("01", ArqErrorKind.SHORT),
        ("0100", ArqErrorKind.SHORT),
        ("000000", ArqErrorKind.UNKNOWN_TYPE),
        ("030000", ArqErrorKind.UNKNOWN_TYPE),
        ("ff0000aa", ArqErrorKind.UNKNOWN_TYPE),
        ("02000000", ArqErrorKind.ACK_PAYLOAD),
    ],
)
def test_malformed(hex_bytes: str, kind: ArqErrorKind) -> None:
    data = bytes.fromhex(hex_bytes)
    for parser in (parse, parse_reference):
        with pytest.raises(ArqFormatError) as info:
            parser(data)
        assert info.value.kind is kind
        assert str(info.value).startswith("ARQ: ")
        assert isinstance(info.value, FormatError)


@given(st.binary(max_size=40))
def test_any_bytes_parse_or_raise_only_format_error(data: bytes) -> None:
    try:
        fast = parse(data)
    except ArqFormatError as error:
        with pytest.raises(ArqFormatError) as reference_error:
            parse_reference(data)
        assert reference_error.value.kind is error.kind
    else:
        assert parse_reference(data) == fast
        assert build(fast) == data


@given(st.integers(0, 255), st.integers(0, 0xFFFF))
def test_fast_codec_agrees_with_construct(kind: int, seq: int) -> None:
    packed = HEADER_CODEC.pack(kind, seq)
    assert packed == HEADER_FORMAT.build({"type": kind, "seq": seq})
    assert HEADER_CODEC.unpack(packed) == (kind, seq)
    value = HEADER_FORMAT.parse(packed)
    assert (value.type, value.seq) == (kind, seq)
    assert HEADER_CODEC.names == ("type", "seq")
    assert HEADER_CODEC.size == wire.HEADER_SIZE == HEADER_FORMAT.sizeof()


@pytest.mark.parametrize(
    "pdu",
    [Pdu.data(-1, b""), Pdu.data(0x10000, b"x"), Pdu.ack(0x10000), Pdu(PduType.ACK, 1, b"x")],
)
def test_build_rejects_bad_values(pdu: Pdu) -> None:
    with pytest.raises(ValueError):
        build(pdu)


def test_registered_for_decode() -> None:
    text = registry.decode("arq", bytes.fromhex("0100076869"))
    assert "DATA" in text
    assert "7" in text
