"""stacklib: composable user-level network protocol stacks.

U-Net (paper 000) and the systems around it, as a toolbox: the U-Net core (:mod:`stacklib.unet`),
interchangeable network interfaces (:mod:`stacklib.transports`, simulated with cost models in
virtual time or real), protocol layers (:mod:`stacklib.layers`) and recipes that compose them.

``import stacklib`` gives the working set, imported on first use (so the command starts fast):

* stacks: :class:`Layer`, :func:`register_layer`, :func:`open_stack`, :func:`open_stacks`,
  :class:`Placement`;
* the services layers provide and require: :class:`Service`, :class:`DatagramService`,
  :class:`UNetService`, :class:`ReliableService`, :class:`ActiveMessageService`,
  :class:`StreamService`, :class:`FrameService`;
* U-Net: :class:`Endpoint`, :class:`EndpointConfig`, :func:`connect`, and the in-process
  :class:`MemoryNetwork`;
* time: :class:`Simulation` (virtual time) and :class:`RealWorld`;
* recipes: :func:`load_recipe`, :func:`run_recipe`, :func:`open_session`, :func:`list_recipes`.
"""

from __future__ import annotations

import importlib
import os as _os
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: The directory of the compiled copy this process runs (stacklib/compiled.py), or None.
COMPILED: str | None = None
if _os.environ.get("STACKLIB_COMPILED", "") not in ("", "0"):
    from stacklib.compiled import _activate

    COMPILED = _activate(__path__)

#: The public names and the module each comes from.
_API: dict[str, str] = {
    "Layer": "stacklib.stack",
    "Placement": "stacklib.stack",
    "open_stack": "stacklib.stack",
    "open_stacks": "stacklib.stack",
    "register_layer": "stacklib.stack",
    "Service": "stacklib.services",
    "DatagramService": "stacklib.services",
    "UNetService": "stacklib.services",
    "ReliableService": "stacklib.services",
    "ActiveMessageService": "stacklib.services",
    "StreamService": "stacklib.services",
    "FrameService": "stacklib.services",
    "Endpoint": "stacklib.unet",
    "EndpointConfig": "stacklib.unet",
    "connect": "stacklib.unet",
    "MemoryNetwork": "stacklib.transports.memory",
    "Simulation": "stacklib.sim",
    "RealWorld": "stacklib.sim",
    "load_recipe": "stacklib.recipes",
    "run_recipe": "stacklib.recipes",
    "open_session": "stacklib.recipes",
    "list_recipes": "stacklib.recipes",
}

__all__ = [
    "COMPILED",
    "ActiveMessageService",
    "DatagramService",
    "Endpoint",
    "EndpointConfig",
    "FrameService",
    "Layer",
    "MemoryNetwork",
    "Placement",
    "RealWorld",
    "ReliableService",
    "Service",
    "Simulation",
    "StreamService",
    "UNetService",
    "__version__",
    "connect",
    "list_recipes",
    "load_recipe",
    "open_session",
    "open_stack",
    "open_stacks",
    "register_layer",
    "run_recipe",
]


def __getattr__(name: str) -> object:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'stacklib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


if TYPE_CHECKING:
    from stacklib.recipes import list_recipes, load_recipe, open_session, run_recipe
    from stacklib.services import (
        ActiveMessageService,
        DatagramService,
        FrameService,
        ReliableService,
        Service,
        StreamService,
        UNetService,
    )
    from stacklib.sim import RealWorld, Simulation
    from stacklib.stack import Layer, Placement, open_stack, open_stacks, register_layer
    from stacklib.transports.memory import MemoryNetwork
    from stacklib.unet import Endpoint, EndpointConfig, connect
