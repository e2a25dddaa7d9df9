"""A struct-speed codec derived from a construct definition (docs/performance.md, "Wire formats").

Every stacklib wire format is defined once, as a construct ``Struct``: that definition is the
specification.  construct is 20-100x slower than :mod:`struct`, too slow for
a per-message hot path, so :func:`derive_codec` reads a construct ``Struct`` of fixed-size fields
and builds an equivalent :class:`FixedCodec` on one precompiled :class:`struct.Struct`.  Each
format's tests prove the two agree on random values.

What is supported (anything else raises :class:`TypeError` naming the subcon):

* ``FormatField`` (``Int8ub`` ... ``Int64ul``, the signed variants, ``Float16/32/64``);
* ``BytesInteger`` with an int length (``Int24ub`` and friends), via ``int.from_bytes``;
* ``Bytes(n)`` with an int ``n``; ``Flag`` (one byte, any non-zero byte is ``True``);
* ``Padding(n)``: zero padding is a struct pad byte; other patterns are written on pack; the
  bytes are never checked on unpack (construct does not check them either);
* ``Const(value, subcon)`` around any of the above: packed without an argument, checked on
  unpack (a mismatch raises the caller's ``error`` class);
* nested ``Struct``: flattened, its own name dropped, its members in order;
* ``BitStruct`` (``Bitwise(Struct(...))``) of ``BitsInteger(n)`` (signed or not, not swapped),
  ``Flag`` (one bit, a ``bool``), bit ``Padding(n)`` and ``Const`` around those, nested
  ``Struct`` flattened: read as one unsigned big-endian integer of the BitStruct's byte width,
  then shifts and masks.  The BitStruct's own name is dropped; its members appear, in order, in
  the codec's field list (so ``"flags"/BitStruct("a"/Flag, "b"/Nibble, ...)`` yields fields
  ``a`` and ``b``).

Fields that are not part of the value tuple (:attr:`FixedCodec.names`): ``Padding``, ``Const``,
unnamed fields, and fields whose names start with ``"_"`` (reserved fields: unpack drops them,
pack writes zeros).  Duplicate value names raise :class:`ValueError`.

Byte order: one struct format has one byte order, the majority of the multi-byte fields' (a
BitStruct wider than a byte counts as big-endian; a tie is big-endian).  Fields of the other
order are carried as ``Ns`` bytes and converted on their own, correct but slower; single-byte
fields and ``Bytes`` have no order.

Errors: :meth:`FixedCodec.unpack` raises ``error`` (default :class:`~stacklib.errors.FormatError`)
for data too short or a ``Const`` mismatch; :class:`struct.error` never escapes.  Packing values
out of range for their field raises :class:`ValueError` naming the field (that is the caller's
mistake, not malformed input); a wrong number of values raises :class:`TypeError`.

Speed: the derived codec is one to two orders of magnitude faster than construct's interpreter
and its ``compile()``d form (figures: docs/performance.md, "Wire formats").

The three functions are generated Python source (as ``collections.namedtuple`` once was),
because a generic loop over per-field converters is markedly slower (docs/performance.md).
Only integers and positional names made here appear in that source, never user-supplied text
(constants and names are passed in through the namespace).
"""

from __future__ import annotations

import struct
import sys
from typing import Any, Protocol

import attrs
import construct

from stacklib.errors import FormatError

__all__ = ["FixedCodec", "derive_codec"]

_Buffer = bytes | bytearray | memoryview


class _Unpack(Protocol):
    def __call__(self, data: _Buffer, offset: int = 0) -> tuple[Any, ...]: ...


class _Pack(Protocol):
    def __call__(self, *values: Any) -> bytes: ...


class _PackInto(Protocol):
    def __call__(self, buffer: bytearray | memoryview, offset: int, *values: Any) -> None: ...


class FixedCodec:
    """A fixed-size format's struct-speed codec; build one with :func:`derive_codec`.

    ``unpack(data, offset=0)`` returns the value fields (:attr:`names`) as a tuple;
    ``pack(*values)`` and ``pack_into(buffer, offset, *values)`` take them in the same order.
    ``offset`` is passed to :mod:`struct` as is: a negative offset counts from the end.
    """

    __slots__ = ("format", "names", "pack", "pack_into", "size", "source", "unpack")

    names: tuple[str, ...]
    size: int
    format: str  #: the struct format string, for documentation and debugging
    source: str  #: the generated Python source of the three functions, for debugging
    unpack: _Unpack
    pack: _Pack
    pack_into: _PackInto

    def __init__(
        self,
        names: tuple[str, ...],
        size: int,
        format: str,
        source: str,
        functions: dict[str, Any],
    ) -> None:
        self.names = names
        self.size = size
        self.format = format
        self.source = source
        self.unpack = functions["unpack"]
        self.pack = functions["pack"]
        self.pack_into = functions["pack_into"]

    def __repr__(self) -> str:
        return f"<FixedCodec {self.size} bytes {self.format!r} fields={self.names}>"


