"""U-Net Active Messages (UAM): Generic Active Messages 1.1 over U-Net (paper 000 §5).

Three parts, as every stacklib protocol (docs/writing-a-layer.md):
:mod:`~stacklib.layers.uam.wire` (the PDU format), :mod:`~stacklib.layers.uam.machine` (the
sans-IO go-back-N machine) and the service the application calls,
:mod:`~stacklib.layers.uam.service`, whose machines run on one of three execution paths
(:mod:`~stacklib.layers.uam.paths`: the event, lean and task paths);
:mod:`~stacklib.layers.uam.layer` registers it for recipes as ``"uam"``.  docs/uam.md describes
the API, the protocol and the figures.
"""

from __future__ import annotations

from stacklib.layers.uam.event_path import EventPath
from stacklib.layers.uam.layer import UamLayer
from stacklib.layers.uam.lean_path import LeanPath
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
from stacklib.layers.uam.paths import ExecutionPath, HostCosts
from stacklib.layers.uam.service import Handler, RemoteAddress, UamService
from stacklib.layers.uam.task_path import TaskPath

__all__ = [
    "INBOX_REGION",
    "Delivered",
    "EventPath",
    "ExecutionPath",
    "GetReceived",
    "GetReplyReceived",
    "Handler",
    "HostCosts",
    "LeanPath",
    "PeerFailed",
    "RemoteAddress",
    "ReplyReceived",
    "RequestReceived",
    "StoreReceived",
    "TaskPath",
    "UamLayer",
    "UamMachine",
    "UamParams",
    "UamService",
    "UamState",
    "UamStatistics",
]
