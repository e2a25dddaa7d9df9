"""The U-Net OS service as a daemon: set-up, authentication and protection, and single copies.

Paper 000 §3.2: the OS service creates endpoints and channels, performs the authentication and
authorization checks and registers the tag; it is never on the data path of ring messages (it
moves only single-copy transfers, see below).  For the shm transport this daemon (one per
host, ``stacklib daemon`` or started on demand) does exactly that:

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
  not own, a bogus tag) gets an error reply, is logged and counted, and never stops the daemon;
* single-copy transfers (:mod:`stacklib.transports.xmem`, paper 002 §4): a process registers
  memory it has, a receiver gets a receive pool it posts buffers into, and on SEND_DIRECT (or
  an entry in the sender's shared request queue) the daemon checks channel, side and
  registration and copies with one ``process_vm_readv`` from the sender into the peer's next
  posted buffer; failures are statuses on the DONE, never a crash.

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
import select
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
from stacklib.transports import xmem
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
    ShmEndpoint,
    ShmNetwork,
    ShmNI,
)
from stacklib.wire.codec import FixedCodec, derive_codec

log = logging.getLogger("stacklib.daemon")

PROTOCOL_VERSION = 1
#: Largest body accepted; requests are a few dozen bytes, so anything bigger is garbage.
MAX_BODY = 4096
#: Header word (8-byte index) where the daemon sets bit ``1 << side`` for each side it reclaimed
#: because the owning process died (words 3-7 of the header page are unused by shm).
RECLAIMED_WORD = 4
ENV_SOCKET = "STACKLIB_DAEMON_SOCKET"
#: Most memory ranges one process may register for single-copy transfers.
MAX_WINDOWS = 256
#: Seconds the request-queue mover polls before sleeping, and its longest sleep.
MOVER_SPIN = 50e-6
MOVER_MAX_SLEEP = 0.02
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
    BAD_RANGE = 9


_DENIALS = {ErrorCode.FORGED_PID, ErrorCode.NOT_OWNER, ErrorCode.DENIED}


class MsgType(enum.IntEnum):
    CREATE_ENDPOINT = 1
    OPEN_CHANNEL = 2
    CLOSE_CHANNEL = 3
    CLOSE_ENDPOINT = 4
    STATUS = 5
    REGISTER = 6
    DEREGISTER = 7
    OPEN_POOL = 8
    SEND_DIRECT = 9
    OPEN_QUEUE = 10
    DOORBELL = 11
    OK = 128
    CHANNEL = 129
    ERROR = 130
    STATUS_REPLY = 131
    POOL = 132
    DONE = 133
    QUEUE = 134


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
    MsgType.REGISTER: cs.Struct("pid" / cs.Int32ub, "address" / cs.Int64ub, "length" / cs.Int64ub),
    MsgType.DEREGISTER: cs.Struct(
        "pid" / cs.Int32ub, "address" / cs.Int64ub, "length" / cs.Int64ub
    ),
    MsgType.OPEN_POOL: cs.Struct(
        "pid" / cs.Int32ub,
        "node" / _Name,
        "port" / cs.Int16ub,
        "slots" / cs.Int32ub,
        "data_bytes" / cs.Int64ub,
    ),
    MsgType.SEND_DIRECT: cs.Struct(
        "pid" / cs.Int32ub,
        "channel" / cs.Int32ub,
        "side" / cs.Int8ub,
        "address" / cs.Int64ub,
        "length" / cs.Int32ub,
        "cookie" / cs.Int32ub,
    ),
    MsgType.OPEN_QUEUE: cs.Struct("pid" / cs.Int32ub, "slots" / cs.Int32ub),
    MsgType.DOORBELL: cs.Struct("pid" / cs.Int32ub),
    MsgType.OK: cs.Struct(),
    MsgType.CHANNEL: cs.Struct(
        "channel" / cs.Int32ub,
        "side" / cs.Int8ub,
        "ring_bytes" / cs.Int32ub,
        "max_message" / cs.Int32ub,
    ),
    MsgType.ERROR: cs.Struct("code" / cs.Int16ub, "text" / _Text),
    MsgType.STATUS_REPLY: cs.Struct("text" / _Text),
    MsgType.QUEUE: cs.Struct("slots" / cs.Int32ub),
    MsgType.POOL: cs.Struct("slots" / cs.Int32ub, "data_bytes" / cs.Int64ub),
    MsgType.DONE: cs.Struct(
        "cookie" / cs.Int32ub, "status" / cs.Int8ub, "length" / cs.Int32ub, "channel" / cs.Int32ub
    ),
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
class Register:
    """Let transfers read ``length`` bytes at ``address`` of the caller (whole pages)."""

    pid: int
    address: int
    length: int
    type = MsgType.REGISTER


@attrs.frozen
class Deregister:
    pid: int
    address: int
    length: int
    type = MsgType.DEREGISTER


@attrs.frozen
class OpenPool:
    """Create the receive pool of the caller's endpoint (reply POOL and its descriptor)."""

    pid: int
    node: str
    port: int
    slots: int
    data_bytes: int
    type = MsgType.OPEN_POOL


