"""The send side's buffer: bytes the application handed over, unacknowledged then unsent."""

from __future__ import annotations

from stacklib.layers.tcp.seq import SEQ_HALF, SEQ_MASK

__all__ = ["SendBuffer"]


class SendBuffer:
    """``data`` holds the stream from sequence number ``seq`` on: first what was sent and not
    yet acknowledged, then what was not sent yet; at most ``capacity`` bytes (the send buffer,
    whose free space is the application's back-pressure, paper 000 §7.4).  The FIN, which is no
    byte, is not in it: it sits at :attr:`end`.  ``data`` and ``seq`` are plain attributes,
    read per segment by the connection's output engine."""

    __slots__ = ("capacity", "data", "seq")

    def __init__(self, seq: int, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.seq = seq
        self.capacity = capacity
        self.data = bytearray()

    @property
    def room(self) -> int:
        """Bytes :meth:`push` accepts now."""
        return self.capacity - len(self.data)

    @property
    def end(self) -> int:
        """The sequence number after the last byte (where a FIN goes)."""
        return (self.seq + len(self.data)) & SEQ_MASK

    def push(self, data: bytes | bytearray | memoryview) -> int:
        """Append as much of ``data`` as fits (a copy: the caller may reuse its buffer)."""
        n = min(len(data), self.capacity - len(self.data))
        if n > 0:
            self.data += memoryview(data)[:n]
        return n

    def acknowledge(self, ack: int) -> None:
        """Drop the bytes before ``ack`` (no more than are held: a FIN's ACK is one past)."""
        n = ((ack - self.seq + SEQ_HALF) & SEQ_MASK) - SEQ_HALF
        if n > 0:
            if n > len(self.data):
                n = len(self.data)
            del self.data[:n]
            self.seq = (self.seq + n) & SEQ_MASK

    def clear(self) -> None:
        self.data.clear()
