"""Single-copy transfers (cross-memory attach by the OS service) vs the shm ring path.

U-Net/MM (paper 002 §3-§5) sends from any memory of a sender into posted buffers of the
receiver with one copy.  On the shm transport the daemon does that copy with
``process_vm_readv`` (:mod:`stacklib.transports.xmem`); the ordinary shm path copies the message
into the communication segment's send buffer, into the channel ring, and out of it again.  This
benchmark measures both between two processes in one run, best of ``repeat``:

* **single-copy**: this process registers a source buffer and pipelines ``window`` SEND_DIRECT
  requests on its control socket; the daemon copies each straight into the next buffer a
  receiver process posted in its pool; a transfer counts when its DONE arrives (the data is
  then in the receiver's memory).
* **ring path**: a peer process streams messages of the same size through a shm channel to this
  process, which busy-polls (as ``stacklib bench real`` does for 64 KiB).
* **request path**: one 64-byte transfer at a time (the control-socket round trip), and
  64-byte transfers pipelined (the daemon's cost per request).

Placement on the 2-core machine: the sender (and the ring path's receiver) on CPU 0, the daemon
and the ring path's source on CPU 1; the single-copy receiver only reposts buffers and sleeps
between checks.  ``python -m stacklib.bench.single_copy`` prints the table.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from stacklib.bench.peers.shm import PeerSpec, spawn_peer
from stacklib.bench.real import drain_stream, open_endpoint, pinned, placement
from stacklib.bench.result import Cell, Column, Result
from stacklib.daemon import DaemonClient, DaemonError
from stacklib.transports import xmem
from stacklib.transports.shm import (
    RegionSpec,
    ShmAddress,
    ShmNetwork,
    relax,
)
from stacklib.unet import EndpointConfig

#: The cookie of the 0-byte transfer that tells the receiver to stop.
END = 0xFFFFFFFF
SLOTS = 16
SENDER, RECEIVER = ShmAddress("xsend", 1), ShmAddress("xrecv", 1)
_SPEC = RegionSpec(1 << 16, 4096)  # the channel's own rings are not used here


@contextlib.contextmanager
def private_daemon(cpu: int | None = None) -> Iterator[str]:
    """A daemon on a private socket (pinned to ``cpu``), stopped on exit; yields the path."""
    directory = tempfile.mkdtemp(prefix="sc-")
    path = os.path.join(directory, "daemon.sock")
    process = subprocess.Popen(
        [sys.executable, "-m", "stacklib.daemon", "--socket", path],
        stdin=subprocess.DEVNULL,
    )
    try:
        if cpu is not None:
            os.sched_setaffinity(process.pid, {cpu})
        deadline = time.monotonic() + 20
        while not os.path.exists(path):
            if time.monotonic() > deadline or process.poll() is not None:
                raise DaemonError(f"the daemon on {path} did not start")
            time.sleep(0.01)
        yield path
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        with contextlib.suppress(OSError):
            for name in os.listdir(directory):
                os.unlink(os.path.join(directory, name))
            os.rmdir(directory)


def receiver_main(path: str, buffer_bytes: int, ready: object) -> None:
    """The receiving process: open its side and pool, post every slot, repost each filled
    buffer, stop at the END transfer.  Sleeps between checks: it only recycles buffers."""
    client = DaemonClient(path, start=False)
    client.create_endpoint(RECEIVER)
    _, fd = client.open_channel(RECEIVER, SENDER, _SPEC)
    os.close(fd)
    pool = client.open_pool(RECEIVER, SLOTS, SLOTS * buffer_bytes)
    for slot in range(SLOTS):
        pool.post(slot * buffer_bytes, buffer_bytes)
    ready.set()  # type: ignore[attr-defined]
    try:
        while True:
            completion = pool.poll()
            if completion is None:
                time.sleep(50e-6)
                continue
            if completion.cookie == END:
                return
            pool.post(completion.offset, buffer_bytes)
    finally:
        pool.close()
        client.close()


def _stream(
    client: DaemonClient, channel: int, side: int, address: int, size: int, count: int, window: int
) -> float:
    """Seconds for ``count`` transfers of ``size`` bytes to complete with status OK, at most
    ``window`` in flight.  NO_BUFFER (the receiver has not reposted yet) is back-pressure: the
    transfer is sent again, and counted in :data:`RETRIES`."""
    submit, reap = client.submit_direct, client.reap
    start = time.perf_counter()
    done_ok = in_flight = 0
    while done_ok < count:
        while in_flight < window and done_ok + in_flight < count:
            submit(channel, side, address, size, 0)
            in_flight += 1
        status = reap().status
        in_flight -= 1
        done_ok += _check(status)
    return time.perf_counter() - start


#: Transfers sent again after NO_BUFFER, per benchmark run (back-pressure, not loss).
RETRIES = [0]


def _check(status: int) -> int:
    """1 for OK, 0 for NO_BUFFER (to be sent again); anything else is a failure."""
    if status == xmem.XferStatus.OK:
        return 1
    if status == xmem.XferStatus.NO_BUFFER:
        RETRIES[0] += 1
        return 0
    raise RuntimeError(f"transfer failed: {xmem.XferStatus(status).name}")


def _stream_queue(
    queue: xmem.RequestQueue,
    channel: int,
    side: int,
    address: int,
    size: int,
    count: int,
    window: int,
) -> float:
    """Like :func:`_stream`, through the shared request queue (busy-polling for results)."""
    submit, reap = queue.submit, queue.reap
    start = time.perf_counter()
    done_ok = in_flight = spins = 0
    while done_ok < count:
        while in_flight < window and done_ok + in_flight < count:
            if not submit(channel, side, address, size, 0):
                break
            in_flight += 1
        result = reap()
        if result is None:
            spins += 1
            relax(spins)
            continue
        in_flight -= 1
        done_ok += _check(result[1])
    return time.perf_counter() - start


def _round_trip_queue(
    queue: xmem.RequestQueue, channel: int, side: int, address: int, count: int
) -> float:
    """Mean seconds of one 64-byte transfer through the request queue, waited for."""
    return _stream_queue(queue, channel, side, address, 64, count, 1) / count


def _round_trip(client: DaemonClient, channel: int, side: int, address: int, count: int) -> float:
    """Mean seconds of one 64-byte transfer waited for (the control-socket round trip)."""
    return _stream(client, channel, side, address, 64, count, 1) / count


def ring_stream(count: int, size: int) -> float:
    """Seconds for a peer process to stream ``count`` messages of ``size`` bytes to this one
    over a shm channel (the ring path), first arrival to last, scaled to ``count``."""
    ring = max(4 << 20, 4 * size)
    config = EndpointConfig(
        segment_size=4 * size + 4096, tx_buffers=4, tx_buffer_size=size, rx_buffers=1
    )
    mine, theirs = placement(False)
    with ShmNetwork(ring_bytes=ring, max_message=size) as network, pinned(mine):
        endpoint, channel = open_endpoint(network)
        peer = spawn_peer(
            PeerSpec(
                *(network.directory, "peer", 1, "main", 1),
                role="source",
                count=count,
                size=size,
                ring_bytes=ring,
                max_message=size,
                cpu=theirs,
                config=config,
            )
        )
        return drain_stream(endpoint, channel, peer, count, "shm")


def bench_single_copy(
    sizes: tuple[int, ...] = (65536, 1 << 20),
    count: int = 400,
    repeat: int = 5,
    window: int = 8,
    target: float = 5e9,
) -> Result:
    """Single-copy vs ring-path bandwidth per size, and the request path's costs (one run)."""
    if not xmem.available():
        raise RuntimeError("this libc has no process_vm_readv")
    if window < 1 or count < window or not sizes:
        raise ValueError("need window >= 1, count >= window and at least one size")
    largest = max(sizes)
    mine, theirs = placement(False)
    single: dict[int, float] = {}
    queued: dict[int, float] = {}
    ring: dict[int, float] = {}
    trip = pipelined = trip_q = pipelined_q = float("inf")
    RETRIES[0] = 0
    with private_daemon(theirs) as path, pinned(mine):
        context = multiprocessing.get_context("spawn")
        ready = context.Event()
        receiver = context.Process(
            target=receiver_main, args=(path, largest, ready), daemon=True, name="xrecv"
        )
        client = DaemonClient(path, start=False)
        source = bytearray(os.urandom(largest))
        address = xmem.address_of(source)
        try:
            client.create_endpoint(SENDER)
            grant, fd = client.open_channel(SENDER, RECEIVER, _SPEC)
            os.close(fd)
            client.register_memory(address, largest)
            queue = client.open_queue()
            receiver.start()
            if not ready.wait(30):
                raise RuntimeError("the single-copy receiver did not start")
            channel, side = grant.channel, grant.side
            for _ in range(repeat):
                for size in sizes:
                    elapsed = _stream(client, channel, side, address, size, count, window)
                    single[size] = min(single.get(size, elapsed), elapsed)
                    elapsed = _stream_queue(queue, channel, side, address, size, count, window)
                    queued[size] = min(queued.get(size, elapsed), elapsed)
                    ring[size] = min(ring.get(size, float("inf")), ring_stream(count, size))
                trip = min(trip, _round_trip(client, channel, side, address, 200))
                pipelined = min(
                    pipelined, _stream(client, channel, side, address, 64, 2000, window) / 2000
                )
                trip_q = min(trip_q, _round_trip_queue(queue, channel, side, address, 200))
                pipelined_q = min(
                    pipelined_q,
                    _stream_queue(queue, channel, side, address, 64, 2000, window) / 2000,
                )
            cache = client.status()["cache"]
            doorbells = queue.doorbells
            queue.close()
            client.submit_direct(channel, side, address, 0, END)
            client.reap()
            receiver.join(10)
        finally:
            if receiver.is_alive():
                receiver.kill()
                receiver.join(5)
            client.close()
    rows: list[dict[str, Cell]] = []
    for size in sizes:
        one = size * count / single[size]
        shared = size * count / queued[size]
        two = size * count / ring[size]
        best = max(one, shared)
        rows.append(
            {
                "size": f"{size // 1024} KiB",
                "single": one / 1e9,
                "queued": shared / 1e9,
                "ring": two / 1e9,
                "ratio": best / two,
                "target": f">= {target / 1e9:g} GB/s" if size == 1 << 20 else "-",
                "met": ("yes" if best >= target else "no") if size == 1 << 20 else "-",
            }
        )
    return Result(
        title="Single-copy transfers by the OS service vs the shm ring path (one run)",
        columns=[
            Column("size", "transfer"),
            Column("single", "single-copy, socket", "GB/s", 2),
            Column("queued", "single-copy, queue", "GB/s", 2),
            Column("ring", "ring path", "GB/s", 2),
            Column("ratio", "best/ring", "x", 2),
            Column("target", "target"),
            Column("met", "met"),
        ],
        rows=rows,
        facts={
            "socket: 64 B transfer round trip (us)": trip * 1e6,
            f"socket: per 64 B transfer, {window} in flight (us)": pipelined * 1e6,
            "queue: 64 B transfer round trip (us)": trip_q * 1e6,
            f"queue: per 64 B transfer, {window} in flight (us)": pipelined_q * 1e6,
            "queue: doorbells rung": doorbells,
            "transfers sent again after NO_BUFFER": RETRIES[0],
            "transfers per size and run": count,
            "runs (best of)": repeat,
            "cache hits": cache["hits"],
            "cache misses": cache["misses"],
            "cache evictions": cache["evictions"],
            "cache pinned bytes": cache["pinned_bytes"],
        },
        notes=[
            "single-copy: one process_vm_readv per transfer, sender memory -> receiver's pool;",
            "requests reach the daemon on its control socket or through a shared request queue",
            "ring path: sender copies into its segment, into the ring; receiver copies out",
        ],
    )


if __name__ == "__main__":
    print(bench_single_copy().format_table())
