"""Network namespaces for tests and tutorials: made, used and always removed with ``ip``.

A namespace is a private copy of the kernel's network stack (interfaces, addresses, routes), so
a test can give the kernel an address and talk to it through a TAP device or a veth pair
without touching the machine's own network.  Everything here shells out to the ``ip`` tool
(iproute2) and needs CAP_NET_ADMIN; :func:`capability_problem` says what is missing, so tests
can skip with that reason.

Names are unique per process (``PREFIX-PID-RANDOM``): runs in parallel do not collide, and
:func:`remove_stale` can delete what a killed run left behind.

Run as ``python -m stacklib.netns ping ADDRESS [COUNT [WAIT]]`` this module is a minimal ping
(raw ICMP socket, exit status 0 if any echo was answered), for machines without ``ping``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from stacklib.errors import StacklibError

__all__ = [
    "RANK_INTERFACE",
    "NetnsError",
    "bridged_namespaces",
    "capability_problem",
    "links",
    "local_veth",
    "namespaces",
    "netns",
    "netns_argv",
    "ping_argv",
    "remove_stale",
    "remove_stale_links",
    "run_in",
    "veth_pair",
]

_CAP_NET_ADMIN = 12
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class NetnsError(StacklibError, OSError):
    """An ``ip`` command failed; the message holds the command and its error output."""


@functools.cache
def capability_problem() -> str | None:
    """Why namespaces and TAP devices cannot be used here, or None if they can.

    Checks the ``ip`` tool, ``/dev/net/tun``, CAP_NET_ADMIN, and finally creates and deletes
    a namespace, which also needs the right to mount under ``/run/netns``.
    """
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if shutil.which("ip") is None:
        return "the ip tool is missing (apt-get install iproute2)"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (modprobe tun; in a container: --device /dev/net/tun)"
    if not _has_cap_net_admin():
        return "CAP_NET_ADMIN is missing (run as root, or in a container: --cap-add NET_ADMIN)"
    try:
        os.close(os.open("/dev/net/tun", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/net/tun: {exc.strerror}"
    try:
        with netns("slprobe"):
            pass
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    return None


def _has_cap_net_admin() -> bool:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = ["ip", *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise NetnsError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result


@contextmanager
def netns(name_prefix: str = "sl") -> Iterator[str]:
    """A new network namespace, named ``PREFIX-PID-RANDOM``, deleted on exit even on error.

    Its interfaces (veths, TAP interfaces moved into it) go with it.  Processes still running
    inside keep it alive, unnamed, until they exit.
    """
    if not _NAME.fullmatch(name_prefix):
        raise ValueError(f"name_prefix must match {_NAME.pattern}, got {name_prefix!r}")
    name = f"{name_prefix}-{os.getpid()}-{secrets.token_hex(3)}"
    _ip("netns", "add", name)
    try:
        yield name
    finally:
        _ip("netns", "delete", name)


def namespaces() -> list[str]:
    """The names of the named network namespaces (``ip netns list``)."""
    lines = _ip("netns", "list").stdout.splitlines()
    return [line.split()[0] for line in lines if line.strip()]


def links(ns: str | None = None) -> list[str]:
    """The interface names in namespace ``ns`` (None: this process's namespace)."""
    where = ("-n", ns) if ns is not None else ()
    return [link["ifname"] for link in json.loads(_ip(*where, "-j", "link", "show").stdout)]


def remove_stale(name_prefix: str) -> list[str]:
    """Delete namespaces made by :func:`netns` with this prefix in processes that have exited
    (a run killed before its clean-up); returns their names."""
    pattern = re.compile(rf"{re.escape(name_prefix)}-(\d+)-[0-9a-f]+")
    removed = []
    for name in namespaces():
        match = pattern.fullmatch(name)
        if match and not _alive(int(match.group(1))):
            _ip("netns", "delete", name)
            removed.append(name)
    return removed


@contextmanager
def local_veth(name_prefix: str) -> Iterator[tuple[str, str]]:
    """Both ends of a veth pair in this process's namespace, up, without addresses, named
    ``PREFIX<pid>a`` and ``PREFIX<pid>b``; deleted on exit even on error (deleting one end
    takes the other)."""
    if not _NAME.fullmatch(name_prefix):
        raise ValueError(f"name_prefix must match {_NAME.pattern}, got {name_prefix!r}")
    a, b = f"{name_prefix}{os.getpid()}a", f"{name_prefix}{os.getpid()}b"
    veth_pair(None, None, name_a=a, name_b=b)
    try:
        yield a, b
    finally:
        _ip("link", "del", a, check=False)


def remove_stale_links(name_prefix: str) -> list[str]:
    """Delete veth pairs made by :func:`local_veth` with this prefix in processes that have
    exited (a run killed before its clean-up); returns the names deleted."""
    pattern = re.compile(rf"{re.escape(name_prefix)}(\d+)[ab]")
    removed = []
    for name in links():
        match = pattern.fullmatch(name)
        if match and not _alive(int(match.group(1))):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_argv(ns: str, *cmd: str) -> list[str]:
    """The command line that runs ``cmd`` inside namespace ``ns`` (for ``trio.run_process``)."""
    return ["ip", "netns", "exec", ns, *cmd]


def run_in(
    ns: str, *cmd: str, check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` inside namespace ``ns`` to completion; output is captured as text.

    Blocks the calling thread: from trio, use ``trio.run_process(netns_argv(ns, ...))``.
    """
    command = netns_argv(ns, *cmd)
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout)
    if check and result.returncode != 0:
        raise NetnsError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def ping_argv(ns: str, address: str, *, count: int = 1, wait: float = 1.0) -> list[str]:
    """Ping ``address`` from inside ``ns``: ``ping`` if installed, else this module's own.

    Exit status 0 when an echo reply came back within ``wait`` seconds of its request.
    """
    if shutil.which("ping") is not None:
        return netns_argv(ns, "ping", "-n", "-c", str(count), "-W", str(wait), address)
    return netns_argv(
        ns, sys.executable, "-m", "stacklib.netns", "ping", address, str(count), str(wait)
    )


def veth_pair(
    ns_a: str | None,
    ns_b: str | None,
    addr_a: str | None = None,
    addr_b: str | None = None,
    *,
    name_a: str = "veth0",
    name_b: str = "veth1",
) -> tuple[str, str]:
    """Connect two namespaces (None: this process's) with a veth pair, addressed and up.

    The ends are created directly in their namespaces, so their names need only be free
    there.  Returns the two interface names.
    """
    where_a = ("netns", ns_a) if ns_a is not None else ()
    where_b = ("netns", ns_b) if ns_b is not None else ()
    _ip("link", "add", name_a, *where_a, "type", "veth", "peer", "name", name_b, *where_b)
    for ns, name, address in ((ns_a, name_a, addr_a), (ns_b, name_b, addr_b)):
        inside = ("-n", ns) if ns is not None else ()
        if address is not None:
            _ip(*inside, "address", "add", address, "dev", name)
        _ip(*inside, "link", "set", "dev", name, "up")
    return name_a, name_b


#: The interface every rank of :func:`bridged_namespaces` has in its namespace.
RANK_INTERFACE = "sl0"


def bridged_namespaces(
    stack: ExitStack, n: int, name_prefix: str = "slrank"
) -> tuple[list[str], list[str]]:
    """``n`` namespaces, each with one veth (:data:`RANK_INTERFACE`, addressed, up) whose
    other end is on a bridge in a hub namespace: one Ethernet segment, like a switch between
    hosts.  Returns the namespaces and their IPv4 addresses (in a /24 per calling process,
    so two runs at once do not meet); ``stack`` deletes everything when it closes."""
    if not 1 <= n <= 250:
        raise ValueError(f"bridged_namespaces takes 1..250 namespaces, not {n}")
    hub = stack.enter_context(netns(name_prefix))
    spaces = [stack.enter_context(netns(name_prefix)) for _ in range(n)]
    # The bridge and the hub ends of the veths go when the hub namespace is deleted.
    run_in(hub, "ip", "link", "add", "slbr", "type", "bridge")
    run_in(hub, "ip", "link", "set", "slbr", "up")
    subnet = f"10.97.{os.getpid() % 250}"
    addresses = [f"{subnet}.{rank + 1}" for rank in range(n)]
    for rank, space in enumerate(spaces):
        _, port = veth_pair(
            space, hub, f"{addresses[rank]}/24", None, name_a=RANK_INTERFACE, name_b=f"sl{rank}"
        )
        run_in(hub, "ip", "link", "set", port, "master", "slbr")
    return spaces, addresses


# ---------------------------------------------------------------------- a minimal ping


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ping(address: str, count: int, wait: float) -> int:
    ident = os.getpid() & 0xFFFF
    answered = 0
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        for seq in range(1, count + 1):
            body = struct.pack("!HH", ident, seq) + b"stacklib"
            echo = struct.pack("!BBH", 8, 0, _checksum(b"\x08\0\0\0" + body)) + body
            try:
                sock.sendto(echo, (address, 0))
            except OSError as exc:  # no route, interface down: what ping reports as exit 2
                print(f"ping: {address}: {exc.strerror}", file=sys.stderr)
                return 2
            deadline = time.monotonic() + wait
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    packet, (source, _) = sock.recvfrom(65535)
                except TimeoutError:
                    break
                icmp = packet[(packet[0] & 0x0F) * 4 :]
                if source == address and icmp[0] == 0 and icmp[4:8] == body[:4]:
                    answered += 1
                    break
    return 0 if answered else 1


def _main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[0] != "ping":
        print("usage: python -m stacklib.netns ping ADDRESS [COUNT [WAIT]]", file=sys.stderr)
        return 2
    count = int(argv[2]) if len(argv) > 2 else 1
    wait = float(argv[3]) if len(argv) > 3 else 1.0
    return _ping(argv[1], count, wait)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
