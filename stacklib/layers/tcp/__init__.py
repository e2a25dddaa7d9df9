"""TCP (RFC 9293) over stacklib's IP, meant to interoperate with the Linux kernel's TCP.

In the parts every stacklib protocol has: :mod:`~stacklib.layers.tcp.wire` (the segment format
and checksum) and :mod:`~stacklib.layers.tcp.machine` (the sans-IO connection and listener).
The trio driver (connections as ``trio.abc.HalfCloseableStream``) is designed in
docs/tcp-core.md and comes later.
"""

from __future__ import annotations

from stacklib.layers.tcp.machine import (
    ChecksumPolicy,
    Closed,
    Connected,
    ConnectionAborted,
    ConnectionReset,
    DataReceived,
    DropReason,
    EndOfStream,
    TcpConfig,
    TcpConnection,
    TcpListener,
    TcpState,
    TcpStatistics,
    reset_for,
)
from stacklib.layers.tcp.wire import Segment, TcpFlags, TcpFormatError, TcpOptions

__all__ = [
    "ChecksumPolicy",
    "Closed",
    "Connected",
    "ConnectionAborted",
    "ConnectionReset",
    "DataReceived",
    "DropReason",
    "EndOfStream",
    "Segment",
    "TcpConfig",
    "TcpConnection",
    "TcpFlags",
    "TcpFormatError",
    "TcpListener",
    "TcpOptions",
    "TcpState",
    "TcpStatistics",
    "reset_for",
]
