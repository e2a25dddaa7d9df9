"""The U-Net OS service as a daemon: set-up, authentication and protection, off the data path.

Paper 000 §3.2: the OS service creates endpoints and channels, performs the authentication and
authorization checks and registers the tag; it is never on the data path.  For the shm transport
this daemon (one per host, ``stacklib daemon`` or started on demand) does exactly that:

* it listens on a UNIX stream socket (:func:`default_socket_path`) and identifies each
  connected process by ``SO_PEERCRED`` (pid, uid, gid), never by what the process claims;
* a process registers endpoints (a shm node name and port; a node belongs to one process) and
  opens channels from its own endpoints; the :class:`DaemonPolicy` authorizes the tag (the
  remote address): same uid by default, or an allow-list file;
* the daemon creates each channel's region itself (a sealed ``memfd``: no name in any file
  system, so nobody can open it by path) and passes its descriptor with ``SCM_RIGHTS`` to
  exactly the two owners of the channel, writing each side's verified pid into the header;
* when a process's connection closes (it exited or died) the daemon reclaims its endpoints and
  channels and marks its side of each region closed and reclaimed, so the surviving peer's
  ``ShmLink.check_peer`` fails the channel with ``PeerGone``;
* a malformed or forged request (a pid that is not the caller's, a channel or endpoint it does
  not own, a bogus tag) gets an error reply, is logged and counted, and never stops the daemon.

Messages then flow through the per-channel rings (:mod:`stacklib.transports.shm`) with no
daemon involvement.  :class:`DaemonBroker` plugs the daemon into ``ShmNetwork(broker=...)``.

Wire format (:data:`BODY`): every message is a 4-byte big-endian length and a body of
``version: u8, type: u8, seq: u32`` followed by the type's fields.  Replies echo ``seq``.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import enum
import errno
import fcntl
import fnmatch
import json
import logging
import math
import mmap
import os
import pwd
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import construct as cs
import trio

from stacklib.errors import ChannelError, FormatError, PermissionDenied
from stacklib.transports.shm import (
    _HEADER,
    _SIDE_WORD,
    HEADER_BYTES,
    MAGIC,
    STATE_CLOSED,
    VERSION,
    PeerGone,
    RegionSpec,
    ShmAddress,
    ShmNetwork,
)

log = logging.getLogger("stacklib.daemon")

PROTOCOL_VERSION = 1
#: Largest body accepted; requests are a few dozen bytes, so anything bigger is garbage.
MAX_BODY = 4096
#: Header word (8-byte index) where the daemon sets bit ``1 << side`` for each side it reclaimed
#: because the owning process died (words 3-7 of the header page are unused by shm).
RECLAIMED_WORD = 4
ENV_SOCKET = "STACKLIB_DAEMON_SOCKET"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class DaemonFormatError(FormatError):
    """Bytes that are not a daemon protocol message."""


class DaemonError(ChannelError):
    """The daemon refused a request (``code`` says why) or cannot be reached."""

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class DaemonDenied(DaemonError, PermissionDenied):
    """The daemon refused a request for lack of ownership or authorization."""


class ErrorCode(enum.IntEnum):
    MALFORMED = 1
    FORGED_PID = 2
    NOT_OWNER = 3
    BAD_TAG = 4
    DENIED = 5
    IN_USE = 6
    BAD_SPEC = 7
    INTERNAL = 8


_DENIALS = {ErrorCode.FORGED_PID, ErrorCode.NOT_OWNER, ErrorCode.DENIED}


class MsgType(enum.IntEnum):
    CREATE_ENDPOINT = 1
    OPEN_CHANNEL = 2
    CLOSE_CHANNEL = 3
    CLOSE_ENDPOINT = 4
    STATUS = 5
    OK = 128
    CHANNEL = 129
    ERROR = 130
    STATUS_REPLY = 131


# ==================================================================== wire format

_Name = cs.PascalString(cs.Int8ub, "utf8")
_Text = cs.PascalString(cs.Int16ub, "utf8")

_PAYLOADS: dict[int, Any] = {
    MsgType.CREATE_ENDPOINT: cs.Struct("pid" / cs.Int32ub, "node" / _Name, "port" / cs.Int16ub),
    MsgType.OPEN_CHANNEL: cs.Struct(
        "pid" / cs.Int32ub,
        "node" / _Name,
        "port" / cs.Int16ub,
        "remote_node" / _Name,
        "remote_port" / cs.Int16ub,
        "ring_bytes" / cs.Int32ub,
        "max_message" / cs.Int32ub,
    ),
    MsgType.CLOSE_CHANNEL: cs.Struct(
        "pid" / cs.Int32ub, "channel" / cs.Int32ub, "side" / cs.Int8ub
    ),
    MsgType.CLOSE_ENDPOINT: cs.Struct("pid" / cs.Int32ub, "node" / _Name, "port" / cs.Int16ub),
    MsgType.STATUS: cs.Struct("pid" / cs.Int32ub),
    MsgType.OK: cs.Struct(),
    MsgType.CHANNEL: cs.Struct(
        "channel" / cs.Int32ub,
        "side" / cs.Int8ub,
        "ring_bytes" / cs.Int32ub,
        "max_message" / cs.Int32ub,
    ),
    MsgType.ERROR: cs.Struct("code" / cs.Int16ub, "text" / _Text),
    MsgType.STATUS_REPLY: cs.Struct("text" / _Text),
}

#: The body of every message (after the 4-byte big-endian length prefix).
BODY = cs.Struct(
    "version" / cs.Const(PROTOCOL_VERSION, cs.Int8ub),
    "type" / cs.Int8ub,
    "seq" / cs.Int32ub,
    "payload" / cs.Switch(cs.this.type, _PAYLOADS, default=cs.Error),
    cs.Terminated,
)


@attrs.frozen
class CreateEndpoint:
    pid: int
    node: str
    port: int
    type = MsgType.CREATE_ENDPOINT


@attrs.frozen
class OpenChannel:
    pid: int
    node: str
    port: int
    remote_node: str
    remote_port: int
    ring_bytes: int
    max_message: int
    type = MsgType.OPEN_CHANNEL


@attrs.frozen
class CloseChannel:
    pid: int
    channel: int
    side: int
    type = MsgType.CLOSE_CHANNEL


@attrs.frozen
class CloseEndpoint:
    pid: int
    node: str
    port: int
    type = MsgType.CLOSE_ENDPOINT


@attrs.frozen
class Status:
    pid: int
    type = MsgType.STATUS


@attrs.frozen
class Ok:
    type = MsgType.OK


@attrs.frozen
class ChannelGranted:
    """Reply to OPEN_CHANNEL; the region's descriptor rides along (SCM_RIGHTS)."""

    channel: int
    side: int
    ring_bytes: int
    max_message: int
    type = MsgType.CHANNEL


