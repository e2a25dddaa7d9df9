"""AAL5 CPCS-PDU: CRC-32/BZIP2 implementations, golden PDUs, round trips, error order."""

from __future__ import annotations

import random

import crcmod.predefined
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import FormatError
from stacklib.wire import aal5, registry
from stacklib.wire.aal5 import (
    MAX_CELLS,
    MAX_PAYLOAD,
    TRAILER,
    TRAILER_CODEC,
    Aal5ErrorKind,
    Aal5FormatError,
    Aal5Pdu,
    build_pdu,
    cells_needed,
    crc32_bzip2,
    parse_pdu,
)

# crcmod's catalogue entry, independent of the initCrc convention aal5.py has to get right.
_catalogue_crc = crcmod.predefined.mkPredefinedCrcFun("crc-32-bzip2")


def reference_crc(data: bytes) -> int:
    """Bit-at-a-time CRC-32/BZIP2: MSB first, register preset to ones, complemented."""
    reg = 0xFFFFFFFF
    for byte in data:
        reg ^= byte << 24
        for _ in range(8):
            reg = ((reg << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if reg & 0x80000000 else reg << 1
    return reg ^ 0xFFFFFFFF


def test_check_value_every_implementation() -> None:
    for crc in (crc32_bzip2, aal5._crc_crcmod, aal5._crc_mirror, _catalogue_crc, reference_crc):
        assert crc(b"123456789") == 0xFC891918, crc


@given(st.binary(max_size=300))
def test_implementations_agree_with_reference(data: bytes) -> None:
    expected = reference_crc(data)
    assert aal5._crc_crcmod(data) == expected
    assert aal5._crc_mirror(data) == expected
    assert crc32_bzip2(data) == expected


@given(st.integers(0, 9000), st.randoms(use_true_random=False))
def test_mirror_agrees_with_crcmod_on_large_data(size: int, rnd: random.Random) -> None:
    data = rnd.randbytes(size)
    assert aal5._crc_mirror(data) == _catalogue_crc(data) == crc32_bzip2(data)
    assert crc32_bzip2(bytearray(data)) == crc32_bzip2(memoryview(data)) == _catalogue_crc(data)


# The three 40-octet example PDUs (I.363.5 examples, widely reproduced as "AAL-5 test #1-#3").
GOLDEN = [
    (bytes(40), "00000028864d7f99"),
    (b"\xff" * 40, "00000028c55e457a"),
    (bytes(range(1, 41)), "00000028bf671ed0"),
]


@pytest.mark.parametrize(("payload", "trailer"), GOLDEN)
def test_golden_pdus(payload: bytes, trailer: str) -> None:
    pdu = build_pdu(payload)
    assert pdu == payload + bytes.fromhex(trailer)
    assert parse_pdu(pdu) == Aal5Pdu(payload, 0, 0)


def test_golden_padding_and_trailer_fields() -> None:
    pdu = build_pdu(b"hello", uu=0xAB, cpi=0)
    assert len(pdu) == 48
    assert pdu[:5] == b"hello"
    assert pdu[5:40] == bytes(35)
    assert pdu[40:44] == bytes.fromhex("ab000005")
    assert int.from_bytes(pdu[44:], "big") == reference_crc(pdu[:44])


@given(st.binary(max_size=500))
def test_crc_residue_over_whole_pdu(payload: bytes) -> None:
    # A CRC over data followed by its own CRC leaves a constant: the catalogue's residue
    # 0xC704DD7B, complemented by the output XOR.
    assert crc32_bzip2(build_pdu(payload)) == 0xC704DD7B ^ 0xFFFFFFFF


@given(aal5.pdus())
def test_round_trip(value: Aal5Pdu) -> None:
    pdu = build_pdu(value.payload, value.uu, value.cpi)
    assert len(pdu) == 48 * cells_needed(len(value.payload))
    assert parse_pdu(pdu) == value
    assert parse_pdu(bytearray(pdu)) == value
    assert parse_pdu(memoryview(pdu)) == value


@pytest.mark.parametrize("size", [0, 1, 39, 40, 41, 47, 48, 49, 88, 89, 95, 96, MAX_PAYLOAD])
def test_round_trip_edge_sizes(size: int) -> None:
    payload = bytes(i & 0xFF for i in range(size))
    pdu = build_pdu(payload, uu=1, cpi=2)
    assert len(pdu) % 48 == 0
    assert 0 <= len(pdu) - 8 - size < 48
    assert parse_pdu(pdu) == Aal5Pdu(payload, 1, 2)


@pytest.mark.parametrize(
    ("size", "cells"),
    [(0, 1), (1, 1), (40, 1), (41, 2), (88, 2), (89, 3), (MAX_PAYLOAD, 1366)],
)
def test_cells_needed(size: int, cells: int) -> None:
    assert cells_needed(size) == cells
    assert len(build_pdu(bytes(size))) == 48 * cells


def test_max_cells() -> None:
    assert MAX_CELLS == 1366


@pytest.mark.parametrize("size", [-1, MAX_PAYLOAD + 1])
def test_cells_needed_range(size: int) -> None:
    with pytest.raises(ValueError):
        cells_needed(size)


def test_build_limits() -> None:
    with pytest.raises(ValueError, match="65535"):
        build_pdu(bytes(MAX_PAYLOAD + 1))
    with pytest.raises(ValueError):
        build_pdu(b"", uu=256)
    with pytest.raises(ValueError):
        build_pdu(b"", cpi=-1)


@given(
    st.integers(0, 0xFF), st.integers(0, 0xFF), st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1)
)
def test_trailer_codec_agrees_with_construct(uu: int, cpi: int, length: int, crc: int) -> None:
    values = {"uu": uu, "cpi": cpi, "length": length, "crc": crc}
    data = TRAILER.build(values)
    assert TRAILER_CODEC.pack(uu, cpi, length, crc) == data
    assert TRAILER_CODEC.unpack(data) == (uu, cpi, length, crc)
    assert TRAILER_CODEC.names == ("uu", "cpi", "length", "crc")


def _with_trailer(body: bytes, uu: int, cpi: int, length: int) -> bytes:
    """A PDU with an arbitrary Length field and a correct CRC."""
    head = body + bytes((uu, cpi)) + length.to_bytes(2, "big")
    return head + reference_crc(head).to_bytes(4, "big")


def _kind(pdu: bytes | bytearray, check_crc: bool = True) -> Aal5ErrorKind:
    with pytest.raises(Aal5FormatError) as info:
        parse_pdu(pdu, check_crc=check_crc)
    return info.value.kind


@pytest.mark.parametrize("size", [1, 8, 47, 49, 95, 97])
def test_not_a_cell_multiple(size: int) -> None:
    assert _kind(bytes(size)) is Aal5ErrorKind.NOT_CELL_MULTIPLE


def test_empty_is_too_short() -> None:
    assert _kind(b"") is Aal5ErrorKind.TOO_SHORT


@pytest.mark.parametrize("index", [0, 20, 39, 40, 42, 44, 47, 60, 95])
def test_any_corrupted_byte_is_bad_crc(index: int) -> None:
    pdu = bytearray(build_pdu(bytes(range(50))))
    pdu[index] ^= 0x01
    assert _kind(pdu) is Aal5ErrorKind.BAD_CRC


@pytest.mark.parametrize(
    ("cells", "length"),
    [
        (1, 41),  # longer than the room before the trailer
        (2, 88 + 1),
        (2, 40),  # 48 bytes of padding: one whole cell too many
        (2, 0),
        (3, 40),
    ],
)
def test_inconsistent_length_with_good_crc(cells: int, length: int) -> None:
    pdu = _with_trailer(bytes(48 * cells - 8), 0, 0, length)
    assert _kind(pdu) is Aal5ErrorKind.BAD_LENGTH
    assert _kind(pdu, check_crc=False) is Aal5ErrorKind.BAD_LENGTH


@pytest.mark.parametrize(("cells", "length"), [(1, 0), (1, 40), (2, 41), (2, 88), (3, 89)])
def test_consistent_lengths_accepted(cells: int, length: int) -> None:
    pdu = _with_trailer(bytes(48 * cells - 8), 0, 0, length)
    assert parse_pdu(pdu).payload == bytes(length)


def test_integrity_before_sanity() -> None:
    # Both a bad CRC and a bad Length: the CRC (integrity) is reported.
    pdu = bytearray(_with_trailer(bytes(88), 0, 0, 0))
    pdu[-1] ^= 0xFF
    assert _kind(pdu) is Aal5ErrorKind.BAD_CRC
    # Not a cell multiple beats everything.
    assert _kind(bytes(pdu[:-1])) is Aal5ErrorKind.NOT_CELL_MULTIPLE


def test_crc_check_is_a_policy() -> None:
    pdu = bytearray(build_pdu(b"offloaded"))
    pdu[-1] ^= 0xFF
    assert _kind(pdu) is Aal5ErrorKind.BAD_CRC
    assert parse_pdu(pdu, check_crc=False).payload == b"offloaded"


def test_parser_does_not_mutate_input() -> None:
    pdu = bytearray(build_pdu(bytes(range(100))))
    snapshot = bytes(pdu)
    result = parse_pdu(pdu)
    assert bytes(pdu) == snapshot
    pdu[0] ^= 0xFF  # nor does the result alias it
    assert result.payload == bytes(range(100))


def test_trailing_bytes_rejected() -> None:
    pdu = build_pdu(b"x")
    assert _kind(pdu + b"\x00") is Aal5ErrorKind.NOT_CELL_MULTIPLE
    assert _kind(pdu + bytes(48)) is Aal5ErrorKind.BAD_CRC


def test_error_message_and_class() -> None:
    assert issubclass(Aal5FormatError, FormatError)
    with pytest.raises(Aal5FormatError, match=r"^AAL5: CRC-32 mismatch"):
        parse_pdu(bytes(48))


def test_describe_and_registry() -> None:
    rows = dict(aal5.describe_pdu(Aal5Pdu(b"\x01" * 100, uu=7)))
    assert rows["length"] == 100
    assert rows["cells"] == 3
    assert rows["cpcs-uu"] == "0x07"
    assert "aal5-pdu" in registry.formats()
    text = registry.decode("aal5-pdu", build_pdu(b"\xab" * 100, uu=7))
    assert "length: 100" in text
    assert "cpcs-uu: 0x07" in text
    assert "100 bytes: abab" in text
    with pytest.raises(Aal5FormatError):
        registry.decode("aal5-pdu", bytes(48))
