"""Start N ranks of a program and connect them: ``stacklib spawn -n N PROGRAM [ARGS]``.

A *rank* is one process of a parallel program (MPI's word).  :func:`spawn` starts N ranks of a
Python file or module on this host, each with its bootstrap in environment variables:

=====================  ==================================================================
``STACKLIB_RANK``      this process's rank, 0..N-1
``STACKLIB_SIZE``      N
``STACKLIB_RENDEZVOUS``  where the ranks find each other: a directory (shm: the shared-memory
                       directory of the :class:`~stacklib.transports.shm.ShmNetwork`; udp:
                       each rank writes its address there), or for udp ``static:H:P,H:P,...``
                       (rank r binds the r-th address)
``STACKLIB_TRANSPORT``  ``shm`` (one host), ``udp`` (across hosts), ``ether`` (hosts on one
                       Ethernet segment; needs CAP_NET_RAW) or ``xdp`` (the same frames over
                       AF_XDP; root, or a socket from the daemon)
``STACKLIB_HOST``      udp with a directory: the IPv4 address this rank binds (default
                       127.0.0.1)
``STACKLIB_INTERFACE``  ether, xdp: the network interface this rank's endpoint uses
``STACKLIB_XDP_DAEMON``  xdp: the socket path of the daemon (root) that hands this rank its
                       AF_XDP socket (``default``: its default path); unset, the rank sets
                       up alone and must be root
=====================  ==================================================================

It waits for all of them; when one fails it kills the others, names the failed rank and
exits with its status.  A rank calls :func:`bootstrap` to learn its rank and size and get an
endpoint with a channel to every other rank.  Across hosts, existing launchers start the ranks
(ssh, ``mpirun``, ``srun``) and :func:`bootstrap` reads their variables instead
(:data:`LAUNCHER_VARIABLES`); docs/launching.md shows both ways.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

import attrs

from stacklib.errors import StacklibError
from stacklib.unet.endpoint import Endpoint, EndpointConfig
from stacklib.unet.node import Node
from stacklib.unet.polled import yield_when_idle

if TYPE_CHECKING:
    from stacklib.transports.xdp import XdpNetwork

__all__ = [
    "LAUNCHER_VARIABLES",
    "OVERSUBSCRIBED_SPIN",
    "LaunchError",
    "Rank",
    "bootstrap",
    "join_ether",
    "program_argv",
    "publish",
    "rank_from_environment",
    "shm_spin_time",
    "shm_wait_policy",
    "spawn",
    "usable_cpus",
    "wait_for",
]

#: The port every rank's endpoint has (one endpoint per rank).
PORT = 1

#: (rank variable, size variable, launcher), in the order :func:`rank_from_environment` tries.
LAUNCHER_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("STACKLIB_RANK", "STACKLIB_SIZE", "stacklib spawn"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI mpirun"),
    ("PMI_RANK", "PMI_SIZE", "MPICH / Intel MPI (Hydra) mpiexec"),
    ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMIx (Open MPI 5 prterun)"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MVAPICH2 mpirun_rsh"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm srun"),
)


class LaunchError(StacklibError):
    """The bootstrap variables are missing or inconsistent, or the ranks could not meet."""


def rank_from_environment(env: Mapping[str, str] | None = None) -> tuple[int, int, str]:
    """(rank, size, launcher) from the first launcher whose two variables are both set."""
    env = os.environ if env is None else env
    for rank_var, size_var, launcher in LAUNCHER_VARIABLES:
        if rank_var in env and size_var in env:
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
            except ValueError:
                raise LaunchError(
                    f"{rank_var}={env[rank_var]!r} / {size_var}={env[size_var]!r}: not integers"
                ) from None
            if not 0 <= rank < size:
                raise LaunchError(f"{rank_var}={rank} is outside 0..{size_var}-1={size - 1}")
            return rank, size, launcher
    names = ", ".join(f"{r}+{s}" for r, s, _ in LAUNCHER_VARIABLES)
    raise LaunchError(f"no rank in the environment (looked for {names}); use stacklib spawn")


# ==================================================================== inside a rank


@attrs.define
class Rank:
    """What :func:`bootstrap` gives a rank: who it is and a channel to every other rank."""

    rank: int
    size: int
    transport: str
    network: object
    node: Node
    endpoint: Endpoint
    #: Channel id on :attr:`endpoint` for each other rank.
    channels: dict[int, int]

    def rank_of(self, channel: int) -> int:
        """The rank at the other end of ``channel``."""
        for rank, channel_id in self.channels.items():
            if channel_id == channel:
                return rank
        raise KeyError(channel)

    def close(self) -> None:
        """Close the endpoint and this rank's node (the rendezvous belongs to the launcher)."""
        close = getattr(self.network, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Rank:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def bootstrap(
    env: Mapping[str, str] | None = None,
    *,
    timeout: float = 30.0,
    config: EndpointConfig | None = None,
) -> Rank:
    """Read rank and size from the environment and connect to every other rank.

    shm: a :class:`~stacklib.transports.shm.ShmNetwork` on the rendezvous directory, node
    ``rankR``, endpoint port 1, one channel to each ``rankS:1`` (a channel may be opened before
    its peer exists).  udp: a :class:`~stacklib.transports.udp.UdpNetwork` node whose address
    is published in the rendezvous directory (or fixed by a ``static:`` list); returns once
    every rank has published, so every rank's socket is bound.  ``config`` sizes the endpoint
    (default: :class:`~stacklib.unet.EndpointConfig`'s defaults).
    """
    env = os.environ if env is None else env
    rank, size, launcher = rank_from_environment(env)
    rendezvous = env.get("STACKLIB_RENDEZVOUS")
    if not rendezvous:
        raise LaunchError(f"{launcher} started this rank without STACKLIB_RENDEZVOUS")
    default = "shm" if launcher == "stacklib spawn" else "udp"
    transport = env.get("STACKLIB_TRANSPORT", default)
    if transport == "shm":
        spin, yielding = shm_wait_policy(size, env)
        if yielding:
            yield_when_idle(True)
        return _bootstrap_shm(rank, size, rendezvous, config, spin)
    if transport == "udp":
        return _bootstrap_udp(rank, size, rendezvous, env.get("STACKLIB_HOST"), timeout, config)
    if transport in ("ether", "xdp"):
        interface = env.get("STACKLIB_INTERFACE")
        if not interface:
            raise LaunchError(f"STACKLIB_TRANSPORT={transport} needs STACKLIB_INTERFACE")
        daemon = env.get("STACKLIB_XDP_DAEMON") if transport == "xdp" else None
        return _bootstrap_ether(
            rank, size, rendezvous, interface, timeout, config, transport, daemon
        )
    raise LaunchError(f"STACKLIB_TRANSPORT={transport!r}: bootstrap knows shm, udp, ether and xdp")


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: How long a shm rank spins before it sleeps when the ranks outnumber its CPUs; it gives the
#: CPU away after every empty poll meanwhile (:func:`~stacklib.unet.polled.yield_when_idle`).
OVERSUBSCRIBED_SPIN: Final = 2e-3


def shm_wait_policy(size: int, env: Mapping[str, str] | None = None) -> tuple[float, bool]:
    """How a rank's blocking calls over shm wait, with ``size`` ranks on this host: (seconds
    they spin before sleeping, whether each empty poll gives the CPU away).

    While every rank can have a CPU of its own: shm's default spin, the CPU given away after
    64 empty polls in a row.  Once the ranks outnumber the CPUs: :data:`OVERSUBSCRIBED_SPIN`,
    the CPU given away after every empty poll, so the rank waited for runs at once and the waiting
    rank answers without a wake-up (an MPI library's policy on an oversubscribed node;
    docs/launching.md has the measurements).  ``STACKLIB_SPIN_US`` (microseconds, 0: no spin)
    and ``STACKLIB_YIELD_WHEN_IDLE`` (0 or 1) override either.
    """
    from stacklib.transports.shm import SPIN_TIME

    env = os.environ if env is None else env
    oversubscribed = size > usable_cpus()
    spin = OVERSUBSCRIBED_SPIN if oversubscribed else SPIN_TIME
    text = env.get("STACKLIB_SPIN_US")
    if text:
        try:
            spin_us = float(text)
        except ValueError:
            spin_us = -1.0
        if not spin_us >= 0:
            raise LaunchError(f"STACKLIB_SPIN_US={text!r}: microseconds >= 0 expected")
        spin = spin_us * 1e-6
    yielding = oversubscribed
    text = env.get("STACKLIB_YIELD_WHEN_IDLE")
    if text:
        if text not in ("0", "1"):
            raise LaunchError(f"STACKLIB_YIELD_WHEN_IDLE={text!r}: 0 or 1 expected")
        yielding = text == "1"
    return spin, yielding


def shm_spin_time(size: int, env: Mapping[str, str] | None = None) -> float:
    """The spin of :func:`shm_wait_policy`."""
    return shm_wait_policy(size, env)[0]


def _bootstrap_shm(
    rank: int, size: int, directory: str, config: EndpointConfig | None, spin_time: float
) -> Rank:
    from stacklib.transports.shm import ShmAddress, ShmNetwork

    if not os.path.isdir(directory):
        raise LaunchError(f"STACKLIB_RENDEZVOUS={directory!r} is not a directory")
    network = ShmNetwork(directory=directory, spin_time=spin_time)
    try:
        node = network.add_node(f"rank{rank}")
        endpoint = node.os.create_endpoint(node.os.process(f"rank{rank}"), config, port=PORT)
        channels = {
            other: node.os.create_channel(
                endpoint.owner, endpoint, ShmAddress(f"rank{other}", PORT)
            )
            for other in range(size)
            if other != rank
        }
    except BaseException:
        network.close()
        raise
    return Rank(rank, size, "shm", network, node, endpoint, channels)


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _static_addresses(spec: str, size: int) -> list[tuple[str, int]]:
    addresses = []
    for item in spec.removeprefix("static:").split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise LaunchError(f"STACKLIB_RENDEZVOUS: {item!r} is not HOST:PORT")
        addresses.append((host, int(port)))
    if len(addresses) != size:
        raise LaunchError(f"STACKLIB_RENDEZVOUS lists {len(addresses)} addresses for {size} ranks")
    return addresses


def _bootstrap_udp(
    rank: int,
    size: int,
    rendezvous: str,
    host: str | None,
    timeout: float,
    config: EndpointConfig | None = None,
) -> Rank:
    from stacklib.transports.udp import UdpAddress, UdpNetwork

    static = rendezvous.startswith("static:")
    addresses = _static_addresses(rendezvous, size) if static else None
    if addresses is not None:
        host, udp_port = addresses[rank][0], addresses[rank][1]
    else:
        if not os.path.isdir(rendezvous):
            raise LaunchError(f"STACKLIB_RENDEZVOUS={rendezvous!r} is not a directory")
        host, udp_port = host or "127.0.0.1", 0
    network = UdpNetwork(host=host)
    try:
        node = network.add_node(f"rank{rank}", udp_port=udp_port)
        endpoint = node.os.create_endpoint(node.os.process(f"rank{rank}"), config, port=PORT)
        if addresses is None:
            address = endpoint.address
            assert isinstance(address, UdpAddress)
            publish(rendezvous, rank, f"{address.host}:{address.udp_port}")
            addresses = [_host_port(wait_for(rendezvous, other, timeout)) for other in range(size)]
        channels = {
            other: node.os.create_channel(
                endpoint.owner, endpoint, UdpAddress(addresses[other][0], addresses[other][1], PORT)
            )
            for other in range(size)
            if other != rank
        }
    except BaseException:
        network.close()
        raise
    return Rank(rank, size, "udp", network, node, endpoint, channels)


def _bootstrap_ether(
    rank: int,
    size: int,
    rendezvous: str,
    interface: str,
    timeout: float,
    config: EndpointConfig | None = None,
    transport: str = "ether",
    daemon: str | None = None,
) -> Rank:
    """One node per interface (the rule of ether and xdp, which share their frames and
    addresses): each rank names its own interface and publishes its MAC address and port in
    the rendezvous directory.  xdp with ``daemon`` (a socket path): the daemon hands this
    rank its socket (:func:`~stacklib.transports.xdp.service.add_daemon_node`)."""
    from stacklib.transports.ether import EtherNetwork

    if not os.path.isdir(rendezvous):
        raise LaunchError(f"STACKLIB_RENDEZVOUS={rendezvous!r} is not a directory")
    network: EtherNetwork | XdpNetwork
    if transport == "xdp":
        from stacklib.transports.xdp import XdpNetwork

        network = XdpNetwork(interface)
    else:
        network = EtherNetwork(interface)
    try:
        if daemon:
            from stacklib.transports.xdp.service import add_daemon_node

            assert isinstance(network, XdpNetwork)
            node = add_daemon_node(network, f"rank{rank}", socket_path=daemon)
        else:
            node = network.add_node(f"rank{rank}")
    except BaseException:
        network.close()
        raise
    return join_ether(network, node, rank, size, rendezvous, timeout, config, transport)


def join_ether(
    network: object,
    node: Node,
    rank: int,
    size: int,
    rendezvous: str,
    timeout: float = 30.0,
    config: EndpointConfig | None = None,
    transport: str = "ether",
) -> Rank:
    """Connect ``node`` (this rank's node of an ether or xdp ``network``, built by the caller
    with parameters of its choosing) to every other rank: an endpoint on port 1 whose MAC
    address and port are published in the ``rendezvous`` directory, and a channel to each
    other rank's.  Closes ``network`` if that fails."""
    from stacklib.transports.ether import EtherAddress

    try:
        if not os.path.isdir(rendezvous):
            raise LaunchError(f"STACKLIB_RENDEZVOUS={rendezvous!r} is not a directory")
        endpoint = node.os.create_endpoint(node.os.process(f"rank{rank}"), config, port=PORT)
        address = endpoint.address
        assert isinstance(address, EtherAddress)
        publish(rendezvous, rank, f"{address.mac}/{address.port}")
        channels = {}
        for other in range(size):
            if other != rank:
                mac, _, port = wait_for(rendezvous, other, timeout).partition("/")
                channels[other] = node.os.create_channel(
                    endpoint.owner, endpoint, EtherAddress(mac, int(port))
                )
    except BaseException:
        close = getattr(network, "close", None)
        if close is not None:
            close()
        raise
    return Rank(rank, size, transport, network, node, endpoint, channels)


def publish(directory: str, rank: int, text: str, kind: str = "addr") -> None:
    """Publish ``text`` (an address) for ``rank`` in the rendezvous ``directory``."""
    # Write then rename: a reader sees the whole address or nothing (also on NFS).
    path = os.path.join(directory, f"rank{rank}.{kind}")
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)