@attrs.frozen
class ErrorReply:
    code: int
    text: str
    type = MsgType.ERROR


@attrs.frozen
class StatusReply:
    text: str
    type = MsgType.STATUS_REPLY


Request = CreateEndpoint | OpenChannel | CloseChannel | CloseEndpoint | Status
Reply = Ok | ChannelGranted | ErrorReply | StatusReply
Message = Request | Reply

_CLASSES: dict[int, type[Any]] = {
    cls.type: cls
    for cls in (
        CreateEndpoint,
        OpenChannel,
        CloseChannel,
        CloseEndpoint,
        Status,
        Ok,
        ChannelGranted,
        ErrorReply,
        StatusReply,
    )
}


def encode(seq: int, message: Message) -> bytes:
    """One framed message: length prefix and body."""
    try:
        body: bytes = BODY.build(
            {"type": int(message.type), "seq": seq, "payload": attrs.asdict(message)}
        )
    except (cs.ConstructError, UnicodeError, ValueError, OverflowError) as error:
        raise DaemonFormatError(f"cannot encode {message!r}: {error}") from None
    if len(body) > MAX_BODY:
        raise DaemonFormatError(f"{message!r} encodes to {len(body)} > {MAX_BODY} bytes")
    return len(body).to_bytes(4, "big") + body


