"""U-Net queue descriptors (paper 000 §3.4, paper 003 §3.1).

A descriptor is what the application and the NI exchange through the send, receive and free
queues.  Send and receive descriptors name the message data either as scatter-gather fragments,
(offset, length) pairs into the owner's communication segment, or carry a small message inline
("the send and receive queues may hold entire small messages in descriptors", paper 000 §3.4).
A free descriptor hands one receive buffer to the NI.

The Python objects below are what in-process transports keep in their queues; the byte layout
(for queues that live in NI memory or shared memory, and for ``stacklib decode``) is defined
further down as construct formats with a fast codec derived from them.

Byte layouts (big-endian; the construct definitions below are the specification)::

    Send descriptor: a 16-byte header, then the fragments or the inline data.

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |            channel            |I|D|J|E|  rsv  |    nfrags     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                            length                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                dest_offset (0xFFFFFFFF: none)                 |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  error_code   |                  zero pad                     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  I = 0: nfrags fragments of 8 bytes: offset u32, length u32   |
    |  I = 1: ``length`` bytes of inline message data (nfrags = 0)  |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

    flags: I inline, D direct (dest_offset is set, paper 000 §3.6), J injected, E error
    (``status`` is POSTED when neither J nor E is set); rsv: 4 reserved bits, zero when built,
    ignored when parsed.  error_code: a SendError, non-zero exactly when E is set.

    Receive descriptor: a 16-byte header, then the fragments or the inline data.

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |            channel            |     kind      |    nfrags     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                            length                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                dest_offset (0xFFFFFFFF: none)                 |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                           zero pad                            |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  kind BUFFERS: nfrags fragments (offset u32, length u32)      |
    |  kind INLINE:  ``length`` bytes of message data (nfrags = 0)  |
    |  kind DIRECT:  nothing; the data is at dest_offset (nfrags 0) |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

    kind: a RecvKind.  dest_offset is set exactly for DIRECT.  For BUFFERS the fragments are
    the free-queue buffers the NI filled, whole, in order (paper 000 §4.2.2: "the message
    descriptor containing the pointers to the buffers"): the message fills them in turn, so
    every buffer holds some of it and the last one may be partly used.

    Free descriptor: one receive buffer (paper 000 §3.4, "free queues hold descriptors for
    free buffers").

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                            offset                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                            length                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Parsing checks integrity first (header present, tail exactly as long as the header says: short
is "truncated", long is "trailing bytes") and sanity after (enum values, flags consistent with
each other, fragment lengths adding up to ``length``); any failure raises
:class:`DescriptorFormatError`.  Building a descriptor the layout cannot represent (inline data
and fragments both, more than 255 fragments, a field out of range, ``dest_offset`` 0xFFFFFFFF,
``status``/``error`` or ``kind`` inconsistent as above) raises :class:`ValueError`.

``parse_send``/``parse_recv``/``parse_free`` are the fast path, on codecs derived from the
construct headers (:mod:`stacklib.wire.codec`); ``parse_*_reference`` parse with the full
construct formats (used by ``stacklib decode``); the tests prove the two agree on any input.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple, NoReturn

import attrs
import construct
from construct import this

from stacklib.compiled import mypyc_attr
from stacklib.errors import FormatError
from stacklib.wire import registry
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


class Fragment(NamedTuple):
    """One scatter-gather entry: ``length`` bytes at ``offset`` in a communication segment."""

    offset: int
    length: int


class DescriptorStatus(enum.IntEnum):
    """Where a send descriptor is in its life (paper 000 §3.1: the NI marks it injected)."""

    POSTED = 0  #: pushed by the application, not yet taken by the NI
    INJECTED = 1  #: the NI has put the message on the network; its buffers may be reused
    ERROR = 2  #: the NI rejected the descriptor; ``error`` says why; nothing was sent


class SendError(enum.IntEnum):
    """Why the NI rejected a send descriptor (the error status of paper 000 §3.2 protection)."""

    NONE = 0
    UNKNOWN_CHANNEL = 1  #: the channel id is not in this endpoint's channel table
    OUT_OF_BOUNDS = 2  #: a fragment lies (partly) outside the owner's segment
    TOO_LONG = 3  #: the message exceeds the NI's maximum message size
    INLINE_TOO_LONG = 4  #: inline data longer than the NI's inline threshold
    BAD_SHAPE = 5  #: both or neither of fragments and inline data; too many fragments
    DIRECT_UNSUPPORTED = 6  #: a direct-access offset on an NI that offers only base-level U-Net
    CHANNEL_CLOSED = 7  #: the channel was torn down
    PRIVILEGE = 8  #: U-Net/MM: the buffer is not readable by the sending process (paper 002 §4.1)


class RecvKind(enum.IntEnum):
    """How a receive descriptor holds its message."""

    BUFFERS = 0  #: in free-queue buffers named by ``fragments``
    INLINE = 1  #: inside the descriptor (small-message optimization)
    DIRECT = 2  #: deposited at ``dest_offset`` by direct-access U-Net (paper 000 §3.6)


@mypyc_attr(free_list_len=1)
class SendDescriptor:
    """A message to send on ``channel``: fragments in the segment, or ``inline`` bytes.

    ``dest_offset`` asks a direct-access NI to deposit the data at that offset of the
    destination endpoint's segment (paper 000 §3.6).  The NI writes ``status`` and ``error``.
    Compared by identity (each descriptor is one queue entry).  A plain class, not an attrs
    one: a send builds one per message on the hot paths, and the compiled copy builds a plain
    class natively (reusing the last one freed).
    """

    __slots__ = ("channel", "dest_offset", "error", "fragments", "inline", "status")

    def __init__(
        self,
        channel: int,
        fragments: tuple[Fragment, ...] = (),
        inline: bytes | None = None,
        dest_offset: int | None = None,
        status: DescriptorStatus = DescriptorStatus.POSTED,
        error: SendError = SendError.NONE,
    ) -> None:
        self.channel = channel
        self.fragments = fragments
        self.inline = inline
        self.dest_offset = dest_offset
        self.status = status
        self.error = error

    def __repr__(self) -> str:
        return (
            f"SendDescriptor(channel={self.channel!r}, fragments={self.fragments!r}, "
            f"inline={self.inline!r}, dest_offset={self.dest_offset!r}, "
            f"status={self.status!r}, error={self.error!r})"
        )

    @property
    def length(self) -> int:
        """Total message length in bytes."""
        if self.inline is not None:
            return len(self.inline)
        return sum(fragment.length for fragment in self.fragments)

    @property
    def done(self) -> bool:
        """True once the NI has injected or rejected the descriptor."""
        return self.status is not DescriptorStatus.POSTED


@attrs.define(slots=True, eq=True, repr=True)
class RecvDescriptor:
    """A received message on ``channel`` (the channel the NI mapped the message's tag to)."""

    channel: int
    length: int
    kind: RecvKind = RecvKind.BUFFERS
    fragments: tuple[Fragment, ...] = ()
    inline: bytes | None = None
    dest_offset: int | None = None


# --- byte layouts ------------------------------------------------------------------------------


class DescriptorFormatError(FormatError):
    """Malformed descriptor bytes: short header, truncated tail, trailing bytes, fields that
    contradict each other, or an unknown enum value."""


HEADER_SIZE: Final = 16  #: bytes in a send or receive descriptor header
FRAGMENT_SIZE: Final = 8  #: bytes per fragment, and in a free descriptor
NO_OFFSET: Final = 0xFFFFFFFF  #: ``dest_offset`` field value meaning "none" (base-level U-Net)
MAX_FRAGMENTS: Final = 255  #: nfrags is one byte

FRAGMENT_FORMAT = construct.Struct(
    "offset" / construct.Int32ub,
    "length" / construct.Int32ub,
)
"""A fragment, and the whole of a free descriptor."""

SEND_HEADER_FORMAT = construct.Struct(
    "channel" / construct.Int16ub,
    "flags"
    / construct.BitStruct(
        "inline" / construct.Flag,
        "direct" / construct.Flag,
        "injected" / construct.Flag,
        "error" / construct.Flag,
        construct.Padding(4),
    ),
    "nfrags" / construct.Int8ub,
    "length" / construct.Int32ub,
    "dest_offset" / construct.Int32ub,
    "error_code" / construct.Int8ub,
    construct.Padding(3),
)

SEND_DESCRIPTOR_FORMAT = construct.Struct(
    "header" / SEND_HEADER_FORMAT,
    "fragments"
    / construct.If(
        lambda ctx: not ctx.header.flags.inline,
        construct.Array(this.header.nfrags, FRAGMENT_FORMAT),
    ),
    "inline" / construct.If(this.header.flags.inline, construct.Bytes(this.header.length)),
    construct.Terminated,
)
"""The whole send descriptor; sanity rules (module docstring) are applied on top of it."""

RECV_HEADER_FORMAT = construct.Struct(
    "channel" / construct.Int16ub,
    "kind" / construct.Int8ub,
    "nfrags" / construct.Int8ub,
    "length" / construct.Int32ub,
    "dest_offset" / construct.Int32ub,
    construct.Padding(4),
)

RECV_DESCRIPTOR_FORMAT = construct.Struct(
    "header" / RECV_HEADER_FORMAT,
    "fragments"
    / construct.If(
        lambda ctx: ctx.header.kind != RecvKind.INLINE,
        construct.Array(this.header.nfrags, FRAGMENT_FORMAT),
    ),
    "inline"
    / construct.If(this.header.kind == RecvKind.INLINE, construct.Bytes(this.header.length)),
    construct.Terminated,
)
"""The whole receive descriptor; sanity rules (module docstring) are applied on top of it."""

FREE_DESCRIPTOR_FORMAT = construct.Struct("buffer" / FRAGMENT_FORMAT, construct.Terminated)

SEND_HEADER_CODEC = derive_codec(SEND_HEADER_FORMAT, DescriptorFormatError)
"""Fields: channel, inline, direct, injected, error, nfrags, length, dest_offset, error_code."""
RECV_HEADER_CODEC = derive_codec(RECV_HEADER_FORMAT, DescriptorFormatError)
"""Fields: channel, kind, nfrags, length, dest_offset."""
FRAGMENT_CODEC = derive_codec(FRAGMENT_FORMAT, DescriptorFormatError)
"""Fields: offset, length."""

_SEND_ERRORS: Final = {e.value: e for e in SendError}
_RECV_KINDS: Final = {k.value: k for k in RecvKind}
_INJECTED: Final = DescriptorStatus.INJECTED
_ERROR: Final = DescriptorStatus.ERROR
_INLINE: Final = RecvKind.INLINE
_unpack_send = SEND_HEADER_CODEC.unpack
_unpack_recv = RECV_HEADER_CODEC.unpack
_unpack_fragment = FRAGMENT_CODEC.unpack
_pack_send = SEND_HEADER_CODEC.pack
_pack_recv = RECV_HEADER_CODEC.pack
_pack_fragment = FRAGMENT_CODEC.pack
_make_fragment = Fragment._make


def buffers_hold(fragments: tuple[Fragment, ...], length: int) -> bool:
    """Whether a message of ``length`` bytes fills ``fragments`` in turn, each partly at least."""
    if not fragments:
        return False
    total = sum([fragment.length for fragment in fragments])
    return total - fragments[-1].length < length <= total


def _fail(what: str, reason: str) -> DescriptorFormatError:
    return DescriptorFormatError(f"{what} descriptor: {reason}")


def _size_error(what: str, have: int, need: int) -> NoReturn:
    """Integrity failure: the bytes are fewer or more than the header announces."""
    if have < need:
        raise _fail(what, f"truncated: {have} bytes of the {need} expected")
    raise _fail(what, f"{have - need} trailing bytes after the {need} expected")


def _fragments(data: bytes | bytearray | memoryview, end: int) -> tuple[Fragment, ...]:
    if end == HEADER_SIZE + FRAGMENT_SIZE:  # one buffer, the common case: skip the loop
        return (_make_fragment(_unpack_fragment(data, HEADER_SIZE)),)
    return tuple(
        [
            _make_fragment(_unpack_fragment(data, at))
            for at in range(HEADER_SIZE, end, FRAGMENT_SIZE)
        ]
    )


def _send_value(
    channel: int,
    inline_flag: bool,
    direct: bool,
    injected: bool,
    error_flag: bool,
    nfrags: int,
    length: int,
    dest_offset: int,
    error_code: int,
    fragments: tuple[Fragment, ...],
    inline: bytes | None,
) -> SendDescriptor:
    """Sanity checks shared by the fast and the reference parser; the typed value."""
    reason = _SEND_ERRORS.get(error_code)
    if reason is None:
        raise _fail("send", f"unknown error code {error_code}")
    if injected and error_flag:
        raise _fail("send", "both the injected and the error flag are set")
    if error_flag != (reason is not SendError.NONE):
        raise _fail("send", f"error flag {error_flag} but error code {reason.name}")
    if direct != (dest_offset != NO_OFFSET):
        raise _fail("send", f"direct flag {direct} but dest_offset {dest_offset:#x}")
    if inline_flag:
        if nfrags:
            raise _fail("send", f"inline descriptor with nfrags {nfrags}")
    elif sum([fragment.length for fragment in fragments]) != length:
        raise _fail("send", f"fragment lengths do not add up to length {length}")
    status = _ERROR if error_flag else _INJECTED if injected else DescriptorStatus.POSTED
    return SendDescriptor(
        channel, fragments, inline, dest_offset if direct else None, status, reason
    )


def parse_send(data: bytes | bytearray | memoryview) -> SendDescriptor:
    """Parse one whole send descriptor (fast path); raise DescriptorFormatError if malformed."""
    try:
        header = _unpack_send(data)
    except DescriptorFormatError as exc:
        raise _fail("send", f"short header: {exc}") from None
    channel, inline_flag, direct, injected, error_flag, nfrags, length, dest, code = header
    end = HEADER_SIZE + (length if inline_flag else FRAGMENT_SIZE * nfrags)
    if len(data) != end:
        _size_error("send", len(data), end)
    if inline_flag:
        fragments: tuple[Fragment, ...] = ()
        inline: bytes | None = bytes(data[HEADER_SIZE:end])
    else:
        fragments, inline = _fragments(data, end), None
    return _send_value(
        channel,
        inline_flag,
        direct,
        injected,
        error_flag,
        nfrags,
        length,
        dest,
        code,
        fragments,
        inline,
    )


def build_send(d: SendDescriptor) -> bytes:
    """The bytes of send descriptor ``d``; ValueError if the layout cannot represent it."""
    inline, fragments, dest_offset, status = d.inline, d.fragments, d.dest_offset, d.status
    if dest_offset == NO_OFFSET:
        raise ValueError(f"dest_offset {NO_OFFSET:#x} is reserved to mean 'none'")
    if (status == _ERROR) != (d.error != SendError.NONE):
        raise ValueError(f"status {status.name} and error {d.error.name} contradict each other")
    if inline is not None:
        if fragments:
            raise ValueError("a send descriptor carries inline data or fragments, not both")
        header = _pack_send(
            d.channel,
            True,
            dest_offset is not None,
            status == _INJECTED,
            status == _ERROR,
            0,
            len(inline),
            NO_OFFSET if dest_offset is None else dest_offset,
            d.error,
        )
        return header + inline
    if len(fragments) > MAX_FRAGMENTS:
        raise ValueError(f"{len(fragments)} fragments, at most {MAX_FRAGMENTS} fit the layout")
    if len(fragments) == 1:  # one buffer, the common case: skip the loops
        length = fragments[0].length
        tail = _pack_fragment(fragments[0].offset, length)
    else:
        length = sum([fragment.length for fragment in fragments])
        tail = b"".join([_pack_fragment(*fragment) for fragment in fragments])
    header = _pack_send(
        d.channel,
        False,
        dest_offset is not None,
        status == _INJECTED,
        status == _ERROR,
        len(fragments),
        length,
        NO_OFFSET if dest_offset is None else dest_offset,
        d.error,
    )
    return header + tail


def _recv_value(
    channel: int,
    kind_code: int,
    nfrags: int,
    length: int,
    dest_offset: int,
    fragments: tuple[Fragment, ...],
    inline: bytes | None,
) -> RecvDescriptor:
    """Sanity checks shared by the fast and the reference parser; the typed value."""
    kind = _RECV_KINDS.get(kind_code)
    if kind is None:
        raise _fail("receive", f"unknown kind {kind_code}")
    if (kind is RecvKind.DIRECT) != (dest_offset != NO_OFFSET):
        raise _fail("receive", f"kind {kind.name} with dest_offset {dest_offset:#x}")
    if kind is RecvKind.BUFFERS:
        if not buffers_hold(fragments, length):
            raise _fail("receive", f"buffers of {nfrags} fragments cannot hold exactly {length}")
    elif nfrags:
        raise _fail("receive", f"kind {kind.name} with nfrags {nfrags}")
    return RecvDescriptor(
        channel,
        length,
        kind,
        fragments,
        inline,
        dest_offset if kind is RecvKind.DIRECT else None,
    )


def parse_recv(data: bytes | bytearray | memoryview) -> RecvDescriptor:
    """Parse one whole receive descriptor (fast path); raise DescriptorFormatError if malformed."""
    try:
        channel, kind, nfrags, length, dest = _unpack_recv(data)
    except DescriptorFormatError as exc:
        raise _fail("receive", f"short header: {exc}") from None
    if kind == _INLINE:
        end = HEADER_SIZE + length
        if len(data) != end:
            _size_error("receive", len(data), end)
        return _recv_value(channel, kind, nfrags, length, dest, (), bytes(data[HEADER_SIZE:end]))
    end = HEADER_SIZE + FRAGMENT_SIZE * nfrags
    if len(data) != end:
        _size_error("receive", len(data), end)
    return _recv_value(channel, kind, nfrags, length, dest, _fragments(data, end), None)


def build_recv(d: RecvDescriptor) -> bytes:
    """The bytes of receive descriptor ``d``; ValueError if the layout cannot represent it."""
    kind, fragments, inline, dest_offset = d.kind, d.fragments, d.inline, d.dest_offset
    if kind == RecvKind.INLINE:
        if inline is None or fragments or len(inline) != d.length:
            raise ValueError("an INLINE receive descriptor has inline data of length bytes only")
    elif inline is not None:
        raise ValueError(f"a {kind.name} receive descriptor carries no inline data")
    if kind == RecvKind.DIRECT:
        if dest_offset is None or fragments:
            raise ValueError("a DIRECT receive descriptor has a dest_offset and no fragments")
        if dest_offset == NO_OFFSET:
            raise ValueError(f"dest_offset {NO_OFFSET:#x} is reserved to mean 'none'")
    elif dest_offset is not None:
        raise ValueError(f"a {kind.name} receive descriptor has no dest_offset")
    if len(fragments) > MAX_FRAGMENTS:
        raise ValueError(f"{len(fragments)} fragments, at most {MAX_FRAGMENTS} fit the layout")
    if kind == RecvKind.BUFFERS and not buffers_hold(fragments, d.length):
        raise ValueError(f"the buffers do not hold exactly {d.length} bytes, each some of them")
    header = _pack_recv(
        d.channel,
        kind,
        len(fragments),
        d.length,
        NO_OFFSET if dest_offset is None else dest_offset,
    )
    if inline is not None:
        return header + inline
    return header + b"".join([_pack_fragment(*fragment) for fragment in fragments])


def parse_free(data: bytes | bytearray | memoryview) -> Fragment:
    """Parse a free descriptor (exactly 8 bytes): the receive buffer it hands to the NI."""
    if len(data) != FRAGMENT_SIZE:
        _size_error("free", len(data), FRAGMENT_SIZE)
    return _make_fragment(_unpack_fragment(data))


def build_free(f: Fragment) -> bytes:
    """The bytes of the free descriptor handing buffer ``f`` to the NI."""
    return _pack_fragment(f.offset, f.length)


# --- reference parsers on the full construct formats (stacklib decode; agreement tests) ------


def _construct_parse(what: str, fmt: construct.Construct, data: Any) -> Any:
    try:
        return fmt.parse(bytes(data))
    except construct.StreamError as exc:
        raise _fail(what, f"truncated ({exc})") from None
    except construct.TerminatedError:
        raise _fail(what, "trailing bytes") from None


def parse_send_reference(data: bytes | bytearray | memoryview) -> SendDescriptor:
    """Parse a send descriptor with :data:`SEND_DESCRIPTOR_FORMAT` (slow, the specification)."""
    c = _construct_parse("send", SEND_DESCRIPTOR_FORMAT, data)
    h, flags = c.header, c.header.flags
    fragments = tuple(Fragment(f.offset, f.length) for f in c.fragments or ())
    return _send_value(
        h.channel,
        flags.inline,
        flags.direct,
        flags.injected,
        flags.error,
        h.nfrags,
        h.length,
        h.dest_offset,
        h.error_code,
        fragments,
        c.inline,
    )


def parse_recv_reference(data: bytes | bytearray | memoryview) -> RecvDescriptor:
    """Parse a receive descriptor with :data:`RECV_DESCRIPTOR_FORMAT` (slow, the specification)."""
    c = _construct_parse("receive", RECV_DESCRIPTOR_FORMAT, data)
    h = c.header
    fragments = tuple(Fragment(f.offset, f.length) for f in c.fragments or ())
    return _recv_value(h.channel, h.kind, h.nfrags, h.length, h.dest_offset, fragments, c.inline)


def parse_free_reference(data: bytes | bytearray | memoryview) -> Fragment:
    """Parse a free descriptor with :data:`FREE_DESCRIPTOR_FORMAT` (slow, the specification)."""
    c = _construct_parse("free", FREE_DESCRIPTOR_FORMAT, data)
    return Fragment(c.buffer.offset, c.buffer.length)


# --- stacklib decode ---------------------------------------------------------------------------


def _offset(value: int | None) -> object:
    return "none" if value is None else value


def _fragment_lines(fragments: tuple[Fragment, ...]) -> list[registry.Field]:
    return [(f"[{i}]", f"offset {f.offset} length {f.length}") for i, f in enumerate(fragments)]


def describe_send(d: SendDescriptor) -> list[registry.Field]:
    """``stacklib decode`` lines for a send descriptor."""
    fields: list[registry.Field] = [
        ("channel", d.channel),
        ("status", d.status),
        ("error", d.error),
        ("length", d.length),
        ("dest_offset", _offset(d.dest_offset)),
    ]
    if d.inline is not None:
        fields.append(("inline", d.inline))
    else:
        fields.append((f"fragments ({len(d.fragments)})", _fragment_lines(d.fragments)))
    return fields


def describe_recv(d: RecvDescriptor) -> list[registry.Field]:
    """``stacklib decode`` lines for a receive descriptor."""
    fields: list[registry.Field] = [
        ("channel", d.channel),
        ("kind", d.kind),
        ("length", d.length),
        ("dest_offset", _offset(d.dest_offset)),
    ]
    if d.inline is not None:
        fields.append(("inline", d.inline))
    elif d.kind is RecvKind.BUFFERS:
        fields.append((f"fragments ({len(d.fragments)})", _fragment_lines(d.fragments)))
    return fields


def describe_free(f: Fragment) -> list[registry.Field]:
    """``stacklib decode`` lines for a free descriptor."""
    return [("offset", f.offset), ("length", f.length)]


# --- hypothesis strategies (hypothesis is a test-only dependency: imported lazily) -------------


def _fragment_lists(max_fragments: int) -> SearchStrategy[tuple[Fragment, ...]]:
    from hypothesis import strategies as st

    # Cap each length so that the total still fits the u32 length field.
    cap = 0xFFFFFFFF // max(1, max_fragments)
    fragment = st.builds(Fragment, st.integers(0, 0xFFFFFFFF), st.integers(0, cap))
    return st.lists(fragment, max_size=max_fragments).map(tuple)


def send_descriptors(
    *, max_fragments: int = 4, max_inline: int = 64
) -> SearchStrategy[SendDescriptor]:
    """Send descriptors the byte layout can represent."""
    from hypothesis import strategies as st

    outcome = st.one_of(
        st.just((DescriptorStatus.POSTED, SendError.NONE)),
        st.just((DescriptorStatus.INJECTED, SendError.NONE)),
        st.sampled_from([e for e in SendError if e is not SendError.NONE]).map(
            lambda e: (DescriptorStatus.ERROR, e)
        ),
    )

    @st.composite
    def build(draw: Callable[[Any], Any]) -> SendDescriptor:
        status, error = draw(outcome)
        inline = draw(st.none() | st.binary(max_size=max_inline))
        fragments = draw(_fragment_lists(max_fragments)) if inline is None else ()
        return SendDescriptor(
            channel=draw(st.integers(0, 0xFFFF)),
            fragments=fragments,
            inline=inline,
            dest_offset=draw(st.none() | st.integers(0, NO_OFFSET - 1)),
            status=status,
            error=error,
        )

    result: SearchStrategy[SendDescriptor] = build()
    return result


def recv_descriptors(
    *, max_fragments: int = 4, max_inline: int = 64
) -> SearchStrategy[RecvDescriptor]:
    """Receive descriptors the byte layout can represent."""
    from hypothesis import strategies as st

    channels = st.integers(0, 0xFFFF)

    @st.composite
    def filled(draw: st.DrawFn) -> RecvDescriptor:
        fragments = draw(_fragment_lists(max_fragments).filter(lambda f: bool(f) and f[-1].length))
        total = sum(f.length for f in fragments)
        length = draw(st.integers(total - fragments[-1].length + 1, total))
        return RecvDescriptor(draw(channels), length, RecvKind.BUFFERS, fragments)

    buffers = filled()
    inline = st.builds(
        lambda channel, data: RecvDescriptor(channel, len(data), RecvKind.INLINE, (), data),
        channels,
        st.binary(max_size=max_inline),
    )
    direct = st.builds(
        lambda channel, length, offset: RecvDescriptor(
            channel, length, RecvKind.DIRECT, dest_offset=offset
        ),
        channels,
        st.integers(0, 0xFFFFFFFF),
        st.integers(0, NO_OFFSET - 1),
    )
    result: SearchStrategy[RecvDescriptor] = st.one_of(buffers, inline, direct)
    return result


def free_descriptors() -> SearchStrategy[Fragment]:
    """Free descriptors: any (offset, length) pair of u32s."""
    from hypothesis import strategies as st

    result: SearchStrategy[Fragment] = st.builds(
        Fragment, st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF)
    )
    return result


def _send_fields(descriptor: SendDescriptor) -> tuple[object, ...]:
    """A send descriptor's fields in order (it compares by identity; the codec's round trip
    compares by value)."""
    d = descriptor
    return (d.channel, d.fragments, d.inline, d.dest_offset, d.status, d.error)


registry.register(
    "unet-send-desc",
    parse_send_reference,
    describe_send,
    "U-Net send queue descriptor (paper 000 §3.4)",
    build=build_send,
    strategy=send_descriptors,
    error=DescriptorFormatError,
    equal=lambda a, b: _send_fields(a) == _send_fields(b),
)
registry.register(
    "unet-recv-desc",
    parse_recv_reference,
    describe_recv,
    "U-Net receive queue descriptor (paper 000 §3.4)",
    build=build_recv,
    strategy=recv_descriptors,
    error=DescriptorFormatError,
)
registry.register(
    "unet-free-desc",
    parse_free_reference,
    describe_free,
    "U-Net free queue descriptor: one receive buffer (paper 000 §3.4)",
    build=build_free,
    strategy=free_descriptors,
    error=DescriptorFormatError,
)
