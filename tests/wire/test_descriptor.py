"""U-Net descriptor byte layouts: golden bytes, round trips, agreement with construct, bad input."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.wire import descriptor as d
from stacklib.wire.descriptor import (
    DescriptorFormatError,
    DescriptorStatus,
    Fragment,
    RecvDescriptor,
    RecvKind,
    SendDescriptor,
    SendError,
)


def send_fields(s: SendDescriptor) -> tuple[Any, ...]:
    """SendDescriptor compares by identity (eq=False): compare its fields."""
    return (s.channel, s.fragments, s.inline, s.dest_offset, s.status, s.error)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, SendDescriptor) and isinstance(b, SendDescriptor):
        return send_fields(a) == send_fields(b)
    return bool(a == b) and type(a) is type(b)


# --- golden bytes, written by hand from the diagrams in the module docstring ------------------

GOLDEN_SEND_FRAGMENTS = bytes.fromhex(
    "0005"  # channel 5
    "40"  # flags: direct
    "02"  # nfrags
    "0000002a"  # length 42
    "00000100"  # dest_offset 256
    "00"  # error code NONE
    "000000"  # pad
    "00000000"
    "00000028"  # fragment (0, 40)
    "00000040"
    "00000002"  # fragment (64, 2)
)
GOLDEN_SEND_INLINE_ERROR = bytes.fromhex(
    "0007"  # channel 7
    "90"  # flags: inline, error
    "00"  # nfrags
    "00000003"  # length 3
    "ffffffff"  # dest_offset none
    "04"  # INLINE_TOO_LONG
    "000000"
    "616263"  # b"abc"
)
GOLDEN_SEND_INJECTED = bytes.fromhex("0001200000000000ffffffff00000000")
GOLDEN_RECV_INLINE = bytes.fromhex("0102010000000002ffffffff000000006869")
GOLDEN_RECV_BUFFERS = bytes.fromhex("0003000100000010ffffffff000000000000100000000010")
GOLDEN_RECV_DIRECT = bytes.fromhex("00040200000000640000200000000000")
GOLDEN_FREE = bytes.fromhex("0001000000000800")

GOLDEN_IDS = ["send-frags", "send-inline-error", "send-injected", "recv-inline", "recv-buffers"]
GOLDEN_IDS += ["recv-direct", "free"]
GOLDEN: list[tuple[bytes, Any, Callable[[Any], bytes], Callable[[bytes], Any]]] = [
    (
        GOLDEN_SEND_FRAGMENTS,
        SendDescriptor(5, (Fragment(0, 40), Fragment(64, 2)), dest_offset=256),
        d.build_send,
        d.parse_send,
    ),
    (
        GOLDEN_SEND_INLINE_ERROR,
        SendDescriptor(
            7, inline=b"abc", status=DescriptorStatus.ERROR, error=SendError.INLINE_TOO_LONG
        ),
        d.build_send,
        d.parse_send,
    ),
    (
        GOLDEN_SEND_INJECTED,
        SendDescriptor(1, status=DescriptorStatus.INJECTED),
        d.build_send,
        d.parse_send,
    ),
    (
        GOLDEN_RECV_INLINE,
        RecvDescriptor(0x102, 2, RecvKind.INLINE, (), b"hi"),
        d.build_recv,
        d.parse_recv,
    ),
    (
        GOLDEN_RECV_BUFFERS,
        RecvDescriptor(3, 16, RecvKind.BUFFERS, (Fragment(0x1000, 16),)),
        d.build_recv,
        d.parse_recv,
    ),
    (
        GOLDEN_RECV_DIRECT,
        RecvDescriptor(4, 100, RecvKind.DIRECT, dest_offset=0x2000),
        d.build_recv,
        d.parse_recv,
    ),
    (GOLDEN_FREE, Fragment(0x10000, 0x800), d.build_free, d.parse_free),
]

REFERENCE: dict[Any, Any] = {
    d.parse_send: d.parse_send_reference,
    d.parse_recv: d.parse_recv_reference,
    d.parse_free: d.parse_free_reference,
}


@pytest.mark.parametrize(("raw", "value", "build", "parse"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_bytes(raw: bytes, value: Any, build: Any, parse: Any) -> None:
    assert build(value) == raw
    assert same(parse(raw), value)
    assert same(REFERENCE[parse](raw), value)
    assert same(parse(bytearray(raw)), value)
    assert same(parse(memoryview(raw)), value)


@pytest.mark.parametrize(("raw", "value", "build", "parse"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_every_prefix_and_any_trailing_bytes_fail(
    raw: bytes, value: Any, build: Any, parse: Any
) -> None:
    for end in range(len(raw)):
        with pytest.raises(DescriptorFormatError):
            parse(raw[:end])
        with pytest.raises(DescriptorFormatError):
            REFERENCE[parse](raw[:end])
    for extra in (b"\x00", b"\xff" * 8):
        with pytest.raises(DescriptorFormatError, match="trailing"):
            parse(raw + extra)
        with pytest.raises(DescriptorFormatError):
            REFERENCE[parse](raw + extra)


def test_header_size_and_codec_fields() -> None:
    assert d.SEND_HEADER_CODEC.size == d.RECV_HEADER_CODEC.size == d.HEADER_SIZE == 16
    assert d.SEND_HEADER_FORMAT.sizeof() == d.RECV_HEADER_FORMAT.sizeof() == 16
    assert d.SEND_HEADER_CODEC.names == (
        "channel",
        "inline",
        "direct",
        "injected",
        "error",
        "nfrags",
        "length",
        "dest_offset",
        "error_code",
    )
    assert d.RECV_HEADER_CODEC.names == ("channel", "kind", "nfrags", "length", "dest_offset")


# --- round trips and agreement with the construct definitions ----------------------------------


@given(d.send_descriptors())
def test_send_round_trip(desc: SendDescriptor) -> None:
    raw = d.build_send(desc)
    assert send_fields(d.parse_send(raw)) == send_fields(desc)
    assert send_fields(d.parse_send_reference(raw)) == send_fields(desc)


@given(d.recv_descriptors())
def test_recv_round_trip(desc: RecvDescriptor) -> None:
    raw = d.build_recv(desc)
    assert d.parse_recv(raw) == desc
    assert d.parse_recv_reference(raw) == desc


@given(d.free_descriptors())
def test_free_round_trip(frag: Fragment) -> None:
    raw = d.build_free(frag)
    assert d.parse_free(raw) == frag == d.parse_free_reference(raw)
    assert raw == d.FREE_DESCRIPTOR_FORMAT.build({"buffer": frag._asdict()})


def _send_container(desc: SendDescriptor) -> dict[str, Any]:
    inline = desc.inline is not None
    return {
        "header": {
            "channel": desc.channel,
            "flags": {
                "inline": inline,
                "direct": desc.dest_offset is not None,
                "injected": desc.status is DescriptorStatus.INJECTED,
                "error": desc.status is DescriptorStatus.ERROR,
            },
            "nfrags": len(desc.fragments),
            "length": desc.length,
            "dest_offset": d.NO_OFFSET if desc.dest_offset is None else desc.dest_offset,
            "error_code": int(desc.error),
        },
        "fragments": None if inline else [f._asdict() for f in desc.fragments],
        "inline": desc.inline,
    }


@given(d.send_descriptors())
def test_send_build_equals_construct_build(desc: SendDescriptor) -> None:
    assert d.build_send(desc) == d.SEND_DESCRIPTOR_FORMAT.build(_send_container(desc))


@given(d.recv_descriptors())
def test_recv_build_equals_construct_build(desc: RecvDescriptor) -> None:
    container = {
        "header": {
            "channel": desc.channel,
            "kind": int(desc.kind),
            "nfrags": len(desc.fragments),
            "length": desc.length,
            "dest_offset": d.NO_OFFSET if desc.dest_offset is None else desc.dest_offset,
        },
        "fragments": None
        if desc.kind is RecvKind.INLINE
        else [f._asdict() for f in desc.fragments],
        "inline": desc.inline,
    }
    assert d.build_recv(desc) == d.RECV_DESCRIPTOR_FORMAT.build(container)


# --- arbitrary and damaged input: a value or DescriptorFormatError, and fast == reference ------


def _outcome(parse: Callable[[bytes], Any], raw: bytes) -> Any:
    try:
        value = parse(raw)
    except DescriptorFormatError:
        return DescriptorFormatError
    return send_fields(value) if isinstance(value, SendDescriptor) else value


def _check_agreement(parse: Callable[[bytes], Any], raw: bytes) -> None:
    frozen = bytearray(raw)
    fast = _outcome(parse, frozen)  # type: ignore[arg-type]
    assert frozen == raw  # parsers never mutate their input
    assert fast == _outcome(REFERENCE[parse], raw)


@st.composite
def damaged(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding with one mutation: a byte changed, a cut, an insertion, an append."""
    raw = bytearray(draw(valid))
    how = draw(st.sampled_from(["set", "cut", "insert", "append", "flip_header"]))
    if how == "set" and raw:
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        del raw[draw(st.integers(0, len(raw))) :]
    elif how == "insert":
        raw.insert(draw(st.integers(0, len(raw))), draw(st.integers(0, 255)))
    elif how == "append":
        raw += draw(st.binary(min_size=1, max_size=9))
    elif len(raw) >= 16:  # flip one bit in the header: flags, kind, nfrags, lengths
        raw[draw(st.integers(0, 15))] ^= 1 << draw(st.integers(0, 7))
    return bytes(raw)


