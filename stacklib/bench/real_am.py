"""Active Messages between two processes over shm, for ``stacklib bench real``: UAM
request/reply (:func:`uam_pingpong`) and Split-C's blocking read (:func:`splitc_read`).

A Split-C read of a remote scalar is one UAM request carrying the address and one reply
carrying the value (paper 000 §6: "a read ... map[s] into a request/reply Active Message
pair").  :func:`splitc_read` times it between this process (rank 0) and a peer process (rank
1) on two CPUs, each running UAM over a shm endpoint with explicit polling, as
:func:`uam_pingpong` does for bare UAM.  Its mpi4py counterpart is the
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
from stacklib.layers.uam import LeanPath, UamLayer, UamParams, UamService
from stacklib.services import UNetService
from stacklib.transports.shm import ShmEndpoint, ShmNetwork, relax

__all__ = ["SPLITC_MODES", "splitc_read", "splitc_read_cpu", "uam_pingpong"]

#: How rank 0 reads: ``"poll"`` (``get_nowait``, then ``poll()`` until it is done, as a GAM
#: program polls) or ``"trio"`` (``await sc.read(gp)``).
SPLITC_MODES = ("poll", "trio")
_ELEMENTS = 16
_OFFSET = 5  # the element rank 0 reads
_RETRIES = 1000  # as uam_pingpong: a descheduled peer on a shared machine is not a failure
# How often the polling loops give trio a pass (the layer's timers run then; a pass costs some
# 10 us here, so the peer's requests must not keep meeting one): the serving rank after 4096
# empty polls (about 1 ms), the reading rank every 256 operations (a few ms).
_SERVER_YIELD = 4095
_CLIENT_YIELD = 255


def splitc_read(
    iterations: int,
    mode: str = "poll",
    warmup: int = 200,
    spin: float = 1e-3,
    express: bool = True,
) -> float:
    """Mean seconds of a blocking Split-C read of one remote 8-byte element over shm, rank 0
    in this process and rank 1 in a peer process that polls explicitly.  ``spin``: the shm
    networks' ``spin_time``; ``express``: whether UAM's lean path may take the express lane
    (:attr:`LeanPath.express`, on both sides)."""
    if mode not in SPLITC_MODES:
        raise ValueError(f"no Split-C read benchmark in mode {mode!r} (known: {SPLITC_MODES})")
    import multiprocessing

    from stacklib.bench.real import _wait_attached, open_endpoint, pinned, placement

    mine, theirs = placement(False)
    with ShmNetwork(spin_time=spin) as network, pinned(mine):
        endpoint, channel = open_endpoint(network)
        context = multiprocessing.get_context("spawn")
        peer = context.Process(
            target=_splitc_peer, args=(network.directory, theirs, spin, express), daemon=True
        )
        peer.start()
        try:
            _wait_attached(endpoint, channel)
            return trio.run(_splitc_client, endpoint, channel, mode, iterations, warmup, express)
        finally:
            peer.kill()
            peer.join(5)


def _splitc_peer(directory: str, cpu: int | None, spin: float, express: bool) -> None:
    """Rank 1, in its own process: serve reads by polling."""
    from stacklib.bench.real import open_endpoint

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    network = ShmNetwork(directory=directory, spin_time=spin)
    try:
        endpoint, channel = open_endpoint(network, name="peer", remote="main")
        trio.run(_splitc_serve, endpoint, channel, express)
    finally:
        network.close()


def _params() -> UamParams:
    return UamParams(background_poll=False, max_retries=_RETRIES)


def _set_express(am: UamService, express: bool) -> None:
    """Let the lean path take the express lane, or not (the comparison of the two)."""
    if isinstance(am.path, LeanPath):
        am.path.express = express


async def _splitc_serve(endpoint: ShmEndpoint, channel: int, express: bool) -> None:
    async with UamLayer(_params()).open(UNetService(endpoint)) as am:
        _set_express(am, express)
        sc = SplitC(am, 1, {0: channel})  # handlers registered before anything can arrive
        await sc.all_register("x", np.arange(_ELEMENTS, dtype=np.int64) * 3)
        poll = am.poll
        spins = idle = 0  # empty polls since the last arrival; in all
        while True:  # explicit polling, with a checkpoint now and then for the timers
            if poll():
                spins = 0
            else:
                spins += 1
                relax(spins)
                idle += 1
                if idle & _SERVER_YIELD == 0:
                    await trio.lowlevel.checkpoint()


async def _splitc_client(
    endpoint: ShmEndpoint, channel: int, mode: str, iterations: int, warmup: int, express: bool
) -> float:
    with trio.fail_after(60 + iterations * 1e-3):
        async with UamLayer(_params()).open(UNetService(endpoint)) as am:
            _set_express(am, express)
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
    for index in range(count):
        pending = get(gp)
        spins = 0  # empty polls in this wait
        while not pending.done:
            if not poll():
                spins += 1
                relax(spins)
        if pending.value != _OFFSET * 3:
            raise RuntimeError(f"Split-C benchmark: read {pending.value!r}")
        if index & _CLIENT_YIELD == 0:
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


# UAM request/reply between two processes.  Handler 0 at rank 1 replies to handler 1 at rank 0
# with the request's words; handler 2 at rank 0 hears rank 1 say it is ready (its handler
# table is filled), so no request meets an empty slot.
_UAM_ECHO, _UAM_REPLY, _UAM_READY = 0, 1, 2
_UAM_WORDS = (0x01020304, 0x05060708, 0x090A0B0C, 0x0D0E0F10)
_UAM_KINDS = ("request", "message")
_UAM_MODES = ("poll", "trio")
# A process descheduled for longer than rto * (max_retries + 1) (36 ms by default) would make
# its peer give up; on a shared 2-core machine that happens, so the benchmark waits 4 s.
_RETRIES = 1000


def _uam_peer(
    directory: str, cpu: int | None, kind: str, mode: str, spin: float, express: bool
) -> None:
    """Rank 1 of :func:`uam_pingpong`, in its own process: a UAM layer over a shm endpoint
    whose handler replies to each request (or a task echoing messages, ``kind="message"``)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    from stacklib.bench.real import open_endpoint

    network = ShmNetwork(directory=directory, spin_time=spin)
    try:
        endpoint, channel = open_endpoint(network, name="peer", remote="main")
        trio.run(_uam_serve, endpoint, channel, kind, mode, express)
    finally:
        network.close()


