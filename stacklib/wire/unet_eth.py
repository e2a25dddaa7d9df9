"""U-Net/FE frames: an Ethernet header and the U-Net header (paper 001 §3.2, paper 003 §4.3).

U-Net/FE tags a message with the destination's 48-bit MAC address and a one-byte U-Net port
(paper 003 §4.3.1); the sender's kernel prepends the Ethernet header and the message length,
"needed at the receiving end to identify the exact length of messages under the minimum
Ethernet payload size of 46 bytes" (paper 001 §3.2)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                    destination MAC (6 bytes)                  |
    +                               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                               |                               |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
    |                      source MAC (6 bytes)                     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |     EtherType 0x88B5          |        message length         |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |  U-Net port   |  message (length bytes), then zero padding    |
    +-+-+-+-+-+-+-+-+     up to a 46-byte Ethernet payload          |
    |                    (a 60-byte frame)                          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

All fields are big-endian.  A 40-byte message makes exactly a 60-byte frame, the minimum
(paper 003 Fig 3: "60 bytes with the Ethernet and U-Net headers"; paper 001 Fig 3 says 66, which
fits neither this layout nor the minimum frame, so stacklib follows paper 003).

EtherType: the papers do not give U-Net/FE's value; stacklib uses 0x88B5
(:data:`ETHERTYPE_UNET`), IEEE 802's "Local Experimental EtherType 1", reserved for exactly this
kind of non-standard protocol on a LAN.

Maximum message: the 1500-byte Ethernet payload less the 3-byte U-Net header,
:data:`MAX_MESSAGE` = 1497.  Paper 003 §4.4.2 quotes 1498 bytes, counting only the two-byte
length field; stacklib carries the port as an explicit byte, which costs one byte.

The frame check sequence is not part of this format: NI models add and check it with
:func:`with_fcs` and :func:`check_fcs` (the DC21140 "adds the 32-bit packet CRC",
paper 001 §3.2).

Parsing (:func:`parse`) checks integrity first (the header is there; the frame has at least
60 bytes unless ``strict_min=False``; the EtherType is U-Net's, i.e. this is our protocol at
all; the length field does not exceed the bytes present) and sanity after (the length is at
most :data:`MAX_MESSAGE`).  Bytes after the message are padding and ignored.  Any failure raises
:class:`UNetEthFormatError`.  :func:`parse_reference` does the same on the full construct
format (slow; ``stacklib decode`` uses it); the tests prove the two agree on any input.
"""

from __future__ import annotations

import re
import zlib
from typing import TYPE_CHECKING, ClassVar

import attrs
import construct
from construct import this

from stacklib.errors import FormatError
from stacklib.wire import registry
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = [
    "ETHERTYPE_UNET",
    "FRAME_FORMAT",
    "HEADER_CODEC",
    "HEADER_FORMAT",
    "HEADER_SIZE",
    "MAX_MESSAGE",
    "MIN_FRAME",
    "UNetEthFormatError",
    "UNetFrame",
    "build",
    "check_fcs",
    "describe",
    "fcs",
    "frames",
    "mac",
    "mac_str",
    "parse",
    "parse_reference",
    "with_fcs",
]

ETHERTYPE_UNET = 0x88B5  #: IEEE 802 Local Experimental EtherType 1 (see the module docstring)
ETH_HEADER_SIZE = 14  #: destination MAC, source MAC, EtherType
HEADER_SIZE = 17  #: the Ethernet header and the U-Net header (length, port)
MIN_PAYLOAD = 46  #: Ethernet's minimum payload (paper 001 §3.2)
MIN_FRAME = ETH_HEADER_SIZE + MIN_PAYLOAD  #: 60 bytes, without the FCS
MAX_PAYLOAD = 1500  #: Ethernet's MTU
MAX_MESSAGE = MAX_PAYLOAD - (HEADER_SIZE - ETH_HEADER_SIZE)  #: 1497 (see the module docstring)
FCS_SIZE = 4


class UNetEthFormatError(FormatError):
    """Malformed U-Net/FE frame: too short, not U-Net's EtherType, length past the data or
    above :data:`MAX_MESSAGE`, or a bad FCS."""


