"""A channel region is faulted in when a side attaches: no message pays a page fault later."""

from __future__ import annotations

import mmap
import resource

import pytest

from stacklib.transports.shm import ShmEndpoint, ShmNetwork
from stacklib.unet import connect
from stacklib.unet.segment import MADV_POPULATE_WRITE, PAGE_BYTES, populate


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _faults_reading(region: mmap.mmap | bytearray) -> int:
    """Minor faults taken reading one byte of every page of ``region``."""
    view = memoryview(region)
    offsets = range(0, len(region), PAGE_BYTES)
    before = _minor_faults()
    for offset in offsets:
        view[offset]
    after = _minor_faults()
    view.release()
    return after - before


def test_both_sides_of_a_channel_have_their_region_mapped() -> None:
    with ShmNetwork() as network:
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
        ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
        ch_a, ch_b = connect(ep_a, ep_b)
        assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
        regions = [
            ep_a.shm_ni.link(ep_a, ch_a).region,
            ep_b.shm_ni.link(ep_b, ch_b).region,
        ]
        pages = len(regions[0]) // PAGE_BYTES
        assert pages > 500  # two 1 MiB rings and the header page
        for region in regions:
            # Unpopulated, every page would fault once; a few faults from the interpreter's
            # own allocations may land in between.
            assert _faults_reading(region) < pages // 10


def test_a_fresh_mapping_faults_until_populated() -> None:
    """The check above can fail: an untouched mapping faults on each page."""
    size = 64 * PAGE_BYTES
    fresh = mmap.mmap(-1, size)
    assert _faults_reading(fresh) >= 64
    populated = mmap.mmap(-1, size)
    populate(populated)
    assert _faults_reading(populated) < 8
    fresh.close()
    populated.close()


class _OldKernelRegion(bytearray):
    """A mapping whose kernel does not know MADV_POPULATE_WRITE."""

    advice: list[int]

    def madvise(self, option: int) -> None:
        self.advice.append(option)
        raise OSError(22, "Invalid argument")


def test_without_populate_advice_the_pages_are_touched_unchanged() -> None:
    region = _OldKernelRegion(bytes(range(256)) * 64)
    region.advice = []
    before = bytes(region)
    populate(region)  # type: ignore[arg-type]  # duck-typed: madvise and the buffer protocol
    assert region.advice == [MADV_POPULATE_WRITE]
    assert bytes(region) == before


@pytest.mark.parametrize("size", [PAGE_BYTES, 3 * PAGE_BYTES])
def test_populate_changes_no_byte(size: int) -> None:
    region = mmap.mmap(-1, size)
    region[:] = bytes((i * 13) & 0xFF for i in range(size))
    before = region[:]
    populate(region)
    assert region[:] == before
    region.close()


def test_single_copy_pools_are_mapped_on_both_sides() -> None:
    """The receive pool of a single-copy endpoint: the daemon's mapping and its owner's."""
    from stacklib.transports import xmem

    layout = xmem.PoolLayout(64, 256 * PAGE_BYTES)
    state = xmem.create_pool(layout, "test-pool")
    try:
        assert _faults_reading(state.region) < 8
        # (Reading an allocated page of another process's pool maps the pages around it too:
        # unpopulated, the owner faults once per 16 pages here, not per page.)
        owner = xmem.ReceivePool(mmap.mmap(state.fd, layout.total), layout)
        assert _faults_reading(owner.region) < 8
        owner.close()
    finally:
        state.close()
