"""Split-C over U-Net Active Messages (paper 000 §6, paper 003 §5).

:mod:`~stacklib.layers.splitc.wire` holds the scalar-access messages (four AM argument words),
:mod:`~stacklib.layers.splitc.runtime` the global address space: regions, global pointers,
spread arrays, blocking, split-phase and one-way accesses, bulk transfers and collectives.
docs/splitc.md describes the API and the benchmark programs.
"""

from __future__ import annotations

from stacklib.layers.splitc.layer import SplitcLayer, SplitcParams
from stacklib.layers.splitc.runtime import (
    GlobalPtr,
    Pending,
    SplitC,
    SplitcAccessError,
    SpreadArray,
    open_splitc,
)
from stacklib.layers.splitc.wire import SplitcFormatError

__all__ = [
    "GlobalPtr",
    "Pending",
    "SplitC",
    "SplitcAccessError",
    "SplitcFormatError",
    "SplitcLayer",
    "SplitcParams",
    "SpreadArray",
    "open_splitc",
]
