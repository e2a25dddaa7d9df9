"""TCP (RFC 9293) over stacklib's IP, meant to interoperate with the Linux kernel's TCP.

In the parts every stacklib protocol has: :mod:`~stacklib.layers.tcp.wire` (the segment format
and checksum) and :mod:`~stacklib.layers.tcp.machine` (the sans-IO connection and listener).
:mod:`~stacklib.layers.tcp.driver` is the trio driver: the ``tcp`` layer, whose connections are
``trio.abc.HalfCloseableStream`` objects with a listener (docs/tcpip.md).
"""

from __future__ import annotations

from stacklib.layers.tcp.driver import (
    ConnectFailed,
    ConnectionRefused,
    TcpLayer,
    TcpListenerStream,
    TcpParams,
    TcpStack,
    TcpStream,
    peer_address,
    peer_id,
)
from stacklib.layers.tcp.machine import (
    ChecksumPolicy,
    Closed,
    Connected,
    ConnectionAborted,
    ConnectionReset,
    DataReceived,
    DeliveryProblem,
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
    "ConnectFailed",
    "Connected",
    "ConnectionAborted",
    "ConnectionRefused",
    "ConnectionReset",
    "DataReceived",
    "DeliveryProblem",
    "DropReason",
    "EndOfStream",
    "Segment",
    "TcpConfig",
    "TcpConnection",
    "TcpFlags",
    "TcpFormatError",
    "TcpLayer",
    "TcpListener",
    "TcpListenerStream",
    "TcpOptions",
    "TcpParams",
    "TcpStack",
    "TcpState",
    "TcpStatistics",
    "TcpStream",
    "peer_address",
    "peer_id",
    "reset_for",
]
