from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import SegmentError
from stacklib.unet import Fragment, Segment


def test_size_fixed_and_checked() -> None:
    segment = Segment(128, alignment=32)
    segment.write(100, b"x" * 28)
    with pytest.raises(SegmentError, match="outside the 128-byte segment"):
        segment.write(101, b"x" * 28)
    with pytest.raises(SegmentError):
        segment.read(-1, 4)
    assert segment.read(100, 28) == b"x" * 28


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="positive"):
        Segment(0)
    with pytest.raises(ValueError, match="power of two"):
        Segment(64, alignment=24)


def test_carve_aligns_buffers() -> None:
    segment = Segment(1024, alignment=64)
    buffers = segment.carve(10, 3, 100)
    assert buffers == [Fragment(64, 100), Fragment(192, 100), Fragment(320, 100)]
    assert all(segment.is_aligned(b.offset) for b in buffers)
    with pytest.raises(SegmentError):
        segment.carve(0, 20, 100)


@given(st.integers(-10, 140), st.integers(-10, 140))
def test_contains_is_exact(offset: int, length: int) -> None:
    segment = Segment(128)
    inside = offset >= 0 and length >= 0 and offset + length <= 128
    assert segment.contains(offset, length) == inside


def test_gather_and_slice_share_memory() -> None:
    segment = Segment(64)
    segment.write(0, b"hello")
    segment.write(32, b"world")
    assert segment.gather([Fragment(0, 5), Fragment(32, 5)]) == b"helloworld"
    view = segment.slice(0, 5)
    segment.write(0, b"J")
    assert bytes(view) == b"Jello"
