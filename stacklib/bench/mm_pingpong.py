"""The ``mm-pingpong`` workload: a ping-pong on the U-Net/MM NIs' virtual buffers (paper 002).

The message-level workloads (``pingpong``, ``bandwidth``) name their buffers by segment
offset, so on a U-Net/MM transport (``sim-atm-mm``, ``sim-fe-mm``) they take the base NI's
path and show the baseline.  This workload names them by virtual address in each process's
address space instead (:func:`~stacklib.transports.sim.mm.virtual`), so every transfer
translates through the NI TLB with paper 002 Table 1's costs, one row per buffer case::

    [workload]
    kind = "mm-pingpong"
    modes = ["segment", "hit", "send-miss", "recv-miss"]
    size = 64          # bytes: above both NIs' inline thresholds (40 and 63), so buffers
    iterations = 8
    warmup = 24

* ``segment``: segment-offset buffers, the baseline path;
* ``hit``: virtual buffers on the same pages every time (TLB hits after the first);
* ``send-miss``: every send from a fresh page (a transmit miss each);
* ``recv-miss``: every message into a fresh receive page posted just before it arrives
  (a pre-translate miss on arrival).

Each mode runs on endpoints of its own, opened on the recipe's first two nodes and closed after
(closing invalidates the endpoint's TLB entries), so the modes do not share translations.  A miss
also unpins the entry it evicts once the TLB is full (paper 002 §6.1's "almost 50 us"): with
the paper's 1024 entries a short run never fills it, with ``[transport.mm] entries = 16,
victim = 8`` it does from the warm-up on, and the added times are Table 1's sums
(:func:`stacklib.experiments.mm.integrated_rtt`).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any, Literal

import attrs
import trio

from stacklib.bench import Session, WorkloadKind, register_workload
from stacklib.bench.params import count_valid
from stacklib.bench.result import Cell, Column, Result
from stacklib.errors import ConfigError
from stacklib.services import UNetService
from stacklib.transports.sim.mm import MemoryManagedNI, virtual
from stacklib.unet import EndpointConfig, connect
from stacklib.unet.endpoint import Endpoint
from stacklib.unet.mm import PAGE_SIZE
from stacklib.wire.descriptor import Fragment, SendDescriptor

__all__ = ["MM_PINGPONG", "MODES", "MmPingPongParams", "Mode", "mm_round_trip"]

Mode = Literal["segment", "hit", "send-miss", "recv-miss"]
MODES: tuple[Mode, ...] = ("segment", "hit", "send-miss", "recv-miss")

#: Where the ping-pong's buffers live in each process (page-aligned; any address would do).
BASE = 0x1000_0000
#: The endpoints' segment: room for a message and the segment-mode receive buffers.
ENDPOINT = EndpointConfig(rx_buffers=0, tx_buffers=1, segment_size=64 * 1024)


def _modes(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    unknown = [mode for mode in value if mode not in MODES]
    if unknown or not value:
        raise ValueError(f"{attribute.name} must be some of {', '.join(MODES)}; got {list(value)}")


@attrs.frozen
class MmPingPongParams:
    """Recipe parameters of the ``mm-pingpong`` workload."""

    #: The buffer cases, one row each (module docstring).
    modes: tuple[str, ...] = attrs.field(default=MODES, converter=tuple, validator=_modes)
    #: Message size in bytes: above the NIs' inline thresholds, within one receive page.
    size: int = attrs.field(
        default=64, validator=[attrs.validators.ge(64), attrs.validators.le(PAGE_SIZE)]
    )
    #: Timed round trips per mode.
    iterations: int = attrs.field(default=8, validator=count_valid(1))
    #: Untimed round trips first (they fill a small TLB, so timed misses also unpin).
    warmup: int = attrs.field(default=24, validator=count_valid(0))


async def mm_round_trip(
    eps: Sequence[Endpoint],
    channels: Sequence[int],
    mode: Mode,
    *,
    size: int = 64,
    iterations: int = 8,
    warmup: int = 24,
) -> float:
    """Mean round trip (seconds) between ``eps[0]`` and ``eps[1]`` on U-Net/MM NIs, with the
    buffers of ``mode``; ``channels[i]`` is ``eps[i]``'s channel to the other."""
    # A hit run posts twice as many buffers as the NI keeps translated and re-posts each behind
    # the window, so its pre-translation happens after a delivery, off the round trip.
    ahead = [_pretranslated(ep.ni) for ep in eps]
    first_fresh = 2 * max(ahead) + 2
    pages = first_fresh + 2 * (warmup + iterations) + 8
    fresh = {id(ep): iter(range(first_fresh, pages)) for ep in eps}
    for ep, depth in zip(eps, ahead, strict=True):
        typing.cast(MemoryManagedNI, ep.ni).address_space(ep).map(BASE, pages * PAGE_SIZE)
        if mode == "segment":
            for k in range(4):
                ep.post_free(Fragment(8192 + k * 1024, 1024))
        elif mode == "recv-miss":
            ep.post_free(virtual(BASE + next(fresh[id(ep)]) * PAGE_SIZE, PAGE_SIZE))
        else:
            for k in range(2 * depth):
                ep.post_free(virtual(BASE + (1 + k) * PAGE_SIZE, PAGE_SIZE))

    def source(ep: Endpoint) -> Fragment:
        if mode == "segment":
            return Fragment(0, size)
        if mode == "send-miss":
            return virtual(BASE + next(fresh[id(ep)]) * PAGE_SIZE, size)
        return virtual(BASE, size)

    def received(ep: Endpoint, descriptor: Any) -> None:
        if mode == "recv-miss":
            ep.post_free(virtual(BASE + next(fresh[id(ep)]) * PAGE_SIZE, PAGE_SIZE))
        else:
            ep.release(descriptor)

    async def echo() -> None:
        for _ in range(warmup + iterations):
            descriptor = await eps[1].recv_descriptor()
            received(eps[1], descriptor)
            await eps[1].post(SendDescriptor(channels[1], (source(eps[1]),)))

    start = 0.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        for index in range(warmup + iterations):
            if index == warmup:
                start = trio.current_time()
            await eps[0].post(SendDescriptor(channels[0], (source(eps[0]),)))
            received(eps[0], await eps[0].recv_descriptor())
        elapsed = trio.current_time() - start
    return elapsed / iterations