ENCODINGS: dict[Any, st.SearchStrategy[bytes]] = {
    d.parse_send: d.send_descriptors().map(d.build_send),
    d.parse_recv: d.recv_descriptors().map(d.build_recv),
    d.parse_free: d.free_descriptors().map(d.build_free),
}


@pytest.mark.parametrize("parse", [d.parse_send, d.parse_recv, d.parse_free])
@given(raw=st.binary(max_size=48))
def test_arbitrary_bytes(parse: Callable[[bytes], Any], raw: bytes) -> None:
    _check_agreement(parse, raw)


@pytest.mark.parametrize("parse", [d.parse_send, d.parse_recv, d.parse_free])
@given(data=st.data())
def test_damaged_encodings(parse: Callable[[bytes], Any], data: st.DataObject) -> None:
    _check_agreement(parse, data.draw(damaged(ENCODINGS[parse])))


@pytest.mark.parametrize("parse", [d.parse_send, d.parse_recv, d.parse_free])
@given(data=st.data())
def test_trailing_bytes_are_refused(parse: Callable[[bytes], Any], data: st.DataObject) -> None:
    raw = data.draw(ENCODINGS[parse]) + data.draw(st.binary(min_size=1, max_size=16))
    with pytest.raises(DescriptorFormatError):
        parse(raw)
    with pytest.raises(DescriptorFormatError):
        REFERENCE[parse](raw)


