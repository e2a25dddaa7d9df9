"""Real transports between two processes, side by side in one run (paper 000 §1, §4).

U-Net's claim is that taking the kernel off the data path makes communication an order of
magnitude faster.  This benchmark measures it on today's machine, between two real processes:

* 40-byte ping-pong over the shm transport (busy-polling, and trio tasks that spin then block)
  against the same ping-pong over kernel UDP sockets (blocking ``sendto``/``recvfrom``, the
  fastest kernel path; and, if built, U-Net over the udp transport);
* UAM (GAM 1.1) request/reply over shm: a four-word request to a handler that replies
  (:func:`uam_pingpong`), with explicit polling and with trio tasks;
* Split-C's blocking read of a remote 8-byte element over shm, polled and awaited
  (:func:`stacklib.bench.real_am.splitc_read`);
* one-way message rate over shm with 40-byte messages;
* bulk bandwidth over shm with 64 KiB messages.

Targets: shm round trip at least 10x below kernel UDP and at most 10 us; UAM request/reply at
most 20 us; at least 100,000 messages/s; at least 1 GB/s.  With 2 cores, two busy-polling
processes use the whole machine, so other load
on the machine shows directly.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Final

import trio

from stacklib.bench import real_am, shm_rates
from stacklib.bench.engines import PURE, engines, measure
from stacklib.bench.peers.shm import PeerSpec, spawn_peer
from stacklib.bench.real_am import uam_pingpong
from stacklib.bench.result import Cell, Column, Result
from stacklib.transports.shm import (
    ShmAddress,
    ShmEndpoint,
    ShmNetwork,
    relax,
)
from stacklib.unet import EndpointConfig

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

_BULK = 65536


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """Run this process on ``cpu`` (None: leave it alone), restoring the old set after."""
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


def placement(same_cpu: bool) -> tuple[int | None, int | None]:
    """(this process's CPU, the peer's CPU): two different CPUs, or both on CPU 0."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return None, None
    return (cpus[0], cpus[0]) if same_cpu else (cpus[0], cpus[1])


def open_endpoint(
    network: ShmNetwork,
    config: EndpointConfig | None = None,
    name: str = "main",
    remote: str = "peer",
) -> tuple[ShmEndpoint, int]:
    """A bench endpoint on a new node ``name`` with a channel to ``remote``'s port 1."""
    node = network.add_node(name)
    endpoint = node.os.create_endpoint(node.os.process("bench"), config, port=1)
    if not isinstance(endpoint, ShmEndpoint):
        raise TypeError(f"expected a ShmEndpoint, got {endpoint!r}")
    channel = node.os.create_channel(endpoint.owner, endpoint, ShmAddress(remote, 1))
    return endpoint, channel


def _wait_attached(endpoint: ShmEndpoint, channel: int, timeout: float = 30.0) -> None:
    link = endpoint.shm_ni.link(endpoint, channel)
    deadline = time.monotonic() + timeout
    while not link.peer_attached:
        if time.monotonic() > deadline:
            raise TimeoutError("the shm peer process did not attach")
        time.sleep(0.001)


def shm_pingpong(iterations: int, size: int = 40, mode: str = "poll", warmup: int = 200) -> float:
    """Mean round trip (s) of ``size``-byte messages to an echoing peer process over shm.

    ``mode``: ``poll`` (both sides busy-poll with ``send_payload``/``poll_payload``), ``trio``
    (both sides ``await send``/``recv``, the :class:`Message` face) or ``trio-payload`` (both
    sides ``await send_payload_async``/``recv_payload``).
    """
    mine, theirs = placement(False)
    with ShmNetwork() as network, pinned(mine):
        endpoint, channel = open_endpoint(network)
        peer = spawn_peer(
            PeerSpec(network.directory, "peer", 1, "main", 1, role="echo", mode=mode, cpu=theirs)
        )
        try:
            _wait_attached(endpoint, channel)
            message = bytes(size)
            if mode in ("trio", "trio-payload"):
                return trio.run(
                    _trio_pingpong,
                    endpoint,
                    channel,
                    message,
                    iterations,
                    warmup,
                    mode == "trio-payload",
                )
            # The descriptor-free calls, as the echoing peer uses: raw U-Net at its leanest.
            send, poll = endpoint.send_payload, endpoint.poll_payload
            # (spins: empty polls in this wait, so the CPU is given away only when the peer
            # is slow to answer, as when it shares this CPU.)
            for _ in range(warmup):
                send(channel, message)
                spins = 0
                while poll() is None:
                    spins += 1
                    relax(spins)
            start = time.perf_counter()
            for _ in range(iterations):
                send(channel, message)
                spins = 0
                while poll() is None:
                    spins += 1
                    relax(spins)
            return (time.perf_counter() - start) / iterations
        finally:
            peer.kill()
            peer.join(5)


