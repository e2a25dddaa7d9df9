"""The NI TLB: a direct-mapped primary table backed by a FIFO victim cache (paper 002 §5.1).

A translation maps ``(pid, virtual page)`` to a page frame with read/write rights.  The primary
table has ``entries`` slots in sets of ``ways`` (``ways=1``, the paper's design, is direct
mapped); the set of a page is ``(vpage ^ pid) mod sets``, so two pages of one process whose page
numbers differ by a multiple of the number of sets conflict.  An entry displaced from the primary
table moves to the fully associative victim cache; a hit there moves it back.  When the victim
cache overflows, its oldest entry (FIFO) is evicted, and the caller unpins its page.

Two rules from paper 002 §4.2 constrain eviction: an entry with a transfer in progress
(``busy > 0``) is never evicted, and the OS can cap the number of valid entries (and so the
pinned memory).  If every candidate is busy, a victim cache that may grow (the DC21140/NT linked
list, paper 002 §5.2.1) keeps the extra entries until their transfers complete and a later
insertion shrinks it back; a fixed one refuses the insertion (:meth:`Tlb.plan` returns None) and
the NI retries after a transfer completes.

This module is pure data structure: no costs, no pinning (the core does both).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import attrs

__all__ = ["Key", "Tlb", "TlbEntry", "TlbGeometry"]

Key = tuple[int, int]  #: (pid, virtual page number)


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, not {value!r}")


@attrs.frozen
class TlbGeometry:
    """Sizes of the NI TLB; the defaults are paper 002 §5.1's i960 firmware."""

    entries: int = attrs.field(default=1024, validator=_positive)
    ways: int = attrs.field(default=1, validator=_positive)
    victim: int = attrs.field(default=16, validator=attrs.validators.ge(0))
    #: The victim cache may hold more than ``victim`` entries while they are busy (paper 002
    #: §5.2.1, DC21140/NT); otherwise an insertion that would need to evict a busy one fails.
    victim_grows: bool = False
    #: OS cap on valid entries, hence on pinned pages (paper 002 §4.2); None: no cap.
    max_valid: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.entries % self.ways:
            raise ValueError(f"entries ({self.entries}) must be a multiple of ways ({self.ways})")
        if self.max_valid is not None and self.max_valid <= 0:
            raise ValueError(f"max_valid must be > 0 or None, not {self.max_valid!r}")


@attrs.define(slots=True, eq=False)
class TlbEntry:
    """One valid translation."""

    key: Key
    frame: int
    writable: bool
    #: Transfers in progress (and pre-translated receive buffers) using this page.
    busy: int = 0
    #: Endpoints that installed or used this translation; closing the last invalidates it.
    owners: set[int] = attrs.field(factory=set)
    #: Insertion order, for FIFO choices across the whole TLB (the pinning cap).
    seq: int = 0


class Tlb:
    """Primary table + victim cache: :meth:`lookup`, :meth:`plan`, :meth:`insert`."""

    def __init__(self, geometry: TlbGeometry | None = None) -> None:
        self.geometry = geometry or TlbGeometry()
        self.sets = self.geometry.entries // self.geometry.ways
        #: Each set: its entries, oldest first.
        self._primary: list[list[TlbEntry]] = [[] for _ in range(self.sets)]
        self._victim: OrderedDict[Key, TlbEntry] = OrderedDict()
        self._where: dict[Key, TlbEntry] = {}
        self._seq = 0
        self.victim_hits = 0

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: Key) -> bool:
        return key in self._where

    def __iter__(self) -> Iterator[TlbEntry]:
        return iter(list(self._where.values()))

    def index(self, key: Key) -> int:
        """The primary set of ``key``."""
        pid, vpage = key
        return (vpage ^ pid) % self.sets

    def in_victim(self, key: Key) -> bool:
        return key in self._victim

    @property
    def victim_size(self) -> int:
        return len(self._victim)

    def lookup(self, key: Key) -> TlbEntry | None:
        """The entry for ``key`` or None; a victim hit swaps it back into the primary table."""
        entry = self._where.get(key)
        if entry is None:
            return None
        if key in self._victim:
            self.victim_hits += 1
            del self._victim[key]
            row = self._primary[self.index(key)]
            if len(row) >= self.geometry.ways:
                displaced = row.pop(0)
                self._victim[displaced.key] = displaced
            row.append(entry)
        return entry

    def plan(self, key: Key) -> list[TlbEntry] | None:
        """The entries inserting ``key`` would evict, or None if it cannot be inserted now."""
        if key in self._where:
            return []
        geometry = self.geometry
        row = self._primary[self.index(key)]
        victim = list(self._victim.values())
        if len(row) >= geometry.ways:
            victim.append(row[0])
        evict: list[TlbEntry] = []
        excess = len(victim) - geometry.victim
        if excess > 0:
            for entry in victim:
                if excess == 0:
                    break
                if not entry.busy:
                    evict.append(entry)
                    excess -= 1
            if excess and not geometry.victim_grows:
                return None
        if geometry.max_valid is not None:
            over = len(self._where) + 1 - len(evict) - geometry.max_valid
            if over > 0:
                chosen = {id(entry) for entry in evict}
                candidates = [e for e in victim if not e.busy and id(e) not in chosen]
                candidates += sorted(
                    (
                        e
                        for r in self._primary
                        for e in r
                        if not e.busy and id(e) not in chosen and e not in victim
                    ),
                    key=lambda e: e.seq,
                )
                if len(candidates) < over:
                    return None
                evict += candidates[:over]
        return evict

    def insert(self, entry: TlbEntry) -> list[TlbEntry]:
        """Insert ``entry``; returns the evicted entries (to unpin).  See :meth:`plan`."""
        evict = self.plan(entry.key)
        if evict is None:
            raise RuntimeError(f"no room for {entry.key} (call plan() first)")
        for old in evict:
            self.remove(old.key)
        self._seq += 1
        entry.seq = self._seq
        row = self._primary[self.index(entry.key)]
        if len(row) >= self.geometry.ways:
            displaced = row.pop(0)
            self._victim[displaced.key] = displaced
        row.append(entry)
        self._where[entry.key] = entry
        return evict

    def shrink(self) -> list[TlbEntry]:
        """Evict non-busy victim entries beyond capacity (the NT cleanup routine); evicted."""
        out: list[TlbEntry] = []
        excess = len(self._victim) - self.geometry.victim
        for entry in list(self._victim.values()):
            if excess <= 0:
                break
            if not entry.busy:
                self.remove(entry.key)
                out.append(entry)
                excess -= 1
        return out

    def remove(self, key: Key) -> TlbEntry | None:
        """Invalidate ``key``; the removed entry or None."""
        entry = self._where.pop(key, None)
        if entry is None:
            return None
        if self._victim.pop(key, None) is None:
            self._primary[self.index(key)].remove(entry)
        return entry
