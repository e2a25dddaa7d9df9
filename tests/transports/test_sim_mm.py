"""U-Net/MM inside the simulated PCA-200 and DC21140/NT NIs (stacklib.transports.sim.mm).

Paper 002 Table 1 gives each path's costs; the NIs charge them in virtual time, so the round
trips below differ from the segment-buffer path by exactly the sums of Table 1's rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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
from stacklib.unet.mm import PAGE_SIZE, AddressSpace, Protection
from stacklib.wire.descriptor import (
    Fragment,
    RecvKind,
    SendDescriptor,
    SendError,
    build_send,
    parse_send,
)

T = TypeVar("T")
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


def _run(sim: Simulation, main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` with a virtual-time bound: a lost message fails the test, never hangs it."""

    async def bounded() -> T:
        with trio.fail_after(1.0):
            return await main()

    return sim.run(bounded)


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

    assert _run(sim, main) == payload
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

    first, second, good = _run(sim, main)
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

    assert _run(sim, main).error is SendError.OUT_OF_BOUNDS


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

    _run(sim, main)
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

    _run(sim, main)
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

    _run(sim, main)
    ni = _ni(b)
    before = ni.statistics().mm
    assert before is not None and before.valid_entries == 4
    assert ni.mm.memory.pinned_frames == 4
    b.close()
    after = ni.statistics().mm
    assert after is not None
    assert after.valid_entries == 0 and after.invalidations == 4 and after.pinned_bytes == 0
    assert ni.mm.memory.pinned_frames == 0


# ---------------------------------------------------------------------- receive miss paths

OTHER = 0x3000_0000

#: Paper 002 Table 1, PCA-200 pre-translate misses (handshake 24 + interrupt 10 + pin + unpin 4).
TABLE1_PCA200_MISS_US = {"present": 24 + 10 + 11 + 4, "copy-on-write": 82, "zero-page": 74}


def _one_way(setup: str) -> tuple[float, MemoryManagedNI, Endpoint, AddressSpace]:
    """Arrival time of one 100-byte message into a one-page receive buffer set up as ``setup``;
    the receiving NI and endpoint, and a parent process sharing the buffer's page."""
    sim, _, (a,), b, (ch,) = _pair(mm=MmRecipeParams(pretranslate=1))
    space = _ni(b).address_space(b)
    parent = AddressSpace(99, space.memory)
    parent.map(OTHER, PAGE_SIZE)
    parent.write(OTHER, b"parent's")
    if setup == "copy-on-write":
        space.share_from(parent, OTHER, PAGE_SIZE)  # as after fork: the NI must not write it
    elif setup == "zero-page":
        space.map(OTHER, PAGE_SIZE, present=False)
    else:
        space.map(OTHER, PAGE_SIZE)
    b.post_free(virtual(OTHER, PAGE_SIZE))
    _ni(a).address_space(a).write(BASE, b"x" * 100)

    async def main() -> float:
        await a.post(SendDescriptor(ch, (virtual(BASE, 100),)))
        descriptor = await b.recv_descriptor()
        assert _ni(b).read_message(b, descriptor) == b"x" * 100
        return trio.current_time()

    return _run(sim, main), _ni(b), b, parent


