"""The conformance suite of a registered wire format (:mod:`stacklib.wire.registry`).

For a format registered with ``build``, ``strategy`` and ``error``, :func:`check_format` checks
with hypothesis that

* build-then-parse is identity: ``parse(build(value)) == value`` for every value of the
  strategy, the bytes given as ``bytes``, ``bytearray`` and ``memoryview`` (compared with
  the format's ``equal`` where it registered one);
* malformed input raises only the format's documented error: every truncation of a built
  value, and arbitrary bytes, either parse or raise ``error`` (never ``struct.error``,
  ``IndexError``, ...).

In pytest, one test covers every format::

    @pytest.mark.parametrize("name", format_names())
    def test_format_conforms(name: str) -> None:
        check_format(name)

hypothesis is imported when a check runs, so importing this module does not need it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stacklib.wire import registry
from stacklib.wire.registry import FormatInfo

__all__ = [
    "check_format",
    "check_malformed",
    "check_round_trip",
    "format_names",
]

_MAX_RANDOM = 256  # bytes of random input per example


def format_names(*, complete: bool = True) -> list[str]:
    """The registered formats' names, sorted (stacklib's and installed distributions'); with
    ``complete`` only those with ``build``, ``strategy`` and ``error``."""
    known = registry.formats()
    return [name for name, info in known.items() if info.conformance_ready or not complete]


def _info(name: str | FormatInfo) -> FormatInfo:
    if isinstance(name, FormatInfo):
        info: FormatInfo | None = name
        name = name.name
    else:
        info = registry.FORMATS[name]
    assert info is not None
    missing = [field for field in ("build", "strategy", "error") if getattr(info, field) is None]
    if missing:
        raise ValueError(
            f"wire format {name!r} was registered without {', '.join(missing)}: "
            "the conformance suite needs build, strategy and error"
        )
    return info


def _settings(max_examples: int) -> Any:
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same examples in every run: a failure reproduces
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _parses_or_raises(info: FormatInfo, data: bytes) -> None:
    """Parse ``data``; anything but success or the format's error fails the check."""
    assert info.error is not None
    try:
        info.parse(data)
    except info.error:
        pass
    except Exception as other:
        raise AssertionError(
            f"{info.name}: parsing {data.hex() or 'no bytes'} raised {type(other).__name__} "
            f"({other}), not {info.error.__name__}"
        ) from other


def _run(test: Callable[[Any], None], strategy: Any, max_examples: int) -> None:
    """Run ``test`` as a hypothesis test over ``strategy``."""
    from hypothesis import given

    decorate: Any = given(strategy)  # typed for test functions of named arguments
    wrapped: Callable[[], None] = _settings(max_examples)(decorate(test))
    wrapped()


def check_round_trip(name: str | FormatInfo, *, max_examples: int = 100) -> None:
    """``parse(build(value)) == value`` over the format's strategy (see the module docstring)."""
    info = _info(name)
    name = info.name
    build: Callable[[Any], bytes] = info.build  # type: ignore[assignment]
    assert info.strategy is not None

    equal: Callable[[Any, Any], bool] = info.equal or (lambda a, b: bool(a == b))

    def round_trip(value: Any) -> None:
        data = build(value)
        assert isinstance(data, bytes), f"{name}: build returned {type(data).__name__}"
        for form in (data, bytearray(data), memoryview(data)):
            parsed = info.parse(form)  # type: ignore[arg-type]
            assert equal(parsed, value), (
                f"{name}: {value!r} built to {data.hex()}, parsed {parsed!r}"
            )

    _run(round_trip, info.strategy(), max_examples)


def check_malformed(name: str | FormatInfo, *, max_examples: int = 100) -> None:
    """Truncations of built values and random bytes raise only the format's error."""
    from hypothesis import strategies as st

    info = _info(name)
    build: Callable[[Any], bytes] = info.build  # type: ignore[assignment]
    assert info.strategy is not None

    def truncations(value: Any) -> None:
        data = build(value)
        for size in range(len(data)):
            _parses_or_raises(info, data[:size])

    def random_bytes(data: bytes) -> None:
        _parses_or_raises(info, data)

    _run(truncations, info.strategy(), max_examples)
    _run(random_bytes, st.binary(max_size=_MAX_RANDOM), max_examples)


def check_format(name: str | FormatInfo, *, max_examples: int = 100) -> None:
    """The whole suite for format ``name`` (or a :class:`FormatInfo` not registered): round
    trip, truncations, random bytes.  A format without ``build``, ``strategy`` or ``error``
    raises ValueError."""
    check_round_trip(name, max_examples=max_examples)
    check_malformed(name, max_examples=max_examples)
