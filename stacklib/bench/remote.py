"""The measurement harness between two processes on a real transport (paper 000 §4).

``stacklib bench pingpong|bandwidth|logp --transport shm|udp|ether|memory`` runs the same
workload code as a recipe run (:func:`~stacklib.bench.pingpong.pingpong`,
:func:`~stacklib.bench.bandwidth.bandwidth`, :func:`~stacklib.bench.logp.logp`), but with its
two sides in two processes: rank 0 measures (the workload's client side, with the other side
replaced by :class:`Elsewhere`), rank 1 serves (the echo or the bandwidth
:class:`~stacklib.bench.bandwidth.Follower`).  Each rank connects with
:func:`stacklib.launch.bootstrap`, exactly as a program started by ``stacklib spawn`` does, and
is pinned to its own CPU when there are two (the U-Net case: two applications, two processors).

* ``shm``: two processes on this host.
* ``udp``: two processes over loopback; with ``netns=True`` two network namespaces joined by a
  veth pair (root needed).
* ``ether``: two namespaces joined by a veth pair, U-Net/FE frames over AF_PACKET (root).
* ``memory``: both sides in this process (the memory transport cannot cross processes).

``compare=True`` then runs the same workload between the same two processes over kernel sockets
(trio UDP, and TCP with a 4-byte length prefix per message, :class:`KernelUdpService`,
:class:`KernelTcpService`) on the same addresses, and adds each row's gain: kernel time over
U-Net time for times, U-Net rate over kernel rate for bandwidths (above 1: U-Net is better).

The coordinator (this process) relays a line protocol between the ranks' stdin and stdout so
that the phases run one at a time: rank 1 prints ``ready NAME`` once it serves on service
NAME, rank 0 is told ``go`` and prints ``result NAME JSON``, rank 1 is told ``next``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from stacklib.bench.bandwidth import BandwidthParams, Follower, bandwidth
from stacklib.bench.logp import LogPParams, logp
from stacklib.bench.pingpong import PingPongParams, echo, pingpong
from stacklib.bench.result import Cell, Column, Result
from stacklib.errors import StacklibError
from stacklib.services import DatagramService, UNetService
from stacklib.sim.world import RealWorld

__all__ = [
    "KERNEL",
    "TRANSPORTS",
    "Elsewhere",
    "KernelTcpService",
    "KernelUdpService",
    "RemoteBenchError",
    "bench_transport",
    "combine",
]

TRANSPORTS = ("memory", "shm", "udp", "ether")
KERNEL = ("kernel-udp", "kernel-tcp")
WORKLOADS: dict[str, type[Any]] = {
    "pingpong": PingPongParams,
    "bandwidth": BandwidthParams,
    "logp": LogPParams,
}
#: The column each workload's gain is computed on, and whether it is a time (lower is better).
#: Ping-pong uses the median round trip: on a shared machine the mean follows the stalls.
_METRIC = {
    "pingpong": ("median_us", True),
    "bandwidth": ("mb_s", False),
    "logp": ("rtt_half_us", True),
}
#: Kernel datagrams: the largest UDP payload over IPv4.
_UDP_MAX = 65507
_LENGTH = struct.Struct(">I")
_PHASE_TIMEOUT = 600.0


class RemoteBenchError(StacklibError):
    """A rank failed or the set-up it needs (namespaces, privileges) is not available."""


# ==================================================================== services


class Elsewhere(DatagramService):
    """Stands for the side of a workload that runs in the other process: it never receives
    (the workload's server task idles on it) and refuses to send."""

    kind = "elsewhere"

    def __init__(self, near: DatagramService, peer: int) -> None:
        self._near = near
        self._peer = peer

    @property
    def peers(self) -> Sequence[int]:
        return (self._peer,)

    @property
    def max_message(self) -> int:
        return self._near.max_message

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        raise RuntimeError("the other side of this workload runs in another process")

    async def recv(self) -> tuple[int, bytes]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover


class KernelUdpService(DatagramService):
    """Messages as kernel UDP datagrams (trio sockets) to one peer address; peer id 0."""

    kind = "kernel-udp"

    def __init__(self, sock: trio.socket.SocketType, peer: tuple[str, int]) -> None:
        self._sock = sock
        self._peer = peer

    @property
    def peers(self) -> Sequence[int]:
        return (0,)

    @property
    def max_message(self) -> int:
        return _UDP_MAX

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        await self._sock.sendto(data, self._peer)

    async def recv(self) -> tuple[int, bytes]:
        while True:
            data, source = await self._sock.recvfrom(_UDP_MAX)
            if source[:2] == self._peer:
                return 0, data


class KernelTcpService(DatagramService):
    """Messages over one kernel TCP connection, each with a 4-byte length; peer id 0.  TCP is
    reliable, so nothing is ever lost; sends from several tasks are serialised."""

    kind = "kernel-tcp"

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._lock = trio.Lock()
        self._buffer = bytearray()

    @property
    def peers(self) -> Sequence[int]:
        return (0,)

    @property
    def max_message(self) -> int:
        return 1 << 24

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        async with self._lock:
            await self._stream.send_all(_LENGTH.pack(len(data)) + bytes(data))

    async def recv(self) -> tuple[int, bytes]:
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                (length,) = _LENGTH.unpack_from(buffer)
                if len(buffer) >= 4 + length:
                    data = bytes(buffer[4 : 4 + length])
                    del buffer[: 4 + length]
                    return 0, data
            chunk = await self._stream.receive_some(1 << 20)
            if not chunk:
                raise trio.EndOfChannel
            buffer += chunk


# ==================================================================== the two sides


def make_params(workload: str, given: Mapping[str, Any]) -> Any:
    """The workload's parameters: its defaults with ``given`` applied."""
    try:
        kind = WORKLOADS[workload]
    except KeyError:
        raise ValueError(f"no workload {workload!r} (known: {', '.join(WORKLOADS)})") from None
    return attrs.evolve(kind(), **given)


async def lead(workload: str, service: DatagramService, peer: int, params: Any) -> Result:
    """Rank 0: the measuring side of ``workload`` towards ``peer``."""
    other = Elsewhere(service, peer)
    if workload == "pingpong":
        return await pingpong(service, other, peer, params)
    if workload == "bandwidth":
        return await bandwidth(service, other, peer, params)
    return await logp(service, other, peer, params, world=RealWorld(), host=None)


async def follow(workload: str, service: DatagramService, params: Any) -> None:
    """Rank 1: the serving side of ``workload``, until cancelled."""
    if workload == "pingpong":
        await echo(service)
    else:
        await Follower(service, params.timeout).serve()


# ==================================================================== combining results


def combine(transport: str, workload: str, results: Mapping[str, Result]) -> Result:
    """One table: each path's rows, plus its gain over the kernel (or of U-Net over it)."""
    first = results[transport]
    metric, is_time = _METRIC[workload]
    mine = {(row.get("mode"), row.get("size")): row.get(metric) for row in first.rows}
    rows: list[dict[str, Cell]] = []
    for path, result in results.items():
        for row in result.rows:
            out: dict[str, Cell] = {"path": path, **row}
            if path != transport:
                ours = mine.get((row.get("mode"), row.get("size")))
                theirs = row.get(metric)
                out["gain"] = _gain(ours, theirs, is_time)
            rows.append(out)
    gain_note = (
        f"gain: the kernel path's {metric} / {transport}'s"
        if is_time
        else f"gain: {transport}'s {metric} / the kernel path's"
    )
    facts: dict[str, Cell] = dict(first.facts)
    facts["transport"] = transport
    return Result(
        title=f"{first.title}: {transport} vs kernel sockets, same two processes, one run",
        columns=[
            Column("path", "path"),
            *first.columns,
            Column("gain", f"{transport} gain", "x", 2),
        ],
        rows=rows,
        facts=facts,
        notes=(*first.notes, f"{gain_note} (above 1: {transport} is better)"),
    )


def _gain(ours: Cell, theirs: Cell, is_time: bool) -> float | None:
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float):
        return None
    numerator, denominator = (theirs, ours) if is_time else (ours, theirs)
    return numerator / denominator if denominator > 0 else None


