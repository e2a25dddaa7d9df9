"""The TCP segment: a 20-byte fixed header, options, then the payload (RFC 9293 §3.1).

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          Source Port          |       Destination Port        |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                        Sequence Number                        |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                    Acknowledgment Number                      |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  Data |     |N|C|E|U|A|P|R|S|F|                               |
    | Offset| Rsrv|S|W|C|R|C|S|S|Y|I|            Window             |
    |       |     | |R|E|G|K|H|T|N|N|                               |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |           Checksum            |         Urgent Pointer        |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                    Options (data offset * 4 - 20 bytes)       |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                             data                              |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

Fields are big-endian.  NS is the RFC 3540 nonce bit (historic, but still a header bit); the
three reserved bits are ignored on parse and written as zeros.

Options (RFC 9293 §3.2; RFC 7323; RFC 2018): EOL (0) ends the list, NOP (1) pads, MSS (2, length
4), window scale (3, length 3), SACK-permitted (4, length 2), timestamps (8, length 10).  Other
kinds are skipped by their length byte (tolerant parsing, RFC 9293 §3.1: "A TCP implementation
MUST ignore without error any TCP option it does not implement").  A length byte below 2 or one
that runs past the options area, or a known option with the wrong length, is a format error.
SACK blocks (kind 5) are recognised as an option kind and skipped: stacklib's TCP does not do SACK.

:func:`parse` checks integrity first (the 20 header bytes are there; the data offset is at least
5 and within the segment; the checksum, when the addresses are given) and sanity after (the
options).  Any failure raises :class:`TcpFormatError` with its :class:`TcpErrorKind`.
:data:`HEADER_FORMAT` (construct) specifies the fixed header; :data:`HEADER_CODEC` is the
struct-speed codec derived from it; :func:`parse_reference` parses with construct alone.

The checksum (:func:`checksum`) covers the IPv4 pseudo-header (source and destination address,
zero, protocol 6, TCP length) and the segment, as the 16-bit one's complement of the one's
complement sum (RFC 9293 §3.1, RFC 1071).  Whether it is computed and checked is the caller's
policy: :func:`build` fills it in when given the addresses, :func:`parse` checks it when given
them.
"""

from __future__ import annotations

import enum
import functools
import struct
from typing import TYPE_CHECKING

import attrs
import construct

from stacklib.errors import FormatError
from stacklib.layers.ip.wire import ones_sum
from stacklib.wire import registry
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "HEADER_CODEC",
    "HEADER_FORMAT",
    "HEADER_SIZE",
    "HEADER_WORDS",
    "MAX_OPTIONS",
    "PROTOCOL_NUMBER",
    "HeaderTemplate",
    "IPv4Address",
    "Segment",
    "TcpErrorKind",
    "TcpFlags",
    "TcpFormatError",
    "TcpOptions",
    "build",
    "build_fields",
    "checksum",
    "internet_checksum",
    "parse",
    "parse_reference",
    "pseudo_sum",
    "segments",
    "sum_ok",
]

HEADER_SIZE = 20  #: the fixed header, without options
MAX_OPTIONS = 40  #: a data offset of 15 words leaves 40 bytes of options
PROTOCOL_NUMBER = 6  #: TCP's IPv4 protocol number, in the pseudo-header

IPv4Address = bytes | int
"""An IPv4 address as 4 bytes (network order) or as a 32-bit integer."""


class TcpFlags(enum.IntFlag):
    """The control bits: bit values in the 9-bit flags field (NS is the most significant)."""

    FIN = 0x001
    SYN = 0x002
    RST = 0x004
    PSH = 0x008
    ACK = 0x010
    URG = 0x020
    ECE = 0x040
    CWR = 0x080
    NS = 0x100


class TcpErrorKind(enum.Enum):
    """Why :func:`parse` rejected a segment, in the order the checks run."""

    SHORT = "shorter than the 20-byte header"
    BAD_OFFSET = "data offset below 5 words or past the end of the segment"
    CHECKSUM = "checksum mismatch"
    BAD_OPTION = "malformed option"


