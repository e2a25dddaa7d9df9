"""A task that counts its turns: how often other tasks got to run while a test's calls did."""

from __future__ import annotations

import trio
import trio.lowlevel


class Ticker:
    """Start :meth:`run` in a nursery; :attr:`ticks` counts the times it was scheduled."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self) -> None:
        while True:
            self.ticks += 1
            await trio.lowlevel.checkpoint()
