"""The sans-IO translation core: pinning, eviction, close, cap, page-in, pre-translation."""

from __future__ import annotations

import pytest

from stacklib.errors import UNetError
from stacklib.unet.mm import (
    PAGE_SIZE,
    AddressSpace,
    BufferReturned,
    MemoryManager,
    MmParams,
    PageInDone,
    PhysicalMemory,
    Protection,
    Resumed,
    Status,
    TlbGeometry,
)

P = PAGE_SIZE


def make(entries: int = 8, victim: int = 2, **params: object) -> tuple[MemoryManager, AddressSpace]:
    memory = PhysicalMemory()
    geometry = params.pop("geometry", None) or TlbGeometry(entries=entries, victim=victim)
    mm = MemoryManager(MmParams(geometry=geometry, **params), memory)  # type: ignore[arg-type]
    space = AddressSpace(1, memory)
    space.map(0, 64 * P)
    mm.open_endpoint(1, space)
    return mm, space


def send(mm: MemoryManager, vpage: int, now: float = 0.0, endpoint: int = 1) -> int:
    result = mm.translate_send(now, endpoint, vpage * P, 64)
    assert result.status is Status.OK, result
    assert result.transfer is not None
    return result.transfer


def test_hit_after_miss_and_pinning_follows_the_tlb() -> None:
    mm, space = make()
    first = mm.translate_send(0.0, 1, 0, 100)
    assert first.steps == ("miss.handshake", "miss.interrupt", "pin.send")
    assert first.transfer is not None
    mm.complete(first.transfer)
    again = mm.translate_send(0.0, 1, 0, 100)
    assert again.steps == ("send.tlb_hit",)
    frame = space.pages[0].frame
    assert frame is not None and space.memory.pinned(frame)
    assert not space.page_out(0)  # pinned pages stay in memory
    stats = mm.statistics()
    assert stats.hits == 1
    assert stats.misses == {"transmit/present": 1}
    assert stats.pinned_bytes == P


def test_eviction_from_the_victim_cache_unpins() -> None:
    mm, space = make(entries=4, victim=1)
    for vpage in (0, 4, 8):  # one slot: 0 -> victim, then 4 -> victim evicts 0
        mm.complete(send(mm, vpage))
    frame0 = space.pages[0].frame
    assert frame0 is not None and not space.memory.pinned(frame0)
    assert space.page_out(0)
    stats = mm.statistics()
    assert stats.evictions == 1
    assert stats.valid_entries == 2


def test_the_miss_that_evicts_carries_the_unpin() -> None:
    mm, _ = make(entries=4, victim=1)
    mm.complete(send(mm, 0))
    mm.complete(send(mm, 4))
    result = mm.translate_send(0.0, 1, 8 * P, 64)
    assert result.steps == ("miss.handshake", "miss.interrupt", "pin.send", "unpin")


def test_no_eviction_while_a_transfer_is_in_progress() -> None:
    mm, space = make(entries=4, victim=1)
    busy = send(mm, 0)  # not completed
    mm.complete(send(mm, 4))  # 0 moves to the victim cache
    mm.complete(send(mm, 8))  # 4 to the victim cache: the oldest (0) is busy, so 4 goes
    frame0 = space.pages[0].frame
    assert frame0 is not None and space.memory.pinned(frame0)
    assert (1, 0) in mm.tlb
    # Both victim candidates busy on a fixed victim cache: the NI must wait.
    held = send(mm, 12)
    refused = mm.translate_send(0.0, 1, 16 * P, 64)
    assert refused.status is Status.NO_ROOM
    mm.complete(busy)
    mm.complete(held)
    assert mm.translate_send(0.0, 1, 16 * P, 64).status is Status.OK


def test_closing_an_endpoint_invalidates_its_entries() -> None:
    mm, space = make()
    other = AddressSpace(2, space.memory)
    other.map(0, 4 * P)
    mm.open_endpoint(2, other)
    for vpage in range(3):
        mm.complete(send(mm, vpage))
    mm.complete(send(mm, 0, endpoint=2))
    steps = mm.close_endpoint(1)
    assert steps == ("unpin",) * 3
    assert len(mm.tlb) == 1 and (2, 0) in mm.tlb
    assert all(not space.memory.pinned(f) for p in space.pages.values() if (f := p.frame))
    assert mm.statistics().invalidations == 3
    with pytest.raises(UNetError, match="not open"):
        mm.translate_send(0.0, 1, 0, 1)


