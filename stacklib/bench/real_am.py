"""Split-C's blocking read between two processes over shm, for ``stacklib bench real``.

A Split-C read of a remote scalar is one UAM request carrying the address and one reply
carrying the value (paper 000 §6: "a read ... map[s] into a request/reply Active Message
pair").  :func:`splitc_read` times it between this process (rank 0) and a peer process (rank
1) on two CPUs, each running UAM over a shm endpoint with explicit polling, as
:func:`stacklib.bench.real.uam_pingpong` does for bare UAM.  Its mpi4py counterpart is the
"read" row of stacklib/bench/mpi/p2p.py: the same 16-byte request answered with 8 bytes,
with buffer ``Send``/``Recv`` (and, for completeness, one-sided ``Get``).
"""

from __future__ import annotations

import os
import time

import numpy as np
import trio
import trio.lowlevel

from stacklib.layers.splitc import GlobalPtr, SplitC
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.services import UNetService
from stacklib.transports.shm import ShmEndpoint, ShmNetwork, relax

__all__ = ["SPLITC_MODES", "splitc_read"]

#: How rank 0 reads: ``"poll"`` (``get_nowait``, then ``poll()`` until it is done, as a GAM
#: program polls) or ``"trio"`` (``await sc.read(gp)``).
SPLITC_MODES = ("poll", "trio")
_ELEMENTS = 16
_OFFSET = 5  # the element rank 0 reads
_RETRIES = 1000  # as uam_pingpong: a descheduled peer on a shared machine is not a failure


def splitc_read(
    iterations: int, mode: str = "poll", warmup: int = 200, spin: float = 1e-3
) -> float:
    """Mean seconds of a blocking Split-C read of one remote 8-byte element over shm, rank 0
    in this process and rank 1 in a peer process that polls explicitly.  ``spin``: the shm
    networks' ``spin_time``."""
    if mode not in SPLITC_MODES:
        raise ValueError(f"no Split-C read benchmark in mode {mode!r} (known: {SPLITC_MODES})")
    import multiprocessing

    from stacklib.bench.real import _wait_attached, open_endpoint, pinned, placement

    mine, theirs = placement(False)
    with ShmNetwork(spin_time=spin) as network, pinned(mine):
        endpoint, channel = open_endpoint(network)
        context = multiprocessing.get_context("spawn")
        peer = context.Process(
            target=_splitc_peer, args=(network.directory, theirs, spin), daemon=True
        )
        peer.start()
        try:
            _wait_attached(endpoint, channel)
            return trio.run(_splitc_client, endpoint, channel, mode, iterations, warmup)
        finally:
            peer.kill()
            peer.join(5)


def _splitc_peer(directory: str, cpu: int | None, spin: float) -> None:
    """Rank 1, in its own process: serve reads by polling."""
    from stacklib.bench.real import open_endpoint

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    network = ShmNetwork(directory=directory, spin_time=spin)
    try:
        endpoint, channel = open_endpoint(network, name="peer", remote="main")
        trio.run(_splitc_serve, endpoint, channel)
    finally:
        network.close()


def _params() -> UamParams:
    return UamParams(background_poll=False, max_retries=_RETRIES)


async def _splitc_serve(endpoint: ShmEndpoint, channel: int) -> None:
    async with UamLayer(_params()).open(UNetService(endpoint)) as am:
        sc = SplitC(am, 1, {0: channel})  # handlers registered before anything can arrive
        await sc.all_register("x", np.arange(_ELEMENTS, dtype=np.int64) * 3)
        poll = am.poll
        spins = 0
        while True:  # explicit polling, with a checkpoint now and then for the timers
            if not poll():
                spins += 1
                relax(spins)
                if spins & 255 == 0:
                    await trio.lowlevel.checkpoint()


async def _splitc_client(
    endpoint: ShmEndpoint, channel: int, mode: str, iterations: int, warmup: int
) -> float:
    with trio.fail_after(60 + iterations * 1e-3):
        async with UamLayer(_params()).open(UNetService(endpoint)) as am:
            sc = SplitC(am, 0, {1: channel})
            # Rank 1 stores its part of each collective first (rank 0 is the root), so its
            # handlers are in place before rank 0 sends anything.
            await sc.all_register("x", np.zeros(_ELEMENTS, dtype=np.int64))
            gp = sc.ptr(1, "x", _OFFSET)
            run = _polled if mode == "poll" else _awaited
            await run(sc, gp, warmup)
            start = time.perf_counter()
            await run(sc, gp, iterations)
            elapsed = (time.perf_counter() - start) / iterations
            await am.drain()
            return elapsed


async def _polled(sc: SplitC, gp: GlobalPtr, count: int) -> None:
    get, poll = sc.get_nowait, sc.am.poll
    spins = 0
    for index in range(count):
        pending = get(gp)
        while not pending.done:
            if not poll():
                spins += 1
                relax(spins)
        if pending.value != _OFFSET * 3:
            raise RuntimeError(f"Split-C benchmark: read {pending.value!r}")
        if index & 63 == 0:
            await trio.lowlevel.checkpoint()  # let the layer's timers run now and then


async def _awaited(sc: SplitC, gp: GlobalPtr, count: int) -> None:
    read = sc.read
    for _ in range(count):
        value = await read(gp)
        if value != _OFFSET * 3:
            raise RuntimeError(f"Split-C benchmark: read {value!r}")
