"""The Split-C Active Messages: a scalar access in four 32-bit argument words.

Dereferencing a global pointer to a scalar "turns into a request and reply Active Messages
sequence exchange with the processor holding the data value" (paper 000 §6).  GAM 1.1 carries
up to four words of arguments (paper 000 §5), so a request and its reply are each exactly 16
bytes, packed big-endian into the four words of a UAM request or reply (one ATM cell)::

    request (READ, WRITE, STORE)
     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    | kind  | size  |  region (u8)  |            op (u16)           |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |             offset (u32): byte offset in the region           |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |         value (8 bytes; WRITE and STORE: the first            |
    |         ``size`` bytes, native layout of the region)          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

    reply (VALUE, ACK)
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    | kind  | size  |  status (u8)  |            op (u16)           |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                        reserved (u32)                         |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |         value (8 bytes; VALUE: the first ``size`` bytes)      |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

``kind`` and ``size`` share the first byte (four bits each).  ``size`` is the number of bytes
accessed, 1, 2, 4 or 8: one scalar, or for a STORE several small ones side by side (two 32-bit
keys); an ACK may carry 0.  ``op``
names the requester's outstanding operation, so replies may complete out of order.  ``status``
is 0 (done) or says why the target refused: no such region, or an access outside it; the target
is left untouched.  :func:`parse_request` and :func:`parse_reply` check integrity (four words of
32 bits) before sanity (known kind, size allowed for it); each failure raises
:class:`SplitcFormatError` naming the check.  The construct definitions are the specification;
the codecs derived from them are what the handlers use.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import construct

from stacklib.errors import FormatError
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "REPLY_CODEC",
    "REPLY_FORMAT",
    "REQUEST_CODEC",
    "REQUEST_FORMAT",
    "SCALAR_SIZES",
    "Kind",
    "Reply",
    "Request",
    "SplitcErrorKind",
    "SplitcFormatError",
    "Status",
    "build_reply",
    "build_request",
    "parse_reply",
    "parse_request",
    "parse_request_reference",
    "plain_word_tuple",
    "plain_words",
    "replies",
    "reply_fields",
    "reply_words",
    "request_fields",
    "request_words",
    "requests",
]

WORDS: Final = 4  #: GAM 1.1: up to four words of arguments (paper 000 §5)
WORD_MAX: Final = (1 << 32) - 1
SCALAR_SIZES: Final = frozenset({1, 2, 4, 8})  #: widths a scalar access may have
_WORDS: Final = struct.Struct(">4I")


class Kind(enum.IntEnum):
    """The ``kind`` nibble."""

    READ = 1  #: request: send back ``size`` bytes at ``offset`` (blocking read, split-phase get)
    WRITE = 2  #: request: write ``value`` at ``offset``, then acknowledge (write, put)
    STORE = 3  #: request: write ``value`` at ``offset``; no reply (one-way store)
    VALUE = 5  #: reply to READ: the ``size`` bytes
    ACK = 6  #: reply to WRITE


REQUEST_KINDS: Final = frozenset({Kind.READ, Kind.WRITE, Kind.STORE})
REPLY_KINDS: Final = frozenset({Kind.VALUE, Kind.ACK})


#: Sizes other than :data:`SCALAR_SIZES` a kind allows (an ACK may echo any size or none).
_SIZES: Final[dict[Kind, frozenset[int]]] = {Kind.ACK: frozenset({0, *SCALAR_SIZES})}


class Status(enum.IntEnum):
    """The ``status`` byte of a reply."""

    OK = 0
    NO_REGION = 1  #: the target has no region with this index
    OUT_OF_BOUNDS = 2  #: the access does not lie inside the target's region


REQUEST_FORMAT = construct.Struct(
    "code" / construct.BitStruct("kind" / construct.Nibble, "size" / construct.Nibble),
    "region" / construct.Int8ub,
    "op" / construct.Int16ub,
    "offset" / construct.Int32ub,
    "value" / construct.Bytes(8),
)
REPLY_FORMAT = construct.Struct(
    "code" / construct.BitStruct("kind" / construct.Nibble, "size" / construct.Nibble),
    "status" / construct.Int8ub,
    "op" / construct.Int16ub,
    "_reserved" / construct.Int32ub,
    "value" / construct.Bytes(8),
)


class SplitcErrorKind(enum.Enum):
    """Why a parse failed, in the order the checks run."""

    WORDS = "not four 32-bit argument words"
    UNKNOWN_KIND = "unknown kind for this direction"
    BAD_SIZE = "size not allowed for this kind"
    BAD_STATUS = "unknown status"


class SplitcFormatError(FormatError):
    """Malformed Split-C message; :attr:`kind` says which check failed."""

    def __init__(self, message: str, kind: SplitcErrorKind = SplitcErrorKind.WORDS) -> None:
        super().__init__(message)
        self.kind = kind


REQUEST_CODEC = derive_codec(REQUEST_FORMAT, SplitcFormatError)
REPLY_CODEC = derive_codec(REPLY_FORMAT, SplitcFormatError)


@attrs.frozen
class Request:
    """A decoded request."""

    kind: Kind
    size: int
    region: int
    op: int
    offset: int
    value: bytes = bytes(8)


@attrs.frozen
class Reply:
    """A decoded reply."""

    kind: Kind
    size: int
    status: Status
    op: int
    value: bytes = bytes(8)


def _error(kind: SplitcErrorKind, detail: str) -> SplitcFormatError:
    return SplitcFormatError(f"Split-C: {kind.value}: {detail}", kind)


def _bytes(words: Sequence[int]) -> bytes:
    if len(words) != WORDS:
        raise _error(SplitcErrorKind.WORDS, f"{len(words)} words")
    for word in words:
        # Exactly int: bool (and other subclasses) are not words.
        if word.__class__ is not int or not 0 <= word <= WORD_MAX:
            raise _error(SplitcErrorKind.WORDS, f"word {word!r}")
    return _WORDS.pack(*words)


def _check_size(kind: Kind, size: int) -> None:
    allowed = _SIZES.get(kind, SCALAR_SIZES)
    if size not in allowed:
        raise _error(SplitcErrorKind.BAD_SIZE, f"size {size} for {kind.name}")


# Wire values to members, looked up once per message (``Kind(value)`` costs an enum call).
_REQUEST_KINDS: Final = {int(kind): kind for kind in REQUEST_KINDS}
_REPLY_KINDS: Final = {int(kind): kind for kind in REPLY_KINDS}
_STATUSES: Final = {int(status): status for status in Status}


def parse_request(words: Sequence[int]) -> Request:
    """Decode the four argument words of a request; :class:`SplitcFormatError` if malformed."""
    code, size, region, op, offset, value = REQUEST_CODEC.unpack(_bytes(words))
    kind = _REQUEST_KINDS.get(code)
    if kind is None:
        raise _error(SplitcErrorKind.UNKNOWN_KIND, f"kind {code}")
    _check_size(kind, size)
    return Request(kind, size, region, op, offset, value)


def parse_reply(words: Sequence[int]) -> Reply:
    """Decode the four argument words of a reply; :class:`SplitcFormatError` if malformed."""
    code, size, status_code, op, value = REPLY_CODEC.unpack(_bytes(words))
    kind = _REPLY_KINDS.get(code)
    if kind is None:
        raise _error(SplitcErrorKind.UNKNOWN_KIND, f"kind {code}")
    _check_size(kind, size)
    status = _STATUSES.get(status_code)
    if status is None:
        raise _error(SplitcErrorKind.BAD_STATUS, f"status {status_code}")
    return Reply(kind, size, status, op, value)


def parse_request_reference(words: Sequence[int]) -> Request:
    """Like :func:`parse_request`, with :data:`REQUEST_FORMAT` (construct) alone."""
    parsed = REQUEST_FORMAT.parse(_bytes(words))
    kind, size = parsed.code.kind, parsed.code.size
    if kind not in Kind.__members__.values() or Kind(kind) not in REQUEST_KINDS:
        raise _error(SplitcErrorKind.UNKNOWN_KIND, f"kind {kind}")
    _check_size(Kind(kind), size)
    return Request(Kind(kind), size, parsed.region, parsed.op, parsed.offset, parsed.value)


def _pad(value: bytes) -> bytes:
    if len(value) > 8:
        raise ValueError(f"Split-C: a scalar value has at most 8 bytes, got {len(value)}")
    return bytes(value) + bytes(8 - len(value))


def build_request(request: Request) -> tuple[int, int, int, int]:
    """The four argument words of ``request`` (``ValueError`` for out-of-range fields)."""
    _check_size(request.kind, request.size)
    data = REQUEST_CODEC.pack(
        int(request.kind),
        request.size,
        request.region,
        request.op,
        request.offset,
        _pad(request.value),
    )
    words: tuple[int, int, int, int] = _WORDS.unpack(data)
    return words


def build_reply(reply: Reply) -> tuple[int, int, int, int]:
    """The four argument words of ``reply`` (``ValueError`` for out-of-range fields)."""
    _check_size(reply.kind, reply.size)
    data = REPLY_CODEC.pack(
        int(reply.kind), reply.size, int(reply.status), reply.op, _pad(reply.value)
    )
    words: tuple[int, int, int, int] = _WORDS.unpack(data)
    return words


# ---------------------------------------------------------------------- the per-message path
#
# The runtime's hot path works on plain tuples: the same words and fields as build_* and
# parse_* above (the derived codec of the construct formats), computed with shifts, without
# Request and Reply objects.  Anything the shifts do not cover (bad words, kinds, sizes,
# statuses) takes the codec path, which raises the documented error; tests/layers/splitc
# checks both paths against each other and against the construct formats.

_VALUE: Final = struct.Struct(">II")  # the 8-byte value as the last two words


def request_words(
    kind: Kind, size: int, region: int, op: int, offset: int, value: bytes
) -> tuple[int, int, int, int]:
    """``build_request(Request(kind, size, region, op, offset, value))``."""
    if (
        size in _SIZES.get(kind, SCALAR_SIZES)
        and region.__class__ is int
        and op.__class__ is int
        and offset.__class__ is int
        and value.__class__ is bytes
        and 0 <= region <= 0xFF
        and 0 <= op <= 0xFFFF
        and 0 <= offset <= WORD_MAX
        and len(value) <= 8
    ):
        high, low = _VALUE.unpack(value.ljust(8, b"\0") if len(value) < 8 else value)
        return ((kind << 28) | (size << 24) | (region << 16) | op, offset, high, low)
    return build_request(Request(kind, size, region, op, offset, value))


def reply_words(
    kind: Kind, size: int, status: Status, op: int, value: bytes
) -> tuple[int, int, int, int]:
    """``build_reply(Reply(kind, size, status, op, value))``."""
    if (
        size in _SIZES.get(kind, SCALAR_SIZES)
        and op.__class__ is int
        and value.__class__ is bytes
        and 0 <= op <= 0xFFFF
        and len(value) <= 8
    ):
        high, low = _VALUE.unpack(value.ljust(8, b"\0") if len(value) < 8 else value)
        return ((kind << 28) | (size << 24) | (status << 16) | op, 0, high, low)
    return build_reply(Reply(kind, size, status, op, value))


def plain_words(words: Sequence[int]) -> bool:
    """Whether ``words`` are four plain ints of 32 bits (what the shift-based paths need)."""
    if len(words) != WORDS:
        return False
    # Unrolled (WORDS is 4), not all() over a generator: no call per word.
    w0, w1, w2, w3 = words
    return (
        w0.__class__ is int
        and w1.__class__ is int
        and w2.__class__ is int
        and w3.__class__ is int
        and 0 <= w0 <= WORD_MAX
        and 0 <= w1 <= WORD_MAX
        and 0 <= w2 <= WORD_MAX
        and 0 <= w3 <= WORD_MAX
    )


def plain_word_tuple(words: tuple[object, ...]) -> bool:
    """:func:`plain_words` for a handler's ``*words`` tuple.  Typed for the compiled copy: the
    words are indexed, not iterated, and tested with ``type(w) is int`` (a pointer compare),
    not through a ``__class__`` attribute look-up."""
    if len(words) != WORDS:
        return False
    w0 = words[0]
    w1 = words[1]
    w2 = words[2]
    w3 = words[3]
    return (
        type(w0) is int
        and type(w1) is int
        and type(w2) is int
        and type(w3) is int
        and 0 <= w0 <= WORD_MAX
        and 0 <= w1 <= WORD_MAX
        and 0 <= w2 <= WORD_MAX
        and 0 <= w3 <= WORD_MAX
    )


def request_fields(words: Sequence[int]) -> tuple[Kind, int, int, int, int, bytes]:
    """``parse_request(words)`` as (kind, size, region, op, offset, value)."""
    if plain_words(words):
        first = words[0]
        kind = _REQUEST_KINDS.get(first >> 28)
        size = (first >> 24) & 0xF
        if kind is not None and size in _SIZES.get(kind, SCALAR_SIZES):
            value = _VALUE.pack(words[2], words[3])
            return kind, size, (first >> 16) & 0xFF, first & 0xFFFF, words[1], value
    request = parse_request(words)  # raises SplitcFormatError
    return request.kind, request.size, request.region, request.op, request.offset, request.value


def reply_fields(words: Sequence[int]) -> tuple[Kind, int, Status, int, bytes]:
    """``parse_reply(words)`` as (kind, size, status, op, value)."""
    if plain_words(words):
        first = words[0]
        kind = _REPLY_KINDS.get(first >> 28)
        size = (first >> 24) & 0xF
        status = _STATUSES.get((first >> 16) & 0xFF)
        if kind is not None and status is not None and size in _SIZES.get(kind, SCALAR_SIZES):
            return kind, size, status, first & 0xFFFF, _VALUE.pack(words[2], words[3])
    reply = parse_reply(words)  # raises SplitcFormatError
    return reply.kind, reply.size, reply.status, reply.op, reply.value


def requests() -> SearchStrategy[Request]:
    """Every valid request (hypothesis strategy; test-only)."""
    from hypothesis import strategies as st

    sized: SearchStrategy[Request] = st.builds(
        Request,
        st.sampled_from([Kind.READ, Kind.WRITE, Kind.STORE]),
        st.sampled_from(sorted(SCALAR_SIZES)),
        st.integers(0, 255),
        st.integers(0, 0xFFFF),
        st.integers(0, WORD_MAX),
        st.binary(min_size=8, max_size=8),
    )
    return sized


def replies() -> SearchStrategy[Reply]:
    """Every valid reply (hypothesis strategy; test-only)."""
    from hypothesis import strategies as st

    result: SearchStrategy[Reply] = st.builds(
        Reply,
        st.sampled_from([Kind.VALUE, Kind.ACK]),
        st.sampled_from(sorted(SCALAR_SIZES)),
        st.sampled_from(list(Status)),
        st.integers(0, 0xFFFF),
        st.binary(min_size=8, max_size=8),
    )
    return result