# --- analysis: construct tree -> flat list of leaves -------------------------------------------


@attrs.frozen
class _Pad:
    """Zero padding: a struct ``x`` run, never checked."""

    nbytes: int


@attrs.frozen
class _Field:
    """One struct item.

    ``order`` is the field's own byte order ("<", ">"; "" if it has none), ``code`` its struct
    code without order.  ``int_bytes`` is set for a ``BytesInteger`` (carried as bytes).
    ``const`` is checked on unpack and packed in place of a value; ``fill`` is what a hidden
    field packs.
    """

    name: str | None
    code: str
    order: str
    nbytes: int
    int_bytes: bool = False
    signed: bool = False
    const: Any = None
    has_const: bool = False
    fill: Any = 0
    where: str = ""  # path of a constant, for its error message


@attrs.frozen
class _BitMember:
    name: str | None
    shift: int
    width: int
    kind: str  # "uint", "sint", "bool"
    const: Any = None
    has_const: bool = False
    fill: int = 0  # bit pattern a hidden member packs (padding with pattern b"\x01": all ones)
    where: str = ""  # path of a constant, for its error message


@attrs.frozen
class _Bits:
    """A BitStruct: one big-endian unsigned integer of ``nbytes`` bytes."""

    nbytes: int
    members: tuple[_BitMember, ...]


_Leaf = _Pad | _Field | _Bits

_NATIVE = "<" if sys.byteorder == "little" else ">"
_ORDERS = {">": ">", "<": "<", "=": _NATIVE, "!": ">"}
_UINT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _unsupported(subcon: Any, path: str, why: str = "") -> TypeError:
    detail = f" ({why})" if why else ""
    return TypeError(
        f"derive_codec: unsupported subcon {subcon!r} at {path or '<top>'}{detail}; "
        "only fixed-size fields are supported (see stacklib.wire.codec)"
    )


def _is_bitstruct(subcon: Any) -> bool:
    return (
        isinstance(subcon, construct.Transformed)
        and subcon.decodefunc is construct.bytes2bits
        and subcon.encodefunc is construct.bits2bytes
    )


def _is_padding(subcon: Any) -> bool:
    return isinstance(subcon, construct.Padded) and subcon.subcon is construct.Pass


def _int_length(subcon: Any, path: str) -> int:
    length = subcon.length
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        raise _unsupported(subcon, path, "length is not a fixed int")
    return length


def _byte_leaf(subcon: Any, name: str | None, path: str) -> _Field:
    """A byte-aligned scalar (FormatField, BytesInteger, Bytes, Flag)."""
    if isinstance(subcon, construct.FormatField):
        order, code = subcon.fmtstr[0], subcon.fmtstr[1:]
        nbytes = struct.calcsize("<" + code)
        return _Field(name, code, _ORDERS[order] if nbytes > 1 else "", nbytes)
    if isinstance(subcon, construct.BytesInteger):
        nbytes = _int_length(subcon, path)
        swapped = subcon.swapped
        signed = subcon.signed
        if not isinstance(swapped, bool) or not isinstance(signed, bool):
            raise _unsupported(subcon, path, "signed/swapped must be plain bools")
        order = "<" if swapped else ">"
        return _Field(name, f"{nbytes}s", order, nbytes, int_bytes=True, signed=signed)
    if isinstance(subcon, construct.Bytes):
        nbytes = _int_length(subcon, path)
        return _Field(name, f"{nbytes}s", "", nbytes, fill=bytes(nbytes))
    if subcon is construct.Flag:
        return _Field(name, "?", "", 1, fill=False)
    raise _unsupported(subcon, path)


def _visible(name: str | None) -> str | None:
    """The value name of a field, or None for reserved ("_...") and unnamed fields."""
    if name is None or name.startswith("_"):
        return None
    return name