async def _uam_serve(
    endpoint: ShmEndpoint, channel: int, kind: str, mode: str, express: bool
) -> None:
    params = UamParams(background_poll=mode == "trio", max_retries=_RETRIES)
    async with UamLayer(params).open(UNetService(endpoint)) as am:
        _set_express(am, express)

        def echo(peer: int, *args: int) -> None:
            am.reply(_UAM_REPLY, *args)

        am.register_handler(echo, _UAM_ECHO)
        am.register_handler(lambda peer, *args: None, _UAM_REPLY)
        await am.request(channel, _UAM_READY)
        if kind == "message":
            while True:
                peer, data = await am.recv()
                await am.send(peer, data)
        if mode == "trio":
            await trio.sleep_forever()
        # Explicit polling (GAM's am_poll in a loop), with a checkpoint now and then so the
        # layer's timers run.
        poll = am.poll
        spins = idle = 0  # empty polls since the last arrival; in all
        while True:
            if poll():
                spins = 0
            else:
                spins += 1
                relax(spins)
                idle += 1
                if idle & _SERVER_YIELD == 0:
                    await trio.lowlevel.checkpoint()


def uam_pingpong(
    iterations: int,
    kind: str = "request",
    mode: str = "poll",
    size: int = 40,
    warmup: int = 200,
    spin: float = 1e-3,
    express: bool = True,
) -> float:
    """Mean round trip (s) of UAM between this process and a peer process over shm.

    ``kind="request"``: a GAM request with four words (a 24-byte PDU, paper 000 §5.2's "single
    cell") to a handler at the peer that replies with them.  ``mode="poll"``: both sides poll
    explicitly (``background_poll=False``; ``request_nowait`` then ``poll()`` in a loop until
    the reply handler has run, as a GAM program does); ``mode="trio"``: this side awaits
    :meth:`UamService.request` and :meth:`UamService.wait_until`, the peer's background poller
    runs the handler.  ``kind="message"`` (trio only): ``size``-byte messages through the
    ``send``/``recv`` face, echoed by a task at the peer.  Both shm networks spin ``spin``
    seconds before sleeping (the transport's ``spin_time``): with the default 50 us, a round
    trip slowed by other load puts both sides to sleep and every message then pays a wake-up.
    ``express``: whether the lean paths may take the express lane (:attr:`LeanPath.express`).
    """
    if kind not in _UAM_KINDS or mode not in _UAM_MODES or (kind, mode) == ("message", "poll"):
        raise ValueError(f"no UAM benchmark of kind {kind!r} in mode {mode!r}")
    import multiprocessing

    from stacklib.bench.real import _wait_attached, open_endpoint, pinned, placement

    mine, theirs = placement(False)
    with ShmNetwork(spin_time=spin) as network, pinned(mine):
        endpoint, channel = open_endpoint(network)
        context = multiprocessing.get_context("spawn")
        peer = context.Process(
            target=_uam_peer,
            args=(network.directory, theirs, kind, mode, spin, express),
            daemon=True,
        )
        peer.start()
        try:
            _wait_attached(endpoint, channel)
            return trio.run(
                _uam_client, endpoint, channel, kind, mode, size, iterations, warmup, express
            )
        finally:
            peer.kill()
            peer.join(5)