class TcpFormatError(FormatError):
    """Malformed TCP segment; :attr:`kind` says which check failed.

    (``kind`` defaults to SHORT because the derived codec raises this class, with a message
    only, for data shorter than the header.)
    """

    def __init__(self, message: str, kind: TcpErrorKind = TcpErrorKind.SHORT) -> None:
        self.kind = kind
        super().__init__(message)


def _error(kind: TcpErrorKind, detail: str) -> TcpFormatError:
    return TcpFormatError(f"TCP: {kind.value}: {detail}", kind)


HEADER_FORMAT = construct.Struct(
    "src_port" / construct.Int16ub,
    "dst_port" / construct.Int16ub,
    "seq" / construct.Int32ub,
    "ack" / construct.Int32ub,
    "control"
    / construct.BitStruct(
        "data_offset" / construct.BitsInteger(4),
        "_reserved" / construct.BitsInteger(3),
        "ns" / construct.Flag,
        "cwr" / construct.Flag,
        "ece" / construct.Flag,
        "urg" / construct.Flag,
        "ack_flag" / construct.Flag,
        "psh" / construct.Flag,
        "rst" / construct.Flag,
        "syn" / construct.Flag,
        "fin" / construct.Flag,
    ),
    "window" / construct.Int16ub,
    "checksum" / construct.Int16ub,
    "urgent" / construct.Int16ub,
)
"""The fixed 20-byte header (the specification the fast codec is derived from)."""

HEADER_CODEC = derive_codec(HEADER_FORMAT, TcpFormatError)
"""Fields: src_port, dst_port, seq, ack, data_offset, ns, cwr, ece, urg, ack_flag, psh, rst,
syn, fin, window, checksum, urgent."""

# The hot path reads the control word as one integer: same bytes, fewer conversions.  The tests
# prove it agrees with HEADER_CODEC (and so with HEADER_FORMAT).
_FAST = struct.Struct(">HHIIHHHH")
HEADER_WORDS = _FAST
"""The fixed header as (src_port, dst_port, seq, ack, control, window, checksum, urgent), the
control word being data offset << 12 | flags: the receive path's header prediction reads it."""

# Option kinds (RFC 9293 §3.2, RFC 7323, RFC 2018).
_EOL, _NOP, _MSS, _WSCALE, _SACK_OK, _SACK, _TIMESTAMPS = 0, 1, 2, 3, 4, 5, 8
_KNOWN_LENGTH = {_MSS: 4, _WSCALE: 3, _SACK_OK: 2, _TIMESTAMPS: 10}


@attrs.frozen(kw_only=True)
class TcpOptions:
    """The options stacklib understands; others are skipped on parse and never built."""

    mss: int | None = None  #: maximum segment size the sender can receive (RFC 9293 §3.7.1)
    window_scale: int | None = None  #: shift count (RFC 7323 §2); 0-14 meaningful, any byte kept
    sack_permitted: bool = False  #: RFC 2018 §2
    timestamps: tuple[int, int] | None = None  #: (TSval, TSecr), RFC 7323 §3

    def encode(self) -> bytes:
        """The options area: MSS, then NOP-aligned window scale, SACK-permitted and timestamps,
        padded with EOL to a multiple of 4 bytes (each option 32-bit aligned, as Linux does)."""
        out = bytearray()
        if self.mss is not None:
            out += struct.pack(">BBH", _MSS, 4, self.mss)
        if self.window_scale is not None:
            out += struct.pack(">BBBB", _NOP, _WSCALE, 3, self.window_scale)
        if self.sack_permitted:
            out += bytes((_NOP, _NOP, _SACK_OK, 2))
        if self.timestamps is not None:
            out += struct.pack(">BBBBII", _NOP, _NOP, _TIMESTAMPS, 10, *self.timestamps)
        return bytes(out)


