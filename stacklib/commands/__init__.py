"""Subcommands of ``stacklib`` that belong to one part of the system each.

Each module here has ``add_commands(commands)``, which adds its subparsers (with ``func`` set)
to the ``stacklib`` command's subparsers; :mod:`stacklib.cli` calls every module in
:data:`MODULES`.  Keeping them apart keeps ``cli.py`` small and lets a part own its commands.
"""

from __future__ import annotations

#: The modules whose commands ``stacklib`` offers, in help order.
MODULES: tuple[str, ...] = (
    "stacklib.commands.splitc",
    "stacklib.commands.myrinet",
    "stacklib.commands.mm",
    "stacklib.commands.compile",
)
