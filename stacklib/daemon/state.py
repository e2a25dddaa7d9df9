"""What the daemon keeps per connection and per channel (:mod:`stacklib.daemon.server`)."""

from __future__ import annotations

import attrs
import trio

from stacklib.daemon.policy import Cred
from stacklib.transports import xmem
from stacklib.transports.shm import RegionHeader, RegionSpec, ShmAddress

__all__ = ["ChannelState", "ClientState"]


@attrs.define(eq=False)
class ClientState:
    sock: trio.socket.SocketType
    cred: Cred
    endpoints: set[ShmAddress] = attrs.field(factory=set)
    channels: set[int] = attrs.field(factory=set)
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    #: Registered memory (page-aligned [start, end) ranges) single-copy transfers may read.
    windows: list[tuple[int, int]] = attrs.field(factory=list)
    #: A pidfd of the process: a transfer checks it is still alive before touching its pid.
    pidfd: int | None = None
    #: Its request queue (transfers submitted through shared memory), if it opened one.
    queue: xmem.QueueState | None = None
    #: When it last sent anything (trio time): the least recently active is shed first.
    last_active: float = 0.0
    #: Its xdp sockets (ids of the daemon's :class:`~stacklib.daemon.xdp.XskState`).
    xsks: set[int] = attrs.field(factory=set)
    #: Cancelled to close the connection (it is shed).
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    @property
    def uid(self) -> int:
        return self.cred.uid

    @property
    def pid(self) -> int:
        return self.cred.pid

    def holds_nothing(self) -> bool:
        """No endpoint, channel, registration, queue or xdp socket: closing it reclaims
        nothing."""
        return not (
            self.endpoints or self.channels or self.windows or self.queue is not None or self.xsks
        )


@attrs.define(eq=False)
class ChannelState:
    """A channel the daemon made: its region (a sealed memfd) and the owner of each side."""

    id: int
    addresses: tuple[ShmAddress, ShmAddress]  # side 0, side 1
    spec: RegionSpec
    fd: int
    #: The region's header page, mapped by the daemon (pids and side states live there).
    header: RegionHeader
    owners: list[ClientState | None] = attrs.field(factory=lambda: [None, None])
    #: A side was closed or reclaimed: never joined again; a new open replaces the channel.
    broken: bool = False
