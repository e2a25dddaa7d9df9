"""The express lane: how a layer on a real endpoint reads and writes one channel's queues
itself, without the endpoint's per-message calls.

U-Net gives each endpoint its own send and receive queues in memory the application maps
(paper 000 §3.1, §3.2); a layer whose protocol core runs in C can then move messages between
those queues and its own state without going back through Python per message.  An endpoint
that offers this (the shm transport's, whose queues are the rings) overrides
:class:`~stacklib.unet.endpoint.Endpoint`'s ``express_rx``, ``express_tx``,
``express_received`` and ``express_sent``: a layer asks for a channel's queue at each poll or
send (None: use the endpoint's ordinary calls this time) and reports what it took and wrote, so
the endpoint's counters and wake-ups stay exactly those of the ordinary path.

A queue (:class:`NativeQueue`) offers the same operations twice: as the Python methods below,
and to C as the table of ``native_queue.h`` in a capsule (its ``native_queue`` attribute).
"""

from __future__ import annotations

from typing import Final, Protocol

__all__ = ["QUEUE_BROKEN", "QUEUE_WAKE", "QUEUE_WRITTEN", "NativeQueue"]

#: What :meth:`NativeQueue.take` and :meth:`NativeQueue.try_write` return when the peer broke
#: the queue (the queue's ``failure`` says how).
QUEUE_BROKEN: Final = -1
#: :meth:`NativeQueue.try_write`: written; written, and the consumer sleeps.
QUEUE_WRITTEN: Final = 1
QUEUE_WAKE: Final = 2


class NativeQueue(Protocol):
    """One direction of a channel, as the express lane uses it."""

    @property
    def max_message(self) -> int:
        """The largest message the queue carries (longer ones go the endpoint's general way)."""
        ...

    def take(self) -> bytes | int | None:
        """The next message (a copy; its room freed), None if none waits, or
        :data:`QUEUE_BROKEN`."""
        ...

    def try_write(self, payload: bytes) -> int:
        """Append one message: 1 written, 2 written and the consumer sleeps (the caller has the
        endpoint wake it), 0 full, or :data:`QUEUE_BROKEN`."""
        ...
