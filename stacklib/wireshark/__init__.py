"""The Wireshark dissector shipped with stacklib: where it is, and installing it.

``stacklib.lua`` (package data, beside this module) dissects the U-Net/FE header, UAM PDUs
over U-Net/FE, UDP and ATM, and Split-C's scalar accesses inside UAM requests and replies
(docs/captures.md).  Wireshark loads Lua dissectors from its personal Lua plugins folder, or
for one run from ``tshark -X lua_script:PATH``.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

__all__ = ["DISSECTOR", "dissector_path", "install", "personal_plugins_dir"]

DISSECTOR = "stacklib.lua"  #: the dissector's file name, here and once installed


def dissector_path() -> Path:
    """The path of the dissector file inside the installed package."""
    return Path(str(resources.files(__package__).joinpath(DISSECTOR)))


def personal_plugins_dir() -> Path:
    """Wireshark's personal Lua plugins folder on Linux and macOS (``tshark -G folders``
    names it "Personal Lua Plugins"): ``~/.local/lib/wireshark/plugins``."""
    return Path.home() / ".local" / "lib" / "wireshark" / "plugins"


def install(directory: str | Path | None = None) -> Path:
    """Copy the dissector into ``directory`` (default: :func:`personal_plugins_dir`), making
    the folder if needed; returns the installed file's path.  An existing copy is replaced.
    Raises OSError (naming the path) if the folder cannot be made or written."""
    target = Path(directory) if directory is not None else personal_plugins_dir()
    target.mkdir(parents=True, exist_ok=True)
    destination = target / DISSECTOR
    shutil.copyfile(dissector_path(), destination)
    return destination
