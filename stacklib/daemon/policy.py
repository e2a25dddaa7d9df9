"""Who may open which channel: the kernel's word on a caller, and the daemon's policies."""

from __future__ import annotations

import fnmatch
import pwd
import socket
import struct
from typing import Protocol

import attrs
import trio

from stacklib.transports.shm import ShmAddress

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


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