HEADER_FORMAT = construct.Struct(
    "dst" / construct.Bytes(6),
    "src" / construct.Bytes(6),
    "ethertype" / construct.Const(ETHERTYPE_UNET, construct.Int16ub),
    "length" / construct.Int16ub,
    "port" / construct.Int8ub,
)
"""The 17-byte header: Ethernet header, then the U-Net length and port."""

FRAME_FORMAT = construct.Struct(
    "header" / HEADER_FORMAT,
    "payload" / construct.Bytes(this.header.length),
    "padding" / construct.GreedyBytes,
)
"""A whole frame (without FCS); the size and MAX_MESSAGE rules are applied on top of it."""

HEADER_CODEC = derive_codec(HEADER_FORMAT, UNetEthFormatError)
"""Fields: dst, src, length, port (the EtherType is a checked constant)."""

_unpack_header = HEADER_CODEC.unpack
_pack_header = HEADER_CODEC.pack
_PADDING = tuple(bytes(n) for n in range(MIN_FRAME - HEADER_SIZE + 1))


@attrs.frozen
class UNetFrame:
    """A U-Net/FE frame: to MAC ``dst`` port ``port``, from MAC ``src``, carrying ``payload``."""

    ethertype: ClassVar[int] = ETHERTYPE_UNET

    dst: bytes
    src: bytes
    port: int
    payload: bytes


def _check_frame_size(size: int, strict_min: bool) -> None:
    if size < HEADER_SIZE:
        raise UNetEthFormatError(f"{size} bytes, shorter than the {HEADER_SIZE}-byte header")
    if strict_min and size < MIN_FRAME:
        raise UNetEthFormatError(f"{size} bytes, shorter than the minimum frame of {MIN_FRAME}")


def _length_error(length: int, present: int) -> UNetEthFormatError:
    return UNetEthFormatError(f"length field {length} but only {present} bytes follow the header")


def _too_long(length: int) -> UNetEthFormatError:
    return UNetEthFormatError(f"length {length} exceeds MAX_MESSAGE {MAX_MESSAGE}")


def parse(data: bytes | bytearray | memoryview, *, strict_min: bool = True) -> UNetFrame:
    """Parse a frame without FCS; padding after the message is ignored.

    ``strict_min=False`` accepts frames shorter than Ethernet's 60-byte minimum (from
    transports that do not pad).
    """
    size = len(data)
    if size < MIN_FRAME:
        _check_frame_size(size, strict_min)
    try:
        dst, src, length, port = _unpack_header(data)
    except UNetEthFormatError as exc:  # the EtherType constant: not U-Net's frame at all
        raise UNetEthFormatError(f"not a U-Net frame: {exc}") from None
    if length > size - HEADER_SIZE:
        raise _length_error(length, size - HEADER_SIZE)
    if length > MAX_MESSAGE:
        raise _too_long(length)
    return UNetFrame(dst, src, port, bytes(data[HEADER_SIZE : HEADER_SIZE + length]))


def parse_reference(data: bytes | bytearray | memoryview, *, strict_min: bool = True) -> UNetFrame:
    """Parse like :func:`parse`, with :data:`FRAME_FORMAT` (slow, the specification)."""
    data = bytes(data)
    _check_frame_size(len(data), strict_min)
    try:
        c = FRAME_FORMAT.parse(data)
    except construct.ConstError as exc:
        raise UNetEthFormatError(f"not a U-Net frame: {exc}") from None
    except construct.StreamError:
        length = int.from_bytes(data[14:16], "big")
        raise _length_error(length, len(data) - HEADER_SIZE) from None
    if c.header.length > MAX_MESSAGE:
        raise _too_long(c.header.length)
    return UNetFrame(c.header.dst, c.header.src, c.header.port, c.payload)


