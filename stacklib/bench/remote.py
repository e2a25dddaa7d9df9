"""The measurement harness between two processes on a real transport (paper 000 §4).

``stacklib bench pingpong|bandwidth|logp --transport shm|udp|ether|xdp|memory`` runs the same
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
* ``xdp``: the same, over AF_XDP sockets (root); measured busy-polling (``xdp``), sleeping in
  trio's ``await`` (``xdp-trio``), and so with both ranks on one CPU (``xdp-trio-1cpu``).
* ``memory``: both sides in this process (the memory transport cannot cross processes).

``compare=True`` then runs the same workload between the same two processes over kernel sockets
(trio UDP, and TCP with a 4-byte length prefix per message: :mod:`~stacklib.bench.kernel_paths`)
on the same addresses, and adds each row's gain: kernel time over U-Net time for times, U-Net
rate over kernel rate for bandwidths (above 1: U-Net is better).  For xdp it also runs the
kernel at its best, a ping-pong over blocking UDP sockets without trio with the ranks on two
CPUs and on one (``kernel-udp-blocking-2cpu``, ``-1cpu``; ping-pong only: the bandwidth and
LogP harness needs trio's timeouts), and the ether transport once the XDP program has left
(it takes the 0x88B5 frames while attached); every row's gain is then against the best
kernel row at its size (:func:`combine_best`).

The coordinator (this process) relays a line protocol between the ranks' stdin and stdout so
that the phases run one at a time: rank 1 prints ``ready NAME`` once it serves on service
NAME, rank 0 is told ``go`` and prints ``result NAME JSON``, rank 1 is told ``next``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import shutil
import subprocess
import sys
import tempfile
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs
import trio

from stacklib.bench.bandwidth import BandwidthParams, Follower, bandwidth
from stacklib.bench.kernel_paths import (
    KERNEL,
    KernelTcpService,
    KernelUdpService,
    blocking_echo,
    blocking_pingpong,
    blocking_socket,
    kernel_pair,
    kernel_services,
)
from stacklib.bench.logp import LogPParams, logp
from stacklib.bench.pingpong import PingPongParams, echo, pingpong
from stacklib.bench.result import Cell, Column, Result
from stacklib.errors import StacklibError
from stacklib.launch import Rank, bootstrap
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
    "combine_best",
    "phases",
]

#: The old private name of :func:`~stacklib.bench.kernel_paths.kernel_pair`.
_kernel_pair = kernel_pair

TRANSPORTS = ("memory", "shm", "udp", "ether", "xdp")
#: The blocking kernel UDP ping-pong: the ranks on two CPUs, then both on one.
BLOCKING = ("kernel-udp-blocking-2cpu", "kernel-udp-blocking-1cpu")
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
_PHASE_TIMEOUT = 600.0
#: Seconds a blocking kernel socket waits for one datagram before it gives up.
_RECEIVE_TIMEOUT = 5.0


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


def combine_best(transport: str, workload: str, results: Mapping[str, Result]) -> Result:
    """One table: each path's rows, each with its gain over the kernel at its best, the best
    of the ``kernel*`` paths at the same mode and size (itself among them: a kernel row's gain
    is at most 1)."""
    metric, is_time = _METRIC[workload]
    best: dict[tuple[Cell, Cell], tuple[float, str]] = {}
    for path, result in results.items():
        if not path.startswith("kernel"):
            continue
        for row in result.rows:
            value, key = row.get(metric), (row.get("mode"), row.get("size"))
            if not isinstance(value, int | float) or value <= 0:
                continue
            held = best.get(key)
            if held is None or (value < held[0] if is_time else value > held[0]):
                best[key] = (float(value), path)
    rows: list[dict[str, Cell]] = []
    for path, result in results.items():
        for row in result.rows:
            held = best.get((row.get("mode"), row.get("size")))
            gain = _gain(row.get(metric), held[0], is_time) if held is not None else None
            rows.append({"path": path, **row, "gain": gain})
    first = next(iter(results.values()))
    facts: dict[str, Cell] = dict(first.facts)
    facts["transport"] = transport
    facts["kernel_best"] = ", ".join(
        f"{'/'.join(str(part) for part in key if part is not None)}: {path}"
        for key, (_, path) in best.items()
    )
    measure = (
        f"the kernel's best {metric} / the path's"
        if is_time
        else (f"the path's {metric} / the kernel's best")
    )
    return Result(
        title=f"{first.title}: {transport} vs the kernel at its best, same two processes, one run",
        columns=[
            Column("path", "path"),
            *first.columns,
            Column("gain", "gain vs kernel best", "x", 2),
        ],
        rows=rows,
        facts=facts,
        notes=(
            *first.notes,
            f"gain: {measure}, the best of the kernel-* rows at the same size (kernel_best); "
            "above 1: the path beats the kernel at its best",
        ),
    )


def _titled(result: Result, transport: str, where: str) -> Result:
    return attrs.evolve(
        result,
        title=f"{result.title}: {transport}, {where}",
        facts={**result.facts, "transport": transport},
    )


# ==================================================================== in one process (memory)


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
        udp, tcp = await kernel_pair("127.0.0.1")
        paths += [(KERNEL[0], udp[0], udp[1], 0), (KERNEL[1], tcp[0], tcp[1], 0)]
    results = {}
    for name, near, far, peer in paths:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, workload, far, params)
            results[name] = await lead(workload, near, peer, params)
            nursery.cancel_scope.cancel()
    return results


# ==================================================================== two processes


def phases(
    transport: str, workload: str, compare: bool, cpus: Sequence[int | None] = (0, 1)
) -> list[str]:
    """The paths measured, in order: U-Net's (xdp: busy-polling, then ``await`` in trio, on
    two CPUs and, when ``cpus`` are two, on one), then with ``compare`` the kernel's (for xdp:
    the blocking ping-pong on two CPUs and on one; trio UDP and TCP; and the ether transport,
    last, once the XDP program has left the interfaces).  A ``-1cpu`` path runs both ranks on
    rank 0's CPU."""
    if transport != "xdp":
        return [transport, *(KERNEL if compare else ())]
    names = ["xdp", "xdp-trio"] + (["xdp-trio-1cpu"] if cpus[0] is not None else [])
    if compare:
        if workload == "pingpong":
            names += BLOCKING if cpus[0] is not None else BLOCKING[1:]
        names += [*KERNEL, "ether"]
    return names


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
    module docstring); with ``compare``, also over the kernel's paths, in the same run."""
    if transport not in TRANSPORTS:
        raise ValueError(f"no transport {transport!r} (known: {', '.join(TRANSPORTS)})")
    if workload not in WORKLOADS:
        raise ValueError(f"no workload {workload!r} (known: {', '.join(WORKLOADS)})")
    if netns and transport not in ("udp", "ether", "xdp"):
        raise ValueError(f"--netns applies to udp, ether and xdp, not {transport}")
    if transport == "memory":
        results = trio.run(_in_process, workload, params, compare)
        where = "both sides in this process"
    else:
        if transport == "xdp":
            _check_xdp()
        namespaces = netns or transport in ("ether", "xdp")
        results = _two_processes(workload, params, transport, compare, namespaces, timeout)
        where = "two network namespaces joined by a veth pair" if namespaces else "two processes"
    if compare and transport == "xdp":
        return combine_best(transport, workload, results)
    if compare:
        return combine(transport, workload, results)
    if transport == "xdp":
        return combine_best(transport, workload, results)  # two rows per size, no kernel
    return _titled(results[transport], transport, where)


