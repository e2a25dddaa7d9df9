"""Where the daemon listens, and how a process reaches it (starting one on demand)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import trio

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


def bind_socket(path: str) -> trio.socket.SocketType:
    """Bind and listen on ``path``; replace a stale socket, refuse if a daemon answers there."""
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
