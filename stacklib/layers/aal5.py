"""AAL5 segmentation and reassembly (SAR), a sans-IO core (paper 000 §4.1-4.2, paper 003 §4.2.3).

On the SBA-100 this ran on the host in a user-level library, cell by cell through kernel traps
(paper 000 §4.1); on the SBA-200/PCA-200 the i960 ran it: per incoming cell it looks the VCI up,
appends the cell to the message buffer, and at the last cell checks the CRC (accumulated in
hardware) and posts a descriptor (paper 003 §4.2.3).  This module is that logic without any I/O,
clock or trio: a driver or an NI model feeds cells and gets events back.

Sending: :func:`segment` turns a payload into 53-byte cells (AUU bit on the last one).
:func:`segment_payloads` returns only the 48-byte cell payloads, for models that count or carry
cells without building headers (the VC then travels out of band; feed them back with
:meth:`Reassembler.feed_payload`).

Receiving: :class:`Reassembler` keeps one buffer per VC ((vpi, vci)).  AAL5 has no sequence
numbers, so loss is only seen at the end of a PDU:

* a lost cell shortens the PDU, which fails the CRC (or, with ``check_crc=False``, the Length
  check: one cell fewer always leaves Length larger than the room) and the PDU is dropped;
* a lost end-of-PDU cell merges the PDU with the next one on the VC; the merged PDU fails the CRC
  (or has 48 or more bytes of padding) and both are dropped as one;
* a cell whose HEC fails (raw bytes, ``check_hec=True``) is dropped before its VC can be trusted,
  so it cannot abort the PDU it belonged to: the loss shows up later as that PDU's CRC/Length
  failure.  Likewise for input that is not 53 bytes.

Bad input never raises: it is dropped, reported as a :class:`PduDropped` event and counted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TypeAlias

import attrs

from stacklib.wire.aal5 import (
    CELL_PAYLOAD,
    MAX_PAYLOAD,
    Aal5ErrorKind,
    Aal5FormatError,
    build_pdu,
    cells_needed,
    parse_pdu,
)
from stacklib.wire.atm import (
    CELL_SIZE,
    HEADER_CODEC,
    HEADER_SIZE,
    PTI_AUU,
    PTI_NON_USER,
    Cell,
    header_bytes,
    hec,
)

__all__ = [
    "VC",
    "Aal5Statistics",
    "DropReason",
    "Event",
    "PduDropped",
    "PduReceived",
    "Reassembler",
    "segment",
    "segment_payloads",
]

VC: TypeAlias = tuple[int, int]  # (vpi, vci)


class DropReason(enum.Enum):
    """Why the reassembler dropped a PDU (or, for the cell-level reasons, a cell)."""

    BAD_CRC = "bad_crc"  #: the PDU's CRC-32 did not match (a lost or corrupted cell)
    BAD_LENGTH = "bad_length"  #: Length field inconsistent with the number of cells received
    TOO_LONG = "too_long"  #: over 1366 cells (the largest PDU) without an end cell
    BUFFER_FULL = "buffer_full"  #: the PDU exceeds the reassembler's per-VC ``max_payload``
    BAD_HEC = "bad_hec"  #: a cell's header failed its HEC; its VC is unknown (cell-level)
    BAD_CELL = "bad_cell"  #: input that is not a 53-byte cell / 48-byte payload (cell-level)


@attrs.frozen(kw_only=True)
class PduReceived:
    """A PDU reassembled and verified on ``vc``."""

    vc: VC
    payload: bytes
    uu: int
    cpi: int


@attrs.frozen(kw_only=True)
class PduDropped:
    """Cells discarded for ``reason``; ``vc`` is None for the cell-level reasons."""

    vc: VC | None
    reason: DropReason
    cells: int


Event: TypeAlias = PduReceived | PduDropped


@attrs.frozen
class Aal5Statistics:
    """A snapshot of a :class:`Reassembler`'s counters.

    ``pdus_dropped`` counts drop events by reason; for BAD_HEC and BAD_CELL each event is one
    cell, since the PDU it belonged to is unknown.  ``cells_dropped`` counts every discarded cell.
    ``bytes_received`` counts payload bytes of delivered PDUs.  ``cells_ignored`` counts OAM and
    resource-management cells (PTI 1xx), which are not AAL5 data.
    """

    cells_received: int
    cells_dropped: int
    cells_ignored: int
    pdus_received: int
    bytes_received: int
    pdus_dropped: Mapping[DropReason, int]

    @property
    def pdus_dropped_total(self) -> int:
        """All drop events, whatever the reason."""
        return sum(self.pdus_dropped.values())


# --- segmentation -------------------------------------------------------------------------------


def segment_payloads(
    payload: bytes | bytearray | memoryview, uu: int = 0, cpi: int = 0
) -> list[bytes]:
    """The 48-byte cell payloads of the AAL5 PDU carrying ``payload``, in order.

    Cheaper than :func:`segment` (no headers); the last element is the end-of-PDU cell.
    """
    pdu = build_pdu(payload, uu, cpi)
    return [pdu[i : i + CELL_PAYLOAD] for i in range(0, len(pdu), CELL_PAYLOAD)]


def segment(
    payload: bytes | bytearray | memoryview,
    vpi: int,
    vci: int,
    uu: int = 0,
    cpi: int = 0,
    clp: int = 0,
) -> list[bytes]:
    """The 53-byte cells carrying ``payload`` as one AAL5 PDU on VC (``vpi``, ``vci``).

    All cells are user data cells (PTI 000) except the last, which has the AUU bit (PTI 001).
    Raises :class:`ValueError` for a payload over 65535 bytes or a header field out of range.
    """
    pdu = build_pdu(payload, uu, cpi)
    # Only two distinct headers per PDU: build (and HEC) each once.
    head = header_bytes(vpi, vci, 0, clp)
    last = len(pdu) - CELL_PAYLOAD
    cells = [head + pdu[i : i + CELL_PAYLOAD] for i in range(0, last, CELL_PAYLOAD)]
    cells.append(header_bytes(vpi, vci, PTI_AUU, clp) + pdu[last:])
    return cells


# --- reassembly ---------------------------------------------------------------------------------

_unpack_header = HEADER_CODEC.unpack

# Per-VC state marker: after TOO_LONG/BUFFER_FULL the VC discards cells up to the next end cell,
# which is where the next PDU can start.
_DISCARDING: list[bytes] = []

_PDU_REASON = {
    Aal5ErrorKind.BAD_CRC: DropReason.BAD_CRC,
    Aal5ErrorKind.BAD_LENGTH: DropReason.BAD_LENGTH,
    # The reassembler only ever builds non-empty whole-cell PDUs, but map these anyway.
    Aal5ErrorKind.NOT_CELL_MULTIPLE: DropReason.BAD_LENGTH,
    Aal5ErrorKind.TOO_SHORT: DropReason.BAD_LENGTH,
}


class Reassembler:
    """Reassembles AAL5 PDUs from cells, one buffer per VC.

    ``check_hec`` and ``check_crc`` are the checksum policies (off models an NI whose hardware
    checks them, paper 000 §4.1, paper 003 §4.2.3).  ``max_payload`` is the per-VC buffer limit:
    a PDU with a longer payload is dropped as BUFFER_FULL, as soon as its cell count shows it.
    With ``check_hec=False`` a corrupted header can put a cell on the wrong VC; the CRC of the
    PDUs involved then catches it, as it would catch the loss.
    """

    def __init__(
        self, *, check_hec: bool = True, check_crc: bool = True, max_payload: int = MAX_PAYLOAD
    ) -> None:
        if not 0 <= max_payload <= MAX_PAYLOAD:
            raise ValueError(f"max_payload {max_payload} outside 0..{MAX_PAYLOAD}")
        self._check_hec = check_hec
        self._check_crc = check_crc
        self._max_payload = max_payload
        self._max_cells = cells_needed(max_payload)
        self._overflow = (
            DropReason.TOO_LONG if max_payload == MAX_PAYLOAD else DropReason.BUFFER_FULL
        )
        # Keyed by vpi << 16 | vci: an int key is cheaper per cell than a tuple.
        self._parts: dict[int, list[bytes]] = {}
        self._cells_received = 0
        self._cells_dropped = 0
        self._cells_ignored = 0
        self._pdus_received = 0
        self._bytes_received = 0
        self._dropped = dict.fromkeys(DropReason, 0)

    # -- inputs --

    def feed(self, cell: bytes | bytearray | memoryview | Cell) -> list[Event]:
        """Take one cell (53 raw bytes or a :class:`Cell`); return the events it completes."""
        out: list[Event] = []
        self._feed(cell, out)
        return out

    def feed_many(self, cells: Iterable[bytes | bytearray | memoryview | Cell]) -> list[Event]:
        """Take cells in arrival order; return the events they complete, in order."""
        out: list[Event] = []
        feed = self._feed
        for cell in cells:
            feed(cell, out)
        return out

    def feed_payload(self, vc: VC, payload: bytes, end: bool) -> list[Event]:
        """Take one 48-byte cell payload of ``vc`` (header-less, see :func:`segment_payloads`)."""
        out: list[Event] = []
        self._cells_received += 1
        if len(payload) != CELL_PAYLOAD:
            self._drop(None, DropReason.BAD_CELL, 1, out)
        else:
            self._user_cell((vc[0] << 16) | vc[1], bytes(payload), end, out)
        return out

    def _feed(self, cell: bytes | bytearray | memoryview | Cell, out: list[Event]) -> None:
        self._cells_received += 1
        if isinstance(cell, Cell):
            payload, vpi, vci, pti = cell.payload, cell.vpi, cell.vci, cell.pti
            if len(payload) != CELL_PAYLOAD or not (
                0 <= vpi <= 0xFF and 0 <= vci <= 0xFFFF and 0 <= pti <= 0b111
            ):
                self._drop(None, DropReason.BAD_CELL, 1, out)
                return
            key = (vpi << 16) | vci
        else:
            if type(cell) is not bytes:
                # Keep no view into a buffer the caller may reuse (an NI ring, say).
                cell = bytes(cell)
            if len(cell) != CELL_SIZE:
                self._drop(None, DropReason.BAD_CELL, 1, out)
                return
            _gfc, vpi, vci, pti, _clp, got = _unpack_header(cell)
            if self._check_hec and hec(cell) != got:
                self._drop(None, DropReason.BAD_HEC, 1, out)
                return
            key = (vpi << 16) | vci  # GFC and CLP do not name the VC
            payload = cell[HEADER_SIZE:]
        if pti & PTI_NON_USER:
            self._cells_ignored += 1
            return
        self._user_cell(key, payload, bool(pti & PTI_AUU), out)

    def _user_cell(self, key: int, payload: bytes, end: bool, out: list[Event]) -> None:
        parts = self._parts.get(key)
        if parts is _DISCARDING:
            self._cells_dropped += 1
            if end:
                del self._parts[key]
            return
        if end:
            if parts is None:
                self._finish(key, payload, 1, out)  # single-cell PDU: no buffer needed
            else:
                del self._parts[key]
                parts.append(payload)
                self._finish(key, b"".join(parts), len(parts), out)
            return
        if parts is None:
            parts = self._parts[key] = []
        parts.append(payload)
        if len(parts) >= self._max_cells:
            # A PDU that fits ends by cell max_cells; this non-end cell proves it does not.
            self._parts[key] = _DISCARDING
            self._drop((key >> 16, key & 0xFFFF), self._overflow, len(parts), out)

    def _finish(self, key: int, pdu: bytes, cells: int, out: list[Event]) -> None:
        vc = (key >> 16, key & 0xFFFF)
        try:
            decoded = parse_pdu(pdu, check_crc=self._check_crc)
        except Aal5FormatError as exc:
            self._drop(vc, _PDU_REASON[exc.kind], cells, out)
            return
        if len(decoded.payload) > self._max_payload:
            self._drop(vc, DropReason.BUFFER_FULL, cells, out)
            return
        self._pdus_received += 1
        self._bytes_received += len(decoded.payload)
        out.append(PduReceived(vc=vc, payload=decoded.payload, uu=decoded.uu, cpi=decoded.cpi))

    def _drop(self, vc: VC | None, reason: DropReason, cells: int, out: list[Event]) -> None:
        self._dropped[reason] += 1
        self._cells_dropped += cells
        out.append(PduDropped(vc=vc, reason=reason, cells=cells))

    # -- observation --

    def pending_cells(self, vc: VC | None = None) -> int:
        """Cells of unfinished PDUs buffered for ``vc``, or for all VCs if ``vc`` is None.

        A VC discarding up to its next end cell (after TOO_LONG or BUFFER_FULL) buffers none.
        """
        if vc is None:
            return sum(len(parts) for parts in self._parts.values())
        return len(self._parts.get((vc[0] << 16) | vc[1], ()))

    def statistics(self) -> Aal5Statistics:
        """A frozen snapshot of the counters."""
        return Aal5Statistics(
            cells_received=self._cells_received,
            cells_dropped=self._cells_dropped,
            cells_ignored=self._cells_ignored,
            pdus_received=self._pdus_received,
            bytes_received=self._bytes_received,
            pdus_dropped=MappingProxyType(dict(self._dropped)),
        )