async def _trio_pingpong(
    endpoint: ShmEndpoint,
    channel: int,
    message: bytes,
    iterations: int,
    warmup: int,
    payload: bool = False,
) -> float:
    """Mean round trip through the ``await`` face: ``send``/``recv`` (the :class:`Message`
    face) or, with ``payload``, ``send_payload_async``/``recv_payload``."""
    if payload:
        send, recv = endpoint.send_payload_async, endpoint.recv_payload
    else:
        send, recv = endpoint.send, endpoint.recv  # type: ignore[assignment]
    for _ in range(warmup):
        await send(channel, message)
        await recv()
    start = time.perf_counter()
    for _ in range(iterations):
        await send(channel, message)
        await recv()
    return (time.perf_counter() - start) / iterations


#: The faces :func:`shm_await_cpu` measures.
AWAIT_FACES = ("poll", "message", "payload")


def shm_await_cpu(iterations: int = 20000, face: str = "message", size: int = 40) -> float:
    """Mean round trip (s) between two shm endpoints of this process, in one trio task: the
    CPU cost of a face, without the cross-CPU latency of :func:`shm_pingpong`.

    Each round trip is a send from ``a``, a receive at ``b``, a send back and a receive at
    ``a``: ``face="message"`` awaits ``send``/``recv``, ``"payload"`` awaits
    ``send_payload_async``/``recv_payload``, ``"poll"`` calls ``send_payload``/``poll_payload``
    (the busy-poll face, no await).  Every receive finds its message, so this is the faces'
    own overhead: the cancellation tests, the yields every ``YIELD_EVERY`` calls, the objects.
    """
    if face not in AWAIT_FACES:
        raise ValueError(f"no face {face!r} (known: {', '.join(AWAIT_FACES)})")
    with ShmNetwork() as network:
        a, ch_a = open_endpoint(network, name="a", remote="b")
        b, ch_b = open_endpoint(network, name="b", remote="a")
        return trio.run(_await_cpu, a, ch_a, b, ch_b, bytes(size), iterations, face)


async def _await_cpu(
    a: ShmEndpoint,
    ch_a: int,
    b: ShmEndpoint,
    ch_b: int,
    message: bytes,
    iterations: int,
    face: str,
) -> float:
    async def rounds(count: int) -> float:
        start = time.perf_counter()
        if face == "message":
            send_a, recv_a, send_b, recv_b = a.send, a.recv, b.send, b.recv
            for _ in range(count):
                await send_a(ch_a, message)
                await send_b(ch_b, (await recv_b()).data)
                await recv_a()
        elif face == "payload":
            asend_a, arecv_a = a.send_payload_async, a.recv_payload
            asend_b, arecv_b = b.send_payload_async, b.recv_payload
            for _ in range(count):
                await asend_a(ch_a, message)
                await asend_b(ch_b, (await arecv_b())[1])
                await arecv_a()
        else:
            psend_a, poll_a, psend_b, poll_b = (
                a.send_payload,
                a.poll_payload,
                b.send_payload,
                b.poll_payload,
            )
            for _ in range(count):
                psend_a(ch_a, message)
                arrival = poll_b()
                assert arrival is not None  # in this process: sent means arrived
                psend_b(ch_b, arrival[1])
                poll_a()
        return (time.perf_counter() - start) / count

    await rounds(min(iterations, 500))  # warm-up
    return await rounds(iterations)


def shm_stream(count: int, size: int) -> float:
    """Seconds for a peer process to stream ``count`` messages of ``size`` bytes to this one,
    from the first arrival to the last (the receiver busy-polls)."""
    # 64 KiB messages stream best through a ring that stays in the caches (1 MiB: 15 of them
    # in flight); small ones through a larger ring that rarely fills.
    ring = 1 << 20 if size >= _BULK else 4 << 20
    peer_config = EndpointConfig(
        segment_size=1 << 20, tx_buffers=4, tx_buffer_size=max(size, 64), rx_buffers=1
    )
    mine, theirs = placement(False)
    with ShmNetwork(ring_bytes=ring, max_message=max(size, 64)) as network, pinned(mine):
        endpoint, channel = open_endpoint(network)
        peer = spawn_peer(
            PeerSpec(
                network.directory,
                "peer",
                1,
                "main",
                1,
                role="source",
                count=count,
                size=size,
                ring_bytes=ring,
                max_message=max(size, 64),
                cpu=theirs,
                config=peer_config,
            )
        )
        into = bytearray(size) if size > network.inline_threshold else None
        return drain_stream(endpoint, channel, peer, count, "shm", into)