def test_pinning_cap() -> None:
    mm, space = make(geometry=TlbGeometry(entries=64, victim=16, max_valid=4))
    for vpage in range(10):
        mm.complete(send(mm, vpage))
        assert mm.statistics().pinned_bytes <= 4 * P
    assert space.memory.pinned_frames == 4
    assert mm.statistics().pinned_bytes_max == 4 * P


def test_privilege_violation_is_an_error_status() -> None:
    mm, space = make()
    space.map(100 * P, P, protection=Protection.READ)
    unmapped = mm.translate_send(0.0, 1, 1000 * P, 10)
    assert unmapped.status is Status.ERROR
    assert mm.translate_send(0.0, 1, 100 * P, 10).status is Status.OK  # read is allowed
    mm.post_free(1, 100 * P, P)  # a write into a read-only region
    mm.pretranslate(0.0, 1)
    event = mm.next_event()
    assert event == BufferReturned(1, 100 * P, P, "privilege")
    assert mm.statistics().misses["transmit/privilege"] == 1


def test_copy_on_write_for_a_write_translation_of_a_shared_page() -> None:
    mm, space = make()
    space.write(5 * P, b"parent")
    child = AddressSpace(2, space.memory)
    child.share_from(space, 5 * P, P)
    mm.post_free(1, 5 * P, P)
    steps = mm.pretranslate(0.0, 1)
    assert steps == ("miss.handshake", "miss.interrupt", "pin.cow")
    arrival = mm.arrival(0.0, 1, 6)
    assert arrival.status is Status.OK and arrival.transfer is not None
    mm.dma_write(arrival.transfer, b"wrote!")
    assert space.read(5 * P, 6) == b"wrote!"
    assert child.read(5 * P, 6) == b"parent"  # the other process keeps its copy


def test_zero_page_for_a_non_present_page_aligned_receive_buffer() -> None:
    mm, space = make()
    space.map(200 * P, P, present=False)
    mm.post_free(1, 200 * P, P)
    assert mm.pretranslate(0.0, 1) == ("miss.handshake", "miss.interrupt", "pin.zero")
    assert mm.statistics().page_ins == 0
    # Without the optimization (DC21140: buffers share pages) the same buffer is paged in.
    nt, nt_space = make(zero_map_in=False)
    nt_space.map(200 * P, P, present=False)
    nt.post_free(1, 200 * P, P)
    nt.pretranslate(0.0, 1)
    assert nt.statistics().page_ins == 1


def test_send_page_in_suspends_only_that_endpoint() -> None:
    mm, space = make()
    other = AddressSpace(2, space.memory)
    other.map(0, P)
    mm.open_endpoint(2, other)
    space.write(7 * P, b"swapped out")
    assert space.page_out(7)
    deferred = mm.translate_send(0.0, 1, 7 * P, 11)
    assert deferred.status is Status.DEFERRED
    assert deferred.ready_at == pytest.approx(0.022)
    assert mm.get_timer() == pytest.approx(0.022)
    assert mm.translate_send(0.001, 1, 0, 8).status is Status.SUSPENDED
    served = [mm.translate_send(0.001 * i, 2, 0, 8).status for i in range(5)]
    assert served == [Status.OK] * 5  # the other endpoint is still served
    mm.handle_timer(0.022)
    assert isinstance(mm.next_event(), PageInDone)
    assert mm.next_event() == Resumed(1, pytest.approx(0.022))
    retry = mm.translate_send(0.022, 1, 7 * P, 11)
    assert retry.steps == ("send.tlb_hit",)  # the kernel thread installed the mapping
    assert retry.transfer is not None
    assert mm.dma_read(retry.transfer) == b"swapped out"


def test_receive_pretranslation_depth_and_drops() -> None:
    mm, _ = make(pretranslate=2)
    for i in range(4):
        mm.post_free(1, (10 + i) * P, P)
    mm.pretranslate(0.0, 1)
    assert mm.statistics().misses["receive/present"] == 2  # only the first two
    for _ in range(2):
        arrival = mm.arrival(0.0, 1, 100)
        assert arrival.status is Status.OK and arrival.steps == ("recv.tlb_hit",)
    dropped = mm.arrival(0.0, 1, 100)  # buffers remain, but none is pre-translated
    assert dropped.status is Status.DROPPED
    assert mm.statistics().dropped_no_buffer == 1
    mm.pretranslate(0.0, 1)
    assert mm.arrival(0.0, 1, 100).status is Status.OK


