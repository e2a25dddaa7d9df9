"""Faults a test puts on datagrams: scripted by number, or drawn from a seeded generator.

One :class:`Faults` decides what befalls each datagram in turn (numbered 1, 2, 3, ... in the
order they are sent); :class:`~stacklib.testing.link.Link` applies the decisions between two
sans-IO machines, :class:`FaultyService` (or :class:`FaultLayer` in a stack) under any layer.

The faults, by name: ``"drop"`` (lost), ``"duplicate"`` (or ``"dup"``: arrives twice),
``"reorder"`` (held back until the next datagram to the same peer has gone, then sent after
it; a datagram already held for that peer makes this one pass unharmed), ``"corrupt"`` (its
bytes changed by ``corrupter``: by default the first byte inverted, a header field a checked
format rejects) and ``"late:X"`` (arrives X seconds late, so later datagrams overtake it).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
import trio.lowlevel

from stacklib.services import DatagramService, Service
from stacklib.stack import Layer

__all__ = [
    "CORRUPT",
    "DROP",
    "DUPLICATE",
    "REORDER",
    "FaultLayer",
    "FaultParams",
    "Faults",
    "FaultyService",
    "invert_first_byte",
    "late_by",
]

DROP, DUPLICATE, REORDER, CORRUPT = "drop", "duplicate", "reorder", "corrupt"
_ALIASES = {"dup": DUPLICATE}
_LATE = "late:"


def invert_first_byte(datagram: bytes) -> bytes:
    """The default corruption: every bit of the first byte flipped (empty stays empty)."""
    return bytes([datagram[0] ^ 0xFF]) + datagram[1:] if datagram else datagram


def late_by(fault: str | None) -> float | None:
    """The delay of a ``"late:X"`` fault in seconds, or None for any other fault."""
    if fault is None or not fault.startswith(_LATE):
        return None
    return float(fault.removeprefix(_LATE))


def _canonical(fault: str) -> str:
    fault = _ALIASES.get(fault, fault)
    if fault in (DROP, DUPLICATE, REORDER, CORRUPT):
        return fault
    if fault.startswith(_LATE):
        try:
            seconds = float(fault.removeprefix(_LATE))
        except ValueError:
            seconds = -1.0
        if seconds >= 0:
            return fault
    raise ValueError(
        f"unknown fault {fault!r}: expected drop, duplicate (dup), reorder, corrupt or late:X "
        "with X >= 0 seconds"
    )


def _probability(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be a probability in [0, 1], got {value!r}")


@attrs.define
class Faults:
    """What befalls each datagram: ``script`` (datagram number -> fault name) first, else one
    draw of a generator seeded with ``seed`` against the rates, in the order drop, duplicate,
    reorder, corrupt, delay (``late`` seconds).  ``counts`` tallies what was applied.

    With only a script nothing is drawn; with rates, one number is drawn per datagram whether
    or not the script names it, so a script does not shift the random decisions.
    """

    script: Mapping[int, str] = attrs.field(factory=dict)
    drop: float = attrs.field(default=0.0, validator=_probability)
    duplicate: float = attrs.field(default=0.0, validator=_probability)
    reorder: float = attrs.field(default=0.0, validator=_probability)
    corrupt: float = attrs.field(default=0.0, validator=_probability)
    delay: float = attrs.field(default=0.0, validator=_probability)
    late: float = 1e-3
    seed: int = 0
    corrupter: Callable[[bytes], bytes] = invert_first_byte
    number: int = attrs.field(default=0, init=False)
    counts: Counter[str] = attrs.field(factory=Counter, init=False)
    _rng: random.Random = attrs.field(init=False)
    _bounds: tuple[float, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.script = {number: _canonical(fault) for number, fault in self.script.items()}
        rates = (self.drop, self.duplicate, self.reorder, self.corrupt, self.delay)
        if sum(rates) > 1.0 + 1e-12:
            raise ValueError(f"the fault rates add up to {sum(rates)}, more than 1")
        if self.delay and not self.late > 0:
            raise ValueError(f"late must be positive seconds, got {self.late!r}")
        bounds, total = [], 0.0
        for rate in rates:
            total += rate
            bounds.append(total)
        self._bounds = tuple(bounds)
        self._rng = random.Random(self.seed)

    def next(self) -> str | None:
        """The fault of the next datagram (None: it passes unharmed)."""
        self.number += 1
        fault = self.script.get(self.number)
        if self._bounds[-1] > 0.0:
            roll = self._rng.random()
            if fault is None:
                fault = self._drawn(roll)
        return fault

    def tally(self, fault: str | None) -> None:
        """Count a fault as applied (a ``late:X`` as ``"late"``); the link and the service
        call it for what they did, which differs from what was decided when a reorder finds
        a datagram already held (then it passes unharmed)."""
        if fault is not None:
            self.counts[fault if late_by(fault) is None else "late"] += 1

    def _drawn(self, roll: float) -> str | None:
        drop, duplicate, reorder, corrupt, delay = self._bounds
        if roll < drop:
            return DROP
        if roll < duplicate:
            return DUPLICATE
        if roll < reorder:
            return REORDER
        if roll < corrupt:
            return CORRUPT
        if roll < delay:
            return f"{_LATE}{self.late}"
        return None


class FaultyService(DatagramService):
    """A datagram service that puts :class:`Faults` on what is sent through it.

    Receiving is the service below's.  It lends nothing (:meth:`capability` is None): a layer
    above must send through it.  A ``late:X`` fault sends the datagram from a task of
    ``nursery``, so it needs one (:class:`FaultLayer` gives it its own).  ``sent`` counts the
    datagrams that went below (copies included).
    """

    def __init__(
        self,
        below: DatagramService,
        faults: Faults,
        *,
        nursery: trio.Nursery | None = None,
    ) -> None:
        self.below = below
        self.faults = faults
        self.nursery = nursery
        self.sent = 0
        self._held: dict[int, bytes] = {}

    def __repr__(self) -> str:
        return f"<FaultyService over {self.below!r}>"

    @property
    def peers(self) -> Sequence[int]:
        return self.below.peers

    @property
    def max_message(self) -> int:
        return self.below.max_message

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        datagram = bytes(data)
        fault = self.faults.next()
        out: list[bytes] = []
        if fault == DUPLICATE:
            out += [datagram, datagram]
        elif fault == REORDER and peer not in self._held:
            self._held[peer] = datagram
        elif fault == REORDER:
            fault = None  # one datagram held per peer: this one passes
            out.append(datagram)
        elif fault == CORRUPT:
            out.append(self.faults.corrupter(datagram))
        elif (delay := late_by(fault)) is not None:
            if self.nursery is None:
                raise RuntimeError(
                    "FaultyService: a late:X fault needs a nursery (pass nursery=, or use "
                    "FaultLayer)"
                )
            self.nursery.start_soon(self._send_later, peer, datagram, delay)
        elif fault != DROP:
            out.append(datagram)
        self.faults.tally(fault)
        if out and peer in self._held:
            out.append(self._held.pop(peer))
        for each in out:
            self.sent += 1
            await self.below.send(peer, each)
        if not out:
            await trio.lowlevel.checkpoint()

    async def _send_later(self, peer: int, datagram: bytes, delay: float) -> None:
        await trio.sleep(delay)
        self.sent += 1
        await self.below.send(peer, datagram)

    async def recv(self) -> tuple[int, bytes]:
        return await self.below.recv()

    def statistics(self) -> Mapping[str, object]:
        """The faults decided so far, by name, and ``sent``."""
        return {**self.faults.counts, "sent": self.sent}


@attrs.frozen
class FaultParams:
    """The parameters of a :class:`FaultLayer`: the :class:`Faults` it makes on opening."""

    script: Mapping[int, str] = attrs.field(factory=dict)
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    delay: float = 0.0
    late: float = 1e-3
    seed: int = 0

    def faults(self) -> Faults:
        return Faults(**attrs.asdict(self, recurse=False))


class FaultLayer(Layer[FaultParams]):
    """A layer that puts faults on the datagrams sent through it (not registered for recipes:
    a testing tool).  Each :meth:`open` makes fresh :class:`Faults` from the parameters, so
    two nodes get the same decisions unless their seeds differ; ``opened`` lists the
    services it made, for their counts."""

    name = "faults"
    requires = DatagramService
    provides = DatagramService
    Params = FaultParams

    def __init__(self, params: FaultParams | None = None) -> None:
        super().__init__(params)
        self.opened: list[FaultyService] = []

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[FaultyService]:
        self.require_below(below)
        assert isinstance(below, DatagramService)
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            service = FaultyService(below, self.params.faults(), nursery=nursery)
            self.opened.append(service)
            try:
                yield service
            except BaseException as error:  # re-raised as itself, not in an ExceptionGroup
                body_error = error
            finally:
                nursery.cancel_scope.cancel()
        if body_error is not None:
            raise body_error
