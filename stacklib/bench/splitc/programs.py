"""The Split-C benchmark programs of paper 000 §6 and paper 003 §5.1, as SPMD programs.

Each factory returns ``program(sc) -> RankResult``: it sets up its regions, times the
algorithm from a barrier to a barrier, verifies its own result (the product against numpy,
the keys sorted, the components against a sequential union-find, the solution against a
sequential CG), and splits its time into computation and communication as the papers did
("instrumented to account for time spent in local computation phases and in communication
phases separately", paper 000 §6).  Computation is every local step run through
:class:`Work`: on a simulated machine it is charged to the rank's CPU from the machine's
:class:`~stacklib.transports.sim.machines.CpuCosts`; on a real transport its wall-clock time is
measured.  Communication is the rest of the elapsed time.

Sizes are parameters; :data:`PAPER_SIZES` has the papers' and :data:`SMALL_SIZES` test sizes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

import attrs
import numpy as np
import numpy.typing as npt
import trio

from stacklib.bench.splitc.cluster import run_spmd
from stacklib.layers.splitc import GlobalPtr, Pending, SplitC
from stacklib.layers.uam import UamParams
from stacklib.transports.sim.machines import (
    CALIBRATED_HOSTS,
    CALIBRATION_POINTS,
    HOST_CPUS,
    MACHINES,
    SMALL_BLOCK_BYTES,
    CpuCosts,
    Machine,
)

__all__ = [
    "CALIBRATION_ORDER",
    "CC_GET_WINDOW",
    "PAPER_SIZES",
    "PROGRAMS",
    "SMALL_SIZES",
    "Extrapolation",
    "RankResult",
    "Work",
    "calibrate",
    "conjugate_gradient",
    "connected_components",
    "extrapolate",
    "make_program",
    "matmul",
    "radix_sort",
    "sample_sort",
]

T = TypeVar("T")
Program = Callable[[SplitC], Awaitable["RankResult"]]
SENTINEL = np.uint32(0xFFFFFFFF)  #: pads a message to two keys; never a key (keys < 2**32 - 1)


@attrs.frozen
class RankResult:
    """One rank's outcome: verified or not, elapsed seconds, of which computation."""

    ok: bool
    total: float
    compute: float
    detail: str = ""
    #: Operations charged in the timed section, by kind ("madd", "key", ...).
    ops: Mapping[str, float] = attrs.field(factory=dict, hash=False)

    @property
    def comm(self) -> float:
        """Seconds not spent computing: communication and waiting."""
        return max(0.0, self.total - self.compute)


class Work:
    """Runs local computation and accounts for it.

    ``await work(op, count, fn)`` runs ``fn()`` (the real computation, always: its result is
    verified) and then charges ``count`` operations ``op`` ("madd", "key", "compare", "edge")
    at the machine's cost on this rank; without a machine the wall-clock time of ``fn`` is
    what is charged.  When the count is only known from the result (the edges connected
    components examined), ``count`` is a function of ``fn``'s result.

    On a real transport the rank answers nobody while ``fn`` runs, so before a computation
    whose last run of the same ``op`` took at least UAM's ``ack_delay`` (or that has not run
    yet) it serves what has arrived and sends the acknowledgments it owes
    (:meth:`SplitC.acknowledge`): otherwise the peers' timers expire meanwhile and they
    resend what arrived intact.  Short computations (mm16's 16x16 block multiplies) skip it,
    as the delayed acknowledgment goes out in time anyway.
    """

    #: The clock that times ``fn`` where the wall time is charged (a test may replace it).
    clock = staticmethod(time.perf_counter)

    def __init__(self, sc: SplitC, machine: Machine | None) -> None:
        self.sc = sc
        self.costs = machine.cpu(sc.rank) if machine is not None else None
        self.start_compute = 0.0
        self.ops: dict[str, float] = {}
        self.last_wall: dict[str, float] = {}  # op -> wall time of its last run
        # UAM's delayed acknowledgment; a service without one (GAM replies at once) is
        # acknowledged before every computation, which costs it nothing.
        params = getattr(sc.am, "params", None)
        self.ack_delay = params.ack_delay_us * 1e-6 if isinstance(params, UamParams) else 0.0

    async def __call__(
        self, op: str, count: float | Callable[[T], float], fn: Callable[[], T]
    ) -> T:
        if not self.sc.modeled and self.last_wall.get(op, math.inf) >= self.ack_delay:
            self.sc.acknowledge()
        begin = self.clock()
        result = fn()
        wall = self.clock() - begin
        self.last_wall[op] = wall
        if callable(count):
            count = count(result)
        self.ops[op] = self.ops.get(op, 0.0) + count
        if self.costs is not None and self.sc.modeled:
            seconds = count * getattr(self.costs, f"{op}_us") * 1e-6
        else:
            seconds = wall
            if self.sc.modeled:
                seconds = 0.0  # a simulated host without a machine: computation is free
        await self.sc.compute(seconds)
        return result

    async def begin(self) -> float:
        """Barrier, then the start of the timed section."""
        await self.sc.barrier()
        self.start_compute = self.sc.compute_time
        self.ops = {}
        return trio.current_time()

    async def end(self, start: float, ok: bool, detail: str = "") -> RankResult:
        """Barrier, then this rank's result for the timed section that began at ``start``."""
        await self.sc.barrier()
        total = trio.current_time() - start
        compute = self.sc.compute_time - self.start_compute
        return RankResult(ok, total, compute, detail, dict(self.ops))


