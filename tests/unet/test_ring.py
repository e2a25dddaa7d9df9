from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.unet import DescriptorRing


def test_push_until_full_then_says_no() -> None:
    ring: DescriptorRing[int] = DescriptorRing(3)
    assert [ring.push(i) for i in range(4)] == [True, True, True, False]
    assert ring.full and len(ring) == 3 and ring.space == 0
    assert ring.pop() == 0
    assert ring.push(99)
    assert list(ring) == [1, 2, 99]


def test_empty_ring() -> None:
    ring: DescriptorRing[str] = DescriptorRing(2)
    assert ring.pop() is None and ring.peek() is None and not ring
    with pytest.raises(ValueError, match="positive"):
        DescriptorRing(0)


def test_wrap_around_many_times_keeps_fifo_order() -> None:
    ring: DescriptorRing[int] = DescriptorRing(4)
    out = []
    for i in range(1000):
        assert ring.push(i)
        if i % 3 == 2:
            out.append(ring.pop())
            out.append(ring.pop())
            out.append(ring.pop())
    assert out == list(range(999))
    assert ring.high_water == 3


@given(st.integers(1, 8), st.lists(st.one_of(st.integers(0, 100), st.none()), max_size=200))
def test_ring_matches_a_bounded_list(capacity: int, operations: list[int | None]) -> None:
    ring: DescriptorRing[int] = DescriptorRing(capacity)
    model: list[int] = []
    for op in operations:
        if op is None:
            assert ring.pop() == (model.pop(0) if model else None)
        else:
            accepted = ring.push(op)
            assert accepted == (len(model) < capacity)
            if accepted:
                model.append(op)
        assert len(ring) == len(model)
        assert list(ring) == model
        assert ring.high_water <= capacity
