"""The daemon itself: one trio task tree that answers requests, owns channel regions and pools,
reclaims what a departed process held, and moves single-copy transfers (paper 000 §3.2,
paper 002 §4)."""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import select
import signal
import socket
import time
from collections import Counter
from typing import Any

import trio

from stacklib.daemon.limits import ConnectionLimits, choose_victim
from stacklib.daemon.policy import DaemonPolicy, SameUid, peer_cred
from stacklib.daemon.protocol import (
    MAX_BODY,
    REQUESTS,
    ChannelGranted,
    CloseChannel,
    CloseEndpoint,
    CloseXsk,
    CreateEndpoint,
    DaemonError,
    DaemonFormatError,
    Deregister,
    Done,
    Doorbell,
    ErrorCode,
    ErrorReply,
    GrantPort,
    Message,
    Ok,
    OpenChannel,
    OpenPool,
    OpenQueue,
    OpenXsk,
    PoolGranted,
    QueueGranted,
    Register,
    Reply,
    RevokePort,
    SendDirect,
    Status,
    StatusReply,
    decode,
    encode,
)
from stacklib.daemon.sockets import accept, bind_socket, make_directory, unlink_if_same

# ClientState and ChannelState lived here: still importable from this module.
from stacklib.daemon.state import ChannelState as ChannelState
from stacklib.daemon.state import ClientState as ClientState
from stacklib.daemon.xdp import XdpService
from stacklib.transports import xmem
from stacklib.transports.shm import (
    HEADER_BYTES,
    NODE_NAME,
    RegionHeader,
    RegionSpec,
    ShmAddress,
    side_of,
)

log = logging.getLogger("stacklib.daemon")

#: Most memory ranges one process may register for single-copy transfers.
MAX_WINDOWS = 256
#: Seconds the request-queue mover polls before sleeping, and its longest sleep.
MOVER_SPIN = 50e-6
MOVER_MAX_SLEEP = 0.02


def _notify(sock: trio.socket.SocketType, reply: ErrorReply) -> None:
    """Tell a connection about to be closed why, if its socket takes it now (never waits)."""
    with contextlib.suppress(OSError):  # trio's sockets are non-blocking: a full one refuses
        os.write(sock.fileno(), encode(0, reply))


def _readable(fd: int) -> bool:
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


