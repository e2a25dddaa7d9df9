"""U-Net Active Messages (UAM): Generic Active Messages 1.1 over U-Net (paper 000 §5).

Three parts, as every stacklib protocol (docs/writing-a-layer.md):
:mod:`~stacklib.layers.uam.wire` (the PDU format), :mod:`~stacklib.layers.uam.machine` (the
sans-IO go-back-N machine) and :mod:`~stacklib.layers.uam.driver` (the trio driver), which
:mod:`~stacklib.layers.uam.layer` registers for recipes as ``"uam"``.  docs/uam.md describes
the API, the protocol and the figures.
"""

from __future__ import annotations

from stacklib.layers.uam.driver import Handler, RemoteAddress, UamService
from stacklib.layers.uam.layer import UamLayer
from stacklib.layers.uam.machine import (
    INBOX_REGION,
    Delivered,
    GetReceived,
    GetReplyReceived,
    PeerFailed,
    ReplyReceived,
    RequestReceived,
    StoreReceived,
    UamMachine,
    UamState,
    UamStatistics,
)
from stacklib.layers.uam.params import UamParams

__all__ = [
    "INBOX_REGION",
    "Delivered",
    "GetReceived",
    "GetReplyReceived",
    "Handler",
    "PeerFailed",
    "RemoteAddress",
    "ReplyReceived",
    "RequestReceived",
    "StoreReceived",
    "UamLayer",
    "UamMachine",
    "UamParams",
    "UamService",
    "UamState",
    "UamStatistics",
]
