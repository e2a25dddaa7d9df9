"""The ``stacklib daemon`` command (also ``python -m stacklib.daemon``)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Sequence

import trio

from stacklib.daemon.client import DaemonClient
from stacklib.daemon.limits import CLIENT_IDLE_TIMEOUT, MAX_CLIENTS_PER_UID, ConnectionLimits
from stacklib.daemon.policy import AllowListFile
from stacklib.daemon.protocol import DaemonError
from stacklib.daemon.server import run_daemon
from stacklib.daemon.sockets import ENV_SOCKET, default_socket_path, socket_permissions


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
    parser.add_argument(
        "--socket-mode",
        type=lambda text: int(text, 8),
        metavar="OCTAL",
        help="the socket's mode (default 0600; a root daemon 0660 with group 'stacklib' if "
        "it exists; 0666 serves every local user)",
    )
    parser.add_argument(
        "--socket-group", metavar="NAME", help="the socket's group (mode 0660 unless given)"
    )
    parser.add_argument(
        "--max-clients",
        type=int,
        metavar="N",
        help="most connections (default: from the descriptor limit, RLIMIT_NOFILE)",
    )
    parser.add_argument(
        "--max-clients-per-uid",
        type=int,
        default=MAX_CLIENTS_PER_UID,
        metavar="N",
        help=f"most connections of one uid (default {MAX_CLIENTS_PER_UID})",
    )
    parser.add_argument(
        "--client-idle-timeout",
        type=float,
        default=CLIENT_IDLE_TIMEOUT,
        metavar="SECONDS",
        help="close a connection holding nothing after this long silent "
        f"(default {CLIENT_IDLE_TIMEOUT:g}; 0: never)",
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
    client_timeout = args.client_idle_timeout
    if not math.isfinite(client_timeout) or client_timeout < 0:
        raise DaemonError("--client-idle-timeout must be a number of seconds (0: never)")
    try:
        limits = ConnectionLimits(
            args.max_clients, args.max_clients_per_uid, client_timeout or None
        )
    except ValueError as error:
        raise DaemonError(str(error)) from None
    socket_permissions(os.geteuid(), args.socket_mode, args.socket_group)  # refused up front
    try:
        trio.run(
            lambda: run_daemon(
                path,
                policy=policy,
                idle_timeout=timeout,
                cache_entries=args.cache_entries,
                cache_policy=args.cache_policy,
                limits=limits,
                socket_mode=args.socket_mode,
                socket_group=args.socket_group,
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