# ---------------------------------------------------------------------- matrix multiply


def matmul(
    blocks: int,
    block: int,
    *,
    prefetch: bool = True,
    barrier_every: int = 1,
    seed: int = 1,
    machine: Machine | None = None,
) -> Program:
    """Blocked matrix multiply C = A B of ``blocks`` x ``blocks`` blocks of ``block`` x
    ``block`` doubles; block (i, j) of each matrix lives on rank (i blocks + j) mod P.  Each
    rank computes its C blocks, fetching A(i,k) and B(k,j) with bulk gets; with ``prefetch``
    "the main loop multiplies two blocks while it prefetches the two blocks needed in the next
    iteration" (paper 000 §6).

    Every ``barrier_every`` block multiplies the ranks meet at a barrier (0: never), while the
    prefetched blocks are still in flight; ``sync()`` then waits for them.  The papers do not
    show the code: this is the "synchronization overhead" that paper 003 §5.2 holds
    responsible for the extra communication time on 4 and 8 nodes.  It keeps the ranks in
    step, so that in iteration k all of them fetch A(i, k) from rank k mod P, a hot spot whose
    link sends P - 1 blocks per iteration (docs/splitc.md).  Ranks with fewer blocks join the
    remaining barriers at the end.
    """
    if barrier_every < 0:
        raise ValueError(f"barrier_every must be >= 0, got {barrier_every}")

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, machine)
        nb, bs, size = blocks, block, block * block
        op = "madd_small" if 3 * size * 8 <= SMALL_BLOCK_BYTES else "madd"

        def owner(i: int, j: int) -> tuple[int, int]:
            return (i * nb + j) % sc.size, (i * nb + j) // sc.size

        rng = np.random.default_rng(seed)
        a_full = rng.random((nb * bs, nb * bs))
        b_full = rng.random((nb * bs, nb * bs))
        mine = [(i, j) for i in range(nb) for j in range(nb) if owner(i, j)[0] == sc.rank]
        count = max(1, len(mine))
        a = await sc.all_alloc("mm.A", (count, bs, bs), np.float64)
        b = await sc.all_alloc("mm.B", (count, bs, bs), np.float64)
        buf = await sc.all_alloc("mm.buf", (4, bs, bs), np.float64)
        for i, j in mine:
            index = owner(i, j)[1]
            a[index] = a_full[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs]
            b[index] = b_full[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs]
        c = {ij: np.zeros((bs, bs)) for ij in mine}
        steps = [(i, j, k) for i, j in mine for k in range(nb)]
        most = -(-nb * nb // sc.size) * nb  # the steps of the rank with the most blocks
        barriers = most // barrier_every if barrier_every else 0

        async def fetch(slot: int, i: int, j: int, k: int) -> None:
            rank_a, index_a = owner(i, k)
            rank_b, index_b = owner(k, j)
            here = sc.ptr(sc.rank, "mm.buf")
            await sc.bulk_get(here + 2 * slot * size, sc.ptr(rank_a, "mm.A", index_a * size), size)
            await sc.bulk_get(
                here + (2 * slot + 1) * size, sc.ptr(rank_b, "mm.B", index_b * size), size
            )

        def multiply(i: int, j: int, slot: int) -> None:
            c[i, j] += buf[2 * slot] @ buf[2 * slot + 1]

        start = await work.begin()
        if steps:
            await fetch(0, *steps[0])
            await sc.sync()
        for step, (i, j, _) in enumerate(steps):
            slot = step % 2
            following = steps[step + 1] if step + 1 < len(steps) else None
            if prefetch and following is not None:
                await fetch(1 - slot, *following)
            await work(op, bs**3, lambda i=i, j=j, slot=slot: multiply(i, j, slot))  # type: ignore[misc]
            if barrier_every and (step + 1) % barrier_every == 0:
                await sc.barrier()
                barriers -= 1
            if not prefetch and following is not None:
                await fetch(1 - slot, *following)
            await sc.sync()
        for _ in range(barriers):
            await sc.barrier()
        product = a_full @ b_full
        ok = all(
            np.allclose(c[i, j], product[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs])
            for i, j in mine
        )
        return await work.end(start, ok, f"{len(mine)} blocks")

    return program


# ---------------------------------------------------------------------- sorts: shared parts


def _keys(seed: int, rank: int, n: int) -> npt.NDArray[np.uint32]:
    """``n`` keys of rank ``rank``: arbitrary 32-bit values below the sentinel."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(0, 0xFFFFFFFF, n, dtype=np.uint64).astype(np.uint32)


def _fingerprint(keys: npt.NDArray[np.uint32]) -> npt.NDArray[np.int64]:
    """Count, sum and a sum of squares modulo a prime: equal for equal multisets."""
    wide = keys.astype(np.uint64)
    return np.array([len(keys), int(wide.sum()), int((wide**2 % 9973).sum())], np.int64)


async def _verify_sorted(sc: SplitC, keys: npt.NDArray[np.uint32], inputs: Any) -> bool:
    """Locally sorted, ordered across ranks, and the same multiset (count and sums)."""
    local = bool(np.all(keys[:-1] <= keys[1:])) if len(keys) > 1 else True
    low = int(keys[0]) if len(keys) else -1
    high = int(keys[-1]) if len(keys) else -1
    ends = await sc.all_gather(np.array([low, high, len(keys)], np.int64))
    ordered = True
    previous = -1
    for low_r, high_r, n_r in ends:
        if n_r:
            ordered &= bool(low_r >= previous)
            previous = int(high_r)
    sums = _fingerprint(keys)
    before = _fingerprint(inputs)
    same = await sc.all_reduce(sums - before, "sum")
    everywhere = await sc.all_reduce(int(local and ordered), "min")
    return bool(everywhere == 1 and not np.any(same))


# ---------------------------------------------------------------------- sample sort


def sample_sort(
    keys_per_rank: int,
    *,
    bulk: bool,
    oversample: int = 64,
    seed: int = 1,
    machine: Machine | None = None,
) -> Program:
    """Sample sort (paper 000 §6, paper 003 §5.1): sample the keys, sort the samples on one
    processor, broadcast splitters, send every key to its range's rank (two keys per one-way
    store in input order, or one bulk message per peer after a local presort), sort
    locally."""

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, machine)
        n, p = keys_per_rank, sc.size
        keys = _keys(seed, sc.rank, n)
        rng = np.random.default_rng([seed, sc.rank, 1])
        capacity = 2 * n + 2 * p + 64
        recv = await sc.all_alloc("ss.recv", capacity, np.uint32)
        start = await work.begin()
        sample = await work("key", oversample, lambda: rng.choice(keys, oversample))
        samples = await sc.all_gather(sample)
        splitters = np.zeros(p - 1, np.uint32)
        if sc.rank == 0:
            pool = np.concatenate(samples)
            m = len(pool)
            ordered = await work("compare", m * math.log2(max(m, 2)), lambda: np.sort(pool))
            splitters = ordered[oversample::oversample][: p - 1].astype(np.uint32)
        splitters = np.asarray(await sc.broadcast(splitters, 0), np.uint32).reshape(-1)
        dest = await work("key", n, lambda: np.searchsorted(splitters, keys, side="right"))
        counts = np.bincount(dest, minlength=p)
        padded = counts + counts % 2  # messages carry two keys
        table = np.array(await sc.all_gather(padded))  # table[s, d]
        offsets = np.cumsum(table, axis=0) - table  # where source s starts at d
        expected = int(table[:, sc.rank].sum())
        if expected > capacity:
            raise RuntimeError(f"sample sort: {expected} keys for rank {sc.rank} exceed {capacity}")
        bounds = np.concatenate([[0], np.cumsum(counts)])
        if bulk:
            # "presorts the local values such that each processor sends exactly one message
            # to every other processor" (paper 000 §6)
            order = await work("key", n, lambda: np.argsort(dest, kind="stable"))
            grouped = keys[order]
            for step in range(p):
                d = (sc.rank + step) % p  # start with a different peer on each rank
                part = grouped[bounds[d] : bounds[d + 1]]
                if len(part) % 2:
                    part = np.append(part, SENTINEL)
                if len(part):
                    await sc.bulk_store(sc.ptr(d, "ss.recv", int(offsets[sc.rank, d])), part)
        else:
            # No presort: keys go out in input order, a key waiting in its destination's
            # one-key buffer until a second joins it ("packs two values per message", paper
            # 000 §6).  The grouping below only works out that order; it is not charged.
            order = np.argsort(dest, kind="stable")
            targets, places, pairs, when = [], [], [], []
            for d in range(p):
                part = keys[order[bounds[d] : bounds[d + 1]]]
                sent_at = order[bounds[d] : bounds[d + 1]][1::2]
                if len(part) % 2:
                    part = np.append(part, SENTINEL)
                    sent_at = np.append(sent_at, n)  # the odd one out goes at the end
                k = len(part) // 2
                targets.append(np.full(k, d))
                places.append(int(offsets[sc.rank, d]) + 2 * np.arange(k))
                pairs.append(part.reshape(k, 2))
                when.append(sent_at)
            schedule = np.argsort(np.concatenate(when), kind="stable")
            to, at = np.concatenate(targets)[schedule], np.concatenate(places)[schedule]
            values = np.concatenate(pairs)[schedule]
            for d, place, pair in zip(to.tolist(), at.tolist(), values, strict=True):
                await sc.store(sc.ptr(d, "ss.recv", place), pair)
        await sc.store_sync(4 * expected)
        mine = recv[:expected]
        mine = mine[mine != SENTINEL]
        m = len(mine)
        result = await work("compare", m * math.log2(max(m, 2)), lambda: np.sort(mine))
        finish = await work.end(start, True)
        ok = await _verify_sorted(sc, result, keys)
        return attrs.evolve(finish, ok=ok, detail=f"{m} keys")

    return program


# ---------------------------------------------------------------------- radix sort


def radix_sort(
    keys_per_rank: int,
    *,
    bulk: bool,
    bits: int = 8,
    blocking: bool = True,
    seed: int = 1,
    machine: Machine | None = None,
) -> Program:
    """Radix sort (paper 003 §5.1): per digit, a local histogram, a global histogram giving
    every key its rank in the sorted array, then every key sent to its place: two keys per
    message when they go to neighbouring places, or one bulk message per peer that the
    receiver places locally.

    The small-message version sends each pair with a blocking ``write`` of one 8-byte value
    (a request and its reply) when ``blocking`` (the default), or with a one-way ``store``
    otherwise.  The paper only says it "transfers two keys at a time"; its Table 1 times fit
    a round trip per message: 2 ATM nodes, 4 passes x 512K keys x 1/2 remote / 2 keys =
    512K messages per rank in 48.13 s less about 3 s of computation is 86 us each, against
    Split-C's 72 us round trip (paper 000 Table 3), where one-way stores of about 8 us each
    would take some 4 s in all (docs/splitc.md, "The small-message sorts").
    """

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, machine)
        n, p, buckets = keys_per_rank, sc.size, 1 << bits
        keys = _keys(seed, sc.rank, n)
        regions = ["rs.a", "rs.b"]
        current = await sc.all_alloc(regions[0], n, np.uint32)
        other = await sc.all_alloc(regions[1], n, np.uint32)
        current[:] = keys
        if not bulk and blocking:
            # The same memory seen as 8-byte elements from place 0 and from place 1, so that a
            # pair of keys at any place is one scalar write (a single-cell request on ATM).
            for name, array in zip(regions, (current, other), strict=True):
                for first in (0, 1):
                    pairs = array[first : first + 2 * ((n - first) // 2)].view(np.uint64)
                    await sc.all_register(f"{name}.pairs{first}", pairs)
        start = await work.begin()
        for shift in range(0, 32, bits):
            source, target = regions[(shift // bits) % 2], regions[(shift // bits + 1) % 2]
            cur = sc.local(source)

            def histogram(cur: npt.NDArray[np.uint32] = cur, shift: int = shift) -> Any:
                digit = (cur >> np.uint32(shift)) & np.uint32(buckets - 1)
                return digit, np.bincount(digit, minlength=buckets)

            digit, hist = await work("key", n, histogram)
            table = np.array(await sc.all_gather(hist))  # table[r, b]
            totals = table.sum(axis=0)
            base = np.cumsum(totals) - totals
            starts = base + np.cumsum(table, axis=0) - table  # rank r's first place in bucket b

            def places(
                cur: npt.NDArray[np.uint32] = cur, digit: Any = digit, starts: Any = starts
            ) -> Any:
                order = np.argsort(digit, kind="stable")
                ordered_digit = digit[order]
                first = np.searchsorted(ordered_digit, np.arange(buckets))
                within = np.arange(n) - first[ordered_digit]
                return cur[order], starts[sc.rank][ordered_digit] + within

            ordered, pos = await work("key", n, places)
            dest, off = pos // n, pos % n
            if bulk:
                # The keys for rank d are one run of ``ordered``; d stages them after those of
                # lower ranks and places them itself (a stable sort of its staging by digit).
                sent = np.array(await sc.all_gather(np.bincount(dest, minlength=p)))
                stage = np.cumsum(sent, axis=0) - sent  # stage[s, d]
                bounds = np.concatenate([[0], np.cumsum(np.bincount(dest, minlength=p))])
                for step in range(p):
                    d = (sc.rank + step) % p
                    run = ordered[bounds[d] : bounds[d + 1]]
                    if len(run):
                        await sc.bulk_store(sc.ptr(d, target, int(stage[sc.rank, d])), run)
                await sc.store_sync(4 * n)
                staged = sc.local(target)

                def place(staged: npt.NDArray[np.uint32] = staged, shift: int = shift) -> None:
                    d = (staged >> np.uint32(shift)) & np.uint32(buckets - 1)
                    staged[:] = staged[np.argsort(d, kind="stable")]

                await work("key", n, place)
            elif blocking:
                views = (f"{target}.pairs0", f"{target}.pairs1")
                # Python lists, and the 8-byte pairs starting at every even and every odd
                # index as numpy scalars, made once per pass: this loop runs once per message.
                dests, offs, singles = dest.tolist(), off.tolist(), list(ordered)
                pairs = (
                    list(ordered[: n - n % 2].view(np.uint64)),
                    list(ordered[1 : n - (n - 1) % 2].view(np.uint64)),
                )
                i = 0
                while i < n:
                    d, o = dests[i], offs[i]
                    if i + 1 < n and dests[i + 1] == d and offs[i + 1] == o + 1:
                        value = pairs[i % 2][i // 2]
                        await sc.write(sc.ptr(d, views[o % 2], o // 2), value)
                        i += 2
                    else:
                        await sc.write(sc.ptr(d, target, o), singles[i])
                        i += 1
                await sc.barrier()  # every write into this rank has completed
            else:
                i = 0
                while i < n:
                    pair = i + 1 < n and dest[i + 1] == dest[i] and off[i + 1] == off[i] + 1
                    width = 2 if pair else 1
                    gp = sc.ptr(int(dest[i]), target, int(off[i]))
                    await sc.store(gp, ordered[i : i + width])
                    i += width
                await sc.store_sync(4 * n)
        result = sc.local(regions[(32 // bits) % 2]).copy()
        finish = await work.end(start, True)
        ok = await _verify_sorted(sc, result, keys)
        return attrs.evolve(finish, ok=ok, detail=f"{32 // bits} passes of {bits} bits")

    return program


# ---------------------------------------------------------------------- connected components


def _grid_edges(rows: int, cols: int, probability: float, seed: int) -> tuple[Any, Any]:
    rng = np.random.default_rng([seed, 7])
    right = rng.random((rows, cols)) < probability  # (i, j) - (i, j + 1)
    down = rng.random((rows, cols)) < probability  # (i, j) - (i + 1, j)
    right[:, -1] = False
    down[-1, :] = False
    return right, down


def _propagate(labels: Any, right: Any, down: Any) -> tuple[Any, int]:
    """Minimum label over each component of the slab (label propagation to a fixed point);
    returns the labels and the edges a union-find pass would examine (the work charged: the
    vectorized sweeps here are a stand-in for the sequential algorithm, not a cost model)."""
    examined = int(right.sum() + down.sum())
    while True:
        before = labels.copy()
        for _ in range(2):
            h = np.minimum(labels[:, :-1], labels[:, 1:])
            labels[:, :-1] = np.where(right[:, :-1], h, labels[:, :-1])
            labels[:, 1:] = np.where(right[:, :-1], np.minimum(labels[:, 1:], h), labels[:, 1:])
            v = np.minimum(labels[:-1, :], labels[1:, :])
            labels[:-1, :] = np.where(down[:-1, :], v, labels[:-1, :])
            labels[1:, :] = np.where(down[:-1, :], np.minimum(labels[1:, :], v), labels[1:, :])
        if np.array_equal(before, labels):
            return labels, examined


#: Split-phase gets cc keeps outstanding to one rank: UAM's window w (the default of
#: UamParams, which the simulated clusters and the real ranks use).  UAM frees a request's
#: window slot when the peer acknowledges it, and a peer that handles a run of requests in one
#: poll sends their replies each carrying the acknowledgment of the whole run: the first reply
#: opens the window again while the other w - 1 are still on their way.  A program issuing
#: gets as fast as the window opens can so have up to 2w replies and the peer's own w requests
#: arriving at once, more than the 2w arrivals UAM keeps per peer (paper 000 §5.1.1), and on
#: real transports the surplus waits at the endpoint, whose receive queue it can overrun
#: (docs/splitc.md, "Results for real").  At most w gets not yet answered keep a peer's
#: arrivals within w replies + w requests.  (On the simulated NIs handlers run as each PDU
#: arrives and every reply acknowledges only its own request: the bound waits exactly when
#: UAM's window would, and the simulated times are those of unbounded gets.)
CC_GET_WINDOW = UamParams().window


async def _completed(sc: SplitC, pending: Pending) -> None:
    """Poll until ``pending`` has completed (what :meth:`SplitC.read` waits for)."""
    await sc.am.wait_until(lambda: pending.done)


async def _get_windowed(sc: SplitC, pointers: Sequence[GlobalPtr], window: int) -> list[Any]:
    """The values at ``pointers``, fetched with split-phase gets in order, of which at most
    ``window`` are outstanding to any one rank: before another get to a rank the oldest one
    to it completes.  Returns them in the order of ``pointers`` (``window`` >= 1: checked by
    :func:`connected_components`)."""
    pending: list[Pending] = []
    outstanding: dict[int, deque[Pending]] = {}
    async with sc.split_phase():
        for gp in pointers:
            queue = outstanding.setdefault(gp.rank, deque())
            while queue and queue[0].done:  # replies from one rank come in order
                queue.popleft()
            if len(queue) >= window:
                await _completed(sc, queue.popleft())
            queue.append(await sc.get(gp))
            pending.append(queue[-1])
    return [done.value for done in pending]


def _examined(result: tuple[Any, int]) -> float:
    """The edges a :func:`_propagate` call examined (the work charged for it)."""
    return float(result[1])


def connected_components(
    rows_per_rank: int,
    cols: int,
    *,
    probability: float = 0.6,
    get_window: int = CC_GET_WINDOW,
    seed: int = 1,
    machine: Machine | None = None,
) -> Program:
    """Connected components of a random 2-D grid graph, a slab of rows per rank (the kind of
    graph of the Split-C connected-components study cited by paper 000 §6, ref. 20; the
    sizes are ours): local components first, then rounds in which each rank reads its
    neighbours' boundary labels with small split-phase gets, at most ``get_window`` of them
    unanswered per neighbour (:data:`CC_GET_WINDOW`), until no label changes."""
    if get_window < 1:
        raise ValueError(f"connected_components: get_window must be at least 1, got {get_window}")

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, machine)
        rows = rows_per_rank * sc.size
        right_all, down_all = _grid_edges(rows, cols, probability, seed)
        top, bottom = sc.rank * rows_per_rank, (sc.rank + 1) * rows_per_rank
        right, down = right_all[top:bottom], down_all[top:bottom].copy()
        down[-1, :] = False  # edges to the next slab are handled across ranks
        labels = await sc.all_alloc("cc.labels", (rows_per_rank, cols), np.int64)
        labels[:] = np.arange(top * cols, bottom * cols).reshape(rows_per_rank, cols)
        start = await work.begin()
        # The sweeps run inside Work, so that on real transports their wall time is the
        # computation; simulated hosts are charged for the edges examined.
        result, _ = await work("edge", _examined, partial(_propagate, labels.copy(), right, down))
        labels[:] = result
        above = np.flatnonzero(down_all[top - 1]) if sc.rank > 0 else np.zeros(0, np.intp)
        below = np.flatnonzero(down_all[bottom - 1]) if sc.rank < sc.size - 1 else above[:0]
        last_row = (rows_per_rank - 1) * cols
        pointers = [sc.ptr(sc.rank - 1, "cc.labels", last_row + int(j)) for j in above]
        pointers += [sc.ptr(sc.rank + 1, "cc.labels", int(j)) for j in below]
        while True:
            await sc.barrier()
            values = await _get_windowed(sc, pointers, get_window)
            await sc.barrier()  # everyone has read before anyone lowers its labels
            changed = 0
            new = labels.copy()
            for j, value in zip(above, values[: len(above)], strict=True):
                if value < new[0, j]:
                    new[0, j] = value
            for j, value in zip(below, values[len(above) :], strict=True):
                if value < new[-1, j]:
                    new[-1, j] = value
            if not np.array_equal(new, labels):
                result, _ = await work("edge", _examined, partial(_propagate, new, right, down))
                changed = 1
                labels[:] = result
            if await sc.all_reduce(changed, "max") == 0:
                break
        finish = await work.end(start, True)
        expected, _ = _propagate(np.arange(rows * cols).reshape(rows, cols), right_all, down_all)
        ok = bool(np.array_equal(labels, expected[top:bottom]))
        return attrs.evolve(finish, ok=await sc.all_reduce(int(ok), "min") == 1)

    return program


# ---------------------------------------------------------------------- conjugate gradient


def _laplacian(x: Any, up: Any, down: Any) -> Any:
    """The 5-point Laplacian (Dirichlet boundary) of a slab with its neighbours' rows."""
    padded = np.vstack([up[None, :], x, down[None, :]])
    y = 4.0 * x
    y -= padded[:-2] + padded[2:]
    y[:, 1:] -= x[:, :-1]
    y[:, :-1] -= x[:, 1:]
    return y