# --- each sanity rule, on a golden encoding with one field changed ----------------------------


def _patch(raw: bytes, at: int, value: bytes) -> bytes:
    return raw[:at] + value + raw[at + len(value) :]


BAD = [
    ("unknown error code", d.parse_send, _patch(GOLDEN_SEND_INLINE_ERROR, 12, b"\x09")),
    ("injected and error", d.parse_send, _patch(GOLDEN_SEND_INLINE_ERROR, 2, b"\xb0")),
    ("error flag, code NONE", d.parse_send, _patch(GOLDEN_SEND_INLINE_ERROR, 12, b"\x00")),
    ("code without error flag", d.parse_send, _patch(GOLDEN_SEND_INJECTED, 12, b"\x01")),
    ("direct without offset", d.parse_send, _patch(GOLDEN_SEND_INJECTED, 2, b"\x60")),
    ("offset without direct", d.parse_send, _patch(GOLDEN_SEND_FRAGMENTS, 2, b"\x00")),
    ("inline with nfrags", d.parse_send, _patch(GOLDEN_SEND_INLINE_ERROR, 3, b"\x01")),
    ("fragments sum", d.parse_send, _patch(GOLDEN_SEND_FRAGMENTS, 7, b"\x2b")),
    ("unknown kind", d.parse_recv, _patch(GOLDEN_RECV_DIRECT, 2, b"\x03")),
    ("direct without offset", d.parse_recv, _patch(GOLDEN_RECV_DIRECT, 8, b"\xff\xff\xff\xff")),
    ("buffers with offset", d.parse_recv, _patch(GOLDEN_RECV_BUFFERS, 8, b"\x00\x00\x00\x00")),
    ("buffers sum", d.parse_recv, _patch(GOLDEN_RECV_BUFFERS, 4, b"\x00\x00\x00\x11")),
    ("direct with fragments", d.parse_recv, _patch(GOLDEN_RECV_DIRECT, 3, b"\x01") + bytes(8)),
    ("truncated inline", d.parse_recv, _patch(GOLDEN_RECV_INLINE, 4, b"\x00\x00\x00\x03")),
    ("truncated fragments", d.parse_send, _patch(GOLDEN_SEND_FRAGMENTS, 3, b"\x03")),
]


