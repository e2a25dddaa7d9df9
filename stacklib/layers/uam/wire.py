"""The U-Net Active Messages PDU: an 8-byte header, 0-4 argument words, a bulk header, data.

UAM (paper 000 §5) sends Generic Active Messages 1.1 requests and replies of up to four 32-bit
words, and block stores and gets in buffers of :data:`CHUNK_SIZE` data bytes.  Every PDU starts
with the same header; the arguments follow, then, for the three bulk types, a 16-byte bulk
header, then the data of a store or get-reply chunk::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |     type      |    handler    |           seq (u16)           |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |           ack (u16)           |     nargs     |   reserved    |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                 args: nargs (0-4) x u32                       |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  region (u16)  (bulk types)   |          xfer (u16)           |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                  offset (u32): base of the transfer           |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                  total (u32): bytes in the transfer           |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                  chunk (u32): this chunk's offset in it       |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  data (STORE and GET_REPLY only: the rest of the datagram) ...
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Fields are big-endian.  ``seq`` numbers the reliable messages one side sends to one peer (every
type but ACK), modulo 65536; ``ack`` is cumulative: the next ``seq`` the sender has yet to
*handle* from that peer (paper 000 §5.1.2: a message is acknowledged once its handler has run),
so every message acknowledges implicitly and an ACK does only that.  ``handler`` is the
handler-table index (REQUEST, REPLY, the last STORE chunk) or, in a GET_REPLY, a status (0
ok, 1 bad remote address).  A GET carries one argument, the length of the chunk it asks for.

A request or reply with four arguments is 24 bytes: with the 8-byte AAL5 trailer it fits one
48-byte ATM cell (paper 000 §5.2 measures "single cell requests").

:func:`parse` checks integrity first (header present; the arguments and bulk header the type
and ``nargs`` announce are present) and sanity after (known type, at most four arguments,
nothing after a PDU that carries no data, chunk inside its transfer, ACK and GET shapes).
Every failure raises :class:`UamFormatError` whose :attr:`~UamFormatError.kind` names the check.
:data:`PDU_FORMAT` (construct) is the specification; :data:`HEADER_CODEC` and
:data:`BULK_CODEC` are the struct-speed codecs derived from it and :func:`parse_reference`
parses with construct alone, so the tests can prove they agree.
"""

from __future__ import annotations

import enum
import struct
from typing import TYPE_CHECKING, Final

import attrs
import construct

from stacklib.errors import FormatError
from stacklib.wire import registry
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "BULK_CODEC",
    "BULK_FORMAT",
    "BULK_SIZE",
    "CHUNK_SIZE",
    "HEADER_CODEC",
    "HEADER_FORMAT",
    "HEADER_SIZE",
    "MAX_ARGS",
    "MAX_OVERHEAD",
    "SEQ_MODULUS",
    "SMALL_CODECS",
    "Bulk",
    "Pdu",
    "PduType",
    "UamErrorKind",
    "UamFormatError",
    "build",
    "parse",
    "parse_reference",
    "pdus",
]

HEADER_SIZE: Final = 8  #: type, handler, seq, ack, nargs, reserved
BULK_SIZE: Final = 16  #: region, xfer, offset, total, chunk
MAX_ARGS: Final = 4  #: GAM 1.1: "up to four words of arguments" (paper 000 §5)
MAX_OVERHEAD: Final = HEADER_SIZE + 4 * MAX_ARGS + BULK_SIZE  #: bytes of a PDU that are not data
SEQ_MODULUS: Final = 1 << 16  #: seq and ack count modulo this
WORD_MAX: Final = (1 << 32) - 1
#: Data bytes per bulk buffer: "UAM uses buffers holding 4160 bytes of data" (paper 000 §5.2).
CHUNK_SIZE: Final = 4160
STATUS_OK: Final = 0
STATUS_BAD_ADDRESS: Final = 1


class PduType(enum.IntEnum):
    """The ``type`` byte."""

    REQUEST = 1  #: an Active Message request: handler + args
    REPLY = 2  #: the reply of a request handler: handler + args
    ACK = 3  #: acknowledgment only (for requests that produced no reply)
    STORE = 4  #: one chunk of a block store into a remote region
    GET = 5  #: a request for one chunk of a remote region (arg 0: its length)
    GET_REPLY = 6  #: the chunk a GET asked for (handler byte: status)


