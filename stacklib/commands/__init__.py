"""Subcommands of ``stacklib`` that belong to one part of the system each.

Each module here has ``add_commands(commands)``, which adds its subparsers (with ``func`` set)
to the ``stacklib`` command's subparsers; :data:`stacklib.cli.COMMANDS` names each command and
the function that adds it, and only the chosen command's module is imported.  Keeping them apart
keeps ``cli.py`` small and lets a part own its commands.
"""
