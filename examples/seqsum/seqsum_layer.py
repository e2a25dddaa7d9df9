"""seqsum: a stacklib layer from outside stacklib, shipped as its own distribution.

Every datagram gets a 6-byte header: a per-peer sequence number and a 16-bit ones'-complement
sum of the payload (RFC 1071).  The receiver drops and counts datagrams whose sum is wrong and
counts gaps and repeats in the numbering; it delivers everything else.  Three parts, as every
stacklib protocol: a construct format, a sans-IO core, a thin trio driver.

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                        sequence (u32)                         |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |          sum (u16)            |  payload ...
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, cast

import attrs
import construct

from stacklib.errors import FormatError
from stacklib.services import DatagramService, Service
from stacklib.stack import Layer
from stacklib.wire.registry import FormatInfo

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

HEADER = construct.Struct("seq" / construct.Int32ub, "sum" / construct.Int16ub)
HEADER_SIZE = HEADER.sizeof()


class SeqSumFormatError(FormatError):
    """Malformed seqsum datagram: too short for its header."""


@attrs.frozen
class Datagram:
    seq: int
    sum: int
    payload: bytes


def checksum(data: bytes | bytearray | memoryview) -> int:
    """The 16-bit ones'-complement sum of ``data`` (RFC 1071)."""
    data = bytes(data)
    if len(data) % 2:
        data += b"\0"
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def build(datagram: Datagram) -> bytes:
    return HEADER.build({"seq": datagram.seq, "sum": datagram.sum}) + datagram.payload


def parse(data: bytes) -> Datagram:
    if len(data) < HEADER_SIZE:
        raise SeqSumFormatError(f"{len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
    header = HEADER.parse(data[:HEADER_SIZE])
    return Datagram(header.seq, header.sum, bytes(data[HEADER_SIZE:]))


def datagrams() -> SearchStrategy[Datagram]:
    """A hypothesis strategy of datagrams (hypothesis is imported only when called)."""
    from hypothesis import strategies as st

    return st.builds(
        Datagram, st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFF), st.binary(max_size=64)
    )


#: For ``stacklib decode seqsum HEX`` and the conformance suite
#: (``stacklib.testing.check_format("seqsum")``): the ``stacklib.formats`` entry point.
FORMAT_INFO = FormatInfo(
    name="seqsum",
    parse=parse,
    describe=lambda d: [("seq", d.seq), ("sum", f"0x{d.sum:04x}"), ("payload", d.payload)],
    summary="the seqsum example layer's datagram",
    build=build,
    strategy=datagrams,
    error=SeqSumFormatError,
)


class SeqSumMachine:
    """The sans-IO core: numbers what it sends, checks what it receives.  No I/O, no clock."""

    def __init__(self, check: bool) -> None:
        self.check = check
        self.next_seq: dict[int, int] = {}
        self.expected: dict[int, int] = {}
        self.counters: Counter[str] = Counter()

    def wrap(self, peer: int, payload: bytes | bytearray | memoryview) -> bytes:
        seq = self.next_seq.get(peer, 0)
        self.next_seq[peer] = (seq + 1) & 0xFFFFFFFF
        self.counters["sent"] += 1
        return build(Datagram(seq, checksum(payload), bytes(payload)))

    def receive(self, peer: int, data: bytes) -> bytes | None:
        """The payload to deliver, or None when the datagram is dropped (counted)."""
        try:
            datagram = parse(data)
        except SeqSumFormatError:
            self.counters["dropped_short"] += 1
            return None
        if self.check and checksum(datagram.payload) != datagram.sum:
            self.counters["dropped_bad_sum"] += 1
            return None
        expected = self.expected.get(peer, 0)
        if datagram.seq != expected:
            self.counters["gaps" if datagram.seq > expected else "repeats"] += 1
        self.expected[peer] = (datagram.seq + 1) & 0xFFFFFFFF
        self.counters["delivered"] += 1
        return datagram.payload


@attrs.frozen
class SeqSumParams:
    #: Verify the sum of every datagram received (drop those that fail).
    check: bool = True


class SeqSumService(DatagramService):
    """The driver: wraps on send, unwraps on receive, over any datagram service."""

    def __init__(self, below: DatagramService, params: SeqSumParams) -> None:
        self.below = below
        self.machine = SeqSumMachine(params.check)

    @property
    def peers(self) -> Sequence[int]:
        return self.below.peers

    @property
    def max_message(self) -> int:
        return self.below.max_message - HEADER_SIZE

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        await self.below.send(peer, self.machine.wrap(peer, data))

    async def recv(self) -> tuple[int, bytes]:
        while True:
            peer, data = await self.below.recv()
            payload = self.machine.receive(peer, data)
            if payload is not None:
                return peer, payload

    def statistics(self) -> Mapping[str, object]:
        return dict(self.machine.counters)


class SeqSumLayer(Layer[SeqSumParams]):
    """Sequence numbers and a checksum on every datagram (``kind = "seqsum"``)."""

    name = "seqsum"
    requires = DatagramService
    provides = DatagramService
    Params = SeqSumParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[SeqSumService]:
        self.require_below(below)
        yield SeqSumService(cast(DatagramService, below), self.params)
