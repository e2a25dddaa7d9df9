"""IPv4, ICMP, ARP and Ethernet II: the formats of IP over U-Net and over Ethernet.

Four formats, each a construct definition (the specification), a codec derived from it for the
hot path (:func:`stacklib.wire.codec.derive_codec`), ``parse``/``build``, a ``parse_reference``
that parses with construct alone, one :class:`~stacklib.errors.FormatError` subclass whose
``kind`` names the failed check, and a lazily importing hypothesis strategy.

IPv4 (RFC 791 §3.1); options are kept as bytes and otherwise skipped::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |Version|  IHL  |Type of Service|          Total Length         |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |         Identification        |R|D|M|      Fragment Offset    |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  Time to Live |    Protocol   |         Header Checksum       |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                       Source Address                          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                    Destination Address                        |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                    Options (IHL > 5)  ...                     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

:func:`parse` checks, in order: at least 20 bytes (``SHORT``), version 4 (``VERSION``: the
layout depends on it, so it goes first), 5 <= IHL and the header within the data
(``HEADER_LENGTH``), header <= Total Length <= the data (``TOTAL_LENGTH``), the header checksum
(``CHECKSUM``).  Bytes after Total Length are link padding (Ethernet's 60-byte minimum) and are
ignored.  The reserved flag is carried, not rejected: paper 000 §7.5's receive side "is liberal
in the messages that it accepts".

ICMP (RFC 792): type, code, checksum over the whole message, four bytes whose meaning depends on
the type (identifier and sequence number for echo), then data.  ARP (RFC 826) for IPv4 over
Ethernet only: 28 bytes, hardware type 1, protocol type 0x0800, lengths 6 and 4.  Ethernet II:
destination, source, EtherType (>= 0x0600; smaller values are IEEE 802.3 lengths); no FCS.

The Internet checksum (RFC 1071) is :func:`checksum`; :func:`ones_sum` is its un-complemented
16-bit ones' complement sum, so a pseudo-header (:func:`pseudo_header_sum`) and a payload can be
summed separately and combined.  The fast path reads the
data as one big integer: since 2**16 = 1 (mod 0xFFFF), the ones' complement sum of the 16-bit
words is that integer modulo 0xFFFF, except that a non-zero sum is written 0xFFFF rather than 0.
Above 2 KiB, folding the integer in halves at multiples of 16 bits first is faster than one big
modulo.  :func:`checksum_reference` is the word-by-word loop of RFC 1071 §4.1 the tests hold it
against.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import socket
import struct
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs
import construct
from construct import this

from stacklib.errors import FormatError
from stacklib.wire import registry
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "ARP_FORMAT",
    "ARP_SIZE",
    "BROADCAST_MAC",
    "ETHERNET_HEADER_FORMAT",
    "ETHERNET_HEADER_SIZE",
    "ETHERTYPE_ARP",
    "ETHERTYPE_IPV4",
    "ICMP_HEADER_FORMAT",
    "ICMP_HEADER_SIZE",
    "IPV4_HEADER_FORMAT",
    "IPV4_HEADER_SIZE",
    "IPV4_PACKET_FORMAT",
    "MAX_PACKET",
    "ArpErrorKind",
    "ArpFormatError",
    "ArpOperation",
    "ArpPacket",
    "EthernetFormatError",
    "EthernetFrame",
    "IcmpErrorKind",
    "IcmpFormatError",
    "IcmpMessage",
    "IcmpType",
    "IpProtocol",
    "Ipv4ErrorKind",
    "Ipv4FormatError",
    "Ipv4Packet",
    "address_sum",
    "addresses",
    "arp_packets",
    "build_arp",
    "build_ethernet",
    "build_icmp",
    "build_ipv4",
    "build_ipv4_simple",
    "build_ipv4_summed",
    "checksum",
    "checksum_reference",
    "copy_with_sum",
    "ethernet_frames",
    "icmp_messages",
    "ip_bytes",
    "ip_str",
    "ipv4_packets",
    "ones_sum",
    "parse_arp",
    "parse_arp_reference",
    "parse_ethernet",
    "parse_ethernet_reference",
    "parse_icmp",
    "parse_icmp_reference",
    "parse_ipv4",
    "parse_ipv4_reference",
    "parse_ipv4_simple",
    "pseudo_header_sum",
]

_Buffer = bytes | bytearray | memoryview

IPV4_HEADER_SIZE = 20  #: without options
MAX_HEADER = 60  #: IHL is 4 bits of 32-bit words
MAX_PACKET = 0xFFFF  #: Total Length is 16 bits
ICMP_HEADER_SIZE = 8
ARP_SIZE = 28
ETHERNET_HEADER_SIZE = 14
ETHERNET_MIN_FRAME = 60  #: without FCS
ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_ARP = 0x0806
BROADCAST_MAC = b"\xff" * 6


class IpProtocol(enum.IntEnum):
    """IPv4 Protocol numbers (IANA) that stacklib knows by name."""

    ICMP = 1
    TCP = 6
    UDP = 17


# --- addresses ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def ip_bytes(address: str) -> bytes:
    """``"10.0.0.1"`` -> 4 bytes; ValueError unless a dotted quad (cached: the send path)."""
    try:
        return ipaddress.IPv4Address(address).packed
    except (ipaddress.AddressValueError, TypeError):
        raise ValueError(f"not an IPv4 address: {address!r} (expected a dotted quad)") from None


def ip_str(data: _Buffer) -> str:
    """4 bytes -> ``"10.0.0.1"``."""
    return socket.inet_ntoa(bytes(data))


# --- the Internet checksum (RFC 1071) ----------------------------------------------------------

_FOLD_ABOVE = 2048  # bytes: above this, halving folds beat one big modulo (measured)
_LITTLE = sys.byteorder == "little"
_MASKS: dict[int, int] = {}


_NUMPY_ABOVE = 1024  # bytes: above this, numpy's word sum beats the big integer on real data


@functools.cache
def _numpy() -> ModuleType:
    import numpy  # imported on first use: most programs never checksum a large packet

    return numpy


# numpy's word sum, bound on first use (module globals: no attribute lookups per packet).
_word_sum: Any = None
_frombuffer: Any = None
_U16: Any = None
_U64: Any = None


def _bind_numpy() -> None:
    global _word_sum, _frombuffer, _U16, _U64
    np = _numpy()
    _frombuffer, _U16, _U64 = np.frombuffer, np.uint16, np.uint64
    _word_sum = np.add.reduce


def _wide_sum(data: _Buffer) -> int:
    """:func:`ones_sum` of a large buffer without ``start``: the 16-bit words in the machine's
    order summed in 64 bits by numpy, folded, and swapped back once (RFC 1071 §2(B): the sum
    is byte-order independent).  About 2-3x faster than the big integer on random data."""
    if _word_sum is None:
        _bind_numpy()
    size = len(data)
    total = int(_word_sum(_frombuffer(data, _U16, size >> 1), dtype=_U64))
    if size & 1:
        total += data[-1] if _LITTLE else data[-1] << 8  # the zero-padded last word
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    if _LITTLE:
        total = ((total & 0xFF) << 8) | (total >> 8)
    return total


def ones_sum(data: _Buffer, start: int = 0) -> int:
    """The 16-bit ones' complement sum of ``data`` (odd length: a zero byte appended) plus
    ``start`` (a previous result), in 0..0xFFFF; 0 only if everything summed was zero."""
    size = len(data)
    if size > _NUMPY_ABOVE:
        total = _wide_sum(data)
        if start:
            total += start
            total = (total & 0xFFFF) + (total >> 16)
        return total
    value = int.from_bytes(data, "big")
    if size & 1:
        value <<= 8
    if size > _FOLD_ABOVE:
        bits = value.bit_length()
        while bits > 64:
            # Split at a multiple of 16 bits: 2**(16k) = 1 (mod 0xFFFF), so the sum is kept.
            half = ((bits + 1) // 2 + 15) & ~15
            mask = _MASKS.get(half)
            if mask is None:
                mask = _MASKS[half] = (1 << half) - 1
            value = (value >> half) + (value & mask)
            bits = value.bit_length()
    total = value % 0xFFFF
    if total == 0 and value:
        total = 0xFFFF  # ones' complement: a non-zero sum is "negative zero", never 0
    if start:
        total += start
        total = (total & 0xFFFF) + (total >> 16)
    return total


def checksum(data: _Buffer, start: int = 0) -> int:
    """The Internet checksum of ``data`` (RFC 1071): the complement of :func:`ones_sum`."""
    return ~ones_sum(data, start) & 0xFFFF


def checksum_reference(data: _Buffer) -> int:
    """RFC 1071 §4.1's loop, a word at a time (slow: the tests' reference)."""
    data = bytes(data)
    if len(data) & 1:
        data += b"\x00"
    total = 0
    for i in range(0, len(data), 2):
        total += (data[i] << 8) | data[i + 1]
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def copy_with_sum(data: _Buffer) -> tuple[bytes, int]:
    """A copy of ``data`` and its :func:`ones_sum`, in one call.

    Integrated layer processing (paper 000 §7.6: the checksum "can be combined with the copy
    operation that retrieves the data from the communication segment").  In C that is one loop;
    here it is one C-level copy followed by a C-level sum over the copy while it is in cache,
    the closest Python gets to one pass.
    """
    copy = bytes(data)
    return copy, ones_sum(copy)


_PSEUDO = struct.Struct(">4s4sxBH")


def pseudo_header_sum(src: str, dst: str, protocol: int, length: int) -> int:
    """:func:`ones_sum` of the TCP/UDP pseudo-header (RFC 768, RFC 793 §3.1)."""
    return ones_sum(_PSEUDO.pack(ip_bytes(src), ip_bytes(dst), protocol, length))


# --- IPv4 --------------------------------------------------------------------------------------


class Ipv4ErrorKind(enum.Enum):
    """Why :func:`parse_ipv4` rejected a packet, in the order the checks run."""

    SHORT = "shorter than the 20-byte header"
    VERSION = "version is not 4"
    HEADER_LENGTH = "IHL below 5 or past the data"
    TOTAL_LENGTH = "total length below the header or past the data"
    CHECKSUM = "bad header checksum"


class Ipv4FormatError(FormatError):
    """Malformed IPv4 packet; :attr:`kind` names the check (SHORT also for the derived codec)."""

    def __init__(self, message: str, kind: Ipv4ErrorKind = Ipv4ErrorKind.SHORT) -> None:
        self.kind = kind
        super().__init__(message)


def _ipv4_error(kind: Ipv4ErrorKind, detail: str) -> Ipv4FormatError:
    return Ipv4FormatError(f"IPv4: {kind.value}: {detail}", kind)


IPV4_HEADER_FORMAT = construct.Struct(
    "vihl"
    / construct.BitStruct(
        "version" / construct.BitsInteger(4),
        "ihl" / construct.BitsInteger(4),
    ),
    "tos" / construct.Int8ub,
    "total_length" / construct.Int16ub,
    "identification" / construct.Int16ub,
    "frag"
    / construct.BitStruct(
        "reserved" / construct.Flag,
        "df" / construct.Flag,
        "mf" / construct.Flag,
        "fragment_offset" / construct.BitsInteger(13),
    ),
    "ttl" / construct.Int8ub,
    "protocol" / construct.Int8ub,
    "checksum" / construct.Int16ub,
    "src" / construct.Bytes(4),
    "dst" / construct.Bytes(4),
)
"""The fixed 20-byte header (fragment_offset in 8-byte units, as on the wire)."""

IPV4_PACKET_FORMAT = construct.Struct(
    "header" / IPV4_HEADER_FORMAT,
    "options" / construct.Bytes(this.header.vihl.ihl * 4 - IPV4_HEADER_SIZE),
    "payload" / construct.Bytes(this.header.total_length - this.header.vihl.ihl * 4),
    "padding" / construct.GreedyBytes,
)
"""A whole packet; the length and checksum rules are applied on top of it."""

IPV4_CODEC = derive_codec(IPV4_HEADER_FORMAT, Ipv4FormatError)
"""Fields: version, ihl, tos, total_length, identification, reserved, df, mf, fragment_offset,
ttl, protocol, checksum, src, dst."""

_unpack_ipv4 = IPV4_CODEC.unpack
_pack_ipv4 = IPV4_CODEC.pack


@attrs.frozen
class Ipv4Packet:
    """One IPv4 packet (or fragment).  ``fragment_offset`` is in bytes (a multiple of 8)."""

    src: str
    dst: str
    protocol: int
    payload: bytes
    ttl: int = 64
    tos: int = 0
    identification: int = 0
    dont_fragment: bool = False
    more_fragments: bool = False
    fragment_offset: int = 0
    reserved_flag: bool = False
    options: bytes = b""

    @property
    def is_fragment(self) -> bool:
        """True for any piece of a fragmented datagram (RFC 791: MF set or an offset)."""
        return self.more_fragments or self.fragment_offset != 0

    @property
    def header_length(self) -> int:
        return IPV4_HEADER_SIZE + len(self.options)

    @property
    def total_length(self) -> int:
        return self.header_length + len(self.payload)


def _check_ipv4(version: int, ihl: int, total: int, size: int) -> None:
    if version != 4:
        raise _ipv4_error(Ipv4ErrorKind.VERSION, f"version {version}")
    header = ihl * 4
    if ihl < 5 or header > size:
        raise _ipv4_error(Ipv4ErrorKind.HEADER_LENGTH, f"IHL {ihl} with {size} bytes")
    if not header <= total <= size:
        raise _ipv4_error(
            Ipv4ErrorKind.TOTAL_LENGTH, f"total length {total}, header {header}, {size} bytes"
        )


def parse_ipv4(data: _Buffer, *, verify_checksum: bool = True) -> Ipv4Packet:
    """The packet in ``data``; :class:`Ipv4FormatError` if malformed.

    ``verify_checksum=False`` skips the header checksum (for an NI that verified it).
    """
    size = len(data)
    if size < IPV4_HEADER_SIZE:
        raise _ipv4_error(Ipv4ErrorKind.SHORT, f"{size} bytes")
    (version, ihl, tos, total, ident, reserved, df, mf, offset, ttl, proto, _, src, dst) = (
        _unpack_ipv4(data)
    )
    if version != 4 or ihl != 5 or total > size or total < IPV4_HEADER_SIZE:
        _check_ipv4(version, ihl, total, size)
    header = ihl * 4
    if verify_checksum and ones_sum(data[:header]) != 0xFFFF:
        raise _ipv4_error(Ipv4ErrorKind.CHECKSUM, f"sum {ones_sum(data[:header]):#06x}")
    return Ipv4Packet(
        socket.inet_ntoa(src),
        socket.inet_ntoa(dst),
        proto,
        bytes(data[header:total]),
        ttl,
        tos,
        ident,
        df,
        mf,
        offset << 3,
        reserved,
        bytes(data[IPV4_HEADER_SIZE:header]),
    )


def parse_ipv4_reference(data: _Buffer, *, verify_checksum: bool = True) -> Ipv4Packet:
    """Parse like :func:`parse_ipv4`, with :data:`IPV4_PACKET_FORMAT` (slow, the spec)."""
    data = bytes(data)
    size = len(data)
    if size < IPV4_HEADER_SIZE:
        raise _ipv4_error(Ipv4ErrorKind.SHORT, f"{size} bytes")
    h = IPV4_HEADER_FORMAT.parse(data)
    _check_ipv4(h.vihl.version, h.vihl.ihl, h.total_length, size)
    c = IPV4_PACKET_FORMAT.parse(data)
    header = h.vihl.ihl * 4
    if verify_checksum and checksum_reference(data[:header]) != 0:
        raise _ipv4_error(Ipv4ErrorKind.CHECKSUM, "reference check")
    return Ipv4Packet(
        ip_str(h.src),
        ip_str(h.dst),
        h.protocol,
        c.payload,
        h.ttl,
        h.tos,
        h.identification,
        h.frag.df,
        h.frag.mf,
        h.frag.fragment_offset << 3,
        h.frag.reserved,
        c.options,
    )


def build_ipv4(packet: Ipv4Packet) -> bytes:
    """The bytes of ``packet``, with Total Length and header checksum computed.

    Raises ValueError for what the caller got wrong: options not a multiple of 4 bytes or over
    40, a packet over 65535 bytes, an offset not a multiple of 8, a field out of range.
    """
    options = packet.options
    if len(options) & 3 or len(options) > MAX_HEADER - IPV4_HEADER_SIZE:
        raise ValueError(f"IPv4 options must be a multiple of 4 bytes, at most 40: {len(options)}")
    offset = packet.fragment_offset
    if offset & 7:
        raise ValueError(f"IPv4 fragment offset {offset} is not a multiple of 8")
    total = packet.total_length
    if total > MAX_PACKET:
        raise ValueError(f"IPv4 packet of {total} bytes exceeds {MAX_PACKET}")
    ihl = packet.header_length >> 2
    fields = (
        4,
        ihl,
        packet.tos,
        total,
        packet.identification,
        packet.reserved_flag,
        packet.dont_fragment,
        packet.more_fragments,
        offset >> 3,
        packet.ttl,
        packet.protocol,
    )
    src, dst = ip_bytes(packet.src), ip_bytes(packet.dst)
    header = _pack_ipv4(*fields, 0, src, dst) + options
    return _pack_ipv4(*fields, checksum(header), src, dst) + options + packet.payload


# The fixed header as whole bytes (version/IHL and flags/offset as 8 and 16-bit words): the
# per-packet fast path of IP over U-Net, checked against IPV4_HEADER_FORMAT by the tests.
_SIMPLE = struct.Struct("!BBHHHBBH4s4s")
_VIHL = 0x45  # version 4, no options
_DF = 0x4000


def address_sum(src: bytes, dst: bytes) -> int:
    """The 16-bit word sum of two 4-byte addresses: the per-route constant of
    :func:`build_ipv4_summed`."""
    s, d = int.from_bytes(src, "big"), int.from_bytes(dst, "big")
    return (s >> 16) + (s & 0xFFFF) + (d >> 16) + (d & 0xFFFF)


_SIMPLE_WORD_VALUES = struct.Struct("!10H")
# The header words that never change on the simple path: version/IHL/TOS and flags (DF).
_SIMPLE_WORDS = (_VIHL << 8) + _DF


def build_ipv4_summed(
    src: bytes,
    dst: bytes,
    addresses: int,
    protocol: int,
    payload: _Buffer,
    ttl: int,
    identification: int,
) -> bytes:
    """:func:`build_ipv4_simple` with the addresses' word sum given (:func:`address_sum`): the
    header checksum is integer arithmetic over the words that vary, one ``struct`` pack makes
    the header with it, and one concatenation adds the payload."""
    total = IPV4_HEADER_SIZE + len(payload)
    if total > MAX_PACKET:
        raise ValueError(f"IPv4 packet of {total} bytes exceeds {MAX_PACKET}")
    words = _SIMPLE_WORDS + total + identification + (ttl << 8) + protocol + addresses
    if words < 0:
        raise ValueError("IPv4 header field out of range: negative")
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    try:
        header = _SIMPLE.pack(
            _VIHL, 0, total, identification, _DF, ttl, protocol, ~words & 0xFFFF, src, dst
        )
    except struct.error as exc:
        raise ValueError(f"IPv4 header field out of range: {exc}") from None
    return header + payload


def build_ipv4_simple(
    src: bytes, dst: bytes, protocol: int, payload: _Buffer, ttl: int, identification: int
) -> bytes:
    """What :func:`build_ipv4` makes of an :class:`Ipv4Packet` with Don't Fragment set and no
    options, TOS or fragmentation, from its fields (``src`` and ``dst`` as 4 bytes), without
    the packet object: the send path of a packet that fits the MTU (paper 000 §7.5)."""
    if len(src) != 4 or len(dst) != 4:
        raise ValueError("IPv4 header field out of range: addresses are 4 bytes")
    return build_ipv4_summed(
        src, dst, address_sum(src, dst), protocol, payload, ttl, identification
    )


def parse_ipv4_simple(data: bytes) -> tuple[bytes, bytes, int, bytes] | None:
    """(source, destination as 4 bytes, protocol, payload) of a well-formed packet without
    options that is not a fragment and whose header checksum is right, as :func:`parse_ipv4`
    would read it; None for anything else, which :func:`parse_ipv4` then judges (the receive
    path's fast case)."""
    size = len(data)
    if size < IPV4_HEADER_SIZE:
        return None
    vihl, _, total, _, frag, _, protocol, _, src, dst = _SIMPLE.unpack_from(data)
    if vihl != _VIHL or frag & 0xBFFF or not IPV4_HEADER_SIZE <= total <= size:
        return None  # options, a fragment (or the reserved bit), a bad length: the slow path
    # The header's ten words summed from one unpack, no slice: a correct header sums to
    # 0xFFFF (a header is never all zero: it has version 4).
    words = sum(_SIMPLE_WORD_VALUES.unpack_from(data))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    if words != 0xFFFF:
        return None
    return src, dst, protocol, data[IPV4_HEADER_SIZE:total]


def describe_ipv4(packet: Ipv4Packet) -> list[registry.Field]:
    """``stacklib decode`` lines for an IPv4 packet."""
    try:
        proto: object = IpProtocol(packet.protocol)
    except ValueError:
        proto = packet.protocol
    return [
        ("src", packet.src),
        ("dst", packet.dst),
        ("protocol", proto),
        ("ttl", packet.ttl),
        ("tos", packet.tos),
        ("total_length", packet.total_length),
        ("identification", packet.identification),
        (
            "flags",
            f"{'R' if packet.reserved_flag else '-'}"
            f"{'DF' if packet.dont_fragment else '--'}{'MF' if packet.more_fragments else '--'}",
        ),
        ("fragment_offset", packet.fragment_offset),
        ("options", packet.options),
        ("payload", packet.payload),
    ]


# --- ICMP --------------------------------------------------------------------------------------


class IcmpType(enum.IntEnum):
    """ICMP message types stacklib knows by name (RFC 792)."""

    ECHO_REPLY = 0
    DESTINATION_UNREACHABLE = 3
    ECHO_REQUEST = 8
    TIME_EXCEEDED = 11


class IcmpErrorKind(enum.Enum):
    """Why :func:`parse_icmp` rejected a message."""

    SHORT = "shorter than the 8-byte header"
    CHECKSUM = "bad checksum"


class IcmpFormatError(FormatError):
    """Malformed ICMP message; :attr:`kind` names the check."""

    def __init__(self, message: str, kind: IcmpErrorKind = IcmpErrorKind.SHORT) -> None:
        self.kind = kind
        super().__init__(message)


ICMP_HEADER_FORMAT = construct.Struct(
    "type" / construct.Int8ub,
    "code" / construct.Int8ub,
    "checksum" / construct.Int16ub,
    "rest" / construct.Bytes(4),
)
"""The 8-byte header; ``rest`` is identifier and sequence number for echo messages."""

ICMP_FORMAT = construct.Struct("header" / ICMP_HEADER_FORMAT, "data" / construct.GreedyBytes)
ICMP_CODEC = derive_codec(ICMP_HEADER_FORMAT, IcmpFormatError)
"""Fields: type, code, checksum, rest."""

_ECHO = struct.Struct(">HH")


@attrs.frozen
class IcmpMessage:
    """An ICMP message: ``rest`` is the header's last four bytes, ``data`` what follows."""

    type: int
    code: int
    rest: bytes = bytes(4)
    data: bytes = b""

    @classmethod
    def echo_request(cls, identifier: int, sequence: int, data: bytes = b"") -> IcmpMessage:
        return cls(IcmpType.ECHO_REQUEST, 0, _ECHO.pack(identifier, sequence), data)

    @classmethod
    def echo_reply(cls, identifier: int, sequence: int, data: bytes = b"") -> IcmpMessage:
        return cls(IcmpType.ECHO_REPLY, 0, _ECHO.pack(identifier, sequence), data)

    @property
    def identifier(self) -> int:
        """Echo identifier (the first two bytes of ``rest``)."""
        return int(_ECHO.unpack(self.rest)[0])

    @property
    def sequence(self) -> int:
        """Echo sequence number (the last two bytes of ``rest``)."""
        return int(_ECHO.unpack(self.rest)[1])


def parse_icmp(data: _Buffer, *, verify_checksum: bool = True) -> IcmpMessage:
    """The ICMP message in ``data`` (an IPv4 payload); :class:`IcmpFormatError` if malformed."""
    size = len(data)
    if size < ICMP_HEADER_SIZE:
        raise IcmpFormatError(f"ICMP: {IcmpErrorKind.SHORT.value}: {size} bytes")
    kind, code, _, rest = ICMP_CODEC.unpack(data)
    if verify_checksum and ones_sum(data) != 0xFFFF:
        raise IcmpFormatError(f"ICMP: {IcmpErrorKind.CHECKSUM.value}", IcmpErrorKind.CHECKSUM)
    return IcmpMessage(kind, code, rest, bytes(data[ICMP_HEADER_SIZE:]))


def parse_icmp_reference(data: _Buffer, *, verify_checksum: bool = True) -> IcmpMessage:
    """Parse like :func:`parse_icmp`, with :data:`ICMP_FORMAT` (slow, the spec)."""
    data = bytes(data)
    try:
        c = ICMP_FORMAT.parse(data)
    except construct.StreamError:
        raise IcmpFormatError(f"ICMP: {IcmpErrorKind.SHORT.value}: {len(data)} bytes") from None
    if verify_checksum and checksum_reference(data) != 0:
        raise IcmpFormatError(f"ICMP: {IcmpErrorKind.CHECKSUM.value}", IcmpErrorKind.CHECKSUM)
    return IcmpMessage(c.header.type, c.header.code, c.header.rest, c.data)


def build_icmp(message: IcmpMessage) -> bytes:
    """The bytes of ``message`` with its checksum; ValueError for fields out of range."""
    if len(message.rest) != 4:
        raise ValueError(f"ICMP rest-of-header is 4 bytes, got {len(message.rest)}")
    body = ICMP_CODEC.pack(message.type, message.code, 0, message.rest) + message.data
    total = checksum(body)
    return body[:2] + total.to_bytes(2, "big") + body[4:]


def describe_icmp(message: IcmpMessage) -> list[registry.Field]:
    """``stacklib decode`` lines for an ICMP message."""
    try:
        kind: object = IcmpType(message.type)
    except ValueError:
        kind = message.type
    fields: list[registry.Field] = [("type", kind), ("code", message.code)]
    if message.type in (IcmpType.ECHO_REQUEST, IcmpType.ECHO_REPLY):
        fields += [("identifier", message.identifier), ("sequence", message.sequence)]
    else:
        fields.append(("rest", message.rest.hex()))
    return [*fields, ("data", message.data)]


# --- ARP ---------------------------------------------------------------------------------------


class ArpOperation(enum.IntEnum):
    REQUEST = 1
    REPLY = 2


class ArpErrorKind(enum.Enum):
    """Why :func:`parse_arp` rejected a packet, in the order the checks run."""

    SHORT = "shorter than 28 bytes"
    UNSUPPORTED = "not IPv4 over Ethernet"
    OPERATION = "unknown operation"


class ArpFormatError(FormatError):
    """Malformed (or not IPv4-over-Ethernet) ARP packet; :attr:`kind` names the check."""

    def __init__(self, message: str, kind: ArpErrorKind = ArpErrorKind.SHORT) -> None:
        self.kind = kind
        super().__init__(message)


ARP_FORMAT = construct.Struct(
    "htype" / construct.Int16ub,
    "ptype" / construct.Int16ub,
    "hlen" / construct.Int8ub,
    "plen" / construct.Int8ub,
    "operation" / construct.Int16ub,
    "sender_mac" / construct.Bytes(6),
    "sender_ip" / construct.Bytes(4),
    "target_mac" / construct.Bytes(6),
    "target_ip" / construct.Bytes(4),
)
"""RFC 826's packet, for Ethernet (6-byte) and IPv4 (4-byte) addresses."""

ARP_CODEC = derive_codec(ARP_FORMAT, ArpFormatError)


@attrs.frozen
class ArpPacket:
    """An ARP request or reply; addresses as 6-byte MACs and dotted-quad IPs."""

    operation: int
    sender_mac: bytes
    sender_ip: str
    target_mac: bytes
    target_ip: str


def _check_arp(htype: int, ptype: int, hlen: int, plen: int, operation: int) -> None:
    if (htype, ptype, hlen, plen) != (1, ETHERTYPE_IPV4, 6, 4):
        raise ArpFormatError(
            f"ARP: {ArpErrorKind.UNSUPPORTED.value}: htype {htype} ptype {ptype:#06x} "
            f"hlen {hlen} plen {plen}",
            ArpErrorKind.UNSUPPORTED,
        )
    if operation not in (1, 2):
        raise ArpFormatError(
            f"ARP: {ArpErrorKind.OPERATION.value}: {operation}", ArpErrorKind.OPERATION
        )


def parse_arp(data: _Buffer) -> ArpPacket:
    """The ARP packet in ``data`` (trailing Ethernet padding ignored)."""
    if len(data) < ARP_SIZE:
        raise ArpFormatError(f"ARP: {ArpErrorKind.SHORT.value}: {len(data)} bytes")
    htype, ptype, hlen, plen, op, sha, spa, tha, tpa = ARP_CODEC.unpack(data)
    _check_arp(htype, ptype, hlen, plen, op)
    return ArpPacket(op, sha, socket.inet_ntoa(spa), tha, socket.inet_ntoa(tpa))


def parse_arp_reference(data: _Buffer) -> ArpPacket:
    """Parse like :func:`parse_arp`, with :data:`ARP_FORMAT` (slow, the spec)."""
    data = bytes(data)
    try:
        c = ARP_FORMAT.parse(data)
    except construct.StreamError:
        raise ArpFormatError(f"ARP: {ArpErrorKind.SHORT.value}: {len(data)} bytes") from None
    _check_arp(c.htype, c.ptype, c.hlen, c.plen, c.operation)
    return ArpPacket(
        c.operation, c.sender_mac, ip_str(c.sender_ip), c.target_mac, ip_str(c.target_ip)
    )


def build_arp(packet: ArpPacket) -> bytes:
    """The 28 bytes of ``packet``; ValueError for malformed addresses or operation."""
    if packet.operation not in (1, 2):
        raise ValueError(f"ARP operation must be 1 or 2, got {packet.operation!r}")
    return ARP_CODEC.pack(
        1,
        ETHERTYPE_IPV4,
        6,
        4,
        packet.operation,
        packet.sender_mac,
        ip_bytes(packet.sender_ip),
        packet.target_mac,
        ip_bytes(packet.target_ip),
    )


def describe_arp(packet: ArpPacket) -> list[registry.Field]:
    """``stacklib decode`` lines for an ARP packet."""
    try:
        op: object = ArpOperation(packet.operation)
    except ValueError:
        op = packet.operation
    return [
        ("operation", op),
        ("sender_mac", packet.sender_mac.hex(":")),
        ("sender_ip", packet.sender_ip),
        ("target_mac", packet.target_mac.hex(":")),
        ("target_ip", packet.target_ip),
    ]


# --- Ethernet II -------------------------------------------------------------------------------


class EthernetFormatError(FormatError):
    """Malformed Ethernet II frame: shorter than 14 bytes, or an IEEE 802.3 length field
    (below 0x0600) where the EtherType should be."""


ETHERNET_HEADER_FORMAT = construct.Struct(
    "dst" / construct.Bytes(6),
    "src" / construct.Bytes(6),
    "ethertype" / construct.Int16ub,
)
ETHERNET_FORMAT = construct.Struct(
    "header" / ETHERNET_HEADER_FORMAT, "payload" / construct.GreedyBytes
)
ETHERNET_CODEC = derive_codec(ETHERNET_HEADER_FORMAT, EthernetFormatError)


@attrs.frozen
class EthernetFrame:
    """An Ethernet II frame without FCS; ``payload`` includes any padding."""

    dst: bytes
    src: bytes
    ethertype: int
    payload: bytes


def _check_ethertype(ethertype: int) -> None:
    if ethertype < 0x0600:
        raise EthernetFormatError(f"Ethernet: {ethertype:#06x} is an 802.3 length, not a type")


def parse_ethernet(data: _Buffer) -> EthernetFrame:
    """The frame in ``data`` (no FCS)."""
    if len(data) < ETHERNET_HEADER_SIZE:
        raise EthernetFormatError(f"Ethernet: {len(data)} bytes, shorter than the header")
    dst, src, ethertype = ETHERNET_CODEC.unpack(data)
    _check_ethertype(ethertype)
    return EthernetFrame(dst, src, ethertype, bytes(data[ETHERNET_HEADER_SIZE:]))


def parse_ethernet_reference(data: _Buffer) -> EthernetFrame:
    """Parse like :func:`parse_ethernet`, with construct (slow, the spec)."""
    data = bytes(data)
    try:
        c = ETHERNET_FORMAT.parse(data)
    except construct.StreamError:
        raise EthernetFormatError(f"Ethernet: {len(data)} bytes, shorter than the header") from None
    _check_ethertype(c.header.ethertype)
    return EthernetFrame(c.header.dst, c.header.src, c.header.ethertype, c.payload)


def build_ethernet(frame: EthernetFrame, *, pad: bool = True) -> bytes:
    """The frame's bytes, zero-padded to the 60-byte minimum unless ``pad=False``."""
    if frame.ethertype < 0x0600:
        raise ValueError(f"EtherType {frame.ethertype:#06x} is below 0x0600")
    out = ETHERNET_CODEC.pack(frame.dst, frame.src, frame.ethertype) + frame.payload
    if pad and len(out) < ETHERNET_MIN_FRAME:
        out += bytes(ETHERNET_MIN_FRAME - len(out))
    return out


def describe_ethernet(frame: EthernetFrame) -> list[registry.Field]:
    """``stacklib decode`` lines for an Ethernet II frame."""
    return [
        ("dst", frame.dst.hex(":")),
        ("src", frame.src.hex(":")),
        ("ethertype", f"{frame.ethertype:#06x}"),
        ("payload", frame.payload),
    ]


# --- hypothesis strategies (hypothesis is a test-only dependency: imported lazily) -------------


def addresses() -> SearchStrategy[str]:
    """Dotted-quad IPv4 addresses."""
    from hypothesis import strategies as st

    result: SearchStrategy[str] = st.binary(min_size=4, max_size=4).map(ip_str)
    return result


def ipv4_packets(*, max_payload: int = 512) -> SearchStrategy[Ipv4Packet]:
    """Valid IPv4 packets (fragments included, options of whole 32-bit words)."""
    from hypothesis import strategies as st

    result: SearchStrategy[Ipv4Packet] = st.builds(
        Ipv4Packet,
        src=addresses(),
        dst=addresses(),
        protocol=st.integers(0, 255),
        payload=st.binary(max_size=max_payload),
        ttl=st.integers(0, 255),
        tos=st.integers(0, 255),
        identification=st.integers(0, 0xFFFF),
        dont_fragment=st.booleans(),
        more_fragments=st.booleans(),
        fragment_offset=st.integers(0, 0x1FFF).map(lambda units: units * 8),
        reserved_flag=st.booleans(),
        options=st.integers(0, 10).flatmap(
            lambda words: st.binary(min_size=4 * words, max_size=4 * words)
        ),
    )
    return result


def icmp_messages(*, max_data: int = 256) -> SearchStrategy[IcmpMessage]:
    """Valid ICMP messages of any type."""
    from hypothesis import strategies as st

    result: SearchStrategy[IcmpMessage] = st.builds(
        IcmpMessage,
        type=st.integers(0, 255),
        code=st.integers(0, 255),
        rest=st.binary(min_size=4, max_size=4),
        data=st.binary(max_size=max_data),
    )
    return result


def arp_packets() -> SearchStrategy[ArpPacket]:
    """Valid ARP requests and replies."""
    from hypothesis import strategies as st

    macs = st.binary(min_size=6, max_size=6)
    result: SearchStrategy[ArpPacket] = st.builds(
        ArpPacket,
        operation=st.sampled_from([1, 2]),
        sender_mac=macs,
        sender_ip=addresses(),
        target_mac=macs,
        target_ip=addresses(),
    )
    return result


def ethernet_frames(*, max_payload: int = 1500) -> SearchStrategy[EthernetFrame]:
    """Valid Ethernet II frames (payloads of at least 46 bytes, so no padding is added)."""
    from hypothesis import strategies as st

    macs = st.binary(min_size=6, max_size=6)
    result: SearchStrategy[EthernetFrame] = st.builds(
        EthernetFrame,
        dst=macs,
        src=macs,
        ethertype=st.integers(0x0600, 0xFFFF),
        payload=st.binary(min_size=46, max_size=max(46, max_payload)),
    )
    return result


registry.register(
    "ipv4",
    parse_ipv4_reference,
    describe_ipv4,
    "IPv4 packet, options skipped (RFC 791)",
    build=build_ipv4,
    strategy=ipv4_packets,
    error=Ipv4FormatError,
)
registry.register(
    "icmp",
    parse_icmp_reference,
    describe_icmp,
    "ICMP message (RFC 792)",
    build=build_icmp,
    strategy=icmp_messages,
    error=IcmpFormatError,
)
registry.register(
    "arp",
    parse_arp_reference,
    describe_arp,
    "ARP, IPv4 over Ethernet (RFC 826)",
    build=build_arp,
    strategy=arp_packets,
    error=ArpFormatError,
)
registry.register(
    "ethernet",
    parse_ethernet_reference,
    describe_ethernet,
    "Ethernet II frame, no FCS",
    build=build_ethernet,
    strategy=ethernet_frames,
    error=EthernetFormatError,
)
