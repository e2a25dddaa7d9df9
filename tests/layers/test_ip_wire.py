"""IPv4, ICMP, ARP and Ethernet II formats and the Internet checksum: golden bytes, round
trips, any input, and the derived codecs against their construct definitions."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.layers.ip import wire
from stacklib.layers.ip.wire import (
    ArpFormatError,
    ArpOperation,
    ArpPacket,
    EthernetFormatError,
    EthernetFrame,
    IcmpErrorKind,
    IcmpFormatError,
    IcmpMessage,
    Ipv4ErrorKind,
    Ipv4FormatError,
    Ipv4Packet,
)
from stacklib.wire import registry

BUFFERS = (bytes, bytearray, memoryview)

# RFC 791-style header from the classic worked example: 45 00 00 73 00 00 40 00 40 11 b8 61
# c0 a8 00 01 c0 a8 00 c7 (192.168.0.1 -> 192.168.0.199, UDP, DF, TTL 64).
GOLDEN_HEADER = bytes.fromhex("450000730000400040 11b861c0a80001c0a800c7".replace(" ", ""))


# --- the checksum ------------------------------------------------------------------------------


def test_rfc1071_example_sum() -> None:
    # RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (with the end-around carry).
    data = bytes.fromhex("0001f203f4f5f6f7")
    assert wire.ones_sum(data) == 0xDDF2
    assert wire.checksum(data) == 0x220D
    assert wire.checksum_reference(data) == 0x220D


def test_known_ipv4_header_checksum() -> None:
    zeroed = GOLDEN_HEADER[:10] + b"\0\0" + GOLDEN_HEADER[12:]
    assert wire.checksum(zeroed) == 0xB861
    assert wire.checksum(GOLDEN_HEADER) == 0  # a correct header sums to all ones


def test_checksum_edge_cases() -> None:
    assert wire.ones_sum(b"") == 0
    assert wire.checksum(b"") == 0xFFFF
    assert wire.ones_sum(b"\xff\xff") == 0xFFFF  # "negative zero", not 0
    assert wire.ones_sum(b"\x01") == 0x0100  # odd length: padded with a zero byte
    assert wire.ones_sum(bytes(5000)) == 0
    assert wire.ones_sum(b"\xff" * 5000) == 0xFFFF


@given(
    st.one_of(
        st.binary(max_size=100),
        st.binary(min_size=1020, max_size=1030),  # around the switch to numpy's word sum
        st.binary(min_size=2040, max_size=9000),
    )
)
def test_fast_checksum_agrees_with_rfc1071_loop(data: bytes) -> None:
    assert wire.checksum(data) == wire.checksum_reference(data)
    copy, total = wire.copy_with_sum(memoryview(data))
    assert copy == data and ~total & 0xFFFF == wire.checksum_reference(data)


@given(
    st.binary(max_size=64).map(lambda b: b + b"\0" * (len(b) & 1)),
    st.one_of(st.binary(max_size=64), st.binary(min_size=1025, max_size=1100)),
)
def test_sums_combine(first: bytes, second: bytes) -> None:
    # An even-length first part: the sum of a concatenation is the ones' complement sum of sums.
    assert wire.ones_sum(second, wire.ones_sum(first)) == wire.ones_sum(first + second)


# --- IPv4 --------------------------------------------------------------------------------------


def test_ipv4_golden_bytes() -> None:
    packet = Ipv4Packet(
        "192.168.0.1", "192.168.0.199", 17, bytes(0x73 - 20), ttl=64, dont_fragment=True
    )
    built = wire.build_ipv4(packet)
    assert built[:20] == GOLDEN_HEADER
    assert wire.parse_ipv4(built) == packet == wire.parse_ipv4_reference(built)


@given(wire.ipv4_packets(), st.sampled_from(BUFFERS), st.binary(max_size=8))
def test_ipv4_round_trip_with_trailing_padding(
    packet: Ipv4Packet, buffer: type, padding: bytes
) -> None:
    built = wire.build_ipv4(packet)
    assert len(built) == packet.total_length
    assert wire.parse_ipv4(buffer(built + padding)) == packet
    assert wire.parse_ipv4_reference(built + padding) == packet


@given(st.binary(max_size=80))
def test_ipv4_any_input_raises_only_its_error_and_agrees_with_reference(data: bytes) -> None:
    try:
        packet = wire.parse_ipv4(data)
    except Ipv4FormatError as error:
        with pytest.raises(Ipv4FormatError) as reference:
            wire.parse_ipv4_reference(data)
        assert reference.value.kind == error.kind
    else:
        assert wire.parse_ipv4_reference(data) == packet
        assert wire.build_ipv4(packet) == data[: packet.total_length]


@given(wire.ipv4_packets(), st.binary(max_size=8))
def test_the_simple_codecs_agree_with_build_and_parse(packet: Ipv4Packet, padding: bytes) -> None:
    simple = attrs.evolve(
        packet,
        tos=0,
        dont_fragment=True,
        more_fragments=False,
        fragment_offset=0,
        reserved_flag=False,
        options=b"",
    )
    src, dst = wire.ip_bytes(simple.src), wire.ip_bytes(simple.dst)
    built = wire.build_ipv4_simple(
        src, dst, simple.protocol, simple.payload, simple.ttl, simple.identification
    )
    assert built == wire.build_ipv4(simple)
    assert wire.parse_ipv4_simple(built + padding) == (src, dst, simple.protocol, simple.payload)
    # Anything the fast parse takes, parse_ipv4 reads the same way; the rest it leaves to it.
    whole = wire.build_ipv4(packet) + padding
    fast = wire.parse_ipv4_simple(whole)
    if packet.options or packet.is_fragment or packet.reserved_flag:
        assert fast is None
    else:
        parsed = wire.parse_ipv4(whole)
        assert fast == (src, dst, parsed.protocol, parsed.payload)


@given(st.binary(max_size=80))
def test_the_simple_parse_never_takes_what_parse_rejects(data: bytes) -> None:
    fast = wire.parse_ipv4_simple(data)
    if fast is not None:
        packet = wire.parse_ipv4(data)
        assert fast == (
            wire.ip_bytes(packet.src),
            wire.ip_bytes(packet.dst),
            packet.protocol,
            packet.payload,
        )


def test_the_simple_build_refuses_caller_mistakes() -> None:
    a = wire.ip_bytes("10.0.0.1")
    with pytest.raises(ValueError, match="exceeds"):
        wire.build_ipv4_simple(a, a, 6, bytes(65516), 64, 0)
    with pytest.raises(ValueError, match="out of range"):
        wire.build_ipv4_simple(a, a, 256, b"", 64, 0)


@given(wire.ipv4_packets(max_payload=64), st.data())
def test_ipv4_corruption_is_caught(packet: Ipv4Packet, data: st.DataObject) -> None:
    built = bytearray(wire.build_ipv4(packet))
    index = data.draw(st.integers(0, packet.header_length - 1))
    built[index] ^= data.draw(st.integers(1, 255))
    with pytest.raises(Ipv4FormatError):
        wire.parse_ipv4(built)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (GOLDEN_HEADER[:19], Ipv4ErrorKind.SHORT),
        (b"\x65" + GOLDEN_HEADER[1:], Ipv4ErrorKind.VERSION),
        (b"\x44" + GOLDEN_HEADER[1:], Ipv4ErrorKind.HEADER_LENGTH),
        (b"\x46" + GOLDEN_HEADER[1:], Ipv4ErrorKind.HEADER_LENGTH),  # options past the data
        (GOLDEN_HEADER, Ipv4ErrorKind.TOTAL_LENGTH),  # 0x73 bytes claimed, 20 present
        (GOLDEN_HEADER[:2] + b"\x00\x13" + GOLDEN_HEADER[4:], Ipv4ErrorKind.TOTAL_LENGTH),
        (GOLDEN_HEADER[:2] + b"\x00\x14" + GOLDEN_HEADER[4:], Ipv4ErrorKind.CHECKSUM),
    ],
)
def test_ipv4_checks(data: bytes, kind: Ipv4ErrorKind) -> None:
    with pytest.raises(Ipv4FormatError) as error:
        wire.parse_ipv4(data)
    assert error.value.kind == kind
    assert str(error.value).startswith("IPv4: ")


def test_ipv4_options_are_skipped_and_checksum_can_be_left_to_the_ni() -> None:
    packet = Ipv4Packet("10.0.0.1", "10.0.0.2", 6, b"tcp", options=b"\x01\x01\x01\x00")
    built = bytearray(wire.build_ipv4(packet))
    assert built[0] == 0x46
    assert wire.parse_ipv4(built).payload == b"tcp"
    built[10] ^= 1
    assert wire.parse_ipv4(built, verify_checksum=False).payload == b"tcp"


def test_ipv4_build_rejects_caller_mistakes() -> None:
    base = Ipv4Packet("10.0.0.1", "10.0.0.2", 17, b"")
    for bad in (
        {"options": b"\x01"},
        {"options": bytes(44)},
        {"fragment_offset": 4},
        {"payload": bytes(65536)},
        {"ttl": 256},
        {"src": "10.0.0.256"},
    ):
        with pytest.raises(ValueError):
            wire.build_ipv4(attrs.evolve(base, **bad))


@given(
    st.tuples(
        st.integers(0, 15), st.integers(0, 15), st.integers(0, 255), st.integers(0, 0xFFFF),
        st.integers(0, 0xFFFF), st.booleans(), st.booleans(), st.booleans(),
        st.integers(0, 0x1FFF), st.integers(0, 255), st.integers(0, 255), st.integers(0, 0xFFFF),
        st.binary(min_size=4, max_size=4), st.binary(min_size=4, max_size=4),
    )
)  # fmt: skip
def test_ipv4_codec_agrees_with_construct(values: tuple[object, ...]) -> None:
    packed = wire.IPV4_CODEC.pack(*values)
    names = wire.IPV4_CODEC.names
    v = dict(zip(names, values, strict=True))
    spec = wire.IPV4_HEADER_FORMAT.build(
        {
            "vihl": {"version": v["version"], "ihl": v["ihl"]},
            "frag": {k: v[k] for k in ("reserved", "df", "mf", "fragment_offset")},
            **{k: v[k] for k in names if k not in
               ("version", "ihl", "reserved", "df", "mf", "fragment_offset")},
        }
    )  # fmt: skip
    assert packed == spec
    assert wire.IPV4_CODEC.unpack(packed) == values


# --- ICMP --------------------------------------------------------------------------------------


def test_icmp_echo_golden_bytes() -> None:
    # Echo request, id 1, seq 1, data "abcd": checksum computed by hand from the words
    # 0800 0000 0001 0001 6162 6364: 0x0800 + 0x0001 + 0x0001 + 0x6162 + 0x6364 = 0xccc8,
    # complement 0x3337.
    built = wire.build_icmp(IcmpMessage.echo_request(1, 1, b"abcd"))
    assert built == bytes.fromhex("0800333700010001") + b"abcd"
    message = wire.parse_icmp(built)
    assert (message.type, message.identifier, message.sequence) == (8, 1, 1)


@given(wire.icmp_messages(), st.sampled_from(BUFFERS))
def test_icmp_round_trip(message: IcmpMessage, buffer: type) -> None:
    built = wire.build_icmp(message)
    assert wire.parse_icmp(buffer(built)) == message == wire.parse_icmp_reference(built)


@given(st.binary(max_size=40))
def test_icmp_any_input(data: bytes) -> None:
    try:
        message = wire.parse_icmp(data)
    except IcmpFormatError as error:
        with pytest.raises(IcmpFormatError) as reference:
            wire.parse_icmp_reference(data)
        assert reference.value.kind == error.kind
    else:
        assert wire.build_icmp(message) == data


def test_icmp_short_and_bad_checksum() -> None:
    with pytest.raises(IcmpFormatError) as error:
        wire.parse_icmp(b"\x08\0\0\0")
    assert error.value.kind == IcmpErrorKind.SHORT
    with pytest.raises(IcmpFormatError) as error:
        wire.parse_icmp(bytes.fromhex("0800000000010001"))
    assert error.value.kind == IcmpErrorKind.CHECKSUM


# --- ARP and Ethernet ---------------------------------------------------------------------------

MAC_A = bytes.fromhex("020000000001")


def test_arp_request_golden_bytes() -> None:
    request = ArpPacket(ArpOperation.REQUEST, MAC_A, "10.0.0.1", bytes(6), "10.0.0.2")
    built = wire.build_arp(request)
    assert built == bytes.fromhex(
        "0001 0800 06 04 0001 020000000001 0a000001 000000000000 0a000002".replace(" ", "")
    )
    assert wire.parse_arp(built + bytes(18)) == request  # Ethernet padding ignored


@given(wire.arp_packets(), st.sampled_from(BUFFERS))
def test_arp_round_trip(packet: ArpPacket, buffer: type) -> None:
    built = wire.build_arp(packet)
    assert wire.parse_arp(buffer(built)) == packet == wire.parse_arp_reference(built)


@given(st.binary(max_size=40))
def test_arp_any_input(data: bytes) -> None:
    try:
        packet = wire.parse_arp(data)
    except ArpFormatError as error:
        with pytest.raises(ArpFormatError) as reference:
            wire.parse_arp_reference(data)
        assert reference.value.kind == error.kind
    else:
        assert wire.build_arp(packet) == data[:28]


def test_ethernet_golden_bytes_and_padding() -> None:
    frame = EthernetFrame(wire.BROADCAST_MAC, MAC_A, wire.ETHERTYPE_ARP, b"x")
    built = wire.build_ethernet(frame)
    assert built[:14] == bytes.fromhex("ffffffffffff0200000000010806")
    assert len(built) == 60
    assert wire.parse_ethernet(built).payload == b"x" + bytes(45)
    with pytest.raises(EthernetFormatError):
        wire.parse_ethernet(built[:12] + b"\x05\xdc" + built[14:])  # an 802.3 length


@given(wire.ethernet_frames(max_payload=100), st.sampled_from(BUFFERS))
def test_ethernet_round_trip(frame: EthernetFrame, buffer: type) -> None:
    built = wire.build_ethernet(frame)
    assert wire.parse_ethernet(buffer(built)) == frame == wire.parse_ethernet_reference(built)


@given(st.binary(max_size=30))
def test_ethernet_any_input(data: bytes) -> None:
    try:
        frame = wire.parse_ethernet(data)
    except EthernetFormatError:
        with pytest.raises(EthernetFormatError):
            wire.parse_ethernet_reference(data)
    else:
        assert wire.build_ethernet(frame, pad=False) == data


@settings(max_examples=30)
@given(st.binary(min_size=28, max_size=28))
def test_arp_and_ethernet_codecs_agree_with_construct(data: bytes) -> None:
    values = wire.ARP_CODEC.unpack(data)
    assert wire.ARP_CODEC.pack(*values) == data
    assert wire.ARP_FORMAT.build(dict(zip(wire.ARP_CODEC.names, values, strict=True))) == data
    for codec, spec, size in (
        (wire.ETHERNET_CODEC, wire.ETHERNET_HEADER_FORMAT, 14),
        (wire.ICMP_CODEC, wire.ICMP_HEADER_FORMAT, 8),
    ):
        values = codec.unpack(data)
        assert spec.build(dict(zip(codec.names, values, strict=True))) == data[:size]


def test_formats_are_registered_for_decode() -> None:
    names = registry.formats()
    assert {"ipv4", "icmp", "arp", "ethernet"} <= set(names)
    text = registry.decode("ipv4", wire.build_ipv4(Ipv4Packet("10.0.0.1", "10.0.0.2", 17, b"")))
    assert "src: 10.0.0.1" in text and "protocol: UDP" in text
    assert "sequence: 7" in registry.decode("icmp", wire.build_icmp(IcmpMessage.echo_reply(1, 7)))


def test_addresses() -> None:
    assert wire.ip_bytes("10.0.0.1") == b"\n\0\0\1"
    assert wire.ip_str(b"\n\0\0\1") == "10.0.0.1"
    for bad in ("10.0.0", "1", "10.0.0.1.2", "::1"):
        with pytest.raises(ValueError):
            wire.ip_bytes(bad)


@given(wire.ipv4_packets(max_payload=16), st.integers(0, 159))
def test_the_simple_parse_refuses_a_corrupted_header(packet: Ipv4Packet, bit: int) -> None:
    simple = attrs.evolve(
        packet, tos=0, dont_fragment=True, more_fragments=False, fragment_offset=0, options=b""
    )
    src, dst = wire.ip_bytes(simple.src), wire.ip_bytes(simple.dst)
    summed = wire.build_ipv4_summed(
        src,
        dst,
        wire.address_sum(src, dst),
        simple.protocol,
        simple.payload,
        simple.ttl,
        simple.identification,
    )
    assert summed == wire.build_ipv4(attrs.evolve(simple, reserved_flag=False))
    data = bytearray(summed)
    data[bit // 8] ^= 1 << (bit % 8)
    assert wire.parse_ipv4_simple(bytes(data)) is None  # one flipped bit: the header sum fails


def test_the_summed_build_refuses_caller_mistakes() -> None:
    a = wire.ip_bytes("10.0.0.1")
    with pytest.raises(ValueError, match="4 bytes"):
        wire.build_ipv4_simple(a, b"\x01\x02\x03", 6, b"", 64, 0)
    with pytest.raises(ValueError, match="out of range"):
        wire.build_ipv4_summed(a, a, wire.address_sum(a, a), 6, b"", 64, -(1 << 40))
    with pytest.raises(ValueError, match="out of range"):
        wire.build_ipv4_summed(a, a, wire.address_sum(a, a), 6, b"", 256, 0)
