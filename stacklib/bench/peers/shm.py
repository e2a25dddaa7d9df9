"""Peer processes of the shm benchmarks and tests: echo, sink or source on one channel.

:func:`spawn_peer` starts one with the ``spawn`` start method (a fresh interpreter, as a real
second application would be); ``python -m stacklib.bench.peers.shm --peer DIR NODE PORT
REMOTE_NODE:REMOTE_PORT`` runs one from a shell.  A peer ends quietly when its partner leaves
(:class:`~stacklib.errors.PeerGone`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from stacklib.errors import PeerGone
from stacklib.transports.shm import ShmAddress, ShmEndpoint, ShmNetwork, relax
from stacklib.unet.endpoint import EndpointConfig

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

#: Messages per ``send_many`` call of a batching source.
BATCH = 64


@attrs.frozen
class PeerSpec:
    """What a peer process does: its node and port, whom it talks to, and its role.

    Roles: ``echo`` (send every message back on its channel), ``sink`` (count messages of a
    stream, reply once with the count when a 0-byte message ends it), ``source`` (send
    ``count`` messages of ``size`` bytes, then a 0-byte end marker).  ``mode`` is ``poll``
    (busy-poll loop, no trio), ``many`` (busy-poll, a source sends in batches with
    ``send_many``), ``trio`` (``await recv``/``send``: the :class:`Message` face) or
    ``trio-payload`` (``await recv_payload``/``send_payload_async``: no per-message object).
    """

    directory: str
    node: str
    port: int
    remote_node: str
    remote_port: int
    role: str = "echo"
    mode: str = "poll"
    count: int = 0
    size: int = 40
    ring_bytes: int = 1 << 20
    max_message: int = 65535
    #: Pin the peer process to this CPU (benchmarks place the two processes deliberately).
    cpu: int | None = None
    config: EndpointConfig = attrs.field(factory=EndpointConfig)


def peer_main(spec: PeerSpec) -> None:
    """Entry point of a peer process (spawned with :func:`spawn_peer` or ``-m``)."""
    if spec.cpu is not None:
        os.sched_setaffinity(0, {spec.cpu})
    network = ShmNetwork(
        directory=spec.directory, ring_bytes=spec.ring_bytes, max_message=spec.max_message
    )
    node = network.add_node(spec.node)
    endpoint = node.os.create_endpoint(node.os.process(spec.role), spec.config, port=spec.port)
    if not isinstance(endpoint, ShmEndpoint):
        raise TypeError(f"expected a ShmEndpoint, got {endpoint!r}")
    channel = node.os.create_channel(
        endpoint.owner, endpoint, ShmAddress(spec.remote_node, spec.remote_port)
    )
    try:
        if spec.mode == "trio":
            trio.run(_peer_trio, endpoint, channel, spec)
        elif spec.mode == "trio-payload":
            trio.run(_peer_trio_payload, endpoint, channel, spec)
        else:
            _peer_poll(endpoint, channel, spec)
    except PeerGone:
        pass
    finally:
        network.close()


def _peer_poll(endpoint: ShmEndpoint, channel: int, spec: PeerSpec) -> None:
    """Busy-poll loop: the fastest receive model (paper 000 §3.1 polling); a ``source`` in
    mode ``many`` sends with ``send_many``.  The descriptor-free calls (``poll_payload``,
    ``send_payload``): no per-message object but the (channel, data) pair."""
    poll, send = endpoint.poll_payload, endpoint.send_payload
    link = endpoint.shm_ni.link(endpoint, channel)
    spins = 0

    def idle() -> None:
        nonlocal spins
        spins += 1
        relax(spins)
        if spins & 0xFFFF == 0:
            link.check_peer()
            if link.failed is not None:
                raise PeerGone(link.failed)

    if spec.role == "source" and spec.mode == "many":
        _source_many(endpoint, channel, spec, idle)
        return
    if spec.role == "source":
        payload = bytes(spec.size)
        for index in range(spec.count + 1):
            outgoing = payload if index < spec.count else b""
            while True:
                try:
                    send(channel, outgoing)
                    break
                except trio.WouldBlock:
                    idle()
        while endpoint.send_queue:
            endpoint.shm_ni.progress()
            idle()
        while poll() is None:  # wait for the receiver's acknowledgment before closing
            idle()
        return
    received = 0
    while True:
        arrival = poll()
        if arrival is None:
            idle()
            continue
        on, data = arrival
        spins = 0  # (idle() gives the CPU away after 64 empty polls in a row)
        if spec.role == "echo":
            while True:
                try:
                    send(on, data)
                    break
                except trio.WouldBlock:
                    idle()
        elif data:
            received += 1
        else:
            send(on, received.to_bytes(8, "little"))
            received = 0


def _source_many(
    endpoint: ShmEndpoint, channel: int, spec: PeerSpec, idle: Callable[[], None]
) -> None:
    """The ``source`` role in batches of :data:`BATCH` messages (``send_many``)."""
    batch = [bytes(spec.size)] * BATCH
    left = spec.count
    while left:
        chunk = batch if left >= BATCH else batch[:left]
        taken = endpoint.send_many(channel, chunk)
        left -= taken
        if not taken:
            idle()
    while not endpoint.send_many(channel, [b""]):
        idle()
    while endpoint.poll() is None:  # wait for the receiver's acknowledgment before closing
        idle()


async def _peer_trio(endpoint: ShmEndpoint, channel: int, spec: PeerSpec) -> None:
    if spec.role == "source":
        payload = bytes(spec.size)
        for _ in range(spec.count):
            await endpoint.send(channel, payload)
        await endpoint.send(channel, b"")
        await endpoint.recv()
        return
    received = 0
    while True:
        message = await endpoint.recv()
        if spec.role == "echo":
            await endpoint.send(message.channel, message.data)
        elif message.data:
            received += 1
        else:
            await endpoint.send(message.channel, received.to_bytes(8, "little"))
            received = 0


async def _peer_trio_payload(endpoint: ShmEndpoint, channel: int, spec: PeerSpec) -> None:
    """:func:`_peer_trio` through the descriptor-free ``await`` face."""
    send, recv = endpoint.send_payload_async, endpoint.recv_payload
    if spec.role == "source":
        payload = bytes(spec.size)
        for _ in range(spec.count):
            await send(channel, payload)
        await send(channel, b"")
        await recv()
        return
    received = 0
    while True:
        on, data = await recv()
        if spec.role == "echo":
            await send(on, data)
        elif data:
            received += 1
        else:
            await send(on, received.to_bytes(8, "little"))
            received = 0


def spawn_peer(spec: PeerSpec) -> BaseProcess:
    """Start a peer process with the ``spawn`` start method (a fresh interpreter, as a real
    second application would be) and return it, started."""
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(
        target=peer_main, args=(spec,), daemon=True, name=f"shm-peer-{spec.node}"
    )
    process.start()
    return process


def _main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stacklib.bench.peers.shm",
        description="Run a U-Net shm peer process (echo, sink or source).",
    )
    parser.add_argument("--peer", action="store_true", help="run as a peer (the only mode)")
    parser.add_argument("directory", help="the shared directory of the ShmNetwork")
    parser.add_argument("node", help="this peer's node name")
    parser.add_argument("port", type=int, help="this peer's endpoint port")
    parser.add_argument("remote", help="the remote endpoint as NODE:PORT")
    parser.add_argument("--role", choices=["echo", "sink", "source"], default="echo")
    parser.add_argument("--mode", choices=["poll", "trio", "trio-payload"], default="poll")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--size", type=int, default=40)
    args = parser.parse_args(argv)
    remote_node, _, remote_port = args.remote.rpartition(":")
    if not remote_node or not remote_port.isdigit():
        parser.error(f"remote must be NODE:PORT, got {args.remote!r}")
    peer_main(
        PeerSpec(
            directory=args.directory,
            node=args.node,
            port=args.port,
            remote_node=remote_node,
            remote_port=int(remote_port),
            role=args.role,
            mode=args.mode,
            count=args.count,
            size=args.size,
        )
    )
    return 0


if __name__ == "__main__":
    # Run as ``python -m``: delegate to the imported module, so the classes are the package's
    # own, not copies living in ``__main__``.
    from stacklib.bench.peers.shm import _main as main

    sys.exit(main(sys.argv[1:]))
