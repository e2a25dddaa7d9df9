"""The echo peer process of the udp transport's tests (a udp node in another process)."""

from __future__ import annotations

from typing import Any

import trio

from stacklib.transports.udp import UdpAddress, UdpNetwork


def udp_echo_main(port_out: Any, port: int = 1) -> None:
    """A peer process: a udp node whose endpoint ``port`` echoes every message (blocking
    receive).  Sends its address through ``port_out`` (a multiprocessing queue), then expects
    the client's address back."""
    network = UdpNetwork()
    node = network.add_node("echo")
    endpoint = node.os.create_endpoint(node.os.process("echo"), port=port)
    port_out.put(endpoint.address)
    client: UdpAddress = port_out.get(timeout=30)
    channel = node.os.create_channel(endpoint.owner, endpoint, client)

    async def serve() -> None:
        while True:
            message = await endpoint.recv()
            await endpoint.send(channel, message.data)

    try:
        trio.run(serve)
    finally:
        network.close()
