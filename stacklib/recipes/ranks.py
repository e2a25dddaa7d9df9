"""A recipe on a one-node-per-process transport (ether, xdp) run as one rank per process.

Such a transport has one node per network interface, so a recipe's two (or N) nodes are N
processes on N hosts, or in N network namespaces.  Each process is one *rank*, started by a
launcher with the bootstrap variables of :mod:`stacklib.launch` (``stacklib spawn -n 2
--transport xdp --netns stacklib run RECIPE`` on one host; ssh or ``mpirun`` across hosts,
docs/launching.md).  Rank R:

1. builds node ``rankR`` with the recipe's transport parameters, on ``STACKLIB_INTERFACE``
   when set (the launcher knows the interface, the recipe cannot);
2. opens an endpoint with the recipe's ``[endpoint]`` table and joins the other ranks through
   the rendezvous directory (:func:`stacklib.launch.join_ether`): node R's channel table;
3. builds the recipe's layers for node R (``{node}`` templates, IP peers from the channel
   table, :class:`~stacklib.stack.Placement`) over that endpoint and opens them;
4. waits until every rank has opened its stack (a ``ready`` file per rank in the rendezvous),
   then runs its side of the workload (:data:`ROLES`): rank 0 measures and returns the
   :class:`~stacklib.bench.Result`; the others serve until rank 0 publishes ``done``.  A
   Split-C workload runs the program on every rank and rank 0 returns the table.

The same code runs between two namespaces on one host and between two machines.
"""

from __future__ import annotations

import ipaddress
import os
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from stacklib.bench import Result, Session
from stacklib.bench.result import Cell
from stacklib.errors import ConfigError
from stacklib.launch import (
    LAUNCHER_VARIABLES,
    Rank,
    join_ether,
    publish,
    rank_from_environment,
)
from stacklib.layers.ip.service import IpService, ProtocolEndpoint, UdpService, UdpSocket
from stacklib.recipes import Recipe, workload_nodes
from stacklib.services import DatagramService, Service, StreamService, UNetService
from stacklib.sim import RealWorld
from stacklib.stack import Placement, open_stacks

__all__ = ["ROLES", "RankSession", "not_a_rank", "open_rank", "run_rank", "wants_ranks"]

#: Seconds a rank waits for the others to publish their address, open their stack, or (the
#: servers) for rank 0 to finish once every rank is ready.
TIMEOUT = 60.0
#: How often a waiting rank looks at the rendezvous directory (set-up and tear-down only).
_POLL = 0.01


@attrs.frozen
class RankSession:
    """What a rank's side of a workload runs on."""

    recipe: Recipe
    params: Any
    world: RealWorld
    rank: int
    size: int
    #: The top service of this rank's stack.
    service: Service
    #: Every other rank -> the peer id that reaches it (the channel table).
    peers: Mapping[int, int]
    rendezvous: str

    def address_of(self, node: int) -> str:
        """Node ``node``'s IPv4 address in the recipe (its IP layer's ``address``)."""
        for per_node in self.recipe.node_params:
            if per_node and hasattr(per_node[node], "address"):
                return str(per_node[node].address)
        raise ConfigError(str(self.recipe.path), "layers", "the stack has no IP layer")


async def _wait_file(directory: str, rank: int, kind: str, timeout: float) -> None:
    path = os.path.join(directory, f"rank{rank}.{kind}")
    with trio.fail_after(timeout):
        while not os.path.exists(path):
            await trio.sleep(_POLL)


