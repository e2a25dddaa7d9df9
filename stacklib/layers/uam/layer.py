"""The UAM layer for stacks and recipes (``"uam"``): opens a :class:`UamService` over the
service below and runs the background tasks of its execution path (none on the event path;
docs/uam.md).

It lives apart from :mod:`stacklib.layers.uam.service` because it is an async generator, which
mypyc does not compile, and the service is one of the modules ``stacklib compile`` compiles.
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stacklib.layers.uam.params import UamParams
from stacklib.layers.uam.service import UamService
from stacklib.services import ActiveMessageService, DatagramService, Service
from stacklib.stack import Layer, register_layer, serve

__all__ = ["UamLayer"]


@register_layer
class UamLayer(Layer[UamParams]):
    """U-Net Active Messages: GAM 1.1, go-back-N, block stores and gets (docs/uam.md)."""

    name = "uam"
    requires = DatagramService
    provides = ActiveMessageService
    Params = UamParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[UamService]:
        """Run the layer over ``below`` and yield its :class:`UamService`."""
        self.require_below(below)
        service = UamService(typing.cast(DatagramService, below), self.params)
        async with serve(service, service.start(), service.close):
            yield service
