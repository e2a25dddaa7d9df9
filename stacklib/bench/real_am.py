"""Split-C's blocking read between two processes over shm, for ``stacklib bench real``.

A Split-C read of a remote scalar is one UAM request carrying the address and one reply
carrying the value (paper 000 §6: "a read ... map[s] into a request/reply Active Message
pair").  :func:`splitc_read` times it between this process (rank 0) and a peer process (rank
1) on two CPUs, each running UAM over a shm endpoint with explicit polling, as
:func:`stacklib.bench.real.uam_pingpong` does for bare UAM.  Its mpi4py counterpart is the
"read" row of stacklib/bench/mpi/p2p.py: the same 16-byte request answered with 8 bytes,
with buffer ``Send``/``Recv`` (and, for completeness, one-sided ``Get``).

:func:`splitc_read_cpu` measures the CPU of the same read with both ranks in one process
(no peer to wait for, so nothing but the work is timed), beside a bare UAM request/reply:
the difference is Split-C's own share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import trio
import trio.lowlevel

from stacklib.layers.splitc import GlobalPtr, SplitC
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.services import UNetService
from stacklib.transports.shm import ShmEndpoint, ShmNetwork, relax

__all__ = ["SPLITC_MODES", "splitc_read", "splitc_read_cpu"]

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


def splitc_read_cpu(iterations: int = 5000, runs: int = 5) -> dict[str, float]:
    """CPU seconds per operation with both ranks in this process, one thread, one trio run: two
    UAM services (``background_poll=False``) over an shm endpoint pair of one
    :class:`ShmNetwork`, each with its :class:`SplitC`.  Each of ``runs`` runs times
    ``iterations`` operations in batches of 64 and keeps the fastest batch (the work, without
    other processes' interference on a shared machine); the best run counts.  The two kinds
    alternate, run by run.

    ``"splitc"``: rank 0 ``get_nowait(gp)`` of a remote 8-byte element, then ``poll()`` of
    rank 1 (its request handler reads the element and replies), then ``poll()`` of rank 0 until
    the read is done (its reply handler completes it).  ``"uam"``: the same with a bare UAM
    request of four words whose handler replies four words.  ``"share"``: the difference,
    Split-C's own work per read.  Whichever modules are imported are measured: run it with
    ``STACKLIB_COMPILED=1`` for the compiled copy.
    """
    if iterations < 1 or runs < 1:
        raise ValueError(f"iterations ({iterations}) and runs ({runs}) must be positive")
    return trio.run(_cpu_runs, iterations, runs)


async def _cpu_runs(iterations: int, runs: int) -> dict[str, float]:
    from stacklib.bench.real import open_endpoint

    with ShmNetwork() as network:
        ep0, ch0 = open_endpoint(network, name="main", remote="peer")
        ep1, ch1 = open_endpoint(network, name="peer", remote="main")
        async with (
            UamLayer(_params()).open(UNetService(ep0)) as am0,
            UamLayer(_params()).open(UNetService(ep1)) as am1,
        ):
            sc0 = SplitC(am0, 0, {1: ch0})
            sc1 = SplitC(am1, 1, {0: ch1})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sc1.all_register, "x", np.arange(_ELEMENTS, dtype=np.int64) * 3)
                await sc0.all_register("x", np.zeros(_ELEMENTS, dtype=np.int64))
            gp = sc0.ptr(1, "x", _OFFSET)
            replies = [0]

            def on_request(peer: int, *words: int) -> None:
                am1.reply(reply_handler, *words)

            def on_reply(peer: int, *words: int) -> None:
                replies[0] += 1

            request_handler = am1.register_handler(on_request, name="bench.request")
            reply_handler = am0.register_handler(on_reply, name="bench.reply")
            am0.register_handler(on_request, name="bench.request")  # same order on both
            am1.register_handler(on_reply, name="bench.reply")

            def splitc_read() -> None:
                pending = sc0.get_nowait(gp)
                am1.poll()
                while not pending.done:
                    am0.poll()
                if pending.value != _OFFSET * 3:
                    raise RuntimeError(f"Split-C benchmark: read {pending.value!r}")

            def uam_round_trip() -> None:
                count = replies[0]
                am0.request_nowait(ch0, request_handler, *_WORDS)
                am1.poll()
                while replies[0] == count:
                    am0.poll()

            result = {"uam": float("inf"), "splitc": float("inf")}
            for _ in range(runs):
                for name, operation in (("uam", uam_round_trip), ("splitc", splitc_read)):
                    result[name] = min(result[name], await _timed(operation, iterations))
            await am0.drain()
            await am1.drain()
    result["share"] = result["splitc"] - result["uam"]
    return result


_WORDS = (0x12000005, 40, 0, 0)  # a request's four words, as a Split-C read's


async def _timed(operation: Callable[[], None], iterations: int) -> float:
    """CPU seconds per ``operation()`` in the fastest batch of 64 (fewer if ``iterations`` is),
    after a warm-up; a checkpoint between batches lets UAM's timers run (delayed
    acknowledgments), outside the timed stretches."""
    for _ in range(200):
        operation()
    await trio.lowlevel.checkpoint()
    best = float("inf")
    done = 0
    clock = time.process_time
    while done < iterations:
        chunk = min(64, iterations - done)
        start = clock()
        for _ in range(chunk):
            operation()
        best = min(best, (clock() - start) / chunk)
        done += chunk
        await trio.lowlevel.checkpoint()
    return best