class _Replies:
    """Rank 0's handlers: count replies, note that the peer is ready."""

    def __init__(self) -> None:
        self.count = 0
        self.ready = False

    def reply(self, peer: int, *args: int) -> None:
        if args != _UAM_WORDS:
            raise RuntimeError(f"UAM benchmark: reply carried {args!r}")
        self.count += 1

    def hello(self, peer: int) -> None:
        self.ready = True


async def _uam_client(
    endpoint: ShmEndpoint,
    channel: int,
    kind: str,
    mode: str,
    size: int,
    iterations: int,
    warmup: int,
    express: bool,
) -> float:
    params = UamParams(background_poll=False, max_retries=_RETRIES)
    replies = _Replies()
    with trio.fail_after(60 + iterations * 1e-3):
        async with UamLayer(params).open(UNetService(endpoint)) as am:
            _set_express(am, express)
            am.register_handler(lambda peer, *args: None, _UAM_ECHO)
            am.register_handler(replies.reply, _UAM_REPLY)
            am.register_handler(replies.hello, _UAM_READY)
            await am.wait_until(lambda: replies.ready)
            if kind == "message":
                run = _uam_messages
            else:
                run = _uam_polled if mode == "poll" else _uam_awaited
            await run(am, channel, size, warmup, replies)
            start = time.perf_counter()
            await run(am, channel, size, iterations, replies)
            elapsed = (time.perf_counter() - start) / iterations
            if kind == "request" and replies.count != warmup + iterations:
                raise RuntimeError(f"UAM benchmark: {replies.count} replies")
            await am.drain()
            return elapsed


async def _uam_polled(
    am: UamService, channel: int, size: int, count: int, replies: _Replies
) -> None:
    poll, request = am.poll, am.request_nowait
    for index in range(count):
        target = replies.count + 1
        request(channel, _UAM_ECHO, *_UAM_WORDS)
        spins = 0  # empty polls in this wait
        while replies.count < target:
            if not poll():
                spins += 1
                relax(spins)
        if index & _CLIENT_YIELD == 0:
            await trio.lowlevel.checkpoint()  # let the layer's timers run now and then


async def _uam_awaited(
    am: UamService, channel: int, size: int, count: int, replies: _Replies
) -> None:
    for _ in range(count):
        target = replies.count + 1
        await am.request(channel, _UAM_ECHO, *_UAM_WORDS)
        await am.wait_until(lambda: replies.count >= target)  # noqa: B023 (awaited here)


async def _uam_messages(
    am: UamService, channel: int, size: int, count: int, replies: _Replies
) -> None:
    message = bytes(size)
    for _ in range(count):
        await am.send(channel, message)
        await am.recv()
