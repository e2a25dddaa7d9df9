"""Fragmentation, fragment reassembly and the ARP cache, scripted at explicit times."""

from __future__ import annotations

import random

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.errors import LocalProtocolError
from stacklib.layers.ip.machine import (
    ArpCache,
    FragmentationNeeded,
    Reassembler,
    Transmit,
    fragment,
)
from stacklib.layers.ip.wire import (
    BROADCAST_MAC,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    ArpOperation,
    ArpPacket,
    Ipv4Packet,
    build_ipv4,
    parse_arp,
    parse_ipv4,
)

DATA = bytes(range(256)) * 12  # 3072 bytes


def fragments(data: bytes = DATA, size: int = 512, ident: int = 7) -> list[Ipv4Packet]:
    """``data`` cut into fragments of ``size`` bytes (a multiple of 8), in order."""
    out = []
    for start in range(0, len(data), size):
        piece = data[start : start + size]
        out.append(
            Ipv4Packet(
                "10.0.0.2",
                "10.0.0.1",
                17,
                piece,
                identification=ident,
                more_fragments=start + size < len(data),
                fragment_offset=start,
            )
        )
    return out


def feed(r: Reassembler, pieces: list[Ipv4Packet], now: float = 0.0) -> list[Ipv4Packet]:
    return [p for f in pieces if (p := r.receive(f, now)) is not None]


def test_in_order_out_of_order_and_whole_packets() -> None:
    r = Reassembler()
    (whole,) = feed(r, fragments())
    assert whole.payload == DATA and not whole.is_fragment and whole.identification == 7
    pieces = fragments(ident=8)
    random.Random(1).shuffle(pieces)
    (whole,) = feed(r, pieces)
    assert whole.payload == DATA
    plain = Ipv4Packet("10.0.0.2", "10.0.0.1", 17, b"x")
    assert r.receive(plain, 0.0) is plain
    stats = r.statistics()
    assert (stats.reassembled, stats.fragments, stats.in_progress) == (2, 12, 0)
    assert stats.buffered_bytes == 0 and r.get_timer() is None


def test_duplicates_are_ignored() -> None:
    r = Reassembler()
    pieces = fragments()
    assert feed(r, [pieces[0], pieces[0], pieces[2], pieces[2]]) == []
    (whole,) = feed(r, pieces[1:])
    assert whole.payload == DATA
    assert r.statistics().duplicates == 3  # two early copies, and pieces[2] again at the end


def test_overlaps_that_agree_are_accepted_and_conflicts_drop_the_datagram() -> None:
    r = Reassembler()
    first = Ipv4Packet("10.0.0.2", "10.0.0.1", 17, DATA[:1024], identification=1,
                       more_fragments=True)  # fmt: skip
    middle = attrs.evolve(first, payload=DATA[512:2048], fragment_offset=512)
    last = attrs.evolve(first, payload=DATA[2048:], fragment_offset=2048, more_fragments=False)
    (whole,) = feed(r, [first, middle, last])
    assert whole.payload == DATA and r.statistics().overlaps == 1
    bad = attrs.evolve(middle, payload=bytes(1536), identification=2)
    assert feed(r, [attrs.evolve(first, identification=2), bad]) == []
    stats = r.statistics()
    assert stats.overlap_conflicts == 1 and stats.in_progress == 0


def test_missing_fragment_times_out_and_is_counted() -> None:
    r = Reassembler(timeout=30.0)
    pieces = fragments()
    assert feed(r, pieces[:-2] + pieces[-1:], now=5.0) == []
    assert r.get_timer() == 35.0
    assert r.handle_timer(34.999) == []
    (first,) = r.handle_timer(35.0)  # the offset-0 fragment: cue for ICMP time exceeded
    assert first.fragment_offset == 0
    assert r.statistics().timeouts == 1 and r.get_timer() is None
    # The straggler now starts a new datagram, which never completes.
    assert r.receive(pieces[-2], 36.0) is None and r.statistics().in_progress == 1


def test_limits_evict_the_oldest_datagram() -> None:
    r = Reassembler(max_datagrams=2, max_bytes=4096)
    for ident in (1, 2, 3):
        assert feed(r, fragments(ident=ident)[:1]) == []
    assert r.statistics().evicted == 1 and r.statistics().in_progress == 2
    assert feed(r, fragments(ident=1)[1:]) == []  # ident 1 lost its first fragment
    r2 = Reassembler(max_bytes=1024)
    assert feed(r2, fragments(ident=1)[:1] + fragments(ident=2)[:2]) == []
    assert r2.statistics().buffered_bytes <= 1024 and r2.statistics().evicted == 1


