"""The UDP datagram (RFC 768) and its checksum policy::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          Source Port          |       Destination Port        |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |            Length             |           Checksum            |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                          data ...                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

The checksum covers a pseudo-header (source and destination address, zero, protocol 17, UDP
length), the header and the data.  A transmitted checksum of 0 means "none computed"; a
computed 0 is sent as 0xFFFF.  Paper 000 §7.6: the checksum "can also be switched off by
applications that use data protection at a higher level or are satisfied with the 32-bit CRC
at the U-Net AAL5 level", so it is a :class:`ChecksumPolicy`.

:func:`parse` checks: at least 8 bytes (``SHORT``), 8 <= Length <= the data (``LENGTH``; bytes
after Length are ignored, as Linux does), then the checksum if asked and present
(``CHECKSUM``).  Without addresses (``stacklib decode udp``) the checksum is not checked.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import attrs
import construct

from stacklib.errors import FormatError
from stacklib.layers.ip.wire import IpProtocol, ones_sum, pseudo_header_sum
from stacklib.wire import registry
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "HEADER_CODEC",
    "HEADER_FORMAT",
    "HEADER_SIZE",
    "ChecksumPolicy",
    "UdpDatagram",
    "UdpErrorKind",
    "UdpFormatError",
    "build",
    "datagrams",
    "parse",
    "parse_reference",
]

HEADER_SIZE = 8
_Buffer = bytes | bytearray | memoryview
_UDP = int(IpProtocol.UDP)


class ChecksumPolicy(enum.Enum):
    """Which way the checksum is handled (smoltcp's ``Checksum`` shape)."""

    BOTH = "both"  #: compute on send, verify on receive
    TX = "tx"  #: compute on send only
    RX = "rx"  #: verify on receive only (send 0: "none")
    NONE = "none"  #: neither (paper 000 §7.6: switched off by the application)

    @property
    def tx(self) -> bool:
        return self in (ChecksumPolicy.BOTH, ChecksumPolicy.TX)

    @property
    def rx(self) -> bool:
        return self in (ChecksumPolicy.BOTH, ChecksumPolicy.RX)


class UdpErrorKind(enum.Enum):
    """Why :func:`parse` rejected a datagram, in the order the checks run."""

    SHORT = "shorter than the 8-byte header"
    LENGTH = "length field below 8 or past the data"
    CHECKSUM = "bad checksum"


class UdpFormatError(FormatError):
    """Malformed UDP datagram; :attr:`kind` names the check (SHORT for the derived codec)."""

    def __init__(self, message: str, kind: UdpErrorKind = UdpErrorKind.SHORT) -> None:
        self.kind = kind
        super().__init__(message)


HEADER_FORMAT = construct.Struct(
    "src_port" / construct.Int16ub,
    "dst_port" / construct.Int16ub,
    "length" / construct.Int16ub,
    "checksum" / construct.Int16ub,
)
DATAGRAM_FORMAT = construct.Struct(
    "header" / HEADER_FORMAT,
    "data" / construct.Bytes(construct.this.header.length - HEADER_SIZE),
    "trailer" / construct.GreedyBytes,
)
HEADER_CODEC = derive_codec(HEADER_FORMAT, UdpFormatError)
"""Fields: src_port, dst_port, length, checksum."""

_unpack = HEADER_CODEC.unpack
_pack = HEADER_CODEC.pack


@attrs.frozen
class UdpDatagram:
    """One UDP datagram.  ``checksum`` is the field as sent (0: none) — set by :func:`parse`,
    ignored by :func:`build`, which computes it."""

    src_port: int
    dst_port: int
    data: bytes
    checksum: int = attrs.field(default=0, eq=False)


def _length_error(length: int, size: int) -> UdpFormatError:
    return UdpFormatError(
        f"UDP: {UdpErrorKind.LENGTH.value}: length {length}, {size} bytes", UdpErrorKind.LENGTH
    )


def _checksum_error(total: int) -> UdpFormatError:
    return UdpFormatError(
        f"UDP: {UdpErrorKind.CHECKSUM.value}: sum {total:#06x}", UdpErrorKind.CHECKSUM
    )


def parse(
    data: _Buffer, src: str | None = None, dst: str | None = None, *, verify: bool = True
) -> UdpDatagram:
    """The datagram in ``data`` (an IPv4 payload from ``src`` to ``dst``).

    The checksum is verified when ``verify`` and both addresses are given and the datagram
    carries one.  (The UDP layer itself verifies in the same pass as its copy, see
    :mod:`stacklib.layers.udp.driver`; this is the plain form.)
    """
    size = len(data)
    if size < HEADER_SIZE:
        raise UdpFormatError(f"UDP: {UdpErrorKind.SHORT.value}: {size} bytes")
    sport, dport, length, check = _unpack(data)
    if not HEADER_SIZE <= length <= size:
        raise _length_error(length, size)
    if verify and check and src is not None and dst is not None:
        total = ones_sum(data[:length], pseudo_header_sum(src, dst, _UDP, length))
        if total != 0xFFFF:
            raise _checksum_error(total)
    return UdpDatagram(sport, dport, bytes(data[HEADER_SIZE:length]), check)


def parse_reference(
    data: _Buffer, src: str | None = None, dst: str | None = None, *, verify: bool = True
) -> UdpDatagram:
    """Parse like :func:`parse` with :data:`DATAGRAM_FORMAT` (slow, the spec)."""
    data = bytes(data)
    size = len(data)
    if size < HEADER_SIZE:
        raise UdpFormatError(f"UDP: {UdpErrorKind.SHORT.value}: {size} bytes")
    h = HEADER_FORMAT.parse(data)
    if not HEADER_SIZE <= h.length <= size:
        raise _length_error(h.length, size)
    c = DATAGRAM_FORMAT.parse(data)
    if verify and h.checksum and src is not None and dst is not None:
        from stacklib.layers.ip.wire import checksum_reference, ip_bytes

        pseudo = ip_bytes(src) + ip_bytes(dst) + bytes([0, _UDP]) + h.length.to_bytes(2, "big")
        if checksum_reference(pseudo + data[: h.length]) != 0:
            raise _checksum_error(0)
    return UdpDatagram(h.src_port, h.dst_port, c.data, h.checksum)


def build(datagram: UdpDatagram, src: str, dst: str, *, compute: bool = True) -> bytes:
    """The bytes of ``datagram`` from ``src`` to ``dst``; checksum 0 unless ``compute``.

    Raises ValueError for ports out of range or data over 65527 bytes.
    """
    data = datagram.data
    length = HEADER_SIZE + len(data)
    if length > 0xFFFF:
        raise ValueError(f"UDP datagram of {length} bytes exceeds 65535")
    header = _pack(datagram.src_port, datagram.dst_port, length, 0)
    if not compute:
        return header + data
    start = pseudo_header_sum(src, dst, _UDP, length)
    check = ~ones_sum(data, ones_sum(header, start)) & 0xFFFF
    return _pack(datagram.src_port, datagram.dst_port, length, check or 0xFFFF) + data


def describe(datagram: UdpDatagram) -> list[registry.Field]:
    """``stacklib decode`` lines for a UDP datagram (checksum shown, not verified)."""
    return [
        ("src_port", datagram.src_port),
        ("dst_port", datagram.dst_port),
        ("length", HEADER_SIZE + len(datagram.data)),
        ("checksum", f"{datagram.checksum:#06x}" if datagram.checksum else "none"),
        ("data", datagram.data),
    ]


def _parse_for_decode(data: bytes) -> UdpDatagram:
    return parse_reference(data)


def datagrams(*, max_data: int = 512) -> SearchStrategy[UdpDatagram]:
    """Valid UDP datagrams."""
    from hypothesis import strategies as st

    ports = st.integers(0, 0xFFFF)
    result: SearchStrategy[UdpDatagram] = st.builds(
        UdpDatagram, src_port=ports, dst_port=ports, data=st.binary(max_size=max_data)
    )
    return result


registry.register(
    "udp",
    _parse_for_decode,
    describe,
    "UDP datagram (RFC 768), checksum unchecked",
    # Any pseudo-header will do: the registered parser does not check the checksum.
    build=lambda datagram: build(datagram, "192.0.2.1", "192.0.2.2"),
    strategy=datagrams,
    error=UdpFormatError,
)
