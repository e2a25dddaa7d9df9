"""The stop-and-wait ARQ PDU: a 3-byte header, then the payload of a DATA PDU.

Two PDU types share one header.  DATA carries a message numbered ``seq``; ACK confirms the DATA
numbered ``seq`` and carries nothing::

     0                   1                   2
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |     type      |          seq (u16)            |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  payload (DATA only: the rest of the datagram) ...
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Fields are big-endian; type is 1 for DATA and 2 for ACK; ``seq`` counts modulo 65536
(:data:`SEQ_MODULUS`).  There is no length field: the datagram service below delimits messages,
so a DATA payload is everything after the header.

:func:`parse` checks integrity first (at least the 3 header bytes are present) and sanity after
(the type is known; an ACK has nothing after its header).  Any failure raises
:class:`ArqFormatError`, whose :attr:`~ArqFormatError.kind` names the check.  :data:`PDU_FORMAT`
(construct) is the specification; :data:`HEADER_CODEC` is the struct-speed codec derived from it,
and :func:`parse_reference` parses with construct alone, so the tests can prove both agree.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs
import construct

from stacklib.errors import FormatError
from stacklib.wire import registry
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "HEADER_CODEC",
    "HEADER_FORMAT",
    "HEADER_SIZE",
    "PDU_FORMAT",
    "SEQ_MODULUS",
    "ArqErrorKind",
    "ArqFormatError",
    "Pdu",
    "PduType",
    "build",
    "parse",
    "parse_reference",
    "pdus",
]

HEADER_SIZE = 3  #: type (1 byte) and seq (2 bytes)
SEQ_MODULUS = 1 << 16  #: sequence numbers wrap modulo this


class PduType(enum.IntEnum):
    """The ``type`` byte."""

    DATA = 1  #: a message, numbered ``seq``
    ACK = 2  #: "I received DATA ``seq``"


class ArqErrorKind(enum.Enum):
    """Why :func:`parse` rejected a datagram, in the order the checks run."""

    SHORT = "shorter than the 3-byte header"
    UNKNOWN_TYPE = "unknown PDU type"
    ACK_PAYLOAD = "ACK with bytes after its header"


class ArqFormatError(FormatError):
    """Malformed ARQ PDU; :attr:`kind` says which check failed.

    (``kind`` defaults to SHORT because the derived codec raises this class, with a message
    only, for data shorter than the header.)
    """

    def __init__(self, message: str, kind: ArqErrorKind = ArqErrorKind.SHORT) -> None:
        self.kind = kind
        super().__init__(message)


def _error(kind: ArqErrorKind, detail: str) -> ArqFormatError:
    return ArqFormatError(f"ARQ: {kind.value}: {detail}", kind)


HEADER_FORMAT = construct.Struct(
    "type" / construct.Int8ub,
    "seq" / construct.Int16ub,
)
"""The 3-byte header (the specification the fast codec is derived from)."""

PDU_FORMAT = construct.Struct(
    "header" / HEADER_FORMAT,
    "payload" / construct.GreedyBytes,
)
"""A whole PDU; the sanity rules (known type, empty ACK) are applied on top of it."""

HEADER_CODEC = derive_codec(HEADER_FORMAT, ArqFormatError)
"""Fields: type, seq."""

_unpack_header = HEADER_CODEC.unpack
_pack_header = HEADER_CODEC.pack
_DATA = int(PduType.DATA)
_ACK = int(PduType.ACK)


@attrs.frozen
class Pdu:
    """One ARQ PDU.  Build them with :meth:`data` and :meth:`ack`."""

    type: PduType
    seq: int
    payload: bytes = b""

    @classmethod
    def data(cls, seq: int, payload: bytes) -> Pdu:
        """DATA number ``seq`` carrying ``payload``."""
        return cls(PduType.DATA, seq, payload)

    @classmethod
    def ack(cls, seq: int) -> Pdu:
        """ACK of DATA number ``seq``."""
        return cls(PduType.ACK, seq)


def parse(data: bytes | bytearray | memoryview) -> Pdu:
    """The PDU in ``data`` (one whole datagram); :class:`ArqFormatError` if malformed."""
    size = len(data)
    if size < HEADER_SIZE:
        raise _error(ArqErrorKind.SHORT, f"{size} bytes")
    kind, seq = _unpack_header(data)
    if kind == _DATA:
        return Pdu(PduType.DATA, seq, bytes(data[HEADER_SIZE:]))
    return _parse_other(kind, seq, size)


def _parse_other(kind: int, seq: int, size: int) -> Pdu:
    """The non-DATA cases, shared by :func:`parse` and :func:`parse_reference`."""
    if kind == _ACK:
        if size != HEADER_SIZE:
            raise _error(ArqErrorKind.ACK_PAYLOAD, f"{size - HEADER_SIZE} bytes after seq {seq}")
        return Pdu(PduType.ACK, seq)
    raise _error(ArqErrorKind.UNKNOWN_TYPE, f"type {kind}")


def parse_reference(data: bytes | bytearray | memoryview) -> Pdu:
    """Parse like :func:`parse`, with :data:`PDU_FORMAT` (slow, the specification)."""
    data = bytes(data)
    try:
        value = PDU_FORMAT.parse(data)
    except construct.StreamError:
        raise _error(ArqErrorKind.SHORT, f"{len(data)} bytes") from None
    kind, seq = value.header.type, value.header.seq
    if kind == _DATA:
        return Pdu(PduType.DATA, seq, value.payload)
    return _parse_other(kind, seq, len(data))


def build(pdu: Pdu) -> bytes:
    """The bytes of ``pdu``.

    Raises ValueError for a seq outside 0-65535, an unknown type, or an ACK with a payload:
    those are the caller's mistakes, not malformed input.
    """
    if pdu.type == _DATA:
        return _pack_header(_DATA, pdu.seq) + pdu.payload
    if pdu.type == _ACK:
        if pdu.payload:
            raise ValueError(f"an ACK carries no payload, got {len(pdu.payload)} bytes")
        return _pack_header(_ACK, pdu.seq)
    raise ValueError(f"unknown PDU type {pdu.type!r}")


# --- stacklib decode ---------------------------------------------------------------------------


def describe(pdu: Pdu) -> list[registry.Field]:
    """``stacklib decode`` lines for a PDU."""
    return [("type", pdu.type), ("seq", pdu.seq), ("payload", pdu.payload)]


# --- hypothesis strategy (hypothesis is a test-only dependency: imported lazily) ---------------


def pdus(*, max_payload: int = 256) -> SearchStrategy[Pdu]:
    """Valid PDUs: DATA with up to ``max_payload`` bytes, and ACKs."""
    from hypothesis import strategies as st

    seqs = st.integers(0, SEQ_MODULUS - 1)
    result: SearchStrategy[Pdu] = st.one_of(
        st.builds(Pdu.data, seqs, st.binary(max_size=max_payload)),
        st.builds(Pdu.ack, seqs),
    )
    return result


registry.register(
    "arq",
    parse_reference,
    describe,
    "stop-and-wait ARQ PDU (docs/writing-a-layer.md)",
    build=build,
    strategy=pdus,
    error=ArqFormatError,
)
