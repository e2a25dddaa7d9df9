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


def test_active_message_tables_enter_and_name_handlers_and_regions() -> None:
    from stacklib.errors import LocalProtocolError
    from stacklib.services import ActiveMessageTables

    tables = ActiveMessageTables("AM", size=2, max_regions=1)
    assert tables.register_handler(print, name="p") == 0
    assert tables.register_handler(len, index=1) == 1
    assert tables.handler_index("p") == 0 and tables.handler_index(1) == 1
    with pytest.raises(LocalProtocolError, match=r"AM: the handler table \(2 entries\) is full"):
        tables.register_handler(print)
    with pytest.raises(LocalProtocolError, match=r"AM: handler index 2 is not in 0\.\.1"):
        tables.register_handler(print, index=2)
    assert tables.register_region(bytearray(8), name="r") == 0
    assert tables.region_id("r") == 0
    with pytest.raises(LocalProtocolError, match="AM: at most 1 regions"):
        tables.register_region(bytearray(8))
    with pytest.raises(LocalProtocolError, match="must be writable"):
        ActiveMessageTables("AM").register_region(memoryview(bytes(8)))
    with pytest.raises(LocalProtocolError, match="AM: no region named 'x'"):
        tables.region_id("x")
