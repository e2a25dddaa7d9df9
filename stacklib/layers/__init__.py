"""Protocol layers, each a wire format, a sans-IO core and a trio driver.

Importing this package registers the layers that ship with stacklib (see stacklib.stack).
"""

from __future__ import annotations

import stacklib.layers.arq
import stacklib.layers.uam  # noqa: F401  (registers "uam")