def decode(body: bytes) -> tuple[int, Message]:
    """Parse one body (without its length prefix): (seq, message); DaemonFormatError if bad."""
    try:
        parsed = BODY.parse(body)
    except (cs.ConstructError, UnicodeError, ValueError, OverflowError) as error:
        raise DaemonFormatError(f"bad message: {error}") from None
    fields = {k: v for k, v in parsed.payload.items() if not k.startswith("_")}
    return int(parsed.seq), _CLASSES[parsed.type](**fields)


# ==================================================================== policy


@attrs.frozen
class Cred:
    """A process as the kernel identifies it (SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket | trio.socket.SocketType) -> Cred:
    """The credentials of the process at the other end of a connected UNIX socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    return Cred(*_CRED.unpack(raw))


class DaemonPolicy(Protocol):
    """Authorization of a channel's tag: None to allow, or the reason for refusing.

    ``peer`` is the owner of the remote endpoint, or None if it is not registered yet (its owner
    is checked in turn when it opens its side).
    """

    def check(
        self, requester: Cred, local: ShmAddress, remote: ShmAddress, peer: Cred | None
    ) -> str | None: ...


class SameUid:
    """Default: both owners of a channel run under one uid."""

    def check(
        self, requester: Cred, local: ShmAddress, remote: ShmAddress, peer: Cred | None
    ) -> str | None:
        if peer is None or peer.uid == requester.uid:
            return None
        return f"uid {requester.uid} may not open a channel to {remote} (owned by uid {peer.uid})"


@attrs.define
class AllowListFile:
    """Allow exactly the listed (user, remote address) pairs.

    One rule per line: ``USER NODE[:PORT]``; USER is a uid, a user name or ``*``; NODE and PORT
    are shell patterns (``*`` for any).  ``#`` starts a comment.
    """

    rules: list[tuple[str, str, str]] = attrs.field(factory=list)

    @classmethod
    def load(cls, path: str) -> AllowListFile:
        rules = []
        with open(path, encoding="utf-8") as f:
            for number, raw in enumerate(f, 1):
                line = raw.split("#", 1)[0].strip()
                if not line:
                    continue
                parts = line.split()
                if len(parts) != 2:
                    raise ValueError(f"{path}:{number}: expected 'USER NODE[:PORT]'")
                user, address = parts
                if not (user == "*" or user.isdigit()):
                    user = str(pwd.getpwnam(user).pw_uid)
                node, _, port = address.partition(":")
                rules.append((user, node, port or "*"))
        return cls(rules)

    def check(
        self, requester: Cred, local: ShmAddress, remote: ShmAddress, peer: Cred | None
    ) -> str | None:
        for user, node, port in self.rules:
            if (
                user in ("*", str(requester.uid))
                and fnmatch.fnmatchcase(remote.node, node)
                and fnmatch.fnmatchcase(str(remote.port), port)
            ):
                return None
        return f"uid {requester.uid} is not on the allow-list for {remote}"


# ==================================================================== the daemon


@attrs.define(eq=False)
class _Client:
    sock: trio.socket.SocketType
    cred: Cred
    endpoints: set[ShmAddress] = attrs.field(factory=set)
    channels: set[int] = attrs.field(factory=set)
    lock: trio.Lock = attrs.field(factory=trio.Lock)


@attrs.define(eq=False)
class _Channel:
    id: int
    addresses: tuple[ShmAddress, ShmAddress]  # side 0, side 1
    spec: RegionSpec
    fd: int
    header: mmap.mmap
    owners: list[_Client | None] = attrs.field(factory=lambda: [None, None])
    #: A side was closed or reclaimed: never joined again; a new open replaces the channel.
    broken: bool = False

    def word(self, index: int) -> int:
        value: int = struct.unpack_from("<Q", self.header, index * 8)[0]
        return value

    def set_word(self, index: int, value: int) -> None:
        struct.pack_into("<Q", self.header, index * 8, value)

    def side_closed(self, side: int) -> bool:
        return self.word(_SIDE_WORD[side] + 1) == STATE_CLOSED


