"""The optional extra the plots need: matplotlib (``pip install 'stacklib[plot]'``)."""

from __future__ import annotations

import sys

__all__ = ["matplotlib_missing"]


def matplotlib_missing(command: str, option: str) -> bool:
    """True, having said so on stderr, when ``stacklib command``'s ``option`` cannot draw
    because matplotlib (an optional dependency) is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        print(
            f"stacklib {command}: {option} needs matplotlib ({error}); "
            "install it with: pip install 'stacklib[plot]'",
            file=sys.stderr,
        )
        return True
    return False
