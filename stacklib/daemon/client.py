"""A process's control connection to the daemon (blocking; set-up and single copies)."""

from __future__ import annotations

import json
import mmap
import os
import socket
from typing import Any

from stacklib.daemon.protocol import (
    DENIALS,
    MAX_BODY,
    REQUESTS,
    ChannelGranted,
    CloseChannel,
    CloseEndpoint,
    CreateEndpoint,
    DaemonDenied,
    DaemonError,
    Deregister,
    Done,
    Doorbell,
    ErrorCode,
    ErrorReply,
    Message,
    OpenChannel,
    OpenPool,
    OpenQueue,
    PoolGranted,
    QueueGranted,
    Register,
    Reply,
    SendDirect,
    Status,
    StatusReply,
    decode,
    encode,
)
from stacklib.daemon.sockets import connect, default_socket_path
from stacklib.transports import xmem
from stacklib.transports.shm import RegionSpec, ShmAddress


class DaemonClient:
    """A process's control connection to the daemon (blocking; set-up only).

    The daemon reclaims everything this process set up when the connection closes, so keep the
    client open as long as its channels are in use.
    """

    def __init__(
        self, socket_path: str | None = None, *, start: bool = True, timeout: float = 10.0
    ) -> None:
        self.socket_path = socket_path if socket_path is not None else default_socket_path()
        self.sock = connect(self.socket_path, start=start)
        # The daemon answers in microseconds; a hung daemon must not hang set-up forever.
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self._seq = 0
        #: Single-copy transfers submitted and not yet reaped.
        self.in_flight = 0
        self._rx = bytearray()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        """Send arbitrary bytes (tests of the daemon's robustness)."""
        self.sock.sendall(data)

    def receive(self) -> tuple[int, Message, list[int]]:
        """Read one framed message and the descriptors that came with it."""
        fds: list[int] = []
        buffer = b""
        need = 4
        while len(buffer) < need:
            data, new_fds, _, _ = socket.recv_fds(self.sock, max(need - len(buffer), 1), 4)
            fds.extend(new_fds)
            if not data:
                for fd in fds:
                    os.close(fd)
                raise DaemonError(f"the daemon at {self.socket_path} closed the connection")
            buffer += data
            if len(buffer) >= 4 and need == 4:
                need = 4 + int.from_bytes(buffer[:4], "big")
                if need - 4 > MAX_BODY:
                    raise DaemonError(f"the daemon sent a frame of {need - 4} bytes")
        seq, message = decode(buffer[4:need])
        return seq, message, fds

    def request(self, message: Message) -> tuple[Reply, int | None]:
        """Send one request, return the reply (raising DaemonError for an error reply) and
        the descriptor that came with it (any others are closed)."""
        reply, fds = self.request_fds(message)
        for extra in fds[1:]:
            os.close(extra)
        return reply, fds[0] if fds else None

    def request_fds(self, message: Message) -> tuple[Reply, list[int]]:
        """Send one request, return the reply (raising DaemonError for an error reply) and
        every descriptor that came with it, in order: the caller owns them."""
        if self.in_flight:
            raise DaemonError(
                f"{self.in_flight} single-copy transfers are in flight: reap() them before "
                "another request"
            )
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        try:
            self.sock.sendall(encode(self._seq, message))
        except OSError as error:  # the daemon closed us: it may have said why first
            seq, reply, fds = self._last_word(error)
        else:
            try:
                seq, reply, fds = self.receive()
            except OSError as error:  # timeout, or the daemon went away
                raise DaemonError(f"daemon at {self.socket_path}: {error}") from None
        if isinstance(reply, ErrorReply) or seq != self._seq or isinstance(reply, REQUESTS):
            for fd in fds:
                os.close(fd)
        if isinstance(reply, ErrorReply):
            try:
                code: ErrorCode | None = ErrorCode(reply.code)
            except ValueError:
                code = None
            cls = DaemonDenied if code in DENIALS else DaemonError
            raise cls(f"daemon refused: {reply.text}", code)
        if seq != self._seq or isinstance(reply, REQUESTS):
            raise DaemonError(f"unexpected reply {reply!r} (seq {seq}, wanted {self._seq})")
        return reply, fds

    def _last_word(self, error: OSError) -> tuple[int, Message, list[int]]:
        """A send failed: the daemon closed the connection, after a BUSY notice that says why
        if it had room to send one (returned as the reply); else raise for ``error``."""
        try:
            self.sock.settimeout(0)
            try:
                return self.receive()
            finally:
                self.sock.settimeout(self.timeout)
        except (OSError, DaemonError):
            raise DaemonError(f"daemon at {self.socket_path}: {error}") from None

    def create_endpoint(self, address: ShmAddress) -> None:
        self.request(CreateEndpoint(os.getpid(), address.node, address.port))

    def close_endpoint(self, address: ShmAddress) -> None:
        self.request(CloseEndpoint(os.getpid(), address.node, address.port))

    def open_channel(
        self, local: ShmAddress, remote: ShmAddress, spec: RegionSpec
    ) -> tuple[ChannelGranted, int]:
        """Open (or join) the channel local-remote: the grant and the region's descriptor."""
        reply, fd = self.request(
            OpenChannel(
                os.getpid(),
                local.node,
                local.port,
                remote.node,
                remote.port,
                spec.ring_bytes,
                spec.max_message,
            )
        )
        if not isinstance(reply, ChannelGranted) or fd is None:
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"unexpected reply {reply!r} to OPEN_CHANNEL")
        return reply, fd

    def close_channel(self, channel: int, side: int) -> None:
        self.request(CloseChannel(os.getpid(), channel, side))

    # ---------------------------------------------------------------- single-copy transfers
    def register_memory(self, address: int, length: int) -> None:
        """Let single-copy transfers read these bytes of this process (whole pages)."""
        self.request(Register(os.getpid(), address, length))

    def deregister_memory(self, address: int, length: int) -> None:
        self.request(Deregister(os.getpid(), address, length))

    def open_pool(self, local: ShmAddress, slots: int, data_bytes: int) -> xmem.ReceivePool:
        """Create and map the receive pool of this process's endpoint ``local``."""
        reply, fd = self.request(OpenPool(os.getpid(), local.node, local.port, slots, data_bytes))
        if not isinstance(reply, PoolGranted) or fd is None:
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"unexpected reply {reply!r} to OPEN_POOL")
        try:
            layout = xmem.PoolLayout(reply.slots, reply.data_bytes)
            if os.fstat(fd).st_size != layout.total:
                raise DaemonError(f"pool of {local} has the wrong size")
            region = mmap.mmap(fd, layout.total)
        finally:
            os.close(fd)
        return xmem.ReceivePool(region, layout)

    def open_queue(self, slots: int = 64) -> xmem.RequestQueue:
        """Create this connection's request queue: transfers submitted through shared memory."""
        reply, fd = self.request(OpenQueue(os.getpid(), slots))
        if not isinstance(reply, QueueGranted) or fd is None:
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"unexpected reply {reply!r} to OPEN_QUEUE")
        try:
            layout = xmem.QueueLayout(reply.slots)
            if os.fstat(fd).st_size != layout.total:
                raise DaemonError("the request queue has the wrong size")
            region = mmap.mmap(fd, layout.total)
        finally:
            os.close(fd)
        doorbell = encode(0, Doorbell(os.getpid()))
        return xmem.RequestQueue(region, layout, lambda: self.sock.sendall(doorbell))

    def submit_direct(
        self, channel: int, side: int, address: int, length: int, cookie: int
    ) -> None:
        """Queue a single-copy transfer without waiting; :meth:`reap` collects its DONE.

        Requests are answered in order, so several may be in flight (a pipeline).
        """
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        frame = encode(self._seq, SendDirect(os.getpid(), channel, side, address, length, cookie))
        try:
            self.sock.sendall(frame)
        except OSError as error:
            raise DaemonError(f"daemon at {self.socket_path}: {error}") from None
        self.in_flight += 1

    def reap(self) -> Done:
        """The next DONE of a submitted transfer (raising DaemonError for an error reply)."""
        if not self.in_flight:
            raise DaemonError("reap() with no single-copy transfer in flight")
        # DONEs carry no descriptors and arrive in batches: read them through a buffer.
        rx = self._rx
        try:
            while len(rx) < 4 or len(rx) < 4 + int.from_bytes(rx[:4], "big"):
                if len(rx) >= 4 and int.from_bytes(rx[:4], "big") > MAX_BODY:
                    raise DaemonError(f"the daemon sent a frame of {len(rx) - 4}+ bytes")
                data = self.sock.recv(65536)
                if not data:
                    raise DaemonError(f"the daemon at {self.socket_path} closed the connection")
                rx += data
        except OSError as error:
            raise DaemonError(f"daemon at {self.socket_path}: {error}") from None
        end = 4 + int.from_bytes(rx[:4], "big")
        _, reply = decode(bytes(rx[4:end]))
        del rx[:end]
        self.in_flight -= 1
        if isinstance(reply, ErrorReply):
            code = ErrorCode(reply.code) if reply.code in set(ErrorCode) else None
            cls = DaemonDenied if code in DENIALS else DaemonError
            raise cls(f"daemon refused: {reply.text}", code)
        if not isinstance(reply, Done):
            raise DaemonError(f"unexpected reply {reply!r} to SEND_DIRECT")
        return reply

    def send_direct(self, channel: int, side: int, address: int, length: int) -> Done:
        """One single-copy transfer, waited for."""
        self.submit_direct(channel, side, address, length, 0)
        return self.reap()

    def status(self) -> dict[str, Any]:
        reply, _ = self.request(Status(os.getpid()))
        if not isinstance(reply, StatusReply):
            raise DaemonError(f"unexpected reply {reply!r} to STATUS")
        result: dict[str, Any] = json.loads(reply.text)
        return result