def _titled(result: Result, transport: str, where: str) -> Result:
    return attrs.evolve(
        result,
        title=f"{result.title}: {transport}, {where}",
        facts={**result.facts, "transport": transport},
    )


# ==================================================================== in one process (memory)


async def _kernel_pair(host: str) -> tuple[list[DatagramService], list[DatagramService]]:
    """Kernel UDP and TCP services joining two sides in this process: ([udp], [tcp])."""
    socks = []
    for _ in range(2):
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        await sock.bind((host, 0))
        socks.append(sock)
    udp: list[DatagramService] = [
        KernelUdpService(socks[0], socks[1].getsockname()[:2]),
        KernelUdpService(socks[1], socks[0].getsockname()[:2]),
    ]
    listeners = await trio.open_tcp_listeners(0, host=host)
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream(host, port)
    server = await listeners[0].accept()
    for listener in listeners:
        await listener.aclose()
    return udp, [KernelTcpService(client), KernelTcpService(server)]


async def _in_process(workload: str, params: Any, compare: bool) -> dict[str, Result]:
    from stacklib.transports.memory import MemoryNetwork
    from stacklib.unet import connect

    network = MemoryNetwork()
    a, b = network.add_node("rank0"), network.add_node("rank1")
    ep_a = a.os.create_endpoint(a.os.process("rank0"))
    ep_b = b.os.create_endpoint(b.os.process("rank1"))
    ch_a, _ = connect(ep_a, ep_b)
    paths: list[tuple[str, DatagramService, DatagramService, int]] = [
        ("memory", UNetService(ep_a), UNetService(ep_b), ch_a)
    ]
    if compare:
        udp, tcp = await _kernel_pair("127.0.0.1")
        paths += [(KERNEL[0], udp[0], udp[1], 0), (KERNEL[1], tcp[0], tcp[1], 0)]
    results = {}
    for name, near, far, peer in paths:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, workload, far, params)
            results[name] = await lead(workload, near, peer, params)
            nursery.cancel_scope.cancel()
    return results