@attrs.frozen
class SendDirect:
    """Copy ``length`` bytes at ``address`` of the caller into the next posted buffer of the
    peer of ``channel`` (the caller owns ``side``); reply DONE with ``cookie``."""

    pid: int
    channel: int
    side: int
    address: int
    length: int
    cookie: int
    type = MsgType.SEND_DIRECT


@attrs.frozen
class OpenQueue:
    """Create the caller's request queue (reply QUEUE and its descriptor)."""

    pid: int
    slots: int
    type = MsgType.OPEN_QUEUE


@attrs.frozen
class Doorbell:
    """The caller's request queue has work and the daemon's mover sleeps (no reply)."""

    pid: int
    type = MsgType.DOORBELL


@attrs.frozen
class QueueGranted:
    slots: int
    type = MsgType.QUEUE


@attrs.frozen
class PoolGranted:
    slots: int
    data_bytes: int
    type = MsgType.POOL


@attrs.frozen
class Done:
    """The completion of a SEND_DIRECT: an :class:`~stacklib.transports.xmem.XferStatus`."""

    cookie: int
    status: int
    length: int
    channel: int
    type = MsgType.DONE


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


Request = (
    CreateEndpoint
    | OpenChannel
    | CloseChannel
    | CloseEndpoint
    | Status
    | Register
    | Deregister
    | OpenPool
    | SendDirect
    | OpenQueue
    | Doorbell
)
Reply = Ok | ChannelGranted | ErrorReply | StatusReply | PoolGranted | Done | QueueGranted
_REQUESTS = (
    CreateEndpoint,
    OpenChannel,
    CloseChannel,
    CloseEndpoint,
    Status,
    Register,
    Deregister,
    OpenPool,
    SendDirect,
    OpenQueue,
    Doorbell,
)
Message = Request | Reply

_CLASSES: dict[int, type[Any]] = {
    cls.type: cls
    for cls in (
        CreateEndpoint,
        OpenChannel,
        CloseChannel,
        CloseEndpoint,
        Status,
        Register,
        Deregister,
        OpenPool,
        SendDirect,
        OpenQueue,
        Doorbell,
        QueueGranted,
        Ok,
        ChannelGranted,
        ErrorReply,
        StatusReply,
        PoolGranted,
        Done,
    )
}


def _fixed(kind: MsgType) -> FixedCodec:
    # The whole body of a fixed-size message, derived from the same construct definition.
    frame = cs.Struct(
        "version" / cs.Const(PROTOCOL_VERSION, cs.Int8ub),
        "type" / cs.Const(int(kind), cs.Int8ub),
        "seq" / cs.Int32ub,
        "payload" / _PAYLOADS[kind],
    )
    return derive_codec(frame, DaemonFormatError)


#: Struct-speed codecs of the per-transfer messages (SEND_DIRECT and its DONE), which are on
#: the data path of single-copy transfers; tests prove them equal to :data:`BODY`.
FAST_CODECS: dict[int, tuple[FixedCodec, type[Any]]] = {
    MsgType.SEND_DIRECT: (_fixed(MsgType.SEND_DIRECT), SendDirect),
    MsgType.DONE: (_fixed(MsgType.DONE), Done),
}


def encode(seq: int, message: Message) -> bytes:
    """One framed message: length prefix and body."""
    fast = FAST_CODECS.get(message.type)
    if fast is not None:
        codec = fast[0]
        try:
            return codec.size.to_bytes(4, "big") + codec.pack(seq, *attrs.astuple(message))
        except ValueError as error:
            raise DaemonFormatError(f"cannot encode {message!r}: {error}") from None
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
    fast = FAST_CODECS.get(body[1]) if len(body) > 1 else None
    if fast is not None and len(body) == fast[0].size:
        values = fast[0].unpack(body)
        return int(values[0]), fast[1](*values[1:])
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
    #: Registered memory (page-aligned [start, end) ranges) single-copy transfers may read.
    windows: list[tuple[int, int]] = attrs.field(factory=list)
    #: A pidfd of the process: a transfer checks it is still alive before touching its pid.
    pidfd: int | None = None
    #: Its request queue (transfers submitted through shared memory), if it opened one.
    queue: xmem.QueueState | None = None


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


