"""Packet captures in the classic libpcap format, which Wireshark and tshark open and dissect.

A capture is a 24-byte global header, then one 16-byte record header and the captured bytes
per packet (not pcapng).  Every field is in the byte order of the writer's machine, which the
reader learns from the magic number; stacklib writes little-endian unless asked otherwise::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |   magic: 0xA1B23C4D (nanosecond) or 0xA1B2C3D4 (microsecond)  |  global
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  header
    |      version major (2)        |      version minor (4)        |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                 thiszone (0; signed, unused)                  |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                     sigfigs (0, unused)                       |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |              snaplen: most bytes kept per packet              |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          link type (LinkType: 1 Ethernet, 123 SunATM)         |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                     timestamp, seconds                        |  record
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  header
    |   timestamp, nanoseconds (or microseconds, by the magic)      |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          caplen: bytes of the packet in this file             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          orig_len: bytes of the packet on the link            |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          packet data (caplen bytes) ...                       |

Resolution: :class:`PcapWriter` writes nanosecond timestamps by default (magic 0xA1B23C4D, which
libpcap >= 1.5 and Wireshark read), because virtual time separates events by less than a
microsecond: one 53-byte cell takes 2.7 us at 155 Mbit/s, one byte of a Fast Ethernet frame
80 ns.  ``nanosecond=False`` writes the original microsecond format for older tools.  The
timestamp is the simulation's clock in seconds as is; a virtual-time capture therefore starts
near 1970-01-01 00:00:00 in Wireshark, and the times are offsets from the start of the run.

Link types (:class:`LinkType`):

* :attr:`LinkType.ETHERNET` (1): the Ethernet frame from the destination MAC to the end of the
  payload and padding, without the FCS (the usual convention; Wireshark then does not look for
  one).  U-Net/FE frames (:mod:`stacklib.wire.unet_eth`) carry EtherType 0x88B5, which
  Wireshark names "Local Experimental Ethertype 1" and shows as ``eth:ethertype:data``; the
  capture or display filter ``ether proto 0x88b5`` / ``eth.type == 0x88b5`` selects them.
* :attr:`LinkType.SUNATM` (123): one reassembled AAL5 message per record behind a 4-byte
  pseudo-header (:data:`SUNATM_HEADER`)::

       0                   1                   2                   3
       0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
      +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
      |D| res | traffic |      VPI      |              VCI              |
      +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
      |         AAL5 CPCS-SDU: the message, no padding, no trailer ... |

  D (0x80) set: the capturing host sent it (tcpdump prints "Tx:", Wireshark "Channel:
  DTE->DCE (0)"); clear: it received it ("Rx:", "DCE->DTE (1)").  The low four bits give the
  traffic type (:class:`SunAtmTraffic`): Wireshark reads 1 as LANE, 2 as LLC-multiplexed
  (RFC 1483), 5 as ILMI, 6 as signalling, everything else as AAL5 of unknown type.  U-Net/ATM
  messages are raw AAL5 payloads, so stacklib writes 0 (unknown).  Wireshark then guesses the
  payload from its first bytes (AA AA 03 as LLC/SNAP, a first nibble of 4 or 6 as IP, and a few
  more) and otherwise shows ``atm:data``; a message that happens to start like an IP header is
  shown as one.  The record carries the SDU, not the whole CPCS-PDU: Wireshark's ATM dissector
  treats SunATM records as having no trailer (the SunATM driver delivered payloads only), and
  showed a PDU's padding and trailer as payload bytes when we tried.  Cells are not recorded one
  by one: a link that moves cells writes one record per reassembled PDU, stamped with the arrival
  of its last cell (:func:`sunatm_record_from_pdu` drops padding and trailer).

:data:`GLOBAL_HEADER_LE`, :data:`RECORD_HEADER_LE` and their big-endian twins (construct) are the
specification, all four made by one function; the struct-speed codecs that the writer and reader
use are derived from them (:func:`~stacklib.wire.codec.derive_codec`).

Reading checks integrity first (a known magic, the global header and each record header and its
data complete) and sanity after (version 2.x, caplen at most orig_len, the fraction of a second
in range).  One sanity check comes early because it decides how much to read: caplen at most
the snaplen (when the file sets one) and at most :data:`MAX_CAPLEN`.  Any failure raises
:class:`PcapFormatError`; nothing else escapes.  Misuse of the writer (a negative timestamp,
``orig_len`` below the data length, writing after close) raises :class:`ValueError`.
"""

from __future__ import annotations