def _cg_sequential(b: Any, iterations: int) -> Any:
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rr = float((r * r).sum())
    zero = np.zeros(b.shape[1])
    for _ in range(iterations):
        q = _laplacian(p, zero, zero)
        alpha = rr / float((p * q).sum())
        x += alpha * p
        r -= alpha * q
        new = float((r * r).sum())
        p = r + (new / rr) * p
        rr = new
    return x


def conjugate_gradient(
    rows_per_rank: int,
    cols: int,
    *,
    iterations: int = 20,
    seed: int = 1,
    machine: Machine | None = None,
) -> Program:
    """Conjugate gradient on the 5-point Poisson matrix of a grid, a slab of rows per rank
    (paper 000 §6 names the solver, not its problem: the grid is ours).  Each iteration gets
    the neighbours' boundary rows with bulk gets and takes two dot products with all-reduce."""

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, machine)
        rows = rows_per_rank * sc.size
        b_all = np.random.default_rng([seed, 3]).random((rows, cols))
        top = sc.rank * rows_per_rank
        b = b_all[top : top + rows_per_rank]
        p = await sc.all_alloc("cg.p", (rows_per_rank, cols), np.float64)
        halo = await sc.all_alloc("cg.halo", (2, cols), np.float64)
        x = np.zeros_like(b)
        r = b.copy()
        p[:] = r
        points = rows_per_rank * cols
        start = await work.begin()
        rr = await sc.all_reduce(float((r * r).sum()))
        for _ in range(iterations):
            await sc.barrier()  # p is final everywhere
            async with sc.split_phase():
                if sc.rank > 0:
                    src = sc.ptr(sc.rank - 1, "cg.p", (rows_per_rank - 1) * cols)
                    await sc.bulk_get(sc.ptr(sc.rank, "cg.halo", 0), src, cols)
                if sc.rank < sc.size - 1:
                    src = sc.ptr(sc.rank + 1, "cg.p", 0)
                    await sc.bulk_get(sc.ptr(sc.rank, "cg.halo", cols), src, cols)
            q = await work("madd", 5 * points, lambda: _laplacian(p, halo[0], halo[1]))
            pq = await sc.all_reduce(
                await work("madd", points, lambda q=q: float((p * q).sum()))  # type: ignore[misc]
            )
            alpha = rr / pq

            def update(alpha: float = alpha, q: Any = q) -> float:
                x[:] += alpha * p
                r[:] -= alpha * q
                return float((r * r).sum())

            new = await sc.all_reduce(await work("madd", 3 * points, update))
            await sc.barrier()  # nobody still reads p
            beta = new / rr
            await work("madd", points, lambda beta=beta: p.__setitem__(slice(None), r + beta * p))  # type: ignore[misc]
            rr = new
        finish = await work.end(start, True)
        expected = _cg_sequential(b_all, iterations)[top : top + rows_per_rank]
        ok = bool(np.allclose(x, expected, rtol=1e-8, atol=1e-10))
        return attrs.evolve(finish, ok=await sc.all_reduce(int(ok), "min") == 1)

    return program


