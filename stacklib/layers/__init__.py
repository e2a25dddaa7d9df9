"""Protocol layers, each a wire format, a sans-IO core and a trio driver.

Importing this package registers the layers that ship with stacklib (see stacklib.stack).
"""

from __future__ import annotations

# Imported for their registration with stacklib.stack.
from stacklib.layers import arq, ip, splitc, tcp, uam, udp

__all__ = ["arq", "ip", "splitc", "tcp", "uam", "udp"]