BULK_TYPES = frozenset({PduType.STORE, PduType.GET, PduType.GET_REPLY})
_DATA_TYPES: Final = frozenset({int(PduType.STORE), int(PduType.GET_REPLY)})
_BULK_INTS: Final = frozenset(int(t) for t in BULK_TYPES)
_KNOWN: Final = frozenset(int(t) for t in PduType)


class UamErrorKind(enum.Enum):
    """Why :func:`parse` rejected a datagram, in the order the checks run."""

    SHORT = "shorter than the 8-byte header"
    UNKNOWN_TYPE = "unknown PDU type"
    TOO_MANY_ARGS = "more than 4 argument words"
    TRUNCATED = "shorter than its arguments and bulk header"
    TRAILING = "bytes after a PDU that carries no data"
    BAD_CHUNK = "chunk outside its transfer"
    BAD_SHAPE = "fields not allowed for this type"


class UamFormatError(FormatError):
    """Malformed UAM PDU; :attr:`kind` says which check failed.

    (``kind`` defaults to SHORT because the derived codecs raise this class, with a message
    only, for data shorter than their struct.)
    """

    def __init__(self, message: str, kind: UamErrorKind = UamErrorKind.SHORT) -> None:
        self.kind = kind
        super().__init__(message)


def _error(kind: UamErrorKind, detail: str) -> UamFormatError:
    return UamFormatError(f"UAM: {kind.value}: {detail}", kind)


HEADER_FORMAT = construct.Struct(
    "type" / construct.Int8ub,
    "handler" / construct.Int8ub,
    "seq" / construct.Int16ub,
    "ack" / construct.Int16ub,
    "nargs" / construct.Int8ub,
    "_reserved" / construct.Int8ub,
)
"""The 8-byte header every PDU starts with."""

BULK_FORMAT = construct.Struct(
    "region" / construct.Int16ub,
    "xfer" / construct.Int16ub,
    "offset" / construct.Int32ub,
    "total" / construct.Int32ub,
    "chunk" / construct.Int32ub,
)
"""The bulk header of STORE, GET and GET_REPLY."""

PDU_FORMAT = construct.Struct(
    "header" / HEADER_FORMAT,
    "args" / construct.Array(construct.this.header.nargs, construct.Int32ub),
    "bulk" / construct.If(lambda ctx: ctx.header.type in _BULK_INTS, BULK_FORMAT),
    "data" / construct.GreedyBytes,
)
"""A whole PDU (integrity); the sanity rules are applied on top of it.  Used with ``nargs``
checked first, since construct would happily read 255 arguments."""

HEADER_CODEC = derive_codec(HEADER_FORMAT, UamFormatError)
"""Fields: type, handler, seq, ack, nargs (the reserved byte is written as zero, not read)."""
BULK_CODEC = derive_codec(BULK_FORMAT, UamFormatError)
"""Fields: region, xfer, offset, total, chunk."""

_unpack_header = HEADER_CODEC.unpack
_pack_header = HEADER_CODEC.pack
_unpack_bulk = BULK_CODEC.unpack
_pack_bulk = BULK_CODEC.pack
_ARGS = [struct.Struct(f">{n}I") for n in range(MAX_ARGS + 1)]
SMALL_CODECS: Final = tuple(
    struct.Struct(HEADER_CODEC.format[:-1] + "x" + "I" * n) for n in range(MAX_ARGS + 1)
)
"""A whole PDU without a bulk header (REQUEST, REPLY, ACK) with ``n`` argument words, as one
struct derived from :data:`HEADER_CODEC`: fields type, handler, seq, ack, nargs, then the
words (the reserved byte is written as zero and not read).  The machine's fast path packs and
unpacks the common small PDU in one call; the tests check it against :func:`build` and
:func:`parse`."""


@attrs.frozen
class Bulk:
    """The bulk header: where a chunk belongs (``region``, ``offset``) in which transfer."""

    region: int
    xfer: int
    offset: int
    total: int
    chunk: int