def drain_stream(
    endpoint: ShmEndpoint,
    channel: int,
    peer: BaseProcess,
    count: int,
    what: str,
    into: bytearray | None = None,
) -> float:
    """Busy-poll ``count`` messages, then an empty one, that ``peer`` streams on ``channel``;
    answer "done" and reap ``peer``.  Returns seconds from the first arrival to the last,
    scaled to ``count``; ``what`` names the path in errors.  With ``into``, each message is
    copied into that one buffer (:meth:`ShmEndpoint.poll_into`, as MPI's ``Recv`` does)
    instead of into new bytes."""
    try:
        # Bound method or C-level partial: no Python frame between the loop and the ring.
        poll = (
            endpoint.poll_payload if into is None else functools.partial(endpoint.poll_into, into)
        )
        elapsed, received = _drain(poll, peer, what)
        endpoint.send_nowait(channel, b"done")
        if received != count:
            raise RuntimeError(f"{what} stream lost messages: {received} of {count}")
        # The first message's arrival starts the clock, so count-1 intervals were timed.
        return elapsed * count / max(count - 1, 1)
    finally:
        peer.join(5)
        if peer.is_alive():
            peer.kill()
            peer.join(5)


def _first(poll: Callable[[], object | None], peer: BaseProcess, what: str) -> object:
    deadline = time.monotonic() + 30
    while (first := poll()) is None:
        if time.monotonic() > deadline or not peer.is_alive():
            raise RuntimeError(f"the {what} source process sent nothing")
    return first


def _idle(idle: int, peer: BaseProcess, what: str) -> None:
    relax(idle)
    if idle & 0xFFFFF == 0 and not peer.is_alive():
        raise RuntimeError(f"the {what} source process died mid-stream")


def _drain(
    poll: Callable[[], tuple[int, object] | None], peer: BaseProcess, what: str
) -> tuple[float, int]:
    """(seconds from the first message to the empty one, messages before it), taking each
    arrival as ``(channel, data or length)`` from ``poll``."""
    first = _first(poll, peer, what)
    start = time.perf_counter()
    received = 1 if isinstance(first, tuple) and first[1] else 0
    idle = 0
    while True:
        arrival = poll()
        if arrival is None:
            idle += 1
            _idle(idle, peer, what)
            continue
        if not arrival[1]:
            return time.perf_counter() - start, received
        received += 1


