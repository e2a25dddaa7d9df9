"""How many connections the daemon serves, and which it closes when it must (no I/O here).

A daemon that runs out of descriptors cannot accept, cannot create regions and, worse, used to
exit, reclaiming every channel on the host.  So it bounds its connections (in total, from
``RLIMIT_NOFILE``, and per uid) and, when a bound is reached or ``accept`` fails for want of
descriptors, it closes a connection that *holds nothing* (no endpoint, channel, registration
or request queue), the least recently active first.  A connection holding something is never
closed for this: closing it would reclaim an established channel.
"""

from __future__ import annotations

import resource
from collections.abc import Iterable
from typing import Protocol, TypeVar

import attrs

#: Descriptors kept for the listener, logging, and the regions and pools of channels.
FD_RESERVE = 32
#: Descriptors one connection may cost: its socket, its pidfd, and a share of its regions.
FDS_PER_CLIENT = 4
#: Default most connections of one uid.
MAX_CLIENTS_PER_UID = 128
#: Default seconds a connection holding nothing may stay silent before it is closed.
CLIENT_IDLE_TIMEOUT = 300.0
#: First and longest pause of the accept loop while descriptors are short.
ACCEPT_BACKOFF = 0.01
ACCEPT_BACKOFF_MAX = 1.0


def clients_for_descriptors(limit: int | None = None) -> int:
    """The most connections a daemon with descriptor limit ``limit`` (default: its own soft
    ``RLIMIT_NOFILE``) serves, keeping :data:`FD_RESERVE` descriptors for everything else."""
    if limit is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max(1, (limit - FD_RESERVE) // FDS_PER_CLIENT)


class Connection(Protocol):
    """What the limits look at in a connection (the daemon's ``ClientState``)."""

    @property
    def uid(self) -> int: ...

    @property
    def last_active(self) -> float: ...

    def holds_nothing(self) -> bool: ...


@attrs.frozen
class ConnectionLimits:
    """The daemon's bounds on connections; every value positive.

    ``max_clients`` in total (None: from the descriptor limit), ``max_per_uid`` per uid, and
    ``idle_timeout`` seconds of silence for a connection that holds nothing (None: no limit).
    """

    max_clients: int | None = None
    max_per_uid: int = MAX_CLIENTS_PER_UID
    idle_timeout: float | None = CLIENT_IDLE_TIMEOUT

    def __attrs_post_init__(self) -> None:
        if self.max_clients is not None and self.max_clients < 1:
            raise ValueError(f"max_clients must be at least 1, got {self.max_clients}")
        if self.max_per_uid < 1:
            raise ValueError(f"max_per_uid must be at least 1, got {self.max_per_uid}")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive, got {self.idle_timeout}")

    def total(self) -> int:
        """The bound on all connections (resolved from the descriptor limit if not given)."""
        return self.max_clients if self.max_clients is not None else clients_for_descriptors()


C = TypeVar("C", bound=Connection)


def choose_victim(connections: Iterable[C], uid: int | None = None) -> C | None:
    """The connection to close to make room: the least recently active one that holds
    nothing, among ``uid``'s connections or (``uid`` None) among those of the uid with the most
    connections that has one.  None if there is no such connection."""
    pool = list(connections)
    if uid is None:
        counts: dict[int, int] = {}
        for connection in pool:
            counts[connection.uid] = counts.get(connection.uid, 0) + 1
        sheddable = {c.uid for c in pool if c.holds_nothing()}
        if not sheddable:
            return None
        uid = max(sheddable, key=lambda u: (counts[u], -u))
    candidates = [c for c in pool if c.uid == uid and c.holds_nothing()]
    return min(candidates, key=lambda c: c.last_active, default=None)
