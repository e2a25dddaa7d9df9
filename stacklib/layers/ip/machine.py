"""Sans-IO parts of IP: fragmentation, fragment reassembly and the ARP cache.  No I/O, no
clock: every input takes ``now`` (seconds), timers are numbers reported by ``get_timer()``.

**Fragmentation** (RFC 791 §2.3, §3.2).  :func:`fragment` cuts a datagram larger than the MTU
into fragments whose data lengths are multiples of 8 (the offset's unit), all but the last with
MF set; options with the "copied" flag go into every fragment, the others into the first only.
A datagram with DF set that does not fit is refused: :class:`FragmentationNeeded` names the
size and the MTU (what a router would report with ICMP "fragmentation needed", RFC 1191).
Paper 000 §7.5's IP over U-Net never fragments (its 9 KB MTU made that unnecessary); stacklib
fragments what exceeds the MTU so that a real host's 4 KB ping over a 1500-byte Ethernet is
answered, while packets that fit take the unfragmented fast path unchanged.

**Reassembly** (RFC 791 §3.2, RFC 815).  The receive side "is liberal in the messages that it
accepts" (paper 000 §7.5), so a peer's fragments are put back together.  Fragments are keyed by
(source, destination, protocol, identification).  A datagram's first fragment starts its timer
(``timeout``, default 30 s as Linux's ``ipfrag_time``); if it is not complete by then it is dropped
and counted (``timeouts``).  Duplicates are ignored; overlapping fragments are accepted when the
overlapping bytes agree and the whole datagram is dropped when they do not (``overlap_conflicts``):
with two different versions of the same bytes there is no right answer, and this is the ambiguity
that teardrop-style attacks and RFC 5722 are about.  Limits bound memory: ``max_datagrams`` in
progress (the oldest is evicted) and ``max_bytes`` buffered in all.

**ARP** (RFC 826, with the timers of RFC 1122 §2.3.2.1 left to parameters).  :class:`ArpCache`
maps IPv4 addresses to MACs.  :meth:`ArpCache.resolve` either returns the MAC or queues the
packet (``max_pending`` per address; the oldest is dropped beyond that) and sends a broadcast
request, retried every ``retry_interval`` up to ``max_retries`` times before the queue is
dropped (``unresolved``).  Entries expire ``entry_lifetime`` after they were last confirmed.
Every ARP packet's sender is learned if it is already in the table (RFC 826's "merge"), and
added when the packet is addressed to us; requests for our address are answered.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

import attrs

from stacklib.errors import LocalProtocolError
from stacklib.layers.ip.wire import (
    BROADCAST_MAC,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    IPV4_HEADER_SIZE,
    MAX_PACKET,
    ArpOperation,
    ArpPacket,
    Ipv4Packet,
    build_arp,
)

__all__ = [
    "ArpCache",
    "ArpStatistics",
    "FragmentationNeeded",
    "Reassembler",
    "ReassemblyStatistics",
    "Transmit",
    "fragment",
]

_Key = tuple[str, str, int, int]


MIN_MTU = 68  #: RFC 791: every module must forward a 68-byte datagram without fragmenting


class FragmentationNeeded(LocalProtocolError):
    """A datagram with DF set is larger than the MTU (RFC 791 §3.2; ICMP type 3 code 4)."""

    def __init__(self, size: int, mtu: int, dst: str) -> None:
        self.size = size
        self.mtu = mtu
        super().__init__(
            f"IP: datagram of {size} bytes to {dst} exceeds the MTU of {mtu} bytes and has "
            "DF (don't fragment) set: fragmentation needed"
        )


def _copied_options(options: bytes) -> bytes:
    """The options RFC 791 copies into every fragment (type's top bit set), padded to words."""
    kept = bytearray()
    i = 0
    while i < len(options):
        kind = options[i]
        if kind == 0:  # end of option list
            break
        if kind == 1:  # no-operation: one byte
            i += 1
            continue
        length = options[i + 1] if i + 1 < len(options) else 0
        if length < 2:
            break  # malformed: copy nothing further
        if kind & 0x80:
            kept += options[i : i + length]
        i += length
    kept += bytes(-len(kept) % 4)
    return bytes(kept)


def fragment(packet: Ipv4Packet, mtu: int) -> list[Ipv4Packet]:
    """``packet`` as fragments of at most ``mtu`` bytes each, header included (RFC 791 §3.2).

    A packet that fits is returned alone, unchanged.  Each fragment keeps the datagram's
    identification; data is cut at multiples of 8 bytes.  A fragment of a fragment keeps the
    offsets and the MF of the original.  Raises :class:`FragmentationNeeded` if DF is set and
    the packet does not fit, ValueError if ``mtu`` is below RFC 791's 68 bytes.
    """
    if mtu < MIN_MTU:
        raise ValueError(f"an IPv4 MTU is at least {MIN_MTU} bytes, got {mtu}")
    if packet.total_length <= mtu:
        return [packet]
    if packet.dont_fragment:
        raise FragmentationNeeded(packet.total_length, mtu, packet.dst)
    payload = packet.payload
    later_options = _copied_options(packet.options)
    pieces: list[Ipv4Packet] = []
    start = 0
    while start < len(payload):
        options = packet.options if start == 0 else later_options
        room = (mtu - IPV4_HEADER_SIZE - len(options)) & ~7
        end = min(start + room, len(payload))
        last = end == len(payload)
        pieces.append(
            attrs.evolve(
                packet,
                payload=payload[start:end],
                options=options,
                fragment_offset=packet.fragment_offset + start,
                more_fragments=packet.more_fragments or not last,
            )
        )
        start = end
    return pieces


@attrs.frozen
class ReassemblyStatistics:
    """What the reassembler has seen (a snapshot)."""

    fragments: int
    reassembled: int
    duplicates: int
    overlaps: int  #: overlapping fragments whose common bytes agreed (accepted)
    overlap_conflicts: int  #: datagrams dropped because overlapping bytes disagreed
    timeouts: int  #: datagrams dropped incomplete when their timer expired
    evicted: int  #: datagrams dropped to stay within max_datagrams / max_bytes
    too_long: int  #: fragments reaching past 65535 bytes (RFC 791's limit), datagram dropped
    bad_fragments: int  #: a non-last fragment whose length is not a multiple of 8, etc.
    in_progress: int
    buffered_bytes: int


class _Partial:
    """One datagram being reassembled."""

    __slots__ = ("buffer", "deadline", "first", "pieces", "received", "total")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.buffer = bytearray()
        self.pieces: list[tuple[int, int]] = []  # disjoint, sorted (start, end) ranges held
        self.total: int | None = None  # known once the last fragment (MF=0) arrived
        self.first: Ipv4Packet | None = None  # the offset-0 fragment: its header is kept
        self.received = 0  # bytes held

    def complete(self) -> bool:
        return self.total is not None and self.pieces == [(0, self.total)]


class Reassembler:
    """Puts fragmented IPv4 datagrams back together (see the module docstring)."""

    def __init__(
        self, *, timeout: float = 30.0, max_datagrams: int = 64, max_bytes: int = 1 << 20
    ) -> None:
        if not timeout > 0 or max_datagrams < 1 or max_bytes < 1:
            raise ValueError("timeout, max_datagrams and max_bytes must be positive")
        self.timeout = timeout
        self.max_datagrams = max_datagrams
        self.max_bytes = max_bytes
        self._partials: OrderedDict[_Key, _Partial] = OrderedDict()
        self._bytes = 0
        self._counts = dict.fromkeys(
            (
                "fragments",
                "reassembled",
                "duplicates",
                "overlaps",
                "overlap_conflicts",
                "timeouts",
                "evicted",
                "too_long",
                "bad_fragments",
            ),
            0,
        )

    def receive(self, fragment: Ipv4Packet, now: float) -> Ipv4Packet | None:
        """Add ``fragment``; return the whole datagram if this completed it, else None.

        A packet that is not a fragment is returned unchanged.  Bad fragments are counted and
        dropped, never raised.
        """
        if not fragment.is_fragment:
            return fragment
        counts = self._counts
        counts["fragments"] += 1
        start = fragment.fragment_offset
        data = fragment.payload
        end = start + len(data)
        key = (fragment.src, fragment.dst, fragment.protocol, fragment.identification)
        if end + fragment.header_length > MAX_PACKET:
            counts["too_long"] += 1
            self._drop(key)
            return None
        if fragment.more_fragments and (len(data) & 7 or not data):
            counts["bad_fragments"] += 1
            return None
        partial = self._partials.get(key)
        if partial is None:
            self._expire(now)
            partial = self._partials[key] = _Partial(now + self.timeout)
            while len(self._partials) > self.max_datagrams:
                self._evict()
        if not self._consistent_end(partial, fragment.more_fragments, end):
            counts["bad_fragments"] += 1
            self._drop(key)
            return None
        overlap = self._overlap(partial, start, end, data)
        if overlap == "conflict":
            counts["overlap_conflicts"] += 1
            self._drop(key)
            return None
        if overlap == "duplicate":
            counts["duplicates"] += 1
            return None
        if overlap == "overlap":
            counts["overlaps"] += 1
        self._store(partial, start, end, data)
        if start == 0:
            partial.first = fragment
        if not fragment.more_fragments:
            partial.total = end
        while self._bytes > self.max_bytes and self._partials:
            oldest = next(iter(self._partials))
            if oldest == key and len(self._partials) == 1:
                break  # one datagram alone may use the whole budget
            self._evict()
        if key not in self._partials or not partial.complete():
            return None
        self._drop(key)
        counts["reassembled"] += 1
        first = partial.first
        if first is None:  # complete implies offset 0 arrived; kept for the type checker
            return None
        return attrs.evolve(
            first,
            payload=bytes(partial.buffer[: partial.total]),
            more_fragments=False,
            fragment_offset=0,
        )

    def get_timer(self) -> float | None:
        """The earliest reassembly deadline, or None."""
        if not self._partials:
            return None
        return min(p.deadline for p in self._partials.values())

    def handle_timer(self, now: float) -> list[Ipv4Packet]:
        """Drop the datagrams whose time is up; return their first fragments, where one had
        arrived (RFC 792: the cue for an ICMP Time Exceeded, code 1)."""
        return self._expire(now)

    def statistics(self) -> ReassemblyStatistics:
        return ReassemblyStatistics(
            **self._counts, in_progress=len(self._partials), buffered_bytes=self._bytes
        )

    # ------------------------------------------------------------------ helpers

    def _expire(self, now: float) -> list[Ipv4Packet]:
        expired: list[Ipv4Packet] = []
        for key in [k for k, p in self._partials.items() if p.deadline <= now]:
            first = self._partials[key].first
            if first is not None:
                expired.append(first)
            self._counts["timeouts"] += 1
            self._drop(key)
        return expired

    def _evict(self) -> None:
        key = next(iter(self._partials))
        self._counts["evicted"] += 1
        self._drop(key)

    def _drop(self, key: _Key) -> None:
        partial = self._partials.pop(key, None)
        if partial is not None:
            self._bytes -= partial.received

    @staticmethod
    def _consistent_end(partial: _Partial, more: bool, end: int) -> bool:
        """Linux's rule: a last fragment may not cut off bytes already held or move the end;
        no fragment may reach past a known end."""
        held_end = partial.pieces[-1][1] if partial.pieces else 0
        if not more:
            return end >= held_end and (partial.total is None or end == partial.total)
        return partial.total is None or end <= partial.total

    @staticmethod
    def _overlap(partial: _Partial, start: int, end: int, data: bytes) -> str:
        """ "none", "duplicate" (all bytes held and equal), "overlap" (some held, equal) or
        "conflict" (some held bytes differ)."""
        if start == end:
            return "none"
        covered = 0
        buffer = partial.buffer
        for lo, hi in partial.pieces:
            a, b = max(lo, start), min(hi, end)
            if a >= b:
                continue
            if buffer[a:b] != data[a - start : b - start]:
                return "conflict"
            covered += b - a
        if covered == 0:
            return "none"
        return "duplicate" if covered == end - start else "overlap"

    def _store(self, partial: _Partial, start: int, end: int, data: bytes) -> None:
        buffer = partial.buffer
        if len(buffer) < end:
            buffer.extend(bytes(end - len(buffer)))
        buffer[start:end] = data
        merged: list[tuple[int, int]] = []
        new = (start, end)
        for piece in sorted([*partial.pieces, new]):
            if merged and piece[0] <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], piece[1]))
            else:
                merged.append(piece)
        held = sum(hi - lo for lo, hi in merged)
        self._bytes += held - partial.received
        partial.received = held
        partial.pieces = merged


