"""The batched one-way message rate over shm (``send_many`` into ``recv_many``), a row of
``stacklib bench real``.

A peer process streams ``count`` messages in batches of
:data:`~stacklib.bench.peers.shm.BATCH` with ``send_many``; this process drains them with
``recv_many``, busy-polling; the clock runs from the first arrival to the last.  The two
processes sit on two different CPUs where there are two.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from stacklib.bench.engines import PURE, Engine, measure
from stacklib.bench.peers.shm import BATCH, PeerSpec, spawn_peer
from stacklib.bench.result import Cell
from stacklib.transports.shm import ShmAddress, ShmEndpoint, ShmNetwork, relax
from stacklib.unet import EndpointConfig

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["batched_rows", "batched_stream"]

_RING = 4 << 20
#: The batched rate users compare with (messages per second, one way).
TARGET = 2_000_000


def batched_stream(count: int, size: int) -> float:
    """Seconds for a peer process to stream ``count`` messages of ``size`` bytes to this one
    with ``send_many``, received with ``recv_many``, first arrival to last."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    mine, theirs = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    old = os.sched_getaffinity(0) if mine is not None else None
    with ShmNetwork(ring_bytes=_RING, max_message=max(size, 64)) as network:
        node = network.add_node("main")
        endpoint = node.os.create_endpoint(node.os.process("bench"), port=1)
        if not isinstance(endpoint, ShmEndpoint):
            raise TypeError(f"expected a ShmEndpoint, got {endpoint!r}")
        channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress("peer", 1))
        peer = spawn_peer(
            PeerSpec(
                network.directory,
                "peer",
                1,
                "main",
                1,
                role="source",
                mode="many",
                count=count,
                size=size,
                ring_bytes=_RING,
                max_message=max(size, 64),
                cpu=theirs,
                config=EndpointConfig(segment_size=1 << 16, tx_buffers=1, rx_buffers=1),
            )
        )
        try:
            if mine is not None:
                os.sched_setaffinity(0, {mine})
            recv_many = endpoint.recv_many
            deadline = time.monotonic() + 30
            while not (first := recv_many(BATCH)):
                if time.monotonic() > deadline or not peer.is_alive():
                    raise RuntimeError("the batching shm source process sent nothing")
            start = time.perf_counter()
            received = len(first)
            done = not first[-1].data
            idle = 0
            while not done:
                batch = recv_many(BATCH)
                if not batch:
                    idle += 1
                    relax(idle)
                    if idle & 0xFFFFF == 0 and not peer.is_alive():
                        raise RuntimeError("the batching shm source process died mid-stream")
                    continue
                received += len(batch)
                done = not batch[-1].data
            elapsed = time.perf_counter() - start
            received -= 1  # the empty end marker
            endpoint.send_nowait(channel, b"done")
            if received != count:
                raise RuntimeError(f"batched shm stream lost messages: {received} of {count}")
            return elapsed * count / max(count - len(first), 1)
        finally:
            if old is not None:
                os.sched_setaffinity(0, old)
            peer.join(5)
            if peer.is_alive():
                peer.kill()
                peer.join(5)


def batched_rows(
    only: Sequence[str] | None,
    repeat: int,
    messages: int,
    size: int,
    runs_on: Sequence[Engine] = (PURE,),
) -> list[dict[str, Cell]]:
    """The rows ``bench real`` adds after its one-way rate (run with it: ``--only rate``), one
    per engine in ``runs_on`` (the pure modules, and the compiled copy)."""
    if only is not None and "rate" not in only:
        return []
    rows: list[dict[str, Cell]] = []
    for engine in runs_on:
        seconds = min(measure(engine, batched_stream, messages, size) for _ in range(repeat))
        rate = messages / seconds
        rows.append(
            {
                "measurement": f"one-way message rate, shm, {size} B, send_many/recv_many of "
                f"{BATCH}{engine.suffix}",
                "value": rate,
                "unit": "msgs/s",
                "target": f">= {TARGET:,}",
                "met": "yes" if rate >= TARGET else "no",
            }
        )
    return rows
