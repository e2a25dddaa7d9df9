"""Cost profiles: what each modeled operation costs and which resource pays, with citations.

Costs are data, not code (docs/architecture.md "Time and cost"): a profile maps operation names to a
:class:`Cost` (a resource, a fixed part and a per-byte part in microseconds, as the papers give
them, and where the number comes from).  Recipes load profiles with
:meth:`CostProfile.from_mapping`, strictly, so a typo is an error and not a silently free
operation.  Parameter classes of NIs and hosts mark each published number with :func:`cited`,
and :func:`citations` lists them, so every number in a result can be traced to its paper.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from stacklib.errors import ConfigError

__all__ = ["Citation", "Cost", "CostProfile", "ProtocolCosts", "citations", "cited", "us"]

T = TypeVar("T")


def us(x: float) -> float:
    """Microseconds to seconds (the papers count microseconds; trio counts seconds)."""
    return x / 1_000_000


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and >= 0, not {value!r}")


@attrs.frozen
class Cost:
    """One operation's cost: ``fixed_us + per_byte_us * nbytes`` microseconds on ``resource``."""

    resource: str
    fixed_us: float = attrs.field(default=0.0, validator=_non_negative)
    per_byte_us: float = attrs.field(default=0.0, validator=_non_negative)
    cite: str = ""

    def seconds(self, nbytes: int = 0) -> float:
        """The cost of one operation on ``nbytes`` bytes, in seconds."""
        return (self.fixed_us + self.per_byte_us * nbytes) / 1_000_000


def _freeze_ops(ops: Mapping[str, Cost]) -> Mapping[str, Cost]:
    return types.MappingProxyType(dict(ops))