@pytest.mark.parametrize(("why", "parse", "raw"), BAD, ids=[b[0] for b in BAD])
def test_sanity_rules(why: str, parse: Callable[[bytes], Any], raw: bytes) -> None:
    with pytest.raises(DescriptorFormatError):
        parse(raw)
    with pytest.raises(DescriptorFormatError):
        REFERENCE[parse](raw)


def test_reserved_bits_and_padding_are_ignored() -> None:
    raw = _patch(GOLDEN_SEND_INJECTED, 2, b"\x2f")  # reserved flag bits set
    raw = _patch(raw, 13, b"\xff\xff\xff")
    assert send_fields(d.parse_send(raw)) == send_fields(d.parse_send(GOLDEN_SEND_INJECTED))
    raw = _patch(GOLDEN_RECV_DIRECT, 12, b"\xff\xff\xff\xff")
    assert d.parse_recv(raw) == d.parse_recv(GOLDEN_RECV_DIRECT)


# --- build refuses what the layout cannot represent --------------------------------------------

UNBUILDABLE_SEND = [
    SendDescriptor(1, (Fragment(0, 1),), inline=b"x"),
    SendDescriptor(1, tuple(Fragment(0, 1) for _ in range(256))),
    SendDescriptor(1, inline=b"", dest_offset=d.NO_OFFSET),
    SendDescriptor(1, inline=b"", status=DescriptorStatus.ERROR),
    SendDescriptor(1, inline=b"", error=SendError.TOO_LONG),
    SendDescriptor(1 << 16, inline=b""),
    SendDescriptor(1, (Fragment(1 << 32, 1),)),
    SendDescriptor(1, (Fragment(0, 0xFFFFFFFF), Fragment(0, 1))),
]


@pytest.mark.parametrize("desc", UNBUILDABLE_SEND)
def test_build_send_refuses(desc: SendDescriptor) -> None:
    with pytest.raises(ValueError) as info:
        d.build_send(desc)
    assert not isinstance(info.value, DescriptorFormatError)


UNBUILDABLE_RECV = [
    RecvDescriptor(1, 2, RecvKind.INLINE, (), b"abc"),
    RecvDescriptor(1, 0, RecvKind.INLINE, (Fragment(0, 0),), b""),
    RecvDescriptor(1, 0, RecvKind.INLINE),
    RecvDescriptor(1, 3, RecvKind.BUFFERS, (), b"abc"),
    RecvDescriptor(1, 3, RecvKind.BUFFERS, (Fragment(0, 2),)),
    RecvDescriptor(1, 3, RecvKind.BUFFERS, (Fragment(0, 3),), dest_offset=4),
    RecvDescriptor(1, 3, RecvKind.DIRECT),
    RecvDescriptor(1, 3, RecvKind.DIRECT, (Fragment(0, 3),), dest_offset=4),
    RecvDescriptor(1, 3, RecvKind.DIRECT, dest_offset=d.NO_OFFSET),
    RecvDescriptor(1 << 16, 0, RecvKind.BUFFERS),
]


@pytest.mark.parametrize("desc", UNBUILDABLE_RECV)
def test_build_recv_refuses(desc: RecvDescriptor) -> None:
    with pytest.raises(ValueError):
        d.build_recv(desc)


def test_build_free_refuses_out_of_range() -> None:
    with pytest.raises(ValueError):
        d.build_free(Fragment(-1, 0))


def test_imports_without_hypothesis() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import stacklib.wire.descriptor, stacklib.wire.unet_eth\n"
        "try:\n"
        "    stacklib.wire.descriptor.send_descriptors()\n"
        "except ImportError:\n"
        "    print('lazy')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "lazy"
