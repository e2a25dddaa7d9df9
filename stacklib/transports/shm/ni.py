"""The NI of a shm node: it moves messages between endpoints and the channel rings.

It has no processor of its own (paper 000 §3 puts the NI's work in the process here): the
owning process runs it whenever it polls, receives or sends (:meth:`ShmNI.progress`), or from
:meth:`ShmNI.serve` for upcalls.  A message that does not fit the endpoint stays in its ring,
which pushes back on the sender.  A sleeping receiver raises a flag in each incoming ring and
sleeps on the node's wake FIFO; a sender writes one byte to the FIFO only when it sees that flag.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

import trio

from stacklib.compiled import mypyc_attr
from stacklib.errors import ChannelError
from stacklib.sim import Host
from stacklib.transports.shm.endpoint import ShmEndpoint
from stacklib.transports.shm.link import ShmLink
from stacklib.transports.shm.region import NODE_NAME, ShmAddress
from stacklib.transports.shm.ring import WRITTEN_WAKE, Ring
from stacklib.unet.endpoint import Channel, DropReason, Endpoint
from stacklib.unet.ni import Payload
from stacklib.unet.polled import PolledNI
from stacklib.wire.descriptor import DescriptorStatus, SendDescriptor, SendError

if TYPE_CHECKING:
    from stacklib.transports.shm.network import ShmNetwork


@mypyc_attr(allow_interpreted_subclasses=True)
class ShmNI(PolledNI):
    """The NI of one node (usually one process) on a :class:`ShmNetwork`.

    It has no processor of its own: the owning process runs it whenever it polls, receives or
    sends (:meth:`progress`), or from :meth:`serve` for upcalls.
    """

    kind = "shm"
    endpoint_class = ShmEndpoint

    def __init__(self, name: str, host: Host, network: ShmNetwork) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=network.inline_threshold,
            max_message=network.spec.max_message,
            alignment=network.alignment,
            direct_access=False,
        )
        self.network = network
        self.spin_time = network.spin_time
        #: Seconds ``await recv()`` polls without yielding before it spins with checkpoints.
        self.hot_spin = network.hot_spin
        self.max_sleep = network.max_sleep
        self._links: dict[Hashable, ShmLink] = {}
        self._link_list: list[ShmLink] = []
        #: A ring refused a send: the next :meth:`progress` retries the queued sends.
        self.tx_blocked = False
        self._sleeper = False
        self._lot = trio.lowlevel.ParkingLot()
        self.wake_path = os.path.join(network.directory, f"{name}.wake")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.wake_path)
        os.mkfifo(self.wake_path, 0o600)
        # O_RDWR keeps the FIFO open for writing too, so open() never blocks and reads never
        # see end-of-file while no peer has it open.
        self._wake_fd = os.open(self.wake_path, os.O_RDWR | os.O_NONBLOCK)
        self.wakeups_sent = 0
        self.sleeps = 0
        #: Channels failed because the peer wrote impossible values into a ring.
        self.corrupt_rings = 0

    # ---------------------------------------------------------------- addressing
    def address_of(self, endpoint: Endpoint) -> ShmAddress:
        return ShmAddress(self.name, endpoint.port)

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, ShmAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not a ShmAddress")
        if not NODE_NAME.match(remote.node) or not 0 <= remote.port < 1 << 16:
            raise ChannelError(f"{self!r} cannot reach {remote}: bad node name or port")
        rx_key = (remote.node, remote.port, endpoint.port)
        if rx_key in self._links:
            raise ChannelError(f"{self!r} already has a channel from {remote} to {endpoint!r}")
        local = ShmAddress(self.name, endpoint.port)
        if local == remote:
            raise ChannelError(f"{self!r}: a channel from {local} to itself")
        region, side, path = self.network.broker.open_region(local, remote, self.network.spec)
        link = ShmLink(self, region, side, path, remote, rx_key)
        if link.failed is not None:  # a ring broken already when attaching
            self.corrupt_rings += 1
        self._links[rx_key] = link
        self._link_list.append(link)
        return link, rx_key

    def register_channel(self, endpoint: Endpoint, channel: Channel) -> None:
        try:
            super().register_channel(endpoint, channel)
        except BaseException:
            self._drop_link(channel.rx_key)
            raise
        link = self._links.get(channel.rx_key)
        if isinstance(endpoint, ShmEndpoint) and link is not None:
            endpoint.add_rx_link(link, channel.id)

    def unregister_channel(self, endpoint: Endpoint, channel: Channel) -> None:
        super().unregister_channel(endpoint, channel)
        if isinstance(endpoint, ShmEndpoint):
            endpoint.remove_rx_link(channel.id)
        self._drop_link(channel.rx_key)

    def _drop_link(self, rx_key: Hashable) -> None:
        link = self._links.pop(rx_key, None)
        if link is not None:
            self._link_list.remove(link)
            link.close()

    def link(self, endpoint: Endpoint, channel: int) -> ShmLink:
        """The shared-memory link of one of ``endpoint``'s channels."""
        found = self._links.get(endpoint.channel(channel).rx_key)
        if found is None:
            raise ChannelError(f"{endpoint!r} channel {channel} has no link")
        return found

    # ---------------------------------------------------------------- send path
    def validate(self, endpoint: Endpoint, descriptor: SendDescriptor) -> SendError:
        error = super().validate(endpoint, descriptor)
        if error is SendError.NONE:
            link = endpoint.channels[descriptor.channel].tx_tag
            if isinstance(link, ShmLink) and link.failed is not None:
                return SendError.CHANNEL_CLOSED
        return error

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        link: ShmLink = channel.tx_tag  # type: ignore[assignment]
        ring = link.tx
        written = ring.try_write(data)
        if not written:
            if written is None:
                self.ring_broken(link, ring)
                # Reject rather than wait forever on a ring that cannot drain.
                descriptor.status = DescriptorStatus.ERROR
                descriptor.error = SendError.CHANNEL_CLOSED
                endpoint.send_errors[SendError.CHANNEL_CLOSED.name] += 1
                self.send_errors[SendError.CHANNEL_CLOSED.name] += 1
                return True
            ring.set_producer_waiting(True)
            self.tx_blocked = True
            return False
        if written == WRITTEN_WAKE:
            self.wakeups_sent += 1
            link.wake_peer()
        self.injected(endpoint, descriptor, len(data))
        return True

    # ---------------------------------------------------------------- receive path
    def progress(self) -> int:
        """Run the NI once: move arrived messages into their endpoints (while they have room;
        a message that does not fit stays in the ring, which pushes back on the sender) and
        retry sends the rings refused.  Returns how many messages were delivered."""
        delivered = 0
        inline = self.inline_threshold
        for link in self._link_list:
            ring = link.rx
            if not ring.pending:
                continue
            entry = self.demux.get(link.rx_key)
            if entry is None:
                continue
            endpoint = entry[0]
            recv_queue = endpoint.recv_queue
            before = ring.corrupt
            while not recv_queue.full:
                view = ring.peek()
                if view is None:
                    break
                length = len(view)
                if length > inline and not _room(endpoint, length):
                    view.release()
                    break
                self.deliver_to(endpoint, entry[1], view, None)
                ring.release(view)
                delivered += 1
            if ring.corrupt != before:
                self.ring_broken(link, ring, endpoint)
            if ring.producer_waiting:
                ring.set_producer_waiting(False)
                link.wake_peer()
        if self.tx_blocked:
            self.tx_blocked = False
            self.resume()
        return delivered

    def ring_broken(self, link: ShmLink, ring: Ring, endpoint: Endpoint | None = None) -> None:
        """The peer broke one of ``link``'s rings: count it (as a malformed drop when it was
        the receive ring) and fail the channel with the ring's reason."""
        if link.failed is None:
            self.corrupt_rings += 1
            if endpoint is not None:
                self.drop(DropReason.MALFORMED, endpoint)
        link.ring_broken(ring)

    def check_peers(self) -> None:
        """Look for dead or departed peers (done when idle, never per message)."""
        for link in self._link_list:
            link.check_peer()

    async def idle_wait(self) -> None:
        """Sleep until a peer wakes this node, at most ``max_sleep`` seconds.

        One task sleeps on the wake FIFO for the whole node; other tasks of this process that
        want to sleep park behind it and wake with it.
        """
        if self._sleeper:
            with trio.move_on_after(self.max_sleep):
                await self._lot.park()
            return
        self._sleeper = True
        self.sleeps += 1
        links = self._link_list
        try:
            for link in links:
                link.rx.set_sleeping(True)
            # Re-check after raising the flags: a message may have landed in between.
            if not any(link.rx.pending for link in links):
                with trio.move_on_after(self.max_sleep):
                    await trio.lowlevel.wait_readable(self._wake_fd)
                with contextlib.suppress(BlockingIOError):
                    while os.read(self._wake_fd, 4096):
                        pass
            self.check_peers()
        finally:
            for link in links:
                if not link.closed:
                    link.rx.set_sleeping(False)
            self._sleeper = False
            self._lot.unpark_all()

    async def serve(self) -> None:
        """Run the NI in a task forever: deliver arrivals (raising upcalls), spin then sleep."""
        while True:
            if self.progress():
                await trio.lowlevel.checkpoint()
                continue
            deadline = time.perf_counter() + self.spin_time
            while time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
                if self.progress():
                    break
            else:
                await self.idle_wait()

    # ---------------------------------------------------------------- helpers
    def open_wake(self, node: str) -> int | None:
        path = os.path.join(self.network.directory, f"{node}.wake")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:
            return None  # the peer has not started yet (or is gone): nothing to wake
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def close(self) -> None:
        """Close every endpoint's links and the wake FIFO."""
        for endpoint in list(self.endpoints.values()):
            if not endpoint.closed:
                endpoint.close()
        for link in list(self._link_list):
            self._drop_link(link.rx_key)
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            self._wake_fd = -1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.wake_path)


def _room(endpoint: Endpoint, length: int) -> bool:
    """Whether the free queue holds enough buffer space for ``length`` bytes."""
    total = 0
    for _, size in endpoint.free_queue:
        total += size
        if total >= length:
            return True
    return False
