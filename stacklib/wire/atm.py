"""The ATM cell at the UNI (ITU-T I.361), the unit U-Net/ATM moves (paper 000 §4).

A cell is a 5-byte header and 48 bytes of payload::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  GFC  |      VPI      |              VCI              | PTI |C|
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |      HEC      |          payload (48 bytes) ...               |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

GFC generic flow control (4 bits, UNI only), VPI virtual path (8 bits), VCI virtual channel
(16 bits; U-Net/ATM names a channel by a transmit/receive VCI pair, paper 000 §4 and §4.2.2),
PTI payload type (3 bits), C = CLP cell loss priority (1 bit).

PTI: the high bit set marks OAM and resource-management cells; for user data cells the middle
bit is EFCI (congestion seen) and the low bit is the ATM-user-to-ATM-user indication (AUU),
which AAL5 sets on the last cell of a PDU (I.363.5).

HEC (ITU-T I.432): CRC-8 with generator x^8 + x^2 + x + 1 over the first four header bytes,
XORed with the coset 01010101 (0x55).  The Fore SBA-100 computed it in hardware, the only thing
it did beyond serializing cells (paper 000 §4.1); checking it is a policy (``check_hec``) so a
simulated NI can model that hardware.

:data:`HEADER` (construct) is the specification; :data:`HEADER_CODEC` is the struct-speed codec
derived from it, used by :func:`build` and :func:`parse`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
from construct import BitsInteger, BitStruct, Bytes, Int8ub, Struct

from stacklib.errors import FormatError
from stacklib.wire.codec import derive_codec
from stacklib.wire.registry import Field, register

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "CELL",
    "CELL_SIZE",
    "HEADER",
    "HEADER_CODEC",
    "HEADER_SIZE",
    "PAYLOAD_SIZE",
    "PTI_AUU",
    "PTI_EFCI",
    "PTI_NON_USER",
    "AtmFormatError",
    "Cell",
    "build",
    "cells",
    "describe",
    "header_bytes",
    "hec",
    "parse",
]

CELL_SIZE = 53
HEADER_SIZE = 5
PAYLOAD_SIZE = 48

PTI_AUU = 0b001  #: user data cell: ATM-user-to-ATM-user indication (AAL5 end of PDU)
PTI_EFCI = 0b010  #: user data cell: explicit forward congestion indication
PTI_NON_USER = 0b100  #: set: OAM or resource-management cell, not user data

HEADER = Struct(
    "fields"
    / BitStruct(
        "gfc" / BitsInteger(4),
        "vpi" / BitsInteger(8),
        "vci" / BitsInteger(16),
        "pti" / BitsInteger(3),
        "clp" / BitsInteger(1),
    ),
    "hec" / Int8ub,
)
CELL = Struct("header" / HEADER, "payload" / Bytes(PAYLOAD_SIZE))


class AtmFormatError(FormatError):
    """Malformed ATM cell: wrong size or HEC mismatch."""


HEADER_CODEC = derive_codec(HEADER, error=AtmFormatError)


def _crc8_table() -> bytes:
    # Byte-at-a-time table for the I.432 generator x^8 + x^2 + x + 1 (0x07), MSB first.
    table = bytearray(256)
    for i in range(256):
        c = i
        for _ in range(8):
            c = ((c << 1) ^ 0x07) & 0xFF if c & 0x80 else c << 1
        table[i] = c
    return bytes(table)


_T = _crc8_table()
_COSET = 0x55


def hec(header: bytes | bytearray | memoryview) -> int:
    """The HEC of the first four bytes of ``header`` (at least 4); 00 00 00 01 gives 0x52."""
    t = _T
    return t[t[t[t[header[0]] ^ header[1]] ^ header[2]] ^ header[3]] ^ _COSET


@attrs.frozen
class Cell:
    """An ATM cell; the HEC is not stored: :func:`build` computes it, :func:`parse` checks it."""

    vpi: int
    vci: int
    pti: int = 0
    clp: int = 0
    gfc: int = 0
    payload: bytes = bytes(PAYLOAD_SIZE)


def header_bytes(vpi: int, vci: int, pti: int = 0, clp: int = 0, gfc: int = 0) -> bytes:
    """The 5 header bytes, HEC included, of a cell on VC (``vpi``, ``vci``).

    Raises :class:`ValueError` for a field out of range.
    """
    for name, value, limit in (
        ("vpi", vpi, 0xFF),
        ("vci", vci, 0xFFFF),
        ("pti", pti, 0b111),
        ("clp", clp, 1),
        ("gfc", gfc, 0xF),
    ):
        if not 0 <= value <= limit:
            raise ValueError(f"ATM cell {name}={value} outside 0..{limit}")
    head = HEADER_CODEC.pack(gfc, vpi, vci, pti, clp, 0)
    return head[:4] + bytes((hec(head),))


def build(cell: Cell) -> bytes:
    """The 53 bytes of ``cell`` with its HEC.

    Raises :class:`ValueError` for a field out of range or a payload that is not 48 bytes.
    """
    if len(cell.payload) != PAYLOAD_SIZE:
        raise ValueError(f"ATM cell payload is {len(cell.payload)} bytes, not {PAYLOAD_SIZE}")
    return header_bytes(cell.vpi, cell.vci, cell.pti, cell.clp, cell.gfc) + cell.payload


def parse(data: bytes | bytearray | memoryview, check_hec: bool = True) -> Cell:
    """Decode a 53-byte cell; ``check_hec=False`` models an NI whose hardware checked it.

    Raises :class:`AtmFormatError` for a wrong size or a HEC mismatch.  The input is not modified.
    """
    if len(data) != CELL_SIZE:
        raise AtmFormatError(f"ATM: cell is {len(data)} bytes, not {CELL_SIZE}")
    gfc, vpi, vci, pti, clp, got = HEADER_CODEC.unpack(data)
    if check_hec:
        want = hec(data)
        if got != want:
            raise AtmFormatError(f"ATM: HEC {got:#04x}, header gives {want:#04x}")
    return Cell(vpi, vci, pti, clp, gfc, bytes(data[HEADER_SIZE:]))


def describe(cell: Cell) -> list[Field]:
    """Field/value pairs for ``stacklib decode``."""
    kind = "OAM/RM" if cell.pti & PTI_NON_USER else "user data"
    if not cell.pti & PTI_NON_USER and cell.pti & PTI_AUU:
        kind += ", AUU (AAL5 end of PDU)"
    return [
        ("gfc", cell.gfc),
        ("vpi", cell.vpi),
        ("vci", cell.vci),
        ("pti", f"{cell.pti:03b} ({kind})"),
        ("clp", cell.clp),
        ("payload", cell.payload),
    ]


def cells(vpi: int | None = None, vci: int | None = None) -> SearchStrategy[Cell]:
    """Hypothesis strategy for :class:`Cell`; ``vpi``/``vci`` pin the VC if given."""
    from hypothesis import strategies as st  # lazily: hypothesis is a test dependency

    return st.builds(
        Cell,
        vpi=st.just(vpi) if vpi is not None else st.integers(0, 0xFF),
        vci=st.just(vci) if vci is not None else st.integers(0, 0xFFFF),
        pti=st.integers(0, 0b111),
        clp=st.integers(0, 1),
        gfc=st.integers(0, 0xF),
        payload=st.binary(min_size=PAYLOAD_SIZE, max_size=PAYLOAD_SIZE),
    )


register(
    "atm-cell",
    parse,
    describe,
    "ATM cell, UNI format (I.361): 5-byte header + 48 bytes",
    build=build,
    strategy=cells,
    error=AtmFormatError,
)
