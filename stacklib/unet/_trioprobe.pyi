"""Type stub of the C form of :func:`stacklib.unet.polled.cancelled` (``_trioprobe.c``), built by
``stacklib compile``."""

from typing import Any

def install(run_context: Any, task_type: type, status_type: type, /) -> tuple[int, int]: ...
def cancelled() -> bool: ...