def build(frame: UNetFrame, *, pad: bool = True) -> bytes:
    """The bytes of ``frame`` without FCS, padded to 60 bytes unless ``pad=False``.

    Raises ValueError for MACs that are not 6 bytes, a port outside 0-255, or a payload longer
    than :data:`MAX_MESSAGE`.
    """
    payload = frame.payload
    length = len(payload)
    if length > MAX_MESSAGE:
        raise ValueError(f"payload of {length} bytes exceeds MAX_MESSAGE {MAX_MESSAGE}")
    header = _pack_header(frame.dst, frame.src, length, frame.port)
    if pad and length < MIN_FRAME - HEADER_SIZE:
        return header + payload + _PADDING[MIN_FRAME - HEADER_SIZE - length]
    return header + payload


# --- FCS: the NI model's business, offered here because it is part of the wire -----------------


def fcs(frame: bytes | bytearray | memoryview) -> int:
    """Ethernet's frame check sequence of ``frame``: the standard CRC-32 (as zlib computes)."""
    return zlib.crc32(frame)


def with_fcs(frame: bytes | bytearray | memoryview) -> bytes:
    """``frame`` followed by its FCS, least significant byte first as Ethernet sends it."""
    return bytes(frame) + zlib.crc32(frame).to_bytes(FCS_SIZE, "little")


def check_fcs(frame_with_fcs: bytes | bytearray | memoryview) -> bytes:
    """The frame without its trailing FCS; UNetEthFormatError if the FCS does not match."""
    if len(frame_with_fcs) < FCS_SIZE:
        raise UNetEthFormatError(f"{len(frame_with_fcs)} bytes, too short to hold an FCS")
    view = memoryview(frame_with_fcs)
    body, trailer = view[:-FCS_SIZE], view[-FCS_SIZE:]
    expected = zlib.crc32(body)
    got = int.from_bytes(trailer, "little")
    if got != expected:
        raise UNetEthFormatError(f"bad FCS {got:#010x}, expected {expected:#010x}")
    return bytes(body)


# --- MAC addresses -----------------------------------------------------------------------------

_MAC_TEXT = re.compile(r"[0-9A-Fa-f]{2}([:-])[0-9A-Fa-f]{2}(?:\1[0-9A-Fa-f]{2}){4}")


def mac(s: str) -> bytes:
    """``"02:00:00:00:00:01"`` (or with ``-``) -> 6 bytes; ValueError if malformed."""
    if not _MAC_TEXT.fullmatch(s):
        raise ValueError(
            f"not a MAC address: {s!r} (expected six hex pairs like 02:00:5e:00:00:01)"
        )
    return bytes.fromhex(s.replace(s[2], ""))


def mac_str(b: bytes | bytearray | memoryview) -> str:
    """6 bytes -> ``"02:00:00:00:00:01"``; ValueError if not 6 bytes."""
    if len(b) != 6:
        raise ValueError(f"a MAC address is 6 bytes, got {len(b)}")
    return bytes(b).hex(":")


# --- stacklib decode ---------------------------------------------------------------------------


def describe(frame: UNetFrame) -> list[registry.Field]:
    """``stacklib decode`` lines for a frame."""
    return [
        ("dst", mac_str(frame.dst)),
        ("src", mac_str(frame.src)),
        ("ethertype", f"{frame.ethertype:#06x}"),
        ("length", len(frame.payload)),
        ("port", frame.port),
        ("payload", frame.payload),
    ]


# --- hypothesis strategy (hypothesis is a test-only dependency: imported lazily) ---------------


def frames(*, max_payload: int = MAX_MESSAGE) -> SearchStrategy[UNetFrame]:
    """Valid U-Net/FE frames with payloads of up to ``max_payload`` bytes."""
    from hypothesis import strategies as st

    macs = st.binary(min_size=6, max_size=6)
    result: SearchStrategy[UNetFrame] = st.builds(
        UNetFrame,
        dst=macs,
        src=macs,
        port=st.integers(0, 0xFF),
        payload=st.binary(max_size=min(max_payload, MAX_MESSAGE)),
    )
    return result


registry.register(
    "unet-eth",
    parse_reference,
    describe,
    "Ethernet frame with the U-Net/FE header, no FCS (paper 001 §3.2)",
    build=build,
    strategy=frames,
    error=UNetEthFormatError,
)
