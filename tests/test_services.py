"""The service contracts are enforced: abstract services cannot be made half-implemented, and
layers learn what the service below lends through ``capability``, not its class."""

from __future__ import annotations

import pytest

from stacklib.services import (
    ActiveMessageService,
    DatagramService,
    FrameService,
    ReliableService,
    Service,
    StreamService,
    UNetService,
)
from stacklib.transports.memory import MemoryNetwork
from stacklib.unet import Endpoint, Segment


@pytest.mark.parametrize(
    "base", [DatagramService, ReliableService, ActiveMessageService, StreamService, FrameService]
)
def test_an_empty_subclass_of_a_service_cannot_be_made(base: type[Service]) -> None:
    empty = type(f"Empty{base.__name__}", (base,), {})
    with pytest.raises(TypeError, match="abstract"):
        empty()


def test_active_messages_are_a_reliable_service() -> None:
    assert issubclass(ActiveMessageService, ReliableService)
    assert ActiveMessageService.kind == "active-messages"
    abstract = ActiveMessageService.__abstractmethods__
    assert {"request", "reply", "store", "get", "poll", "wait_until", "drain"} <= abstract


def test_unet_lends_its_endpoint_and_nothing_else() -> None:
    network = MemoryNetwork()
    node = network.add_node("a")
    endpoint = node.os.create_endpoint(node.os.process("p"))
    service = UNetService(endpoint)
    assert service.capability(Endpoint) is endpoint
    assert service.capability(Segment) is None

    class Wrapped(UNetService):
        async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
            await super().send(peer, bytes(data) + b"!")

        def capability(self, kind: type[object]) -> None:  # type: ignore[override]
            return None  # it changes send: a layer above must not bypass it

    assert Wrapped(endpoint).capability(Endpoint) is None