NO_OPTIONS = TcpOptions()
NO_FLAGS = TcpFlags(0)
# Every 9-bit flags value made once: ``TcpFlags(n)`` runs enum's Python code (hot path on parse).
_FLAGS = tuple(TcpFlags(n) for n in range(0x200))


@attrs.frozen(kw_only=True)
class Segment:
    """One TCP segment.  ``checksum`` is what the header carries (filled in by :func:`build`
    when given the addresses; on parse, the received value)."""

    src_port: int
    dst_port: int
    seq: int
    ack: int = 0
    flags: TcpFlags = NO_FLAGS
    window: int = 0
    checksum: int = 0
    urgent: int = 0
    options: TcpOptions = NO_OPTIONS
    payload: bytes = b""

    @property
    def seg_len(self) -> int:
        """Sequence space occupied: payload bytes plus one each for SYN and FIN."""
        # Plain int arithmetic: IntFlag's ``&`` goes through enum's Python code (hot path).
        bits = int(self.flags)
        return len(self.payload) + ((bits >> 1) & 1) + (bits & 1)  # SYN is 0x002, FIN 0x001

    def __str__(self) -> str:
        names = "|".join(f.name or "" for f in TcpFlags if f in self.flags) or "-"
        return (
            f"{self.src_port}>{self.dst_port} [{names}] seq={self.seq} ack={self.ack} "
            f"win={self.window} len={len(self.payload)}"
        )


# --- the checksum (RFC 1071) --------------------------------------------------------------------


def internet_checksum(data: bytes | bytearray | memoryview, initial: int = 0) -> int:
    """The 16-bit one's complement of the one's complement sum of ``data`` (RFC 1071).

    ``initial`` is a partial (unfolded, big-endian) sum to add, e.g. of a pseudo-header.  The
    sum is IP's :func:`~stacklib.layers.ip.wire.ones_sum`: the bytes as one big integer
    reduced modulo 0xFFFF (2**16 = 1 mod 0xFFFF), about 4x faster than summing 16-bit words
    at 2 KB (docs/performance.md).
    """
    while initial >> 16:
        initial = (initial & 0xFFFF) + (initial >> 16)
    return ~ones_sum(data, initial) & 0xFFFF


def _address(value: IPv4Address) -> int:
    if isinstance(value, int):
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError(f"IPv4 address out of range: {value}")
        return value
    if len(value) != 4:
        raise ValueError(f"an IPv4 address is 4 bytes, got {len(value)}")
    return int.from_bytes(value, "big")


def _pair_sum(src: IPv4Address, dst: IPv4Address) -> int:
    s, d = _address(src), _address(dst)
    return (s >> 16) + (s & 0xFFFF) + (d >> 16) + (d & 0xFFFF) + PROTOCOL_NUMBER


# A connection checksums every segment over the same two addresses: remember their sum (hot
# path).  Only bytes and int are hashable address types; anything else is computed each time.
_cached_pair_sum = functools.lru_cache(maxsize=256)(_pair_sum)
_HASHABLE = (bytes, int)


def _pseudo_sum(src: IPv4Address, dst: IPv4Address, length: int) -> int:
    if type(src) in _HASHABLE and type(dst) in _HASHABLE:
        return _cached_pair_sum(src, dst) + length
    return _pair_sum(src, dst) + length


def checksum(segment: bytes | bytearray | memoryview, src: IPv4Address, dst: IPv4Address) -> int:
    """The checksum of ``segment`` (its checksum field included as is) over the IPv4
    pseudo-header; a segment carrying a correct checksum gives 0 (RFC 9293 §3.1)."""
    return internet_checksum(segment, _pseudo_sum(src, dst, len(segment)))


# --- parse and build -----------------------------------------------------------------------------


