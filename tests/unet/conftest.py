"""Fixtures: two nodes of a memory network with one endpoint each and a channel between them."""

from __future__ import annotations

import attrs
import pytest

from stacklib.transports.memory import MemoryNetwork
from stacklib.unet import Endpoint, EndpointConfig, Node, connect


@attrs.frozen
class Pair:
    network: MemoryNetwork
    a: Node
    b: Node
    ep_a: Endpoint
    ep_b: Endpoint
    ch_a: int  # channel id at a, leading to b
    ch_b: int  # channel id at b, leading to a


def make_pair(config: EndpointConfig | None = None, **network_options: object) -> Pair:
    network = MemoryNetwork(**network_options)  # type: ignore[arg-type]
    a = network.add_node("a")
    b = network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("app-a"), config)
    ep_b = b.os.create_endpoint(b.os.process("app-b"), config)
    ch_a, ch_b = connect(ep_a, ep_b)
    return Pair(network, a, b, ep_a, ep_b, ch_a, ch_b)


@pytest.fixture
def pair() -> Pair:
    return make_pair()
