"""The AAL5 CPCS-PDU (ITU-T I.363.5), the packet format of U-Net/ATM (paper 000 §4).

A PDU is the payload, zero padding, and an 8-byte trailer, sized so that the whole PDU fills a
whole number of 48-byte cell payloads; the trailer always sits at the end of the last cell::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |            payload (0..65535 bytes) ...                       |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |            padding (0..47 zero bytes) ...                     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |    CPCS-UU    |      CPI      |            Length             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                            CRC-32                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Length is the payload length in bytes.  The CRC is CRC-32/BZIP2 (generator 0x04C11DB7, register
preset to all ones, not reflected, complemented) over everything but the CRC field itself.

The SBA-100 had no hardware for this CRC, so it cost a third of the send overhead and 40% of the
receive overhead (paper 000 §4.1); the SBA-200/PCA-200 accumulates it in hardware (paper 000
§4.2.2, paper 003 §4.2.3).  Checking it is therefore a policy (``check_crc``), so a simulated NI
can model the hardware doing it.

Deviation: I.363.5 reserves Length 0 as the abort indication.  stacklib, like U-Net, lets a
message be empty, so a one-cell PDU with Length 0 and 40 bytes of padding is an empty payload.

:data:`TRAILER` (construct) is the specification of the trailer; :data:`TRAILER_CODEC` is the
struct-speed codec derived from it, which :func:`build_pdu` and :func:`parse_pdu` use.
"""

from __future__ import annotations

import binascii
import enum
from typing import TYPE_CHECKING

import attrs
import crcmod
from construct import Int8ub, Int16ub, Int32ub, Struct

from stacklib.errors import FormatError
from stacklib.wire.codec import derive_codec
from stacklib.wire.registry import Field, register

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "CELL_PAYLOAD",
    "MAX_CELLS",
    "MAX_PAYLOAD",
    "TRAILER",
    "TRAILER_CODEC",
    "TRAILER_SIZE",
    "Aal5ErrorKind",
    "Aal5FormatError",
    "Aal5Pdu",
    "build",
    "build_pdu",
    "cells_needed",
    "crc32_bzip2",
    "describe_pdu",
    "parse_pdu",
    "pdus",
]

CELL_PAYLOAD = 48  #: bytes of PDU carried per ATM cell
TRAILER_SIZE = 8
MAX_PAYLOAD = 65535  #: the Length field is 16 bits
#: cells of the largest PDU (65535 + 8 bytes, padded): 1366
MAX_CELLS = (MAX_PAYLOAD + TRAILER_SIZE + CELL_PAYLOAD - 1) // CELL_PAYLOAD

TRAILER = Struct(
    "uu" / Int8ub,  # CPCS user-to-user indication, passed through transparently
    "cpi" / Int8ub,  # common part indicator; I.363.5 wants 0, stacklib passes it through
    "length" / Int16ub,
    "crc" / Int32ub,
)


class Aal5ErrorKind(enum.Enum):
    """Why :func:`parse_pdu` rejected a PDU, in the order the checks run."""

    NOT_CELL_MULTIPLE = "not a multiple of 48 bytes"
    TOO_SHORT = "shorter than one cell"
    BAD_CRC = "CRC-32 mismatch"
    BAD_LENGTH = "Length field inconsistent with the PDU size"


class Aal5FormatError(FormatError):
    """Malformed AAL5 CPCS-PDU; :attr:`kind` says which check failed.

    (``kind`` defaults to TOO_SHORT because the derived codec raises this class, with a message
    only, for data too short to hold a trailer.)
    """

    def __init__(self, message: str, kind: Aal5ErrorKind = Aal5ErrorKind.TOO_SHORT) -> None:
        self.kind = kind
        super().__init__(message)


def _error(kind: Aal5ErrorKind, detail: str) -> Aal5FormatError:
    return Aal5FormatError(f"AAL5: {kind.value}: {detail}", kind)


TRAILER_CODEC = derive_codec(TRAILER, error=Aal5FormatError)


# --- CRC-32/BZIP2 -------------------------------------------------------------------------------
#
# Two implementations.  crcmod's C extension is fastest below about 96 bytes.  Above that, the
# bit-mirror identity wins by 3-4x: CRC-32/BZIP2 is the
# zlib CRC-32 with every input byte and the result bit-reversed, and bytes.translate plus
# binascii.crc32 both run in C.

# crcmod's initCrc is the register value *after* xorOut, so a register preset of 0xFFFFFFFF is
# initCrc=0 here; the check value test pins this.
_crc_crcmod = crcmod.mkCrcFun(0x104C11DB7, initCrc=0, rev=False, xorOut=0xFFFFFFFF)

_BIT_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))
_CRCMOD_BELOW = 96  # measured crossover (bytes) between the two implementations


def _crc_mirror(data: bytes | bytearray) -> int:
    """CRC-32/BZIP2 via the bit-mirrored zlib CRC-32."""
    crc = binascii.crc32(data.translate(_BIT_REVERSED))
    # Reversing the 32 bits = reversing the byte order and the bits within each byte.
    return int.from_bytes(crc.to_bytes(4, "little").translate(_BIT_REVERSED), "big")


