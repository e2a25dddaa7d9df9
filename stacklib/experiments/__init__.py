"""The experiments ``stacklib reproduce`` runs, one module per part of the papers.

Importing this package registers them (:func:`stacklib.reporting.figures.register_experiment`),
in the order below, which is the order they print in; :mod:`stacklib.reproduce` runs them.
"""

from __future__ import annotations

import importlib

#: The papers' order: the network interfaces (papers 000, 001, 003), Active Messages and
#: TCP/IP (paper 000), Split-C (papers 000, 003), U-Net/MM (paper 002), Myrinet (paper 004).
MODULES = ("network_interfaces", "uam", "tcpip", "splitc", "mm", "myrinet")

for _name in MODULES:
    importlib.import_module(f"stacklib.experiments.{_name}")
