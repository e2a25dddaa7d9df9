"""Type stub of the C ring core (``_ringcore.c``), built by ``stacklib compile``."""

from collections.abc import Callable

from stacklib.unet.ni import Payload

class RingCore:
    tail: int
    head: int
    cached_head: int
    wake: Callable[[], object] | None
    @property
    def failure(self) -> str | None: ...
    def __init__(
        self, words: memoryview, base: int, data: memoryview, max_message: int, tail: int, head: int
    ) -> None: ...
    def try_write(self, payload: Payload) -> int: ...
    def take(self) -> bytes | int | None: ...
    def release(self) -> None: ...