def _check_xdp() -> None:
    from stacklib.netns import capability_problem
    from stacklib.transports.xdp.bpf import bpf_problem
    from stacklib.transports.xdp.xsk import xdp_problem

    problem = capability_problem() or bpf_problem() or xdp_problem()
    if problem is not None:
        raise RemoteBenchError(f"the xdp transport cannot run here: {problem}")


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
        os.mkdir(os.path.join(rendezvous, "ether"))  # the ether phase's own bootstrap
        hosts = ["127.0.0.1", "127.0.0.1"]
        interfaces: list[str | None] = [None, None]
        where: list[str | None] = [None, None]
        if namespaces:
            where, hosts, interfaces = _namespaces(stack)
        cpus = _cpus()
        paths = phases(transport, workload, compare, cpus)
        config = {
            "workload": workload,
            "params": attrs.asdict(params),
            "transport": transport,
            "phases": paths,
            "cpus": cpus,
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
        raise RemoteBenchError(
            f"two network namespaces are needed (udp --netns, ether, xdp): {problem}"
        )
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


async def _rank_main(
    config: Mapping[str, Any], me: Rank, close_unet: typing.Callable[[], None]
) -> None:
    rank = config["rank"]
    workload = config["workload"]
    params = make_params(workload, config["params"])
    names: list[str] = config["phases"]
    kernel: dict[str, DatagramService] = {}
    if any(name in KERNEL for name in names):
        kernel = dict(await kernel_services(rank, config["host"], config["rendezvous"], 30.0))
    unet = UNetService(me.endpoint)
    peer = me.channels[1 - rank]
    for name in names:
        if name == config["transport"] or name.startswith("xdp"):
            if name.startswith("xdp"):
                _set_spin(me, math.inf if name == "xdp" else 0.0)
            with _cpu_of(config, name):
                await _phase(config, name, params, unet, peer)
            continue
        if config["transport"] == "xdp":
            close_unet()  # the XDP program leaves: the kernel's paths run without it
        if name in KERNEL:
            await _phase(config, name, params, kernel[name], 0)
        elif name in BLOCKING:
            await _blocking_phase(config, name, params)
        elif name == "ether":
            env = _environment(config, "ether", os.path.join(config["rendezvous"], "ether"))
            with bootstrap(env) as ether:
                to = ether.channels[1 - rank]
                await _phase(config, name, params, UNetService(ether.endpoint), to)
        else:  # pragma: no cover (phases() names only the above)
            raise AssertionError(f"no phase {name!r}")


def _set_spin(me: Rank, seconds: float) -> None:
    """How long the xdp endpoint's ``await recv()`` polls before it sleeps: busy-polling
    (paper 000 §3.1) spins without end, trio's ``await`` sleeps at once."""
    from stacklib.transports.xdp import XdpNI

    ni = me.endpoint.ni
    if not isinstance(ni, XdpNI):
        raise TypeError(f"the xdp paths need an xdp node, got {type(ni).__name__}")
    ni.spin_time = seconds


async def _phase(
    config: Mapping[str, Any], name: str, params: Any, service: DatagramService, peer: int
) -> None:
    """One path: rank 1 serves until told ``next``, rank 0 measures when told ``go``."""
    workload = config["workload"]
    if config["rank"] == 1:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow, workload, service, params)
            _say("ready", name)
            await _line()  # "next"
            nursery.cancel_scope.cancel()
    else:
        await _line()  # "go"
        result = await lead(workload, service, peer, params)
        _say("result", name, json.dumps(result.to_dict()))