async def _serve_until_done(session: RankSession, serve: Callable[[], Awaitable[None]]) -> None:
    """Run ``serve`` until rank 0 says it is done (its ``done`` file in the rendezvous)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        # Rank 0 may run for long (a big workload): no timeout here, its launcher has one.
        await _wait_file(session.rendezvous, 0, "done", float("inf"))
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------- the roles


async def _pingpong(session: RankSession) -> Result | None:
    from stacklib.bench.pingpong import echo, pingpong
    from stacklib.bench.remote import Elsewhere

    service = typing.cast(DatagramService, session.service)
    if session.rank != 0:
        await _serve_until_done(session, lambda: echo(service))
        return None
    peer = session.peers[1]
    return await pingpong(service, Elsewhere(service, peer), peer, session.params)


class _FarIp(IpService):
    """The IP of a node in another process: only its address is known here."""

    kind = "far-ip"

    def __init__(self, address: str) -> None:
        self._far = address

    @property
    def address(self) -> str:
        return self._far

    def mtu(self, peer: str) -> int:
        raise RuntimeError("a node in another process")

    async def send(
        self,
        dst: str,
        protocol: int,
        payload: bytes | bytearray | memoryview,
        *,
        ttl: int | None = None,
        dont_fragment: bool = False,
    ) -> None:
        raise RuntimeError("a node in another process")

    def open_protocol(self, protocol: int) -> ProtocolEndpoint:
        raise RuntimeError("a node in another process")


class _IdleSocket(UdpSocket):
    @property
    def local_address(self) -> tuple[str, int]:
        return ("0.0.0.0", 0)

    async def sendto(self, data: bytes | bytearray | memoryview, address: tuple[str, int]) -> None:
        raise RuntimeError("a socket in another process")

    async def recvfrom(self) -> tuple[bytes, tuple[str, int]]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    def close(self) -> None:
        pass


class _FarUdp:
    """Stands for the UDP of the echoing node, which runs in another process: the workload's
    echo task idles on its socket."""

    def __init__(self, address: str) -> None:
        self.ip = _FarIp(address)

    async def bind(self, port: int = 0, **options: object) -> UdpSocket:
        return _IdleSocket()


async def _udp_pingpong(session: RankSession) -> Result | None:
    from stacklib.bench.streams import run_udp_pingpong

    udp = typing.cast(UdpService, session.service)
    if session.rank != 0:

        async def echo() -> None:
            async with await udp.bind(session.params.port) as sock:
                while True:
                    data, source = await sock.recvfrom()
                    await sock.sendto(data, source)

        await _serve_until_done(session, echo)
        return None
    far = typing.cast(Service, _FarUdp(session.address_of(1)))
    both = Session(session.world, None, [udp, far], [dict(session.peers), {}])
    return await run_udp_pingpong(both, session.params)


async def _tcp_stream(session: RankSession) -> Result | None:
    """The ``tcp-stream`` workload's two sides (:func:`~stacklib.bench.streams.run_tcp_stream`
    runs both in one process): rank 0 sends, rank 1 receives and answers the requests."""
    from stacklib.bench.streams import (
        TO_ANSWER,
        drive_tcp_stream,
        serve_tcp_stream,
        tcp_stream_result,
    )

    tcp = typing.cast(StreamService, session.service)
    params = session.params
    if session.rank != 0:

        async def serve() -> None:
            await serve_tcp_stream(tcp, params)

        await _serve_until_done(session, serve)
        return None
    address = session.address_of(1)
    wall_start = time.perf_counter()
    peer = int(ipaddress.IPv4Address(address))
    elapsed, samples, segments = await drive_tcp_stream(tcp, peer, params)
    facts: dict[str, Cell] = {
        "server": address,
        "segments_sent_by_node0": segments,
        "wall_seconds": time.perf_counter() - wall_start,
    }
    return tcp_stream_result(params, elapsed, samples, facts, TO_ANSWER)


async def _splitc(session: RankSession) -> Result | None:
    """Every rank runs the program on its Split-C; rank 0 returns every rank's row."""
    from stacklib.bench.splitc.programs import RankResult, make_program
    from stacklib.bench.splitc.workload import _result
    from stacklib.layers.splitc import SplitC

    sc = session.service
    if not isinstance(sc, SplitC):
        raise ConfigError(
            str(session.recipe.path),
            "layers",
            "the splitc workload runs one rank per process over the splitc layer: end the "
            "layers with uam and splitc",
        )
    params = session.params
    program = make_program(
        params.benchmark, params.sizes or None, small=params.small, seed=session.world.seed
    )
    result = await program(sc)
    rows = await sc.all_gather([float(result.ok), result.total, result.compute])
    if session.rank != 0:
        return None
    results = [RankResult(bool(ok), total, compute) for ok, total, compute in rows]
    return _result(params, results, "wall")


#: Each workload's per-rank form: (session) -> rank 0's result, None on the other ranks.
ROLES: dict[str, Callable[[RankSession], Awaitable[Result | None]]] = {
    "pingpong": _pingpong,
    "udp-pingpong": _udp_pingpong,
    "tcp-stream": _tcp_stream,
    "splitc": _splitc,
}


# ---------------------------------------------------------------------------- a rank


def _transport_params(recipe: Recipe, env: Mapping[str, str]) -> Any:
    params = recipe.transport_params
    interface = env.get("STACKLIB_INTERFACE")
    if interface and hasattr(params, "interface"):
        params = attrs.evolve(params, interface=interface)
    return params