def _udp_echo(port_out: object, cpu: int | None) -> None:
    """A kernel UDP echo server in its own process (blocking socket)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port_out.put(sock.getsockname()[1])  # type: ignore[attr-defined]
    while True:
        data, peer = sock.recvfrom(65536)
        if data == b"stop":
            return
        sock.sendto(data, peer)


def udp_pingpong(
    iterations: int, size: int = 40, warmup: int = 200, same_cpu: bool = False
) -> float:
    """Mean round trip (s) over kernel UDP sockets between two processes (blocking I/O)."""
    import multiprocessing

    mine, theirs = placement(same_cpu)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    peer = context.Process(target=_udp_echo, args=(queue, theirs), daemon=True)
    peer.start()
    try:
        with pinned(mine):
            address = ("127.0.0.1", queue.get(timeout=30))
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.settimeout(5)
                message = bytes(size)
                send, recv = sock.send, sock.recv
                for _ in range(warmup):
                    send(message)
                    recv(65536)
                start = time.perf_counter()
                for _ in range(iterations):
                    send(message)
                    recv(65536)
                elapsed = (time.perf_counter() - start) / iterations
                send(b"stop")
        return elapsed
    finally:
        peer.join(5)
        if peer.is_alive():
            peer.kill()
            peer.join(5)


def _best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


#: The measurements of :func:`bench_real`, by key (``stacklib bench real --only KEY``).
MEASUREMENTS = (
    "shm",
    "udp",
    "trio",
    "triopay",
    "await",
    "udp1",
    "uam",
    "uamtrio",
    "splitc",
    "splitctrio",
    "rate",
    "bulk",
)

#: The measurements without stacklib code (kernel sockets): measured once, not per engine.
_KERNEL = frozenset({"udp", "udp1"})

#: Baselines :func:`bench_real` can run beside its own rows (``--compare``).
COMPARISONS = ("mpi",)

#: The mpi4py rows: (key in stacklib/bench/mpi/p2p.py's result, name, the stacklib row whose
#: ratio it anchors).  Buffer ``Send``/``Recv`` is mpi4py at its best; pickled
#: ``send``/``recv`` is what most mpi4py code writes.  A remote read is a 16-byte request
#: answered with 8 bytes by ``Send``/``Recv`` (the Split-C rows' anchor), or one-sided ``Get``.
_MPI_ROWS = (
    ("buffer", "ping-pong, mpi4py Send/Recv on buffers (2 CPUs)"),
    ("pickle", "ping-pong, mpi4py pickled send/recv (2 CPUs)"),
    ("read", "remote 8 B read, mpi4py Send/Recv request and reply (2 CPUs)"),
    ("rma", "remote 8 B read, mpi4py one-sided Get + Flush (2 CPUs)"),
    ("rate", "one-way message rate, mpi4py Send"),
    ("bulk", "bulk bandwidth, mpi4py Send, 64 KiB messages"),
)


def _mpi_runs(
    iterations: int, messages: int, bulk_messages: int, size: int
) -> Callable[[], dict[str, float]]:
    """A function running stacklib/bench/mpi/p2p.py once on two ranks bound to two cores;
    raises :class:`~stacklib.bench.mpi.MpiUnavailable` now if mpirun or mpi4py is missing."""
    from stacklib.bench.mpi import find_mpi, run_script

    setup = find_mpi()
    args = [
        f"--iterations={iterations}",
        f"--messages={messages}",
        f"--bulk-messages={bulk_messages}",
        f"--size={size}",
    ]

    def run() -> dict[str, float]:
        result = run_script("p2p", 2, args, pinned=True, setup=setup)
        return {key: float(result[key]) for key, _ in _MPI_ROWS}

    return run


#: The target of the ``await`` faces' round trip: within this factor of busy-poll's.
AWAIT_FACTOR: Final = 2.0
AWAIT_TARGET: Final = f"<= {AWAIT_FACTOR:g}x busy-poll"


def _judged_against_busy_poll(
    target: str, met: Callable[[float], bool], best: dict[str, float], busy_key: str
) -> tuple[str, Callable[[float], bool]]:
    """An ``await`` face's (target, met): its round trip against ``best[busy_key]`` (the
    busy-poll round trip on the same modules), not judged where that was not run; any other
    row's own."""
    if target != AWAIT_TARGET:
        return target, met
    if busy_key not in best:
        return "-", met
    busy = best[busy_key]
    return target, lambda t: t <= AWAIT_FACTOR * busy


