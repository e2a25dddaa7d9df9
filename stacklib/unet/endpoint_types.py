"""The values an endpoint's API takes and gives (paper 000 §3.1, §3.2, §7.4): its sizes, its
channels, the messages it delivers, its statistics, and the conditions and drop reasons it
reports.  :mod:`stacklib.unet.endpoint` re-exports every name."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from typing import Final

import attrs

from stacklib.compiled import mypyc_attr

__all__ = [
    "Channel",
    "DropReason",
    "EndpointConfig",
    "EndpointStatistics",
    "Message",
    "UpcallCondition",
]


class UpcallCondition(enum.Enum):
    """The two receive-queue conditions U-Net can signal (paper 000 §3.1)."""

    NON_EMPTY = "non-empty"
    ALMOST_FULL = "almost-full"


class DropReason(enum.StrEnum):
    """Why an NI dropped an arriving message (each is counted where it happened)."""

    UNKNOWN_TAG = "unknown-tag"  #: no channel registered for the message's tag
    NO_FREE_BUFFER = "no-free-buffer"  #: the free queue could not hold the message
    RECV_QUEUE_FULL = "recv-queue-full"  #: no room for the receive descriptor
    BAD_FREE_BUFFER = "bad-free-buffer"  #: a free-queue entry outside the segment or misaligned
    DIRECT_NOT_ENABLED = "direct-not-enabled"  #: a direct deposit to a base-level endpoint
    DIRECT_OUT_OF_BOUNDS = "direct-out-of-bounds"  #: a direct deposit outside the window
    TOO_LONG = "too-long"  #: longer than the NI's maximum message
    ENDPOINT_CLOSED = "endpoint-closed"  #: arrived for an endpoint that was closed
    MALFORMED = "malformed"  #: the transport could not parse the frame
    CORRUPTED = "corrupted"  #: a checksum or CRC check failed


@attrs.frozen
class EndpointConfig:
    """Sizes of an endpoint's resources.

    The segment is laid out as ``tx_buffers`` send buffers, then ``rx_buffers`` receive buffers
    (posted to the free queue at creation for the message-level API), then an application area.
    Set ``rx_buffers=0`` to manage the free queue yourself.
    """

    segment_size: int = 256 * 1024
    send_queue: int = 64
    recv_queue: int = 64
    free_queue: int = 64
    tx_buffers: int = 16
    tx_buffer_size: int = 4096
    rx_buffers: int = 16
    rx_buffer_size: int = 4096
    #: Receive-queue length that raises the "almost full" upcall (default: 3/4 of the queue).
    almost_full: int | None = None
    #: Accept direct-access deposits (paper 000 §3.6) into ``direct_window`` (default: the
    #: application area after the buffers).
    direct_access: bool = False
    direct_window: tuple[int, int] | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("segment_size", "send_queue", "recv_queue", "free_queue"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EndpointConfig.{name} must be positive")
        for name in ("tx_buffers", "rx_buffers"):
            if getattr(self, name) < 0:
                raise ValueError(f"EndpointConfig.{name} must not be negative")
        if self.rx_buffers > self.free_queue:
            raise ValueError(
                f"EndpointConfig.rx_buffers={self.rx_buffers} exceeds free_queue={self.free_queue}"
            )
        buffers = self.tx_buffers * self.tx_buffer_size + self.rx_buffers * self.rx_buffer_size
        if buffers > self.segment_size:
            raise ValueError(
                f"EndpointConfig: {buffers} bytes of send and receive buffers do not fit the "
                f"{self.segment_size}-byte segment"
            )
        if self.almost_full is not None and not 0 < self.almost_full <= self.recv_queue:
            raise ValueError("EndpointConfig.almost_full must lie in 1..recv_queue")


@attrs.frozen
class Channel:
    """A registered communication channel of one endpoint (paper 000 §3.2).

    ``tx_tag`` is what the NI stamps on outgoing messages; ``rx_key`` is what it maps incoming
    messages back to this channel by.  Their form depends on the NI (an ATM VCI pair, a MAC
    address and port, a node name and port).
    """

    id: int
    remote: Hashable
    tx_tag: Hashable
    rx_key: Hashable


@mypyc_attr(free_list_len=1)
class Message:
    """A received message: its channel, its bytes, and where a direct deposit put it.

    A value: equal to and hashed as another message with the same three fields.  Read-only by
    contract (the type checker refuses an assignment to a field; nothing checks at run time).
    A plain class rather than a frozen attrs one because one is built per received message on
    the real transports' hot paths: a frozen attrs ``__init__`` sets each field through
    ``object.__setattr__``, and the compiled copy builds this class natively (reusing the
    last one freed: a loop that drops each message before the next frees and allocates none).
    """

    __slots__ = ("channel", "data", "dest_offset")

    def __init__(self, channel: int, data: bytes, dest_offset: int | None = None) -> None:
        self.channel: Final = channel
        self.data: Final = data
        self.dest_offset: Final = dest_offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return (
            self.channel == other.channel
            and self.data == other.data
            and self.dest_offset == other.dest_offset
        )

    def __hash__(self) -> int:
        return hash((self.channel, self.data, self.dest_offset))

    def __repr__(self) -> str:
        return (
            f"Message(channel={self.channel!r}, data={self.data!r}, "
            f"dest_offset={self.dest_offset!r})"
        )


@attrs.frozen
class EndpointStatistics:
    """What an endpoint has seen, readable by the application (paper 000 §7.4)."""

    sent: int
    sent_bytes: int
    send_errors: Mapping[str, int]
    received: int
    received_bytes: int
    dropped: Mapping[str, int]
    send_queue_high_water: int
    recv_queue_high_water: int
    free_queue_empty_drops: int
    upcalls: int
    upcall_errors: int