def test_a_message_spans_several_pretranslated_buffers() -> None:
    mm, space = make()
    mm.post_free(1, 10 * P, 100)
    mm.post_free(1, 11 * P, 100)
    mm.pretranslate(0.0, 1)
    arrival = mm.arrival(0.0, 1, 150)
    assert arrival.buffers == ((10 * P, 100), (11 * P, 100))
    assert arrival.transfer is not None
    mm.dma_write(arrival.transfer, bytes(range(150)))
    assert space.read(10 * P, 100) + space.read(11 * P, 50) == bytes(range(150))


def test_a_buffer_whose_page_in_is_late_is_skipped_and_returned() -> None:
    mm, space = make(zero_map_in=False)
    space.map(300 * P, P, present=False)
    mm.post_free(1, 300 * P + 64, 1024)  # not page-aligned: needs a real page-in
    mm.post_free(1, 20 * P, 1024)
    mm.pretranslate(0.0, 1)
    arrival = mm.arrival(0.005, 1, 500)
    assert arrival.status is Status.OK
    assert arrival.skipped == ((300 * P + 64, 1024),)
    assert arrival.buffers == ((20 * P, 1024),)
    assert mm.next_event() == BufferReturned(1, 300 * P + 64, 1024, "page-in late")
    assert mm.statistics().buffers_skipped == 1


def test_a_page_in_done_in_time_makes_the_buffer_usable() -> None:
    mm, space = make(zero_map_in=False)
    space.map(300 * P, P, present=False)
    mm.post_free(1, 300 * P + 64, 1024)
    mm.pretranslate(0.0, 1)
    assert mm.arrival(0.030, 1, 500).buffers == ((300 * P + 64, 1024),)


def test_misuse_raises() -> None:
    mm, space = make()
    with pytest.raises(UNetError, match="already open"):
        mm.open_endpoint(1, space)
    with pytest.raises(UNetError, match="no transfer"):
        mm.complete(99)
    with pytest.raises(UNetError, match="length"):
        mm.post_free(1, 0, 0)


def test_pinned_memory_depends_on_the_tlb_not_on_the_number_of_processes() -> None:
    # Paper 002 §1: 32 processes with 64 receive buffers of one page each would pin 8 MB with
    # a pinned segment apiece; through a 256+16-entry TLB at most 272 pages are ever pinned.
    memory = PhysicalMemory()
    mm = MemoryManager(MmParams(geometry=TlbGeometry(entries=256, victim=16)), memory)
    for pid in range(32):
        space = AddressSpace(pid, memory)
        space.map(0, 64 * P)
        mm.open_endpoint(pid, space)
        for k in range(64):
            mm.post_free(pid, k * P, P)
        for _ in range(64 // 4):  # pre-translate 4, receive into them, complete the DMAs
            mm.pretranslate(0.0, pid)
            while (arrival := mm.arrival(0.0, pid, 100)).transfer is not None:
                mm.complete(arrival.transfer)
    stats = mm.statistics()
    assert stats.pinned_bytes_max <= (256 + 16) * P
    assert memory.pinned_frames == stats.valid_entries <= 256 + 16
    assert stats.misses["receive/present"] == 32 * 64  # every buffer was used once
    assert stats.evictions > 0


def test_write_translation_of_a_page_translated_for_reading_copies_it() -> None:
    mm, space = make()
    space.write(3 * P, b"original")
    child = AddressSpace(2, space.memory)
    child.share_from(space, 3 * P, P)
    mm.complete(send(mm, 3))  # a read translation keeps sharing the page
    assert space.pages[3].frame == child.pages[3].frame
    mm.post_free(1, 3 * P, P)
    steps = mm.pretranslate(0.0, 1)
    assert steps == ("miss.handshake", "miss.interrupt", "unpin", "pin.cow")
    assert space.pages[3].frame != child.pages[3].frame


def test_growing_victim_list_keeps_busy_entries_and_shrinks_after() -> None:
    geometry = TlbGeometry(entries=4, victim=1, victim_grows=True)
    mm, _ = make(geometry=geometry)
    held = [send(mm, vpage) for vpage in (0, 4, 8)]  # three busy entries on one slot
    assert mm.tlb.victim_size == 2  # over capacity: the list grew
    steps: tuple[str, ...] = ()
    for transfer in held:
        steps += mm.complete(transfer)
    assert steps == ("unpin",)  # the cleanup shrank it back to one entry
    assert mm.tlb.victim_size == 1
