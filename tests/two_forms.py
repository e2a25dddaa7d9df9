"""Running one script through a Python reference and its C form, side by side."""

from __future__ import annotations

from typing import Any, Protocol


class World(Protocol):
    """Machines of one form, driven by script steps (``_apply`` runs one; it may raise)."""

    machines: dict[str, Any]

    def _apply(self, op: tuple[Any, ...]) -> object: ...

    def observe(self) -> object: ...


def outcome(world: World, op: tuple[Any, ...]) -> object:
    """What one step gives: ("ok", its result), or ("raised", the error's type and words)."""
    try:
        return ("ok", world._apply(op))
    except Exception as error:  # both forms must raise the same, with the same words
        return ("raised", type(error).__name__, str(error))


def step_both(reference: World, under_test: World, ops: list[tuple[Any, ...]]) -> None:
    """Apply each step to both worlds (the reference's machines Python, the other's C) and
    require the same outcome, and the same observable state after every step."""
    assert not any(m.native for m in reference.machines.values())
    assert all(m.native for m in under_test.machines.values())
    for step, op in enumerate(ops):
        expected = outcome(reference, op)
        got = outcome(under_test, op)
        assert got == expected, f"step {step}: {op}"
        assert under_test.observe() == reference.observe(), f"after step {step}: {op}"