@attrs.frozen
class CostProfile:
    """A named set of operation costs, e.g. a SPARCstation 20 host or an SBA-200's i960."""

    name: str
    ops: Mapping[str, Cost] = attrs.field(converter=_freeze_ops, hash=False)
    description: str = ""
    cite: str = ""

    def cost(self, op: str) -> Cost:
        """The cost of ``op``; a KeyError that names the op and this profile if it has none."""
        try:
            return self.ops[op]
        except KeyError:
            raise KeyError(
                f"cost profile {self.name!r} has no operation {op!r}"
                f" (it has: {', '.join(sorted(self.ops)) or 'none'})"
            ) from None

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], where: str) -> CostProfile:
        """Build a profile from parsed TOML/JSON-like data, strictly.

        Shape::

            name = "sparc20"                 # required
            description = "..."              # optional
            cite = "paper 000 Table 1"       # optional
            [ops."udp.checksum"]             # one table per operation
            resource = "cpu"                 # required
            fixed_us = 1.0                   # optional, >= 0
            per_byte_us = 0.01               # optional, >= 0
            cite = "paper 000 §6"            # optional

        Unknown keys, wrong types and negative or non-finite costs raise
        :class:`~stacklib.errors.ConfigError` naming ``where`` and the key path.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(where, "", f"expected a table, got {_kind(data)}")
        _check_keys(data, where, "", required={"name", "ops"}, optional={"description", "cite"})
        name = _string(data, where, "", "name")
        description = _string(data, where, "", "description")
        cite = _string(data, where, "", "cite")
        raw_ops = data["ops"]
        if not isinstance(raw_ops, Mapping):
            raise ConfigError(where, "ops", f"expected a table of operations, got {_kind(raw_ops)}")
        ops: dict[str, Cost] = {}
        for op, raw in raw_ops.items():
            if not isinstance(op, str) or not op:
                raise ConfigError(
                    where, "ops", f"operation names must be non-empty strings: {op!r}"
                )
            path = f"ops.{_key(op)}"
            if not isinstance(raw, Mapping):
                raise ConfigError(where, path, f"expected a table, got {_kind(raw)}")
            _check_keys(
                raw,
                where,
                path,
                required={"resource"},
                optional={"fixed_us", "per_byte_us", "cite"},
            )
            resource = _string(raw, where, path, "resource")
            if not resource:
                raise ConfigError(where, f"{path}.resource", "must not be empty")
            ops[op] = Cost(
                resource=resource,
                fixed_us=_microseconds(raw, where, path, "fixed_us"),
                per_byte_us=_microseconds(raw, where, path, "per_byte_us"),
                cite=_string(raw, where, path, "cite"),
            )
        return cls(name=name, ops=ops, description=description, cite=cite)


def _key(name: str) -> str:
    """A TOML-style key path element: bare if it can be, quoted otherwise ("udp.checksum")."""
    bare = name.replace("_", "").replace("-", "")
    return name if bare.isascii() and bare.isalnum() else f'"{name}"'


def _join(path: str, key: str) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


def _kind(value: object) -> str:
    return type(value).__name__


def _check_keys(
    data: Mapping[str, object], where: str, path: str, *, required: set[str], optional: set[str]
) -> None:
    for key in data:
        if key not in required and key not in optional:
            allowed = ", ".join(sorted(required | optional))
            raise ConfigError(where, _join(path, str(key)), f"unknown key (allowed: {allowed})")
    for key in sorted(required):
        if key not in data:
            raise ConfigError(where, _join(path, key), "missing required key")


def _string(data: Mapping[str, object], where: str, path: str, key: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(where, _join(path, key), f"expected a string, got {_kind(value)}")
    return value


def _microseconds(data: Mapping[str, object], where: str, path: str, key: str) -> float:
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            where, _join(path, key), f"expected a number of microseconds, got {_kind(value)}"
        )
    if not 0.0 <= value < math.inf:
        raise ConfigError(where, _join(path, key), f"must be finite and >= 0, not {value!r}")
    return float(value)


def cited(default: T, cite: str, unit: str = "", **kw: Any) -> T:
    """An attrs field with a default taken from a paper, e.g.::

        send_overhead_us: float = cited(7.0, "paper 000 Table 1", "us")

    The citation and unit live in the field's metadata, where :func:`citations` finds them.
    """
    metadata = dict(kw.pop("metadata", None) or {})
    metadata["cite"] = cite
    metadata["unit"] = unit
    field: T = attrs.field(default=default, metadata=metadata, **kw)
    return field


@attrs.frozen
class Citation:
    """One cited parameter: its (dotted) name, current value, unit and source."""

    name: str
    value: object
    unit: str
    cite: str


def citations(instance: object) -> list[Citation]:
    """Every cited field of an attrs instance, in field order, recursing into nested instances.

    Nested fields get dotted names (``"ni.dma_setup_us"``).  The value is the instance's current
    value, so a recipe that overrides a paper's number shows the override next to the citation.
    """
    found: list[Citation] = []
    _collect(instance, "", found)
    return found


def _collect(instance: object, prefix: str, found: list[Citation]) -> None:
    cls = type(instance)
    if not attrs.has(cls):
        raise TypeError(f"citations() needs an attrs instance, not {_kind(instance)}")
    for field in attrs.fields(cls):
        value = getattr(instance, field.name)
        name = prefix + field.name
        if "cite" in field.metadata:
            found.append(
                Citation(name, value, str(field.metadata.get("unit", "")), field.metadata["cite"])
            )
        if attrs.has(type(value)):
            _collect(value, name + ".", found)


@attrs.frozen
class ProtocolCosts:
    """Host CPU per message of the user-level UDP and TCP (paper 000 §7.5-7.7) on one host,
    microseconds: the protocol work beyond the copy and checksum of the data, which the layers
    charge by the byte.  The defaults are the SPARCstation-20's, calibrated to paper 000 Table
    3; a simulated host's figures live in its host model (stacklib/transports/sim/hosts.py) and
    reach the layers through the NI (``UNetNI.host_protocol``)."""

    udp_datagram_us: float = cited(
        4.5,
        "calibrated: paper 000 §7.6, Table 3's 138 us U-Net UDP round trip (16 B) on "
        "SPARCstation-20s",
        "us",
        validator=_non_negative,
    )
    tcp_segment_us: float = cited(
        5.4,
        "calibrated: paper 000 §7.7, Table 3's 157 us U-Net TCP round trip (16 B) on "
        "SPARCstation-20s",
        "us",
        validator=_non_negative,
    )

    def scaled(self, factor: float) -> ProtocolCosts:
        """These costs times ``factor`` (another host's, by the ratio of clock rates)."""
        return ProtocolCosts(self.udp_datagram_us * factor, self.tcp_segment_us * factor)
