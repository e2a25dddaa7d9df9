"""Running one script through a Python reference and its C form, side by side."""

from __future__ import annotations

from typing import Any, Protocol


class World(Protocol):
    """Machines of one form, driven by script steps."""

    machines: dict[str, Any]

    def apply(self, op: tuple[Any, ...]) -> object: ...

    def observe(self) -> object: ...


def step_both(reference: World, under_test: World, ops: list[tuple[Any, ...]]) -> None:
    """Apply each step to both worlds (the reference's machines Python, the other's C) and
    require the same result, and the same observable state after every step."""
    assert not any(m.native for m in reference.machines.values())
    assert all(m.native for m in under_test.machines.values())
    for step, op in enumerate(ops):
        expected = reference.apply(op)
        got = under_test.apply(op)
        assert got == expected, f"step {step}: {op}"
        assert under_test.observe() == reference.observe(), f"after step {step}: {op}"
