"""The daemon as the shm transport's channel broker: ``ShmNetwork(broker=DaemonBroker())``."""

from __future__ import annotations

import contextlib
import mmap
import os

import trio

from stacklib.daemon.client import DaemonClient
from stacklib.daemon.protocol import DaemonError
from stacklib.errors import PeerGone
from stacklib.transports.shm import (
    RegionHeader,
    RegionSpec,
    ShmAddress,
    ShmEndpoint,
    ShmNetwork,
    ShmNI,
)


def channel_path(channel: int, side: int) -> str:
    """The ``path`` a daemon region reports to ``ShmLink``: never a file (entries of
    /proc/self/fd are numbers), so ShmLink's clean-up ``unlink`` always finds nothing."""
    return f"/proc/self/fd/stacklib-daemon-channel-{channel}-{side}"


class DaemonBroker:
    """``ShmNetwork(broker=DaemonBroker(...))``: channel regions from the daemon.

    Satisfies shm's ``ChannelBroker``: registers the local endpoint on first use, opens the
    channel, maps the descriptor the daemon passed and checks the header before use.
    """

    def __init__(self, socket_path: str | None = None, *, start: bool = True) -> None:
        self.client = DaemonClient(socket_path, start=start)
        self._endpoints: set[ShmAddress] = set()
        #: path -> (daemon channel id, side), for :meth:`close_region`.
        self.channels: dict[str, tuple[int, int]] = {}

    def open_region(
        self, local: ShmAddress, remote: ShmAddress, spec: RegionSpec
    ) -> tuple[mmap.mmap, int, str]:
        if local not in self._endpoints:
            self.client.create_endpoint(local)
            self._endpoints.add(local)
        grant, fd = self.client.open_channel(local, remote, spec)
        try:
            size = os.fstat(fd).st_size
            if size != spec.region_bytes:
                raise DaemonError(f"region of channel {grant.channel} has size {size}")
            region = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        if RegionHeader(region).spec() != spec:
            region.close()
            raise DaemonError(f"region of channel {grant.channel} has a bad header")
        path = channel_path(grant.channel, grant.side)
        self.channels[path] = (grant.channel, grant.side)
        return region, grant.side, path

    def direct_channel(self, endpoint: ShmEndpoint, channel: int) -> tuple[int, int]:
        """(daemon channel id, side) of one of ``endpoint``'s channels: what single-copy
        transfers on :attr:`client` name (docs/single-copy.md)."""
        ni = getattr(endpoint, "ni", None)
        if not isinstance(ni, ShmNI):
            raise DaemonError(f"{endpoint!r} is not an endpoint of the shm transport")
        entry = self.channels.get(ni.link(endpoint, channel).path)
        if entry is None:
            raise DaemonError(f"{endpoint!r} channel {channel} was not opened through this broker")
        return entry

    def close_region(self, path: str) -> None:
        """Tell the daemon this side closed the channel (needs the shm hook; else the daemon
        notices lazily, when the channel is reopened or this process disconnects)."""
        entry = self.channels.pop(path, None)
        if entry is not None:
            with contextlib.suppress(DaemonError, OSError):
                self.client.close_channel(*entry)

    def close(self) -> None:
        self.client.close()


def echo_peer(
    socket_path: str,
    directory: str,
    local: ShmAddress,
    remote: ShmAddress,
    *,
    ring_bytes: int = 1 << 18,
    max_message: int = 65535,
) -> None:
    """A peer process for tests and demonstrations: open ``local``-``remote`` through the
    daemon, print ``ready``, echo every message until the channel fails."""
    broker = DaemonBroker(socket_path, start=False)
    network = ShmNetwork(
        directory=directory, broker=broker, ring_bytes=ring_bytes, max_message=max_message
    )
    try:
        node = network.add_node(local.node)
        endpoint = node.os.create_endpoint(node.os.process("echo"), port=local.port)
        node.os.create_channel(endpoint.owner, endpoint, remote)
        print("ready", flush=True)

        async def echo() -> None:
            while True:
                message = await endpoint.recv()
                await endpoint.send(message.channel, message.data)

        with contextlib.suppress(PeerGone):
            trio.run(echo)
    finally:
        network.close()
        broker.close()