@attrs.frozen
class Pdu:
    """One UAM PDU.  ``bulk`` is set exactly for STORE, GET and GET_REPLY."""

    type: PduType
    seq: int = 0
    ack: int = 0
    handler: int = 0
    args: tuple[int, ...] = ()
    bulk: Bulk | None = None
    data: bytes = b""


def parse(data: bytes | bytearray | memoryview) -> Pdu:
    """The PDU in ``data`` (one whole datagram); :class:`UamFormatError` if malformed."""
    size = len(data)
    if size < HEADER_SIZE:
        raise _error(UamErrorKind.SHORT, f"{size} bytes")
    kind, handler, seq, ack, nargs = _unpack_header(data)
    if kind not in _KNOWN:
        raise _error(UamErrorKind.UNKNOWN_TYPE, f"type {kind}")
    if nargs > MAX_ARGS:
        raise _error(UamErrorKind.TOO_MANY_ARGS, f"nargs {nargs}")
    position = HEADER_SIZE + 4 * nargs
    bulk_type = kind in _BULK_INTS
    needed = position + BULK_SIZE if bulk_type else position
    if size < needed:
        raise _error(UamErrorKind.TRUNCATED, f"{size} bytes, {needed} needed")
    args = _ARGS[nargs].unpack_from(data, HEADER_SIZE) if nargs else ()
    bulk = None
    if bulk_type:
        bulk = Bulk(*_unpack_bulk(data, position))
        position += BULK_SIZE
    payload = bytes(data[position:]) if kind in _DATA_TYPES else b""
    return _check(PduType(kind), seq, ack, handler, args, bulk, payload, size - position)


def _check(
    kind: PduType,
    seq: int,
    ack: int,
    handler: int,
    args: tuple[int, ...],
    bulk: Bulk | None,
    payload: bytes,
    rest: int,
) -> Pdu:
    """The sanity checks, shared by :func:`parse` and :func:`parse_reference`."""
    if rest and kind not in (PduType.STORE, PduType.GET_REPLY):
        raise _error(UamErrorKind.TRAILING, f"{rest} bytes after a {kind.name}")
    if bulk is not None:
        length = args[0] if kind is PduType.GET and args else len(payload)
        if bulk.chunk + length > bulk.total:
            raise _error(
                UamErrorKind.BAD_CHUNK,
                f"chunk {bulk.chunk}+{length} beyond total {bulk.total}",
            )
    if kind is PduType.ACK and (args or handler or seq):
        raise _error(UamErrorKind.BAD_SHAPE, "an ACK carries only its ack field")
    if kind is PduType.GET and len(args) != 1:
        raise _error(UamErrorKind.BAD_SHAPE, f"a GET carries 1 argument, not {len(args)}")
    if kind is PduType.GET_REPLY and handler != STATUS_OK and (payload or args):
        raise _error(UamErrorKind.BAD_SHAPE, "a failed GET_REPLY carries no data")
    return Pdu(kind, seq, ack, handler, tuple(args), bulk, payload)


def parse_reference(data: bytes | bytearray | memoryview) -> Pdu:
    """Parse like :func:`parse`, with :data:`PDU_FORMAT` (slow, the specification)."""
    data = bytes(data)
    try:
        header = HEADER_FORMAT.parse(data)
    except construct.StreamError:
        raise _error(UamErrorKind.SHORT, f"{len(data)} bytes") from None
    if header.type not in _KNOWN:
        raise _error(UamErrorKind.UNKNOWN_TYPE, f"type {header.type}")
    if header.nargs > MAX_ARGS:
        raise _error(UamErrorKind.TOO_MANY_ARGS, f"nargs {header.nargs}")
    try:
        value = PDU_FORMAT.parse(data)
    except construct.StreamError:
        raise _error(UamErrorKind.TRUNCATED, f"{len(data)} bytes") from None
    kind = PduType(header.type)
    bulk = None
    if value.bulk is not None:
        b = value.bulk
        bulk = Bulk(b.region, b.xfer, b.offset, b.total, b.chunk)
    carries = kind in (PduType.STORE, PduType.GET_REPLY)
    payload = value.data if carries else b""
    rest = len(value.data)
    return _check(
        kind, header.seq, header.ack, header.handler, tuple(value.args), bulk, payload, rest
    )