# ==================================================================== two processes


def bench_transport(
    workload: str,
    params: Any,
    transport: str,
    *,
    compare: bool = False,
    netns: bool = False,
    timeout: float = _PHASE_TIMEOUT,
) -> Result:
    """Run ``workload`` with ``params`` between two processes over ``transport`` (see the
    module docstring); with ``compare``, also over kernel UDP and TCP, in the same run."""
    if transport not in TRANSPORTS:
        raise ValueError(f"no transport {transport!r} (known: {', '.join(TRANSPORTS)})")
    if workload not in WORKLOADS:
        raise ValueError(f"no workload {workload!r} (known: {', '.join(WORKLOADS)})")
    if netns and transport not in ("udp", "ether"):
        raise ValueError(f"--netns applies to udp and ether, not {transport}")
    if transport == "memory":
        results = trio.run(_in_process, workload, params, compare)
        where = "both sides in this process"
    else:
        namespaces = netns or transport == "ether"
        results = _two_processes(workload, params, transport, compare, namespaces, timeout)
        where = "two network namespaces joined by a veth pair" if namespaces else "two processes"
    if compare:
        return combine(transport, workload, results)
    return _titled(results[transport], transport, where)


def _cpus() -> list[int | None]:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return [cpus[0], cpus[1]] if len(cpus) >= 2 else [None, None]


def _two_processes(
    workload: str, params: Any, transport: str, compare: bool, namespaces: bool, timeout: float
) -> dict[str, Result]:
    with contextlib.ExitStack() as stack:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        rendezvous = tempfile.mkdtemp(prefix="stacklib-bench-", dir=base)
        stack.callback(shutil.rmtree, rendezvous, True)
        hosts = ["127.0.0.1", "127.0.0.1"]
        interfaces: list[str | None] = [None, None]
        where: list[str | None] = [None, None]
        if namespaces:
            where, hosts, interfaces = _namespaces(stack)
        cpus = _cpus()
        config = {
            "workload": workload,
            "params": attrs.asdict(params),
            "transport": transport,
            "compare": compare,
            "rendezvous": rendezvous,
        }
        ranks = []
        for rank in (1, 0):
            mine = {**config, "rank": rank, "host": hosts[rank], "interface": interfaces[rank]}
            mine["cpu"] = cpus[rank]
            command = [sys.executable, "-m", "stacklib.bench.remote", json.dumps(mine)]
            if where[rank] is not None:
                from stacklib.netns import netns_argv

                command = netns_argv(typing.cast(str, where[rank]), *command)
            process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            stack.callback(_reap, process)
            ranks.append(process)
        server, client = ranks
        paths = [transport, *(KERNEL if compare else ())]
        results: dict[str, Result] = {}
        for name in paths:
            _expect(server, "ready", name, timeout)
            _tell(client, "go")
            line = _expect(client, "result", name, timeout)
            results[name] = _result(json.loads(line))
            _tell(server, "next")
        return results
    raise AssertionError("unreachable")  # pragma: no cover (mypy: ExitStack may swallow)


def _namespaces(
    stack: contextlib.ExitStack,
) -> tuple[list[str | None], list[str], list[str | None]]:
    from stacklib.netns import capability_problem, netns, veth_pair

    problem = capability_problem()
    if problem is not None:
        raise RemoteBenchError(f"two network namespaces are needed (udp --netns, ether): {problem}")
    spaces = [stack.enter_context(netns("slbench")) for _ in range(2)]
    # A subnet per coordinator process, so two runs at once do not meet.
    subnet = f"10.96.{os.getpid() % 250}"
    ends = veth_pair(
        spaces[0], spaces[1], f"{subnet}.1/24", f"{subnet}.2/24", name_a="ul0", name_b="ul1"
    )
    return list(spaces), [f"{subnet}.1", f"{subnet}.2"], list(ends)


