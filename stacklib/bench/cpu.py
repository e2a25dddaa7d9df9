"""The CPU cost of a UAM request/reply round trip, in one process and one thread.

``stacklib bench real`` times UAM between two processes on two CPUs, where cross-CPU cache
traffic and other load move the figure by microseconds.  These rows time only the work: both
sides of the conversation run in this process, one after the other, so a round trip costs the
sum of both sides' CPU and nothing else.

* :func:`machine_pair`: two :class:`~stacklib.layers.uam.machine.UamMachine` objects handing
  each other their datagrams: request, ``datagrams_to_send``, ``receive``, ``take``, reply,
  ``datagrams_to_send``, ``receive``, ``take`` (the sans-IO core alone);
* :func:`service_pair`: two :class:`~stacklib.layers.uam.service.UamService` objects over an
  in-process shm endpoint pair (one :class:`~stacklib.transports.shm.ShmNetwork`, one trio
  run, ``background_poll=False``): ``request_nowait`` on A, ``poll`` on B (its handler
  replies), ``poll`` on A until the reply handler ran: the lean path, the transport's rings
  included;
* :func:`trio_pass`: what one ``await trio.lowlevel.checkpoint()`` costs an application that
  polls those two services (its explicit polls keep the layers' background tasks out of the
  way; each checkpoint runs whatever of them is due).

Times are this thread's CPU time (``time.thread_time``), not the wall clock: on a shared
machine a process descheduled for another's time slice would otherwise be charged for it,
and nothing here waits (the shm rings are polled, no system call on the path).  Each row is
measured on the pure modules and, where a compiled copy of these sources exists,
on it too (:mod:`stacklib.bench.engines`, as ``bench real`` does); best of ``repeat``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import trio
import trio.lowlevel

from stacklib.bench.engines import engines, measure
from stacklib.bench.result import Cell, Column, Result

__all__ = ["MEASUREMENTS", "bench_cpu", "machine_pair", "service_pair", "trio_pass"]

_WORDS = (0x01020304, 0x05060708, 0x090A0B0C, 0x0D0E0F10)
_ECHO, _REPLY = 0, 1

#: The rows, by the name ``--only`` takes.
MEASUREMENTS: dict[str, tuple[str, Callable[[int], float]]] = {}


def machine_pair(iterations: int, warmup: int = 1000) -> float:
    """Mean seconds per request/reply round trip between two machines in this process."""
    from stacklib.layers.uam.machine import UamMachine

    a, b = UamMachine(), UamMachine()
    now = 0.0  # no clock: the timers never expire within a run

    def run(count: int) -> None:
        for _ in range(count):
            a.request(_ECHO, _WORDS, now)
            for datagram in a.datagrams_to_send(now):
                b.receive(datagram, now)
            taken = b.take()
            if not isinstance(taken, tuple):
                raise RuntimeError(f"UAM cpu bench: B took {taken!r}")
            b.reply(taken[3], _REPLY, taken[2], now)
            for datagram in b.datagrams_to_send(now):
                a.receive(datagram, now)
            taken = a.take()
            if not isinstance(taken, tuple) or taken[2] != _WORDS:
                raise RuntimeError(f"UAM cpu bench: A took {taken!r}")

    run(warmup)
    start = time.thread_time()
    run(iterations)
    elapsed = time.thread_time() - start
    if a.statistics().handled != warmup + iterations:  # pragma: no cover - a bug above
        raise RuntimeError("UAM cpu bench: replies went missing")
    return elapsed / iterations


def service_pair(iterations: int, warmup: int = 1000) -> float:
    """Mean seconds per request/reply round trip between two UAM services over an in-process
    shm endpoint pair, both polled explicitly in one trio run."""
    return _over_services(iterations, warmup, passes=False)


def trio_pass(iterations: int, warmup: int = 1000) -> float:
    """Mean seconds of one ``trio.lowlevel.checkpoint()`` in the conversation of
    :func:`service_pair`, taken after each round trip and 50 empty polls of A."""
    return _over_services(iterations, warmup, passes=True)


def _over_services(iterations: int, warmup: int, passes: bool) -> float:
    from stacklib.bench.real import open_endpoint
    from stacklib.transports.shm import ShmNetwork

    # A spin time longer than a checkpoint interval: the receive tasks never park (a parked
    # peer would make every send pay a wake-up).
    with ShmNetwork(spin_time=1e-2) as network:
        left, left_channel = open_endpoint(network, name="a", remote="b")
        right, _ = open_endpoint(network, name="b", remote="a")
        return trio.run(_services, left, right, left_channel, iterations, warmup, passes)


async def _services(
    left: object, right: object, channel: int, iterations: int, warmup: int, passes: bool
) -> float:
    from stacklib.layers.uam import UamLayer, UamParams
    from stacklib.services import UNetService
    from stacklib.unet import Endpoint

    if not isinstance(left, Endpoint) or not isinstance(right, Endpoint):
        raise TypeError("UAM cpu bench: expected two U-Net endpoints")
    params = UamParams(background_poll=False, max_retries=1000)
    replies = [0]

    def reply(peer: int, *args: int) -> None:
        replies[0] += 1

    with trio.fail_after(60 + iterations * 1e-3):
        async with (
            UamLayer(params).open(UNetService(left)) as a,
            UamLayer(params).open(UNetService(right)) as b,
        ):

            def echo(peer: int, *args: int) -> None:
                b.reply(_REPLY, *args)

            b.register_handler(echo, _ECHO)
            a.register_handler(reply, _REPLY)
            request, poll_a, poll_b = a.request_nowait, a.poll, b.poll

            def round_trip() -> None:
                target = replies[0] + 1
                request(channel, _ECHO, *_WORDS)
                poll_b()
                while replies[0] < target:
                    poll_a()

            async def run(count: int) -> None:
                for index in range(count):
                    round_trip()
                    if index & 63 == 0:
                        await trio.lowlevel.checkpoint()  # the layers' tasks run now and then

            async def checkpoints(count: int) -> float:
                spent = 0.0
                clock = time.thread_time
                for _ in range(count):
                    round_trip()
                    for _ in range(50):
                        poll_a()
                    start = clock()
                    await trio.lowlevel.checkpoint()
                    spent += clock() - start
                return spent

            if passes:
                await checkpoints(warmup)
                elapsed = await checkpoints(iterations)
            else:
                await run(warmup)
                start = time.thread_time()
                await run(iterations)
                elapsed = time.thread_time() - start
            await a.drain()
    return elapsed / iterations


MEASUREMENTS["machine"] = ("UAM machine pair: request/reply, 4 words", machine_pair)
MEASUREMENTS["service"] = (
    "UAM service pair over in-process shm: request_nowait, poll B, poll A",
    service_pair,
)
MEASUREMENTS["pass"] = ("a trio checkpoint of an application polling that pair", trio_pass)


def bench_cpu(
    iterations: int = 50_000,
    repeat: int = 5,
    only: list[str] | None = None,
    pure: bool = False,
) -> Result:
    """The rows of :data:`MEASUREMENTS` (or those in ``only``), per round trip, best of
    ``repeat``, on the pure modules and, unless ``pure``, on the compiled copy if one matches
    these sources; runs interleave so that both see the same machine."""
    unknown = sorted(set(only or ()) - set(MEASUREMENTS))
    if unknown:
        raise ValueError(f"no measurement {unknown[0]!r} (known: {', '.join(MEASUREMENTS)})")
    if iterations < 1 or repeat < 1:
        raise ValueError(f"iterations and repeat must be positive, got {iterations}, {repeat}")
    keys = [key for key in MEASUREMENTS if only is None or key in only]
    runs_on = engines(pure)
    best: dict[tuple[str, str], float] = {}
    for _ in range(repeat):
        for key in keys:
            fn = MEASUREMENTS[key][1]
            for engine in runs_on:
                seconds = measure(engine, fn, iterations)
                slot = (key, engine.name)
                best[slot] = min(best.get(slot, seconds), seconds)
    rows: list[dict[str, Cell]] = []
    for key in keys:
        pure_time = best[key, "pure"]
        for engine in runs_on:
            seconds = best[key, engine.name]
            rows.append(
                {
                    "measurement": MEASUREMENTS[key][0] + engine.suffix,
                    "value": seconds * 1e6,
                    "vs_pure": seconds / pure_time,
                }
            )
    return Result(
        title="UAM request/reply: CPU per round trip, both sides in one process (one run)",
        columns=[
            Column("measurement", "measurement"),
            Column("value", "round trip", "us", 2),
            Column("vs_pure", "x pure", "", 2),
        ],
        rows=rows,
        facts={"iterations": iterations, "repeat": repeat},
        notes=[
            "best of the repeats; one process, one thread: both sides' work, no cross-CPU cost",
            "compiled: the mypyc copy (stacklib compile), measured in a spawned worker",
        ]
        if len(runs_on) > 1
        else ["best of the repeats; one process, one thread: both sides' work"],
    )
