"""U-Net/MM inside the simulated PCA-200 and DC21140/NT NIs (stacklib.transports.sim.mm).

Paper 002 Table 1 gives each path's costs; the NIs charge them in virtual time, so the round
trips below differ from the segment-buffer path by exactly the sums of Table 1's rows.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import UNetError
from stacklib.experiments.mm import integrated_rtt
from stacklib.recipes import parse_recipe, run_recipe
from stacklib.sim import Simulation
from stacklib.transports.sim import SimCluster
from stacklib.transports.sim.mm import (
    VIRTUAL,
    AtmMmParams,
    FastEthernetMmParams,
    MemoryManagedNI,
    MmNIStatistics,
    MmRecipeParams,
    build_atm_mm,
    build_fe_mm,
    is_virtual,
    virtual,
    virtual_address,
)
from stacklib.unet import DescriptorStatus, DropReason, Endpoint, EndpointConfig, connect
from stacklib.unet.mm import PAGE_SIZE, Protection
from stacklib.wire.descriptor import (
    Fragment,
    RecvKind,
    SendDescriptor,
    SendError,
    build_send,
    parse_send,
)

BASE = 0x2000_0000
CONFIG = EndpointConfig(rx_buffers=0, tx_buffers=1)


def _pair(
    kind: str = "atm", mm: MmRecipeParams | None = None, senders: int = 1
) -> tuple[Simulation, SimCluster, list[Endpoint], Endpoint, list[int]]:
    """Nodes a and b; ``senders`` endpoints at a (one process each), one at b, channels to it."""
    sim = Simulation(seed=0)
    mm = mm or MmRecipeParams()
    if kind == "atm":
        cluster = build_atm_mm(sim, AtmMmParams(mm=mm), ["a", "b"], None)
    else:
        cluster = build_fe_mm(sim, FastEthernetMmParams(mm=mm), ["a", "b"], None)
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    receiver = b.os.create_endpoint(b.os.process("server"), CONFIG)
    sources = [a.os.create_endpoint(a.os.process(f"app{i}"), CONFIG) for i in range(senders)]
    channels = []
    targets = [receiver]
    for port, source in enumerate(sources):
        # One endpoint per remote endpoint and channel at b (ATM: one VCI pair each).
        target = (
            receiver if port == 0 else b.os.create_endpoint(b.os.process(f"server{port}"), CONFIG)
        )
        channels.append(connect(source, target)[0])
        if target is not receiver:
            targets.append(target)
    for ep in [*sources, *targets]:
        _ni(ep).address_space(ep).map(BASE, 64 * PAGE_SIZE)
    return sim, cluster, sources, receiver, channels


def _ni(ep: Endpoint) -> MemoryManagedNI:
    ni = ep.ni
    assert isinstance(ni, MemoryManagedNI)
    return ni


def _post_buffers(ep: Endpoint, count: int, size: int = PAGE_SIZE, first: int = 32) -> None:
    for k in range(count):
        ep.post_free(virtual(BASE + first * PAGE_SIZE + k * size, size))


# ---------------------------------------------------------------------- costs through the NI


@pytest.mark.parametrize(
    ("nic", "hit", "send_miss", "recv_miss"),
    [("pca200", 1 + 2, 24 + 10 + 11 + 4 + 2, 1 + 24 + 10 + 11 + 4 + 2), ("dc21140-nt", 3, 22, 43)],
)
def test_round_trip_adds_table1_costs(
    nic: Any, hit: float, send_miss: float, recv_miss: float
) -> None:
    base, _ = integrated_rtt(nic, "segment", iterations=4)
    added = {}
    for mode in ("hit", "send-miss", "recv-miss"):
        rtt, stats = integrated_rtt(nic, mode, iterations=4)
        added[mode] = (rtt - base) / 2
        mm = stats["a"].mm
        assert mm is not None and mm.hits > 0
        if mode == "send-miss":
            assert mm.misses["transmit/present"] >= 20 and mm.evictions > 0
    assert added["hit"] == pytest.approx(hit, abs=0.01)
    assert added["send-miss"] == pytest.approx(send_miss, abs=0.01)
    assert added["recv-miss"] == pytest.approx(recv_miss, abs=0.01)


def test_segment_buffers_keep_the_baseline_numbers() -> None:
    def rtts(transport: dict[str, Any]) -> list[float]:
        recipe = parse_recipe(
            {
                "run": {"clock": "virtual", "seed": 1},
                "transport": transport,
                "workload": {"kind": "pingpong", "sizes": [4, 1000], "iterations": 3},
            },
            "test",
        )
        return [float(row["rtt_us"]) for row in run_recipe(recipe).rows]  # type: ignore[arg-type]

    assert rtts({"kind": "sim-atm-mm"}) == rtts({"kind": "sim-atm", "ni": "pca200", "link": "oc-3"})
    assert rtts({"kind": "sim-fe-mm"}) == rtts({"kind": "sim-fe"})


def test_virtual_buffers_carry_the_data_and_the_statistics() -> None:
    sim, _, (a,), b, (ch,) = _pair()
    payload = bytes(range(256)) * 30  # two receive buffers of 4 KB
    _ni(a).address_space(a).write(BASE + 100, payload)
    _post_buffers(b, 4)

    async def main() -> bytes:
        await a.post(SendDescriptor(ch, (virtual(BASE + 100, len(payload)),)))
        descriptor = await b.recv_descriptor()
        assert descriptor.kind is RecvKind.BUFFERS
        assert all(is_virtual(f) for f in descriptor.fragments)
        assert len(descriptor.fragments) == 2
        return _ni(b).read_message(b, descriptor)

    assert sim.run(main) == payload
    stats = _ni(b).statistics()
    assert isinstance(stats, MmNIStatistics) and stats.mm is not None
    assert stats.received == 1
    assert stats.mm.misses == {"receive/present": 4}
    sent = _ni(a).statistics().mm
    assert sent is not None and sent.misses == {"transmit/present": 2}
    assert sent.pinned_bytes == 2 * PAGE_SIZE


# ---------------------------------------------------------------------- protection


@pytest.mark.parametrize("kind", ["atm", "fe"])
def test_privilege_violation_is_an_error_status(kind: str) -> None:
    sim, _, (a,), b, (ch,) = _pair(kind)
    _ni(a).address_space(a).map(0x4000_0000, PAGE_SIZE, protection=Protection.WRITE)
    _post_buffers(b, 2)

    async def main() -> list[SendDescriptor]:
        bad = [
            SendDescriptor(ch, (virtual(0x5000_0000, 100),)),  # not mapped at all
            SendDescriptor(ch, (virtual(0x4000_0000, 100),)),  # write-only
        ]
        good = SendDescriptor(ch, (virtual(BASE, 100),))
        for descriptor in [*bad, good]:
            await a.post(descriptor)
        await b.recv_descriptor()
        return [*bad, good]

    first, second, good = sim.run(main)
    for descriptor in (first, second):
        assert descriptor.status is DescriptorStatus.ERROR
        assert descriptor.error is SendError.PRIVILEGE
    assert good.status is DescriptorStatus.INJECTED
    assert _ni(a).statistics().send_errors == {"PRIVILEGE": 2}
    assert a.send_errors["PRIVILEGE"] == 2


def test_virtual_fragment_bounds_and_misuse() -> None:
    with pytest.raises(UNetError, match="2 GB"):
        virtual(VIRTUAL, 1)
    with pytest.raises(UNetError, match="2 GB"):
        virtual(VIRTUAL - 10, 11)
    sim, _, (a,), _, (ch,) = _pair()

    async def main() -> SendDescriptor:
        descriptor = SendDescriptor(ch, (virtual(BASE, 100), Fragment(1 << 20, 10)))
        await a.post(descriptor)
        await trio.sleep(0.001)
        return descriptor

    assert sim.run(main).error is SendError.OUT_OF_BOUNDS


@given(st.integers(0, VIRTUAL - 1), st.integers(1, 65535))
def test_virtual_fragments_round_trip_through_the_wire_format(address: int, length: int) -> None:
    length = min(length, VIRTUAL - address)
    fragment = virtual(address, length)
    parsed = parse_send(build_send(SendDescriptor(3, (fragment, Fragment(8, 16)))))
    assert parsed.fragments[0] == fragment
    assert is_virtual(parsed.fragments[0]) and virtual_address(parsed.fragments[0]) == address
    assert not is_virtual(parsed.fragments[1])


# ---------------------------------------------------------------------- deferred page-in


def test_page_in_suspends_only_its_endpoint() -> None:
    sim, cluster, (slow, fast), b, (ch_slow, ch_fast) = _pair(senders=2)
    space = _ni(slow).address_space(slow)
    assert space is not _ni(fast).address_space(fast)  # one address space per process
    space.write(BASE, b"paged out")
    assert space.page_out(BASE // PAGE_SIZE)
    fast_target = next(ep for ep in cluster.nodes["b"].ni.endpoints.values() if ep is not b)
    _post_buffers(b, 2)
    _post_buffers(fast_target, 8, size=256)
    arrivals: list[tuple[str, float]] = []

    async def receive(ep: Endpoint, label: str, count: int) -> None:
        for _ in range(count):
            descriptor = await ep.recv_descriptor()
            arrivals.append((label, trio.current_time()))
            _ni(ep).read_message(ep, descriptor)
            ep.release(descriptor)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive, b, "slow", 1)
            nursery.start_soon(receive, fast_target, "fast", 20)
            await slow.post(SendDescriptor(ch_slow, (virtual(BASE, 100),)))
            for _ in range(20):
                await fast.post(SendDescriptor(ch_fast, (virtual(BASE + PAGE_SIZE, 100),)))
                await trio.sleep(100e-6)

    sim.run(main)
    assert [label for label, _ in arrivals][:20] == ["fast"] * 20
    slow_at = dict(arrivals)["slow"]
    assert 0.022 < slow_at < 0.0225  # Table 1's ~22 ms page-in, then the retried hit
    mm = _ni(slow).statistics().mm
    assert mm is not None and mm.page_ins == 1 and mm.misses["transmit/page-in"] == 1


# ---------------------------------------------------------------------- pre-translation, close


def test_arrival_without_pretranslated_buffers_is_dropped_and_counted() -> None:
    sim, _, (a,), b, (ch,) = _pair(mm=MmRecipeParams(pretranslate=1))
    _post_buffers(b, 3, size=256)

    async def main() -> None:
        await a.post(SendDescriptor(ch, (virtual(BASE, 600),)))  # needs three buffers
        await trio.sleep(0.001)

    sim.run(main)
    assert b.dropped[DropReason.NO_FREE_BUFFER] == 1
    mm = _ni(b).statistics().mm
    assert mm is not None and mm.dropped_no_buffer == 1
    assert b.recv_queue.pop() is None


def test_closing_an_endpoint_invalidates_its_entries() -> None:
    sim, _, (a,), b, (ch,) = _pair()
    _post_buffers(b, 4)

    async def main() -> None:
        await a.post(SendDescriptor(ch, (virtual(BASE, 100),)))
        await b.recv_descriptor()

    sim.run(main)
    ni = _ni(b)
    before = ni.statistics().mm
    assert before is not None and before.valid_entries == 4
    assert ni.mm.memory.pinned_frames == 4
    b.close()
    after = ni.statistics().mm
    assert after is not None
    assert after.valid_entries == 0 and after.invalidations == 4 and after.pinned_bytes == 0
    assert ni.mm.memory.pinned_frames == 0