def _readable(fd: int) -> bool:
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


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
        cache_entries: int = 1024,
        cache_policy: str = "lru",
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
        #: Receive pools of endpoints, for single-copy transfers (stacklib.transports.xmem).
        self.pools: dict[ShmAddress, tuple[_Client, xmem.PoolState]] = {}
        #: Page checks of registered memory, bounded like the NI TLB (paper 002 §4).
        self.cache = xmem.RegistrationCache(cache_entries, cache_policy)
        self._next_channel = 1
        self._idle_changed = trio.Event()
        #: Set by a DOORBELL or a new queue: the request-queue mover wakes up.
        self._doorbell = trio.Event()
        #: Seconds the mover polls request queues before it sleeps (as the shm transport does).
        self.mover_spin = MOVER_SPIN

    # ---------------------------------------------------------------- request handling
    def _refuse(self, client: _Client, code: ErrorCode, text: str) -> ErrorReply:
        self.counters[code.name.lower()] += 1
        log.warning(
            "refused pid %d uid %d: %s: %s", client.cred.pid, client.cred.uid, code.name, text
        )
        return ErrorReply(int(code), text)

    def handle(self, client: _Client, message: Message) -> tuple[Reply, int | None]:
        """Answer one request: the reply and a descriptor to pass with it (or None)."""
        if not isinstance(message, _REQUESTS):
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
        if not _NAME.match(address.node):
            return self._refuse(client, ErrorCode.BAD_TAG, f"bad node name {address.node!r}"), None
        if isinstance(message, CreateEndpoint):
            return self._create_endpoint(client, address), None
        if isinstance(message, CloseEndpoint):
            return self._close_endpoint(client, address), None
        if isinstance(message, OpenPool):
            return self._open_pool(client, address, message)
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
        pool = self.pools.pop(address, None)
        if pool is not None:
            pool[1].close()
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

    # ---------------------------------------------------------------- single-copy transfers
    def _register(self, client: _Client, message: Register | Deregister) -> Reply:
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
        self, client: _Client, address: ShmAddress, message: OpenPool
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

    def _open_queue(self, client: _Client, slots: int) -> tuple[Reply, int | None]:
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

    def _send_direct(self, client: _Client, message: SendDirect) -> Done:
        status, length = self._move(client, message)
        self.counters[f"direct_{status.name.lower()}"] += 1
        return Done(message.cookie, int(status), length, message.channel)

    def _move(self, client: _Client, message: SendDirect) -> tuple[xmem.XferStatus, int]:
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
            "registrations": sum(len(c.windows) for c in self.clients),
            "pools": len(self.pools),
            "cache": {"capacity": self.cache.capacity, **self.cache.stats.as_dict()},
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

    async def _flush(self, client: _Client, frames: list[bytes]) -> None:
        if frames:
            data = b"".join(frames)
            frames.clear()
            async with client.lock:
                view = memoryview(data)
                while view:
                    view = view[await client.sock.send(view) :]

    async def _serve_client(self, sock: trio.socket.SocketType) -> None:
        with sock:
            try:
                cred = peer_cred(sock)
            except OSError:
                return
            client = _Client(sock, cred)
            with contextlib.suppress(OSError):
                client.pidfd = os.pidfd_open(cred.pid)
            self.clients.add(client)
            self._idle_changed.set()
            log.info("connected: pid %d uid %d gid %d", cred.pid, cred.uid, cred.gid)
            buffer = bytearray()
            pending: list[bytes] = []
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
                            await self._flush(client, pending)
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
                            if isinstance(message, Doorbell) and message.pid == cred.pid:
                                self._doorbell.set()  # a doorbell is never answered
                                continue
                        except DaemonFormatError as error:
                            reply = self._refuse(client, ErrorCode.MALFORMED, str(error))
                        else:
                            reply, fd = self.handle(client, message)
                        if isinstance(reply, Done):
                            # Pipelined transfers: their DONEs leave in one send per batch.
                            pending.append(encode(seq, reply))
                            continue
                        await self._flush(client, pending)
                        await self._send(client, reply, seq, fd)
                    await self._flush(client, pending)
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
                    nursery.start_soon(self._mover)
                    task_status.started()
                    log.info("listening on %s", self.socket_path)
                    while True:
                        sock, _ = await listener.accept()
                        nursery.start_soon(self._serve_client, sock)
        finally:
            _unlink_if_same(self.socket_path, identity)
            for channel in list(self.channels.values()):
                self._retire(channel)
            for _, pool in self.pools.values():
                pool.close()
            self.pools.clear()

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
    socket_path: str,
    *,
    policy: DaemonPolicy | None = None,
    idle_timeout: float | None = None,
    cache_entries: int = 1024,
    cache_policy: str = "lru",
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
        daemon = Daemon(
            socket_path,
            policy=policy,
            idle_timeout=idle_timeout,
            cache_entries=cache_entries,
            cache_policy=cache_policy,
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
        #: Single-copy transfers submitted and not yet reaped.
        self.in_flight = 0
        self._rx = bytearray()

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
        if self.in_flight:
            raise DaemonError(
                f"{self.in_flight} single-copy transfers are in flight: reap() them before "
                "another request"
            )
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
        if seq != self._seq or isinstance(reply, _REQUESTS):
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

    # ---------------------------------------------------------------- single-copy transfers
    def register_memory(self, address: int, length: int) -> None:
        """Let single-copy transfers read these bytes of this process (whole pages)."""
        self.request(Register(os.getpid(), address, length))

    def deregister_memory(self, address: int, length: int) -> None:
        self.request(Deregister(os.getpid(), address, length))

    def open_pool(self, local: ShmAddress, slots: int, data_bytes: int) -> xmem.ReceivePool:
        """Create and map the receive pool of this process's endpoint ``local``."""
        reply, fd = self.request(OpenPool(os.getpid(), local.node, local.port, slots, data_bytes))
        if not isinstance(reply, PoolGranted) or fd is None:
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"unexpected reply {reply!r} to OPEN_POOL")
        try:
            layout = xmem.PoolLayout(reply.slots, reply.data_bytes)
            if os.fstat(fd).st_size != layout.total:
                raise DaemonError(f"pool of {local} has the wrong size")
            region = mmap.mmap(fd, layout.total)
        finally:
            os.close(fd)
        return xmem.ReceivePool(region, layout)

    def open_queue(self, slots: int = 64) -> xmem.RequestQueue:
        """Create this connection's request queue: transfers submitted through shared memory."""
        reply, fd = self.request(OpenQueue(os.getpid(), slots))
        if not isinstance(reply, QueueGranted) or fd is None:
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"unexpected reply {reply!r} to OPEN_QUEUE")
        try:
            layout = xmem.QueueLayout(reply.slots)
            if os.fstat(fd).st_size != layout.total:
                raise DaemonError("the request queue has the wrong size")
            region = mmap.mmap(fd, layout.total)
        finally:
            os.close(fd)
        doorbell = encode(0, Doorbell(os.getpid()))
        return xmem.RequestQueue(region, layout, lambda: self.sock.sendall(doorbell))

    def submit_direct(
        self, channel: int, side: int, address: int, length: int, cookie: int
    ) -> None:
        """Queue a single-copy transfer without waiting; :meth:`reap` collects its DONE.

        Requests are answered in order, so several may be in flight (a pipeline).
        """
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        frame = encode(self._seq, SendDirect(os.getpid(), channel, side, address, length, cookie))
        try:
            self.sock.sendall(frame)
        except OSError as error:
            raise DaemonError(f"daemon at {self.socket_path}: {error}") from None
        self.in_flight += 1

    def reap(self) -> Done:
        """The next DONE of a submitted transfer (raising DaemonError for an error reply)."""
        if not self.in_flight:
            raise DaemonError("reap() with no single-copy transfer in flight")
        # DONEs carry no descriptors and arrive in batches: read them through a buffer.
        rx = self._rx
        try:
            while len(rx) < 4 or len(rx) < 4 + int.from_bytes(rx[:4], "big"):
                if len(rx) >= 4 and int.from_bytes(rx[:4], "big") > MAX_BODY:
                    raise DaemonError(f"the daemon sent a frame of {len(rx) - 4}+ bytes")
                data = self.sock.recv(65536)
                if not data:
                    raise DaemonError(f"the daemon at {self.socket_path} closed the connection")
                rx += data
        except OSError as error:
            raise DaemonError(f"daemon at {self.socket_path}: {error}") from None
        end = 4 + int.from_bytes(rx[:4], "big")
        _, reply = decode(bytes(rx[4:end]))
        del rx[:end]
        self.in_flight -= 1
        if isinstance(reply, ErrorReply):
            code = ErrorCode(reply.code) if reply.code in set(ErrorCode) else None
            cls = DaemonDenied if code in _DENIALS else DaemonError
            raise cls(f"daemon refused: {reply.text}", code)
        if not isinstance(reply, Done):
            raise DaemonError(f"unexpected reply {reply!r} to SEND_DIRECT")
        return reply

    def send_direct(self, channel: int, side: int, address: int, length: int) -> Done:
        """One single-copy transfer, waited for."""
        self.submit_direct(channel, side, address, length, 0)
        return self.reap()

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
    parser.add_argument(
        "--cache-entries",
        type=int,
        default=1024,
        metavar="N",
        help="pages in the registration cache of single-copy transfers (default 1024)",
    )
    parser.add_argument(
        "--cache-policy", choices=("lru", "fifo"), default="lru", help="its eviction policy"
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
    if args.cache_entries < 1:
        raise DaemonError("--cache-entries must be at least 1")
    try:
        trio.run(
            lambda: run_daemon(
                path,
                policy=policy,
                idle_timeout=timeout,
                cache_entries=args.cache_entries,
                cache_policy=args.cache_policy,
            )
        )
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
