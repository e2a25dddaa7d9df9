"""The Split-C buffer tracer: the buffers of Split-C runs as paper 002 §6.2's instrumented
runtime saw them, as a U-Net/MM buffer trace (:mod:`stacklib.unet.mm.trace`).

:class:`SplitcTracer` hooks UAM's and Split-C's entry points while installed and turns every
message into trace records with addresses from each rank's
:class:`~stacklib.unet.mm.layout.ProcessLayout`; :func:`record_splitc` runs a benchmark of the
Split-C suite (:mod:`stacklib.bench.splitc.programs`) under it, at paper 002's sizes
(:data:`FIG3_SIZES`) or scaled down.  The trace feeds the NI TLB simulation
(:mod:`stacklib.unet.mm.tlbsim`): experiment ``mm-fig3`` (stacklib/experiments/mm.py) and
``stacklib trace record --splitc``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import numpy as np

import stacklib
from stacklib.bench.splitc.cluster import SPLITC_UAM, run_spmd
from stacklib.bench.splitc.programs import PAPER_SIZES, PROGRAMS
from stacklib.errors import ConfigError
from stacklib.layers.splitc import SplitC
from stacklib.layers.uam import UamService
from stacklib.layers.uam.wire import CHUNK_SIZE
from stacklib.transports.sim.machines import MACHINES
from stacklib.unet.mm.layout import ProcessLayout
from stacklib.unet.mm.trace import TraceRecord

__all__ = [
    "FIG3_RANKS",
    "FIG3_SIZES",
    "SMALL_MESSAGE",
    "SplitcTracer",
    "record_splitc",
    "scaled_sizes",
]

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