def wait_for(directory: str, rank: int, timeout: float, kind: str = "addr") -> str:
    """What ``rank`` published with :func:`publish`, waiting up to ``timeout`` seconds."""
    path = os.path.join(directory, f"rank{rank}.{kind}")
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            with open(path) as handle:
                return handle.read()
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"rank {rank} did not publish its address in {timeout} s"
                ) from None
            time.sleep(delay)  # set-up only, never on the data path
            delay = min(delay * 2, 0.05)


# ==================================================================== the launcher


def program_argv(program: str, args: Sequence[str] = ()) -> list[str]:
    """The command that runs ``program``: a Python file if it is one, else a module name."""
    if program.endswith(".py") or os.path.isfile(program):
        return [sys.executable, program, *args]
    return [sys.executable, "-m", program, *args]


def _status(returncode: int) -> int:
    """A shell-style exit status: 128 + N for a rank killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


#: The transports :func:`spawn` starts ranks on; ether and xdp only with ``netns``.
SPAWN_TRANSPORTS = ("shm", "udp", "ether", "xdp")

#: Prefix of the namespaces ``spawn(netns=True)`` makes (stacklib.netns.remove_stale cleans
#: up after a killed launcher).
NETNS_PREFIX = "slspawn"


def spawn(
    n: int,
    program: str,
    args: Sequence[str] = (),
    *,
    transport: str = "shm",
    rendezvous: str | None = None,
    grace: float = 2.0,
    netns: bool = False,
    pure: bool = False,
) -> int:
    """Run ``n`` ranks of ``program`` to completion; the exit status of the first to fail, or 0.

    The ranks run the compiled hot path (``stacklib compile``) where a copy of these sources
    exists, as ``stacklib splitc run``'s do, unless ``pure`` or this process's environment
    already says (``STACKLIB_COMPILED``, which is then passed on as it is).

    When a rank fails the others get SIGTERM, then SIGKILL after ``grace`` seconds.  The
    rendezvous directory (made under /dev/shm unless given) is removed at the end.

    ``netns``: each rank runs in a network namespace of its own with one interface, the
    namespaces joined by a bridge (:func:`stacklib.netns.bridged_namespaces`; root), as
    ``n`` hosts on one Ethernet segment; udp ranks bind their interface's IPv4 address,
    ether and xdp ranks use the interface (``STACKLIB_INTERFACE``).  One node per interface
    makes that the only way to run ether or xdp ranks on one host.  Everything is deleted
    afterwards.
    """
    if n < 1:
        raise LaunchError(f"-n must be at least 1, got {n}")
    if transport not in SPAWN_TRANSPORTS:
        raise LaunchError(f"transport {transport!r}: spawn knows {', '.join(SPAWN_TRANSPORTS)}")
    if transport in ("ether", "xdp") and not netns:
        raise LaunchError(
            f"transport {transport}: one node per interface, so on one host the ranks need a "
            "namespace each (--netns); across hosts start them with your launcher "
            "(docs/launching.md)"
        )
    if netns and transport == "shm":
        raise LaunchError("--netns applies to udp, ether and xdp, not shm")
    with contextlib.ExitStack() as stack:
        places = _rank_places(stack, n) if netns else None
        return _spawn(n, program, args, transport, rendezvous, grace, places, pure)
    raise AssertionError("unreachable")  # pragma: no cover - mypy: ExitStack may swallow


def _compiled_environment(pure: bool) -> dict[str, str]:
    """This process's environment for the ranks, with the compiled copy where one matches the
    sources (see :func:`spawn`); says so on stderr when it is used."""
    from stacklib import compiled

    env = dict(os.environ)
    if pure:
        env[compiled.ENVIRONMENT] = "0"
    elif compiled.ENVIRONMENT not in env:
        extra = compiled.worker_environment()
        if extra:
            env.update(extra)
            where = extra[compiled.ENVIRONMENT]
            print(f"stacklib spawn: ranks run the compiled hot path in {where}", file=sys.stderr)
    return env


def _rank_places(stack: contextlib.ExitStack, n: int) -> list[tuple[str, str]]:
    """(namespace, IPv4 address) of each rank, joined by a bridge."""
    from stacklib.netns import NetnsError, bridged_namespaces, capability_problem

    problem = capability_problem()
    if problem is not None:
        raise LaunchError(f"--netns needs network namespaces: {problem}")
    try:
        spaces, addresses = bridged_namespaces(stack, n, NETNS_PREFIX)
    except (NetnsError, ValueError) as error:
        raise LaunchError(str(error)) from None
    return list(zip(spaces, addresses, strict=True))


def _spawn(
    n: int,
    program: str,
    args: Sequence[str],
    transport: str,
    rendezvous: str | None,
    grace: float,
    places: list[tuple[str, str]] | None,
    pure: bool = False,
) -> int:
    owns = rendezvous is None
    base_env = _compiled_environment(pure)
    if rendezvous is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        rendezvous = tempfile.mkdtemp(prefix="stacklib-spawn-", dir=base)
    command = program_argv(program, args)
    ranks: dict[int, subprocess.Popen[bytes]] = {}
    pidfds: dict[int, int] = {}
    try:
        for rank in range(n):
            env = dict(base_env)
            env.update(
                STACKLIB_RANK=str(rank),
                STACKLIB_SIZE=str(n),
                STACKLIB_RENDEZVOUS=rendezvous,
                STACKLIB_TRANSPORT=transport,
            )
            argv = command
            if places is not None:
                from stacklib.netns import RANK_INTERFACE, netns_argv

                space, address = places[rank]
                env.update(STACKLIB_HOST=address, STACKLIB_INTERFACE=RANK_INTERFACE)
                argv = netns_argv(space, *command)
            ranks[rank] = subprocess.Popen(argv, env=env)
            pidfds[os.pidfd_open(ranks[rank].pid)] = rank
        # A pidfd turns readable when its process exits: wait on all without polling.
        while pidfds:
            readable, _, _ = select.select(list(pidfds), [], [])
            for fd in readable:
                rank = pidfds.pop(fd)
                os.close(fd)
                status = _status(ranks[rank].wait())
                if status != 0:
                    print(
                        f"stacklib spawn: rank {rank} of {n} exited with status {status}; "
                        "stopping the others",
                        file=sys.stderr,
                        flush=True,
                    )
                    return status
        return 0
    finally:
        for fd in pidfds:
            os.close(fd)
        _stop(list(ranks.values()), grace)
        if owns:
            shutil.rmtree(rendezvous, ignore_errors=True)


def _stop(processes: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    running = [p for p in processes if p.poll() is None]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def cmd_spawn(
    n: int,
    program: str,
    args: Sequence[str],
    transport: str = "shm",
    netns: bool = False,
    pure: bool = False,
) -> int:
    """What ``stacklib spawn`` runs (the CLI wires its arguments here).

    SIGTERM to the launcher becomes an exit through :func:`spawn`'s clean-up, so killing the
    launcher (as a batch system does) takes its ranks with it.
    """

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return spawn(n, program, args, transport=transport, netns=netns, pure=pure)
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stacklib.launch -n N PROGRAM [ARGS...]`` (same as ``stacklib spawn``)."""
    parser = argparse.ArgumentParser(prog="stacklib spawn", description=__doc__.splitlines()[0])
    add_arguments(parser)
    parsed = parser.parse_args(argv)
    try:
        return cmd_spawn(
            parsed.n, parsed.program, parsed.args, parsed.transport, parsed.netns, parsed.pure
        )
    except LaunchError as error:
        print(f"stacklib spawn: {error}", file=sys.stderr)
        return 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add spawn's arguments to an argparse parser (``stacklib spawn`` and ``-m``)."""
    parser.add_argument("-n", type=int, required=True, metavar="N", help="number of ranks")
    parser.add_argument(
        "--transport", choices=SPAWN_TRANSPORTS, default="shm", help="how ranks connect (shm)"
    )
    parser.add_argument(
        "--netns",
        action="store_true",
        help="each rank in a network namespace of its own, the namespaces bridged (root; "
        "needed for ether and xdp)",
    )
    parser.add_argument(
        "--pure",
        action="store_true",
        help="the ranks run the pure Python modules even where a compiled copy exists",
    )
    parser.add_argument("program", metavar="PROGRAM", help="a Python file or module name")
    parser.add_argument("args", metavar="ARGS", nargs=argparse.REMAINDER, help="its arguments")


if __name__ == "__main__":
    sys.exit(main())
