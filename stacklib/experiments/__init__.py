"""The experiments ``stacklib reproduce`` runs, one module per part of the papers.

Importing this package registers them with :mod:`stacklib.reproduce`.
"""

from __future__ import annotations

from stacklib.experiments import mm, myrinet, network_interfaces, splitc, tcpip, uam  # noqa: F401
