"""stacklib: composable user-level network protocol stacks.

U-Net (paper 000) and the systems around it, as a toolbox: the U-Net core (:mod:`stacklib.unet`),
interchangeable network interfaces (:mod:`stacklib.transports`, simulated with cost models in
virtual time or real), protocol layers (:mod:`stacklib.layers`) and recipes that compose them.
"""

from __future__ import annotations

__version__ = "0.1.0"

import os as _os

#: The directory of the compiled copy this process runs (stacklib/compiled.py), or None.
COMPILED: str | None = None
if _os.environ.get("STACKLIB_COMPILED", "") not in ("", "0"):
    from stacklib.compiled import _activate

    COMPILED = _activate(__path__)
