"""Validators shared by the workloads' parameter classes."""

from __future__ import annotations

import attrs


def sizes_valid(
    instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]
) -> None:
    """Message sizes: at least one, none negative."""
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")
    if any(size < 0 for size in value):
        raise ValueError(f"{attribute.name} must not be negative")