import enum
import io
import math
import os
from collections.abc import Iterator
from types import TracebackType
from typing import BinaryIO, Literal, Self

import attrs
import construct
from construct import BitsInteger, BitStruct, Flag, Int8ub, Int16ub, Struct

from stacklib.errors import FormatError
from stacklib.wire.codec import FixedCodec, derive_codec

__all__ = [
    "GLOBAL_HEADER_BE",
    "GLOBAL_HEADER_LE",
    "GLOBAL_HEADER_SIZE",
    "MAGIC_MICROSECOND",
    "MAGIC_NANOSECOND",
    "MAX_CAPLEN",
    "RECORD_HEADER_BE",
    "RECORD_HEADER_LE",
    "RECORD_HEADER_SIZE",
    "SUNATM_HEADER",
    "SUNATM_HEADER_SIZE",
    "ByteOrder",
    "LinkType",
    "PcapFormatError",
    "PcapReader",
    "PcapWriter",
    "Record",
    "SunAtmPacket",
    "SunAtmTraffic",
    "parse_pcap",
    "parse_sunatm",
    "read_pcap",
    "sunatm_record",
    "sunatm_record_from_pdu",
]

MAGIC_MICROSECOND = 0xA1B2C3D4  #: timestamps in seconds and microseconds
MAGIC_NANOSECOND = 0xA1B23C4D  #: timestamps in seconds and nanoseconds (stacklib's default)
VERSION = (2, 4)
GLOBAL_HEADER_SIZE = 24
RECORD_HEADER_SIZE = 16
DEFAULT_SNAPLEN = 65535
#: Largest caplen the reader accepts: libpcap's limit (256 KiB), so a corrupt length field
#: cannot make the reader allocate gigabytes.
MAX_CAPLEN = 262144
_NS = 1_000_000_000
_US = 1_000_000
_U32 = 0xFFFFFFFF

ByteOrder = Literal["little", "big"]


class PcapFormatError(FormatError):
    """Malformed capture file: unknown magic, truncated header or record, bad lengths."""


class LinkType(enum.IntEnum):
    """Link-layer header types (tcpdump.org's LINKTYPE_ values) that stacklib writes."""

    ETHERNET = 1  #: Ethernet II / 802.3 frame without FCS
    SUNATM = 123  #: SunATM pseudo-header + reassembled AAL5 SDU (see the module docstring)


class SunAtmTraffic(enum.IntEnum):
    """Traffic type in the low four bits of the SunATM flags byte, as Wireshark reads it."""

    UNKNOWN = 0  #: raw AAL5; Wireshark guesses the payload (U-Net/ATM messages)
    LANE = 1  #: LAN emulation
    LLC = 2  #: RFC 1483 LLC-multiplexed
    MARS = 3  #: RFC 2022 (Wireshark: AAL5, unknown type)
    IFMP = 4  #: RFC 1954 Ipsilon (Wireshark: AAL5, unknown type)
    ILMI = 5  #: ILMI (SNMP)
    QSAAL = 6  #: signalling AAL (Q.2931 over SSCOP)


def _headers(order: ByteOrder) -> tuple[construct.Struct, construct.Struct]:
    """The global and record header definitions in one byte order (one source for both)."""
    little = order == "little"
    u16 = construct.Int16ul if little else construct.Int16ub
    u32 = construct.Int32ul if little else construct.Int32ub
    s32 = construct.Int32sl if little else construct.Int32sb
    global_header = Struct(
        "magic" / u32,
        "version_major" / u16,
        "version_minor" / u16,
        "thiszone" / s32,  # GMT offset of the timestamps; always 0 in practice
        "sigfigs" / u32,  # timestamp accuracy; always 0 in practice
        "snaplen" / u32,
        "linktype" / u32,
    )
    record_header = Struct(
        "ts_sec" / u32,
        "ts_frac" / u32,  # nanoseconds or microseconds, by the magic
        "caplen" / u32,
        "orig_len" / u32,
    )
    return global_header, record_header


GLOBAL_HEADER_LE, RECORD_HEADER_LE = _headers("little")
GLOBAL_HEADER_BE, RECORD_HEADER_BE = _headers("big")

_GLOBAL: dict[ByteOrder, FixedCodec] = {
    "little": derive_codec(GLOBAL_HEADER_LE, PcapFormatError),
    "big": derive_codec(GLOBAL_HEADER_BE, PcapFormatError),
}
_RECORD: dict[ByteOrder, FixedCodec] = {
    "little": derive_codec(RECORD_HEADER_LE, PcapFormatError),
    "big": derive_codec(RECORD_HEADER_BE, PcapFormatError),
}

