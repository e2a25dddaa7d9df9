"""ATM cell format: HEC vectors, golden bytes, round trips, construct vs derived codec."""

from __future__ import annotations

from typing import Any

import crcmod
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import FormatError
from stacklib.wire import atm, registry
from stacklib.wire.atm import CELL, CELL_SIZE, HEADER, HEADER_CODEC, AtmFormatError, Cell


def reference_hec(header: bytes) -> int:
    """Bit-at-a-time I.432 HEC: polynomial division by x^8 + x^2 + x + 1, then the 0x55 coset."""
    reg = 0
    for byte in header:
        for bit in range(7, -1, -1):
            top = (reg >> 7) ^ ((byte >> bit) & 1)
            reg = (reg << 1) & 0xFF
            if top:
                reg ^= 0x07
    return reg ^ 0x55


# crcmod's generic CRC-8 with the same generator, as a third implementation.
_crcmod_crc8 = crcmod.mkCrcFun(0x107, initCrc=0, rev=False, xorOut=0)

# Published header vectors: I.432 idle cell, I.361 unassigned cell, I.432 physical-layer OAM cell.
HEC_VECTORS = [
    ("00000001", 0x52),
    ("00000000", 0x55),
    ("00000009", 0x6A),
]


@pytest.mark.parametrize(("header", "expected"), HEC_VECTORS)
def test_hec_published_vectors(header: str, expected: int) -> None:
    data = bytes.fromhex(header)
    assert atm.hec(data) == expected
    assert reference_hec(data) == expected
    assert _crcmod_crc8(data) ^ 0x55 == expected


def test_reference_hec_matches_catalogue_check_value() -> None:
    # CRC-8/I-432-1 in the reveng CRC catalogue: check value over "123456789" is 0xA1.
    assert reference_hec(b"123456789") == 0xA1
    assert _crcmod_crc8(b"123456789") ^ 0x55 == 0xA1


@given(st.binary(min_size=4, max_size=4))
def test_hec_table_matches_bitwise_and_crcmod(header: bytes) -> None:
    assert atm.hec(header) == reference_hec(header) == _crcmod_crc8(header) ^ 0x55


def test_golden_cell_bytes() -> None:
    payload = bytes(range(48))
    cell = Cell(vpi=1, vci=2, pti=0b001, clp=0, gfc=3, payload=payload)
    # GFC 0011 | VPI 0000 0001 | VCI 0000 0000 0000 0010 | PTI 001 | CLP 0
    head = bytes.fromhex("30100022")
    expected = head + bytes((reference_hec(head),)) + payload
    assert expected[4] == 0xB0
    assert atm.build(cell) == expected
    assert atm.parse(expected) == cell


def test_all_fields_at_maximum() -> None:
    cell = Cell(vpi=0xFF, vci=0xFFFF, pti=0b111, clp=1, gfc=0xF, payload=b"\xff" * 48)
    data = atm.build(cell)
    assert data[:4] == b"\xff\xff\xff\xff"
    assert data[4] == reference_hec(b"\xff\xff\xff\xff")
    assert atm.parse(data) == cell


@given(atm.cells())
def test_round_trip(cell: Cell) -> None:
    data = atm.build(cell)
    assert len(data) == CELL_SIZE
    assert atm.parse(data) == cell
    assert atm.parse(bytearray(data)) == cell
    assert atm.parse(memoryview(data)) == cell


@given(atm.cells())
def test_construct_definition_agrees_with_build_and_codec(cell: Cell) -> None:
    data = atm.build(cell)
    fields = {"gfc": cell.gfc, "vpi": cell.vpi, "vci": cell.vci, "pti": cell.pti, "clp": cell.clp}
    hec = reference_hec(data[:4])
    built = CELL.build({"header": {"fields": fields, "hec": hec}, "payload": cell.payload})
    assert built == data
    parsed = CELL.parse(data)
    assert {k: parsed.header.fields[k] for k in fields} == fields
    assert parsed.header.hec == hec
    assert HEADER_CODEC.unpack(data) == (cell.gfc, cell.vpi, cell.vci, cell.pti, cell.clp, hec)
    assert HEADER_CODEC.pack(cell.gfc, cell.vpi, cell.vci, cell.pti, cell.clp, hec) == data[:5]
    assert HEADER.sizeof() == HEADER_CODEC.size == 5