def _parse_options(data: bytes | bytearray | memoryview) -> TcpOptions:
    mss = wscale = timestamps = None
    sack_ok = False
    i, end = 0, len(data)
    while i < end:
        kind = data[i]
        if kind == _EOL:
            break
        if kind == _NOP:
            i += 1
            continue
        if i + 1 >= end:
            raise _error(TcpErrorKind.BAD_OPTION, f"kind {kind} at {i} has no length byte")
        length = data[i + 1]
        if length < 2 or i + length > end:
            raise _error(
                TcpErrorKind.BAD_OPTION, f"kind {kind} at {i}: length {length} of {end - i} left"
            )
        expected = _KNOWN_LENGTH.get(kind)
        if expected is not None and length != expected:
            raise _error(
                TcpErrorKind.BAD_OPTION, f"kind {kind} must have length {expected}, got {length}"
            )
        if kind == _MSS:
            mss = (data[i + 2] << 8) | data[i + 3]
        elif kind == _WSCALE:
            wscale = data[i + 2]
        elif kind == _SACK_OK:
            sack_ok = True
        elif kind == _TIMESTAMPS:
            tsval, tsecr = struct.unpack_from(">II", data, i + 2)
            timestamps = (tsval, tsecr)
        i += length
    if mss is None and wscale is None and not sack_ok and timestamps is None:
        return NO_OPTIONS
    return TcpOptions(mss=mss, window_scale=wscale, sack_permitted=sack_ok, timestamps=timestamps)


def _verify(
    data: bytes | bytearray | memoryview, src: IPv4Address | None, dst: IPv4Address | None
) -> None:
    if src is not None and dst is not None and checksum(data, src, dst) != 0:
        raise _error(TcpErrorKind.CHECKSUM, f"{len(data)}-byte segment")


def _finish(
    data: bytes | bytearray | memoryview, head: tuple[int, ...], offset: int, control: int
) -> Segment:
    src_port, dst_port, seq, ack, window, csum, urgent = head
    size = len(data)
    if offset < 5 or offset * 4 > size:
        raise _error(TcpErrorKind.BAD_OFFSET, f"offset {offset} words in {size} bytes")
    header_len = offset * 4
    options = (
        _parse_options(data[HEADER_SIZE:header_len]) if header_len > HEADER_SIZE else NO_OPTIONS
    )
    return Segment(
        src_port=src_port,
        dst_port=dst_port,
        seq=seq,
        ack=ack,
        flags=_FLAGS[control & 0x1FF],
        window=window,
        checksum=csum,
        urgent=urgent,
        options=options,
        payload=bytes(data[header_len:]),
    )


def parse(
    data: bytes | bytearray | memoryview,
    src: IPv4Address | None = None,
    dst: IPv4Address | None = None,
) -> Segment:
    """The segment in ``data`` (one whole segment: IP delimits it).

    The checksum is verified when both ``src`` and ``dst`` (the IPv4 source and destination of
    the datagram) are given.  Raises :class:`TcpFormatError` if malformed.
    """
    if len(data) < HEADER_SIZE:
        raise _error(TcpErrorKind.SHORT, f"{len(data)} bytes")
    src_port, dst_port, seq, ack, control, window, csum, urgent = _FAST.unpack_from(data)
    offset = control >> 12
    if offset < 5 or offset * 4 > len(data):
        raise _error(TcpErrorKind.BAD_OFFSET, f"offset {offset} words in {len(data)} bytes")
    _verify(data, src, dst)
    return _finish(data, (src_port, dst_port, seq, ack, window, csum, urgent), offset, control)


def parse_reference(
    data: bytes | bytearray | memoryview,
    src: IPv4Address | None = None,
    dst: IPv4Address | None = None,
) -> Segment:
    """Parse like :func:`parse`, the fixed header with :data:`HEADER_FORMAT` (slow)."""
    data = bytes(data)
    try:
        h = HEADER_FORMAT.parse(data)
    except construct.StreamError:
        raise _error(TcpErrorKind.SHORT, f"{len(data)} bytes") from None
    c = h.control
    offset = c.data_offset
    if offset < 5 or offset * 4 > len(data):
        raise _error(TcpErrorKind.BAD_OFFSET, f"offset {offset} words in {len(data)} bytes")
    _verify(data, src, dst)
    bits = (c.ns, c.cwr, c.ece, c.urg, c.ack_flag, c.psh, c.rst, c.syn, c.fin)
    control = 0
    for bit in bits:
        control = (control << 1) | bool(bit)
    head = (h.src_port, h.dst_port, h.seq, h.ack, h.window, h.checksum, h.urgent)
    return _finish(data, head, offset, control)