# --- ARP ---------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Transmit:
    """A frame to send: to MAC ``dst`` with ``ethertype``, carrying ``payload``."""

    dst: bytes
    ethertype: int
    payload: bytes


@attrs.frozen
class ArpStatistics:
    """What the ARP cache has seen (a snapshot)."""

    requests_sent: int
    replies_sent: int
    requests_received: int
    replies_received: int
    learned: int
    hits: int
    misses: int
    unresolved: int  #: packets dropped because their address never resolved
    pending_overflow: int  #: packets dropped because max_pending were already waiting
    ignored: int  #: ARP packets neither for us nor about a known address
    entries: int


class _Pending:
    __slots__ = ("deadline", "packets", "retries")

    def __init__(self, deadline: float) -> None:
        self.packets: deque[bytes] = deque()
        self.retries = 0
        self.deadline = deadline


class ArpCache:
    """IPv4-to-MAC resolution for one interface (see the module docstring)."""

    def __init__(
        self,
        mac: bytes,
        address: str,
        *,
        entry_lifetime: float = 60.0,
        retry_interval: float = 1.0,
        max_retries: int = 3,
        max_pending: int = 16,
        max_entries: int = 1024,
    ) -> None:
        if len(mac) != 6:
            raise ValueError(f"a MAC address is 6 bytes, got {len(mac)}")
        self.mac = bytes(mac)
        self.address = address
        self.entry_lifetime = entry_lifetime
        self.retry_interval = retry_interval
        self.max_retries = max_retries
        self.max_pending = max_pending
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()  # ip -> mac, expiry
        self._pending: dict[str, _Pending] = {}
        self._outbox: list[Transmit] = []
        self._counts = dict.fromkeys(
            (
                "requests_sent",
                "replies_sent",
                "requests_received",
                "replies_received",
                "learned",
                "hits",
                "misses",
                "unresolved",
                "pending_overflow",
                "ignored",
            ),
            0,
        )

    def lookup(self, address: str, now: float) -> bytes | None:
        """The MAC of ``address`` if known and fresh (no side effects on the network)."""
        entry = self._entries.get(address)
        if entry is None or entry[1] <= now:
            return None
        return entry[0]

    def resolve(self, address: str, packet: bytes, now: float) -> None:
        """Send ``packet`` (an IPv4 packet) to ``address``: at once if its MAC is known,
        otherwise once it resolves.  The frames appear in :meth:`frames_to_send`."""
        mac = self.lookup(address, now)
        if mac is not None:
            self._counts["hits"] += 1
            self._outbox.append(Transmit(dst=mac, ethertype=ETHERTYPE_IPV4, payload=packet))
            return
        self._counts["misses"] += 1
        pending = self._pending.get(address)
        if pending is None:
            pending = self._pending[address] = _Pending(now + self.retry_interval)
            self._request(address)
        if len(pending.packets) >= self.max_pending:
            pending.packets.popleft()
            self._counts["pending_overflow"] += 1
        pending.packets.append(packet)

    def add_static(self, address: str, mac: bytes) -> None:
        """A permanent entry (never expires)."""
        self._entries[address] = (bytes(mac), math.inf)

    def receive(self, arp: ArpPacket, now: float) -> None:
        """Process an ARP packet from the link (RFC 826's algorithm)."""
        counts = self._counts
        if arp.operation == ArpOperation.REQUEST:
            counts["requests_received"] += 1
        else:
            counts["replies_received"] += 1
        for_us = arp.target_ip == self.address
        sender = arp.sender_ip
        known = sender in self._entries or sender in self._pending
        # A probe (sender 0.0.0.0, RFC 5227) or a broadcast sender teaches nothing.
        learnable = sender != "0.0.0.0" and arp.sender_mac != BROADCAST_MAC
        if learnable and (known or for_us):
            self._learn(sender, arp.sender_mac, now)
        elif not for_us:
            counts["ignored"] += 1
        if for_us and arp.operation == ArpOperation.REQUEST:
            reply = ArpPacket(
                ArpOperation.REPLY, self.mac, self.address, arp.sender_mac, arp.sender_ip
            )
            counts["replies_sent"] += 1
            self._outbox.append(
                Transmit(dst=arp.sender_mac, ethertype=ETHERTYPE_ARP, payload=build_arp(reply))
            )

    def get_timer(self) -> float | None:
        """The earliest retry deadline, or None (entry expiry needs no timer: checked on use)."""
        if not self._pending:
            return None
        return min(p.deadline for p in self._pending.values())

    def handle_timer(self, now: float) -> None:
        """Retry requests whose deadline passed; give up after ``max_retries`` retries."""
        for address, pending in list(self._pending.items()):
            if pending.deadline > now:
                continue
            if pending.retries >= self.max_retries:
                self._counts["unresolved"] += len(pending.packets)
                del self._pending[address]
                continue
            pending.retries += 1
            pending.deadline = now + self.retry_interval
            self._request(address)
        for address in [a for a, (_, expiry) in self._entries.items() if expiry <= now]:
            del self._entries[address]

    def frames_to_send(self) -> list[Transmit]:
        """Frames to transmit now, each handed out once."""
        out, self._outbox = self._outbox, []
        return out

    def statistics(self) -> ArpStatistics:
        return ArpStatistics(**self._counts, entries=len(self._entries))

    # ------------------------------------------------------------------ helpers

    def _request(self, address: str) -> None:
        if address == self.address:
            raise LocalProtocolError(f"ARP: {address} is our own address")
        request = ArpPacket(ArpOperation.REQUEST, self.mac, self.address, bytes(6), address)
        self._counts["requests_sent"] += 1
        self._outbox.append(
            Transmit(dst=BROADCAST_MAC, ethertype=ETHERTYPE_ARP, payload=build_arp(request))
        )

    def _learn(self, address: str, mac: bytes, now: float) -> None:
        entry = self._entries.get(address)
        if entry is None or entry[1] != math.inf:
            self._entries[address] = (bytes(mac), now + self.entry_lifetime)
            self._entries.move_to_end(address)
            self._counts["learned"] += 1
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        pending = self._pending.pop(address, None)
        if pending is not None:
            for packet in pending.packets:
                self._outbox.append(Transmit(dst=mac, ethertype=ETHERTYPE_IPV4, payload=packet))