def crc32_bzip2(data: bytes | bytearray | memoryview) -> int:
    """CRC-32/BZIP2 of ``data`` (the AAL5 CRC); ``crc32_bzip2(b"123456789") == 0xFC891918``."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    if len(data) < _CRCMOD_BELOW:
        return int(_crc_crcmod(data))
    return _crc_mirror(data)


# --- PDUs ---------------------------------------------------------------------------------------


@attrs.frozen
class Aal5Pdu:
    """A decoded CPCS-PDU: its payload and the two pass-through trailer bytes."""

    payload: bytes
    uu: int = 0
    cpi: int = 0


def cells_needed(n: int) -> int:
    """Number of cells an AAL5 PDU with an ``n``-byte payload occupies (1 for 0..40 bytes)."""
    if not 0 <= n <= MAX_PAYLOAD:
        raise ValueError(f"AAL5 payload length {n} outside 0..{MAX_PAYLOAD}")
    return (n + TRAILER_SIZE + CELL_PAYLOAD - 1) // CELL_PAYLOAD


_ZEROS = bytes(CELL_PAYLOAD)
_pack_head = TRAILER_CODEC.pack  # bound once: build_pdu runs per message


def build_pdu(payload: bytes | bytearray | memoryview, uu: int = 0, cpi: int = 0) -> bytes:
    """Encapsulate ``payload`` in a CPCS-PDU: pad, append the trailer, compute the CRC.

    Raises :class:`ValueError` for a payload over 65535 bytes or ``uu``/``cpi`` outside a byte.
    """
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ValueError(f"AAL5 payload of {n} bytes exceeds {MAX_PAYLOAD}")
    if not (0 <= uu <= 0xFF and 0 <= cpi <= 0xFF):
        raise ValueError(f"AAL5 CPCS-UU {uu} / CPI {cpi} must be 0..255")
    pad = -(n + TRAILER_SIZE) % CELL_PAYLOAD
    # The CRC covers the trailer up to the CRC field: pack it with crc=0 and drop those 4 bytes.
    body = b"".join((payload, _ZEROS[:pad], _pack_head(uu, cpi, n, 0)[:4]))
    return body + crc32_bzip2(body).to_bytes(4, "big")


def parse_pdu(pdu: bytes | bytearray | memoryview, check_crc: bool = True) -> Aal5Pdu:
    """Decode a reassembled CPCS-PDU; ``check_crc=False`` models an NI that checked it already.

    Checks, integrity before sanity: size a non-zero multiple of 48, CRC, then Length consistent
    with the padding (Length <= size - 8 and fewer than 48 bytes of padding).  Raises
    :class:`Aal5FormatError`.  The input is not modified.
    """
    size = len(pdu)
    if size % CELL_PAYLOAD:
        raise _error(Aal5ErrorKind.NOT_CELL_MULTIPLE, f"{size} bytes")
    if size < CELL_PAYLOAD:
        raise _error(Aal5ErrorKind.TOO_SHORT, f"{size} bytes")
    uu, cpi, length, crc = TRAILER_CODEC.unpack(pdu, size - TRAILER_SIZE)
    if check_crc:
        computed = crc32_bzip2(pdu[: size - 4])
        if computed != crc:
            raise _error(
                Aal5ErrorKind.BAD_CRC, f"trailer has {crc:#010x}, data gives {computed:#010x}"
            )
    room = size - TRAILER_SIZE
    if length > room or room - length >= CELL_PAYLOAD:
        raise _error(
            Aal5ErrorKind.BAD_LENGTH, f"Length {length} in a {size}-byte PDU ({room} bytes room)"
        )
    return Aal5Pdu(bytes(pdu[:length]), uu, cpi)


def describe_pdu(pdu: Aal5Pdu) -> list[Field]:
    """Field/value pairs for ``stacklib decode``."""
    return [
        ("length", len(pdu.payload)),
        ("cells", cells_needed(len(pdu.payload))),
        ("cpcs-uu", f"{pdu.uu:#04x}"),
        ("cpi", f"{pdu.cpi:#04x}"),
        ("payload", pdu.payload),
    ]


def pdus(max_payload: int = 200) -> SearchStrategy[Aal5Pdu]:
    """Hypothesis strategy for :class:`Aal5Pdu` values with payloads up to ``max_payload`` bytes."""
    from hypothesis import strategies as st  # lazily: hypothesis is a test dependency

    byte = st.integers(0, 0xFF)
    return st.builds(Aal5Pdu, st.binary(max_size=max_payload), byte, byte)


def build(pdu: Aal5Pdu) -> bytes:
    """:func:`build_pdu` of a parsed value: ``parse_pdu(build(p)) == p``."""
    return build_pdu(pdu.payload, pdu.uu, pdu.cpi)


register(
    "aal5-pdu",
    parse_pdu,
    describe_pdu,
    "AAL5 CPCS-PDU (I.363.5): payload, padding, 8-byte trailer with CRC-32",
    build=build,
    strategy=pdus,
    error=Aal5FormatError,
)