def test_bad_fragments_are_dropped() -> None:
    r = Reassembler()
    odd = Ipv4Packet("10.0.0.2", "10.0.0.1", 17, b"abc", more_fragments=True)
    assert r.receive(odd, 0.0) is None
    huge = Ipv4Packet("10.0.0.2", "10.0.0.1", 17, bytes(16), fragment_offset=65528)
    assert r.receive(huge, 0.0) is None
    pieces = fragments()
    feed(r, [pieces[-1]])
    short_last = attrs.evolve(pieces[-1], fragment_offset=8)  # cuts held bytes off
    assert r.receive(short_last, 0.0) is None
    stats = r.statistics()
    assert (stats.bad_fragments, stats.too_long) == (2, 1)


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 8).map(lambda n: n * 64))
def test_any_order_with_duplicates_reassembles_once(rng: random.Random, size: int) -> None:
    pieces = fragments(size=size)
    pieces += rng.sample(pieces, k=len(pieces) // 2)
    rng.shuffle(pieces)
    r = Reassembler()
    out = feed(r, pieces)
    assert [p.payload for p in out] == [DATA]


# --- ARP ---------------------------------------------------------------------------------------

MAC_A = bytes.fromhex("020000000001")
MAC_B = bytes.fromhex("020000000002")


# --- fragmentation ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 65515),
    mtu=st.integers(68, 65535),
    seed=st.integers(0, 2**32 - 1),
    options=st.sampled_from([b"", bytes([0x94, 4, 0, 0]), bytes([7, 7, 4]) + bytes(5)]),
)
def test_any_datagram_fragmented_at_any_mtu_reassembles_in_any_order(
    size: int, mtu: int, seed: int, options: bytes
) -> None:
    rng = random.Random(seed)
    data = rng.randbytes(max(0, size - len(options)))
    datagram = Ipv4Packet("10.0.0.2", "10.0.0.1", 17, data, identification=seed & 0xFFFF,
                          options=options)  # fmt: skip
    pieces = fragment(datagram, mtu)
    wires = [build_ipv4(p) for p in pieces]  # each is a valid packet within the MTU
    assert all(len(w) <= mtu for w in wires)
    assert all(p.fragment_offset % 8 == 0 for p in pieces)
    assert [p.more_fragments for p in pieces] == [True] * (len(pieces) - 1) + [False]
    if len(pieces) == 1:
        assert pieces == [datagram]
        return
    # The router-alert option (0x94, copied) goes into every fragment; record route does not.
    assert all(p.options == (options if options[:1] != b"\x07" else b"") for p in pieces[1:])
    received = [parse_ipv4(w) for w in wires]
    received += rng.choices(received, k=rng.randint(0, 3))  # duplicates
    rng.shuffle(received)
    r = Reassembler(max_bytes=1 << 17)
    out = feed(r, received)
    # Duplicates that arrive after completion may complete the datagram again (IP has no
    # memory of finished datagrams): every datagram delivered is the original.
    assert out and all(o == datagram for o in out)


def test_df_refuses_and_names_the_sizes() -> None:
    datagram = Ipv4Packet("10.0.0.2", "10.0.0.1", 17, bytes(1481), dont_fragment=True)
    with pytest.raises(FragmentationNeeded, match=r"1501 bytes .* MTU of 1500 .* DF") as error:
        fragment(datagram, 1500)
    assert (error.value.size, error.value.mtu) == (1501, 1500)
    assert fragment(attrs.evolve(datagram, payload=bytes(1480)), 1500) == [
        attrs.evolve(datagram, payload=bytes(1480))
    ]
    with pytest.raises(ValueError, match="at least 68"):
        fragment(datagram, 67)