def bench_real(
    iterations: int = 20000,
    messages: int = 200000,
    bulk_messages: int = 20000,
    repeat: int = 3,
    size: int = 40,
    only: Sequence[str] | None = None,
    compare: str | None = None,
    pure: bool = False,
) -> Result:
    """All the measurements (or those named in ``only``), best of ``repeat`` each, interleaved
    in one run.

    ``compare="mpi"`` adds mpi4py over Open MPI between two ranks bound to two cores, run by
    ``mpirun`` on the system Python once per repeat (stacklib/bench/mpi/p2p.py): the same
    ping-pong with buffer ``Send``/``Recv`` and pickled ``send``/``recv``, the message rate
    and the bulk transfer, and a column with each row's time over mpi4py's best for the same
    thing (ratio above 1: mpi4py is faster).  Without mpirun or mpi4py those rows are left
    out and a note says why.

    Both processes are pinned to two different CPUs (the U-Net case: two applications, two
    processors); kernel UDP is also measured with both processes on one CPU, where a wake-up
    is a cheap same-CPU switch, for completeness.  The UAM and Split-C rows run
    ``iterations // 10`` round trips, as the kernel rows do.  With ``compare="mpi"`` the
    Split-C read rows are set against mpi4py's read of the same bytes (a 16-byte request and
    an 8-byte reply with ``Send``/``Recv``), the polled one with a target of at most 3x.

    Where a compiled copy of these sources exists (``stacklib compile``) and ``pure`` is
    False, every stacklib row is measured twice, on the pure modules and on the compiled copy
    (both processes of the channel; :mod:`stacklib.bench.engines`), the compiled row named
    ", compiled" right after the pure one.
    """
    unknown = sorted(set(only or ()) - set(MEASUREMENTS))
    if unknown:
        raise ValueError(f"no measurement {unknown[0]!r} (known: {', '.join(MEASUREMENTS)})")
    if compare is not None and compare not in COMPARISONS:
        raise ValueError(f"no comparison {compare!r} (known: {', '.join(COMPARISONS)})")
    few = max(iterations // 10, 10)
    runs: dict[str, list[float]] = {}
    skipped: list[str] = []
    mpi: Callable[[], dict[str, float]] | None = None
    if compare == "mpi":
        from stacklib.bench.mpi import MpiUnavailable

        try:
            mpi = _mpi_runs(iterations, messages, bulk_messages, size)
        except MpiUnavailable as error:
            skipped.append(f"mpi4py rows skipped: {error}")
    runs_on = engines(pure)
    plan: list[tuple[str, Callable[..., float], tuple[object, ...]]] = [
        ("shm", shm_pingpong, (iterations, size, "poll")),
        ("udp", udp_pingpong, (few, size)),
        ("trio", shm_pingpong, (few, size, "trio")),
        ("triopay", shm_pingpong, (few, size, "trio-payload")),
        *[(f"await.{face}", shm_await_cpu, (iterations, face, size)) for face in AWAIT_FACES],
        ("udp1", udp_pingpong, (few, size, 200, True)),
        ("uam", uam_pingpong, (few, "request", "poll")),
        ("uamtrio", uam_pingpong, (few, "request", "trio")),
        ("splitc", real_am.splitc_read, (few, "poll")),
        ("splitctrio", real_am.splitc_read, (few, "trio")),
        ("rate", shm_stream, (messages, size)),
        ("bulk", shm_stream, (bulk_messages, _BULK)),
    ]
    plan = [step for step in plan if only is None or step[0].partition(".")[0] in only]
    for _ in range(repeat):
        for key, fn, args in plan:
            if key in _KERNEL:  # no stacklib code to compile
                runs.setdefault(key, []).append(fn(*args))
                continue
            for engine in runs_on:
                runs.setdefault(key + engine.suffix, []).append(measure(engine, fn, *args))
        if mpi is not None:
            for key, seconds in mpi().items():
                runs.setdefault(f"mpi.{key}", []).append(seconds)
    best = {key: min(values) for key, values in runs.items()}
    ratio = best["udp"] / best["shm"] if "udp" in best and "shm" in best else None
    rtt = "us RTT"
    specs: list[tuple[str, str, Callable[[float], float], str, str, Callable[[float], bool]]] = [
        (
            "shm",
            f"{size} B ping-pong, shm, busy-poll (2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            "<= 10 us and >= 10x below UDP",
            lambda t: t <= 10e-6 and (ratio is None or ratio >= 10),
        ),
        (
            "trio",
            f"{size} B ping-pong, shm, trio await send/recv (Message face; 2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            AWAIT_TARGET,  # judged against the busy-poll row on the same modules, below
            lambda t: True,
        ),
        (
            "triopay",
            f"{size} B ping-pong, shm, trio await send_payload_async/recv_payload (2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            AWAIT_TARGET,  # judged against the busy-poll row on the same modules, below
            lambda t: True,
        ),
        *[
            (
                f"await.{face}",
                f"{size} B round trip in one process, one trio task, {what}",
                lambda t: t * 1e6,
                rtt,
                "-",
                lambda t: True,
            )
            for face, what in (
                ("poll", "send_payload/poll_payload"),
                ("message", "await send/recv"),
                ("payload", "await send_payload_async/recv_payload"),
            )
        ],
        (
            "udp",
            f"{size} B ping-pong, kernel UDP, blocking sockets (2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            "baseline",
            lambda t: True,
        ),
        (
            "udp1",
            f"{size} B ping-pong, kernel UDP, blocking sockets (1 CPU)",
            lambda t: t * 1e6,
            rtt,
            "-",
            lambda t: True,
        ),
        (
            "uam",
            "UAM request/reply (4 words), shm, explicit poll (2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            "<= 20 us",
            lambda t: t <= 20e-6,
        ),
        (
            "uamtrio",
            "UAM request/reply (4 words), shm, trio await + poller (2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            "-",
            lambda t: True,
        ),
        (
            "splitc",
            "Split-C blocking read of a remote 8 B element, shm, explicit poll (2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            "<= 3x mpi4py read" if mpi is not None else "-",
            lambda t: "mpi.read" not in best or t <= 3 * best["mpi.read"],
        ),
        (
            "splitctrio",
            "Split-C blocking read (await sc.read), shm (2 CPUs)",
            lambda t: t * 1e6,
            rtt,
            "-",
            lambda t: True,
        ),
        (
            "rate",
            f"one-way message rate, shm, {size} B",
            lambda t: messages / t,
            "msgs/s",
            ">= 100,000",
            lambda t: messages / t >= 100_000,
        ),
        (
            "bulk",
            "bulk bandwidth, shm, 64 KiB messages",
            lambda t: bulk_messages * _BULK / t / 1e9,
            "GB/s",
            ">= 1",
            lambda t: bulk_messages * _BULK / t >= 1e9,
        ),
    ]
    # Each stacklib row again on the compiled copy, right after its pure row; the await faces
    # judged against the busy-poll round trip of the same modules in this run.
    specs = [
        (
            key + engine.suffix,
            name + engine.suffix,
            value,
            unit,
            *_judged_against_busy_poll(target, met, best, "shm" + engine.suffix),
        )
        for key, name, value, unit, target, met in specs
        for engine in (runs_on if key not in _KERNEL else [PURE])
    ]
    if mpi is not None:
        units: dict[str, tuple[Callable[[float], float], str]] = {
            spec[0]: (spec[2], spec[3]) for spec in specs
        }
        for key, name in _MPI_ROWS:
            convert, unit = units.get(key, (lambda t: t * 1e6, rtt))
            shown = f"{size} B {name}" if key in ("buffer", "pickle") else name
            specs.append((f"mpi.{key}", shown, convert, unit, "mpi4py", lambda t: True))
    # Each row's time over mpi4py's best for the same work: a round trip against Send/Recv on
    # buffers, a stream against mpi4py's stream of as many messages.
    # A Split-C read against mpi4py's request/reply of the same bytes.
    anchors = {key: "mpi." + key.removeprefix("mpi.") for key in ("rate", "bulk")}
    anchors |= {value: value for value in anchors.values()}
    anchors |= {key: "mpi.read" for key in ("splitc", "splitctrio", "mpi.read", "mpi.rma")}
    rows: list[dict[str, Cell]] = []
    for key, name, value, unit, target, met in specs:
        if key not in best:
            continue
        judged = target not in ("-", "baseline", "mpi4py")
        row: dict[str, Cell] = {
            "measurement": name,
            "value": value(best[key]),
            "unit": unit,
            "target": target,
            "met": ("yes" if met(best[key]) else "no") if judged else "-",
        }
        if mpi is not None:
            anchor = anchors.get(key.removesuffix(", compiled"), "mpi.buffer")
            row["vs_mpi"] = best[key] / best[anchor] if anchor in best else None
        rows.append(row)
    rows += shm_rates.batched_rows(only, repeat, messages, size, runs_on)
    facts: dict[str, Cell] = {
        "iterations": iterations,
        "messages": messages,
        "bulk_messages": bulk_messages,
        "repeat": repeat,
    }
    if ratio is not None:
        facts["udp_to_shm_rtt_ratio"] = ratio
    if "udp1" in best and "shm" in best:
        facts["udp_1cpu_to_shm_rtt_ratio"] = best["udp1"] / best["shm"]
    columns = [
        Column("measurement", "measurement"),
        Column("value", "value", "", 2),
        Column("unit", "unit"),
        Column("target", "target"),
        Column("met", "met"),
    ]
    notes = [
        "best of each over the repeats; each side is its own process (spawn start method)",
        "2 CPUs: this process on one CPU, the peer on the other (sched_setaffinity)",
    ]
    if len(runs_on) > 1:
        notes.append(
            f"compiled: both processes run the mypyc copy in {runs_on[-1].copy} (stacklib "
            "compile); the other stacklib rows run the pure modules (--pure: those only)"
        )
    if mpi is not None:
        columns.append(Column("vs_mpi", "x mpi4py best", "", 2))
        notes.append(
            "mpi4py: Open MPI shared memory between two ranks bound to two cores (mpirun "
            "--bind-to core), on the system Python; x mpi4py best: this row's time over "
            "mpi4py's for the same work (round trips against Send/Recv on buffers, Split-C reads "
            "against mpi4py's Send/Recv request and reply of the same bytes)"
        )
    return Result(
        title="U-Net between two processes: shared memory vs kernel UDP (one run)",
        columns=columns,
        rows=rows,
        facts=facts,
        notes=notes + skipped,
    )


if __name__ == "__main__":
    print(bench_real().format_table())
