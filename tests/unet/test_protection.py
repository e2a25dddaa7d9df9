"""Protection (paper 000 §3.2): a hostile process gets errors and receives nothing of others'."""

from __future__ import annotations

import attrs
import pytest

from stacklib.errors import ChannelError, PermissionDenied
from stacklib.transports.memory import MemoryAddress, MemoryNetwork
from stacklib.unet import (
    AllowList,
    DescriptorStatus,
    DropReason,
    Endpoint,
    Fragment,
    Node,
    Principal,
    SendDescriptor,
    SendError,
    connect,
)


@attrs.frozen
class World:
    network: MemoryNetwork
    a: Node
    b: Node
    victim_a: Endpoint
    victim_b: Endpoint
    hostile: Principal
    hostile_ep: Endpoint
    ch_a: int
    ch_b: int


def make_world() -> World:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    victim_a = a.os.create_endpoint(a.os.process("victim-a"))
    victim_b = b.os.create_endpoint(b.os.process("victim-b"))
    hostile = b.os.process("hostile")
    hostile_ep = b.os.create_endpoint(hostile)
    ch_a, ch_b = connect(victim_a, victim_b)
    return World(network, a, b, victim_a, victim_b, hostile, hostile_ep, ch_a, ch_b)


async def test_hostile_endpoint_is_confined() -> None:
    w = make_world()
    hostile_ep = w.hostile_ep

    # Out-of-bounds offsets: error status, nothing read, nothing sent.
    w.b.os.create_channel(w.hostile, hostile_ep, w.victim_a.address)
    for offset, length in [(-1, 10), (hostile_ep.segment.size - 4, 8), (0, 10**9)]:
        descriptor = SendDescriptor(0, fragments=(Fragment(offset, length),))
        hostile_ep.post_nowait(descriptor)
        assert descriptor.status is DescriptorStatus.ERROR
        assert descriptor.error is SendError.OUT_OF_BOUNDS

    # A channel id from the victim's table means nothing in the hostile endpoint's table.
    descriptor = SendDescriptor(w.ch_b + 5, inline=b"forged")
    hostile_ep.post_nowait(descriptor)
    assert descriptor.error is SendError.UNKNOWN_CHANNEL

    # The OS service refuses set-up on an endpoint the caller does not own.
    with pytest.raises(PermissionDenied, match="does not own"):
        w.b.os.create_channel(w.hostile, w.victim_b, w.victim_a.address)
    with pytest.raises(PermissionDenied):
        w.b.os.close_endpoint(w.hostile, w.victim_b)
    with pytest.raises(PermissionDenied):
        w.b.os.destroy_channel(w.hostile, w.victim_b, w.ch_b)

    # Forged tags on the wire are dropped and counted.
    w.network.inject("b", ("a", 99, w.victim_b.port), b"forged")
    w.network.inject("b", "garbage", b"forged")
    assert w.b.ni.dropped[DropReason.UNKNOWN_TAG] == 2

    # Legitimate traffic still flows only to the victim.
    await w.victim_a.send(w.ch_a, b"secret")
    message = w.victim_b.poll()
    assert message is not None and message.data == b"secret"
    assert hostile_ep.poll() is None
    assert hostile_ep.statistics().received == 0
    assert hostile_ep.statistics().sent == 0


def test_a_tag_can_be_registered_once() -> None:
    w = make_world()
    with pytest.raises(ChannelError, match="already registered"):
        w.b.os.create_channel(w.victim_b.owner, w.victim_b, w.victim_a.address)


async def test_hostile_channel_to_victims_peer_receives_nothing_meant_for_victim() -> None:
    w = make_world()
    # The hostile process may open its own channel to a's endpoint...
    w.b.os.create_channel(w.hostile, w.hostile_ep, w.victim_a.address)
    # ...but messages a sends to the victim still go only to the victim.
    await w.victim_a.send(w.ch_a, b"for victim")
    assert w.hostile_ep.poll() is None
    message = w.victim_b.poll()
    assert message is not None and message.data == b"for victim"


def test_policy_refuses_unauthorized_routes() -> None:
    network = MemoryNetwork()
    policy = AllowList()
    a = network.add_node("a", policy=policy)
    network.add_node("b")
    app = a.os.process("app")
    ep = a.os.create_endpoint(app)
    with pytest.raises(PermissionDenied, match="not authorized"):
        a.os.create_channel(app, ep, MemoryAddress("b", 1))
    policy.allow(app, MemoryAddress("b", 1))
    assert a.os.create_channel(app, ep, MemoryAddress("b", 1)) == 0


def test_unknown_processes_and_unreachable_routes() -> None:
    network = MemoryNetwork()
    a = network.add_node("a")
    other = network.add_node("other")
    stranger = other.os.process("stranger")
    with pytest.raises(PermissionDenied, match="not a process"):
        a.os.create_endpoint(stranger)
    app = a.os.process("app")
    ep = a.os.create_endpoint(app)
    with pytest.raises(ChannelError, match="no such node"):
        a.os.create_channel(app, ep, MemoryAddress("nowhere", 1))
    with pytest.raises(ChannelError, match="not a MemoryAddress"):
        a.os.create_channel(app, ep, ("b", 1))


async def test_reclaiming_a_dead_process_frees_its_endpoints_and_tags() -> None:
    network = MemoryNetwork()
    a = network.add_node("a")
    b = network.add_node("b")
    app_a = a.os.process("app")
    ep_a = a.os.create_endpoint(app_a)
    ep_b = b.os.create_endpoint(b.os.process("peer"))
    _ch_a, ch_b = connect(ep_a, ep_b)
    assert a.os.reclaim(app_a) == 1
    assert ep_a.closed and a.ni.statistics().endpoints == 0
    await ep_b.send(ch_b, b"anyone there?")
    assert a.ni.dropped[DropReason.UNKNOWN_TAG] == 1