def build(
    segment: Segment,
    src: IPv4Address | None = None,
    dst: IPv4Address | None = None,
) -> bytes:
    """The bytes of ``segment``.

    With both ``src`` and ``dst`` the checksum is computed over the IPv4 pseudo-header and
    written; otherwise ``segment.checksum`` is written as is.  Raises ValueError for a field out
    of range or options longer than 40 bytes (the caller's mistakes, not malformed input).
    """
    opts = segment.options.encode() if segment.options is not NO_OPTIONS else b""
    if len(opts) > MAX_OPTIONS:
        raise ValueError(f"{len(opts)} bytes of options exceed {MAX_OPTIONS}")
    offset = (HEADER_SIZE + len(opts)) // 4
    flags = int(segment.flags)
    if not 0 <= flags <= 0x1FF:
        raise ValueError(f"flags out of range: {flags:#x}")
    try:
        head = _FAST.pack(
            segment.src_port,
            segment.dst_port,
            segment.seq,
            segment.ack,
            (offset << 12) | flags,
            segment.window,
            0 if src is not None and dst is not None else segment.checksum,
            segment.urgent,
        )
    except struct.error as exc:
        raise ValueError(f"TCP header field out of range: {exc}") from None
    data = head + opts + segment.payload
    if src is not None and dst is not None:
        csum = checksum(data, src, dst)
        data = data[:16] + csum.to_bytes(2, "big") + data[18:]
    return data


def build_fields(
    src_port: int,
    dst_port: int,
    seq: int,
    ack: int,
    flags: int,
    window: int,
    payload: bytes,
    src: IPv4Address | None = None,
    dst: IPv4Address | None = None,
) -> bytes:
    """The bytes of a segment without options, from its fields: what :func:`build` makes of the
    same :class:`Segment` (checksum 0 without addresses, urgent 0), without making one.

    The per-segment fast path of :class:`~stacklib.layers.tcp.machine.TcpConnection` (every data
    segment and ACK): one precompiled ``struct`` pack, no Segment or options objects.
    """
    flags = int(flags)
    if not 0 <= flags <= 0x1FF:
        raise ValueError(f"flags out of range: {flags:#x}")
    control = 0x5000 | flags  # data offset 5 words: no options
    try:
        head = _FAST.pack(src_port, dst_port, seq, ack, control, window, 0, 0)
        if src is None or dst is None:
            return head + payload
        csum = internet_checksum(head + payload, _pseudo_sum(src, dst, HEADER_SIZE + len(payload)))
        return _FAST.pack(src_port, dst_port, seq, ack, control, window, csum, 0) + payload
    except struct.error as exc:
        raise ValueError(f"TCP header field out of range: {exc}") from None


def pseudo_sum(src: IPv4Address, dst: IPv4Address) -> int:
    """The 16-bit word sum of a pseudo-header's addresses and protocol (the length apart), for
    :func:`sum_ok` and :class:`HeaderTemplate`, which add the length per segment."""
    return _pair_sum(src, dst)


def sum_ok(segment: bytes | bytearray | memoryview, pair: int) -> bool:
    """Whether ``segment`` carries a correct checksum over a pseudo-header whose addresses sum
    to ``pair`` (:func:`pseudo_sum`): ``checksum(segment, src, dst) == 0`` in one call."""
    start = pair + len(segment)
    while start >> 16:
        start = (start & 0xFFFF) + (start >> 16)
    return ones_sum(segment, start) == 0xFFFF


