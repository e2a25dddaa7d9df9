"""Moved to :mod:`stacklib.transports.sim.myrinet_libs`: the five libraries of paper 004 run on
the simulated LANai 4.1 in place of U-Net, so they live with the simulated transports they
depend on (docs/myrinet.md).  This package stays so that old imports keep working."""

from __future__ import annotations

from stacklib.transports.sim.myrinet_libs import *  # noqa: F403
from stacklib.transports.sim.myrinet_libs import __all__ as __all__