def _tell(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()


def _expect(process: subprocess.Popen[str], word: str, name: str, timeout: float) -> str:
    """The rest of the rank's next line, which must be ``word name ...``."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line:
        status = process.poll()
        raise RemoteBenchError(
            f"the benchmark rank said nothing within {timeout:.0f} s "
            f"({'still running' if status is None else f'exit status {status}'})"
        )
    head, _, rest = line.rstrip("\n").partition(" ")
    if head == "error":
        raise RemoteBenchError(f"a benchmark rank failed: {rest}")
    got, _, rest = rest.partition(" ")
    if head != word or got != name:
        raise RemoteBenchError(f"a benchmark rank said {line.strip()[:200]!r}, not {word} {name}")
    return rest


def _reap(process: subprocess.Popen[str]) -> None:
    for pipe in (process.stdin,):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def _result(data: Mapping[str, Any]) -> Result:
    return Result(
        title=data["title"],
        columns=[Column(**column) for column in data["columns"]],
        rows=data["rows"],
        facts=data["facts"],
        notes=tuple(data["notes"]),
    )


# ==================================================================== inside a rank


def _say(*words: str) -> None:
    print(*words, flush=True)


async def _line() -> str:
    line: str = await trio.to_thread.run_sync(sys.stdin.readline)
    if not line:
        raise RemoteBenchError("the coordinator went away")
    return line.strip()


async def _kernel_services(
    rank: int, host: str, rendezvous: str, timeout: float
) -> list[tuple[str, DatagramService]]:
    """This rank's kernel UDP and TCP services to the other rank (addresses swapped through
    the rendezvous directory, as the bootstrap does)."""
    from stacklib.launch import publish, wait_for

    other = 1 - rank
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind((host, 0))
    publish(rendezvous, rank, f"{host}:{sock.getsockname()[1]}", "kudp")
    listeners = []
    if rank == 1:
        listeners = await trio.open_tcp_listeners(0, host=host)
        publish(rendezvous, rank, f"{host}:{listeners[0].socket.getsockname()[1]}", "ktcp")
    udp_host, _, udp_port = (
        await trio.to_thread.run_sync(wait_for, rendezvous, other, timeout, "kudp")
    ).rpartition(":")
    if rank == 0:
        text = await trio.to_thread.run_sync(wait_for, rendezvous, other, timeout, "ktcp")
        tcp_host, _, tcp_port = text.rpartition(":")
        stream = await trio.open_tcp_stream(tcp_host, int(tcp_port))
    else:
        stream = await listeners[0].accept()
        for listener in listeners:
            await listener.aclose()
    return [
        (KERNEL[0], KernelUdpService(sock, (udp_host, int(udp_port)))),
        (KERNEL[1], KernelTcpService(stream)),
    ]


async def _rank_main(config: Mapping[str, Any], service: DatagramService, peer: int) -> None:
    rank = config["rank"]
    workload = config["workload"]
    params = make_params(workload, config["params"])
    paths: list[tuple[str, DatagramService, int]] = [(config["transport"], service, peer)]
    if config["compare"]:
        kernel = await _kernel_services(rank, config["host"], config["rendezvous"], 30.0)
        paths += [(name, each, 0) for name, each in kernel]
    for name, each, to in paths:
        if rank == 1:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow, workload, each, params)
                _say("ready", name)
                await _line()  # "next"
                nursery.cancel_scope.cancel()
        else:
            await _line()  # "go"
            result = await lead(workload, each, to, params)
            _say("result", name, json.dumps(result.to_dict()))


def rank_main(config: Mapping[str, Any]) -> int:
    """One rank (``python -m stacklib.bench.remote CONFIG``): bootstrap, then the phases."""
    from stacklib.launch import bootstrap

    try:
        if config.get("cpu") is not None:
            os.sched_setaffinity(0, {config["cpu"]})
        env = {
            "STACKLIB_RANK": str(config["rank"]),
            "STACKLIB_SIZE": "2",
            "STACKLIB_RENDEZVOUS": config["rendezvous"],
            "STACKLIB_TRANSPORT": config["transport"],
            "STACKLIB_HOST": config["host"] or "127.0.0.1",
            "STACKLIB_INTERFACE": config["interface"] or "",
        }
        with bootstrap(env) as me:
            peer = me.channels[1 - config["rank"]]
            trio.run(_rank_main, config, UNetService(me.endpoint), peer)
    except Exception as error:  # reported to the coordinator, which raises it
        leaf: BaseException = error
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # trio wraps a task's error in a group
        _say("error", f"rank {config.get('rank')}: {type(leaf).__name__}: {leaf}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(json.loads(sys.argv[1])))
