"""Link technologies: what the wire carries for a message of a given size (:class:`WireShape`),
as AAL5 cells (TAXI and OC-3c ATM), one Ethernet frame with preamble and inter-frame gap, or
Myrinet bytes behind a route header.

Each technology also says what its receiver's integrity check makes of bits flipped on the wire
(:meth:`LinkTech.check`), by running that check: ATM reassembles the AAL5 PDU and verifies its
CRC-32 (paper 000 §4.2.2), Ethernet recomputes the frame check sequence (a CRC-32), Myrinet's
8-bit CRC is left to its NI model.

The fabric (:mod:`stacklib.transports.sim.fabric`) uses them; they are apart because
``stacklib compile`` compiles the fabric, and mypyc does not take attrs fields with citations
in a compiled class (nor attrs subclasses of a compiled one).
"""

from __future__ import annotations

import abc
import zlib

import attrs

from stacklib.sim.costs import cited
from stacklib.wire.aal5 import Aal5FormatError, build_pdu, parse_pdu

__all__ = [
    "AAL5_TRAILER",
    "CELL_BYTES",
    "CELL_PAYLOAD",
    "OC3",
    "TAXI_140",
    "AtmLink",
    "EthernetLink",
    "LinkTech",
    "MyrinetLink",
    "WireShape",
    "flip_bits",
]


def flip_bits(data: bytes, bits: tuple[int, ...]) -> bytes:
    """``data`` with the bits at offsets ``bits`` (0 = the first byte's top bit) inverted."""
    out = bytearray(data)
    for bit in bits:
        out[bit >> 3] ^= 0x80 >> (bit & 7)
    return bytes(out)


@attrs.frozen(slots=True)
class WireShape:
    """How a message crosses a link: ``units`` of ``per_unit`` seconds, then ``tail`` idle."""

    units: int
    per_unit: float
    tail: float
    wire_bytes: int


class LinkTech(abc.ABC):
    """A link technology: its name, bit rate and framing."""

    name: str
    rate_bps: float

    @abc.abstractmethod
    def shape(self, message_bytes: int) -> WireShape:
        """The wire form of a message of ``message_bytes`` bytes."""

    def payload_limit_bps(self, message_bytes: int) -> float:
        """Payload bits per second this link can carry at most for this message size."""
        shape = self.shape(message_bytes)
        return message_bytes * 8 / (shape.units * shape.per_unit + shape.tail)

    def protected_bytes(self, message_bytes: int) -> int:
        """The bytes the link's check covers for a message (where wire errors can land)."""
        return message_bytes

    def check(self, payload: bytes, bits: tuple[int, ...]) -> bytes | None:
        """What the receiver makes of ``payload`` sent with the bits at ``bits`` (offsets in
        the :meth:`protected_bytes`) flipped on the wire: None if its check catches them (the
        message is dropped), else the bytes it delivers.  By default every error is caught."""
        return None


CELL_BYTES = 53


CELL_PAYLOAD = 48


AAL5_TRAILER = 8


@attrs.frozen
class AtmLink(LinkTech):
    """An ATM link carrying AAL5 PDUs in 53-byte cells."""

    name: str
    #: Bits per second available to cells (after SONET framing on OC-3).
    rate_bps: float
    cite: str = ""

    def shape(self, message_bytes: int) -> WireShape:
        cells = -(-(message_bytes + AAL5_TRAILER) // CELL_PAYLOAD)
        return WireShape(cells, CELL_BYTES * 8 / self.rate_bps, 0.0, cells * CELL_BYTES)

    def protected_bytes(self, message_bytes: int) -> int:
        """The AAL5 CPCS-PDU: payload, padding and trailer, 48 bytes per cell."""
        return -(-(message_bytes + AAL5_TRAILER) // CELL_PAYLOAD) * CELL_PAYLOAD

    def check(self, payload: bytes, bits: tuple[int, ...]) -> bytes | None:
        """Reassemble the PDU with the flipped bits and verify it as the NI does (CRC-32,
        then the Length field): None if it fails, else the payload it yields."""
        try:
            return parse_pdu(flip_bits(build_pdu(payload), bits)).payload
        except Aal5FormatError:
            return None


#: 140 Mbit/s TAXI fiber (paper 000 §4.1-4.2).
TAXI_140 = AtmLink("taxi-140", 140e6, "paper 000 §4.1: 140Mbit/s TAXI fibers")


#: 155.52 Mbit/s OC-3c: SONET leaves 149.76 Mbit/s for cells, 135.6 Mbit/s of cell payload
#: ("not 155Mbps, but rather 135 Mbps", paper 001 §3.4; 138 in paper 003 §4.4.2).
OC3 = AtmLink("oc-3", 149.76e6, "ANSI T1.105 SONET STS-3c payload; paper 001 §3.4, 003 §4.4.2")


@attrs.frozen
class EthernetLink(LinkTech):
    """Ethernet: 14-byte header + 3-byte U-Net header (paper 001 §3.2), padded to the 60-byte
    minimum, 4-byte FCS, 8 bytes of preamble and start delimiter, 12 bytes of inter-frame gap."""

    name: str = "fast-ethernet"
    rate_bps: float = 100e6
    header_bytes: int = 17
    cite: str = "IEEE 802.3u 100BASE-TX; paper 001 §3.2"

    def shape(self, message_bytes: int) -> WireShape:
        frame = max(60, self.header_bytes + message_bytes) + 4
        bit = 1.0 / self.rate_bps
        return WireShape(1, (frame + 8) * 8 * bit, 12 * 8 * bit, frame + 20)

    def check(self, payload: bytes, bits: tuple[int, ...]) -> bytes | None:
        """Recompute the frame check sequence (IEEE 802.3's CRC-32) over the flipped frame
        data: None when it differs from the sender's, which the NIC then drops."""
        flipped = flip_bits(payload, bits)
        return flipped if zlib.crc32(flipped) == zlib.crc32(payload) else None


@attrs.frozen
class MyrinetLink(LinkTech):
    """A Myrinet link: bytes flow cut-through at the link rate behind a short route header."""

    name: str = "myrinet"
    rate_bps: float = cited(1.28e9, "paper 004 §3: 1.28 Gbit/s links each way", "bit/s")
    header_bytes: int = 8
    cite: str = "paper 004 §3"

    def shape(self, message_bytes: int) -> WireShape:
        units = message_bytes + self.header_bytes
        return WireShape(units, 8 / self.rate_bps, 0.0, units)
