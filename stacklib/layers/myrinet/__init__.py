"""The five user-space communication libraries of paper 004 on the LANai 4.1 platform.

Generic Active Messages (:mod:`.gam`), BIP-0.92 (:mod:`.bip`), FM-2.02 (:mod:`.fm`), PM-1.2
(:mod:`.pm`) and VMMC-2 (:mod:`.vmmc`), each a :class:`~stacklib.services.DatagramService` per
node with its own API beside it, over :mod:`stacklib.transports.sim.lanai4`.  Their programming
models and implementation choices are declared on the classes (paper 004 Tables 1-3) and
rendered by :func:`~stacklib.layers.myrinet.base.table`.  docs/myrinet.md describes them.
"""

from __future__ import annotations

from stacklib.layers.myrinet.base import (
    ImplChoices,
    LibraryError,
    ModelChoices,
    MyrinetLibrary,
    table,
)
from stacklib.layers.myrinet.bip import Bip, BipParams
from stacklib.layers.myrinet.fm import Fm, FmParams
from stacklib.layers.myrinet.gam import Gam, GamParams
from stacklib.layers.myrinet.pm import Pm, PmDaemon, PmParams
from stacklib.layers.myrinet.vmmc import Vmmc, VmmcParams

__all__ = [
    "LIBRARIES",
    "Bip",
    "BipParams",
    "Fm",
    "FmParams",
    "Gam",
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
