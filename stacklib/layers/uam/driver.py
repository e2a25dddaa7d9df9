"""The names UAM's driver module had, kept for existing imports: the service now lives in
:mod:`stacklib.layers.uam.service` and its three ways of running in the path modules
(:mod:`stacklib.layers.uam.paths`)."""

from __future__ import annotations

from stacklib.layers.uam.params import UamParams
from stacklib.layers.uam.service import Handler, RemoteAddress, UamService

__all__ = ["Handler", "RemoteAddress", "UamParams", "UamService"]