async def _blocking_phase(config: Mapping[str, Any], name: str, params: Any) -> None:
    """The blocking kernel UDP ping-pong: no trio between the two system calls of a message
    (the calls below block the whole event loop, on purpose).  ``-1cpu``: rank 1 moves to
    rank 0's CPU for the phase."""
    from stacklib.launch import publish, wait_for

    rank, host, rendezvous = config["rank"], config["host"], config["rendezvous"]
    with blocking_socket(host, _RECEIVE_TIMEOUT) as sock:
        if rank == 1:
            publish(rendezvous, rank, f"{host}:{sock.getsockname()[1]}", name)
            with _cpu_of(config, name):
                _say("ready", name)
                blocking_echo(sock)
            await _line()  # "next"
        else:
            await _line()  # "go"
            peer_host, _, port = wait_for(rendezvous, 1, 30.0, name).rpartition(":")
            result = blocking_pingpong(sock, (peer_host, int(port)), params)
            _say("result", name, json.dumps(result.to_dict()))


@contextlib.contextmanager
def _cpu_of(config: Mapping[str, Any], name: str) -> Iterator[None]:
    """For a ``-1cpu`` path, rank 1 runs on rank 0's CPU (this thread: the one that works)."""
    cpus = config["cpus"]
    if not (name.endswith("-1cpu") and config["rank"] == 1 and cpus[0] is not None):
        yield
        return
    os.sched_setaffinity(0, {cpus[0]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, {cpus[1]})


def _environment(config: Mapping[str, Any], transport: str, rendezvous: str) -> dict[str, str]:
    return {
        "STACKLIB_RANK": str(config["rank"]),
        "STACKLIB_SIZE": "2",
        "STACKLIB_RENDEZVOUS": rendezvous,
        "STACKLIB_TRANSPORT": transport,
        "STACKLIB_HOST": config["host"] or "127.0.0.1",
        "STACKLIB_INTERFACE": config["interface"] or "",
    }


def rank_main(config: Mapping[str, Any]) -> int:
    """One rank (``python -m stacklib.bench.remote CONFIG``): bootstrap, then the phases."""
    try:
        if config.get("cpu") is not None:
            os.sched_setaffinity(0, {config["cpu"]})
        env = _environment(config, config["transport"], config["rendezvous"])
        with contextlib.ExitStack() as stack:
            me = stack.enter_context(bootstrap(env))
            trio.run(_rank_main, config, me, stack.close)
    except Exception as error:  # reported to the coordinator, which raises it
        leaf: BaseException = error
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # trio wraps a task's error in a group
        _say("error", f"rank {config.get('rank')}: {type(leaf).__name__}: {leaf}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(json.loads(sys.argv[1])))
