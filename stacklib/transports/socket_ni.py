"""The shape the real transports driven by the application's calls (udp, ether, tap) share:
one non-blocking kernel handle per node (a socket, or a TAP device's file descriptor) run by
:class:`~stacklib.unet.polled.PolledNI`, and a network of such nodes."""

from __future__ import annotations

import socket
from typing import Self

import trio

from stacklib.unet.node import Node, total_drops
from stacklib.unet.polled import PolledNI

__all__ = ["HandleNI", "HandleNetwork", "SocketNI"]


class HandleNI(PolledNI):
    """A :class:`PolledNI` on one kernel handle, with a flag for a full transmit side.

    One task sleeps on the handle at a time; others park behind it and wake with it, so a node
    never has two tasks waiting on the same file descriptor (trio forbids that).
    """

    _tx_blocked: bool

    def _init_waiting(self) -> None:
        self._tx_blocked = False
        self._sleeper = False
        self._lot = trio.lowlevel.ParkingLot()

    def _handle(self) -> socket.socket | int:
        """What ``idle_wait`` sleeps on: a socket or a file descriptor."""
        raise NotImplementedError

    def _close_handle(self) -> None:
        raise NotImplementedError

    async def _wait_writable(self) -> None:
        await trio.lowlevel.wait_writable(self._handle())

    async def idle_wait(self) -> None:
        """Sleep until the handle is ready (one task per node; others park behind it)."""
        if self._sleeper:
            await self._lot.park()
            return
        self._sleeper = True
        try:
            if self._tx_blocked:
                await self._wait_writable()
            else:
                await trio.lowlevel.wait_readable(self._handle())
        finally:
            self._sleeper = False
            self._lot.unpark_all()

    def close(self) -> None:
        """Close every endpoint of the node, then the handle."""
        for endpoint in list(self.endpoints.values()):
            if not endpoint.closed:
                endpoint.close()
        self._close_handle()


class SocketNI(HandleNI):
    """A :class:`HandleNI` on one socket, ``sock``."""

    sock: socket.socket

    def _init_socket(self, sock: socket.socket) -> None:
        self.sock = sock
        self._init_waiting()

    def _handle(self) -> socket.socket:
        return self.sock

    def _close_handle(self) -> None:
        self.sock.close()


class HandleNetwork:
    """The nodes of a network of :class:`HandleNI`, by name; closing it closes their NIs."""

    nodes: dict[str, Node]

    def dropped(self) -> dict[str, int]:
        return total_drops(self.nodes.values())

    def close(self) -> None:
        for node in self.nodes.values():
            if isinstance(node.ni, HandleNI):
                node.ni.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
