"""What a TCP connection tells its application (pulled with ``TcpConnection.next_event``)."""

from __future__ import annotations

from typing import TypeAlias

import attrs

__all__ = [
    "Closed",
    "Connected",
    "ConnectionAborted",
    "ConnectionReset",
    "DataReceived",
    "DeliveryProblem",
    "EndOfStream",
    "Event",
]


@attrs.frozen(kw_only=True)
class Connected:
    """The three-way handshake completed: the connection is ESTABLISHED."""


@attrs.frozen(kw_only=True)
class DataReceived:
    """New in-order bytes arrived; ``available`` bytes can now be :meth:`~TcpConnection.read`."""

    available: int


@attrs.frozen(kw_only=True)
class EndOfStream:
    """The peer's FIN: after the bytes already received, the peer sends nothing more."""


@attrs.frozen(kw_only=True)
class ConnectionReset:
    """The peer reset the connection (an acceptable RST; in SYN-SENT: connection refused)."""


@attrs.frozen(kw_only=True)
class ConnectionAborted:
    """This end gave up on the connection; ``reason`` says why."""

    reason: str


@attrs.frozen(kw_only=True)
class DeliveryProblem:
    """The same segment has been retransmitted ``retransmissions`` times (threshold R1, RFC
    9293 §3.8.3) without an acknowledgment: the connection is in trouble but not yet given up
    (that happens at R2).  Reported once per stall."""

    retransmissions: int


@attrs.frozen(kw_only=True)
class Closed:
    """The connection reached CLOSED in an orderly way (or the application aborted it)."""


Event: TypeAlias = (
    Connected
    | DataReceived
    | EndOfStream
    | ConnectionReset
    | ConnectionAborted
    | DeliveryProblem
    | Closed
)
