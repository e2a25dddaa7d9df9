"""U-Net/MM in virtual time: paper 002 Table 1 and §6.1's statements about it.

Each measurement runs the translation core (:mod:`stacklib.unet.mm.core`) through its trio
driver on a simulated host whose cost profile is one implementation's Table 1 column
(:mod:`stacklib.unet.mm.costs`), and reads the virtual time a send or receive path took:

* a TLB hit against the same path without memory management (paper 002 §6.1: "adds only
  1-2 us in the case of a TLB hit" on the PCA-200);
* a miss on a present page with the TLB full, so the request also carries an unpin (§6.1:
  handshake, interrupt, pin and unpin "account for almost 50 us");
* a miss that copies (copy-on-write) or zeroes the page ("the overhead roughly doubles");
* the page-fault path: a send from a paged-out page, with a second endpoint sending meanwhile
  (Table 1: ~22 ms; §5.1.1: the NI serves other endpoints while a translation is pending);
* the DC21140/NT column: translation in the trap, no NI-kernel handshake;
* the same costs inside the simulated NIs (:mod:`stacklib.transports.sim.mm`): a ping-pong on
  virtual buffers against segment buffers, with all hits and with forced misses
  (:func:`integrated_rtt`).

Experiment ``mm-fig3`` checks paper 002 §6.2's findings on buffer traces of the Split-C
benchmarks (:mod:`stacklib.bench.splitc.trace`: ``SplitcTracer``, ``record_splitc``),
replayed through 1024- and 256-entry TLBs with a 16-entry victim cache, at 1/64 scale (every
byte count, the page included, divided by 64, so that the runs take seconds and touch as many
pages as at full size).

docs/memory-management.md has the table and how each figure was read.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Literal

import attrs
import trio

from stacklib.bench.mm_pingpong import ENDPOINT, Mode, mm_round_trip
from stacklib.bench.splitc.trace import (
    FIG3_RANKS,
    FIG3_SIZES,
    SMALL_MESSAGE,
    SplitcTracer,
    record_splitc,
    scaled_sizes,
)
from stacklib.reporting import progress
from stacklib.reporting.figures import Experiment, Figure, register_experiment
from stacklib.sim import CostProfile, Host, Simulation
from stacklib.transports.sim.mm import (
    AtmMmParams,
    FastEthernetMmParams,
    MemoryManagedNI,
    MmNIStatistics,
    MmRecipeParams,
    build_atm_mm,
    build_fe_mm,
)
from stacklib.unet import connect
from stacklib.unet.mm import (
    PAGE_SIZE,
    AddressSpace,
    MemoryManager,
    MmParams,
    PhysicalMemory,
    Status,
    TlbGeometry,
)
from stacklib.unet.mm.costs import (
    DC21140_NT,
    DC21140_NT_MM,
    PCA200,
    PCA200_LINUX_MM,
    acharge_steps,
)
from stacklib.unet.mm.driver import MmDriver
from stacklib.unet.mm.tlbsim import TlbSimResult, simulate

US = 1e-6

# The Split-C tracer's names (stacklib/bench/splitc/trace.py) stay importable from here.
__all__ = [
    "FIG3_RANKS",
    "FIG3_SIZES",
    "SERVED_DURING_FAULT",
    "SMALL_MESSAGE",
    "MmModel",
    "SplitcTracer",
    "fig3_results",
    "integrated_rtt",
    "measure",
    "record_splitc",
    "run_mm",
    "run_mm_fig3",
    "scaled_sizes",
    "scenario_page_fault",
    "scenario_pre_cow",
    "scenario_pre_present",
    "scenario_pre_zero",
    "scenario_recv_baseline",
    "scenario_recv_hit",
    "scenario_send_baseline",
    "scenario_send_hit",
    "scenario_send_miss_evicting",
]

SEND_PATH = ("send.trap", "send.queue")  # the baseline transmit work (ops a profile lacks: free)
RECV_PATH = ("recv.interrupt", "recv.queue")
P = PAGE_SIZE


class MmModel:
    """One simulated host with a U-Net/MM NI (or a baseline NI) and two processes."""

    def __init__(self, profile: CostProfile, *, memory_managed: bool, zero_map_in: bool) -> None:
        self.sim = Simulation(seed=1)
        self.host = Host("host", self.sim, profile)
        self.memory_managed = memory_managed
        self.memory = PhysicalMemory()
        geometry = TlbGeometry(entries=1024, victim=16, victim_grows=not zero_map_in)
        self.mm = MemoryManager(
            MmParams(geometry=geometry, zero_map_in=zero_map_in, pretranslate=4),
            self.memory,
            profile,
        )
        self.driver = MmDriver(self.host, self.mm)
        self.spaces = {pid: AddressSpace(pid, self.memory) for pid in (1, 2)}
        for pid, space in self.spaces.items():
            space.map(0, 64 * P)
            self.mm.open_endpoint(pid, space)

    def fill_conflicting(self, pid: int) -> list[int]:
        """Map and translate 17 pages sharing one TLB slot: the victim cache is then full."""
        pages = [(k + 1) * 1024 for k in range(18)]
        for vpage in pages:
            self.spaces[pid].map(vpage * P, P)
        for vpage in pages[:17]:
            result = self.mm.translate_send(0.0, pid, vpage * P, 64)
            if result.transfer is None:
                raise RuntimeError(f"warm-up translation failed: {result}")
            self.mm.complete(result.transfer)
        return pages

    async def send(self, pid: int, address: int, length: int) -> float:
        """One send's modeled time in microseconds: the baseline path plus translation."""
        start = trio.current_time()
        await acharge_steps(self.host, SEND_PATH)
        if self.memory_managed:
            result = await self.driver.send(pid, address, length)
            if result.status is not Status.OK or result.transfer is None:
                raise RuntimeError(f"send translation failed: {result}")
            await self.driver.complete(result.transfer)
        return (trio.current_time() - start) * 1e6

    async def receive(self, pid: int, length: int) -> float:
        """One arrival's modeled time in microseconds (a pre-translated buffer is waiting)."""
        start = trio.current_time()
        await acharge_steps(self.host, RECV_PATH)
        await acharge_steps(self.host, ("recv.copy",), length)
        if self.memory_managed:
            arrival = await self.driver.arrival(pid, length)
            if arrival.transfer is None:
                raise RuntimeError(f"arrival dropped: {arrival}")
            await self.driver.complete(arrival.transfer)
        return (trio.current_time() - start) * 1e6

    async def pretranslate(self, pid: int, address: int, length: int) -> float:
        """Post one free buffer and pre-translate it; microseconds."""
        self.mm.post_free(pid, address, length)
        start = trio.current_time()
        await self.driver.pretranslate(pid)
        return (trio.current_time() - start) * 1e6

    def run(self, body: Callable[[MmModel], Awaitable[float]]) -> float:
        """Run ``body`` with the page-in thread alive; its result."""
        out: list[float] = []

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.driver.run)
                out.append(await body(self))
                nursery.cancel_scope.cancel()

        self.sim.run(main)
        return out[0]


