"""The five user-space communication libraries of paper 004 on the LANai 4.1 platform.

Generic Active Messages (:mod:`.gam`), BIP-0.92 (:mod:`.bip`), FM-2.02 (:mod:`.fm`), PM-1.2
(:mod:`.pm`) and VMMC-2 (:mod:`.vmmc`), each a :class:`~stacklib.services.DatagramService` per
node with its own API beside it, over :mod:`stacklib.transports.sim.lanai4`.  Their programming
models and implementation choices are declared on the classes (paper 004 Tables 1-3) and
rendered by :func:`~stacklib.transports.sim.myrinet_libs.base.table`.  GAM's Active Messages
also have the surface Split-C runs over (:class:`~.gam_am.GamActiveMessages`, an
:class:`~stacklib.services.ActiveMessageService`).  docs/myrinet.md describes them.

They live with the simulated transports because that is what they are: communication libraries
on the simulated LANai that replace U-Net at the bottom of a stack; they depend on the
platform model (:mod:`stacklib.transports.sim.lanai4`), the simulator and the service
contracts, and on no layer.  Importing the package registers them as recipe transports
(:mod:`.transport`: ``sim-myrinet-am`` ... ``sim-myrinet-vmmc``).
"""

from __future__ import annotations

from stacklib.transports.sim.myrinet_libs.base import (
    ImplChoices,
    LibraryError,
    ModelChoices,
    MyrinetLibrary,
    table,
)
from stacklib.transports.sim.myrinet_libs.bip import Bip, BipParams
from stacklib.transports.sim.myrinet_libs.fm import Fm, FmParams
from stacklib.transports.sim.myrinet_libs.gam import Gam, GamParams
from stacklib.transports.sim.myrinet_libs.gam_am import GamActiveMessages
from stacklib.transports.sim.myrinet_libs.pm import Pm, PmDaemon, PmParams
from stacklib.transports.sim.myrinet_libs.vmmc import Vmmc, VmmcParams

__all__ = [
    "LIBRARIES",
    "Bip",
    "BipParams",
    "Fm",
    "FmParams",
    "Gam",
    "GamActiveMessages",
    "GamParams",
    "ImplChoices",
    "LibraryError",
    "ModelChoices",
    "MyrinetLibrary",
    "Pm",
    "PmDaemon",
    "PmParams",
    "Vmmc",
    "VmmcParams",
    "table",
]

#: The measured libraries in paper 004's column order, by command-line name.
LIBRARIES: dict[str, type[MyrinetLibrary]] = {
    "am": Gam,
    "bip": Bip,
    "fm": Fm,
    "pm": Pm,
    "vmmc": Vmmc,
}

# Imported last: the recipe transports are made of the libraries above.
from stacklib.transports.sim.myrinet_libs import transport as transport  # noqa: E402
