"""Direct-access U-Net (paper 000 §3.6): the sender names an offset in the destination segment."""

from __future__ import annotations

from stacklib.unet import DescriptorStatus, DropReason, EndpointConfig, RecvKind, SendError

from .conftest import make_pair


async def test_direct_deposit_lands_at_the_named_offset() -> None:
    p = make_pair(EndpointConfig(direct_access=True))
    target = p.ep_b.app_area + 1000
    await p.ep_a.send(p.ch_a, b"deposit" * 20, dest_offset=target)
    descriptor = p.ep_b.poll_descriptor()
    assert descriptor is not None and descriptor.kind is RecvKind.DIRECT
    assert descriptor.dest_offset == target and descriptor.length == 140
    assert p.ep_b.segment.read(target, 140) == b"deposit" * 20
    assert len(p.ep_b.free_queue) == p.ep_b.config.rx_buffers  # no receive buffer used


async def test_direct_deposit_is_bounds_checked_at_the_receiver() -> None:
    p = make_pair(EndpointConfig(direct_access=True))
    size = p.ep_b.segment.size
    before = bytes(p.ep_b.segment.view)
    await p.ep_a.send(p.ch_a, b"x" * 100, dest_offset=size - 50)  # runs off the end
    await p.ep_a.send(p.ch_a, b"x" * 100, dest_offset=0)  # below the window: the buffers
    assert bytes(p.ep_b.segment.view) == before  # nothing written
    assert p.ep_b.statistics().dropped == {DropReason.DIRECT_OUT_OF_BOUNDS: 2}


async def test_base_level_endpoint_refuses_direct_deposits() -> None:
    p = make_pair()
    await p.ep_a.send(p.ch_a, b"x" * 100, dest_offset=p.ep_b.app_area)
    assert p.ep_b.statistics().dropped == {DropReason.DIRECT_NOT_ENABLED: 1}


async def test_ni_without_direct_access_rejects_the_descriptor() -> None:
    p = make_pair(direct_access=False)
    descriptor = await p.ep_a.send(p.ch_a, b"x" * 100, dest_offset=0)
    assert descriptor.status is DescriptorStatus.ERROR
    assert descriptor.error is SendError.DIRECT_UNSUPPORTED
