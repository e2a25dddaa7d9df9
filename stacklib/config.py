"""Strict construction of attrs parameter classes from recipe data (TOML tables).

Recipes name transports, layers, workloads and cost profiles with their parameters; every one of
those is an attrs class, and :func:`structure` builds it from a mapping, refusing anything
unexpected: an unknown key, a value of the wrong type, a non-finite float (TOML's ``inf`` and
``nan``), or one the class's validators reject is a
:class:`~stacklib.errors.ConfigError` naming the file, the key path and the reason.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

import attrs

from stacklib.errors import ConfigError

T = TypeVar("T")


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def _convert(tp: Any, value: object, where: str, key: str) -> object:
    """Check ``value`` against the annotation ``tp`` and convert where TOML needs it."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return value
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, where, key)
            except ConfigError as error:
                errors.append(error.reason)
        raise ConfigError(where, key, "; ".join(errors))
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(where, key, f"must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (list, tuple, typing.Sequence, Mapping, dict) or tp in (list, tuple, dict):
        args = typing.get_args(tp)
        if origin in (dict, Mapping) or tp is dict:
            if not isinstance(value, Mapping):
                raise ConfigError(where, key, f"expected a table, got {_describe(value)}")
            value_type = args[1] if len(args) == 2 else Any
            return {str(k): _convert(value_type, v, where, f"{key}.{k}") for k, v in value.items()}
        if not isinstance(value, list | tuple):
            raise ConfigError(where, key, f"expected a list, got {_describe(value)}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(where, key, f"expected {len(args)} items, got {len(value)}")
            return tuple(
                _convert(a, v, where, f"{key}[{i}]")
                for i, (a, v) in enumerate(zip(args, value, strict=True))
            )
        item_type = args[0] if args else Any
        items = [_convert(item_type, v, where, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if attrs.has(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(where, key, f"expected a table, got {_describe(value)}")
        return structure(tp, value, where, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, key, f"expected true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, key, f"expected an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, key, f"expected a number, got {_describe(value)}")
        if not math.isfinite(value):
            # TOML spells inf and nan; no recipe parameter means either (a latency, a rate or
            # a timeout of inf would run forever or divide into nonsense).
            raise ConfigError(where, key, f"expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(where, key, f"expected a string, got {_describe(value)}")
        return value
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(where, key, f"cannot take {_describe(value)} as {tp!r}")


def structure(cls: type[T], data: Mapping[str, object], where: str, prefix: str = "") -> T:
    """Build the attrs class ``cls`` from ``data``, strictly.

    ``where`` names the source (a file) and ``prefix`` the key path of ``data`` inside it, so
    errors read like ``recipes/x.toml: transport.latency_us: expected a number, got str 'fast'``.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(where, prefix, f"expected a table, got {_describe(data)}")
    hints = typing.get_type_hints(cls)
    fields = {field.name: field for field in attrs.fields(typing.cast(Any, cls)) if field.init}
    # attrs strips a leading underscore from private attributes' init names.
    by_key = {(f.alias or name): f for name, f in fields.items()}
    dotted = f"{prefix}." if prefix else ""
    unknown = sorted(set(data) - set(by_key))
    if unknown:
        known = ", ".join(sorted(by_key)) or "none"
        raise ConfigError(where, dotted + unknown[0], f"unknown key (known keys: {known})")
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        field = by_key[key]
        kwargs[key] = _convert(hints[field.name], value, where, dotted + key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(where, prefix or cls.__name__, str(error)) from None


def unstructure(instance: object) -> dict[str, object]:
    """The mapping :func:`structure` would accept for ``instance`` (for ``--json`` output)."""
    result = attrs.asdict(typing.cast(Any, instance), recurse=True)
    return typing.cast(dict[str, object], result)