# The first four bytes of a file, in either byte order: (byte order, nanosecond resolution).
_MAGICS: dict[bytes, tuple[ByteOrder, bool]] = {
    MAGIC_NANOSECOND.to_bytes(4, "little"): ("little", True),
    MAGIC_NANOSECOND.to_bytes(4, "big"): ("big", True),
    MAGIC_MICROSECOND.to_bytes(4, "little"): ("little", False),
    MAGIC_MICROSECOND.to_bytes(4, "big"): ("big", False),
}
_PCAPNG_MAGIC = bytes.fromhex("0a0d0d0a")


def _seconds_to_ns(timestamp: float) -> int:
    """``timestamp`` seconds as integer nanoseconds, rounded to the nearest.

    Splitting off the whole seconds first keeps nanosecond precision for any timestamp a float
    can hold that finely (``t * 1e9`` alone would round to multiples of 128 ns near 1e9 s).
    """
    if not math.isfinite(timestamp) or timestamp < 0:
        raise ValueError(f"pcap timestamp must be finite and >= 0, not {timestamp!r}")
    whole = math.floor(timestamp)
    return whole * _NS + round((timestamp - whole) * _NS)  # the subtraction is exact


@attrs.frozen
class Record:
    """One captured packet: when, the captured bytes, and its length on the link.

    ``timestamp`` is in seconds; ``timestamp_ns`` holds the same instant exactly in integer
    nanoseconds (a float near 1e9 s cannot).  ``len(data) < orig_len`` when the packet was
    cut to the snaplen.
    """

    timestamp: float
    data: bytes
    orig_len: int
    timestamp_ns: int = attrs.field(
        default=attrs.Factory(lambda self: _seconds_to_ns(self.timestamp), takes_self=True)
    )


def _named(kind: type[enum.IntEnum], value: int) -> int:
    """``value`` as a member of ``kind`` when it is one, else the plain int."""
    try:
        return kind(value)
    except ValueError:
        return value


# --- writing ------------------------------------------------------------------------------------