# ---------------------------------------------------------------------- the suite

#: name -> (factory, description)
PROGRAMS: dict[str, tuple[Callable[..., Program], str]] = {
    "mm": (matmul, "blocked matrix multiply with prefetch"),
    "ssortsm": (lambda n, **kw: sample_sort(n, bulk=False, **kw), "sample sort, 2 keys/message"),
    "ssortlg": (lambda n, **kw: sample_sort(n, bulk=True, **kw), "sample sort, bulk"),
    # Two versions of the small-message radix sort: paper 003 Table 1's times need a round
    # trip per message, paper 000 §6's Fig 5 comparisons one-way stores (docs/splitc.md).
    "rsortsm": (
        lambda n, **kw: radix_sort(n, bulk=False, **kw),
        "radix sort, 2 keys/blocking write",
    ),
    "rsortsm-store": (
        lambda n, **kw: radix_sort(n, bulk=False, blocking=False, **kw),
        "radix sort, 2 keys/one-way store",
    ),
    "rsortlg": (lambda n, **kw: radix_sort(n, bulk=True, **kw), "radix sort, bulk"),
    "cc": (connected_components, "connected components of a random grid"),
    "cg": (conjugate_gradient, "conjugate gradient, 5-point Poisson"),
}

#: Benchmark name -> (program, positional size arguments) at the papers' sizes.
PAPER_SIZES: dict[str, tuple[str, tuple[int, ...]]] = {
    "mm4x4": ("mm", (4, 128)),  # paper 000 §6: 4 by 4 blocks of 128 by 128 doubles
    "mm128": ("mm", (8, 128)),  # paper 003 §5.1: 8 by 8 blocks of 128 by 128
    "mm16": ("mm", (16, 16)),  # paper 003 §5.1: 16 by 16 blocks of 16 by 16
    "ssortsm": ("ssortsm", (512 * 1024,)),  # paper 003 §5.1: 512K keys per node
    "ssortlg": ("ssortlg", (512 * 1024,)),
    "rsortsm": ("rsortsm", (512 * 1024,)),
    "rsortsm-store": ("rsortsm-store", (512 * 1024,)),
    "rsortlg": ("rsortlg", (512 * 1024,)),
    "cc": ("cc", (128, 512)),  # ours: paper 000 §6 gives no size
    "cg": ("cg", (128, 512)),  # ours
}

