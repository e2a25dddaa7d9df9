"""A daemon in a process of its own: start it, wait until it answers, stop it.

What tests, benchmarks and tutorials need when they run a private daemon on a socket of their
own (``stacklib daemon --socket PATH``) rather than the host's.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from typing import IO

from stacklib.daemon.client import DaemonClient
from stacklib.daemon.protocol import DaemonError

__all__ = ["start_daemon", "stop_daemon"]


def start_daemon(
    path: str,
    *options: str,
    nofile: int | None = None,
    stderr: int | IO[bytes] | None = subprocess.DEVNULL,
    timeout: float = 10.0,
) -> subprocess.Popen[bytes]:
    """Start ``stacklib daemon --socket path *options`` and return once it answers on the
    socket, or once it has exited (the caller reads ``process.poll()``).  ``nofile`` sets its
    RLIMIT_NOFILE (in its own process only).  Raises TimeoutError if it neither answers nor
    exits within ``timeout`` seconds, having killed it."""

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    process = subprocess.Popen(
        [sys.executable, "-m", "stacklib.daemon", "--socket", path, *options],
        stderr=stderr,
        preexec_fn=limit if nofile is not None else None,
    )
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        try:  # answering, not merely a socket file: a stale one may be there before it
            DaemonClient(path, start=False).close()
            return process
        except DaemonError:
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise TimeoutError(f"the daemon on {path} did not answer in {timeout} s") from None
            time.sleep(0.01)
    return process


def stop_daemon(process: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
    """Stop a daemon with SIGTERM (SIGKILL after ``timeout`` seconds); its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stderr is not None:
        process.stderr.close()
    return process.returncode
