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

This module imports no format module at import time (they import it).  The first call of
:func:`formats` or :func:`decode` imports :data:`BUILTIN_MODULES`, skipping those that do not
exist (yet).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from stacklib.errors import FormatError

__all__ = [
    "BUILTIN_MODULES",
    "Field",
    "FormatInfo",
    "Registry",
    "decode",
    "formats",
    "hex_preview",
    "import_format_modules",
    "register",
    "render",
]

Field = tuple[str, object]
"""A ``(label, value)`` pair of a described value; a ``list`` of them as value nests a block."""

BUILTIN_MODULES: tuple[str, ...] = (
    "stacklib.wire.unet_eth",
    "stacklib.wire.descriptor",
    "stacklib.wire.atm",
    "stacklib.wire.aal5",
)
"""Modules whose formats :func:`formats` and :func:`decode` make available."""

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


class Registry:
    """A name -> :class:`FormatInfo` table; the module functions use one shared instance."""

    def __init__(self) -> None:
        self._formats: dict[str, FormatInfo] = {}

    def register(
        self,
        name: str,
        parse: Callable[[bytes], Any],
        describe: Callable[[Any], Iterable[Field]],
        summary: str,
        *,
        replace: bool = False,
        build: Callable[[Any], bytes] | None = None,
        strategy: Callable[[], Any] | None = None,
        error: type[FormatError] | None = None,
        equal: Callable[[Any, Any], bool] | None = None,
    ) -> FormatInfo:
        """Add a format; a name already taken raises ValueError unless ``replace``."""
        if name in self._formats and not replace:
            raise ValueError(f"wire format {name!r} is already registered")
        if error is not None and not (isinstance(error, type) and issubclass(error, FormatError)):
            raise ValueError(f"wire format {name!r}: error must be a FormatError subclass")
        info = FormatInfo(name, parse, describe, summary, build, strategy, error, equal)
        self._formats[name] = info
        return info

    def formats(self) -> dict[str, FormatInfo]:
        """A copy of the table, sorted by name."""
        return dict(sorted(self._formats.items()))

    def decode(self, name: str, data: bytes) -> str:
        """Parse ``data`` as format ``name`` and render it (first line: name and size).

        An unknown name raises ValueError listing the known ones; malformed bytes raise the
        format's FormatError.
        """
        info = self._formats.get(name)
        if info is None:
            known = ", ".join(sorted(self._formats)) or "none"
            raise ValueError(f"unknown wire format {name!r}; known formats: {known}")
        value = info.parse(data)
        return "\n".join([f"{name}: {len(data)} bytes", *render(info.describe(value))])


def import_format_modules(modules: Iterable[str]) -> tuple[str, ...]:
    """Import ``modules`` (which register their formats); return those imported.

    A module that does not exist is skipped; any other import failure, including a missing
    module imported *by* one of them, propagates.
    """
    imported: list[str] = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        imported.append(module)
    return tuple(imported)


_DEFAULT = Registry()
_loaded = False


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        import_format_modules(BUILTIN_MODULES)
        _loaded = True  # only after success: a broken module keeps failing loudly, not silently


def register(
    name: str,
    parse: Callable[[bytes], Any],
    describe: Callable[[Any], Iterable[Field]],
    summary: str,
    *,
    replace: bool = False,
    build: Callable[[Any], bytes] | None = None,
    strategy: Callable[[], Any] | None = None,
    error: type[FormatError] | None = None,
    equal: Callable[[Any, Any], bool] | None = None,
) -> FormatInfo:
    """Register a format in the shared registry (format modules call this at import)."""
    return _DEFAULT.register(
        name,
        parse,
        describe,
        summary,
        replace=replace,
        build=build,
        strategy=strategy,
        error=error,
        equal=equal,
    )


def formats() -> dict[str, FormatInfo]:
    """All formats of the shared registry, by name, after importing :data:`BUILTIN_MODULES`."""
    _ensure_loaded()
    return _DEFAULT.formats()


def decode(name: str, data: bytes) -> str:
    """Parse ``data`` as format ``name`` and return indented ``label: value`` lines."""
    _ensure_loaded()
    return _DEFAULT.decode(name, data)