#: The same at sizes small enough for tests.
SMALL_SIZES: dict[str, tuple[str, tuple[int, ...]]] = {
    "mm4x4": ("mm", (4, 8)),
    "mm128": ("mm", (4, 16)),
    "mm16": ("mm", (8, 4)),
    "ssortsm": ("ssortsm", (300,)),
    "ssortlg": ("ssortlg", (2000,)),
    "rsortsm": ("rsortsm", (200,)),
    "rsortsm-store": ("rsortsm-store", (200,)),
    "rsortlg": ("rsortlg", (2000,)),
    "cc": ("cc", (6, 12)),
    "cg": ("cg", (6, 16)),
}


def make_program(
    benchmark: str,
    sizes: tuple[int, ...] | None = None,
    *,
    machine: Machine | None = None,
    small: bool = False,
    **params: Any,
) -> Program:
    """The program of ``benchmark`` (a key of :data:`PAPER_SIZES`) at the paper's sizes, the
    small ones, or ``sizes``."""
    table = SMALL_SIZES if small else PAPER_SIZES
    if benchmark not in table:
        raise KeyError(f"no Split-C benchmark {benchmark!r} (known: {', '.join(PAPER_SIZES)})")
    name, default = table[benchmark]
    factory, _ = PROGRAMS[name]
    return factory(*(sizes or default), machine=machine, **params)


