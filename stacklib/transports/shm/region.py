"""The channel region of the shm transport: its layout, its header, and how a side gets one.

A region is a header page and two rings (:mod:`stacklib.transports.shm.ring`), one per
direction.  The header holds the format (magic, version, sizes), one block per side (its pid and
state, written by that side, or by the OS service daemon on its behalf) and a word in which the
daemon marks the sides it reclaimed after their process died.  :class:`RegionHeader` is what the
OS service (:mod:`stacklib.daemon`) reads and writes; it is never on the data path.

Set-up is the OS service's job (paper 000 §3.2): a :class:`ChannelBroker` creates or attaches
the region; :class:`FileBroker` does it with files (an atomic ``link`` makes the creator
unique), the daemon's ``DaemonBroker`` with sealed memfds passed over a UNIX socket.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import re
import stat
import struct
from typing import Final, Protocol

import attrs

from stacklib.errors import ChannelError

MAGIC = b"UNETSHM1"
VERSION = 1
HEADER_BYTES = 4096
#: The format fields at the start of the header page: magic, version, ring_bytes, max_message.
REGION_HEADER = struct.Struct("<8sIII")

#: Word indexes (8-byte words) into the header page of side s's block: pid, state.
SIDE_WORD = (8, 24)
#: The first word of ring r (written by side r): tail, head, consumer sleeping, producer
#: waiting, each on its own 64-byte line so the two processes do not bounce one cache line on
#: every message.
RING_WORD = (64, 96)
#: Set by the OS service daemon: bit ``1 << side`` means that side's process died and the daemon
#: reclaimed it (the side's state word then reads STATE_CLOSED).
RECLAIMED_WORD = 4

STATE_ABSENT: Final = 0
STATE_ATTACHED: Final = 1
STATE_CLOSED: Final = 2

#: What a node name may be (it names files and daemon records).
NODE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_WORD = struct.Struct("<Q")


@attrs.frozen
class ShmAddress:
    """Where an endpoint of the shm transport lives: a node (process) name and a port."""

    node: str
    port: int

    def __str__(self) -> str:
        return f"{self.node}:{self.port}"


def side_of(local: ShmAddress, remote: ShmAddress) -> int:
    """Which side (0 or 1) of the channel ``local``-``remote`` is ``local``'s: the lower
    (node, port) is side 0, whoever creates the region."""
    return 0 if (local.node, local.port) < (remote.node, remote.port) else 1


@attrs.frozen
class RegionSpec:
    """Sizes of a channel region."""

    ring_bytes: int = 1 << 20
    max_message: int = 65535

    def __attrs_post_init__(self) -> None:
        if self.ring_bytes < 4096 or self.ring_bytes % 4096:
            raise ValueError(f"ring_bytes must be a multiple of 4096, got {self.ring_bytes}")
        if not 0 < self.max_message <= self.ring_bytes // 2 - 16:
            raise ValueError(
                f"max_message {self.max_message} must be positive and at most half a ring "
                f"({self.ring_bytes // 2 - 16} bytes)"
            )

    @property
    def region_bytes(self) -> int:
        """The size of a region of this spec: the header page and two rings."""
        return HEADER_BYTES + 2 * self.ring_bytes


class RegionHeader:
    """The header page of a region, as the OS service reads and writes it.

    ``buffer`` is a writable mapping of at least :data:`HEADER_BYTES`; no view of it is kept,
    so the caller may close it at any time.
    """

    __slots__ = ("buffer",)

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer

    def format(self, spec: RegionSpec) -> None:
        """Write the format fields of a fresh region of ``spec``."""
        REGION_HEADER.pack_into(self.buffer, 0, MAGIC, VERSION, spec.ring_bytes, spec.max_message)

    def spec(self) -> RegionSpec | None:
        """The spec the format fields announce, or None if they are not a valid version-
        :data:`VERSION` header (a peer or a stray file may hold anything)."""
        magic, version, ring_bytes, max_message = REGION_HEADER.unpack_from(self.buffer, 0)
        if magic != MAGIC or version != VERSION:
            return None
        try:
            return RegionSpec(ring_bytes, max_message)
        except ValueError:
            return None

    def _word(self, index: int) -> int:
        value: int = _WORD.unpack_from(self.buffer, index * 8)[0]
        return value

    def _set_word(self, index: int, value: int) -> None:
        _WORD.pack_into(self.buffer, index * 8, value)

    def pid(self, side: int) -> int:
        """The pid side ``side`` published (or the daemon verified)."""
        return self._word(SIDE_WORD[side])

    def set_pid(self, side: int, pid: int) -> None:
        self._set_word(SIDE_WORD[side], pid)

    def state(self, side: int) -> int:
        """``STATE_ABSENT``, ``STATE_ATTACHED`` or ``STATE_CLOSED`` (or garbage from a peer)."""
        return self._word(SIDE_WORD[side] + 1)

    def closed(self, side: int) -> bool:
        return self.state(side) == STATE_CLOSED

    def reclaimed(self, side: int) -> bool:
        """Whether the OS service reclaimed ``side`` after its process died."""
        return bool(self._word(RECLAIMED_WORD) & 1 << side)

    def close(self, side: int, *, reclaimed: bool = False) -> None:
        """Mark ``side`` closed (and reclaimed by the OS service): its peer fails the channel
        the next time it checks."""
        self._set_word(SIDE_WORD[side] + 1, STATE_CLOSED)
        if reclaimed:
            self._set_word(RECLAIMED_WORD, self._word(RECLAIMED_WORD) | 1 << side)


class ChannelBroker(Protocol):
    """The OS service's set-up seam: give this side the mapped region of a channel.

    Returns the mapping, this side's index (0 or 1) and a path naming the region (which
    ``ShmLink`` unlinks when it closes last, if it is a file).  :class:`FileBroker` does it
    with files; the daemon's ``DaemonBroker`` authenticates callers by SO_PEERCRED and passes
    the region's file descriptor over a UNIX socket.  A broker may also have
    ``close_region(path)``, called when this side closes the channel.
    """

    def open_region(
        self, local: ShmAddress, remote: ShmAddress, spec: RegionSpec
    ) -> tuple[mmap.mmap, int, str]: ...


class FileBroker:
    """Channel regions as files in one directory (a tmpfs such as /dev/shm).

    The first side to arrive creates and initializes the file under a private name and links it
    to the channel's name; ``link`` fails if the name exists, so exactly one creator wins and
    the loser attaches to the winner's fully initialized region.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def region_path(self, local: ShmAddress, remote: ShmAddress) -> str:
        low, high = sorted([(local.node, local.port), (remote.node, remote.port)])
        return os.path.join(self.directory, f"chan.{low[0]}.{low[1]}.{high[0]}.{high[1]}")

    def open_region(
        self, local: ShmAddress, remote: ShmAddress, spec: RegionSpec
    ) -> tuple[mmap.mmap, int, str]:
        side = side_of(local, remote)
        path = self.region_path(local, remote)
        size = spec.region_bytes
        private = f"{path}.{os.getpid()}.{next(_serial)}"
        fd = os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            region = mmap.mmap(fd, size)
            RegionHeader(region).format(spec)
            try:
                os.link(private, path)
            except FileExistsError:
                region.close()
                region = self._attach(path)
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(private)
        return region, side, path

    @staticmethod
    def _attach(path: str) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < HEADER_BYTES:
                raise ChannelError(f"{path} is not a channel region")
            region = mmap.mmap(fd, info.st_size)
        finally:
            os.close(fd)
        spec = RegionHeader(region).spec()
        if spec is None or spec.region_bytes != len(region):
            region.close()
            raise ChannelError(f"{path}: not a version-{VERSION} channel region of a valid size")
        return region


_serial = itertools.count()
