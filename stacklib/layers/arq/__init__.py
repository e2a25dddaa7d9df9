"""Stop-and-wait ARQ: a reliable service over an unreliable datagram service.

The example layer of docs/writing-a-layer.md, in the three parts every stacklib protocol has:
:mod:`~stacklib.layers.arq.wire` (the PDU format), :mod:`~stacklib.layers.arq.machine` (the
sans-IO protocol machine) and :mod:`~stacklib.layers.arq.driver` (the trio driver, registered
for recipes as ``"arq"``).
"""

from __future__ import annotations

from stacklib.layers.arq.driver import ArqLayer, ArqParams, ArqService
from stacklib.layers.arq.machine import (
    ArqMachine,
    ArqState,
    ArqStatistics,
    Delivered,
    PeerFailed,
)

__all__ = [
    "ArqLayer",
    "ArqMachine",
    "ArqParams",
    "ArqService",
    "ArqState",
    "ArqStatistics",
    "Delivered",
    "PeerFailed",
]