def _side(local: ShmAddress, remote: ShmAddress) -> int:
    # The same rule as FileBroker: the lower (node, port) is side 0.
    return 0 if (local.node, local.port) < (remote.node, remote.port) else 1


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
    ) -> None:
        self.socket_path = socket_path
        self.policy: DaemonPolicy = policy if policy is not None else SameUid()
        self.idle_timeout = idle_timeout
        self.clients: set[_Client] = set()
        self.endpoints: dict[ShmAddress, _Client] = {}
        self.node_owner: dict[str, _Client] = {}
        self.channels: dict[int, _Channel] = {}
        self.by_pair: dict[tuple[ShmAddress, ShmAddress], _Channel] = {}
        self.counters: Counter[str] = Counter()
        self._next_channel = 1
        self._idle_changed = trio.Event()

    # ---------------------------------------------------------------- request handling
    def _refuse(self, client: _Client, code: ErrorCode, text: str) -> ErrorReply:
        self.counters[code.name.lower()] += 1
        log.warning(
            "refused pid %d uid %d: %s: %s", client.cred.pid, client.cred.uid, code.name, text
        )
        return ErrorReply(int(code), text)

    def handle(self, client: _Client, message: Message) -> tuple[Reply, int | None]:
        """Answer one request: the reply and a descriptor to pass with it (or None)."""
        if not isinstance(
            message, CreateEndpoint | OpenChannel | CloseChannel | CloseEndpoint | Status
        ):
            return self._refuse(client, ErrorCode.MALFORMED, "a reply is not a request"), None
        if message.pid != client.cred.pid:
            # The kernel's word, not the payload's, says who is asking.
            return self._refuse(
                client,
                ErrorCode.FORGED_PID,
                f"request claims pid {message.pid} but comes from pid {client.cred.pid}",
            ), None
        self.counters["requests"] += 1
        if isinstance(message, Status):
            return StatusReply(json.dumps(self.status())), None
        if isinstance(message, CloseChannel):
            return self._close_channel(client, message.channel, message.side), None
        address = ShmAddress(message.node, message.port)
        if not _NAME.match(address.node):
            return self._refuse(client, ErrorCode.BAD_TAG, f"bad node name {address.node!r}"), None
        if isinstance(message, CreateEndpoint):
            return self._create_endpoint(client, address), None
        if isinstance(message, CloseEndpoint):
            return self._close_endpoint(client, address), None
        return self._open_channel(client, address, message)

    def _create_endpoint(self, client: _Client, address: ShmAddress) -> Reply:
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

    def _close_endpoint(self, client: _Client, address: ShmAddress) -> Reply:
        if self.endpoints.get(address) is not client:
            return self._refuse(client, ErrorCode.NOT_OWNER, f"endpoint {address} is not yours")
        for channel_id in list(client.channels):
            channel = self.channels[channel_id]
            for side in (0, 1):
                if channel.addresses[side] == address and channel.owners[side] is client:
                    self._leave(client, channel, side, reclaimed=False)
        self._drop_endpoint(client, address)
        return Ok()

    def _drop_endpoint(self, client: _Client, address: ShmAddress) -> None:
        del self.endpoints[address]
        client.endpoints.discard(address)
        if not any(a.node == address.node for a in client.endpoints):
            self.node_owner.pop(address.node, None)

    def _open_channel(
        self, client: _Client, local: ShmAddress, message: OpenChannel
    ) -> tuple[Reply, int | None]:
        remote = ShmAddress(message.remote_node, message.remote_port)
        if not _NAME.match(remote.node) or remote == local:
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
        side = _side(local, remote)
        pair = (local, remote) if side == 0 else (remote, local)
        channel = self.by_pair.get(pair)
        if channel is not None:
            mine = channel.owners[side]
            if channel.broken or (mine is client and channel.side_closed(side)):
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
        channel.set_word(_SIDE_WORD[side], client.cred.pid)
        client.channels.add(channel.id)
        self.counters["channels_opened"] += 1
        reply = ChannelGranted(channel.id, side, spec.ring_bytes, spec.max_message)
        return reply, channel.fd

    def _new_channel(self, pair: tuple[ShmAddress, ShmAddress], spec: RegionSpec) -> _Channel:
        channel_id = self._next_channel
        self._next_channel += 1
        fd = os.memfd_create(
            f"stacklib-channel-{channel_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
        )
        try:
            os.ftruncate(fd, HEADER_BYTES + 2 * spec.ring_bytes)
            # Sealed size: a peer cannot shrink the region under the other (SIGBUS).
            fcntl.fcntl(
                fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            )
            header = mmap.mmap(fd, HEADER_BYTES)
        except BaseException:
            os.close(fd)
            raise
        _HEADER.pack_into(header, 0, MAGIC, VERSION, spec.ring_bytes, spec.max_message)
        channel = _Channel(channel_id, pair, spec, fd, header)
        self.channels[channel_id] = channel
        self.by_pair[pair] = channel
        return channel

    def _close_channel(self, client: _Client, channel_id: int, side: int) -> Reply:
        channel = self.channels.get(channel_id)
        if channel is None or side not in (0, 1) or channel.owners[side] is not client:
            return self._refuse(
                client, ErrorCode.NOT_OWNER, f"channel {channel_id} side {side} is not yours"
            )
        self._leave(client, channel, side, reclaimed=False)
        return Ok()

    def _leave(self, client: _Client, channel: _Channel, side: int, *, reclaimed: bool) -> None:
        """``client`` leaves its ``side`` of ``channel``: mark the side closed in the header so
        the peer fails the channel.  (One process may own both sides of a channel.)"""
        channel.owners[side] = None
        channel.broken = True
        if client not in channel.owners:
            client.channels.discard(channel.id)
        channel.set_word(_SIDE_WORD[side] + 1, STATE_CLOSED)
        if reclaimed:
            channel.set_word(RECLAIMED_WORD, channel.word(RECLAIMED_WORD) | 1 << side)
        if channel.owners == [None, None]:
            self._retire(channel)

    def _retire(self, channel: _Channel) -> None:
        for owner in channel.owners:
            if owner is not None:
                owner.channels.discard(channel.id)
        self.channels.pop(channel.id, None)
        if self.by_pair.get(channel.addresses) is channel:
            del self.by_pair[channel.addresses]
        channel.header.close()
        os.close(channel.fd)

    def reclaim(self, client: _Client) -> None:
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
        self.clients.discard(client)
        self._idle_changed.set()

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": self.socket_path,
            "clients": len(self.clients),
            "endpoints": sorted(str(a) for a in self.endpoints),
            "channels": len(self.channels),
            "counters": dict(self.counters),
        }

    # ---------------------------------------------------------------- sockets
    async def _send(self, client: _Client, reply: Reply, seq: int, fd: int | None) -> None:
        frame = encode(seq, reply)
        async with client.lock:
            if fd is None:
                ancillary = []
            else:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            sent = await client.sock.sendmsg([frame], ancillary)
            while sent < len(frame):  # the descriptor rode with the first byte
                sent += await client.sock.send(frame[sent:])

    async def _serve_client(self, sock: trio.socket.SocketType) -> None:
        with sock:
            try:
                cred = peer_cred(sock)
            except OSError:
                return
            client = _Client(sock, cred)
            self.clients.add(client)
            self._idle_changed.set()
            log.info("connected: pid %d uid %d gid %d", cred.pid, cred.uid, cred.gid)
            buffer = bytearray()
            try:
                while True:
                    # Plain recv: descriptors a client tries to pass are discarded by the kernel.
                    data = await sock.recv(65536)
                    if not data:
                        break
                    buffer += data
                    while len(buffer) >= 4:
                        length = int.from_bytes(buffer[:4], "big")
                        if length > MAX_BODY:
                            # No way to resynchronize a stream: answer and hang up.
                            refusal = self._refuse(
                                client, ErrorCode.MALFORMED, f"frame of {length} bytes"
                            )
                            await self._send(client, refusal, 0, None)
                            return
                        if len(buffer) < 4 + length:
                            break
                        body = bytes(buffer[4 : 4 + length])
                        del buffer[: 4 + length]
                        seq = int.from_bytes(body[2:6], "big") if len(body) >= 6 else 0
                        reply: Reply
                        fd: int | None = None
                        try:
                            seq, message = decode(body)
                        except DaemonFormatError as error:
                            reply = self._refuse(client, ErrorCode.MALFORMED, str(error))
                        else:
                            reply, fd = self.handle(client, message)
                        await self._send(client, reply, seq, fd)
            except OSError as error:
                log.info("pid %d: connection error %s", cred.pid, error)
            finally:
                log.info("disconnected: pid %d", cred.pid)
                self.reclaim(client)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled (or idle for ``idle_timeout``); remove the socket on exit."""
        listener = bind_socket(self.socket_path)
        identity = os.stat(self.socket_path)
        try:
            with listener:
                async with trio.open_nursery() as nursery:
                    if self.idle_timeout is not None:
                        nursery.start_soon(
                            self._idle_watch, self.idle_timeout, nursery.cancel_scope
                        )
                    task_status.started()
                    log.info("listening on %s", self.socket_path)
                    while True:
                        sock, _ = await listener.accept()
                        nursery.start_soon(self._serve_client, sock)
        finally:
            _unlink_if_same(self.socket_path, identity)
            for channel in list(self.channels.values()):
                self._retire(channel)

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


def _unlink_if_same(path: str, identity: os.stat_result) -> None:
    # Remove the socket only if it is still ours (not one a later daemon bound).
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (identity.st_dev, identity.st_ino):
            os.unlink(path)


def _make_directory(socket_path: str) -> None:
    # Root's directory must be searchable by every user; a user's is private.
    mode = 0o755 if os.geteuid() == 0 else 0o700
    os.makedirs(os.path.dirname(socket_path) or ".", mode=mode, exist_ok=True)


def bind_socket(path: str) -> trio.socket.SocketType:
    """Bind and listen on ``path``; replace a stale socket, refuse if a daemon answers there."""
    _make_directory(path)
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise DaemonError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # stale: its daemon is gone
        else:
            raise DaemonError(f"a daemon is already listening on {path}")
        finally:
            probe.close()
    # Bind under a private name and rename into place: clients never see a socket that does
    # not accept yet, and rename is atomic.
    private = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(private)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        raw.bind(private)
        # Root serves every user (the policy decides); a user's daemon only that user.
        os.chmod(private, 0o666 if os.geteuid() == 0 else 0o600)
        raw.listen(64)
        os.rename(private, path)
    except BaseException:
        raw.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(private)
        raise
    return trio.socket.from_stdlib_socket(raw)


def default_socket_path() -> str:
    """``$STACKLIB_DAEMON_SOCKET``; else ``/run/stacklib/daemon.sock`` for root; else
    ``$XDG_RUNTIME_DIR/stacklib/daemon.sock``; else ``/tmp/stacklib-$UID/daemon.sock``."""
    if os.environ.get(ENV_SOCKET):
        return os.environ[ENV_SOCKET]
    if os.geteuid() == 0:
        return "/run/stacklib/daemon.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "stacklib", "daemon.sock")
    return f"/tmp/stacklib-{os.geteuid()}/daemon.sock"


async def run_daemon(
    socket_path: str, *, policy: DaemonPolicy | None = None, idle_timeout: float | None = None
) -> Daemon:
    """Run a daemon until SIGTERM/SIGINT (or idle timeout); one per socket (a pid-file lock)."""
    _make_directory(socket_path)
    lock_fd = os.open(f"{socket_path}.pid", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DaemonError(f"a daemon already runs for {socket_path}") from None
        os.ftruncate(lock_fd, 0)
        os.write(lock_fd, f"{os.getpid()}\n".encode())
        daemon = Daemon(socket_path, policy=policy, idle_timeout=idle_timeout)
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


# ==================================================================== the client side


class DaemonClient:
    """A process's control connection to the daemon (blocking; set-up only).

    The daemon reclaims everything this process set up when the connection closes, so keep the
    client open as long as its channels are in use.
    """

    def __init__(
        self, socket_path: str | None = None, *, start: bool = True, timeout: float = 10.0
    ) -> None:
        self.socket_path = socket_path if socket_path is not None else default_socket_path()
        self.sock = connect(self.socket_path, start=start)
        # The daemon answers in microseconds; a hung daemon must not hang set-up forever.
        self.sock.settimeout(timeout)
        self._seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        """Send arbitrary bytes (tests of the daemon's robustness)."""
        self.sock.sendall(data)

    def receive(self) -> tuple[int, Message, list[int]]:
        """Read one framed message and the descriptors that came with it."""
        fds: list[int] = []
        buffer = b""
        need = 4
        while len(buffer) < need:
            data, new_fds, _, _ = socket.recv_fds(self.sock, max(need - len(buffer), 1), 1)
            fds.extend(new_fds)
            if not data:
                for fd in fds:
                    os.close(fd)
                raise DaemonError(f"the daemon at {self.socket_path} closed the connection")
            buffer += data
            if len(buffer) >= 4 and need == 4:
                need = 4 + int.from_bytes(buffer[:4], "big")
                if need - 4 > MAX_BODY:
                    raise DaemonError(f"the daemon sent a frame of {need - 4} bytes")
        seq, message = decode(buffer[4:need])
        return seq, message, fds

    def request(self, message: Message) -> tuple[Reply, int | None]:
        """Send one request, return the reply (raising DaemonError for an error reply)."""
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        try:
            self.sock.sendall(encode(self._seq, message))
            seq, reply, fds = self.receive()
        except OSError as error:  # timeout, or the daemon went away
            raise DaemonError(f"daemon at {self.socket_path}: {error}") from None
        for extra in fds[1:]:
            os.close(extra)
        fd = fds[0] if fds else None
        if isinstance(reply, ErrorReply):
            if fd is not None:
                os.close(fd)
            try:
                code: ErrorCode | None = ErrorCode(reply.code)
            except ValueError:
                code = None
            cls = DaemonDenied if code in _DENIALS else DaemonError
            raise cls(f"daemon refused: {reply.text}", code)
        if seq != self._seq or isinstance(
            reply, CreateEndpoint | OpenChannel | CloseChannel | CloseEndpoint | Status
        ):
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"unexpected reply {reply!r} (seq {seq}, wanted {self._seq})")
        return reply, fd

    def create_endpoint(self, address: ShmAddress) -> None:
        self.request(CreateEndpoint(os.getpid(), address.node, address.port))

    def close_endpoint(self, address: ShmAddress) -> None:
        self.request(CloseEndpoint(os.getpid(), address.node, address.port))

    def open_channel(
        self, local: ShmAddress, remote: ShmAddress, spec: RegionSpec
    ) -> tuple[ChannelGranted, int]:
        """Open (or join) the channel local-remote: the grant and the region's descriptor."""
        reply, fd = self.request(
            OpenChannel(
                os.getpid(),
                local.node,
                local.port,
                remote.node,
                remote.port,
                spec.ring_bytes,
                spec.max_message,
            )
        )
        if not isinstance(reply, ChannelGranted) or fd is None:
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"unexpected reply {reply!r} to OPEN_CHANNEL")
        return reply, fd

    def close_channel(self, channel: int, side: int) -> None:
        self.request(CloseChannel(os.getpid(), channel, side))

    def status(self) -> dict[str, Any]:
        reply, _ = self.request(Status(os.getpid()))
        if not isinstance(reply, StatusReply):
            raise DaemonError(f"unexpected reply {reply!r} to STATUS")
        result: dict[str, Any] = json.loads(reply.text)
        return result


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
            if size != HEADER_BYTES + 2 * spec.ring_bytes:
                raise DaemonError(f"region of channel {grant.channel} has size {size}")
            region = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        magic, version, ring_bytes, max_message = _HEADER.unpack_from(region, 0)
        if (magic, version, ring_bytes, max_message) != (
            MAGIC,
            VERSION,
            spec.ring_bytes,
            spec.max_message,
        ):
            region.close()
            raise DaemonError(f"region of channel {grant.channel} has a bad header")
        path = channel_path(grant.channel, grant.side)
        self.channels[path] = (grant.channel, grant.side)
        return region, grant.side, path

    def close_region(self, path: str) -> None:
        """Tell the daemon this side closed the channel (needs the shm hook; else the daemon
        notices lazily, when the channel is reopened or this process disconnects)."""
        entry = self.channels.pop(path, None)
        if entry is not None:
            with contextlib.suppress(DaemonError, OSError):
                self.client.close_channel(*entry)

    def close(self) -> None:
        self.client.close()


