"""Moved to :mod:`stacklib.transports.sim.myrinet_libs.gam` (the libraries are communication
libraries on the simulated LANai, below any layer); this name stays for old imports."""

from __future__ import annotations

from stacklib.transports.sim.myrinet_libs.gam import *  # noqa: F403
from stacklib.transports.sim.myrinet_libs.gam import __all__ as __all__