def test_codec_field_names() -> None:
    assert HEADER_CODEC.names == ("gfc", "vpi", "vci", "pti", "clp", "hec")


@pytest.mark.parametrize("size", [0, 5, 52, 54, 106])
def test_wrong_size_rejected(size: int) -> None:
    with pytest.raises(AtmFormatError, match="53"):
        atm.parse(bytes(size))


def test_trailing_bytes_rejected() -> None:
    data = atm.build(Cell(vpi=1, vci=2))
    with pytest.raises(AtmFormatError):
        atm.parse(data + b"\x00")


@pytest.mark.parametrize("bit", range(40))
def test_every_single_bit_header_error_detected(bit: int) -> None:
    data = bytearray(atm.build(Cell(vpi=7, vci=300, payload=bytes(range(48)))))
    data[bit // 8] ^= 0x80 >> (bit % 8)
    snapshot = bytes(data)
    with pytest.raises(AtmFormatError, match="HEC"):
        atm.parse(data)
    assert bytes(data) == snapshot  # the parser did not touch its input


def test_hec_check_is_a_policy() -> None:
    data = bytearray(atm.build(Cell(vpi=1, vci=2)))
    data[4] ^= 0xFF
    assert atm.parse(data, check_hec=False) == Cell(vpi=1, vci=2)


def test_error_is_a_format_error() -> None:
    assert issubclass(AtmFormatError, FormatError)


@pytest.mark.parametrize(
    "fields",
    [
        {"vpi": 256},
        {"vpi": -1},
        {"vci": 0x10000},
        {"pti": 8},
        {"clp": 2},
        {"gfc": 16},
    ],
)
def test_build_rejects_out_of_range_fields(fields: dict[str, int]) -> None:
    values: dict[str, Any] = {"vpi": 0, "vci": 0, **fields}
    with pytest.raises(ValueError, match=next(iter(fields))):
        atm.build(Cell(**values))


@pytest.mark.parametrize("size", [0, 47, 49])
def test_build_rejects_wrong_payload_size(size: int) -> None:
    with pytest.raises(ValueError, match="payload"):
        atm.build(Cell(vpi=0, vci=0, payload=bytes(size)))


def test_header_bytes_matches_build() -> None:
    cell = Cell(vpi=9, vci=1234, pti=0b011, clp=1, gfc=5)
    assert atm.header_bytes(9, 1234, 0b011, 1, 5) == atm.build(cell)[:5]


def test_describe_names_the_auu_bit() -> None:
    rows = dict(atm.describe(Cell(vpi=1, vci=2, pti=atm.PTI_AUU)))
    assert (rows["vpi"], rows["vci"]) == (1, 2)
    assert "AUU" in str(rows["pti"])
    assert "OAM" in str(dict(atm.describe(Cell(vpi=1, vci=2, pti=0b101)))["pti"])


def test_registered_for_decode() -> None:
    assert "atm-cell" in registry.formats()
    text = registry.decode("atm-cell", atm.build(Cell(vpi=1, vci=2, pti=1)))
    assert "vci: 2" in text
    assert "AUU" in text
    with pytest.raises(AtmFormatError):
        registry.decode("atm-cell", bytes(53))  # HEC of 00 00 00 00 is 0x55, not 0


@given(atm.cells(vpi=3, vci=77))
def test_cells_strategy_can_pin_the_vc(cell: Cell) -> None:
    assert (cell.vpi, cell.vci) == (3, 77)
    assert len(cell.payload) == 48
