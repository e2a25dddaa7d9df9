"""Wire formats by name, for ``stacklib decode FORMAT HEX`` and the format conformance suite.

A format module registers itself at import::

    registry.register(
        "unet-eth", parse, describe, "Ethernet frame with a U-Net/FE header",
        build=build, strategy=frames, error=UNetEthFormatError,
    )

``parse(data: bytes)`` returns the typed value or raises the format's
:class:`~stacklib.errors.FormatError`; ``describe(value)`` returns :data:`Field` pairs
``(label, value)``.  :func:`decode` renders them as indented ``label: value`` lines: enums by
name, ``None`` as ``none``, bytes as a length and a hex preview, a ``list`` of pairs as a nested
block, anything else with ``str`` (so a describer formats MAC addresses and the like itself).

The keyword fields serve :func:`stacklib.testing.check_format`: ``build(value)`` returns the
bytes that ``parse`` turns back into an equal value, ``strategy()`` a hypothesis strategy of
values (hypothesis stays a test-only dependency: the function imports it when called), and
``error`` the one :class:`~stacklib.errors.FormatError` subclass ``parse`` may raise;
``equal(a, b)`` compares values where ``==`` does not (a class that compares by identity).

The formats live in one :class:`stacklib.registry.Registry` (:data:`FORMATS`): stacklib's own,
declared in :mod:`stacklib.builtin` and imported when first asked for, and other distributions'
through entry points in the ``stacklib.formats`` group (an entry point names a
:class:`FormatInfo`).  This module imports no format module at import time (they import it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from stacklib import builtin
from stacklib.errors import FormatError
from stacklib.registry import Registry

__all__ = [
    "FORMATS",
    "Field",
    "FormatInfo",
    "decode",
    "formats",
    "hex_preview",
    "register",
    "render",
]

Field = tuple[str, object]
"""A ``(label, value)`` pair of a described value; a ``list`` of them as value nests a block."""

PREVIEW_BYTES = 32  #: bytes shown in hex by :func:`hex_preview`


@attrs.frozen
class FormatInfo:
    """A registered format: its name, parser, describer and a one-line summary; for the
    conformance suite, its builder, the function making its hypothesis strategy, its
    :class:`~stacklib.errors.FormatError` subclass (None where the format has none) and, for
    values that do not compare with ``==``, how to compare them."""

    name: str
    parse: Callable[[bytes], Any]
    describe: Callable[[Any], Iterable[Field]]
    summary: str
    build: Callable[[Any], bytes] | None = None
    strategy: Callable[[], Any] | None = None
    error: type[FormatError] | None = None
    equal: Callable[[Any, Any], bool] | None = None

    @property
    def conformance_ready(self) -> bool:
        """Whether :func:`stacklib.testing.check_format` can check it (all three given)."""
        return self.build is not None and self.strategy is not None and self.error is not None


def hex_preview(data: bytes | bytearray | memoryview, limit: int = PREVIEW_BYTES) -> str:
    """``"N bytes: 0a0b..."``, at most ``limit`` bytes in hex, ``...`` if there is more."""
    data = bytes(data)
    if not data:
        return "0 bytes"
    more = "..." if len(data) > limit else ""
    return f"{len(data)} bytes: {data[:limit].hex()}{more}"


def _value_text(value: object) -> str:
    if isinstance(value, enum.Enum):
        return value.name
    if value is None:
        return "none"
    if isinstance(value, bytes | bytearray | memoryview):
        return hex_preview(value)
    return str(value)


def render(fields: Iterable[Field], indent: int = 1) -> list[str]:
    """The ``label: value`` lines of ``fields``, two spaces per ``indent`` level."""
    pad = "  " * indent
    lines: list[str] = []
    for label, value in fields:
        if isinstance(value, list):
            lines.append(f"{pad}{label}:")
            lines.extend(render(value, indent + 1))
        else:
            lines.append(f"{pad}{label}: {_value_text(value)}")
    return lines


#: Every wire format by name (stacklib's and those of installed distributions).
FORMATS = Registry.of_instances("format", FormatInfo, builtin.FORMATS)


def register(
    name: str,
    parse: Callable[[bytes], Any],
    describe: Callable[[Any], Iterable[Field]],
    summary: str,
    *,
    build: Callable[[Any], bytes] | None = None,
    strategy: Callable[[], Any] | None = None,
    error: type[FormatError] | None = None,
    equal: Callable[[Any, Any], bool] | None = None,
) -> FormatInfo:
    """Register a format (format modules call this at import); a name already taken by
    another format raises :class:`~stacklib.registry.RegistryError`."""
    if error is not None and not (isinstance(error, type) and issubclass(error, FormatError)):
        raise ValueError(f"wire format {name!r}: error must be a FormatError subclass")
    return FORMATS.register(
        FormatInfo(name, parse, describe, summary, build, strategy, error, equal)
    )


def formats() -> dict[str, FormatInfo]:
    """Every format by name, sorted, importing the modules that register them."""
    return dict(sorted(FORMATS.load_all().items()))


def decode(name: str, data: bytes) -> str:
    """Parse ``data`` as format ``name`` and render it (first line: name and size).

    An unknown name raises :class:`~stacklib.registry.UnknownName` listing the known ones;
    malformed bytes raise the format's FormatError.
    """
    info = FORMATS[name]
    value = info.parse(data)
    return "\n".join([f"{name}: {len(data)} bytes", *render(info.describe(value))])
