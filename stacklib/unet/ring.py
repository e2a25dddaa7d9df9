"""Bounded descriptor rings: the send, receive and free queues (paper 000 §3.1).

The head and tail are free-running counters and a slot is ``counter % capacity``, the layout a
queue shared between a host and an NI (or two processes) uses, so wrap-around is exercised the
same way here as in shared memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class DescriptorRing(Generic[T]):
    """A fixed-capacity FIFO ring.  ``push`` says no when full: that is back-pressure."""

    __slots__ = ("_head", "_slots", "_tail", "capacity", "high_water", "pushed")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"ring capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._slots: list[T | None] = [None] * capacity
        self._head = 0  # next slot to pop (consumer's counter)
        self._tail = 0  # next slot to fill (producer's counter)
        #: Most entries ever held at once.
        self.high_water = 0
        #: Entries ever pushed.
        self.pushed = 0

    def __len__(self) -> int:
        return self._tail - self._head

    def __bool__(self) -> bool:
        return self._tail != self._head

    def __iter__(self) -> Iterator[T]:
        """The entries from oldest to newest, without removing them."""
        slots = self._slots
        capacity = self.capacity
        for counter in range(self._head, self._tail):
            item = slots[counter % capacity]
            if item is not None:
                yield item

    def __repr__(self) -> str:
        return f"DescriptorRing({len(self)}/{self.capacity})"

    @property
    def full(self) -> bool:
        return self._tail - self._head >= self.capacity

    @property
    def space(self) -> int:
        """Free slots."""
        return self.capacity - (self._tail - self._head)

    def push(self, item: T) -> bool:
        """Append ``item``; False (and nothing changes) if the ring is full."""
        tail = self._tail
        used = tail - self._head
        if used >= self.capacity:
            return False
        self._slots[tail % self.capacity] = item
        self._tail = tail + 1
        self.pushed += 1
        if used + 1 > self.high_water:
            self.high_water = used + 1
        return True

    def pop(self) -> T | None:
        """Remove and return the oldest entry, or None if empty."""
        head = self._head
        if head == self._tail:
            return None
        slot = head % self.capacity
        item = self._slots[slot]
        self._slots[slot] = None
        self._head = head + 1
        return item

    def peek(self) -> T | None:
        """The oldest entry without removing it, or None if empty."""
        if self._head == self._tail:
            return None
        return self._slots[self._head % self.capacity]

    def clear(self) -> None:
        """Drop every entry."""
        while self.pop() is not None:
            pass