def measure(
    profile: CostProfile,
    body: Callable[[MmModel], Awaitable[float]],
    *,
    memory_managed: bool = True,
    zero_map_in: bool = True,
) -> float:
    """Run ``body`` on a fresh model of ``profile``."""
    model = MmModel(profile, memory_managed=memory_managed, zero_map_in=zero_map_in)
    return model.run(body)


async def scenario_send_hit(m: MmModel) -> float:
    """A send whose page the TLB holds (after one miss)."""
    await m.send(1, 0, 64)  # the miss
    return await m.send(1, 0, 64)


async def scenario_send_baseline(m: MmModel) -> float:
    """A send on the baseline NI (no translation)."""
    return await m.send(1, 0, 64)


async def scenario_send_miss_evicting(m: MmModel) -> float:
    """A send missing in a full TLB: the request carries an unpin."""
    pages = m.fill_conflicting(1)
    return await m.send(1, pages[17] * P, 64)


async def scenario_recv_hit(m: MmModel) -> float:
    """An arrival into a pre-translated buffer."""
    await m.pretranslate(1, 8 * P, P)
    return await m.receive(1, 40)


async def scenario_recv_baseline(m: MmModel) -> float:
    """A 40-byte arrival on the baseline NI."""
    return await m.receive(1, 40)


async def scenario_pre_present(m: MmModel) -> float:
    """Pre-translating a present private page, TLB full."""
    pages = m.fill_conflicting(1)
    return await m.pretranslate(1, pages[17] * P, P)