class PcapWriter:
    """Writes a capture to a binary stream; a context manager that closes it on exit.

    ``PcapWriter.open(path, LinkType.ETHERNET)`` creates a file it owns and closes; the
    constructor writes to a stream the caller owns (it is flushed, not closed, by
    :meth:`close`, unless ``close_stream=True``).  The global header is written at once.
    """

    def __init__(
        self,
        stream: BinaryIO,
        linktype: int,
        snaplen: int = DEFAULT_SNAPLEN,
        *,
        nanosecond: bool = True,
        byteorder: ByteOrder = "little",
        close_stream: bool = False,
    ) -> None:
        if not 0 <= linktype <= _U32:
            raise ValueError(f"pcap link type {linktype} outside 0..{_U32}")
        if not 1 <= snaplen <= _U32:
            raise ValueError(f"pcap snaplen {snaplen} outside 1..{_U32}")
        if byteorder not in _RECORD:
            raise ValueError(f"byte order must be 'little' or 'big', not {byteorder!r}")
        self.linktype = _named(LinkType, linktype)
        self.snaplen = snaplen
        self.nanosecond = nanosecond
        self.byteorder: ByteOrder = byteorder
        self._stream = stream
        self._close_stream = close_stream
        self._pack_record = _RECORD[byteorder].pack
        self._records = 0
        self._closed = False
        magic = MAGIC_NANOSECOND if nanosecond else MAGIC_MICROSECOND
        stream.write(_GLOBAL[byteorder].pack(magic, *VERSION, 0, 0, snaplen, linktype))

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        linktype: int,
        snaplen: int = DEFAULT_SNAPLEN,
        *,
        nanosecond: bool = True,
        byteorder: ByteOrder = "little",
    ) -> Self:
        """Create (or truncate) the file at ``path`` and write the global header."""
        stream = open(path, "wb")  # noqa: SIM115 -- owned by the writer, closed by close()
        try:
            return cls(
                stream,
                linktype,
                snaplen,
                nanosecond=nanosecond,
                byteorder=byteorder,
                close_stream=True,
            )
        except BaseException:
            stream.close()
            raise

    @property
    def records(self) -> int:
        """Number of records written so far."""
        return self._records

    @property
    def closed(self) -> bool:
        return self._closed

    def write(
        self,
        timestamp: float,
        data: bytes | bytearray | memoryview,
        orig_len: int | None = None,
    ) -> None:
        """Append a packet seen at ``timestamp`` seconds (the simulation's clock).

        ``orig_len`` is the packet's length on the link (default ``len(data)``); data beyond
        the snaplen is cut off.  Raises :class:`ValueError` for a negative, non-finite or too
        large timestamp, or ``orig_len < len(data)``.
        """
        self.write_ns(_seconds_to_ns(timestamp), data, orig_len)

    def write_ns(
        self,
        timestamp_ns: int,
        data: bytes | bytearray | memoryview,
        orig_len: int | None = None,
    ) -> None:
        """Like :meth:`write`, with the timestamp in integer nanoseconds (exact)."""
        if self._closed:
            raise ValueError("write to a closed PcapWriter")
        size = len(data)
        if orig_len is None:
            orig_len = size
        elif not size <= orig_len <= _U32:
            raise ValueError(f"orig_len {orig_len} must be in {size}..{_U32} (len(data)={size})")
        seconds, fraction = divmod(timestamp_ns, _NS)
        if not self.nanosecond:
            fraction = (fraction + 500) // 1000  # to the nearest microsecond
            if fraction == _US:
                seconds, fraction = seconds + 1, 0
        if not 0 <= seconds <= _U32:
            raise ValueError(f"pcap timestamp {timestamp_ns} ns outside 0..2**32 s")
        caplen = min(size, self.snaplen)
        self._stream.write(self._pack_record(seconds, fraction, caplen, orig_len))
        self._stream.write(data if caplen == size else data[:caplen])
        self._records += 1

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        """Flush, and close the stream if the writer owns it; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stream.flush()
        finally:
            if self._close_stream:
                self._stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<PcapWriter {self.linktype!r} {self._records} records, {state}>"


# --- reading ------------------------------------------------------------------------------------


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes: fewer only at the end of the stream (pipes return short reads)."""
    data = stream.read(n)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        more = stream.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class PcapReader:
    """Reads a capture from a binary stream: the global header at once, records by iteration.

    Attributes after construction: ``linktype`` (a :class:`LinkType` when known, else the int),
    ``snaplen``, ``nanosecond``, ``byteorder``, ``version``.  Raises :class:`PcapFormatError`.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        head = _read_exact(stream, GLOBAL_HEADER_SIZE)
        magic = head[:4]
        if magic == _PCAPNG_MAGIC:
            raise PcapFormatError("pcap: this is a pcapng file; only classic pcap is read")
        if len(magic) < 4 or magic not in _MAGICS:
            raise PcapFormatError(f"pcap: bad magic {magic.hex() or '(empty file)'}")
        if len(head) < GLOBAL_HEADER_SIZE:
            raise PcapFormatError(
                f"pcap: truncated global header ({len(head)} of {GLOBAL_HEADER_SIZE} bytes)"
            )
        self.byteorder, self.nanosecond = _MAGICS[magic]
        _, major, minor, _zone, _sigfigs, snaplen, linktype = _GLOBAL[self.byteorder].unpack(head)
        if major != VERSION[0]:
            raise PcapFormatError(f"pcap: version {major}.{minor}, only 2.x is read")
        self.version: tuple[int, int] = (major, minor)
        self.snaplen: int = snaplen
        self.linktype: int = _named(LinkType, linktype)
        self._unpack_record = _RECORD[self.byteorder].unpack
        self._index = 0

    def __iter__(self) -> Iterator[Record]:
        return self

    def __next__(self) -> Record:
        head = _read_exact(self._stream, RECORD_HEADER_SIZE)
        if not head:
            raise StopIteration
        index = self._index
        if len(head) < RECORD_HEADER_SIZE:
            raise PcapFormatError(
                f"pcap: record {index}: truncated header ({len(head)} of {RECORD_HEADER_SIZE})"
            )
        seconds, fraction, caplen, orig_len = self._unpack_record(head)
        # Sanity of caplen comes before reading the data: it decides how much to read.
        if caplen > MAX_CAPLEN or (self.snaplen and caplen > self.snaplen):
            raise PcapFormatError(
                f"pcap: record {index}: caplen {caplen} exceeds snaplen {self.snaplen}"
                f" (or the {MAX_CAPLEN}-byte limit)"
            )
        data = _read_exact(self._stream, caplen)
        if len(data) < caplen:
            raise PcapFormatError(
                f"pcap: record {index}: truncated data ({len(data)} of {caplen} bytes)"
            )
        if caplen > orig_len:
            raise PcapFormatError(f"pcap: record {index}: caplen {caplen} > orig_len {orig_len}")
        per_second = _NS if self.nanosecond else _US
        if fraction >= per_second:
            raise PcapFormatError(
                f"pcap: record {index}: fraction {fraction} of a second out of range"
            )
        nanos = fraction if self.nanosecond else fraction * 1000
        self._index = index + 1
        return Record(seconds + nanos / _NS, data, orig_len, seconds * _NS + nanos)


def parse_pcap(data: bytes | bytearray | memoryview) -> tuple[int, list[Record]]:
    """The link type and records of a whole capture held in memory."""
    reader = PcapReader(io.BytesIO(bytes(data)))
    return reader.linktype, list(reader)


def read_pcap(path: str | os.PathLike[str]) -> tuple[int, list[Record]]:
    """The link type (a :class:`LinkType` when known) and the records of the file at ``path``."""
    with open(path, "rb") as stream:
        reader = PcapReader(stream)
        return reader.linktype, list(reader)


# --- SunATM -------------------------------------------------------------------------------------

SUNATM_HEADER = Struct(
    "flags"
    / BitStruct(
        "outgoing" / Flag,  # 0x80: sent by the capturing host
        "_reserved" / BitsInteger(3),
        "traffic" / BitsInteger(4),  # SunAtmTraffic
    ),
    "vpi" / Int8ub,
    "vci" / Int16ub,
)
"""The 4-byte SunATM pseudo-header in front of each LINKTYPE_SUNATM record (big-endian)."""

SUNATM_HEADER_SIZE = 4
_SUNATM = derive_codec(SUNATM_HEADER, PcapFormatError)  # fields: outgoing, traffic, vpi, vci


@attrs.frozen
class SunAtmPacket:
    """A decoded LINKTYPE_SUNATM record: the VC, direction, traffic type and AAL5 SDU."""

    vpi: int
    vci: int
    payload: bytes
    outgoing: bool = False
    traffic: int = SunAtmTraffic.UNKNOWN


def sunatm_record(
    vpi: int,
    vci: int,
    payload: bytes | bytearray | memoryview,
    *,
    outgoing: bool = False,
    traffic: int = SunAtmTraffic.UNKNOWN,
) -> bytes:
    """The bytes of a LINKTYPE_SUNATM record: pseudo-header, then the AAL5 SDU ``payload``.

    ``outgoing`` marks a message the capturing host sent.  Raises :class:`ValueError` for a
    VPI outside 0..255, a VCI outside 0..65535 or a traffic type outside 0..15.
    """
    if not 0 <= vpi <= 0xFF or not 0 <= vci <= 0xFFFF:
        raise ValueError(f"SunATM VPI/VCI {vpi}/{vci} outside 0..255 / 0..65535")
    if not 0 <= traffic <= 0xF:
        raise ValueError(f"SunATM traffic type {traffic} outside 0..15")
    return _SUNATM.pack(outgoing, traffic, vpi, vci) + bytes(payload)


def sunatm_record_from_pdu(
    vpi: int,
    vci: int,
    pdu: bytes | bytearray | memoryview,
    *,
    outgoing: bool = False,
    traffic: int = SunAtmTraffic.UNKNOWN,
    check_crc: bool = False,
) -> bytes:
    """Like :func:`sunatm_record` for a whole CPCS-PDU: its padding and trailer are dropped.

    The CRC is not checked unless ``check_crc``: a capture shows what was on the wire.  Raises
    :class:`~stacklib.wire.aal5.Aal5FormatError` for a PDU whose size or Length field is broken.
    """
    from stacklib.wire import aal5  # only this helper needs it

    return sunatm_record(
        vpi,
        vci,
        aal5.parse_pdu(pdu, check_crc=check_crc).payload,
        outgoing=outgoing,
        traffic=traffic,
    )


def parse_sunatm(data: bytes | bytearray | memoryview) -> SunAtmPacket:
    """Decode a LINKTYPE_SUNATM record's data; raises :class:`PcapFormatError` if under 4 bytes."""
    if len(data) < SUNATM_HEADER_SIZE:
        raise PcapFormatError(f"pcap: SunATM record of {len(data)} bytes, under the pseudo-header")
    outgoing, traffic, vpi, vci = _SUNATM.unpack(data)
    payload = bytes(data[SUNATM_HEADER_SIZE:])
    return SunAtmPacket(vpi, vci, payload, outgoing, _named(SunAtmTraffic, traffic))