def build(pdu: Pdu) -> bytes:
    """The bytes of ``pdu``.

    Raises ValueError for values out of range or a shape :func:`parse` would reject (a bulk
    header on a request, data on a reply): those are the caller's mistakes, not bad input.
    """
    nargs = len(pdu.args)
    if nargs > MAX_ARGS:
        raise ValueError(f"at most {MAX_ARGS} arguments, got {nargs}")
    if (pdu.bulk is not None) != (pdu.type in BULK_TYPES):
        raise ValueError(f"a {pdu.type.name} {'needs' if pdu.bulk is None else 'has no'} bulk")
    if pdu.data and pdu.type not in (PduType.STORE, PduType.GET_REPLY):
        raise ValueError(f"a {pdu.type.name} carries no data")
    try:
        out = _pack_header(int(pdu.type), pdu.handler, pdu.seq, pdu.ack, nargs)
        if nargs:
            out += _ARGS[nargs].pack(*pdu.args)
    except struct.error as error:
        raise ValueError(f"UAM argument out of range: {error}") from None
    if pdu.bulk is not None:
        b = pdu.bulk
        out += _pack_bulk(b.region, b.xfer, b.offset, b.total, b.chunk)
        return out + pdu.data
    return out


# --- stacklib decode ---------------------------------------------------------------------------


def describe(pdu: Pdu) -> list[registry.Field]:
    """``stacklib decode`` lines for a PDU."""
    lines: list[registry.Field] = [
        ("type", pdu.type),
        ("handler", pdu.handler),
        ("seq", pdu.seq),
        ("ack", pdu.ack),
        ("args", pdu.args),
    ]
    if pdu.bulk is not None:
        lines.append(("bulk", pdu.bulk))
        lines.append(("data", pdu.data))
    return lines


# --- hypothesis strategy (hypothesis is a test-only dependency: imported lazily) ---------------


def pdus(*, max_data: int = 64) -> SearchStrategy[Pdu]:
    """Valid PDUs of every type, with up to ``max_data`` bytes of chunk data."""
    from hypothesis import strategies as st

    u16 = st.integers(0, SEQ_MODULUS - 1)
    u8 = st.integers(0, 255)
    words = st.lists(st.integers(0, WORD_MAX), max_size=MAX_ARGS).map(tuple)

    @st.composite
    def bulk_pdu(draw: st.DrawFn, kind: PduType) -> Pdu:
        args: tuple[int, ...]
        if kind is PduType.GET_REPLY and draw(st.booleans()):
            data, args, handler = b"", (), STATUS_BAD_ADDRESS
        else:
            data = b"" if kind is PduType.GET else draw(st.binary(max_size=max_data))
            args = (draw(st.integers(0, WORD_MAX)),) if kind is PduType.GET else draw(words)
            handler = STATUS_OK if kind is PduType.GET_REPLY else draw(u8)
        length = args[0] if kind is PduType.GET else len(data)
        chunk = draw(st.integers(0, WORD_MAX - length))
        total = draw(st.integers(chunk + length, WORD_MAX))
        bulk = Bulk(draw(u16), draw(u16), draw(st.integers(0, WORD_MAX)), total, chunk)
        return Pdu(kind, draw(u16), draw(u16), handler, args, bulk, data)

    small = st.builds(Pdu, st.sampled_from([PduType.REQUEST, PduType.REPLY]), u16, u16, u8, words)
    acks = st.builds(lambda ack: Pdu(PduType.ACK, ack=ack), u16)
    result: SearchStrategy[Pdu] = st.one_of(
        small,
        acks,
        *(bulk_pdu(kind) for kind in (PduType.STORE, PduType.GET, PduType.GET_REPLY)),
    )
    return result


registry.register(
    "uam",
    parse_reference,
    describe,
    "U-Net Active Messages PDU (paper 000 §5)",
    build=build,
    strategy=pdus,
    error=UamFormatError,
)