# ==================================================================== starting on demand


def connect(path: str, *, start: bool = True, timeout: float = 10.0) -> socket.socket:
    """Connect to the daemon at ``path``, starting one (detached) if none answers.

    Starters serialize on ``PATH.start.lock``, so two processes racing here start one daemon.
    """
    sock = _try_connect(path)
    if sock is not None:
        return sock
    if not start:
        raise DaemonError(f"no daemon listens on {path}")
    try:
        _make_directory(path)
        lock_fd = os.open(f"{path}.start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:  # e.g. another user's (root's) socket directory
        raise DaemonError(f"no daemon on {path}, and cannot start one: {error}") from None
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        sock = _try_connect(path)  # the starter before us may have won
        if sock is None:
            _spawn(path)
            deadline = time.monotonic() + timeout
            while sock is None:
                if time.monotonic() > deadline:
                    raise DaemonError(f"started a daemon on {path} but it never answered")
                time.sleep(0.01)
                sock = _try_connect(path)
    finally:
        os.close(lock_fd)
    return sock


def _try_connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as error:
        sock.close()
        if error.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise DaemonError(f"cannot reach the daemon at {path}: {error}") from None
    return sock


#: Seconds an on-demand daemon lingers with no clients before it exits.
ON_DEMAND_IDLE = 300.0


def _spawn(path: str) -> None:
    log_file = open(f"{path}.log", "ab")  # noqa: SIM115  # handed to the child
    with log_file:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "stacklib.daemon"),
                *("--socket", path, "--idle-timeout", str(ON_DEMAND_IDLE)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # detached: no terminal signals, outlives its starter
            close_fds=True,
        )
    # Reap it whenever it exits, so it never lingers as a zombie of this process.
    threading.Thread(target=process.wait, daemon=True, name="stacklib-daemon-reaper").start()


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


