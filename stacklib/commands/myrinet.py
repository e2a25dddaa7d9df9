"""``stacklib`` subcommands for the myrinet part (none yet)."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Add this part's subcommands to ``commands``."""
