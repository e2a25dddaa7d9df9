"""U-Net Active Messages on the simulated SBA-200: paper 000 §5.2's micro-benchmarks, Table 3.

Four benchmarks, as paper 000 §5.2 describes them, run in virtual time on two SPARCstation-20s
with SBA-200s (the ``unet-atm-uam`` recipe is the same configuration):

1. single-cell round trip: a request with four words to a handler that replies with them;
2. block transfer round trip: a store of N bytes, whose arrival makes the receiver store N
   bytes back; fitted as a + b N over several sizes;
3. store bandwidth: ``STREAM`` stores of one size back to back, until all are acknowledged;
4. get bandwidth: ``STREAM`` gets of one size, until all have arrived.

:func:`bench_reliability` (not run by ``stacklib reproduce``) drives two UAM machines over a
lossy, duplicating, reordering link in virtual time and counts what the protocol did.
docs/uam.md has the results and how each paper figure was read.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Awaitable, Callable, Sequence

import trio

from stacklib.layers.uam import UamLayer, UamParams, UamService
from stacklib.layers.uam.machine import (
    GetReceived,
    GetReplyReceived,
    PeerFailed,
    ReplyReceived,
    RequestReceived,
    UamMachine,
)
from stacklib.layers.uam.wire import CHUNK_SIZE
from stacklib.reporting.figures import Experiment, Figure, register_experiment
from stacklib.services import UNetService
from stacklib.sim import Simulation
from stacklib.transports.sim import AtmParams, FastEthernetParams, build_atm, build_fe
from stacklib.unet import EndpointConfig, connect

__all__ = [
    "STREAM",
    "bench_reliability",
    "block_rtts",
    "get_bandwidths",
    "single_cell_rtt",
    "store_bandwidths",
]

STREAM = 200  #: blocks per bandwidth measurement (virtual time: the steady state shows fast)
ROUND_TRIPS = 5
#: Endpoint buffers for bulk traffic: a 4200-byte PDU takes two 4096-byte receive buffers and
#: a window of 8 must fit (paper 000 §5.1.1's preallocated buffers).
ENDPOINT = EndpointConfig(
    segment_size=512 * 1024, tx_buffers=32, rx_buffers=48, free_queue=64, recv_queue=64
)

_Body = Callable[[UamService, UamService, int, int], Awaitable[object]]


def run_pair(body: _Body, *, fe: bool = False, params: UamParams | None = None) -> object:
    """Run ``body(am_a, am_b, to_b, to_a)`` on a fresh simulated SBA-200 (or FE hub) pair."""
    sim = Simulation(seed=1)
    cluster = (
        build_fe(sim, FastEthernetParams(host="p120"), ["a", "b"], None)
        if fe
        else build_atm(sim, AtmParams(host="ss20"), ["a", "b"], None)
    )
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    ep_a = a.os.create_endpoint(a.os.process("uam@a"), ENDPOINT)
    ep_b = b.os.create_endpoint(b.os.process("uam@b"), ENDPOINT)
    to_b, to_a = connect(ep_a, ep_b)
    layer_params = params or UamParams()
    result: list[object] = []

    async def main() -> None:
        async with (
            UamLayer(layer_params).open(UNetService(ep_a)) as am_a,
            UamLayer(layer_params).open(UNetService(ep_b)) as am_b,
        ):
            result.append(await body(am_a, am_b, to_b, to_a))

    sim.run(main)
    return result[0]


def single_cell_rtt(*, fe: bool = False, round_trips: int = ROUND_TRIPS) -> float:
    """Mean round trip of a four-word request answered by a four-word reply, microseconds."""

    async def body(am_a: UamService, am_b: UamService, to_b: int, to_a: int) -> float:
        replies: list[tuple[int, ...]] = []
        am_b.register_handler(lambda peer, *args: am_b.reply("pong", *args), name="ping")
        am_b.register_handler(lambda peer, *args: None, name="pong")
        am_a.register_handler(lambda peer, *args: None, name="ping")
        am_a.register_handler(lambda peer, *args: replies.append(args), name="pong")
        samples = []
        for i in range(round_trips + 2):
            start = trio.current_time()
            await am_a.request(to_b, "ping", 1, 2, 3, i)
            await am_a.wait_until(lambda i=i: len(replies) > i)  # type: ignore[misc]
            samples.append(trio.current_time() - start)
        return sum(samples[2:]) / round_trips * 1e6

    return float(run_pair(body, fe=fe))  # type: ignore[arg-type]


def block_rtts(sizes: Sequence[int], *, round_trips: int = ROUND_TRIPS) -> dict[int, float]:
    """Round trip of an N-byte store answered by an N-byte store back, microseconds."""

    async def body(am_a: UamService, am_b: UamService, to_b: int, to_a: int) -> dict[int, float]:
        out: dict[int, float] = {}
        for am in (am_a, am_b):
            am.register_region(bytearray(max(sizes)), name="block")
        arrived = {"a": 0, "b": 0}

        def on_a(*_: int) -> None:
            arrived["a"] += 1

        def on_b(*_: int) -> None:
            arrived["b"] += 1

        am_a.register_handler(on_a, name="done")
        am_b.register_handler(on_b, name="done")

        async def echo(count: int, size: int) -> None:
            for i in range(count):
                await am_b.wait_until(lambda i=i: arrived["b"] > i)  # type: ignore[misc]
                await am_b.store(to_a, bytes(size), ("block", 0), "done")

        for size in sizes:
            arrived["a"] = arrived["b"] = 0
            count = round_trips + 2
            data = bytes(size)
            samples = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo, count, size)
                for i in range(count):
                    start = trio.current_time()
                    await am_a.store(to_b, data, ("block", 0), "done")
                    await am_a.wait_until(lambda i=i: arrived["a"] > i)  # type: ignore[misc]
                    samples.append(trio.current_time() - start)
            out[size] = sum(samples[2:]) / round_trips * 1e6
        return out

    return run_pair(body)  # type: ignore[return-value]


def _bandwidth(sizes: Sequence[int], mode: str, fe: bool, stream: int) -> dict[int, float]:
    async def body(am_a: UamService, am_b: UamService, to_b: int, to_a: int) -> dict[int, float]:
        out: dict[int, float] = {}
        for am in (am_a, am_b):
            am.register_region(bytearray(max(sizes)), name="block")
        done = [0]
        am_a.register_handler(lambda *_: done.__setitem__(0, done[0] + 1), name="done")
        am_b.register_handler(lambda *_: None, name="done")
        for size in sizes:
            data = bytes(size)
            done[0] = 0
            start = trio.current_time()
            for _ in range(stream):
                if mode == "store":
                    await am_a.store(to_b, data, ("block", 0), "done")
                else:
                    await am_a.get(to_b, ("block", 0), size, ("block", 0), "done")
            if mode == "store":
                await am_a.drain(to_b)
            else:
                await am_a.wait_until(lambda: done[0] == stream)
            out[size] = stream * size / (trio.current_time() - start) / 1e6
        return out

    return run_pair(body, fe=fe)  # type: ignore[return-value]


def store_bandwidths(
    sizes: Sequence[int], *, fe: bool = False, stream: int = STREAM
) -> dict[int, float]:
    """Block store bandwidth per size, MB/s (10^6 bytes/s)."""
    return _bandwidth(sizes, "store", fe, stream)


def get_bandwidths(
    sizes: Sequence[int], *, fe: bool = False, stream: int = STREAM
) -> dict[int, float]:
    """Block get bandwidth per size, MB/s."""
    return _bandwidth(sizes, "get", fe, stream)


def aal5_limit(size: int, cell_us: float = 3.03) -> float:
    """The fiber's peak for ``size``-byte AAL5 PDUs, MB/s: 48 payload bytes per TAXI cell time
    (paper 000 Fig 4's "AAL-5 limit"; 140 Mbit/s TAXI, 53-byte cells: 3.03 us)."""
    cells = -(-(size + 8) // 48)
    return size / (cells * cell_us)


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y against x."""
    xs, ys = list(points), list(points.values())
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return mean_y - slope * mean_x, slope


def dip_floor() -> float:
    """The 4164/4160-byte bandwidth ratio that cell quantization alone gives: 4160 bytes take
    one PDU of 4200 bytes, 4164 take that plus a second PDU of 44 (header and 4 bytes)."""
    one = -(-(CHUNK_SIZE + 40 + 8) // 48)
    two = one + -(-(4 + 40 + 8) // 48)
    return (4164 / two) / (4160 / one)


FIT_SIZES = (500, 1000, 2000, 3000, 4000)


def uam_sba200() -> list[Figure]:
    rtt = single_cell_rtt()
    blocks = block_rtts(FIT_SIZES)
    intercept, per_byte = fit_line(blocks)
    store = store_bandwidths([2048, 4096, 4160, 4164])
    get = get_bandwidths([4096])
    cite = "paper 000 §5.2"
    return [
        Figure("single-cell round trip", 71, rtt, "us", f"{cite} item 1 (calibrated)"),
        Figure(
            "block round trip: fixed part",
            135,
            intercept,
            "us",
            f"{cite} item 2 (fit; bulk_us calibrated)",
        ),
        Figure("block round trip: per byte", 0.2, per_byte, "us/B", f"{cite} item 2 (fit)"),
        Figure(
            "store bandwidth at 2 KB / AAL5 limit (at least)",
            0.8,
            store[2048] / aal5_limit(2048),
            "",
            f"{cite} item 3: 80% of the AAL-5 limit with blocks of about 2 KB",
            at_least=True,
        ),
        Figure("store bandwidth at 4 KB", 14.8, store[4096], "MB/s", f"{cite} item 3"),
        Figure(
            "store bandwidth dip: 4164 B / 4160 B",
            dip_floor(),
            store[4164] / store[4160],
            "ratio",
            f"{cite} item 3 states the dip, not its depth: paper value = the AAL5 cells "
            "alone (see docs/uam.md)",
            tolerance=0.05,
        ),
        Figure("get / store bandwidth at 4 KB", 1.0, get[4096] / store[4096], "ratio", cite),
        Figure("Table 3: Active Messages round trip", 71, rtt, "us", "paper 000 Table 3"),
        Figure(
            "Table 3: Active Messages bandwidth, 4 KB",
            118,
            store[4096] * 8,
            "Mbit/s",
            "paper 000 Table 3",
        ),
    ]


register_experiment(
    Experiment(
        "uam",
        "U-Net Active Messages on the SBA-200 (paper 000 §5.2, Figs 3-4, Table 3)",
        uam_sba200,
        seconds=1.2,  # wall time, measured once on a 2-core machine (--json wall_seconds)
    )
)


# --- reliability benchmark (machine level, virtual time) -------------------------------------


def bench_reliability(
    messages: int = 100_000,
    loss: float = 0.0,
    duplicate: float = 0.0,
    reorder: float = 0.0,
    seed: int = 1,
    *,
    window: int = 8,
    delay: float = 20e-6,
    rto: float = 1e-3,
) -> dict[str, float]:
    """Send ``messages`` requests (every other one answered) between two UAM machines over a
    link that loses, duplicates and delays (reorders) datagrams independently with the given
    probabilities; check exactly-once in-order delivery and return the counters.

    Runs the sans-IO machines from an event heap in virtual time (no trio, no NI model): it
    measures the protocol, not the hardware.  ``wall_seconds`` is how long it took.
    """
    rng = random.Random(seed)
    wall = time.perf_counter()
    a = UamMachine(window=window, rto=rto, max_retries=1000, ack_delay=rto / 4)
    b = UamMachine(window=window, rto=rto, max_retries=1000, ack_delay=rto / 4)
    machines = {"a": a, "b": b}
    flight: list[tuple[float, int, str, bytes]] = []
    order = 0
    now = 0.0
    seen: list[int] = []
    replies = 0
    sent = 0
    faults = {"lost": 0, "duplicated": 0, "reordered": 0}

    def put(destination: str, datagram: bytes) -> None:
        nonlocal order
        roll = rng.random()
        if roll < loss:
            faults["lost"] += 1
            return
        copies = 1
        extra = 0.0
        if rng.random() < duplicate:
            faults["duplicated"] += 1
            copies = 2
        if rng.random() < reorder:
            faults["reordered"] += 1
            extra = delay * rng.uniform(1.0, 5.0)  # overtaken by later datagrams
        for _ in range(copies):
            order += 1
            heapq.heappush(flight, (now + delay + extra, order, destination, datagram))

    def step() -> None:
        nonlocal replies
        for side, other in (("a", "b"), ("b", "a")):
            m = machines[side]
            while (event := m.next_event()) is not None:
                if isinstance(event, RequestReceived):
                    seen.append(event.args[0])
                    if event.args[0] % 2:
                        m.reply(event.token, 2, event.args, now)
                elif isinstance(event, ReplyReceived):
                    replies += 1
                elif isinstance(event, PeerFailed | GetReceived | GetReplyReceived):
                    raise RuntimeError(f"unexpected event {event!r}")
            for datagram in m.datagrams_to_send(now):
                put(other, datagram)

    while sent < messages or not (a.idle and b.idle):
        while sent < messages and a.request_room:
            a.request(1, (sent,), now)
            sent += 1
        step()
        timers = [(t, s) for s, m in machines.items() if (t := m.get_timer()) is not None]
        arrival = flight[0][0] if flight else None
        timer = min(timers) if timers else None
        if arrival is not None and (timer is None or arrival <= timer[0]):
            now, _, destination, datagram = heapq.heappop(flight)
            machines[destination].receive(datagram, now)
        elif timer is not None:
            now = timer[0]
            machines[timer[1]].handle_timer(now)
        elif sent >= messages:
            break
    if seen != list(range(messages)):
        raise RuntimeError("delivery was not exactly once and in order")
    sa, sb = a.statistics(), b.statistics()
    return {
        "messages": messages,
        "loss": loss,
        "duplicate": duplicate,
        "reorder": reorder,
        "delivered": len(seen),
        "replies": replies,
        "retransmitted": sa.retransmitted + sb.retransmitted,
        "timeouts": sa.timeouts + sb.timeouts,
        "duplicates_suppressed": sa.duplicates + sb.duplicates,
        "out_of_order_dropped": sa.out_of_order + sb.out_of_order,
        "explicit_acks": sa.acks_sent + sb.acks_sent,
        "lost": faults["lost"],
        "duplicated": faults["duplicated"],
        "reordered": faults["reordered"],
        "virtual_seconds": now,
        "wall_seconds": time.perf_counter() - wall,
    }