def _collect(subcon: Any, name: str | None, path: str, out: list[_Leaf]) -> None:
    """Append the leaves of byte-level ``subcon`` (named ``name``) to ``out``."""
    if isinstance(subcon, construct.Renamed):
        _collect(subcon.subcon, subcon.name, f"{path}.{subcon.name}", out)
        return
    if isinstance(subcon, construct.Struct):
        for member in subcon.subcons:
            _collect(member, None, path, out)
        return
    if _is_bitstruct(subcon):
        if not isinstance(subcon.subcon, construct.Struct):
            raise _unsupported(subcon, path, "Bitwise() of something other than a Struct")
        members: list[_BitMember] = []
        _collect_bits(subcon.subcon, None, path, members)
        out.append(_layout_bits(members, subcon, path))
        return
    if _is_padding(subcon):
        nbytes = _int_length(subcon, path)
        pattern = subcon.pattern
        if pattern == b"\x00":
            out.append(_Pad(nbytes))
        else:
            out.append(_Field(None, f"{nbytes}s", "", nbytes, fill=pattern * nbytes))
        return
    if isinstance(subcon, construct.Const):
        inner = _byte_leaf(subcon.subcon, None, path)
        const = attrs.evolve(inner, const=subcon.value, has_const=True, where=path.lstrip("."))
        out.append(const)
        return
    out.append(_byte_leaf(subcon, _visible(name), path))


def _collect_bits(
    subcon: Any,
    name: str | None,
    path: str,
    out: list[_BitMember],
) -> None:
    """Append the members of bit-level ``subcon``, unplaced (shift 0: see _layout_bits)."""
    if isinstance(subcon, construct.Renamed):
        _collect_bits(subcon.subcon, subcon.name, f"{path}.{subcon.name}", out)
        return
    if isinstance(subcon, construct.Struct):
        for member in subcon.subcons:
            _collect_bits(member, None, path, out)
        return
    if _is_padding(subcon):
        width = _int_length(subcon, path)
        if subcon.pattern not in (b"\x00", b"\x01"):
            raise _unsupported(subcon, path, "bit padding pattern other than 0 or 1")
        fill = (1 << width) - 1 if subcon.pattern == b"\x01" else 0
        out.append(_BitMember(None, 0, width, "uint", fill=fill))
        return
    if isinstance(subcon, construct.Const):
        width, kind = _bit_scalar(subcon.subcon, path)
        out.append(_BitMember(None, 0, width, kind, subcon.value, True, where=path.lstrip(".")))
        return
    width, kind = _bit_scalar(subcon, path)
    out.append(_BitMember(_visible(name), 0, width, kind))


def _bit_scalar(subcon: Any, path: str) -> tuple[int, str]:
    if isinstance(subcon, construct.BitsInteger):
        width = _int_length(subcon, path)
        if subcon.swapped is not False or not isinstance(subcon.signed, bool):
            raise _unsupported(subcon, path, "swapped or computed BitsInteger")
        if width == 0:
            raise _unsupported(subcon, path, "zero-width BitsInteger")
        return width, "sint" if subcon.signed else "uint"
    if subcon is construct.Flag:
        return 1, "bool"
    raise _unsupported(subcon, path, "inside a BitStruct")


