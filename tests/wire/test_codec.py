"""derive_codec: the derived codec agrees with construct, field by field and byte by byte."""

from __future__ import annotations

import math
import struct
from typing import Any

import construct as c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import FormatError
from stacklib.wire.codec import FixedCodec, derive_codec


class MyError(FormatError):
    """The caller-provided error class."""


BYTE_ALIGNED = c.Struct(
    "u8" / c.Int8ub,
    "u16" / c.Int16ub,
    "u32" / c.Int32ub,
    "u64" / c.Int64ub,
    "s8" / c.Int8sb,
    "s16" / c.Int16sb,
    "s32" / c.Int32sb,
    "s64" / c.Int64sb,
    "raw" / c.Bytes(5),
    "flag" / c.Flag,
    "u24" / c.Int24ub,
)

BIT_FIELDS = c.Struct(
    "three"
    / c.BitStruct(  # 24 bits: not a struct integer width, read via int.from_bytes
        "x" / c.Flag,
        "y" / c.BitsInteger(3),
        "s" / c.BitsInteger(5, signed=True),
        c.Padding(3),
        "z" / c.BitsInteger(12),
    ),
    "two" / c.BitStruct("hi" / c.Nibble, "mid" / c.BitsInteger(11), "lo" / c.Flag),
)

MIXED = c.Struct(
    "a" / c.Int16ub,
    "flags" / c.BitStruct("p" / c.Flag, "q" / c.Flag, "_rsv" / c.BitsInteger(2), "r" / c.Nibble),
    c.Padding(2),
    "b" / c.Bytes(3),
    "_reserved" / c.Int8ub,
    "inner" / c.Struct("d" / c.Int16ub, "e" / c.Int8sb),
    "c" / c.Int32ub,
)

LITTLE = c.Struct(
    "a" / c.Int16ul,
    "b" / c.Int32ul,
    "c" / c.Int64sl,
    "d" / c.Int24ul,
    "bits" / c.BitStruct("m" / c.BitsInteger(9), "n" / c.BitsInteger(7, signed=True)),
    "big" / c.Int16ub,  # the minority byte order: carried as bytes and converted alone
    "e" / c.Int32sl,
)

CONSTS = c.Struct(
    "magic" / c.Const(b"UN"),
    "version" / c.Const(1, c.Int8ub),
    "a" / c.Int16ub,
    c.Padding(1, pattern=b"\xff"),
    "bits" / c.BitStruct(c.Const(2, c.BitsInteger(2)), "v" / c.BitsInteger(6)),
    "tail" / c.Const(7, c.Int16ul),
)

FORMATS = {
    "byte_aligned": BYTE_ALIGNED,
    "bit_fields": BIT_FIELDS,
    "mixed": MIXED,
    "little": LITTLE,
    "consts": CONSTS,
}


# --- a value generator read off the construct definition (independent of the codec) -----------


def _int_range(width_bytes: int, signed: bool) -> st.SearchStrategy[int]:
    bits = 8 * width_bytes
    if signed:
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return st.integers(0, (1 << bits) - 1)


def _scalar(sub: Any) -> st.SearchStrategy[Any]:
    if isinstance(sub, c.FormatField):
        return _int_range(sub.length, sub.fmtstr[1].islower())
    if isinstance(sub, c.BytesInteger):
        return _int_range(sub.length, sub.signed)
    if isinstance(sub, c.BitsInteger):
        if sub.signed:
            return st.integers(-(1 << (sub.length - 1)), (1 << (sub.length - 1)) - 1)
        return st.integers(0, (1 << sub.length) - 1)
    if isinstance(sub, c.Bytes):
        return st.binary(min_size=sub.length, max_size=sub.length)
    if sub is c.Flag:
        return st.booleans()
    raise AssertionError(f"test generator does not know {sub!r}")


def _struct_of(fmt: Any) -> Any:
    """The Struct inside a BitStruct, or the Struct itself."""
    return fmt.subcon if isinstance(fmt, c.Transformed) else fmt


