"""Simulated networks in virtual time: link technologies, switches, hubs, and injected faults.

A :class:`Fabric` joins the NIs of a simulated cluster (paper 000 §4.2: eight SPARCstations on a
Fore ASX-200 switch; paper 003 §4.1: Pentiums on a Fast Ethernet hub or switch, or on ATM):

* ``switch``: each NI has a full-duplex link to the switch (an uplink and a downlink resource);
  the switch forwards after a latency, cut-through per unit (an ATM cell switch) or after the
  whole frame (a store-and-forward Ethernet switch), and its output port is the downlink, so
  two senders to one receiver queue there;
* ``hub``: one shared half-duplex medium for every NI (a Fast Ethernet repeater hub);
* ``direct``: two NIs back to back.

Link technologies (:mod:`stacklib.transports.sim.links`) turn a message into what the wire
carries: AAL5 cells, one Ethernet frame with preamble and inter-frame gap, or Myrinet bytes.
Faults (:class:`~stacklib.transports.sim.params.FaultParams`: loss and corruption per unit,
duplication and reordering per message) are drawn from the world's seeded random streams, so a
recipe and seed give the same faults every run.  Corruption flips real bits: ``corrupt`` on the
wire (the packet carries the flipped bit offsets, and the receiving NI's link check, the AAL5
CRC-32 or the Ethernet FCS, runs on them), ``corrupt_undetected`` in the data itself, past
every link check (delivered; the transports' checksums must catch it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Literal

import attrs

from stacklib.compiled import mypyc_attr
from stacklib.sim import Resource, World
from stacklib.sim.pipeline import delay, stage
from stacklib.transports.sim.links import (
    AAL5_TRAILER,
    CELL_PAYLOAD,
    LinkTech,
    WireShape,
    flip_bits,
)
from stacklib.transports.sim.params import FaultParams

if TYPE_CHECKING:
    from stacklib.transports.sim.ni import SimNI


# ---------------------------------------------------------------------------- packets


@attrs.define(slots=True, eq=False)
class Packet:
    """One message in flight on the fabric."""

    source: str
    destination: str
    rx_key: Hashable
    payload: bytes
    dest_offset: int | None
    shape: WireShape
    #: Link-level tag for captures (ATM VCI, U-Net/FE port).
    tag: Hashable = None
    #: Hit by a wire error that the receiving NI's link check is to judge.
    corrupted: bool = False
    #: The flipped bits of that error: offsets into the link's protected bytes
    #: (:meth:`~stacklib.transports.sim.links.LinkTech.protected_bytes`); empty if the error
    #: hit framing outside them (always caught).
    flips: tuple[int, ...] = ()


@attrs.frozen
class FabricStatistics:
    """Messages carried and faults injected on a fabric."""

    carried: int
    lost: int
    corrupted: int  #: messages with wire errors (for the receiving NI's link check)
    corrupted_undetected: int  #: messages delivered with flipped data bits
    duplicated: int
    reordered: int
    units: int
    wire_bytes: int


Tap = Callable[[float, Packet], None]


@mypyc_attr(allow_interpreted_subclasses=True)
class Fabric:
    """Links and a switch or hub joining simulated NIs.  See the module docstring."""

    def __init__(
        self,
        world: World,
        tech: LinkTech,
        *,
        topology: Literal["switch", "hub", "direct"] = "switch",
        latency: float = 0.0,
        store_and_forward: bool = False,
        propagation: float = 0.0,
        faults: FaultParams | None = None,
        name: str = "fabric",
    ) -> None:
        if latency < 0 or propagation < 0:
            raise ValueError("latency and propagation must not be negative")
        self.world = world
        self.tech = tech
        self.topology = topology
        #: Switch forwarding latency, or hub repeater latency.
        self.latency = latency
        self.store_and_forward = store_and_forward
        self.propagation = propagation
        self.faults = faults if faults is not None else FaultParams()
        #: The last ``faults`` object seen to inject nothing (frozen, so identity is enough):
        #: the per-message test without calling the ``any`` property.
        self._clean: FaultParams | None = None
        self.name = name
        self.nis: dict[str, SimNI] = {}
        self._medium = world.resource(f"{name}:medium")
        self._rng = world.rng(f"faults:{name}")
        #: Which bits corruption flips: a stream of its own, so that enabling corruption
        #: leaves the other faults' draws as they were.
        self._bits = world.rng(f"corruption:{name}")
        self._vcs: dict[tuple[object, object], int] = {}
        #: Callbacks seeing every delivered packet with its arrival time (captures).
        self.taps: list[Tap] = []
        self.carried = self.lost = self.corrupted = self.duplicated = self.reordered = 0
        self.corrupted_undetected = 0
        self.units = self.wire_bytes = 0

    def __repr__(self) -> str:
        return f"<Fabric {self.name} {self.topology} {self.tech.name}>"

    def attach(self, ni: SimNI, link: LinkTech | None = None) -> None:
        """Connect ``ni`` with its own link to the switch (or onto the hub).

        ``link`` gives this NI's link a technology of its own (paper 003 §4.4.2 measured
        bandwidth from an OC-3 sender to a TAXI receiver); by default the fabric's.
        """
        if ni.name in self.nis:
            raise ValueError(f"{ni.name} is already attached to {self!r}")
        if self.topology == "direct" and len(self.nis) >= 2:
            raise ValueError("a direct link joins exactly two NIs")
        self.nis[ni.name] = ni
        ni.link = link if link is not None else self.tech
        ni.uplink = self.world.resource(f"{self.name}:{ni.name}:up")
        ni.downlink = self.world.resource(f"{self.name}:{ni.name}:down")
        ni.egress_link = self.egress(ni)

    def egress(self, ni: SimNI) -> Resource:
        """The first shared or serial resource a sender's frames queue on: its own link to
        the switch, or the hub's medium."""
        return self._medium if self.topology == "hub" else ni.uplink

    def vc(self, source: object, destination: object) -> int:
        """The virtual circuit the OS service sets up from ``source`` to ``destination``.

        Paper 000 §4.2.2: an ATM channel is a VCI pair; allocating both directions from one
        network-wide table stands in for the switch signalling the OS service performs.
        """
        key = (source, destination)
        vci = self._vcs.get(key)
        if vci is None:
            vci = 32 + len(self._vcs)  # VCIs 0-31 are reserved (ITU-T I.361)
            self._vcs[key] = vci
        return vci

    # ------------------------------------------------------------------------ carrying

    def transmit(self, packet: Packet, first_out: float, last_out: float) -> None:
        """A sender NI puts ``packet`` on its link: first unit at ``first_out``, last at
        ``last_out``.  The link to the switch belongs to the sender alone, so it is reserved
        now; shared stages are reserved when the first unit reaches them."""
        self.transmit_from(self.nis[packet.source], packet, first_out, last_out)

    def transmit_from(
        self, source: SimNI, packet: Packet, first_out: float, last_out: float
    ) -> None:
        """:meth:`transmit` from the NI ``source`` (the sender's own call: no name look-up)."""
        shape = packet.shape
        self.units += shape.units
        self.wire_bytes += shape.wire_bytes
        if self.topology == "hub":
            self.world.call_at(first_out, self._on_medium, packet, first_out, last_out)
            return
        up = source.wire_shape(len(packet.payload)) if source.link is not self.tech else shape
        first, last = stage(source.uplink, first_out, last_out, up.units, up.per_unit, 0.0, up.tail)
        # delay(first, last, self.propagation), inlined: the same two additions.
        propagation = self.propagation
        first, last = first + propagation, last + propagation
        if self.topology == "direct":
            self._arrive(packet, first, last)
            return
        self.world.call_at(first, self._on_switch, packet, first, last)

    def _on_switch(self, packet: Packet, first_in: float, last_in: float) -> None:
        faults = self.faults
        if self.store_and_forward:
            first_in = last_in
        # delay(first_in, last_in, self.latency) and delay(first, last, self.propagation)
        # below, inlined: the same additions.
        latency = self.latency
        first_in, last_in = first_in + latency, last_in + latency
        destination = self.nis[packet.destination]
        # The switch's output port is the receiver's link, at the receiver's link rate.
        shape = destination.wire_shape(len(packet.payload))
        propagation = self.propagation
        if faults is self._clean or not faults.any:
            self._clean = faults
            # Without faults, _faults returns [packet] and draws nothing, and _arrive reorders
            # nothing: one copy, handed on here (_arrive without its fault branch).
            units, per_unit, tail = shape.units, shape.per_unit, shape.tail
            first, last = stage(destination.downlink, first_in, last_in, units, per_unit, 0.0, tail)
            first, last = first + propagation, last + propagation
            self.carried += 1
            if self.taps:
                for tap in self.taps:
                    tap(last, packet)
            self.world.call_at(first, destination.arrive, packet, first, last)
            return
        for copy in self._faults(packet):
            first, last = stage(
                destination.downlink,
                first_in,
                last_in,
                shape.units,
                shape.per_unit,
                tail=shape.tail,
            )
            self._arrive(copy, first + propagation, last + propagation)

    def _on_medium(self, packet: Packet, first_out: float, last_out: float) -> None:
        shape = packet.shape
        # A frame occupies the shared medium whether or not it survives.
        first, last = stage(
            self._medium, first_out, last_out, shape.units, shape.per_unit, tail=shape.tail
        )
        copies = self._faults(packet)
        for index, copy in enumerate(copies):
            if index:  # a duplicate is sent again on the medium after the original
                first, last = stage(
                    self._medium, last, last, shape.units, shape.per_unit, tail=shape.tail
                )
            self._arrive(copy, *delay(first, last, self.latency + self.propagation))

    def _faults(self, packet: Packet) -> list[Packet]:
        """Apply injected faults: the copies of ``packet`` that go on (none if it is lost, two
        if it is duplicated; a duplicate crosses the rest of the network after the original)."""
        faults = self.faults
        if not faults.any:
            return [packet]
        random = self._rng.random
        units = packet.shape.units
        if faults.loss and random() >= (1.0 - faults.loss) ** units:
            self.lost += 1
            return []
        if faults.corrupt and random() >= (1.0 - faults.corrupt) ** units:
            self.corrupted += 1
            packet.corrupted = True
            packet.flips = self._flips(self.tech.protected_bytes(len(packet.payload)), units)
        undetected = faults.corrupt_undetected
        if undetected and packet.payload and random() >= (1.0 - undetected) ** units:
            self.corrupted_undetected += 1
            packet.payload = flip_bits(packet.payload, self._flips(len(packet.payload), 1))
        if faults.duplicate and random() < faults.duplicate:
            self.duplicated += 1
            return [packet, attrs.evolve(packet)]
        return [packet]

    def _flips(self, span: int, units: int) -> tuple[int, ...]:
        """One to three seeded bit offsets within one of ``units`` equal parts of ``span``
        bytes (the unit the error hit: a cell of the AAL5 PDU, a frame)."""
        if span <= 0:
            return ()
        bits = self._bits
        size = span // units if span >= units else span
        base = bits.randrange(span // size) * size * 8
        chosen = {base + bits.randrange(size * 8) for _ in range(bits.randint(1, 3))}
        return tuple(sorted(chosen))

    def _arrive(self, packet: Packet, first_in: float, last_in: float) -> None:
        faults = self.faults
        if faults.reorder and self._rng.random() < faults.reorder:
            self.reordered += 1
            held = faults.reorder_delay_us * 1e-6
            first_in, last_in = first_in + held, last_in + held
        self.carried += 1
        destination = self.nis[packet.destination]
        if self.taps:
            for tap in self.taps:
                tap(last_in, packet)
        self.world.call_at(first_in, destination.arrive, packet, first_in, last_in)

    def statistics(self) -> FabricStatistics:
        return FabricStatistics(
            carried=self.carried,
            lost=self.lost,
            corrupted=self.corrupted,
            corrupted_undetected=self.corrupted_undetected,
            duplicated=self.duplicated,
            reordered=self.reordered,
            units=self.units,
            wire_bytes=self.wire_bytes,
        )


def link_check_fails(packet: Packet, link: LinkTech) -> bool:
    """The receiving NI's link check on a ``packet`` hit by a wire error, run on its flipped
    bits: True if it catches the error (the NI drops the message).  If the error slips
    through, ``packet`` now carries the bytes the check let pass and is no longer marked."""
    data = link.check(packet.payload, packet.flips) if packet.flips else None
    if data is None:
        return True
    packet.payload = data
    packet.corrupted = False
    return False


def cells(message_bytes: int) -> int:
    """AAL5 cells for a message (payload plus the 8-byte trailer, in 48-byte cells)."""
    return max(1, math.ceil((message_bytes + AAL5_TRAILER) / CELL_PAYLOAD))
