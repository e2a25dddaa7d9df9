"""docs/writing-a-transport.md: its transport runs, and every transport uses only the public
NI-writer interface."""

from __future__ import annotations

import contextlib
import inspect
import io
import re
from pathlib import Path
from typing import Any

import pytest
import trio

import stacklib
from stacklib.errors import ChannelError
from stacklib.services import UNetService
from stacklib.unet import DropReason, NetworkInterface, connect

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-a-transport.md"
#: The NI's transport seam before it was public: no transport may define or call these.
OLD_NAMES = (
    "_tags",
    "_transmit",
    "_deliver",
    "_injected",
    "_resume",
    "_fill",
    "_validate",
    "_register",
    "_unregister",
    "_attach",
    "_detach",
    "_service",
    "_demux",
)


def _load_document(name: str) -> dict[str, Any]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1
    namespace: dict[str, Any] = {"__name__": name}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)
    return namespace


def test_the_documented_transport_carries_messages_under_back_pressure() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _load_document("__main__")  # runs main(), as `python` would
    assert "sent 10 received 10" in out.getvalue()


async def test_the_documented_transport_keeps_u_net_s_guarantees() -> None:
    doc = _load_document("writing_a_transport")
    network = doc["WireNetwork"](capacity=1)
    a, b = network.add_node("a"), network.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("a"))
    ep_b = b.os.create_endpoint(b.os.process("b"))
    with pytest.raises(ChannelError, match="cannot reach"):
        a.os.create_channel(ep_a.owner, ep_a, doc["WireAddress"]("nowhere", 1))
    channel, _ = connect(ep_a, ep_b)
    b.ni.deliver(("stranger", 9, 9), b"who?")  # a tag no channel registered
    assert b.ni.dropped[DropReason.UNKNOWN_TAG] == 1
    async with trio.open_nursery() as nursery:
        nursery.start_soon(network.carry)
        service = UNetService(ep_b)
        await ep_a.send(channel, bytes(5000))  # buffers, not inline: the general path
        peer, data = await service.recv()
        assert (peer, data) == (service.peers[0], bytes(5000))
        nursery.cancel_scope.cancel()


def _ni_classes() -> list[type[NetworkInterface]]:
    import importlib
    import pkgutil

    for module in pkgutil.walk_packages(stacklib.__path__, "stacklib."):
        if module.name.startswith(("stacklib.transports", "stacklib.unet")):
            with contextlib.suppress(ImportError):
                importlib.import_module(module.name)
    found: list[type[NetworkInterface]] = []
    pending = [NetworkInterface]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_transport_uses_only_the_public_ni_interface() -> None:
    classes = _ni_classes()
    assert len(classes) > 10  # memory, udp, ether, tap, shm, emulation, the simulated NIs
    for cls in classes:
        if not cls.__module__.startswith("stacklib."):
            continue
        defined = set(vars(cls)) & set(OLD_NAMES)
        assert not defined, f"{cls.__qualname__} defines {defined}"
        source = inspect.getsource(cls)
        for name in OLD_NAMES:
            assert not re.search(rf"\b(self|super\(\)|ni)\.{name}\b", source), (
                f"{cls.__qualname__} uses {name}"
            )
