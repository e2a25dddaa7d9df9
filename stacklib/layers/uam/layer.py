"""The UAM layer for stacks and recipes (``"uam"``): opens a :class:`UamService` over the
service below and runs the driver's tasks, or none on the event path (docs/uam.md).

It lives apart from :mod:`stacklib.layers.uam.driver` because it is an async generator, which
mypyc does not compile, and the driver is one of the modules ``stacklib compile`` compiles.
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio.lowlevel

from stacklib.layers.uam.driver import UamService
from stacklib.layers.uam.params import UamParams
from stacklib.services import DatagramService, ReliableService, Service
from stacklib.stack import Layer, register_layer, serve

__all__ = ["UamLayer"]


@register_layer
class UamLayer(Layer):
    """U-Net Active Messages: GAM 1.1, go-back-N, block stores and gets (docs/uam.md)."""

    name = "uam"
    requires = DatagramService
    provides = ReliableService
    Params = UamParams

    params: UamParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[UamService]:
        """Run the layer over ``below`` and yield its :class:`UamService`."""
        self.require_below(below)
        service = UamService(typing.cast(DatagramService, below), self.params)
        service._now = trio.lowlevel.current_clock().current_time
        tasks: list[tuple[Callable[[], typing.Awaitable[None]], str]]
        if service._events is not None:
            tasks = []  # the event path: the simulator's callbacks do the work
            service._start_events()
        elif service._endpoint is not None:
            tasks = [(service._receive_lean, "uam receive"), (service._pump_lean, "uam pump")]
        else:
            tasks = [(service._receive_loop, "uam receive"), (service._pump, "uam pump")]
        if self.params.background_poll and service._events is None:
            tasks.append((service._poller, "uam poller"))
        async with serve(service, tasks, service._close):
            yield service