def _layout_bits(members: list[_BitMember], subcon: Any, path: str) -> _Bits:
    total = sum(m.width for m in members)
    if total % 8 or total == 0:
        raise _unsupported(subcon, path, f"BitStruct of {total} bits is not whole bytes")
    shift = total
    laid: list[_BitMember] = []
    for member in members:
        shift -= member.width  # construct's bit order is MSB first across the whole BitStruct
        laid.append(attrs.evolve(member, shift=shift))
    return _Bits(total // 8, tuple(laid))


# --- code generation ---------------------------------------------------------------------------


def _show(value: Any) -> str:
    """Constants in messages: integers in hex (magic numbers, EtherTypes), the rest by repr."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:#x}"
    return repr(value)


def _choose_order(leaves: list[_Leaf]) -> str:
    big = little = 0
    for leaf in leaves:
        if isinstance(leaf, _Bits) and leaf.nbytes > 1:
            big += 1
        elif isinstance(leaf, _Field) and not leaf.int_bytes and leaf.order:
            big += leaf.order == ">"
            little += leaf.order == "<"
    return "<" if little > big else ">"


class _Builder:
    """Accumulates the struct format and the generated source of unpack/pack/pack_into."""

    def __init__(self, order: str, error: type[Exception]) -> None:
        self.order = order
        self.codes: list[str] = []
        self.names: list[str] = []
        self.ns: dict[str, Any] = {"_error": error, "_StructError": struct.error}
        self.unpack_lines: list[str] = []  # statements after r = unpack_from(...)
        self.results: list[str] = []  # expressions of the returned tuple
        self.pack_checks: list[str] = []  # statements before packing
        self.pack_args: list[str] = []  # expressions passed to struct.pack
        self.labels: list[str] = []  # field labels for error messages, by check index
        self.raw_index = 0  # index into the unpacked raw tuple

    def const(self, value: Any) -> str:
        key = f"_k{len(self.ns)}"
        self.ns[key] = value
        return key

    def value_arg(self, name: str) -> str:
        if name in self.names:
            raise ValueError(f"derive_codec: duplicate field name {name!r}")
        self.names.append(name)
        return f"v{len(self.names) - 1}"

    def label(self, text: str) -> int:
        self.labels.append(text)
        return len(self.labels) - 1

    def add_pad(self, leaf: _Pad) -> None:
        self.codes.append(f"{leaf.nbytes}x")

    def add_field(self, leaf: _Field) -> None:
        raw = f"r[{self.raw_index}]"
        self.raw_index += 1
        # Templates turning the struct item into the value ("in") and back ("out").
        convert_in = convert_out = "{}"
        if leaf.int_bytes:
            self.codes.append(leaf.code)
            self.ns["_from_bytes"] = int.from_bytes
            order = "'little'" if leaf.order == "<" else "'big'"
            convert_in = f"_from_bytes({{}}, {order}, signed={leaf.signed})"
            convert_out = f"({{}}).to_bytes({leaf.nbytes}, {order}, signed={leaf.signed})"
        elif leaf.order and leaf.order != self.order:
            # A field of the minority byte order travels as raw bytes with its own struct.
            self.codes.append(f"{leaf.nbytes}s")
            own = self.const(struct.Struct(leaf.order + leaf.code))
            convert_in = f"{own}.unpack({{}})[0]"
            convert_out = f"{own}.pack({{}})"
        else:
            self.codes.append(leaf.code)
        if leaf.has_const:
            expected = self.const(leaf.const)
            check = self.label(f"{leaf.where or 'constant'}: expected {_show(leaf.const)}")
            self.unpack_lines.append(
                f"if {convert_in.format(raw)} != {expected}: raise _const_error({check}, {raw})"
            )
            self.pack_args.append(convert_out.format(expected))
        elif leaf.name is None:
            self.pack_args.append(convert_out.format(self.const(leaf.fill)))
        else:
            arg = self.value_arg(leaf.name)
            if leaf.code.endswith("s") and not leaf.int_bytes:
                # struct pads or truncates silently; construct refuses a wrong length.
                check = self.label(f"field {leaf.name!r} ({leaf.nbytes} bytes)")
                self.pack_checks.append(
                    f"if len({arg}) != {leaf.nbytes}: raise _range_error({check}, {arg})"
                )
            self.results.append(convert_in.format(raw))
            self.pack_args.append(convert_out.format(arg))

    def add_bits(self, leaf: _Bits) -> None:
        raw = f"r[{self.raw_index}]"
        self.raw_index += 1
        total = leaf.nbytes * 8
        word = f"w{self.raw_index}"
        if leaf.nbytes in _UINT_CODES and (leaf.nbytes == 1 or self.order == ">"):
            self.codes.append(_UINT_CODES[leaf.nbytes])
            self.unpack_lines.append(f"{word} = {raw}")
            pack_word = "{}"
        else:
            self.codes.append(f"{leaf.nbytes}s")
            self.unpack_lines.append(f"{word} = _from_bytes({raw}, 'big')")
            self.ns["_from_bytes"] = int.from_bytes
            pack_word = f"({{}}).to_bytes({leaf.nbytes}, 'big')"
        parts: list[str] = []
        fixed = 0  # bits that do not depend on the values: constants and padding patterns
        for m in leaf.members:
            mask = (1 << m.width) - 1
            shifted = f"({word} >> {m.shift})" if m.shift else word
            field = shifted if m.shift + m.width == total else f"({shifted} & {mask})"
            if m.kind == "bool":
                value = f"({field} != 0)"
            elif m.kind == "sint":
                sign = 1 << (m.width - 1)
                value = f"(({field} ^ {sign}) - {sign})"
            else:
                value = field
            if m.has_const:
                expected = self.const(m.const)
                check = self.label(f"{m.where or 'constant'}: expected {_show(m.const)}")
                self.unpack_lines.append(
                    f"if {value} != {expected}: raise _const_error({check}, {value})"
                )
                fixed |= (int(m.const) & mask) << m.shift
            elif m.name is None:
                fixed |= (m.fill & mask) << m.shift
            else:
                arg = self.value_arg(m.name)
                self.results.append(value)
                if m.kind == "bool":
                    parts.append(f"({1 << m.shift} if {arg} else 0)")
                    continue
                low, high = (-(1 << (m.width - 1)), (1 << (m.width - 1)) - 1)
                if m.kind == "uint":
                    low, high = 0, mask
                check = self.label(f"field {m.name!r} ({m.width}-bit, {low}..{high})")
                self.pack_checks.append(
                    f"if not {low} <= {arg} <= {high}: raise _range_error({check}, {arg})"
                )
                masked = f"({arg} & {mask})" if m.kind == "sint" else arg
                parts.append(f"({masked} << {m.shift})" if m.shift else masked)
        if fixed or not parts:
            parts.append(str(fixed))
        self.pack_args.append(pack_word.format(" | ".join(parts)))

    def finish(self, error: type[Exception]) -> FixedCodec:
        fmt = self.order + "".join(self.codes)
        compiled = struct.Struct(fmt)
        size = compiled.size
        labels = tuple(self.labels)
        self.ns.update(
            _unpack_from=compiled.unpack_from,
            _pack=compiled.pack,
            _pack_into=compiled.pack_into,
            _short_error=lambda data, offset: error(
                f"need {size} bytes at offset {offset}, got {len(data)} bytes in all"
            ),
            _const_error=lambda check, got: error(f"{labels[check]}, got {_show(got)}"),
            _range_error=lambda check, got: ValueError(f"{got!r} out of range for {labels[check]}"),
            _pack_error=lambda exc: ValueError(f"cannot pack into {fmt!r}: {exc}"),
        )
        args = ", ".join(f"v{i}" for i in range(len(self.names)))
        lead = f"{args}, " if args else ""
        pack_args = ", ".join(self.pack_args)
        simple = not self.unpack_lines and self.results == [
            f"r[{i}]" for i in range(self.raw_index)
        ]
        if simple:
            # No conversion, no check, nothing dropped: struct's own tuple is the answer.
            unpack_body = [
                "    try:",
                "        return _unpack_from(data, offset)",
                "    except _StructError:",
                "        raise _short_error(data, offset) from None",
            ]
        else:
            result = ", ".join(self.results)
            unpack_body = [
                "    try:",
                "        r = _unpack_from(data, offset)",
                "    except _StructError:",
                "        raise _short_error(data, offset) from None",
                *(f"    {line}" for line in self.unpack_lines),
                f"    return ({result}{',' if len(self.results) == 1 else ''})",
            ]
        checks = [f"    {line}" for line in self.pack_checks]
        source = "\n".join(
            [
                "def unpack(data, offset=0):",
                *unpack_body,
                "",
                f"def pack({args}):",
                *checks,
                "    try:",
                f"        return _pack({pack_args})",
                "    except (_StructError, OverflowError) as exc:",
                "        raise _pack_error(exc) from None",
                "",
                f"def pack_into(buffer, offset, {lead}):",
                *checks,
                "    try:",
                f"        _pack_into(buffer, offset{', ' if pack_args else ''}{pack_args})",
                "    except (_StructError, OverflowError) as exc:",
                "        raise _pack_error(exc) from None",
                "",
            ]
        )
        exec(
            compile(source, f"<derive_codec {fmt}>", "exec"), self.ns
        )  # generated source: see the module docstring
        return FixedCodec(tuple(self.names), size, fmt, source, self.ns)


def derive_codec(fmt: construct.Construct, error: type[Exception] = FormatError) -> FixedCodec:
    """Build the :class:`FixedCodec` equivalent to the construct definition ``fmt``.

    ``error`` is raised by ``unpack`` for short data and ``Const`` mismatches.  Raises
    :class:`TypeError` if ``fmt`` holds a field that is not fixed-size and supported (see the
    module docstring), :class:`ValueError` for duplicate value names.
    """
    top = fmt.subcon if isinstance(fmt, construct.Renamed) else fmt
    if not isinstance(top, construct.Struct) and not _is_bitstruct(top):
        raise _unsupported(fmt, "", "the top level must be a Struct or BitStruct")
    leaves: list[_Leaf] = []
    _collect(top, None, "", leaves)
    builder = _Builder(_choose_order(leaves), error)
    for leaf in leaves:
        if isinstance(leaf, _Pad):
            builder.add_pad(leaf)
        elif isinstance(leaf, _Field):
            builder.add_field(leaf)
        else:
            builder.add_bits(leaf)
    return builder.finish(error)
