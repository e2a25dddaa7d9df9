"""Split-C scalar-access messages: golden words, round trips, malformed input, codec vs
construct."""

from __future__ import annotations

import struct
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.layers.splitc.wire import (
    REPLY_CODEC,
    REPLY_FORMAT,
    REQUEST_CODEC,
    REQUEST_FORMAT,
    Kind,
    Reply,
    Request,
    SplitcErrorKind,
    SplitcFormatError,
    Status,
    build_reply,
    build_request,
    parse_reply,
    parse_request,
    parse_request_reference,
    replies,
    reply_fields,
    reply_words,
    request_fields,
    request_words,
    requests,
)

VALUE = bytes(range(1, 9))


def test_golden_request() -> None:
    # kind 1 (READ) | size 8 = 0x18, region 3, op 0x0102, offset 0x10, value 01..08
    words = build_request(Request(Kind.READ, 8, 3, 0x0102, 0x10, VALUE))
    assert words == (0x18030102, 0x00000010, 0x01020304, 0x05060708)


def test_golden_reply() -> None:
    # kind 5 (VALUE) | size 4 = 0x54, status 2 (out of bounds), op 0xBEEF, reserved, value
    words = build_reply(Reply(Kind.VALUE, 4, Status.OUT_OF_BOUNDS, 0xBEEF, VALUE))
    assert words == (0x5402BEEF, 0, 0x01020304, 0x05060708)


@given(requests())
def test_request_round_trip(request: Request) -> None:
    words = build_request(request)
    assert len(words) == 4
    assert parse_request(words) == request
    assert parse_request_reference(words) == request


@given(replies())
def test_reply_round_trip(reply: Reply) -> None:
    assert parse_reply(build_reply(reply)) == reply


@given(st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4))
def test_any_request_words_parse_or_raise_the_same(words: list[int]) -> None:
    try:
        request = parse_request(words)
    except SplitcFormatError as error:
        with pytest.raises(SplitcFormatError) as reference:
            parse_request_reference(words)
        assert reference.value.kind == error.kind
    else:
        assert parse_request_reference(words) == request
        assert build_request(request) == tuple(words)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4))
def test_any_reply_words_parse_or_raise(words: list[int]) -> None:
    try:
        reply = parse_reply(words)
    except SplitcFormatError as error:
        assert error.kind in {
            SplitcErrorKind.UNKNOWN_KIND,
            SplitcErrorKind.BAD_SIZE,
            SplitcErrorKind.BAD_STATUS,
        }
    else:
        rebuilt = build_reply(reply)
        assert rebuilt[0] == words[0] and rebuilt[2:] == tuple(words[2:])


@pytest.mark.parametrize(
    ("words", "kind"),
    [
        ((1, 2, 3), SplitcErrorKind.WORDS),
        ((1, 2, 3, 4, 5), SplitcErrorKind.WORDS),
        ((-1, 0, 0, 0), SplitcErrorKind.WORDS),
        ((2**32, 0, 0, 0), SplitcErrorKind.WORDS),
        ((0x58000000, 0, 0, 0), SplitcErrorKind.UNKNOWN_KIND),  # a reply kind as request
        ((0x13000000, 0, 0, 0), SplitcErrorKind.BAD_SIZE),  # READ of 3 bytes
        ((0x00000000, 0, 0, 0), SplitcErrorKind.UNKNOWN_KIND),
    ],
)
def test_malformed_requests(words: tuple[int, ...], kind: SplitcErrorKind) -> None:
    with pytest.raises(SplitcFormatError) as error:
        parse_request(words)
    assert error.value.kind == kind


def test_malformed_replies() -> None:
    with pytest.raises(SplitcFormatError) as error:
        parse_reply((0x58090000, 0, 0, 0))  # status 9
    assert error.value.kind == SplitcErrorKind.BAD_STATUS
    with pytest.raises(SplitcFormatError) as error:
        parse_reply((0x18000000, 0, 0, 0))  # READ is not a reply
    assert error.value.kind == SplitcErrorKind.UNKNOWN_KIND


