"""The shape the socket-based real transports (udp, ether) share: one non-blocking kernel
socket per node, driven by the application's calls (:class:`~stacklib.unet.polled.PolledNI`)."""

from __future__ import annotations

import socket

import trio

from stacklib.unet.polled import PolledNI


class SocketNI(PolledNI):
    """A :class:`PolledNI` on one socket: ``sock`` and a flag for a full transmit side.

    One task sleeps on the socket at a time; others park behind it and wake with it, so a
    node never has two tasks waiting on the same file descriptor (trio forbids that).
    """

    sock: socket.socket
    _tx_blocked: bool

    def _init_socket(self, sock: socket.socket) -> None:
        self.sock = sock
        self._tx_blocked = False
        self._sleeper = False
        self._lot = trio.lowlevel.ParkingLot()

    async def _wait_writable(self) -> None:
        await trio.lowlevel.wait_writable(self.sock)

    async def idle_wait(self) -> None:
        """Sleep until the socket is ready (one task per node; others park behind it)."""
        if self._sleeper:
            await self._lot.park()
            return
        self._sleeper = True
        try:
            if self._tx_blocked:
                await self._wait_writable()
            else:
                await trio.lowlevel.wait_readable(self.sock)
        finally:
            self._sleeper = False
            self._lot.unpark_all()

    def close(self) -> None:
        """Close every endpoint of the node, then the socket."""
        for endpoint in list(self.endpoints.values()):
            if not endpoint.closed:
                endpoint.close()
        self.sock.close()