# ---------------------------------------------------------------------- calibration

#: The order in which :func:`calibrate` fixes the costs: benchmark -> the operation it fixes
#: (docs/splitc.md, "The machines"): the sample sort's comparisons come last because it also
#: charges keys.
CALIBRATION_ORDER: tuple[tuple[str, str], ...] = (
    ("mm128", "madd"),
    ("mm16", "madd_small"),
    ("rsortlg", "key"),
    ("ssortlg", "compare"),
)


def calibrate(
    network: str,
    *,
    targets: Mapping[str, float] | None = None,
    sizes: Mapping[str, tuple[int, ...]] | None = None,
    start: CpuCosts | None = None,
    iterations: int = 4,
    tolerance: float = 1e-4,
    progress: Callable[[str], None] | None = None,
) -> CpuCosts:
    """Re-derive the calibrated costs of ``network``'s host ("atm": the SPARCstation-20,
    "fe": the 120 MHz Pentium) from 2-node runs, as docs/splitc.md describes: for each
    benchmark of :data:`CALIBRATION_ORDER`, the cost of its operation is (target - simulated
    communication - the other operations' time) / its operations on the slowest rank,
    iterated (communication shifts a little with the computation) until the simulated time
    is within ``tolerance`` of the target.

    ``targets`` default to paper 003 Table 1's 2-node column
    (:data:`~stacklib.transports.sim.machines.CALIBRATION_POINTS`) at the papers' sizes;
    with ``sizes`` (benchmark -> size arguments) give targets for those sizes.  ``start``
    defaults to the costs in machines.py.  After a change in the communication model this
    refreshes the constants in one call (a few minutes of wall time at the papers' sizes).
    """
    if network not in CALIBRATED_HOSTS:
        raise ValueError(f"calibrate: network must be one of {sorted(CALIBRATED_HOSTS)}")
    cluster, host = CALIBRATED_HOSTS[network]
    goals = dict(CALIBRATION_POINTS[network] if targets is None else targets)
    costs = start or HOST_CPUS[host]
    for benchmark, op in CALIBRATION_ORDER:
        if benchmark not in goals:
            continue
        target = goals[benchmark]
        tried: list[tuple[float, float]] = []  # (cost, simulated time)
        for _ in range(iterations):
            machine = attrs.evolve(MACHINES[cluster], costs={host: costs})
            program = make_program(benchmark, (sizes or {}).get(benchmark), machine=machine)
            run = run_spmd(program, 2, cluster)
            if not all(r.ok for r in run.results):
                raise RuntimeError(f"calibrate: {benchmark} gave a wrong result")
            slowest: RankResult = max(run.results, key=lambda r: r.total)
            count = slowest.ops.get(op, 0.0)
            if count <= 0:
                raise RuntimeError(f"calibrate: {benchmark} charges no {op!r} operations")
            cost = getattr(costs, f"{op}_us")
            if progress is not None:
                progress(f"{benchmark}: {slowest.total:.4f} s, target {target} s ({op} {cost} us)")
            if abs(slowest.total - target) <= tolerance * target:
                break
            tried.append((cost, slowest.total))
            # (target - communication - the other operations' time) / operations ...
            left = target - slowest.comm - (slowest.compute - count * cost * 1e-6)
            value = left / count * 1e6
            if len(tried) >= 2:
                # ... then the secant: communication that overlaps the computation shrinks
                # as it grows, so the time moves by less than operations x cost.
                (c0, t0), (c1, t1) = tried[-2:]
                if t1 != t0 and (t1 - t0) / (c1 - c0) > 0:
                    value = c1 + (target - t1) * (c1 - c0) / (t1 - t0)
            if value <= 0:
                raise RuntimeError(
                    f"calibrate: {benchmark} takes more than {target} s without any {op!r}"
                )
            costs = attrs.evolve(costs, **{f"{op}_us": value})
            if op == "key":  # no paper figure for an edge: taken equal to a key
                costs = attrs.evolve(costs, edge_us=value)
    points = ", ".join(f"{b} {goals[b]} s" for b, _ in CALIBRATION_ORDER if b in goals)
    return attrs.evolve(costs, cite=f"calibrated: {network} 2 nodes ({points})")


