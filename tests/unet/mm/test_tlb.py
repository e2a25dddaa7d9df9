"""The NI TLB data structure: direct-mapped conflicts, the FIFO victim cache, busy entries, cap."""

from __future__ import annotations

import pytest

from stacklib.unet.mm import Tlb, TlbEntry, TlbGeometry


def entry(vpage: int, pid: int = 0, busy: int = 0) -> TlbEntry:
    return TlbEntry((pid, vpage), frame=1000 + vpage, writable=True, busy=busy)


def test_direct_mapped_conflict_moves_the_old_entry_to_the_victim_cache() -> None:
    tlb = Tlb(TlbGeometry(entries=8, victim=2))
    assert tlb.insert(entry(3)) == []
    assert tlb.insert(entry(11)) == []  # 11 mod 8 == 3: same slot
    assert tlb.in_victim((0, 3))
    assert not tlb.in_victim((0, 11))
    assert tlb.index((0, 3)) == tlb.index((0, 11))


def test_no_conflict_between_different_slots() -> None:
    tlb = Tlb(TlbGeometry(entries=8, victim=2))
    for vpage in range(8):
        tlb.insert(entry(vpage))
    assert tlb.victim_size == 0
    assert len(tlb) == 8


def test_victim_cache_is_fifo_and_victim_hit_swaps_back() -> None:
    tlb = Tlb(TlbGeometry(entries=4, victim=2))
    for vpage in (0, 4, 8):  # all map to slot 0: 0 and 4 go to the victim cache
        tlb.insert(entry(vpage))
    assert tlb.in_victim((0, 0)) and tlb.in_victim((0, 4))
    found = tlb.lookup((0, 0))  # victim hit: 0 back in slot 0, 8 into the victim cache
    assert found is not None and found.key == (0, 0)
    assert tlb.victim_hits == 1
    assert tlb.in_victim((0, 8)) and not tlb.in_victim((0, 0))
    evicted = tlb.insert(entry(12))  # 0 goes to victim; the oldest there (4) is evicted
    assert [e.key for e in evicted] == [(0, 4)]
    assert (0, 4) not in tlb


def test_busy_entries_are_never_evicted() -> None:
    tlb = Tlb(TlbGeometry(entries=4, victim=1))
    tlb.insert(entry(0, busy=1))
    tlb.insert(entry(4))  # 0 (busy) moves to the victim cache: moving is not evicting
    assert tlb.in_victim((0, 0))
    tlb2 = Tlb(TlbGeometry(entries=4, victim=1))
    tlb2.insert(entry(0, busy=1))
    tlb2.insert(entry(4, busy=1))
    assert tlb2.plan((0, 8)) is None  # both candidates busy, fixed victim cache: refused
    grown = Tlb(TlbGeometry(entries=4, victim=1, victim_grows=True))
    grown.insert(entry(0, busy=1))
    grown.insert(entry(4, busy=1))
    assert grown.insert(entry(8)) == []  # the linked list grows (paper 002 §5.2.1)
    assert grown.victim_size == 2
    for e in grown:
        e.busy = 0
    shrunk = grown.shrink()
    assert [e.key for e in shrunk] == [(0, 0)]
    assert grown.victim_size == 1


def test_pinning_cap_limits_valid_entries() -> None:
    tlb = Tlb(TlbGeometry(entries=64, victim=16, max_valid=3))
    for vpage in range(3):
        assert tlb.insert(entry(vpage)) == []
    evicted = tlb.insert(entry(3))
    assert [e.key for e in evicted] == [(0, 0)]  # oldest first
    assert len(tlb) == 3
    for e in tlb:
        e.busy = 1
    assert tlb.plan((0, 9)) is None


def test_set_associative_geometry() -> None:
    tlb = Tlb(TlbGeometry(entries=8, ways=2, victim=0))
    tlb.insert(entry(0))
    tlb.insert(entry(4))  # 4 sets: same set, second way
    assert len(tlb) == 2
    evicted = tlb.insert(entry(8))
    assert [e.key for e in evicted] == [(0, 0)]


def test_geometry_is_validated() -> None:
    with pytest.raises(ValueError, match="entries"):
        TlbGeometry(entries=0)
    with pytest.raises(ValueError, match="multiple of ways"):
        TlbGeometry(entries=10, ways=4)
    with pytest.raises(ValueError, match="max_valid"):
        TlbGeometry(max_valid=0)