async def scenario_pre_cow(m: MmModel) -> float:
    """Pre-translating a page shared with another process: copy-on-write."""
    pages = m.fill_conflicting(1)
    m.spaces[2].share_from(m.spaces[1], pages[17] * P, P)  # as after a fork
    return await m.pretranslate(1, pages[17] * P, P)


async def scenario_pre_zero(m: MmModel) -> float:
    """Pre-translating a paged-out, page-aligned page: a zero page where allowed."""
    pages = m.fill_conflicting(1)
    m.spaces[1].page_out(pages[17])
    return await m.pretranslate(1, pages[17] * P, P)


#: Sends the other endpoint completed while endpoint 1 waited for its page-in (last run).
SERVED_DURING_FAULT: list[int] = []


async def scenario_page_fault(m: MmModel) -> float:
    """A send from a paged-out page while endpoint 2 keeps sending."""
    m.spaces[1].write(9 * P, b"paged out")
    m.spaces[1].page_out(9)
    served = 0
    done = trio.Event()

    async def other() -> None:
        nonlocal served
        while not done.is_set():
            await m.send(2, 0, 64)
            served += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        elapsed = await m.send(1, 9 * P, 64)
        done.set()
    SERVED_DURING_FAULT[:] = [served]
    return elapsed


def run_mm() -> list[Figure]:
    """The figures of paper 002 Table 1 and §6.1."""
    t1 = "paper 002 Table 1"
    s61 = "paper 002 §6.1"
    pca_base_send = measure(PCA200, scenario_send_baseline, memory_managed=False)
    pca_hit_send = measure(PCA200_LINUX_MM, scenario_send_hit)
    pca_base_recv = measure(PCA200, scenario_recv_baseline, memory_managed=False)
    pca_hit_recv = measure(PCA200_LINUX_MM, scenario_recv_hit)
    pca_miss = measure(PCA200_LINUX_MM, scenario_send_miss_evicting) - pca_base_send
    pca_pre = measure(PCA200_LINUX_MM, scenario_pre_present)
    pca_cow = measure(PCA200_LINUX_MM, scenario_pre_cow)
    pca_zero = measure(PCA200_LINUX_MM, scenario_pre_zero)
    pca_fault = measure(PCA200_LINUX_MM, scenario_page_fault)
    nt = {"zero_map_in": False}
    nt_base_send = measure(DC21140_NT, scenario_send_baseline, memory_managed=False)
    nt_hit_send = measure(DC21140_NT_MM, scenario_send_hit, **nt)
    nt_base_recv = measure(DC21140_NT, scenario_recv_baseline, memory_managed=False)
    nt_hit_recv = measure(DC21140_NT_MM, scenario_recv_hit, **nt)
    nt_miss = measure(DC21140_NT_MM, scenario_send_miss_evicting, **nt) - nt_base_send
    nt_pre = measure(DC21140_NT_MM, scenario_pre_present, **nt)
    nt_fault = measure(DC21140_NT_MM, scenario_page_fault, **nt)
    return [
        Figure("PCA-200 U-Net send (queue)", 10.0, pca_base_send, "us", t1),
        Figure("PCA-200 U-Net receive (queue)", 13.0, pca_base_recv, "us", t1),
        Figure(
            "PCA-200 U-Net/MM: added by a TLB hit, send",
            1.0,
            pca_hit_send - pca_base_send,
            "us",
            f"{s61} (1-2 us), {t1}",
        ),
        Figure(
            "PCA-200 U-Net/MM: added by a TLB hit, receive",
            2.0,
            pca_hit_recv - pca_base_recv,
            "us",
            f"{s61} (1-2 us), {t1}",
        ),
        Figure(
            "PCA-200 send TLB miss, present page, with unpin",
            50.0,
            pca_miss,
            "us",
            f"{s61} 'almost 50 us' (24+10+11+4, {t1})",
        ),
        Figure("PCA-200 pre-translate miss, present, with unpin", 49.0, pca_pre, "us", t1),
        Figure("PCA-200 pre-translate miss, copy-on-write", 82.0, pca_cow, "us", t1),
        Figure("PCA-200 pre-translate miss, zero page", 74.0, pca_zero, "us", t1),
        Figure(
            "PCA-200 miss with page copy / plain miss",
            2.0,
            pca_cow / pca_pre,
            "x",
            f"{s61} 'roughly doubles' (read as ±25%)",
            tolerance=0.25,
        ),
        Figure(
            "PCA-200 miss with zeroing / plain miss",
            2.0,
            pca_zero / pca_pre,
            "x",
            f"{s61} 'roughly doubles' (read as ±25%)",
            tolerance=0.25,
        ),
        Figure("PCA-200 send from a paged-out page", 22.0, pca_fault / 1000, "ms", t1),
        Figure("DC21140/NT U-Net send (trap + queue)", 5.8, nt_base_send, "us", t1),
        Figure("DC21140/NT U-Net receive, 40 bytes", 7.9, nt_base_recv, "us", f"{t1} (3+3.7+1.2)"),
        Figure(
            "DC21140/NT U-Net/MM: added by a TLB hit, send",
            1.0,
            nt_hit_send - nt_base_send,
            "us",
            t1,
        ),
        Figure(
            "DC21140/NT U-Net/MM: added by a TLB hit, receive",
            1.0,
            nt_hit_recv - nt_base_recv,
            "us",
            t1,
        ),
        Figure(
            "DC21140/NT send TLB miss, present, with unpin",
            20.0,
            nt_miss,
            "us",
            f"{t1} (16+4, in the trap)",
        ),
        Figure(
            "DC21140/NT pre-translate miss, present, with unpin", 41.0, nt_pre, "us", f"{t1} (37+4)"
        ),
        Figure("DC21140/NT send from a paged-out page", 22.0, nt_fault / 1000, "ms", t1),
        *integrated_figures(),
    ]


