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
benchmarks (:class:`SplitcTracer`, :func:`record_splitc`), replayed through 1024- and
256-entry TLBs with a 16-entry victim cache, at 1/64 scale (every byte count, the page
included, divided by 64, so that the runs take seconds and touch as many pages as at full size).

docs/memory-management.md has the table and how each figure was read.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import attrs
import numpy as np
import trio

from stacklib.bench.mm_pingpong import ENDPOINT, Mode, mm_round_trip
from stacklib.errors import ConfigError
from stacklib.reproduce import Experiment, Figure, register_experiment
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
from stacklib.unet.mm.layout import ProcessLayout
from stacklib.unet.mm.tlbsim import TlbSimResult, simulate
from stacklib.unet.mm.trace import TraceRecord

US = 1e-6

__all__ = [
    "FIG3_SIZES",
    "SERVED_DURING_FAULT",
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
    )
)


# ---------------------------------------------------------------------- Fig 3: Split-C traces

#: Paper 002 §6.2's Split-C runs: benchmark -> (program, sizes).  "8 by 8 blocks with 128 by
#: 128 double floats in each block and ... 16 by 16 blocks with 16 by 16 double floats"; the
#: sorts "with 256K keys per node".
FIG3_SIZES: dict[str, tuple[str, tuple[int, ...]]] = {
    "mm128": ("mm", (8, 128)),
    "mm16": ("mm", (16, 16)),
    "rsortlg": ("rsortlg", (256 * 1024,)),
    "ssortsm": ("ssortsm", (256 * 1024,)),
    "ssortlg": ("ssortlg", (256 * 1024,)),
}
#: Ranks of the traced runs: paper 002 does not say; 8 is paper 003's largest cluster.
FIG3_RANKS = 8
#: The experiment's scale: every size in bytes (data, pages, UAM buffers) divided by 64.
FIG3_SCALE = 64
#: A small message's bytes on the wire (a UAM request or reply: four words and a header).
SMALL_MESSAGE = 24