def test_fragments_are_cut_at_multiples_of_eight() -> None:
    datagram = Ipv4Packet("10.0.0.2", "10.0.0.1", 1, bytes(4008), identification=9)
    pieces = fragment(datagram, 1500)  # ping -s 4000: 1480 + 1480 + 1048
    assert [(p.fragment_offset, len(p.payload), p.more_fragments) for p in pieces] == [
        (0, 1480, True),
        (1480, 1480, True),
        (2960, 1048, False),
    ]
    assert {p.identification for p in pieces} == {9}
    again = fragment(pieces[1], 572)  # a fragment fragmented again keeps its offset and MF
    assert [(p.fragment_offset, p.more_fragments) for p in again] == [
        (1480, True),
        (2032, True),
        (2584, True),
    ]


def arp_of(t: Transmit) -> ArpPacket:
    assert t.ethertype == ETHERTYPE_ARP
    return parse_arp(t.payload)


def test_request_reply_and_release_of_the_queue() -> None:
    a = ArpCache(MAC_A, "10.0.0.1")
    a.resolve("10.0.0.2", b"p1", now=0.0)
    a.resolve("10.0.0.2", b"p2", now=0.1)
    (request,) = a.frames_to_send()  # one request for both packets
    assert request.dst == BROADCAST_MAC
    assert arp_of(request) == ArpPacket(1, MAC_A, "10.0.0.1", bytes(6), "10.0.0.2")
    assert a.get_timer() == 1.0
    # b answers (as ArpCache b would).
    b = ArpCache(MAC_B, "10.0.0.2")
    b.receive(arp_of(request), now=0.2)
    (reply,) = b.frames_to_send()
    assert reply.dst == MAC_A and arp_of(reply).operation == ArpOperation.REPLY
    assert b.lookup("10.0.0.1", 0.2) == MAC_A  # b learned a from the request aimed at it
    a.receive(arp_of(reply), now=0.3)
    assert a.frames_to_send() == [
        Transmit(dst=MAC_B, ethertype=ETHERTYPE_IPV4, payload=b"p1"),
        Transmit(dst=MAC_B, ethertype=ETHERTYPE_IPV4, payload=b"p2"),
    ]
    assert a.get_timer() is None
    a.resolve("10.0.0.2", b"p3", now=0.4)  # a hit
    assert a.frames_to_send() == [Transmit(dst=MAC_B, ethertype=ETHERTYPE_IPV4, payload=b"p3")]
    stats = a.statistics()
    assert (stats.requests_sent, stats.hits, stats.misses, stats.learned) == (1, 1, 2, 1)


def test_retries_then_gives_up_and_counts_the_queue() -> None:
    a = ArpCache(MAC_A, "10.0.0.1", retry_interval=1.0, max_retries=2, max_pending=2)
    for i in range(3):
        a.resolve("10.0.0.9", b"p%d" % i, now=0.0)
    assert len(a.frames_to_send()) == 1 and a.statistics().pending_overflow == 1
    times = []
    while (deadline := a.get_timer()) is not None:
        a.handle_timer(deadline)
        times.append((deadline, len(a.frames_to_send())))
    assert times == [(1.0, 1), (2.0, 1), (3.0, 0)]  # two retries, then give up
    assert a.statistics().unresolved == 2


def test_entries_expire_and_are_refreshed() -> None:
    a = ArpCache(MAC_A, "10.0.0.1", entry_lifetime=60.0)
    a.receive(ArpPacket(2, MAC_B, "10.0.0.2", MAC_A, "10.0.0.1"), now=0.0)
    assert a.lookup("10.0.0.2", 59.9) == MAC_B
    assert a.lookup("10.0.0.2", 60.0) is None
    a.add_static("10.0.0.3", MAC_B)
    assert a.lookup("10.0.0.3", 1e9) == MAC_B


def test_not_for_us_is_ignored_and_probes_teach_nothing() -> None:
    a = ArpCache(MAC_A, "10.0.0.1")
    a.receive(ArpPacket(1, MAC_B, "10.0.0.2", bytes(6), "10.0.0.7"), now=0.0)
    assert a.lookup("10.0.0.2", 0.0) is None and a.statistics().ignored == 1
    assert a.frames_to_send() == []
    a.receive(ArpPacket(1, MAC_B, "0.0.0.0", bytes(6), "10.0.0.1"), now=0.0)  # a probe
    (reply,) = a.frames_to_send()  # defended (RFC 5227) but nothing learned
    assert arp_of(reply).target_ip == "0.0.0.0" and a.statistics().entries == 0
    with pytest.raises(LocalProtocolError):
        a.resolve("10.0.0.1", b"self", now=0.0)
