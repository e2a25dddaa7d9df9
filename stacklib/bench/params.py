"""Validators shared by the workloads' parameter classes."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from stacklib.errors import ConfigError


def sizes_valid(
    instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]
) -> None:
    """Message sizes: at least one, none negative."""
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")
    if any(size < 0 for size in value):
        raise ValueError(f"{attribute.name} must not be negative")


#: The most iterations, messages or warm-up rounds a workload takes per size.  A simulated
#: million round trips takes about two minutes; a larger count (a typo, an extra zero) would
#: run past anyone's patience, so it is refused when the parameters are made.
MAX_COUNT = 1_000_000


def count_valid(minimum: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    """A validator for a per-size count: from ``minimum`` to :data:`MAX_COUNT`."""

    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not minimum <= value <= MAX_COUNT:
            raise ValueError(
                f"{attribute.name} must be from {minimum} to {MAX_COUNT:,}, not {value:,}"
            )

    return check


def check_sizes(sizes: Iterable[int], limit: int, *, control: int = 0) -> None:
    """Refuse message sizes above ``limit``, the stack's maximum message, before any is sent:
    a :class:`~stacklib.errors.ConfigError` (a ``ValueError``) on ``workload.sizes`` naming the
    first size too big and the limit.  ``control`` is the size of a harness's own control
    messages, which must fit too."""
    too_big = [size for size in sizes if size > limit]
    if too_big:
        raise ConfigError(
            "workload",
            "sizes",
            f"message size {too_big[0]} exceeds the stack's maximum message ({limit} bytes); "
            f"give sizes up to {limit} (--sizes, or --set workload.sizes=[...])",
        )
    if control > limit:
        raise ConfigError(
            "workload",
            "sizes",
            f"the stack's maximum message ({limit} bytes) is smaller than the harness's "
            f"{control}-byte control messages",
        )