def scaled_sizes(program: str, sizes: tuple[int, ...], scale: int) -> tuple[int, ...]:
    """``sizes`` of ``program`` with every byte count divided by ``scale``.

    mm: the block's side shrinks by sqrt(scale) (``scale`` must be a square); the others:
    the first size (keys, or rows per rank) shrinks by ``scale``.
    """
    if scale < 1:
        raise ValueError(f"scale must be >= 1, not {scale}")
    if program == "mm":
        root = math.isqrt(scale)
        if root * root != scale or sizes[1] % root:
            raise ValueError(f"mm {sizes}: scale {scale} must be a square dividing the block")
        return (sizes[0], sizes[1] // root)
    if sizes[0] % scale:
        raise ValueError(f"{program} {sizes}: scale {scale} does not divide {sizes[0]}")
    return (sizes[0] // scale, *sizes[1:])


@attrs.define
class _Process:
    """One traced rank: its address layout and what the tracer knows about its buffers."""

    service: Any
    layout: ProcessLayout
    rank: int = -1
    peers: dict[int, int] = attrs.Factory(dict)  # UAM peer (channel) -> rank
    regions: dict[int, tuple[int, int, int]] = attrs.Factory(dict)  # id -> real, bytes, vaddr
    arrays: dict[int, int] = attrs.Factory(dict)  # id(owner array) -> vaddr
    source: int | None = None  # the vaddr of the array a bulk store is sending


class SplitcTracer:
    """Records the buffers of Split-C runs as paper 002 §6.2's instrumented runtime saw them.

    While :meth:`installed`, the UAM and Split-C entry points are wrapped (the same class-level
    hook as ``NetworkInterface.buffer_trace``) and every message becomes trace records, with
    addresses from each rank's :class:`~stacklib.unet.mm.layout.ProcessLayout`:

    * a small message (request, reply, scalar store, a get's request) goes out of the next
      slot of the page of small-message buffers;
    * bulk data goes out of the array itself, one record per UAM buffer (``chunk_size``): a
      get's reply from the target's region, a bulk store or put from the source array (a
      registered region, or a heap array allocated when first sent and freed with it; data
      that is not an array view, e.g. a collective's packed values, from a heap copy);
    * every arrival fills the next buffers of the 64-buffer receive ring, one per page.

    UAM's acknowledgments are not recorded (paper 002 §6.2 traced the programs' sends and
    receives); each rank is process and node ``rank``, endpoint 0.
    """

    def __init__(self, *, page_size: int = 4096, rx_buffers: int = 64) -> None:
        self.page_size = page_size
        self.rx_buffers = rx_buffers
        self.records: list[TraceRecord] = []
        self._processes: dict[int, _Process] = {}  # id(UamService) -> process
        self._ranks: dict[int, _Process] = {}

    # ------------------------------------------------------------------ bookkeeping

    def _process(self, service: Any) -> _Process:
        process = self._processes.get(id(service))
        if process is None or process.service is not service:
            layout = ProcessLayout(page_size=self.page_size, rx_buffers=self.rx_buffers)
            process = self._processes[id(service)] = _Process(service, layout)
        return process

    def _tx(self, process: _Process, address: int, length: int) -> None:
        if process.rank >= 0 and length > 0:
            self.records.append(TraceRecord(0, process.rank, 0, address, length, process.rank))

    def _rx(self, process: _Process | None, length: int) -> None:
        if process is None or process.rank < 0:
            return
        for address, nbytes in process.layout.receive_buffers(length):
            self.records.append(TraceRecord(1, process.rank, 0, address, nbytes, process.rank))

    def _small(self, sender: _Process, peer: int) -> None:
        self._tx(sender, sender.layout.small_buffer(), sender.layout.slot_size)
        self._rx(self._ranks.get(sender.peers.get(peer, -1)), SMALL_MESSAGE)

    def _bulk(self, sender: _Process, receiver: _Process | None, address: int, n: int) -> None:
        chunk = max(1, int(sender.service.chunk_size))
        for start in range(0, max(n, 1), chunk):
            length = min(chunk, n - start)
            self._tx(sender, address + start, length)
            self._rx(receiver, max(length, SMALL_MESSAGE))

    def _source(self, process: _Process, data: Any) -> tuple[int, bool]:
        """The vaddr bulk ``data`` is sent from, and whether it is a temporary copy."""
        if isinstance(data, np.ndarray) and data.flags.c_contiguous:
            real = int(data.__array_interface__["data"][0])
            for start, size, vaddr in process.regions.values():
                if start <= real < start + size:
                    return vaddr + real - start, False
            owner = data
            while isinstance(owner.base, np.ndarray):
                owner = owner.base
            key = id(owner)
            known = process.arrays.get(key)
            if known is None:
                known = process.arrays[key] = process.layout.alloc(owner.nbytes)
                # Freed when the array is: the next array may take its place, as in C.
                weakref.finalize(owner, self._release, process, key, known)
            return known + real - int(owner.__array_interface__["data"][0]), False
        nbytes = np.asarray(data).nbytes if not isinstance(data, bytes | bytearray) else len(data)
        return process.layout.alloc(nbytes), True

    @staticmethod
    def _release(process: _Process, key: int, vaddr: int) -> None:
        if process.arrays.get(key) == vaddr:
            del process.arrays[key]
            process.layout.free(vaddr)

    # ------------------------------------------------------------------ the hooks

    @contextmanager
    def installed(self) -> Iterator[SplitcTracer]:
        """Trace every Split-C rank created inside the ``with`` block (pure modules only)."""
        import stacklib
        from stacklib.layers.splitc import SplitC
        from stacklib.layers.uam import UamService

        if stacklib.COMPILED is not None:
            # Compiled Split-C calls UAM and its own methods directly, past these hooks:
            # the trace would come out empty.
            raise ConfigError(
                "STACKLIB_COMPILED",
                stacklib.COMPILED,
                "the Split-C buffer trace hooks the interpreted classes: run it with "
                "STACKLIB_COMPILED=0",
            )
        tracer = self
        saved: list[tuple[type, str, Any]] = []

        def wrap(cls: type, name: str, make: Callable[[Any], Any]) -> None:
            original = cls.__dict__[name]
            saved.append((cls, name, original))
            setattr(cls, name, make(original))

        def register_region(original: Any) -> Any:
            def hooked(service: Any, buffer: Any, name: str | None = None) -> int:
                region: int = original(service, buffer, name)
                if name is not None and name.startswith("splitc:"):
                    # A program's array.  The runtime's own areas (collective slots) are not
                    # in the traced address space: collectives send from a heap copy.
                    real = np.frombuffer(buffer, np.uint8)
                    process = tracer._process(service)
                    vaddr = process.layout.alloc(real.nbytes)
                    start = int(real.__array_interface__["data"][0])
                    process.regions[region] = (start, real.nbytes, vaddr)
                return region

            return hooked

        def request_nowait(original: Any) -> Any:
            def hooked(service: Any, peer: int, handler: Any, *args: int) -> None:
                original(service, peer, handler, *args)
                tracer._small(tracer._process(service), peer)

            return hooked

        def request(original: Any) -> Any:
            async def hooked(service: Any, peer: int, handler: Any, *args: int) -> None:
                await original(service, peer, handler, *args)
                tracer._small(tracer._process(service), peer)

            return hooked

        def reply(original: Any) -> Any:
            def hooked(service: Any, handler: Any, *args: int) -> None:
                current = service._current
                original(service, handler, *args)
                machine = current[0]
                for peer, known in service._machines.items():
                    if known is machine:
                        tracer._small(tracer._process(service), peer)
                        break

            return hooked

        def store(original: Any) -> Any:
            async def hooked(
                service: Any, peer: int, data: Any, remote: Any, handler: Any, *args: int
            ) -> None:
                process = tracer._process(service)
                source, process.source = process.source, None
                temporary = source is None
                nbytes = len(memoryview(data).cast("B"))
                if source is None:
                    # Runtime data of a fixed size (a collective's histogram or splitters)
                    # does not shrink with the program: scale it like the pages.
                    nbytes = max(1, nbytes * tracer.page_size // 4096)
                    source = process.layout.alloc(nbytes)
                receiver = tracer._ranks.get(process.peers.get(peer, -1))
                tracer._bulk(process, receiver, source, nbytes)
                try:
                    await original(service, peer, data, remote, handler, *args)
                finally:
                    if temporary:
                        process.layout.free(source)

            return hooked

        def get(original: Any) -> Any:
            async def hooked(
                service: Any,
                peer: int,
                remote: Any,
                nbytes: int,
                local: Any,
                handler: Any,
                *args: int,
            ) -> None:
                await original(service, peer, remote, nbytes, local, handler, *args)
                process = tracer._process(service)
                target = tracer._ranks.get(process.peers.get(peer, -1))
                if target is None:
                    return
                region = target.service.region_id(remote[0])
                vaddr = target.regions[region][2] + remote[1]
                chunk = max(1, int(service.chunk_size))
                for start in range(0, max(nbytes, 1), chunk):
                    length = min(chunk, nbytes - start)
                    tracer._small(process, peer)  # the GET of this chunk
                    tracer._tx(target, vaddr + start, length)
                    tracer._rx(process, max(length, SMALL_MESSAGE))

            return hooked

        def splitc_init(original: Any) -> Any:
            def hooked(sc: Any, am: Any, rank: int, channels: Any, **kwargs: Any) -> None:
                original(sc, am, rank, channels, **kwargs)
                process = tracer._process(am)
                process.rank = rank
                process.peers = {peer: r for r, peer in channels.items()}
                tracer._ranks[rank] = process

            return hooked

        def bulk_send(original: Any) -> Any:
            async def hooked(sc: Any, dst: Any, data: Any) -> Any:
                process = tracer._process(sc.am)
                start, temporary = None, False
                if dst.rank != sc.rank:
                    start, temporary = tracer._source(process, data)
                    process.source = start
                try:
                    return await original(sc, dst, data)
                finally:
                    process.source = None
                    if temporary and start is not None:
                        process.layout.free(start)

            return hooked

        wrap(UamService, "register_region", register_region)
        wrap(UamService, "request_nowait", request_nowait)
        wrap(UamService, "request", request)
        wrap(UamService, "reply", reply)
        wrap(UamService, "store", store)
        wrap(UamService, "get", get)
        wrap(SplitC, "__init__", splitc_init)
        wrap(SplitC, "bulk_store", bulk_send)
        wrap(SplitC, "bulk_put", bulk_send)
        try:
            yield self
        finally:
            for cls, name, original in reversed(saved):
                setattr(cls, name, original)


def record_splitc(
    benchmark: str,
    n: int = FIG3_RANKS,
    *,
    scale: int = 1,
    sizes: tuple[int, ...] | None = None,
    transport: str = "sim-memory",
    seed: int = 1,
) -> list[TraceRecord]:
    """Run a Split-C benchmark on ``n`` ranks and return its buffer trace.

    ``benchmark`` is a key of :data:`FIG3_SIZES` (paper 002's sizes) or of the Split-C suite's
    ``PAPER_SIZES``; ``sizes`` overrides them.  At ``scale`` s every byte count is divided by
    s: the data (:func:`scaled_sizes`), the page (4096/s) and UAM's buffers (4160/s), so the
    run touches as many pages, in as many messages, as at full size.
    """
    from stacklib.bench.splitc.cluster import SPLITC_UAM, run_spmd
    from stacklib.bench.splitc.programs import PAPER_SIZES, PROGRAMS
    from stacklib.layers.uam.wire import CHUNK_SIZE
    from stacklib.transports.sim.machines import MACHINES

    if 4096 % scale or 4096 // scale < 64:
        raise ValueError(f"scale must divide 4096 into pages of at least 64 bytes, not {scale}")
    table = FIG3_SIZES if benchmark in FIG3_SIZES else PAPER_SIZES
    if benchmark not in table:
        known = ", ".join(sorted({*FIG3_SIZES, *PAPER_SIZES}))
        raise KeyError(f"no Split-C benchmark {benchmark!r} (known: {known})")
    name, default = table[benchmark]
    factory, _ = PROGRAMS[name]
    program = factory(
        *(sizes or scaled_sizes(name, default, scale)),
        machine=MACHINES.get(transport),
        seed=seed,
    )
    uam = attrs.evolve(SPLITC_UAM, chunk_size=max(1, CHUNK_SIZE // scale))
    tracer = SplitcTracer(page_size=4096 // scale)
    with tracer.installed():
        run = run_spmd(program, n, transport, seed=seed, uam=uam)
    if not all(result.ok for result in run.results):
        raise RuntimeError(f"Split-C {benchmark}: a rank's result did not verify")
    return tracer.records


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
    )
)
