"""UAM PDU format: golden bytes, round trips, malformed input, fast codecs vs construct."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import FormatError
from stacklib.layers.uam import wire
from stacklib.layers.uam.wire import (
    BULK_CODEC,
    BULK_FORMAT,
    HEADER_CODEC,
    HEADER_FORMAT,
    Bulk,
    Pdu,
    PduType,
    UamErrorKind,
    UamFormatError,
    build,
    parse,
    parse_reference,
)
from stacklib.wire import registry

R, P, A, S, G, GR = (
    PduType.REQUEST,
    PduType.REPLY,
    PduType.ACK,
    PduType.STORE,
    PduType.GET,
    PduType.GET_REPLY,
)
BULK = Bulk(region=2, xfer=3, offset=0x10, total=5, chunk=2)

GOLDEN = [
    (Pdu(R, 1, 2, 7), "0107000100020000"),
    (Pdu(R, 0xFFFF, 0, 255, (1, 0xFFFFFFFF)), "01ffffff0000020000000001ffffffff"),
    (Pdu(P, 5, 6, 9, (0xA,)), "02090005000601000000000a"),
    (Pdu(A, ack=0x1234), "0300000012340000"),
    (
        Pdu(S, 1, 1, 4, (), BULK, b"abc"),
        "040400010001000000020003000000100000000500000002616263",
    ),
    (
        Pdu(G, 2, 0, 0, (3,), BULK),
        "05000002000001000000000300020003000000100000000500000002",
    ),
    (
        Pdu(GR, 3, 3, 1, (), BULK),
        "060100030003000000020003000000100000000500000002",
    ),
]


@pytest.mark.parametrize(("pdu", "hex_bytes"), GOLDEN)
def test_golden_bytes(pdu: Pdu, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes)
    assert build(pdu) == data
    assert parse(data) == pdu
    assert parse_reference(data) == pdu


def test_four_word_request_fits_one_atm_cell() -> None:
    # 40 bytes is a cell's payload less the AAL5 trailer (paper 000 §5.2: single-cell requests).
    assert len(build(Pdu(R, 0, 0, 1, (1, 2, 3, 4)))) == 24 <= 40
    assert wire.MAX_OVERHEAD == 40


@given(wire.pdus())
def test_round_trip(pdu: Pdu) -> None:
    data = build(pdu)
    for form in (data, bytearray(data), memoryview(data)):
        parsed = parse(form)
        assert parsed == pdu
        assert type(parsed.data) is bytes
        assert parse_reference(form) == pdu


@given(wire.pdus(), st.binary(min_size=1, max_size=20))
def test_trailing_bytes(pdu: Pdu, extra: bytes) -> None:
    # No length field: after a STORE or successful GET_REPLY header everything is data (if it
    # fits the transfer); any other PDU must end where its fields end.
    data = build(pdu) + extra
    carries = pdu.type is S or (pdu.type is GR and pdu.handler == wire.STATUS_OK)
    bulk = pdu.bulk
    if carries and bulk is not None and bulk.chunk + len(pdu.data + extra) <= bulk.total:
        assert parse(data) == attrs.evolve(pdu, data=pdu.data + extra)
        return
    with pytest.raises(UamFormatError) as info:
        parse(data)
    kinds = (UamErrorKind.TRAILING, UamErrorKind.BAD_CHUNK, UamErrorKind.BAD_SHAPE)
    assert info.value.kind in kinds


@given(wire.pdus(max_data=8))
def test_every_truncation_raises(pdu: Pdu) -> None:
    data = build(pdu)
    cut = len(data) - len(pdu.data)  # everything before the data is required
    for size in range(cut):
        with pytest.raises(UamFormatError) as info:
            parse(data[:size])
        expected = UamErrorKind.SHORT if size < wire.HEADER_SIZE else UamErrorKind.TRUNCATED
        assert info.value.kind is expected
        with pytest.raises(UamFormatError):
            parse_reference(data[:size])


@pytest.mark.parametrize(
    ("hex_bytes", "kind"),
    [
        ("", UamErrorKind.SHORT),
        ("01000000000000", UamErrorKind.SHORT),
        ("0000000000000000", UamErrorKind.UNKNOWN_TYPE),
        ("0700000000000000", UamErrorKind.UNKNOWN_TYPE),
        ("0100000000000500", UamErrorKind.TOO_MANY_ARGS),
        ("0100000000000100", UamErrorKind.TRUNCATED),
        ("04000000000000000000", UamErrorKind.TRUNCATED),
        ("0100000000000000ff", UamErrorKind.TRAILING),
        ("0300000000000000ff", UamErrorKind.TRAILING),
        ("0301000000000000", UamErrorKind.BAD_SHAPE),
        ("0300000100000000", UamErrorKind.BAD_SHAPE),
        ("0500000000000000" + "00" * 16, UamErrorKind.BAD_SHAPE),
        ("040000000000000000000000000000000000000100000000aabb", UamErrorKind.BAD_CHUNK),
        ("05000000000001000000000900000000000000000000000800000000", UamErrorKind.BAD_CHUNK),
        ("060100000000000000000000000000000000000400000000aa", UamErrorKind.BAD_SHAPE),
    ],
)
def test_malformed(hex_bytes: str, kind: UamErrorKind) -> None:
    data = bytes.fromhex(hex_bytes)
    for parser in (parse, parse_reference):
        with pytest.raises(UamFormatError) as info:
            parser(data)
        assert info.value.kind is kind
        assert str(info.value).startswith("UAM: ")
        assert isinstance(info.value, FormatError)


@given(st.binary(max_size=48))
def test_any_bytes_parse_or_raise_only_format_error(data: bytes) -> None:
    try:
        fast = parse(data)
    except UamFormatError as error:
        with pytest.raises(UamFormatError) as reference_error:
            parse_reference(data)
        assert reference_error.value.kind is error.kind
    else:
        assert parse_reference(data) == fast
        # The reserved byte is the one field build() does not reproduce.
        rebuilt = build(fast)
        assert rebuilt[:7] == data[:7] and rebuilt[8:] == data[8:]


@given(
    st.integers(0, 255),
    st.integers(0, 255),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFF),
    st.integers(0, 255),
)
def test_header_codec_agrees_with_construct(
    kind: int, handler: int, seq: int, ack: int, nargs: int
) -> None:
    values = {"type": kind, "handler": handler, "seq": seq, "ack": ack, "nargs": nargs}
    packed = HEADER_CODEC.pack(kind, handler, seq, ack, nargs)
    assert packed == HEADER_FORMAT.build({**values, "_reserved": 0})
    assert HEADER_CODEC.unpack(packed) == (kind, handler, seq, ack, nargs)
    parsed = HEADER_FORMAT.parse(packed)
    assert {k: parsed[k] for k in values} == values
    assert HEADER_CODEC.size == wire.HEADER_SIZE == HEADER_FORMAT.sizeof()


@given(
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFFFFFF),
    st.integers(0, 0xFFFFFFFF),
    st.integers(0, 0xFFFFFFFF),
)
def test_bulk_codec_agrees_with_construct(
    region: int, xfer: int, offset: int, total: int, chunk: int
) -> None:
    values = {"region": region, "xfer": xfer, "offset": offset, "total": total, "chunk": chunk}
    packed = BULK_CODEC.pack(region, xfer, offset, total, chunk)
    assert packed == BULK_FORMAT.build(values)
    assert BULK_CODEC.unpack(packed) == (region, xfer, offset, total, chunk)
    assert BULK_CODEC.names == tuple(values)
    assert BULK_CODEC.size == wire.BULK_SIZE == BULK_FORMAT.sizeof()


@pytest.mark.parametrize(
    "pdu",
    [
        Pdu(R, -1),
        Pdu(R, 0x10000),
        Pdu(R, 0, 0, 256),
        Pdu(R, 0, 0, 0, (1, 2, 3, 4, 5)),
        Pdu(R, 0, 0, 0, (1 << 32,)),
        Pdu(R, 0, 0, 0, (), BULK),
        Pdu(S, 0, 0, 0, ()),
        Pdu(P, 0, 0, 0, (), None, b"x"),
    ],
)
def test_build_rejects_bad_values(pdu: Pdu) -> None:
    with pytest.raises(ValueError):
        build(pdu)


def test_registered_for_decode() -> None:
    text = registry.decode("uam", bytes.fromhex("0107000100020000"))
    assert "REQUEST" in text


@given(wire.pdus(max_data=8))
def test_small_codecs_agree_with_build_and_parse(pdu: Pdu) -> None:
    if pdu.bulk is not None:
        return
    nargs = len(pdu.args)
    codec = wire.SMALL_CODECS[nargs]
    packed = codec.pack(pdu.type, pdu.handler, pdu.seq, pdu.ack, nargs, *pdu.args)
    assert packed == build(pdu)
    kind, handler, seq, ack, count, *args = codec.unpack(packed)
    assert (PduType(kind), handler, seq, ack, tuple(args)) == (
        pdu.type,
        pdu.handler,
        pdu.seq,
        pdu.ack,
        pdu.args,
    )
    assert count == nargs


@given(wire.pdus(max_data=8))
def test_the_machines_fixed_arity_pack_agrees_with_build(pdu: Pdu) -> None:
    from stacklib.layers.uam.machine_core import _pack_small

    if pdu.bulk is not None:
        return
    assert _pack_small(int(pdu.type), pdu.handler, pdu.seq, pdu.ack, pdu.args) == build(pdu)