def integrated_figures() -> list[Figure]:
    """Round trips on the U-Net/MM NIs (virtual buffers) against their segment-buffer path:
    the time added per one-way trip, against the sum of Table 1's rows on that path."""
    t1 = "paper 002 Table 1"
    figures = []
    # (NI, label, hit, send miss, receive miss) with the Table 1 sums of each path.
    cases = (
        ("pca200", "PCA-200", (3.0, "1+2"), (51.0, "24+10+11+4, +2"), (52.0, "1, +24+10+11+4+2")),
        (
            "dc21140-nt",
            "DC21140/NT",
            (3.0, "1+1, +1 pre"),
            (22.0, "16+4, +1+1"),
            (43.0, "1, +37+4+1"),
        ),
    )
    for nic, label, hit, send_miss, recv_miss in cases:
        base = integrated_rtt(nic, "segment")[0]  # type: ignore[arg-type]
        for mode, (paper, terms), what in (
            ("hit", hit, "TLB hits"),
            ("send-miss", send_miss, "a send miss (TLB full)"),
            ("recv-miss", recv_miss, "a pre-translate miss on arrival (TLB full)"),
        ):
            rtt = integrated_rtt(nic, mode)[0]  # type: ignore[arg-type]
            figures.append(
                Figure(
                    f"{label} U-Net/MM NI ping-pong: added per one-way trip by {what}",
                    paper,
                    (rtt - base) / 2,
                    "us",
                    f"{t1} ({terms})",
                )
            )
    return figures


# ---------------------------------------------------------------------- the integrated NIs

#: TLB of the forced-miss runs: small, so that it is full and every miss also unpins the entry
#: it evicts, as in §6.1's "almost 50 us" (handshake, interrupt, pin and unpin).
MISS_TLB = {"entries": 16, "victim": 8}


def integrated_rtt(
    nic: Literal["pca200", "dc21140-nt"],
    mode: Mode,
    *,
    iterations: int = 8,
    warmup: int = 24,
) -> tuple[float, dict[str, MmNIStatistics]]:
    """Mean descriptor-level ping-pong round trip (us) on the U-Net/MM NIs, and their stats.

    The buffer cases of :func:`stacklib.bench.mm_pingpong.mm_round_trip` (``segment``,
    ``hit``, ``send-miss``, ``recv-miss``) of 64 bytes on a fresh two-node cluster; forced
    misses use a full TLB (:data:`MISS_TLB`).
    """
    sim = Simulation(seed=0)
    names = ["a", "b"]
    tlb = MmRecipeParams(**MISS_TLB) if mode.endswith("miss") else MmRecipeParams()
    depth = 1 if mode == "recv-miss" else 2
    tlb = attrs.evolve(tlb, pretranslate=depth)
    if nic == "pca200":
        cluster = build_atm_mm(sim, AtmMmParams(mm=tlb), names, None)
    else:
        cluster = build_fe_mm(sim, FastEthernetMmParams(mm=tlb), names, None)
    eps = [
        node.os.create_endpoint(node.os.process(f"app@{n}"), ENDPOINT)
        for n, node in cluster.nodes.items()
    ]
    channels = connect(eps[0], eps[1])
    rtt = sim.run(
        functools.partial(mm_round_trip, size=64, iterations=iterations, warmup=warmup),
        eps,
        channels,
        mode,
    )
    nis = [ep.ni for ep in eps]
    return rtt / US, {ni.name: ni.statistics() for ni in nis if isinstance(ni, MemoryManagedNI)}


