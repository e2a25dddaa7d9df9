"""This side's view of one shm channel: its two rings, the peer's liveness, and teardown.

Each side records its pid in its half of the region's header page; a sleeper checks the peer
with a pidfd (or ``kill(pid, 0)``) and fails the channel (:attr:`ShmLink.failed`) when the peer
process is gone, when the peer closed its side, or when the OS service daemon reclaimed it.
A ring the peer corrupted fails the channel too (:meth:`ShmLink.ring_broken`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
from typing import TYPE_CHECKING

from stacklib.errors import ChannelError
from stacklib.transports.shm.region import (
    HEADER_BYTES,
    RECLAIMED_WORD,
    RING_WORD,
    SIDE_WORD,
    STATE_ABSENT,
    STATE_ATTACHED,
    STATE_CLOSED,
    RegionHeader,
    ShmAddress,
)
from stacklib.transports.shm.ring import Ring
from stacklib.unet.segment import populate

if TYPE_CHECKING:
    from stacklib.transports.shm.ni import ShmNI


class ShmLink:
    """This side's view of one channel region: a transmit ring, a receive ring, the peer."""

    def __init__(
        self,
        ni: ShmNI,
        region: mmap.mmap,
        side: int,
        path: str,
        remote: ShmAddress,
        rx_key: tuple[str, int, int],
    ) -> None:
        self.ni = ni
        self.region = region
        self.side = side
        self.path = path
        self.remote = remote
        self.rx_key = rx_key
        # The peer can rewrite the format fields after the broker checked them: check again,
        # on the values used here, so the rings below are exactly the mapping's.
        spec = RegionHeader(region).spec()
        if spec is None or spec.region_bytes != len(region):
            raise ChannelError(f"channel to {remote}: not a valid channel region")
        ring_bytes, max_message = spec.ring_bytes, spec.max_message
        populate(region)
        self._view = memoryview(region)
        self._words = self._view[:HEADER_BYTES].cast("Q")
        peer = 1 - side
        rings = [
            Ring(
                self._words,
                RING_WORD[r],
                self._view[HEADER_BYTES + r * ring_bytes : HEADER_BYTES + (r + 1) * ring_bytes],
                min(max_message, ni.max_message),
                region,
                HEADER_BYTES + r * ring_bytes,
            )
            for r in (0, 1)
        ]
        self.tx = rings[side]
        self.rx = rings[peer]
        self.rx.wake_producer = self.wake_peer
        self._peer_word = SIDE_WORD[peer]
        own = SIDE_WORD[side]
        self._words[own] = os.getpid()
        self._words[own + 1] = STATE_ATTACHED
        self._peer_pid = 0
        self._pidfd: int | None = None
        self._peer_wake: int | None = None
        #: Why the channel failed (peer died, closed, broke the ring), or None.
        self.failed: str | None = None
        for ring in rings:
            if ring.error is not None:  # garbage counters found when attaching
                self.ring_broken(ring)
        self.reported = False
        self.closed = False

    def __repr__(self) -> str:
        return f"<ShmLink to {self.remote} side={self.side}>"

    # ---------------------------------------------------------------- wake-ups
    def wake_peer(self) -> None:
        """Write one byte to the peer node's wake FIFO (only called when it sleeps)."""
        if self.closed:
            return
        fd = self._peer_wake
        if fd is None:
            fd = self._peer_wake = self.ni.open_wake(self.remote.node)
            if fd is None:
                return
        try:
            os.write(fd, b"\0")
        except BlockingIOError:
            pass  # the FIFO is full of wake-ups already
        except OSError:
            os.close(fd)
            self._peer_wake = None

    # ---------------------------------------------------------------- liveness
    def check_peer(self) -> None:
        """Fail the channel if the peer closed its side or its process is gone."""
        if self.failed is not None or self.closed:
            return
        words = self._words
        state = words[self._peer_word + 1]
        if state == STATE_CLOSED:
            if words[RECLAIMED_WORD] & (1 << (1 - self.side)):
                self.failed = f"peer {self.remote} died; the OS service reclaimed its side"
            else:
                self.failed = f"peer {self.remote} closed the channel"
            return
        if state != STATE_ATTACHED:
            return  # not arrived yet: a channel may be opened before the peer starts
        pid = words[self._peer_word]
        if pid != self._peer_pid:
            self._peer_pid = pid
            if self._pidfd is not None:
                os.close(self._pidfd)
            self._pidfd = None
            if 0 < pid < 1 << 31:
                with contextlib.suppress(OSError):
                    self._pidfd = os.pidfd_open(pid)
        pid = self._peer_pid
        if not 0 < pid < 1 << 31:
            self.failed = f"peer {self.remote} published an impossible pid {pid}"
            return
        if self._pidfd is not None:
            readable, _, _ = select.select([self._pidfd], [], [], 0)
            if readable:
                self.failed = f"peer process {pid} of {self.remote} died"
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self.failed = f"peer process {pid} of {self.remote} died"
        except PermissionError:
            pass

    def ring_broken(self, ring: Ring) -> None:
        """``ring`` (one of this link's) broke: fail the channel with its reason, once."""
        if self.failed is None:
            self.failed = f"peer {self.remote} broke the channel: {ring.error}"

    @property
    def peer_attached(self) -> bool:
        return int(self._words[self._peer_word + 1]) != STATE_ABSENT

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        words = self._words
        words[SIDE_WORD[self.side] + 1] = STATE_CLOSED
        # A broker that tracks channels (the daemon's) learns at once that this side is gone.
        close_region = getattr(self.ni.network.broker, "close_region", None)
        if close_region is not None:
            close_region(self.path)
        if words[self._peer_word + 1] != STATE_ATTACHED:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        for fd in (self._pidfd, self._peer_wake):
            if fd is not None:
                os.close(fd)
        self._pidfd = self._peer_wake = None
        self.tx.release_views()
        self.rx.release_views()
        self._words.release()
        self._view.release()
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
            self.region.close()
