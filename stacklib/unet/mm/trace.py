"""Buffer traces: every send and receive buffer of a run, for the TLB simulation (paper 002 §6.2).

Paper 002 §6.2 instrumented Split-C programs and the Linux socket layer to record "buffer address
and length for all ... send and receive operations" and fed the traces to a TLB simulator.  A
stacklib trace records the same: per buffer an address, a length, a direction and the process
and endpoint that owns it.

File layout (big-endian; the construct definitions below are the specification)::

    Header, 8 bytes:
     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                      magic "UMTR"                             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          version (1)          |           reserved            |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

    Then records of 16 bytes each, to the end of the file:
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |   direction   |   endpoint    |             node              |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |            process            |        length (high 16)       |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |        length (low 16)        |     address (48 bits) ...     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                          ... address                          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

    direction: 0 transmit, 1 receive.  node: the host whose NI (and so whose TLB) handled the
    buffer.  process: a number per process of the run (first seen, first numbered), the TLB's
    process id.  endpoint: the endpoint's number within its process.  length > 0 (32 bits).
    address: the buffer's virtual address in the process (48 bits, as on x86-64).

A recorded U-Net run names buffers by segment offset; the recorder places endpoint ``e`` of a
process at virtual address ``e << 32``, so address = ``(e << 32) + offset``.

Parsing (:func:`parse_trace`): integrity first (the header present with its magic and version:
otherwise :class:`TraceFormatError`), then each record's sanity (a known direction, a non-zero
length); a bad record, or a truncated last one, is dropped and counted, never raised.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import construct

from stacklib.errors import FormatError
from stacklib.wire.codec import derive_codec

if TYPE_CHECKING:
    from stacklib.unet.endpoint import Endpoint

__all__ = [
    "TRACE_HEADER",
    "TRACE_RECORD",
    "ParsedTrace",
    "TraceFormatError",
    "TraceRecord",
    "TraceRecorder",
    "build_trace",
    "parse_trace",
    "parse_trace_reference",
    "trace_records",
]

MAGIC = b"UMTR"
VERSION = 1


class TraceFormatError(FormatError):
    """Not a buffer trace: a missing or wrong header."""


class TraceDirection(enum.IntEnum):
    TRANSMIT = 0
    RECEIVE = 1


TRACE_HEADER = construct.Struct(
    "magic" / construct.Const(MAGIC),
    "version" / construct.Int16ub,
    "_reserved" / construct.Int16ub,
)
TRACE_RECORD = construct.Struct(
    "direction" / construct.Int8ub,
    "endpoint" / construct.Int8ub,
    "node" / construct.Int16ub,
    "process" / construct.Int16ub,
    "length" / construct.Int32ub,
    "address" / construct.BytesInteger(6),
)
_HEADER = derive_codec(TRACE_HEADER, TraceFormatError)
_RECORD = derive_codec(TRACE_RECORD, TraceFormatError)
HEADER_SIZE = _HEADER.size
RECORD_SIZE = _RECORD.size


@attrs.frozen
class TraceRecord:
    """One buffer: ``direction`` 0 transmit / 1 receive."""

    direction: int
    process: int
    endpoint: int
    address: int
    length: int
    node: int = 0


@attrs.frozen
class ParsedTrace:
    """The records of a trace and how many bad ones were dropped."""

    records: tuple[TraceRecord, ...]
    dropped: int


def build_trace(records: Iterable[TraceRecord]) -> bytes:
    """The bytes of a trace file; a field out of range raises ValueError naming it."""
    out = bytearray(_HEADER.pack(VERSION))
    for r in records:
        if r.direction not in (0, 1):
            raise ValueError(f"direction must be 0 or 1, not {r.direction}")
        if r.length <= 0:
            raise ValueError(f"length must be > 0, not {r.length}")
        out += _RECORD.pack(r.direction, r.endpoint, r.node, r.process, r.length, r.address)
    return bytes(out)


def _header(data: bytes | bytearray | memoryview) -> None:
    if len(data) < HEADER_SIZE:
        raise TraceFormatError(f"trace: truncated header ({len(data)} bytes)")
    (version,) = _HEADER.unpack(data)
    if version != VERSION:
        raise TraceFormatError(f"trace: unknown version {version}")


def parse_trace(data: bytes | bytearray | memoryview) -> ParsedTrace:
    """Parse a trace file (fast path); see the module docstring for what is dropped."""
    _header(data)
    records: list[TraceRecord] = []
    dropped = 0
    unpack = _RECORD.unpack
    end = len(data) - (len(data) - HEADER_SIZE) % RECORD_SIZE
    if end != len(data):
        dropped += 1  # a truncated last record
    for offset in range(HEADER_SIZE, end, RECORD_SIZE):
        direction, endpoint, node, process, length, address = unpack(data, offset)
        if direction > 1 or length == 0:
            dropped += 1
            continue
        records.append(TraceRecord(direction, process, endpoint, address, length, node))
    return ParsedTrace(tuple(records), dropped)


def parse_trace_reference(data: bytes) -> ParsedTrace:
    """:func:`parse_trace` through the construct definitions (for tests and ``decode``)."""
    try:
        header = TRACE_HEADER.parse(data)
    except construct.ConstructError as error:
        raise TraceFormatError(f"trace: bad header: {error}") from None
    if header.version != VERSION:
        raise TraceFormatError(f"trace: unknown version {header.version}")
    records: list[TraceRecord] = []
    dropped = 0
    body = data[HEADER_SIZE:]
    for offset in range(0, len(body), RECORD_SIZE):
        chunk = body[offset : offset + RECORD_SIZE]
        if len(chunk) < RECORD_SIZE:
            dropped += 1
            continue
        r = TRACE_RECORD.parse(chunk)
        if r.direction > 1 or r.length == 0:
            dropped += 1
            continue
        records.append(TraceRecord(r.direction, r.process, r.endpoint, r.address, r.length, r.node))
    return ParsedTrace(tuple(records), dropped)


def trace_records() -> Any:
    """A hypothesis strategy for valid trace records (hypothesis is imported lazily)."""
    from hypothesis import strategies as st

    return st.builds(
        TraceRecord,
        direction=st.integers(0, 1),
        process=st.integers(0, 0xFFFF),
        endpoint=st.integers(0, 0xFF),
        address=st.integers(0, 2**48 - 1),
        length=st.integers(1, 2**32 - 1),
        node=st.integers(0, 0xFFFF),
    )


class TraceRecorder:
    """Collects the buffers NIs touch while installed (:meth:`installed`)."""

    def __init__(self) -> None:
        self.records: list[TraceRecord] = []
        self._processes: dict[Hashable, int] = {}
        self._nodes: dict[str, int] = {}
        self._endpoints: dict[object, tuple[int, int, int]] = {}

    def __call__(
        self, endpoint: Endpoint, direction: int, fragments: Sequence[tuple[int, int]]
    ) -> None:
        """The NI hook: ``endpoint`` transmits from / receives into ``fragments``."""
        ids = self._endpoints.get(endpoint)
        if ids is None:
            node = self._nodes.setdefault(endpoint.ni.name, len(self._nodes))
            # The NI's name with the owner tells processes on different hosts apart.
            owner_key = (endpoint.ni.name, endpoint.owner)
            process = self._processes.setdefault(owner_key, len(self._processes))
            number = sum(1 for _, p, _ in self._endpoints.values() if p == process)
            ids = self._endpoints[endpoint] = (node, process, number)
        node, process, number = ids
        base = number << 32
        append = self.records.append
        for offset, length in fragments:
            if length > 0:
                append(TraceRecord(direction, process, number, base + offset, length, node))

    @contextmanager
    def installed(self) -> Iterator[TraceRecorder]:
        """Record the buffers of every NI made inside the ``with`` block."""
        from stacklib.unet.ni import install_buffer_trace

        previous = install_buffer_trace(self)
        try:
            yield self
        finally:
            install_buffer_trace(previous)

    def to_bytes(self) -> bytes:
        return build_trace(self.records)