register_experiment(
    Experiment(
        "mm",
        "U-Net/MM per-operation costs in virtual time (paper 002 Table 1, §6.1)",
        run_mm,
        seconds=0.2,  # wall time, measured once on a 2-core machine (--json wall_seconds)
    )
)


# ---------------------------------------------------------------------- Fig 3: Split-C traces

#: The experiment's scale: every size in bytes (data, pages, UAM buffers) divided by 64.
FIG3_SCALE = 64


def fig3_results(
    benchmarks: tuple[str, ...] = tuple(FIG3_SIZES),
    *,
    n: int = FIG3_RANKS,
    scale: int = FIG3_SCALE,
    entries: tuple[int, ...] = (1024, 256),
) -> list[TlbSimResult]:
    """Each benchmark's trace replayed through TLBs of ``entries`` (+16 victim) entries,
    with the receive ring the trace carries (paper 002 §6.2: 64 buffers of one page)."""
    results = []
    with progress.step("traces", len(benchmarks)) as traces:
        for benchmark in benchmarks:
            records = record_splitc(benchmark, n, scale=scale)
            for size in entries:
                results.append(
                    simulate(
                        records,
                        entries=size,
                        victim=16,
                        page_size=4096 // scale,
                        rx_buffers=0,
                        label=benchmark,
                    )
                )
            traces.advance()
    return results


def _non_compulsory(result: TlbSimResult) -> int:
    return result.tx_non_compulsory + result.rx_non_compulsory


def run_mm_fig3() -> list[Figure]:
    """Paper 002 §6.2's findings on Split-C traces at 1/64 scale."""
    s62 = "paper 002 §6.2, Fig 3"
    results = fig3_results()
    at = {(r.label, r.entries): r for r in results}
    clean_1024 = sum(_non_compulsory(r) == 0 for r in results if r.entries == 1024)
    good = [b for b in ("ssortsm", "mm16") if _non_compulsory(at[b, 256]) == 0]
    some = [b for b in ("rsortlg", "ssortlg") if _non_compulsory(at[b, 256]) > 0]
    figures = [
        Figure(
            "Split-C traces without non-compulsory misses, 1024+16 TLB",
            float(len(FIG3_SIZES)),
            float(clean_1024),
            "programs",
            f"{s62}: 'zero for a 1024-entry primary TLB'",
            tolerance=0.0,
        ),
        Figure(
            "ssortsm and mm16 without non-compulsory misses, 256+16 TLB",
            2.0,
            float(len(good)),
            "programs",
            f"{s62}: sample sort (one page of small buffers), matrix multiply (82 pages)",
            tolerance=0.0,
        ),
        Figure(
            "rsortlg and ssortlg with non-compulsory misses, 256+16 TLB",
            2.0,
            float(len(some)),
            "programs",
            f"{s62}: 'the other applications show some'",
            tolerance=0.0,
        ),
        Figure(
            "mm16: pages per node (receive ring included)",
            82.0,
            at["mm16", 256].pages / FIG3_RANKS,
            "pages",
            f"{s62}: 'only 82 pages are used by matrix multiply' (8 ranks: our estimate)",
        ),
    ]
    return figures


register_experiment(
    Experiment(
        "mm-fig3",
        "U-Net/MM TLB on Split-C traces at 1/64 scale (paper 002 §6.2, Fig 3)",
        run_mm_fig3,
        seconds=12.0,  # wall time, measured once on a 2-core machine (--json wall_seconds)
    )
)