# ==================================================================== command line


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Options of ``stacklib daemon`` (also ``python -m stacklib.daemon``)."""
    if parser is None:
        parser = argparse.ArgumentParser(
            prog="stacklib daemon", description="Run the U-Net OS service daemon of this host."
        )
    parser.add_argument(
        "--socket", metavar="PATH", help=f"UNIX socket (default: ${ENV_SOCKET}, else per user)"
    )
    parser.add_argument(
        "--allow", metavar="FILE", help="allow-list file (USER NODE[:PORT] per line)"
    )
    parser.add_argument(
        "--idle-timeout", type=float, metavar="SECONDS", help="exit after this long with no clients"
    )
    parser.add_argument("--status", action="store_true", help="print a running daemon's status")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every connection")
    return parser


def cmd_daemon(args: argparse.Namespace) -> int:
    """Run (or query) the daemon; the ``stacklib daemon`` sub-command."""
    path = args.socket or default_socket_path()
    if args.status:
        with DaemonClient(path, start=False) as client:
            print(json.dumps(client.status(), indent=2))
        return 0
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s stacklib-daemon[%(process)d] %(levelname)s %(message)s",
    )
    try:
        policy = AllowListFile.load(args.allow) if args.allow else None
    except (OSError, ValueError, KeyError) as error:  # KeyError: an unknown user name
        raise DaemonError(f"allow-list {args.allow}: {error}") from None
    timeout = args.idle_timeout
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise DaemonError("--idle-timeout must be a positive number of seconds")
    try:
        trio.run(lambda: run_daemon(path, policy=policy, idle_timeout=timeout))
    except OSError as error:  # e.g. no permission for the socket's directory
        raise DaemonError(f"cannot serve on {path}: {error}") from None
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return cmd_daemon(args)
    except DaemonError as error:
        print(f"stacklib daemon: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Delegate to the imported module so classes are the package's own, not __main__ copies.
    from stacklib.daemon import main as _main

    sys.exit(_main())