def test_build_rejects_bad_values() -> None:
    with pytest.raises(SplitcFormatError):
        build_request(Request(Kind.READ, 3, 0, 0, 0))
    with pytest.raises(ValueError, match="8 bytes"):
        build_request(Request(Kind.WRITE, 8, 0, 0, 0, bytes(9)))
    with pytest.raises(ValueError):
        build_request(Request(Kind.READ, 8, 256, 0, 0))


@given(
    st.integers(0, 15),
    st.integers(0, 15),
    st.integers(0, 255),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**32 - 1),
    st.binary(min_size=8, max_size=8),
)
def test_request_codec_agrees_with_construct(
    kind: int, size: int, region: int, op: int, offset: int, value: bytes
) -> None:
    packed = REQUEST_CODEC.pack(kind, size, region, op, offset, value)
    spec = {
        "code": {"kind": kind, "size": size},
        "region": region,
        "op": op,
        "offset": offset,
        "value": value,
    }
    assert packed == REQUEST_FORMAT.build(spec)
    assert REQUEST_CODEC.unpack(packed) == (kind, size, region, op, offset, value)


@given(
    st.integers(0, 15),
    st.integers(0, 15),
    st.integers(0, 255),
    st.integers(0, 0xFFFF),
    st.binary(min_size=8, max_size=8),
)
def test_reply_codec_agrees_with_construct(
    kind: int, size: int, status: int, op: int, value: bytes
) -> None:
    packed = REPLY_CODEC.pack(kind, size, status, op, value)
    spec = {
        "code": {"kind": kind, "size": size},
        "status": status,
        "op": op,
        "_reserved": 0,
        "value": value,
    }
    assert packed == REPLY_FORMAT.build(spec)
    assert struct.unpack(">4I", packed)[1] == 0


# --- the per-message path: tuples, the same words and fields --------------------------------

WORD = st.integers(0, 2**32 - 1)
ANY_WORD = st.one_of(WORD, st.integers(-5, 2**33), st.booleans(), st.none())


@given(requests())
def test_request_words_are_build_requests(request: Request) -> None:
    fields = (request.kind, request.size, request.region, request.op, request.offset)
    value = request.value.rstrip(b"\0")  # shorter values are padded the same way
    assert request_words(*fields, request.value) == build_request(request)
    assert request_words(*fields, value) == build_request(attrs.evolve(request, value=value))
    assert request_fields(build_request(request)) == attrs.astuple(request, recurse=False)


@given(replies())
def test_reply_words_are_build_replies(reply: Reply) -> None:
    assert reply_words(reply.kind, reply.size, reply.status, reply.op, reply.value) == (
        build_reply(reply)
    )
    assert reply_fields(build_reply(reply)) == attrs.astuple(reply, recurse=False)


@pytest.mark.parametrize(
    ("fields", "parse"), [(request_fields, parse_request), (reply_fields, parse_reply)]
)
@given(words=st.lists(ANY_WORD, min_size=0, max_size=6))
def test_fields_parse_or_raise_as_the_codec_path(
    fields: Callable[[list[object]], tuple[object, ...]],
    parse: Callable[[list[object]], object],
    words: list[object],
) -> None:
    try:
        expected = attrs.astuple(parse(words), recurse=False)
    except SplitcFormatError as error:
        with pytest.raises(SplitcFormatError) as raised:
            fields(words)
        assert raised.value.kind is error.kind
    else:
        assert fields(words) == expected


def test_request_words_reject_what_build_request_rejects() -> None:
    with pytest.raises(ValueError):
        request_words(Kind.WRITE, 8, 300, 0, 0, b"")  # region beyond a byte
    with pytest.raises(ValueError):
        request_words(Kind.WRITE, 8, 0, 0, 0, bytes(9))  # more than 8 bytes
    with pytest.raises(SplitcFormatError):
        request_words(Kind.WRITE, 3, 0, 0, 0, b"")  # not a scalar size