@pytest.mark.parametrize("setup", ["copy-on-write", "zero-page"])
def test_copy_on_write_and_zero_page_misses_cost_table1(setup: str) -> None:
    present, _, _, _ = _one_way("present")
    at, ni, b, parent = _one_way(setup)
    mm = ni.statistics().mm
    assert mm is not None and mm.misses == {f"receive/{setup}": 1}
    # Only the kernel's work on the page differs between the runs: Table 1's rows differ so.
    added_us = (at - present) * 1e6
    expected = TABLE1_PCA200_MISS_US[setup] - TABLE1_PCA200_MISS_US["present"]
    assert added_us == pytest.approx(expected, abs=0.01)
    space = ni.address_space(b)
    page = space.pages[OTHER // PAGE_SIZE]
    assert page.frame is not None and not page.read_only and not page.shared
    assert page.frame != parent.pages[OTHER // PAGE_SIZE].frame
    assert ni.mm.memory.pinned(page.frame)  # the NI wrote into the new, pinned frame
    assert parent.read(OTHER, 8) == b"parent's"  # the sharer's page is untouched
    # The rest of the buffer: the copied contents, or a fresh zero page.
    assert space.read(OTHER + 100, 8) == bytes(8)
    if setup == "copy-on-write":
        assert space.read(OTHER, 100) == b"x" * 100


def test_buffer_whose_page_in_is_late_is_returned_unfilled() -> None:
    sim, _, (a,), b, (ch,) = _pair(mm=MmRecipeParams(pretranslate=2))
    space = _ni(b).address_space(b)
    # Not page-aligned, so no zero page: the kernel must page it in (~22 ms, Table 1).
    space.map(OTHER, PAGE_SIZE, present=False)
    b.post_free(virtual(OTHER + 256, 256))
    b.post_free(virtual(BASE + 32 * PAGE_SIZE, 256))
    _ni(a).address_space(a).write(BASE, b"y" * 100)

    async def main() -> bytes:
        await a.post(SendDescriptor(ch, (virtual(BASE, 100),)))
        descriptor = await b.recv_descriptor()
        assert [virtual_address(f) for f in descriptor.fragments] == [BASE + 32 * PAGE_SIZE]
        return _ni(b).read_message(b, descriptor)

    assert _run(sim, main) == b"y" * 100
    ni = _ni(b)
    assert [(r.address, r.length, r.reason) for r in ni.returned] == [
        (OTHER + 256, 256, "page-in late")
    ]
    mm = ni.statistics().mm
    assert mm is not None and mm.buffers_skipped == 1 and mm.dropped_no_buffer == 0
    assert mm.misses["receive/page-in"] == 1
    assert space.pages[OTHER // PAGE_SIZE].frame is None  # still on disk: nothing written


def test_pinning_cap_bounds_valid_entries_and_pinned_memory() -> None:
    sim, _, (a,), b, (ch,) = _pair(mm=MmRecipeParams(max_valid=2, pretranslate=4))
    _post_buffers(b, 8)
    ni = _ni(b)
    peak: list[int] = []

    async def main() -> list[bytes]:
        got = []
        for k in range(6):
            _ni(a).address_space(a).write(BASE, bytes([k]) * 100)
            await a.post(SendDescriptor(ch, (virtual(BASE, 100),)))
            descriptor = await b.recv_descriptor()
            got.append(ni.read_message(b, descriptor))
            peak.append(ni.mm.memory.pinned_frames)
        return got

    assert _run(sim, main) == [bytes([k]) * 100 for k in range(6)]
    mm = ni.statistics().mm
    assert mm is not None
    assert max(peak) <= 2 and mm.pinned_bytes_max == 2 * PAGE_SIZE and mm.valid_entries <= 2
    assert mm.misses["receive/no-room"] > 0  # the cap held back pre-translation
    assert mm.misses["receive/present"] == 8 and mm.evictions == 6  # 6 used, 2 ahead


def test_no_room_is_retried_and_a_page_in_a_transfer_is_never_evicted() -> None:
    # One valid entry at the sender: while one endpoint's transfer holds it, the other's
    # translation finds no room, and is retried once the transfer completes.
    sim, cluster, (a0, a1), b0, (ch0, ch1) = _pair(mm=MmRecipeParams(max_valid=1), senders=2)
    b1 = next(ep for ep in cluster.nodes["b"].ni.endpoints.values() if ep is not b0)
    _post_buffers(b0, 1)
    _post_buffers(b1, 1)
    ni = _ni(a0)
    for k, ep in enumerate((a0, a1)):
        ni.address_space(ep).write(BASE, bytes([k + 1]) * 100)
    refused_while_busy: list[bool] = []
    translate = ni.mm.translate_send

    def watch(now: float, endpoint: int, address: int, length: int) -> Any:
        busy = [e for e in ni.mm.tlb if e.busy]
        result = translate(now, endpoint, address, length)
        if result.status.value == "no-room":
            # Refused: the entry of the transfer in progress is still there, still pinned.
            refused_while_busy.append(
                all(ni.mm.tlb.lookup(e.key) is e and ni.mm.memory.pinned(e.frame) for e in busy)
                and bool(busy)
            )
        return result

    ni.mm.translate_send = watch  # type: ignore[method-assign]
    arrivals: list[tuple[int, bytes]] = []

    async def receive(ep: Endpoint, label: int) -> None:
        descriptor = await ep.recv_descriptor()
        arrivals.append((label, _ni(ep).read_message(ep, descriptor)))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive, b0, 0)
            nursery.start_soon(receive, b1, 1)
            await a0.post(SendDescriptor(ch0, (virtual(BASE, 100),)))
            await a1.post(SendDescriptor(ch1, (virtual(BASE, 100),)))

    _run(sim, main)
    assert sorted(arrivals) == [(0, b"\x01" * 100), (1, b"\x02" * 100)]
    assert refused_while_busy and all(refused_while_busy)
    mm = ni.statistics().mm
    assert mm is not None and mm.misses["transmit/no-room"] == len(refused_while_busy)
    assert mm.misses["transmit/present"] == 2 and mm.evictions == 1
    assert mm.valid_entries == 1 and ni.mm.memory.pinned_frames == 1


def test_a_send_needing_more_pages_than_the_cap_fails_instead_of_waiting() -> None:
    # Two pages, one valid entry allowed, nothing in flight to free it: an error, not a wait.
    sim, _, (a0,), b0, (ch0,) = _pair(mm=MmRecipeParams(max_valid=1))
    _post_buffers(b0, 2)
    _ni(a0).address_space(a0).write(BASE, b"x" * (PAGE_SIZE + 100))
    too_big = SendDescriptor(ch0, (virtual(BASE, PAGE_SIZE + 100),))
    fits = SendDescriptor(ch0, (virtual(BASE, 100),))

    async def main() -> bytes:
        await a0.post(too_big)
        await a0.post(fits)
        descriptor = await b0.recv_descriptor()
        return _ni(b0).read_message(b0, descriptor)

    assert _run(sim, main) == b"x" * 100  # the next descriptor still goes out
    assert too_big.status is DescriptorStatus.ERROR and too_big.error is SendError.TOO_LONG
    assert a0.send_errors["TOO_LONG"] == 1