def _join(recipe: Recipe, world: RealWorld, env: Mapping[str, str], timeout: float) -> Rank:
    """Build this rank's node and connect it to the others (steps 1 and 2)."""
    from stacklib.launch import LaunchError

    rank, size, launcher = rank_from_environment(env)
    where = str(recipe.path)
    nodes = workload_nodes(recipe.workload, recipe.workload_params)
    if size != nodes:
        raise ConfigError(where, "workload", f"runs on {nodes} nodes, but {size} ranks started")
    transport = env.get("STACKLIB_TRANSPORT", recipe.transport.name)
    if transport != recipe.transport.name:
        raise ConfigError(
            where,
            "transport.kind",
            f"the recipe's transport is {recipe.transport.name}, the launcher's "
            f"STACKLIB_TRANSPORT={transport}",
        )
    rendezvous = env.get("STACKLIB_RENDEZVOUS")
    if not rendezvous:
        raise LaunchError(f"{launcher} started this rank without STACKLIB_RENDEZVOUS")
    name = f"rank{rank}"
    network = recipe.transport.build(world, _transport_params(recipe, env), [name], recipe.profile)
    node = network.nodes[name]
    return join_ether(
        network, node, rank, size, rendezvous, timeout, recipe.endpoint, recipe.transport.name
    )


@asynccontextmanager
async def open_rank(
    recipe: Recipe,
    env: Mapping[str, str] | None = None,
    *,
    world: RealWorld | None = None,
    timeout: float = TIMEOUT,
) -> AsyncIterator[RankSession]:
    """This process's rank of ``recipe``: its node joined to the others, its stack open, every
    rank's stack open (steps 1-4 up to the workload).  Leaving the block closes the stack and
    the node.  Programs of your own run over ``session.service``; the rank variables come
    from ``env`` (default: the environment)."""
    env = os.environ if env is None else env
    world = world if world is not None else RealWorld(seed=recipe.run.seed)
    if not recipe.transport.per_process:
        raise ConfigError(
            str(recipe.path),
            "transport.kind",
            f"{recipe.transport.name} builds every node in one process: `stacklib run` it",
        )
    me = _join(recipe, world, env, timeout)
    with me:
        layers = recipe.make_layers(me.rank, me.channels)
        placement = Placement(node=me.rank, nodes=me.size, channels=me.channels, cpu=None)
        for layer in layers:
            layer.place(placement)
        rendezvous = env["STACKLIB_RENDEZVOUS"]
        async with open_stacks([(UNetService(me.endpoint), layers)]) as (top,):
            publish(rendezvous, me.rank, "", kind="ready")
            for other in range(me.size):
                await _wait_file(rendezvous, other, "ready", timeout)
            yield RankSession(
                recipe=recipe,
                params=recipe.workload_params,
                world=world,
                rank=me.rank,
                size=me.size,
                service=top,
                peers=me.channels,
                rendezvous=rendezvous,
            )


def run_rank(
    recipe: Recipe,
    env: Mapping[str, str] | None = None,
    *,
    workload_params: Any = None,
    seed: int | None = None,
) -> Result | None:
    """Run this process's side of ``recipe``'s workload: rank 0's result, None elsewhere."""
    role = ROLES.get(recipe.workload.name)
    if role is None:
        raise ConfigError(
            str(recipe.path),
            "workload.kind",
            f"workload {recipe.workload.name!r} has no per-rank form for a one-node-per-process "
            f"transport (known: {', '.join(sorted(ROLES))})",
        )
    env = os.environ if env is None else env
    if not any(r in env and s in env for r, s, _ in LAUNCHER_VARIABLES):
        raise ConfigError(str(recipe.path), "transport.kind", not_a_rank(recipe))
    world = RealWorld(seed=recipe.run.seed if seed is None else seed)

    async def main() -> Result | None:
        async with open_rank(recipe, env, world=world) as session:
            if workload_params is not None:
                session = attrs.evolve(session, params=workload_params)
            result = await role(session)
            if session.rank == 0:
                publish(session.rendezvous, 0, "", kind="done")
            return result

    result = trio.run(main)
    if result is None:
        return None
    return attrs.evolve(result, facts={**result.facts, "clock": "real", "ranks": _ranks(env)})


def not_a_rank(recipe: Recipe) -> str:
    """Why ``recipe`` cannot run in this one process, and how to start its ranks."""
    name = recipe.transport.name
    nodes = workload_nodes(recipe.workload, recipe.workload_params)
    return (
        f"transport {name} runs one node per process: start {nodes} ranks, e.g. "
        f"`stacklib spawn -n {nodes} --transport {name} --netns stacklib run {recipe.name}` on "
        "one host, or a launcher setting the STACKLIB_ variables on each host "
        "(docs/launching.md)"
    )


def _ranks(env: Mapping[str, str] | None) -> int:
    return rank_from_environment(os.environ if env is None else env)[1]


def wants_ranks(recipe: Recipe) -> bool:
    """Whether ``recipe`` runs as one rank per process (its transport has one node each)."""
    return recipe.transport.per_process