def dicts(fmt: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts that ``fmt.build`` accepts: random values, zeros for reserved fields."""
    members: dict[str, st.SearchStrategy[Any]] = {}
    for sub in _struct_of(fmt).subcons:
        if not isinstance(sub, c.Renamed) or isinstance(sub.subcon, c.Const):
            continue
        inner = _struct_of(sub.subcon)
        if isinstance(inner, c.Struct):
            members[sub.name] = dicts(sub.subcon)
        elif sub.name.startswith("_"):
            members[sub.name] = st.just(0)
        else:
            members[sub.name] = _scalar(sub.subcon)
    return st.fixed_dictionaries(members)


def flatten(fmt: Any, container: Any) -> tuple[Any, ...]:
    """The value fields of a construct dict/Container, in definition order, nesting dropped."""
    out: list[Any] = []
    for sub in _struct_of(fmt).subcons:
        if not isinstance(sub, c.Renamed) or isinstance(sub.subcon, c.Const):
            continue
        if isinstance(_struct_of(sub.subcon), c.Struct):
            out.extend(flatten(sub.subcon, container[sub.name]))
        elif not sub.name.startswith("_"):
            out.append(container[sub.name])
    return tuple(out)


CODECS = {name: derive_codec(fmt, MyError) for name, fmt in FORMATS.items()}


@pytest.mark.parametrize("name", sorted(FORMATS))
@given(data=st.data())
def test_pack_equals_construct_build(name: str, data: st.DataObject) -> None:
    fmt, codec = FORMATS[name], CODECS[name]
    d = data.draw(dicts(fmt))
    assert codec.pack(*flatten(fmt, d)) == fmt.build(d)


@pytest.mark.parametrize("name", sorted(FORMATS))
@given(data=st.data())
def test_unpack_equals_construct_parse(name: str, data: st.DataObject) -> None:
    fmt, codec = FORMATS[name], CODECS[name]
    raw = fmt.build(data.draw(dicts(fmt)))
    assert codec.unpack(raw) == flatten(fmt, fmt.parse(raw))


@pytest.mark.parametrize("name", ["byte_aligned", "bit_fields", "mixed", "little"])
@given(data=st.data())
def test_unpack_of_any_bytes_equals_construct_parse(name: str, data: st.DataObject) -> None:
    # Covers what valid values do not: non-zero padding bits, Flag bytes other than 0 and 1.
    fmt, codec = FORMATS[name], CODECS[name]
    raw = data.draw(st.binary(min_size=codec.size, max_size=codec.size))
    got = codec.unpack(raw)
    assert got == flatten(fmt, fmt.parse(raw))
    assert [type(v) for v in got] == [type(v) for v in flatten(fmt, fmt.parse(raw))]


@pytest.mark.parametrize("name", sorted(FORMATS))
@given(data=st.data())
def test_offsets_and_pack_into(name: str, data: st.DataObject) -> None:
    fmt, codec = FORMATS[name], CODECS[name]
    values = flatten(fmt, data.draw(dicts(fmt)))
    prefix = data.draw(st.binary(max_size=7))
    buffer = bytearray(prefix) + bytearray(codec.size) + b"tail"
    codec.pack_into(buffer, len(prefix), *values)
    assert bytes(buffer) == prefix + codec.pack(*values) + b"tail"
    assert codec.unpack(memoryview(buffer), len(prefix)) == values
    assert codec.unpack(bytes(buffer), len(prefix)) == values


def test_names_sizes_and_flattening() -> None:
    assert CODECS["mixed"].names == ("a", "p", "q", "r", "b", "d", "e", "c")
    assert CODECS["mixed"].size == MIXED.sizeof() == 16
    assert CODECS["bit_fields"].names == ("x", "y", "s", "z", "hi", "mid", "lo")
    assert CODECS["consts"].names == ("a", "v")
    assert CODECS["consts"].size == CONSTS.sizeof()
    for name, fmt in FORMATS.items():
        assert CODECS[name].size == fmt.sizeof()


def test_flags_are_bools_and_signed_bits_sign_extend() -> None:
    x, y, s, z, hi, mid, lo = CODECS["bit_fields"].unpack(b"\xff" * 5)
    assert (x, lo) == (True, True)
    assert type(x) is bool and type(lo) is bool
    assert s == -1 and y == 7 and z == 0xFFF and hi == 15 and mid == 0x7FF


def test_little_endian_majority_and_minority_field() -> None:
    codec = CODECS["little"]
    assert codec.format.startswith("<")
    raw = codec.pack(1, 2, -3, 0x030201, 0, 0, 0x0102, 5)
    assert raw[:2] == b"\x01\x00"
    assert raw[14:17] == b"\x01\x02\x03"  # Int24ul
    assert raw[19:21] == b"\x01\x02"  # the big-endian field stays big-endian


def test_no_bit_fields_format_is_one_struct() -> None:
    codec = derive_codec(c.Struct("a" / c.Int32ub, "b" / c.Int32ub))
    assert codec.format == ">LL"
    assert codec.unpack(b"\x00\x00\x00\x01\x00\x00\x00\x02") == (1, 2)


def test_const_mismatch_raises_the_callers_error() -> None:
    codec = CODECS["consts"]
    good = CONSTS.build({"a": 3, "bits": {"v": 9}})
    assert codec.unpack(good) == (3, 9)
    for index in (0, 1, 2, 6, 7):  # magic, version, the bit constant, the tail constant
        bad = bytearray(good)
        bad[index] ^= 0x80
        with pytest.raises(MyError, match="expected"):
            codec.unpack(bytes(bad))
        with pytest.raises(c.ConstError):  # construct agrees the bytes are wrong
            CONSTS.parse(bytes(bad))
    bad = bytearray(good)
    bad[5] = 0x00  # padding bytes are not checked, as in construct
    assert codec.unpack(bytes(bad)) == (3, 9)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_short_input_raises_the_error_class(name: str) -> None:
    codec = CODECS[name]
    for size in range(codec.size):
        with pytest.raises(MyError):
            codec.unpack(bytes(size))
    with pytest.raises(MyError):
        codec.unpack(bytes(codec.size), 1)
    with pytest.raises(MyError):
        codec.unpack(bytes(codec.size + 3), codec.size)


def test_default_error_is_format_error() -> None:
    codec = derive_codec(c.Struct("a" / c.Int16ub))
    with pytest.raises(FormatError):
        codec.unpack(b"\x00")
    try:
        codec.unpack(b"")
    except struct.error:  # pragma: no cover - the point of the test
        pytest.fail("struct.error escaped")
    except FormatError:
        pass


def test_pack_rejects_out_of_range_and_wrong_counts() -> None:
    codec = CODECS["mixed"]
    good = (1, True, False, 3, b"abc", 4, -5, 6)
    codec.pack(*good)
    for index, bad in [(0, 1 << 16), (3, 16), (3, -1), (4, b"ab"), (4, b"abcd"), (6, 128)]:
        values = list(good)
        values[index] = bad
        with pytest.raises(ValueError):
            codec.pack(*values)
        with pytest.raises(ValueError):
            codec.pack_into(bytearray(codec.size), 0, *values)
    with pytest.raises(TypeError):
        codec.pack(*good[:-1])
    with pytest.raises(ValueError):
        codec.pack_into(bytearray(codec.size - 1), 0, *good)
    with pytest.raises(ValueError):
        CODECS["bit_fields"].pack(False, 0, -17, 0, 0, 0, False)  # 5-bit signed: -16..15


def test_floats() -> None:
    fmt = c.Struct("f" / c.Float32b, "d" / c.Float64b, "h" / c.Float16l)
    codec = derive_codec(fmt)
    values = (1.5, -math.pi, 0.25)
    raw = codec.pack(*values)
    assert raw == fmt.build(dict(zip(("f", "d", "h"), values, strict=True)))
    assert codec.unpack(raw) == values


UNSUPPORTED = [
    ("Enum", c.Struct("e" / c.Enum(c.Int8ub, A=1))),
    ("Switch", c.Struct("k" / c.Int8ub, "v" / c.Switch(c.this.k, {1: c.Int8ub}))),
    ("VarInt", c.Struct("v" / c.VarInt)),
    ("Bytes", c.Struct("n" / c.Int8ub, "b" / c.Bytes(c.this.n))),
    ("GreedyBytes", c.Struct("rest" / c.GreedyBytes)),
    ("Array", c.Struct("a" / c.Array(2, c.Int8ub))),
    ("BitsInteger", c.Struct("b" / c.BitStruct("x" / c.BitsInteger(8, swapped=True)))),
    ("Transformed", c.Struct("b" / c.BitStruct("x" / c.Bytewise(c.Int8ub)))),
    ("BitStruct of 3 bits", c.Struct("b" / c.BitStruct("x" / c.BitsInteger(3)))),
    ("top level", c.Int16ub),
    ("Computed", c.Struct("a" / c.Int8ub, "b" / c.Computed(1))),
]


@pytest.mark.parametrize(("what", "fmt"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_subcons_raise_type_error(what: str, fmt: Any) -> None:
    with pytest.raises(TypeError, match="unsupported subcon") as info:
        derive_codec(fmt)
    assert what.split()[0] in str(info.value)


def test_duplicate_names_are_refused() -> None:
    fmt = c.Struct("a" / c.Int8ub, "bits" / c.BitStruct("a" / c.Flag, c.Padding(7)))
    with pytest.raises(ValueError, match="duplicate"):
        derive_codec(fmt)


def test_codec_type_and_repr() -> None:
    codec = CODECS["mixed"]
    assert isinstance(codec, FixedCodec)
    assert "16 bytes" in repr(codec)
    assert "def unpack" in codec.source
