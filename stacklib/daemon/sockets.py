"""Where the daemon listens, and how a process reaches it (starting one on demand)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import trio

from stacklib.daemon.limits import ACCEPT_BACKOFF, ACCEPT_BACKOFF_MAX
from stacklib.daemon.protocol import DaemonError

ENV_SOCKET = "STACKLIB_DAEMON_SOCKET"


def unlink_if_same(path: str, identity: os.stat_result) -> None:
    # Remove the socket only if it is still ours (not one a later daemon bound).
    with contextlib.suppress(OSError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino) == (identity.st_dev, identity.st_ino):
            os.unlink(path)


def make_directory(socket_path: str) -> None:
    # Root's directory must be searchable by every user; a user's is private.
    mode = 0o755 if os.geteuid() == 0 else 0o700
    os.makedirs(os.path.dirname(socket_path) or ".", mode=mode, exist_ok=True)


#: The group whose members may connect to a root daemon's socket (mode 0660), if it exists.
SOCKET_GROUP = "stacklib"


def socket_permissions(
    euid: int, mode: int | None = None, group: str | None = None
) -> tuple[int, int]:
    """The mode and group id (-1: leave it) of the daemon's socket: who may connect at all.

    Policy: an explicit ``mode`` or ``group`` wins (``group`` alone gives 0660).  Otherwise a
    user's daemon serves only that user (0600), and a root daemon serves root and the members
    of the group :data:`SOCKET_GROUP` (0660) if that group exists, else root only (0600).  A
    root daemon serves every local user only when asked to (``mode=0o666``); the policy and the
    per-uid limits then decide what each may do.
    """
    if mode is not None and not 0 <= mode <= 0o777:
        raise DaemonError(f"socket mode {mode:#o} is not a permission mode")
    gid = -1
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise DaemonError(f"no group {group!r} for the daemon's socket") from None
        return (0o660 if mode is None else mode), gid
    if mode is not None:
        return mode, -1
    if euid == 0:
        with contextlib.suppress(KeyError):
            return 0o660, grp.getgrnam(SOCKET_GROUP).gr_gid
    return 0o600, -1


def bind_socket(
    path: str, *, mode: int | None = None, group: str | None = None
) -> trio.socket.SocketType:
    """Bind and listen on ``path`` with the permissions of :func:`socket_permissions`; replace
    a stale socket, refuse if a daemon answers there."""
    socket_mode, gid = socket_permissions(os.geteuid(), mode, group)
    make_directory(path)
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
        os.chown(private, -1, gid)
        os.chmod(private, socket_mode)
        raw.listen(64)
        os.rename(private, path)
    except BaseException:
        raw.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(private)
        raise
    return trio.socket.from_stdlib_socket(raw)


#: Descriptor shortages that make ``accept`` fail with nothing wrong with the listener.
SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO})


async def accept(
    listener: trio.socket.SocketType, short: Callable[[OSError], bool]
) -> trio.socket.SocketType:
    """The next connection.  While descriptors are short (:data:`SHORTAGE`), call ``short``
    (which frees a descriptor if it can, returning True) and back off: pending connections
    wait in the listen backlog, and the daemon never fails for it."""
    backoff = ACCEPT_BACKOFF
    while True:
        try:
            sock, _ = await listener.accept()
        except OSError as error:
            if error.errno in _GONE:
                continue  # that client left before we took it
            if error.errno not in SHORTAGE:
                raise
            if short(error):
                await trio.sleep(ACCEPT_BACKOFF)  # the closed connection's task unwinds
            else:
                await trio.sleep(backoff)
                backoff = min(2 * backoff, ACCEPT_BACKOFF_MAX)
            continue
        return sock


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
        make_directory(path)
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
