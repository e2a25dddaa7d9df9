"""AAL5 segmentation and reassembly: round trips, loss, corruption, limits, fuzzing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.layers.aal5 import (
    VC,
    DropReason,
    Event,
    PduDropped,
    PduReceived,
    Reassembler,
    segment,
    segment_payloads,
)
from stacklib.wire import atm
from stacklib.wire.aal5 import MAX_CELLS, MAX_PAYLOAD, build_pdu, cells_needed

EDGE_SIZES = [0, 1, 39, 40, 41, 47, 48, 49, 88, 95, 96, 65535]


def payload_of(size: int, seed: int = 0) -> bytes:
    return random.Random(seed * 65536 + size).randbytes(size)


def ok(vc: VC, payload: bytes, uu: int = 0, cpi: int = 0) -> PduReceived:
    return PduReceived(vc=vc, payload=payload, uu=uu, cpi=cpi)


def drop(vc: VC | None, reason: DropReason, cells: int) -> PduDropped:
    return PduDropped(vc=vc, reason=reason, cells=cells)


def received(events: list[Event]) -> list[bytes]:
    return [e.payload for e in events if isinstance(e, PduReceived)]


def dropped(events: list[Event]) -> list[PduDropped]:
    return [e for e in events if isinstance(e, PduDropped)]


def accounted(r: Reassembler, events: list[Event]) -> int:
    """Cells explained by delivered PDUs, drops, ignored cells and pending buffers."""
    stats = r.statistics()
    delivered = sum(cells_needed(len(p)) for p in received(events))
    return delivered + stats.cells_dropped + stats.cells_ignored + r.pending_cells()


# --- segmentation -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", EDGE_SIZES)
def test_segment_headers_and_payloads(size: int) -> None:
    payload = payload_of(size)
    cells = segment(payload, vpi=3, vci=4242, uu=9, clp=1)
    assert len(cells) == cells_needed(size)
    parsed = [atm.parse(c) for c in cells]  # every HEC valid
    assert all((c.vpi, c.vci, c.clp, c.gfc) == (3, 4242, 1, 0) for c in parsed)
    assert [c.pti for c in parsed] == [0] * (len(cells) - 1) + [atm.PTI_AUU]
    assert b"".join(c.payload for c in parsed) == build_pdu(payload, uu=9)
    assert segment_payloads(payload, uu=9) == [c[5:] for c in cells]


def test_segment_validates() -> None:
    with pytest.raises(ValueError, match="vpi"):
        segment(b"", vpi=256, vci=0)
    with pytest.raises(ValueError, match="clp"):
        segment(b"", vpi=0, vci=0, clp=2)
    with pytest.raises(ValueError, match="65535"):
        segment(bytes(MAX_PAYLOAD + 1), vpi=0, vci=0)


# --- round trips --------------------------------------------------------------------------------


def _round_trip(size: int, seed: int, vc: VC = (1, 100)) -> None:
    payload = payload_of(size, seed)
    cells = segment(payload, *vc, uu=size & 0xFF, cpi=seed & 0xFF)
    r = Reassembler()
    events = r.feed_many(cells)
    assert events == [ok(vc, payload, size & 0xFF, seed & 0xFF)]
    stats = r.statistics()
    assert (stats.pdus_received, stats.bytes_received) == (1, size)
    assert stats.cells_received == len(cells)
    assert stats.pdus_dropped_total == 0
    assert r.pending_cells() == 0


@pytest.mark.parametrize("size", EDGE_SIZES)
def test_round_trip_edge_sizes(size: int) -> None:
    _round_trip(size, seed=1)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, MAX_PAYLOAD), st.integers(0, 2**16))
def test_round_trip_any_size(size: int, seed: int) -> None:
    _round_trip(size, seed)


@given(st.integers(0, 3000), st.integers(0, 0xFF), st.integers(0, 0xFFFF))
def test_round_trip_three_input_kinds(size: int, vpi: int, vci: int) -> None:
    payload = payload_of(size)
    cells = segment(payload, vpi, vci)
    expected = [ok((vpi, vci), payload, 0, 0)]
    assert Reassembler().feed_many(cells) == expected
    assert Reassembler().feed_many([atm.parse(c) for c in cells]) == expected
    assert Reassembler().feed_many([memoryview(bytearray(c)) for c in cells]) == expected
    r = Reassembler()
    parts = segment_payloads(payload)
    events = [
        e for i, p in enumerate(parts) for e in r.feed_payload((vpi, vci), p, i == len(parts) - 1)
    ]
    assert events == expected


@given(atm.cells())
def test_vc_decoded_as_construct_builds_it(cell: atm.Cell) -> None:
    # One end-of-PDU cell carrying a valid one-cell PDU, any GFC/CLP: the event's VC is the
    # (vpi, vci) the construct-derived codec wrote.
    cell = atm.Cell(
        cell.vpi,
        cell.vci,
        atm.PTI_AUU | (cell.pti & 0b010),
        cell.clp,
        cell.gfc,
        build_pdu(cell.payload[:40]),
    )
    events = Reassembler().feed(atm.build(cell))
    assert events == [ok((cell.vpi, cell.vci), cell.payload[:40], 0, 0)]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([(0, 1), (0, 2), (7, 1), (255, 65535)]), st.integers(0, 400)),
        max_size=12,
    ),
    st.data(),
)
def test_interleaved_vcs(pdus: list[tuple[VC, int]], data: st.DataObject) -> None:
    queues: dict[VC, list[bytes]] = {}
    sent: dict[VC, list[bytes]] = {}
    for i, (vc, size) in enumerate(pdus):
        payload = payload_of(size, i)
        sent.setdefault(vc, []).append(payload)
        queues.setdefault(vc, []).extend(segment(payload, *vc))
    r = Reassembler()
    events: list[Event] = []
    while any(queues.values()):
        vc = data.draw(st.sampled_from(sorted(vc for vc, q in queues.items() if q)))
        events += r.feed(queues[vc].pop(0))
    got: dict[VC, list[bytes]] = {}
    for e in events:
        assert isinstance(e, PduReceived)
        got.setdefault(e.vc, []).append(e.payload)
    assert got == sent


# --- loss and corruption ------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(st.integers(41, 3000), st.integers(0, 3000), st.data(), st.booleans())
def test_any_single_lost_cell_drops_that_pdu(
    size_a: int, size_b: int, data: st.DataObject, check_crc: bool
) -> None:
    vc = (1, 2)
    a, b, c = payload_of(size_a, 1), payload_of(size_b, 2), payload_of(10, 3)
    cells_a = segment(a, *vc)
    lost = data.draw(st.integers(0, len(cells_a) - 1))
    stream = cells_a[:lost] + cells_a[lost + 1 :] + segment(b, *vc) + segment(c, *vc)
    r = Reassembler(check_crc=check_crc)
    events = r.feed_many(stream)
    drops = dropped(events)
    assert len(drops) == 1
    # Without the CRC the Length check still catches it: one cell fewer, or one too many.
    expected = DropReason.BAD_CRC if check_crc else DropReason.BAD_LENGTH
    assert drops[0].reason is expected
    if lost == len(cells_a) - 1:
        # The end cell was lost: A merged with B, both gone; C (after the drop) arrives.
        assert received(events) == [c]
        assert drops[0].cells == len(cells_a) - 1 + cells_needed(size_b)
    else:
        assert received(events) == [b, c]
        assert drops[0].cells == len(cells_a) - 1
    assert r.statistics().pdus_dropped[expected] == 1
    assert accounted(r, events) == len(stream)


def test_lost_end_cell_merges_two_pdus() -> None:
    vc = (0, 32)
    first, second, third = b"A" * 100, b"B" * 100, b"C" * 100
    cells = segment(first, *vc)[:-1] + segment(second, *vc) + segment(third, *vc)
    r = Reassembler()
    events = r.feed_many(cells)
    assert events == [drop(vc, DropReason.BAD_CRC, 2 + 3), ok(vc, third, 0, 0)]
    stats = r.statistics()
    assert stats.pdus_dropped[DropReason.BAD_CRC] == 1
    assert stats.cells_dropped == 5
    assert (stats.pdus_received, stats.bytes_received) == (1, 100)


@given(st.integers(0, 500), st.data())
def test_corrupted_payload_byte_is_bad_crc(size: int, data: st.DataObject) -> None:
    cells = [bytearray(c) for c in segment(payload_of(size), 5, 6)]
    i = data.draw(st.integers(0, len(cells) - 1))
    j = data.draw(st.integers(5, 52))
    cells[i][j] ^= data.draw(st.integers(1, 255))
    r = Reassembler()
    events = r.feed_many(cells)
    assert events == [drop((5, 6), DropReason.BAD_CRC, len(cells))]
    assert r.statistics().pdus_dropped[DropReason.BAD_CRC] == 1


@given(st.integers(41, 500), st.data())
def test_corrupted_header_byte_counts_hec_then_loses_the_pdu(
    size: int, data: st.DataObject
) -> None:
    vc = (5, 6)
    cells = [bytearray(c) for c in segment(payload_of(size), *vc)]
    i = data.draw(st.integers(0, len(cells) - 1))
    cells[i][data.draw(st.integers(0, 4))] ^= data.draw(st.integers(1, 255))
    nxt, last = segment(b"next", *vc), segment(b"last", *vc)
    r = Reassembler()
    events = r.feed_many([*cells, *nxt, *last])
    assert events[0] == drop(None, DropReason.BAD_HEC, 1)
    # The PDU (merged with "next" if its end cell was hit) fails its CRC; "last" arrives.
    assert [d.reason for d in dropped(events)] == [DropReason.BAD_HEC, DropReason.BAD_CRC]
    assert received(events)[-1] == b"last"
    stats = r.statistics()
    assert stats.pdus_dropped[DropReason.BAD_HEC] == 1
    assert stats.pdus_dropped[DropReason.BAD_CRC] == 1
    assert accounted(r, events) == stats.cells_received


def test_hec_check_is_a_policy() -> None:
    cell = bytearray(segment(b"hi", 1, 1)[0])
    cell[4] ^= 0xFF
    assert Reassembler(check_hec=False).feed(cell) == [ok((1, 1), b"hi", 0, 0)]
    assert Reassembler().feed(cell) == [drop(None, DropReason.BAD_HEC, 1)]


def test_crc_check_is_a_policy() -> None:
    cells = [bytearray(c) for c in segment(bytes(100), 1, 1)]
    cells[0][5 + 10] ^= 1  # payload byte 10
    corrupted = bytes(10) + b"\x01" + bytes(89)
    assert received(Reassembler(check_crc=False).feed_many(cells)) == [corrupted]
    assert dropped(Reassembler().feed_many(cells))[0].reason is DropReason.BAD_CRC


# --- limits and odd cells -----------------------------------------------------------------------


def test_too_long_then_recovers_at_next_end_cell() -> None:
    vc = (2, 99)
    filler = atm.build(atm.Cell(2, 99, pti=0, payload=bytes(48)))
    r = Reassembler()
    events = r.feed_many([filler] * (MAX_CELLS - 1))
    assert events == [] and r.pending_cells(vc) == MAX_CELLS - 1
    assert r.feed(filler) == [drop(vc, DropReason.TOO_LONG, MAX_CELLS)]
    assert r.pending_cells(vc) == 0
    # Discarding until the end cell that closes the oversized PDU, then back to normal.
    tail = segment(b"tail of the runaway PDU", *vc)
    assert r.feed_many([filler, filler, *tail]) == []
    assert r.feed_many(segment(b"ok", *vc)) == [ok(vc, b"ok", 0, 0)]
    stats = r.statistics()
    assert stats.pdus_dropped[DropReason.TOO_LONG] == 1
    assert stats.cells_dropped == MAX_CELLS + 2 + len(tail)
    assert stats.cells_received == MAX_CELLS + 2 + len(tail) + 1


def test_largest_pdu_is_not_too_long() -> None:
    cells = segment(bytes(MAX_PAYLOAD), 0, 1)
    assert len(cells) == MAX_CELLS
    assert received(Reassembler().feed_many(cells)) == [bytes(MAX_PAYLOAD)]


@pytest.mark.parametrize(
    ("size", "outcome"),
    [(100, "received"), (120, "late"), (137, "early"), (1000, "early")],
)
def test_per_vc_buffer_limit(size: int, outcome: str) -> None:
    r = Reassembler(max_payload=100)  # 3 cells hold up to 136 bytes
    cells = segment(payload_of(size), 1, 1)
    events = r.feed_many(cells + segment(b"after", 1, 1))
    if outcome == "received":
        assert received(events) == [payload_of(size), b"after"]
        return
    assert received(events) == [b"after"]
    (drop,) = dropped(events)
    assert drop.reason is DropReason.BUFFER_FULL
    # Too many cells is seen at the third non-end cell; a short overrun only at the end cell.
    assert drop.cells == (3 if outcome == "early" else len(cells))
    assert r.statistics().pdus_dropped[DropReason.BUFFER_FULL] == 1


def test_buffer_limit_validated() -> None:
    with pytest.raises(ValueError):
        Reassembler(max_payload=MAX_PAYLOAD + 1)


def test_non_user_cells_are_ignored_mid_pdu() -> None:
    vc = (4, 4)
    cells = segment(payload_of(200), *vc)
    oam = atm.build(atm.Cell(4, 4, pti=0b101))  # F5 end-to-end OAM cell
    r = Reassembler()
    events = r.feed_many([cells[0], oam, *cells[1:]])
    assert received(events) == [payload_of(200)]
    assert r.statistics().cells_ignored == 1


def test_efci_marked_cells_are_user_data() -> None:
    cells = [atm.parse(c) for c in segment(payload_of(100), 1, 1)]
    marked = [atm.Cell(c.vpi, c.vci, c.pti | atm.PTI_EFCI, c.clp, c.gfc, c.payload) for c in cells]
    assert received(Reassembler().feed_many(marked)) == [payload_of(100)]


@pytest.mark.parametrize("cell", [b"", bytes(52), bytes(54), bytearray(100)])
def test_wrong_size_input_is_bad_cell(cell: bytes) -> None:
    r = Reassembler()
    assert r.feed(cell) == [drop(None, DropReason.BAD_CELL, 1)]
    assert r.statistics().pdus_dropped[DropReason.BAD_CELL] == 1


def test_bad_cell_objects_and_payloads() -> None:
    r = Reassembler()
    assert r.feed(atm.Cell(1, 1, payload=b"short")) == [drop(None, DropReason.BAD_CELL, 1)]
    assert r.feed_payload((1, 1), bytes(47), True) == [drop(None, DropReason.BAD_CELL, 1)]
    for bad in (atm.Cell(256, 1), atm.Cell(1, 0x10000), atm.Cell(1, 1, pti=8), atm.Cell(-1, 1)):
        assert r.feed(bad) == [drop(None, DropReason.BAD_CELL, 1)]
    assert r.statistics().cells_received == 6


def test_input_buffer_reuse_does_not_corrupt() -> None:
    # An NI model may hand in a view of a ring slot it then overwrites.
    cells = segment(payload_of(300), 1, 1)
    ring = bytearray(53)
    r = Reassembler()
    events: list[Event] = []
    for c in cells:
        ring[:] = c
        events += r.feed(memoryview(ring))
        ring[:] = bytes(53)
    assert received(events) == [payload_of(300)]


def test_statistics_are_a_snapshot() -> None:
    r = Reassembler()
    before = r.statistics()
    r.feed_many(segment(b"x", 0, 1))
    after = r.statistics()
    assert (before.pdus_received, after.pdus_received) == (0, 1)
    assert before.pdus_dropped == dict.fromkeys(DropReason, 0)
    with pytest.raises(TypeError):
        before.pdus_dropped[DropReason.BAD_CRC] = 1  # type: ignore[index]


# --- fuzzing ------------------------------------------------------------------------------------

_VCS = [(0, 1), (0, 2), (1, 1)]


def _mangled_cells() -> st.SearchStrategy[bytes]:
    valid = st.builds(
        lambda vc, size, seed: segment(payload_of(size, seed), *vc),
        st.sampled_from(_VCS),
        st.integers(0, 150),
        st.integers(0, 5),
    )
    return st.one_of(
        st.binary(max_size=120),
        st.binary(min_size=53, max_size=53),
        st.builds(atm.build, atm.cells(vpi=0, vci=1)),
        st.builds(atm.build, st.one_of(*(atm.cells(*vc) for vc in _VCS))),
        valid.flatmap(st.sampled_from),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(_mangled_cells(), max_size=60), st.booleans(), st.booleans(), st.integers(0, 200))
def test_reassembly_never_raises(cells: list[bytes], hec: bool, crc: bool, limit: int) -> None:
    r = Reassembler(check_hec=hec, check_crc=crc, max_payload=limit)
    events = r.feed_many(cells)
    stats = r.statistics()
    assert stats.cells_received == len(cells)
    assert accounted(r, events) == len(cells)
    assert stats.pdus_received == len(received(events))
    assert stats.pdus_dropped_total == len(dropped(events))
    assert all(len(p) <= limit for p in received(events))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_VCS), st.integers(0, 200)), max_size=6), st.data())
def test_fuzzed_streams_deliver_only_sent_payloads(
    pdus: list[tuple[VC, int]], data: st.DataObject
) -> None:
    # Whatever is dropped, duplicated or reordered, a delivered PDU is one that was sent (the CRC
    # makes an accidental pass a 2**-32 event), on the VC it was sent on.
    sent = {(vc, payload_of(size, i)) for i, (vc, size) in enumerate(pdus)}
    cells = [c for i, (vc, size) in enumerate(pdus) for c in segment(payload_of(size, i), *vc)]
    mangled = data.draw(st.lists(st.sampled_from(cells), max_size=40)) if cells else []
    events = Reassembler().feed_many(mangled)
    assert all((e.vc, e.payload) in sent for e in events if isinstance(e, PduReceived))