@attrs.frozen
class Extrapolation:
    """A sort's time at ``keys`` per rank from runs at smaller sizes, on the line through
    them: (slowest rank's total, mean computation) = intercept + slope x keys."""

    keys: int
    total: float
    compute: float
    #: (keys per rank, total, computation) of each run.
    runs: tuple[tuple[int, float, float], ...]
    #: The largest distance of a run from the fitted line, relative to its total.
    residual: float


def extrapolate(
    benchmark: str,
    machine_name: str,
    nodes: int,
    sizes: Sequence[int] = (4096, 8192, 16384),
    keys: int = 512 * 1024,
    progress: Callable[[str], None] | None = None,
) -> Extrapolation:
    """Run a sort (``rsortsm``: linear in the keys, a round trip per two keys) at ``sizes``
    keys per rank on ``nodes`` ranks of ``machine_name`` and extrapolate to ``keys`` per rank
    along the least-squares line (docs/splitc.md, "The small-message sorts")."""
    if len(sizes) < 2:
        raise ValueError("extrapolate: needs at least two sizes")
    runs = []
    machine = MACHINES[machine_name]
    for size in sizes:
        run = run_spmd(make_program(benchmark, (size,), machine=machine), nodes, machine_name)
        if not all(r.ok for r in run.results):
            raise RuntimeError(f"extrapolate: {benchmark} at {size} keys gave a wrong result")
        total = max(r.total for r in run.results)
        compute = sum(r.compute for r in run.results) / nodes
        runs.append((size, total, compute))
        if progress is not None:
            progress(f"{benchmark} {machine_name} {nodes} nodes, {size} keys: {total:.4f} s")
    x = np.array([r[0] for r in runs], float)
    totals = np.polyfit(x, [r[1] for r in runs], 1)
    computes = np.polyfit(x, [r[2] for r in runs], 1)
    residual = max(abs(np.polyval(totals, size) - total) / total for size, total, _ in runs)
    return Extrapolation(
        keys,
        float(np.polyval(totals, keys)),
        float(np.polyval(computes, keys)),
        tuple(runs),
        float(residual),
    )