def _pretranslated(ni: object) -> int:
    """How many free buffers ``ni`` keeps translated ahead of arrivals (at least 1)."""
    if not isinstance(ni, MemoryManagedNI):
        raise TypeError(f"a U-Net/MM NI is needed, got {type(ni).__name__}")
    return max(1, ni.mm.params.pretranslate)


def _tlb_counts(ni: object) -> tuple[int, int, int]:
    """(hits, misses, evictions) of ``ni``'s TLB so far."""
    mm = typing.cast(MemoryManagedNI, ni).statistics().mm
    return (mm.hits, sum(mm.misses.values()), mm.evictions) if mm else (0, 0, 0)


async def run_mm_pingpong(session: Session, params: MmPingPongParams) -> Result:
    """Run every mode of ``params`` on fresh endpoints of the session's first two nodes."""
    services = [typing.cast(UNetService, service) for service in session.services[:2]]
    nodes = [service.endpoint.ni for service in services]
    if not all(isinstance(ni, MemoryManagedNI) for ni in nodes):
        raise ConfigError(
            "recipe",
            "transport.kind",
            "mm-pingpong needs a U-Net/MM transport (sim-atm-mm, sim-fe-mm)",
        )
    kernels = [service.endpoint.os for service in services]
    rows: list[dict[str, Cell]] = []
    baseline: float | None = None
    for mode in typing.cast(tuple[Mode, ...], params.modes):
        eps = [k.create_endpoint(k.process(f"mm-pingpong {mode}"), ENDPOINT) for k in kernels]
        channels = connect(eps[0], eps[1])
        before = _tlb_counts(nodes[0])
        try:
            rtt = await mm_round_trip(
                eps,
                channels,
                mode,
                size=params.size,
                iterations=params.iterations,
                warmup=params.warmup,
            )
        finally:
            for ep in eps:
                ep.close()
        after = _tlb_counts(nodes[0])
        if mode == "segment":
            baseline = rtt
        rows.append(
            {
                "mode": mode,
                "rtt_us": rtt * 1e6,
                "added_us": (rtt - baseline) / 2 * 1e6 if baseline is not None else None,
                "hits": after[0] - before[0],
                "misses": after[1] - before[1],
                "evictions": after[2] - before[2],
            }
        )
    return Result(
        title=f"U-Net/MM ping-pong of {params.size} bytes, virtual buffers against segment ones",
        columns=[
            Column("mode", "buffers"),
            Column("rtt_us", "RTT", "us", 2),
            Column("added_us", "added per one-way trip", "us", 2),
            Column("hits", "TLB hits (node 0)"),
            Column("misses", "TLB misses (node 0)"),
            Column("evictions", "evictions (node 0)"),
        ],
        rows=rows,
        facts={"size": params.size, "iterations": params.iterations, "warmup": params.warmup},
        notes=(
            "added: (RTT - the segment RTT) / 2, paper 002 Table 1's costs on that path; "
            "a miss unpins the entry it evicts only once the TLB is full "
            "(docs/memory-management.md)",
        ),
    )


MM_PINGPONG = register_workload(
    WorkloadKind(
        name="mm-pingpong",
        Params=MmPingPongParams,
        run=run_mm_pingpong,
        description="ping-pong on U-Net/MM virtual buffers: TLB hits and misses (paper 002)",
        requires=UNetService,
    )
)