class Daemon:
    """The OS service of one host for the shm transport (paper 000 §3.2).

    All state lives in one trio task tree, so handlers never interleave within a request.
    """

    def __init__(
        self,
        socket_path: str,
        *,
        policy: DaemonPolicy | None = None,
        idle_timeout: float | None = None,
        cache_entries: int = 1024,
        cache_policy: str = "lru",
        limits: ConnectionLimits | None = None,
        socket_mode: int | None = None,
        socket_group: str | None = None,
    ) -> None:
        self.socket_path = socket_path
        #: Who may connect at all (see ``sockets.socket_permissions``).
        self.socket_mode = socket_mode
        self.socket_group = socket_group
        #: Bounds on connections (total, per uid, idle time of those holding nothing).
        self.limits = limits if limits is not None else ConnectionLimits()
        self.max_clients = self.limits.total()
        self.policy: DaemonPolicy = policy if policy is not None else SameUid()
        self.idle_timeout = idle_timeout
        self.clients: set[ClientState] = set()
        self.endpoints: dict[ShmAddress, ClientState] = {}
        self.node_owner: dict[str, ClientState] = {}
        self.channels: dict[int, ChannelState] = {}
        self.by_pair: dict[tuple[ShmAddress, ShmAddress], ChannelState] = {}
        self.counters: Counter[str] = Counter()
        #: Receive pools of endpoints, for single-copy transfers (stacklib.transports.xmem).
        self.pools: dict[ShmAddress, tuple[ClientState, xmem.PoolState]] = {}
        #: Page checks of registered memory, bounded like the NI TLB (paper 002 §4).
        self.cache = xmem.RegistrationCache(cache_entries, cache_policy)
        self._next_channel = 1
        self._idle_changed = trio.Event()
        #: Set by a DOORBELL or a new queue: the request-queue mover wakes up.
        self._doorbell = trio.Event()
        #: Seconds the mover polls request queues before it sleeps (as the shm transport does).
        self.mover_spin = MOVER_SPIN
        #: AF_XDP sockets and the port maps of their interfaces (the xdp transport).
        self.xdp = XdpService(self._refuse)

    # ---------------------------------------------------------------- request handling
    def _refuse(self, client: ClientState, code: ErrorCode, text: str) -> ErrorReply:
        self.counters[code.name.lower()] += 1
        log.warning(
            "refused pid %d uid %d: %s: %s", client.cred.pid, client.cred.uid, code.name, text
        )
        return ErrorReply(int(code), text)

    async def answer(self, client: ClientState, message: Message) -> tuple[Reply, list[int]]:
        """Answer one request: the reply and the descriptors to pass with it.  Only OPEN_XSK
        waits (binding a socket); every other request is :meth:`handle`'s."""
        if isinstance(message, OpenXsk):
            refused = self._check_request(client, message)
            if refused is not None:
                return refused, []
            return await self.xdp.open(client, message)
        reply, fd = self.handle(client, message)
        return reply, [] if fd is None else [fd]

    def _check_request(self, client: ClientState, message: Message) -> ErrorReply | None:
        if not isinstance(message, REQUESTS):
            return self._refuse(client, ErrorCode.MALFORMED, "a reply is not a request")
        if message.pid != client.cred.pid:
            # The kernel's word, not the payload's, says who is asking.
            return self._refuse(
                client,
                ErrorCode.FORGED_PID,
                f"request claims pid {message.pid} but comes from pid {client.cred.pid}",
            )
        self.counters["requests"] += 1
        return None

    def handle(self, client: ClientState, message: Message) -> tuple[Reply, int | None]:
        """Answer one request but OPEN_XSK (see :meth:`answer`): the reply and a descriptor
        to pass with it (or None)."""
        refused = self._check_request(client, message)
        if refused is not None:
            return refused, None
        assert isinstance(message, REQUESTS)
        if isinstance(message, OpenXsk):
            return self._refuse(client, ErrorCode.INTERNAL, "OPEN_XSK needs answer()"), None
        if isinstance(message, GrantPort):
            return self.xdp.grant(client, message), None
        if isinstance(message, RevokePort):
            return self.xdp.revoke(client, message), None
        if isinstance(message, CloseXsk):
            return self.xdp.close(client, message), None
        if isinstance(message, Status):
            return StatusReply(json.dumps(self.status())), None
        if isinstance(message, CloseChannel):
            return self._close_channel(client, message.channel, message.side), None
        if isinstance(message, SendDirect):
            return self._send_direct(client, message), None
        if isinstance(message, Register | Deregister):
            return self._register(client, message), None
        if isinstance(message, Doorbell):
            self._doorbell.set()
            return Ok(), None
        if isinstance(message, OpenQueue):
            return self._open_queue(client, message.slots)
        address = ShmAddress(message.node, message.port)
        if not NODE_NAME.match(address.node):
            return self._refuse(client, ErrorCode.BAD_TAG, f"bad node name {address.node!r}"), None
        if isinstance(message, CreateEndpoint):
            return self._create_endpoint(client, address), None
        if isinstance(message, CloseEndpoint):
            return self._close_endpoint(client, address), None
        if isinstance(message, OpenPool):
            return self._open_pool(client, address, message)
        return self._open_channel(client, address, message)

    def _create_endpoint(self, client: ClientState, address: ShmAddress) -> Reply:
        owner = self.endpoints.get(address)
        if owner is client:
            return Ok()
        if owner is not None:
            return self._refuse(client, ErrorCode.IN_USE, f"endpoint {address} is in use")
        node_owner = self.node_owner.get(address.node)
        if node_owner is not None and node_owner is not client:
            # A shm node is one process (its NI and wake FIFO); another may not join it.
            return self._refuse(
                client, ErrorCode.IN_USE, f"node {address.node} belongs to another process"
            )
        self.endpoints[address] = client
        self.node_owner[address.node] = client
        client.endpoints.add(address)
        return Ok()

    def _close_endpoint(self, client: ClientState, address: ShmAddress) -> Reply:
        if self.endpoints.get(address) is not client:
            return self._refuse(client, ErrorCode.NOT_OWNER, f"endpoint {address} is not yours")
        for channel_id in list(client.channels):
            channel = self.channels[channel_id]
            for side in (0, 1):
                if channel.addresses[side] == address and channel.owners[side] is client:
                    self._leave(client, channel, side, reclaimed=False)
        self._drop_endpoint(client, address)
        return Ok()

    def _drop_endpoint(self, client: ClientState, address: ShmAddress) -> None:
        pool = self.pools.pop(address, None)
        if pool is not None:
            pool[1].close()
        del self.endpoints[address]
        client.endpoints.discard(address)
        if not any(a.node == address.node for a in client.endpoints):
            self.node_owner.pop(address.node, None)

    def _open_channel(
        self, client: ClientState, local: ShmAddress, message: OpenChannel
    ) -> tuple[Reply, int | None]:
        remote = ShmAddress(message.remote_node, message.remote_port)
        if not NODE_NAME.match(remote.node) or remote == local:
            return self._refuse(client, ErrorCode.BAD_TAG, f"bad remote address {remote}"), None
        if self.endpoints.get(local) is not client:
            return self._refuse(client, ErrorCode.NOT_OWNER, f"endpoint {local} is not yours"), None
        try:
            spec = RegionSpec(message.ring_bytes, message.max_message)
        except ValueError as error:
            return self._refuse(client, ErrorCode.BAD_SPEC, str(error)), None
        peer = self.endpoints.get(remote)
        reason = self.policy.check(client.cred, local, remote, None if peer is None else peer.cred)
        if reason is not None:
            return self._refuse(client, ErrorCode.DENIED, reason), None
        side = side_of(local, remote)
        pair = (local, remote) if side == 0 else (remote, local)
        channel = self.by_pair.get(pair)
        if channel is not None:
            mine = channel.owners[side]
            if channel.broken or (mine is client and channel.header.closed(side)):
                self._retire(channel)  # a finished channel: this open starts a fresh one
                channel = None
            elif mine is not None:
                return self._refuse(
                    client, ErrorCode.IN_USE, f"channel {local}-{remote} is open"
                ), None
            elif channel.spec != spec:
                return self._refuse(
                    client, ErrorCode.BAD_SPEC, f"the peer opened it with {channel.spec}"
                ), None
        if channel is None:
            try:
                channel = self._new_channel(pair, spec)
            except OSError as error:
                return self._refuse(
                    client, ErrorCode.INTERNAL, f"cannot create region: {error}"
                ), None
        channel.owners[side] = client
        # The verified pid: the peer's liveness check then trusts the kernel, not the process.
        channel.header.set_pid(side, client.cred.pid)
        client.channels.add(channel.id)
        self.counters["channels_opened"] += 1
        reply = ChannelGranted(channel.id, side, spec.ring_bytes, spec.max_message)
        return reply, channel.fd

    def _new_channel(self, pair: tuple[ShmAddress, ShmAddress], spec: RegionSpec) -> ChannelState:
        channel_id = self._next_channel
        self._next_channel += 1
        fd = os.memfd_create(
            f"stacklib-channel-{channel_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
        )
        try:
            os.ftruncate(fd, spec.region_bytes)
            # Sealed size: a peer cannot shrink the region under the other (SIGBUS).
            fcntl.fcntl(
                fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            )
            header = RegionHeader(mmap.mmap(fd, HEADER_BYTES))
        except BaseException:
            os.close(fd)
            raise
        header.format(spec)
        channel = ChannelState(channel_id, pair, spec, fd, header)
        self.channels[channel_id] = channel
        self.by_pair[pair] = channel
        return channel

    # ---------------------------------------------------------------- single-copy transfers
    def _register(self, client: ClientState, message: Register | Deregister) -> Reply:
        page = xmem.PAGE
        start = message.address // page * page
        end = -(-(message.address + message.length) // page) * page
        if message.length <= 0 or end > 1 << 63:
            return self._refuse(client, ErrorCode.BAD_RANGE, "an empty or impossible range")
        if isinstance(message, Deregister):
            if (start, end) not in client.windows:
                return self._refuse(client, ErrorCode.NOT_OWNER, "that range is not registered")
            client.windows.remove((start, end))
            self.cache.invalidate(client.cred.pid, start, end - start)
            return Ok()
        # The process must have the memory it offers: readable and mapped now.  (Unmapping it
        # later only makes its own transfers fail with BAD_ADDRESS.)
        try:
            mapped = xmem.readable_ranges(client.cred.pid)
        except OSError as error:
            return self._refuse(client, ErrorCode.INTERNAL, f"cannot read its maps: {error}")
        if not xmem.covered(mapped, start, end):
            return self._refuse(
                client, ErrorCode.BAD_RANGE, f"{start:#x}-{end:#x} is not readable memory"
            )
        if len(client.windows) >= MAX_WINDOWS:
            return self._refuse(client, ErrorCode.BAD_RANGE, f"over {MAX_WINDOWS} registrations")
        client.windows.append((start, end))
        self.counters["registrations"] += 1
        return Ok()

    def _open_pool(
        self, client: ClientState, address: ShmAddress, message: OpenPool
    ) -> tuple[Reply, int | None]:
        if self.endpoints.get(address) is not client:
            return self._refuse(
                client, ErrorCode.NOT_OWNER, f"endpoint {address} is not yours"
            ), None
        if address in self.pools:
            return self._refuse(client, ErrorCode.IN_USE, f"{address} has a pool"), None
        try:
            layout = xmem.PoolLayout(message.slots, message.data_bytes)
        except ValueError as error:
            return self._refuse(client, ErrorCode.BAD_SPEC, str(error)), None
        try:
            pool = xmem.create_pool(layout, f"stacklib-pool-{address}")
        except OSError as error:
            return self._refuse(client, ErrorCode.INTERNAL, f"cannot create pool: {error}"), None
        self.pools[address] = (client, pool)
        return PoolGranted(layout.slots, layout.data_bytes), pool.fd

    def _open_queue(self, client: ClientState, slots: int) -> tuple[Reply, int | None]:
        if client.queue is not None:
            return self._refuse(client, ErrorCode.IN_USE, "this connection has a queue"), None
        try:
            layout = xmem.QueueLayout(slots)
        except ValueError as error:
            return self._refuse(client, ErrorCode.BAD_SPEC, str(error)), None
        try:
            fd, region = xmem.create_queue(layout, f"stacklib-queue-{client.cred.pid}")
        except OSError as error:
            return self._refuse(client, ErrorCode.INTERNAL, f"cannot create queue: {error}"), None
        client.queue = xmem.QueueState(fd, region, layout)
        self._doorbell.set()
        return QueueGranted(layout.slots), fd

    def serve_queues(self) -> int:
        """Run every request queue once (at most one ring's worth each, for fairness)."""
        served = 0
        for client in list(self.clients):
            queue = client.queue
            if queue is None or not queue.pending():
                continue
            for _ in range(queue.layout.slots):
                entry = queue.take()
                if entry is None:
                    break
                address, length, channel, side, cookie = entry
                done = self._send_direct(
                    client, SendDirect(client.cred.pid, channel, side, address, length, cookie)
                )
                queue.answer(cookie, done.status, done.length, channel)
                served += 1
        return served

    async def _mover(self) -> None:
        """Serve request queues: poll while busy, spin ``mover_spin`` s, then sleep until a
        doorbell (or ``MOVER_MAX_SLEEP``, which bounds a lost wake-up: no fences in Python)."""
        while True:
            if self.serve_queues():
                await trio.lowlevel.checkpoint()
                continue
            deadline = time.perf_counter() + self.mover_spin
            busy = False
            while time.perf_counter() < deadline:
                await trio.lowlevel.checkpoint()
                if self.serve_queues():
                    busy = True
                    break
            if busy:
                continue
            self._doorbell = trio.Event()
            queues = [c.queue for c in self.clients if c.queue is not None]
            if not queues:
                await self._doorbell.wait()
                continue
            for queue in queues:
                queue.set_sleeping(True)
            if not any(queue.pending() for queue in queues):
                with trio.move_on_after(MOVER_MAX_SLEEP):
                    await self._doorbell.wait()
            for queue in queues:
                if not queue.region.closed:
                    queue.set_sleeping(False)

    def _send_direct(self, client: ClientState, message: SendDirect) -> Done:
        status, length = self._move(client, message)
        self.counters[f"direct_{status.name.lower()}"] += 1
        return Done(message.cookie, int(status), length, message.channel)

    def _move(self, client: ClientState, message: SendDirect) -> tuple[xmem.XferStatus, int]:
        status = xmem.XferStatus
        channel = self.channels.get(message.channel)
        side = message.side
        if channel is None or side not in (0, 1) or channel.owners[side] is not client:
            return status.NOT_OWNER, 0
        peer = channel.owners[1 - side]
        pool_entry = self.pools.get(channel.addresses[1 - side])
        if channel.broken or peer is None or pool_entry is None or pool_entry[0] is not peer:
            return status.PEER_GONE, 0
        pool = pool_entry[1]
        pid, address, length = client.cred.pid, message.address, message.length
        # The sender's side: every page must be registered memory it still has (the TLB).
        missed = self.cache.lookup(pid, address, length)
        if missed:
            shift = self.cache.shift
            windows = client.windows
            for page in missed:
                low = page << shift
                if not any(start <= low < end for start, end in windows):
                    return status.NOT_REGISTERED, 0
            try:
                mapped = xmem.readable_ranges(pid)
            except OSError:
                return status.BAD_ADDRESS, 0
            if not xmem.covered(mapped, missed[0] << shift, (missed[-1] + 1) << shift):
                return status.BAD_ADDRESS, 0
            self.cache.insert(pid, missed)
        # The receiver's side: its next posted buffer, checked inside the pool.
        taken, offset, _ = pool.take(length)
        if taken is not status.OK:
            if taken is status.TOO_LONG:
                pool.complete(offset, 0, channel.id, message.cookie)  # returned unfilled
            return taken, 0
        if client.pidfd is not None and _readable(client.pidfd):
            pool.complete(offset, 0, channel.id, message.cookie)
            return status.BAD_ADDRESS, 0  # it died: never touch a pid that may be reused
        try:
            xmem.read_from(pid, address, pool.data_address + offset, length)
        except xmem.XmemError:
            self.cache.invalidate(pid, address, length)
            pool.complete(offset, 0, channel.id, message.cookie)
            return status.BAD_ADDRESS, 0
        pool.complete(offset, length, channel.id, message.cookie)
        self.counters["direct_bytes"] += length
        return status.OK, length

    def _close_channel(self, client: ClientState, channel_id: int, side: int) -> Reply:
        channel = self.channels.get(channel_id)
        if channel is None or side not in (0, 1) or channel.owners[side] is not client:
            return self._refuse(
                client, ErrorCode.NOT_OWNER, f"channel {channel_id} side {side} is not yours"
            )
        self._leave(client, channel, side, reclaimed=False)
        return Ok()

    def _leave(
        self, client: ClientState, channel: ChannelState, side: int, *, reclaimed: bool
    ) -> None:
        """``client`` leaves its ``side`` of ``channel``: mark the side closed in the header so
        the peer fails the channel.  (One process may own both sides of a channel.)"""
        channel.owners[side] = None
        channel.broken = True
        if client not in channel.owners:
            client.channels.discard(channel.id)
        channel.header.close(side, reclaimed=reclaimed)
        if channel.owners == [None, None]:
            self._retire(channel)

    def _retire(self, channel: ChannelState) -> None:
        for owner in channel.owners:
            if owner is not None:
                owner.channels.discard(channel.id)
        self.channels.pop(channel.id, None)
        if self.by_pair.get(channel.addresses) is channel:
            del self.by_pair[channel.addresses]
        channel.header.buffer.close()
        os.close(channel.fd)

    def reclaim(self, client: ClientState) -> None:
        """A process's connection closed: free its endpoints and channels (paper 000 §3.2)."""
        for channel_id in list(client.channels):
            channel = self.channels[channel_id]
            for side in (0, 1):
                if channel.owners[side] is client:
                    self._leave(client, channel, side, reclaimed=True)
            self.counters["reclaimed_channels"] += 1
        for address in list(client.endpoints):
            self._drop_endpoint(client, address)
            self.counters["reclaimed_endpoints"] += 1
        # Its registrations go, and with them every cached page check of its pid.
        self.counters["reclaimed_registrations"] += len(client.windows)
        client.windows.clear()
        self.cache.invalidate(client.cred.pid)
        if client.pidfd is not None:
            os.close(client.pidfd)
            client.pidfd = None
        if client.queue is not None:
            client.queue.close()
            client.queue = None
        # Its xdp sockets: their ports revoked, the daemon's copies closed.
        self.counters["reclaimed_xsks"] += self.xdp.reclaim(client)
        self.clients.discard(client)
        self._idle_changed.set()

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": self.socket_path,
            "clients": len(self.clients),
            "limits": {
                "max_clients": self.max_clients,
                "max_per_uid": self.limits.max_per_uid,
                "idle_timeout": self.limits.idle_timeout,
            },
            "endpoints": sorted(str(a) for a in self.endpoints),
            "channels": len(self.channels),
            "counters": dict(self.counters),
            "registrations": sum(len(c.windows) for c in self.clients),
            "pools": len(self.pools),
            "cache": {"capacity": self.cache.capacity, **self.cache.stats.as_dict()},
            "xdp": self.xdp.status(),
        }

    # ---------------------------------------------------------------- sockets
    async def _send(
        self, client: ClientState, reply: Reply, seq: int, fds: list[int] | None = None
    ) -> None:
        frame = encode(seq, reply)
        async with client.lock:
            if not fds:
                ancillary = []
            else:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            sent = await client.sock.sendmsg([frame], ancillary)
            while sent < len(frame):  # the descriptor rode with the first byte
                sent += await client.sock.send(frame[sent:])

    async def _flush(self, client: ClientState, frames: list[bytes]) -> None:
        if frames:
            data = b"".join(frames)
            frames.clear()
            async with client.lock:
                view = memoryview(data)
                while view:
                    view = view[await client.sock.send(view) :]

    # ---------------------------------------------------------------- connection limits
    def admit(self, client: ClientState) -> str | None:
        """Make room for a new connection: None if it may be served (shedding an idle
        connection that holds nothing if a limit is reached), else why it is refused."""
        limits = self.limits
        uid = client.cred.uid
        if sum(1 for c in self.clients if c.cred.uid == uid) >= limits.max_per_uid:
            victim = choose_victim(self.clients, uid)
            if victim is None:
                return f"uid {uid} has {limits.max_per_uid} connections holding channels"
            self.shed(victim, f"uid {uid} is at its limit of {limits.max_per_uid} connections")
        if len(self.clients) >= self.max_clients:
            victim = choose_victim(self.clients)
            if victim is None:
                return f"the daemon serves {self.max_clients} connections holding channels"
            self.shed(victim, f"the daemon is at its limit of {self.max_clients} connections")
        return None

    def shed(self, client: ClientState, reason: str) -> None:
        """Close a connection that holds nothing (so nothing is reclaimed), telling it why."""
        self.counters["shed"] += 1
        log.warning("closing the connection of pid %d: %s", client.cred.pid, reason)
        _notify(client.sock, ErrorReply(int(ErrorCode.BUSY), f"connection closed: {reason}"))
        client.scope.cancel()
        self.clients.discard(client)  # at once: it no longer counts against a limit

    def _short_of_descriptors(self, error: OSError) -> bool:
        """``accept`` failed for want of descriptors: count it and shed an idle connection
        (True if one was shed)."""
        self.counters[f"accept_{errno.errorcode[error.errno or 0].lower()}"] += 1
        log.warning("accept: %s; shedding an idle connection, backing off", error)
        victim = choose_victim(self.clients)
        if victim is None:
            return False
        self.shed(victim, "the daemon is out of descriptors")
        return True

    async def _serve_client(self, sock: trio.socket.SocketType) -> None:
        with sock:
            try:
                cred = peer_cred(sock)
            except OSError:
                return
            client = ClientState(sock, cred, last_active=trio.current_time())
            refused = self.admit(client)
            if refused is not None:
                self.counters["busy"] += 1
                log.warning("refused pid %d uid %d: %s", cred.pid, cred.uid, refused)
                _notify(sock, ErrorReply(int(ErrorCode.BUSY), refused))
                return
            with contextlib.suppress(OSError):
                client.pidfd = os.pidfd_open(cred.pid)
            self.clients.add(client)
            self._idle_changed.set()
            log.info("connected: pid %d uid %d gid %d", cred.pid, cred.uid, cred.gid)
            try:
                with client.scope:
                    await self._requests(client)
            except OSError as error:
                log.info("pid %d: connection error %s", cred.pid, error)
            finally:
                log.info("disconnected: pid %d", cred.pid)
                self.reclaim(client)

    async def _recv(self, client: ClientState) -> bytes:
        """The next bytes from ``client``; closes it (b"") once it was silent for the idle
        timeout while holding nothing.  A connection holding something may wait forever."""
        timeout = self.limits.idle_timeout
        while True:
            if timeout is None or not client.holds_nothing():
                data: bytes = await client.sock.recv(65536)
                break
            with trio.move_on_after(timeout):
                data = await client.sock.recv(65536)
                break
            if client.holds_nothing():
                self.counters["idle_closed"] += 1
                log.info("pid %d: idle %.1f s holding nothing: closing", client.cred.pid, timeout)
                _notify(client.sock, ErrorReply(int(ErrorCode.BUSY), "connection closed: idle"))
                return b""
        client.last_active = trio.current_time()
        return data

    async def _requests(self, client: ClientState) -> None:
        """Answer ``client``'s requests until it hangs up."""
        cred = client.cred
        buffer = bytearray()
        pending: list[bytes] = []
        while True:
            # Plain recv: descriptors a client tries to pass are discarded by the kernel.
            data = await self._recv(client)
            if not data:
                break
            buffer += data
            while len(buffer) >= 4:
                length = int.from_bytes(buffer[:4], "big")
                if length > MAX_BODY:
                    # No way to resynchronize a stream: answer and hang up.
                    await self._flush(client, pending)
                    refusal = self._refuse(client, ErrorCode.MALFORMED, f"frame of {length} bytes")
                    await self._send(client, refusal, 0)
                    return
                if len(buffer) < 4 + length:
                    break
                body = bytes(buffer[4 : 4 + length])
                del buffer[: 4 + length]
                seq = int.from_bytes(body[2:6], "big") if len(body) >= 6 else 0
                reply: Reply
                fds: list[int] = []
                try:
                    seq, message = decode(body)
                    if isinstance(message, Doorbell) and message.pid == cred.pid:
                        self._doorbell.set()  # a doorbell is never answered
                        continue
                except DaemonFormatError as error:
                    reply = self._refuse(client, ErrorCode.MALFORMED, str(error))
                else:
                    reply, fds = await self.answer(client, message)
                if isinstance(reply, Done):
                    # Pipelined transfers: their DONEs leave in one send per batch.
                    pending.append(encode(seq, reply))
                    continue
                await self._flush(client, pending)
                await self._send(client, reply, seq, fds)
            await self._flush(client, pending)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled (or idle for ``idle_timeout``); remove the socket on exit."""
        listener = bind_socket(self.socket_path, mode=self.socket_mode, group=self.socket_group)
        identity = os.stat(self.socket_path)
        try:
            with listener:
                async with trio.open_nursery() as nursery:
                    if self.idle_timeout is not None:
                        nursery.start_soon(
                            self._idle_watch, self.idle_timeout, nursery.cancel_scope
                        )
                    nursery.start_soon(self._mover)
                    task_status.started()
                    log.info("listening on %s", self.socket_path)
                    while True:
                        sock = await accept(listener, self._short_of_descriptors)
                        nursery.start_soon(self._serve_client, sock)
        finally:
            unlink_if_same(self.socket_path, identity)
            for channel in list(self.channels.values()):
                self._retire(channel)
            for _, pool in self.pools.values():
                pool.close()
            self.pools.clear()
            self.xdp.close_all()  # detaches every program this daemon attached

    async def _idle_watch(self, timeout: float, scope: trio.CancelScope) -> None:
        while True:
            self._idle_changed = trio.Event()
            if self.clients:
                await self._idle_changed.wait()
                continue
            with trio.move_on_after(timeout):
                await self._idle_changed.wait()
                continue
            log.info("idle for %.1f s: exiting", timeout)
            scope.cancel()
            return


async def run_daemon(
    socket_path: str,
    *,
    policy: DaemonPolicy | None = None,
    idle_timeout: float | None = None,
    cache_entries: int = 1024,
    cache_policy: str = "lru",
    limits: ConnectionLimits | None = None,
    socket_mode: int | None = None,
    socket_group: str | None = None,
) -> Daemon:
    """Run a daemon until SIGTERM/SIGINT (or idle timeout); one per socket (a pid-file lock)."""
    make_directory(socket_path)
    lock_fd = os.open(f"{socket_path}.pid", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DaemonError(f"a daemon already runs for {socket_path}") from None
        os.ftruncate(lock_fd, 0)
        os.write(lock_fd, f"{os.getpid()}\n".encode())
        daemon = Daemon(
            socket_path,
            policy=policy,
            idle_timeout=idle_timeout,
            cache_entries=cache_entries,
            cache_policy=cache_policy,
            limits=limits,
            socket_mode=socket_mode,
            socket_group=socket_group,
        )
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()

                async def serve() -> None:
                    await daemon.serve()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stop_on_signal)
                nursery.start_soon(serve)
        return daemon
    finally:
        os.close(lock_fd)