class HeaderTemplate:
    """A connection's segments without options, built from a template: the ports and the
    pseudo-header's address sum are fixed per connection, so the header's checksum is that
    constant plus the words of seq, ack, control and window added as integers, plus one sum
    over the payload.  :meth:`build` makes the same bytes as :func:`build_fields` with one
    ``struct`` pack and one concatenation (no header-and-payload copy to checksum)."""

    __slots__ = ("_base", "_dst_port", "_src_port")

    def __init__(
        self,
        src_port: int,
        dst_port: int,
        src: IPv4Address | None = None,
        dst: IPv4Address | None = None,
    ) -> None:
        if not (0 <= src_port <= 0xFFFF and 0 <= dst_port <= 0xFFFF):
            raise ValueError(f"TCP ports out of range: {src_port}, {dst_port}")
        self._src_port = src_port
        self._dst_port = dst_port
        # None: no checksum (the field stays 0), as build_fields without addresses.
        self._base = (
            None
            if src is None or dst is None
            else _pair_sum(src, dst) + HEADER_SIZE + src_port + dst_port
        )

    def build(
        self, seq: int, ack: int, flags: int, window: int, payload: bytes | bytearray
    ) -> bytes:
        """The segment's bytes: :func:`build_fields` of the template's ports and addresses."""
        if not 0 <= flags <= 0x1FF:
            raise ValueError(f"flags out of range: {flags:#x}")
        control = 0x5000 | flags
        base = self._base
        csum = 0
        if base is not None:
            total = base + len(payload) + (seq >> 16) + (seq & 0xFFFF) + (ack >> 16)
            total += (ack & 0xFFFF) + control + window
            if payload:
                total += ones_sum(payload)
            if total < 0:
                raise ValueError("TCP header field out of range: negative")
            while total >> 16:
                total = (total & 0xFFFF) + (total >> 16)
            csum = ~total & 0xFFFF
        try:
            head = _FAST.pack(self._src_port, self._dst_port, seq, ack, control, window, csum, 0)
        except struct.error as exc:
            raise ValueError(f"TCP header field out of range: {exc}") from None
        return head + payload


# --- stacklib decode -----------------------------------------------------------------------------


def describe(segment: Segment) -> list[registry.Field]:
    """``stacklib decode`` lines for a segment."""
    o = segment.options
    return [
        ("ports", f"{segment.src_port} -> {segment.dst_port}"),
        ("seq", segment.seq),
        ("ack", segment.ack),
        ("flags", "|".join(f.name or "" for f in TcpFlags if f in segment.flags) or "none"),
        ("window", segment.window),
        ("checksum", f"{segment.checksum:#06x}"),
        ("urgent", segment.urgent),
        ("mss", o.mss),
        ("window scale", o.window_scale),
        ("sack permitted", o.sack_permitted),
        ("timestamps", o.timestamps),
        ("payload", segment.payload),
    ]


# --- hypothesis strategy (hypothesis is a test-only dependency: imported lazily) ---------------


def segments(*, max_payload: int = 256) -> SearchStrategy[Segment]:
    """Valid segments: any header fields, any flags, any option set, a payload."""
    from hypothesis import strategies as st

    u16 = st.integers(0, 0xFFFF)
    u32 = st.integers(0, 0xFFFFFFFF)
    options = st.builds(
        TcpOptions,
        mss=st.none() | u16,
        window_scale=st.none() | st.integers(0, 255),
        sack_permitted=st.booleans(),
        timestamps=st.none() | st.tuples(u32, u32),
    )
    result: SearchStrategy[Segment] = st.builds(
        Segment,
        src_port=u16,
        dst_port=u16,
        seq=u32,
        ack=u32,
        flags=st.integers(0, 0x1FF).map(TcpFlags),
        window=u16,
        checksum=u16,
        urgent=u16,
        options=options,
        payload=st.binary(max_size=max_payload),
    )
    return result


registry.register(
    "tcp",
    parse_reference,
    describe,
    "TCP segment, RFC 9293 (docs/tcp-core.md)",
    build=build,
    strategy=segments,
    error=TcpFormatError,
)
