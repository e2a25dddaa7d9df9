"""The trio driver of TCP (RFC 9293) over stacklib's IP: connections as trio streams.

The driver makes no protocol decisions; :class:`~stacklib.layers.tcp.machine.TcpConnection`
does (docs/tcp-core.md).  One :class:`TcpStack` per IP instance runs three tasks while the
layer is open (a thin loop per stack, not per connection):

* the *demultiplexer* reads IP's protocol 6 endpoint and hands each segment to the connection
  keyed by (local port, remote address, remote port), else to a listener for SYNs, else answers
  with the RST for a closed port (RFC 9293 §3.10.7.1); then it drains that machine: segments
  out, events to the stream's waiters;
* the *timer task* sleeps until the earliest machine deadline (a heap, refreshed after every
  drain; a kick when an earlier deadline appears) and calls ``handle_timer``;
* the *sender*, the only task that writes to IP, so segments leave in the order the machines
  produced them whichever task drained them.

:class:`TcpStream` is a ``trio.abc.HalfCloseableStream`` (``trio.SSLStream`` and ordinary trio
code run over it); back-pressure is the send buffer (paper 000 §7.4: the window is the
application's buffer).  :meth:`TcpStack.connect_to` and :meth:`TcpStack.listen` take IP
addresses and ports; the :class:`~stacklib.services.StreamService` methods ``connect(peer)`` /
``accept()`` use ``service_port`` and integer peers, so stacks written against integer peers
run over TCP: a peer is one of the ids IP has addresses for
(:meth:`~stacklib.layers.ip.service.IpService.neighbors`: over U-Net the channel ids below IP,
the same ids the other nodes have at the bottom of the stack), or an IPv4 address as a 32-bit
integer (:func:`peer_id`, :func:`peer_address`; never below 2**24, as no address in 0.0.0.0/8 is
a host's).  ``accept()`` names the remote host by its peer id where IP has one, else by its
address's integer.

Like Linux (RFC 2525 §2.17), closing a stream with unread data, or receiving data after the
application closed it, resets the connection, so the peer's sender learns of it.

ISNs and ephemeral ports come from the world's seeded random stream ``tcp:<address>`` where the
NI models the host (simulations are deterministic), from ``seed`` if given, else from the
operating system's randomness.  Costs are charged only where modeled
(:attr:`~stacklib.layers.ip.service.IpService.modeled_cpu`).
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import math
import operator
import random
import struct
import typing
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

import attrs
import trio
import trio.lowlevel

from stacklib.errors import LocalProtocolError, StacklibError
from stacklib.layers.ip.service import IpService, ProtocolEndpoint
from stacklib.layers.ip.wire import IPV4_HEADER_SIZE, IpProtocol, ip_bytes
from stacklib.layers.tcp.machine import (
    ChecksumPolicy,
    Closed,
    Connected,
    ConnectionAborted,
    ConnectionReset,
    DataReceived,
    EndOfStream,
    TcpConfig,
    TcpConnection,
    TcpState,
    TcpStatistics,
    reset_for,
)
from stacklib.layers.tcp.wire import (
    HEADER_SIZE,
    Segment,
    TcpErrorKind,
    TcpFlags,
    TcpFormatError,
    build,
    parse,
)
from stacklib.services import Service, StreamService
from stacklib.sim.costs import cited
from stacklib.stack import Layer, register_layer, serve

if TYPE_CHECKING:
    from stacklib.sim.resources import Resource

__all__ = [
    "ConnectFailed",
    "ConnectionRefused",
    "TcpLayer",
    "TcpListenerStream",
    "TcpParams",
    "TcpStack",
    "TcpStream",
    "peer_address",
    "peer_id",
]

_TCP = int(IpProtocol.TCP)
EPHEMERAL = range(49152, 65536)  #: IANA's dynamic ports (RFC 6335), for connect_to and listen(0)
_PORTS = struct.Struct("!HH")
_DEFAULT_RECEIVE = 65536  # receive_some() without max_bytes


class ConnectionRefused(StacklibError, ConnectionRefusedError):
    """The peer answered the SYN with an RST: nobody listens on that port."""


class ConnectFailed(StacklibError, ConnectionError):
    """The handshake did not complete (the SYN retransmission limit, or the layer closed)."""


#: The smallest integer that names an IPv4 address rather than a peer id (1.0.0.0).
_FIRST_ADDRESS = 1 << 24


def peer_id(address: str) -> int:
    """The integer peer of :class:`~stacklib.services.StreamService` for an IPv4 address."""
    return int(ipaddress.IPv4Address(address))


def peer_address(peer: int) -> str:
    """The IPv4 address of an integer peer (inverse of :func:`peer_id`)."""
    return str(ipaddress.IPv4Address(peer))


# --- parameters -------------------------------------------------------------------------------


def _int_in(low: int, high: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{attribute.name} must be an integer in {low}..{high}, got {value!r}")

    return check


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{attribute.name} must be a number >= 0, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _optional_non_negative(
    instance: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is not None:
        _non_negative(instance, attribute, value)  # type: ignore[arg-type]


def _optional_seed(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{attribute.name} must be an integer or absent, got {value!r}")


@attrs.frozen
class TcpParams:
    """Parameters of the TCP layer (``[[layers]] kind = "tcp"``); defaults are U-Net TCP's."""

    #: Segment size announced and used, capped per peer by IP's MTU less 40 header bytes.
    mss: int = cited(
        2048,
        "paper 000 §7.8: 'The standard configuration for U-Net TCP uses 2048 byte segments'",
        "bytes",
        validator=_int_in(64, 65495),
    )
    #: Send and receive buffers of a connection; the receive buffer is the advertised window
    #: (at most 65535: no window scaling).
    send_buffer: int = cited(
        8192, "paper 000 §7.7: 14-15 Mbytes/sec 'using an 8Kbyte window'", "bytes",
        validator=_int_in(1, 1 << 30),
    )  # fmt: skip
    receive_buffer: int = cited(
        8192, "paper 000 §7.7: 14-15 Mbytes/sec 'using an 8Kbyte window'", "bytes",
        validator=_int_in(1, 1 << 30),
    )  # fmt: skip
    #: Retransmission timer floor and initial value (RFC 6298; the floor is Linux's 200 ms).
    rto_min: float = attrs.field(default=0.2, validator=_positive)
    rto_initial: float = attrs.field(default=1.0, validator=_positive)
    #: Delayed ACK in seconds; 0 acknowledges at once (paper 000 §7.8: U-Net TCP disables it).
    delayed_ack: float = attrs.field(default=0.0, validator=_non_negative)
    nagle: bool = True
    #: R2 (RFC 9293 §3.8.3): a connection gives up after this many retransmissions of one
    #: segment and at least ``r2_time`` seconds of them (a SYN: ``r2_syn_time``).
    max_retransmissions: int = attrs.field(default=12, validator=_int_in(0, 1 << 16))
    r2_time: float = attrs.field(default=100.0, validator=_non_negative)
    r2_syn_time: float = attrs.field(default=180.0, validator=_non_negative)
    #: Maximum segment lifetime; TIME-WAIT lasts twice this.
    msl: float = attrs.field(default=30.0, validator=_positive)
    #: Keepalive idle time in seconds; 0 is off (RFC 1122 §4.2.3.6).
    keepalive_idle: float = attrs.field(default=0.0, validator=_non_negative)
    #: Checksum policy: "both", "tx", "rx" or "none".
    checksum: Literal["both", "tx", "rx", "none"] = "both"
    #: Connections a listener holds (handshaking plus not yet accepted); further SYNs are
    #: dropped, so the peer retries, as Linux does with a full accept queue.
    backlog: int = attrs.field(default=16, validator=_int_in(1, 1 << 16))
    #: Port of the StreamService view (``connect(peer)`` / ``accept()``); 0 disables it.
    #: 5995 because Wireshark claims no protocol on it (``tshark -G decodes``: no tcp.port or
    #: udp.port entry), so captures dissect as plain TCP; 5000 was GSM IPA's (docs/captures.md).
    service_port: int = attrs.field(default=5995, validator=_int_in(0, 0xFFFF))
    #: Seed of ISNs and ephemeral ports; absent: the world's stream where modeled, else random.
    seed: int | None = attrs.field(default=None, validator=_optional_seed)
    #: Host CPU per segment sent or received, beyond its copy and checksum, where the NI
    #: models the host; absent: the simulated host's
    #: (:attr:`~stacklib.sim.costs.ProtocolCosts.tcp_segment_us`: 5.4 us on the
    #: SPARCstation-20, calibrated to paper 000 §7.7, Table 3's 157 us round trip).
    segment_us: float | None = attrs.field(default=None, validator=_optional_non_negative)
    #: Host CPU for the checksum, where modeled and computed.
    checksum_us_per_100_bytes: float = cited(
        1.0,
        "paper 000 §7.6: 'The checksum adds a processing overhead of 1μs per 100 bytes on a "
        "SPARCStation 20'",
        "us",
        validator=_non_negative,
    )

    def config(self, mss: int | None = None) -> TcpConfig:
        """The machine's :class:`TcpConfig` for a connection (``mss`` caps the segment size)."""
        return TcpConfig(
            mss=self.mss if mss is None else max(1, min(self.mss, mss)),
            send_buffer=self.send_buffer,
            receive_buffer=self.receive_buffer,
            rto_min=self.rto_min,
            rto_initial=max(self.rto_initial, self.rto_min),
            delayed_ack=self.delayed_ack or None,
            nagle=self.nagle,
            msl=self.msl,
            max_retransmissions=self.max_retransmissions,
            r2_time=self.r2_time,
            r2_syn_time=self.r2_syn_time,
            keepalive_idle=self.keepalive_idle or None,
            checksum=ChecksumPolicy[self.checksum.upper()],
        )


# --- streams ----------------------------------------------------------------------------------


class TcpStream(trio.abc.HalfCloseableStream):
    """One TCP connection as a trio stream; made by :meth:`TcpStack.connect_to` or a
    :class:`TcpListenerStream`.

    ``send_all`` waits for send-buffer space; ``receive_some`` returns ``b""`` after the peer's
    FIN; a reset or an abort makes both raise :class:`trio.BrokenResourceError`; ``send_eof``
    sends a FIN (half-close); ``aclose`` sends a FIN (an RST if unread data is waiting) and
    returns at once, the connection finishing in the background; a cancelled ``aclose``
    resets the connection.
    """

    def __init__(
        self,
        stack: TcpStack,
        machine: TcpConnection,
        remote: tuple[str, int],
        listener: TcpListenerStream | None,
    ) -> None:
        self._stack = stack
        self._machine = machine
        self._remote = remote
        self._remote_bytes = ip_bytes(remote[0])
        self._key = (machine.local_port, remote[0], remote[1])
        self._listener = listener  # a passive connection not yet handed out
        self._handshake = trio.Event()  # set once Connected, or on failure
        self._connected = False
        self._failure: BaseException | None = None
        self._peer_eof = False
        self._eof_sent = False
        self._closed = False
        self._send_busy = False
        self._recv_busy = False
        # What a parked send_all still has to queue: the stack tops the send buffer up from it
        # as ACKs free room, so the writer wakes once per call rather than once per ACK, and
        # the data is cut into whole segments whichever task runs first.
        self._pending: memoryview | None = None
        self._send_lot = trio.lowlevel.ParkingLot()
        self._recv_lot = trio.lowlevel.ParkingLot()
        # Whether a task may be parked in each lot (one at most: sends and receives are each
        # exclusive).  Set before parking, cleared by the _wake that unparks it: _wake, called
        # after every segment, tests a flag rather than the lot, and after waking the reader
        # for the first segment of a batch does nothing for the rest.
        self._send_parked = False
        self._recv_parked = False
        self._timer_at: float | None = None  # the machine's deadline
        # The deadline of this stream's live entry in the stack's timer heap.  A deadline that
        # moves later (every ACK restarts the retransmission timer) needs no new entry: the old
        # one fires, finds it early, and queues the new one.
        self._queued_at: float | None = None

    def __repr__(self) -> str:
        local = f"{self._stack.ip.address}:{self._machine.local_port}"
        return f"<TcpStream {local} -> {self._remote[0]}:{self._remote[1]} {self.state.value}>"

    # ------------------------------------------------------------------ introspection

    @property
    def local_address(self) -> tuple[str, int]:
        return self._stack.ip.address, self._machine.local_port

    @property
    def remote_address(self) -> tuple[str, int]:
        return self._remote

    @property
    def state(self) -> TcpState:
        return self._machine.state

    @property
    def send_room(self) -> int:
        """Bytes :meth:`send_all` can queue without waiting (paper 000 §7.4: back-pressure the
        application can see)."""
        return self._machine.send_room

    def statistics(self) -> TcpStatistics:
        """The connection's counters and estimators (retransmissions, RTT, windows...)."""
        return self._machine.statistics()

    # ------------------------------------------------------------------ sending

    def _check_send(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TCP stream is closed")
        if self._failure is not None:
            raise trio.BrokenResourceError(str(self._failure)) from self._failure
        if self._eof_sent:
            raise trio.ClosedResourceError("send_eof() was called on this TCP stream")

    def send_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """Queue as much of ``data`` as the send buffer takes now; returns how many bytes."""
        self._check_send()
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this TCP stream")
        return self._push(memoryview(data))

    def _push(self, view: memoryview) -> int:
        machine = self._machine
        if not machine.send_room or not view:
            return 0
        try:
            n = machine.send(view)
        except LocalProtocolError as error:  # e.g. CLOSED after the peer's RST
            raise trio.BrokenResourceError(str(error)) from error
        self._stack._drain(self)
        return n

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this TCP stream")
        self._send_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            view = memoryview(data)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            parked = False
            self._check_send()
            view = view[self._push(view) :]
            while view:
                self._pending = view
                self._send_parked = True
                try:
                    await self._send_lot.park()
                finally:
                    view = self._pending if self._pending is not None else view
                    self._pending = None
                parked = True
                self._check_send()
                view = view[self._push(view) :]
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._send_busy = False

    async def wait_send_all_might_not_block(self) -> None:
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this TCP stream")
        self._send_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            parked = False
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("the TCP stream is closed")
                if self._failure is not None or self._eof_sent or self._machine.send_room:
                    break  # send_all would not block (it might raise)
                self._send_parked = True
                await self._send_lot.park()
                parked = True
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._send_busy = False

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise trio.ClosedResourceError("the TCP stream is closed")
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this TCP stream")
        if not self._eof_sent:
            self._eof_sent = True
            self._stack._shutdown_write(self)
            self._send_lot.unpark_all()
        await trio.lowlevel.cancel_shielded_checkpoint()

    # ------------------------------------------------------------------ receiving

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            max_bytes = _DEFAULT_RECEIVE
        else:
            max_bytes = operator.index(max_bytes)  # TypeError for 1.5
            if max_bytes < 1:
                raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        if self._recv_busy:
            raise trio.BusyResourceError("another task is receiving on this TCP stream")
        self._recv_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            parked = False
            machine = self._machine
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("the TCP stream is closed")
                if machine.readable:
                    data = machine.read(max_bytes)
                    self._stack._drain(self)  # the read may open the window: a window update
                    break
                if self._failure is not None:
                    raise trio.BrokenResourceError(str(self._failure)) from self._failure
                if self._peer_eof:
                    data = b""
                    break
                self._recv_parked = True
                await self._recv_lot.park()
                parked = True
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data
        finally:
            self._recv_busy = False

    # ------------------------------------------------------------------ closing

    async def aclose(self) -> None:
        first = not self._closed
        if first:
            self._closed = True
            if trio.current_effective_deadline() == -math.inf:
                # Already cancelled (trio.aclose_forcefully): reset, RFC 9293 §3.10.5 ABORT.
                self._stack._abort(self)
            else:
                self._stack._app_closed(self)
            self._wake()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled:
            if first:  # cancelled while closing: reset rather than leave it half done
                self._stack._abort(self)
            raise

    def abort(self) -> None:
        """Reset the connection now (RFC 9293 §3.10.5, ABORT: an RST to the peer) and close
        the stream."""
        self._closed = True
        self._stack._abort(self)
        self._wake()

    # ------------------------------------------------------------------ from the stack

    def _wake(self) -> None:
        # Called after every input and output: most of the time nobody is parked.  A writer
        # with data still pending sleeps on unless the stream failed or closed.
        if self._send_parked and (not self._pending or self._failure is not None or self._closed):
            self._send_parked = False
            self._send_lot.unpark_all()
        if self._recv_parked:
            self._recv_parked = False
            self._recv_lot.unpark_all()

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        self._handshake.set()
        self._wake()


class TcpListenerStream(trio.abc.Listener[TcpStream]):
    """A listening port (RFC 9293 LISTEN); :meth:`accept` returns the next connection that
    completed its handshake.  Made by :meth:`TcpStack.listen`."""

    def __init__(self, stack: TcpStack, port: int, backlog: int) -> None:
        self._stack = stack
        self.port = port
        self.backlog = backlog
        self._pending: set[TcpStream] = set()  # SYN-RECEIVED
        self._ready: deque[TcpStream] = deque()  # ESTABLISHED, not yet accepted
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False
        self._busy = False
        self.accepted = 0
        self.dropped_syns = 0  #: SYNs dropped because the backlog was full

    def __repr__(self) -> str:
        return f"<TcpListener {self._stack.ip.address}:{self.port}>"

    @property
    def local_address(self) -> tuple[str, int]:
        return self._stack.ip.address, self.port

    def _full(self) -> bool:
        return len(self._pending) + len(self._ready) >= self.backlog

    async def accept(self) -> TcpStream:
        if self._busy:
            raise trio.BusyResourceError("another task is accepting on this listener")
        self._busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            parked = False
            while not self._ready:
                if self._closed:
                    raise trio.ClosedResourceError("the TCP listener is closed")
                await self._lot.park()
                parked = True
            stream = self._ready.popleft()
            self.accepted += 1
            if not parked:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return stream
        finally:
            self._busy = False

    async def aclose(self) -> None:
        """Stop listening; connections not yet accepted are reset."""
        if not self._closed:
            self._closed = True
            self._stack._unlisten(self)
            for stream in [*self._pending, *self._ready]:
                self._stack._abort(stream)
            self._pending.clear()
            self._ready.clear()
            self._lot.unpark_all()
        await trio.lowlevel.checkpoint()


# --- the stack --------------------------------------------------------------------------------


class TcpStack(StreamService):
    """TCP over an :class:`IpService`; made by :class:`TcpLayer`."""

    kind = "tcp"

    def __init__(self, ip: IpService, params: TcpParams, rng: random.Random) -> None:
        self.ip = ip
        self.params = params
        self._rng = rng
        self._address = ip.address
        self._local_bytes = ip_bytes(ip.address)
        self._endpoint: ProtocolEndpoint = ip.open_protocol(_TCP)
        self._conns: dict[tuple[int, str, int], TcpStream] = {}
        self._listeners: dict[int, TcpListenerStream] = {}
        self._service_listener: TcpListenerStream | None = None
        self._next_port = EPHEMERAL.start + rng.randrange(len(EPHEMERAL))
        self._closed = False
        # Timers: a heap of (deadline, tie, stream); an entry is live while it matches the
        # stream's _queued_at and the stream is in the table.
        self._timers: list[tuple[float, int, TcpStream]] = []
        self._tie = itertools.count()
        self._timer_kick = trio.Event()
        self._sleeping_until = math.inf
        # Output, in production order: (destination, segment).
        self._outq: deque[tuple[str, bytes]] = deque()
        self._out_lot = trio.lowlevel.ParkingLot()
        self._cpu: Resource | None = ip.modeled_cpu
        self._copy = ip.modeled_copy_per_byte
        segment_us = params.segment_us
        if segment_us is None:
            protocol = ip.modeled_protocol
            segment_us = protocol.tcp_segment_us if protocol is not None else 0.0
        self._segment = segment_us * 1e-6
        if self._cpu is None:
            # No modeled CPU to charge per segment: let IP's receive task feed segments
            # straight to the demultiplexer, saving a task hand-off per segment (the receive
            # loop then only waits for IP to close).  With a modeled CPU the receive loop
            # charges each segment's cost, so segments go through it as before.
            set_handler = getattr(self._endpoint, "set_handler", None)
            if set_handler is not None:
                set_handler(self._input)
        # Likewise on output: segments go to IP from the task that made them while the link
        # takes them at once (IpStack.send_nowait), rather than each waking the sender task.
        self._send_nowait: Callable[[str, int, bytes], None] | None = (
            getattr(ip, "send_nowait", None) if self._cpu is None else None
        )
        self._sum = params.checksum_us_per_100_bytes * 1e-6 / 100
        self._summed = params.checksum != "none"
        # The run's clock read directly (trio.current_time() is three calls deep): the same
        # time, read on every segment.
        try:
            self._now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        except RuntimeError:  # built outside a trio run
            self._now = trio.current_time
        self._counts = dict.fromkeys(
            (
                "segments_in",
                "segments_out",
                "active_opens",
                "passive_opens",
                "resets_sent",
                "refused",
                "send_errors",
            ),
            0,
        )
        self._dropped: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<TCP over {self.ip!r}, {len(self._conns)} connections>"

    # ------------------------------------------------------------------ the service

    async def connect_to(
        self, address: str, port: int, *, config: TcpConfig | None = None
    ) -> TcpStream:
        """Open a connection to (``address``, ``port``) (RFC 9293 §3.10.1, active open).

        Raises :class:`ConnectionRefused` if the peer answers with an RST,
        :class:`ConnectFailed` if the SYN is never answered, and
        :class:`~stacklib.errors.LocalProtocolError` for a bad port, address or an unreachable
        peer.  Cancelling it abandons the attempt.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise trio.ClosedResourceError("the TCP layer is closed")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 0xFFFF:
            raise LocalProtocolError(f"TCP: port {port!r} is not in 1..65535")
        try:
            remote_bytes = ip_bytes(address)
        except ValueError as error:
            raise LocalProtocolError(f"TCP: {error}") from None
        if config is None:
            config = self.params.config(self._mss_for(address, strict=True))
        local_port = self._ephemeral(address, port)
        machine = TcpConnection(
            local_port=local_port,
            remote_port=port,
            iss=self._isn(),
            config=config,
            local_ip=self._local_bytes,
            remote_ip=remote_bytes,
        )
        stream = TcpStream(self, machine, (address, port), None)
        self._conns[stream._key] = stream
        self._counts["active_opens"] += 1
        machine.connect(trio.current_time())
        self._drain(stream)
        try:
            await stream._handshake.wait()
        except BaseException:
            self._abort(stream)
            raise
        failure = stream._failure
        if failure is not None:
            if isinstance(failure, ConnectionRefused):
                raise failure
            raise ConnectFailed(f"TCP: connecting to {address}:{port}: {failure}") from failure
        return stream

    async def listen(self, port: int = 0, *, backlog: int | None = None) -> TcpListenerStream:
        """Listen on ``port`` (0: a free ephemeral port); :class:`LocalProtocolError` if it is
        taken by another listener."""
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("the TCP layer is closed")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 0xFFFF:
            raise LocalProtocolError(f"TCP: port {port!r} is not in 0..65535")
        if backlog is not None and (
            isinstance(backlog, bool) or not isinstance(backlog, int) or backlog < 1
        ):
            raise LocalProtocolError(f"TCP: backlog must be a positive integer, got {backlog!r}")
        return self._listen(port, self.params.backlog if backlog is None else backlog)

    async def connect(self, peer: int) -> TcpStream:
        """StreamService: connect to ``service_port`` of ``peer``: a peer id IP has an
        address for (:meth:`IpService.neighbors`), or an address's integer (:func:`peer_id`)."""
        port = self.params.service_port
        if not port:
            raise LocalProtocolError("TCP: the StreamService view is off (service_port = 0)")
        if isinstance(peer, int) and not isinstance(peer, bool) and 0 <= peer < _FIRST_ADDRESS:
            for address, neighbor in self.ip.neighbors().items():
                if neighbor == peer:
                    return await self.connect_to(address, port)
            known = sorted(set(self.ip.neighbors().values()))
            raise LocalProtocolError(f"TCP: no peer {peer} (peers: {known})")
        try:
            address = peer_address(peer)
        except (ValueError, TypeError):
            raise LocalProtocolError(f"TCP: peer {peer!r} is not an IPv4 address") from None
        return await self.connect_to(address, port)

    async def accept(self) -> tuple[int, TcpStream]:
        """StreamService: the next connection to ``service_port``, as (peer, stream): the peer
        id IP has for the remote address, else the address's integer (:func:`peer_id`)."""
        listener = self._service_listener
        if listener is None:
            raise LocalProtocolError("TCP: the StreamService view is off (service_port = 0)")
        stream = await listener.accept()
        address = stream.remote_address[0]
        neighbor = self.ip.neighbors().get(address)
        return (neighbor if neighbor is not None else peer_id(address)), stream

    def statistics(self) -> Mapping[str, object]:
        """Layer counters: segments in and out, opens, RSTs sent, connections refused, live
        connections and listeners, and segments dropped by reason."""
        return {
            **self._counts,
            "connections": len(self._conns),
            "listeners": len(self._listeners),
            "dropped": dict(sorted(self._dropped.items())),
        }

    def connections(self) -> list[TcpStream]:
        """The connections in the table (TIME-WAIT and closing ones included)."""
        return list(self._conns.values())

    # ------------------------------------------------------------------ helpers

    def _isn(self) -> int:
        return self._rng.getrandbits(32)

    def _mss_for(self, address: str, *, strict: bool = False) -> int:
        try:
            return self.ip.mtu(address) - IPV4_HEADER_SIZE - HEADER_SIZE
        except LocalProtocolError:
            if strict:
                raise
            return self.params.mss

    def _ephemeral(self, address: str, port: int) -> int:
        for _ in EPHEMERAL:
            candidate = self._next_port
            self._next_port = candidate + 1 if candidate + 1 < EPHEMERAL.stop else EPHEMERAL.start
            if candidate not in self._listeners and (candidate, address, port) not in self._conns:
                return candidate
        raise LocalProtocolError(f"TCP: no free ephemeral port towards {address}:{port}")

    def _listen(self, port: int, backlog: int) -> TcpListenerStream:
        if port == 0:
            for _ in EPHEMERAL:
                port = self._next_port
                self._next_port = port + 1 if port + 1 < EPHEMERAL.stop else EPHEMERAL.start
                if port not in self._listeners:
                    break
            else:  # pragma: no cover - 16384 listeners
                raise LocalProtocolError("TCP: no free ephemeral port to listen on")
        elif port in self._listeners:
            raise LocalProtocolError(f"TCP: port {port} is already listening")
        listener = TcpListenerStream(self, port, backlog)
        self._listeners[port] = listener
        return listener

    def _unlisten(self, listener: TcpListenerStream) -> None:
        if self._listeners.get(listener.port) is listener:
            del self._listeners[listener.port]

    def _drop(self, reason: str) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def _transmit(self, dst: str, segment: bytes) -> None:
        send_nowait = self._send_nowait
        if send_nowait is not None and not self._outq:  # behind a queue it would overtake
            try:
                send_nowait(dst, _TCP, segment)
            except LocalProtocolError:
                self._counts["send_errors"] += 1  # unreachable, or over the MTU
                return
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the sender task waits for room (or meets the error, and ends)
            else:
                self._counts["segments_out"] += 1
                return
        self._outq.append((dst, segment))
        self._out_lot.unpark()

    def _cost(self, payload: int) -> float:
        cost = self._segment + payload * self._copy
        if self._summed:
            cost += (payload + HEADER_SIZE) * self._sum
        return cost

    # ------------------------------------------------------------------ driving machines

    def _drain(self, stream: TcpStream, now: float | None = None) -> None:
        """Pull everything a machine has after an input: segments, events, its next timer."""
        machine = stream._machine
        pending = stream._pending
        if pending and machine.send_room:
            try:
                stream._pending = pending[machine.send(pending) :]
            except LocalProtocolError:
                stream._send_lot.unpark_all()  # no longer open for sending: the writer finds out
        for segment in machine.segments_to_send(self._now() if now is None else now):
            self._transmit(stream._remote[0], segment)
        event = machine.next_event()
        while event is not None:
            if type(event) is DataReceived:  # one per data segment: handled here, no call
                if stream._closed:
                    # The application closed the stream: nobody will read this (RFC 2525 §2.17).
                    self._abort(stream)
            else:
                self._on_event(stream, event)
            event = machine.next_event()
        if machine.state is TcpState.CLOSED:
            if self._conns.get(stream._key) is stream:
                del self._conns[stream._key]
            if stream._listener is not None:
                stream._listener._pending.discard(stream)
                stream._listener = None
            stream._timer_at = None
            if stream._failure is None and not stream._connected:
                stream._fail(ConnectFailed("TCP: the connection closed before it opened"))
            stream._wake()
            return
        deadline = machine.get_timer()
        stream._timer_at = deadline
        if deadline is not None and (stream._queued_at is None or deadline < stream._queued_at):
            stream._queued_at = deadline
            heapq.heappush(self._timers, (deadline, next(self._tie), stream))
            if deadline < self._sleeping_until:
                self._timer_kick.set()
        stream._wake()

    def _on_event(self, stream: TcpStream, event: object) -> None:
        if isinstance(event, Connected):
            stream._connected = True
            stream._handshake.set()
            listener = stream._listener
            if listener is not None:
                stream._listener = None
                listener._pending.discard(stream)
                if listener._closed:
                    self._abort(stream)
                else:
                    listener._ready.append(stream)
                    listener._lot.unpark()
        elif isinstance(event, DataReceived):
            if stream._closed:
                # The application closed the stream: nobody will read this (RFC 2525 §2.17).
                self._abort(stream)
        elif isinstance(event, EndOfStream):
            stream._peer_eof = True
        elif isinstance(event, ConnectionReset):
            if stream._connected or stream._listener is not None:
                stream._fail(trio.BrokenResourceError("TCP: connection reset by peer"))
            else:
                self._counts["refused"] += 1
                address, port = stream._remote
                stream._fail(ConnectionRefused(f"TCP: {address}:{port} refused the connection"))
        elif isinstance(event, ConnectionAborted):
            stream._fail(trio.BrokenResourceError(f"TCP: connection aborted: {event.reason}"))
        elif isinstance(event, Closed) and not stream._connected and stream._failure is None:
            stream._fail(ConnectFailed("TCP: the connection closed before it opened"))

    def _shutdown_write(self, stream: TcpStream) -> None:
        machine = stream._machine
        if stream._failure is None:
            try:
                machine.shutdown_write(trio.current_time())
            except LocalProtocolError:
                return  # already shut down, or CLOSED: nothing to send
            self._drain(stream)

    def _app_closed(self, stream: TcpStream) -> None:
        machine = stream._machine
        if machine.state is TcpState.CLOSED:
            return
        if machine.readable:
            self._abort(stream)  # unread data: reset, as Linux does (RFC 2525 §2.17)
            return
        if not stream._eof_sent:
            stream._eof_sent = True
            self._shutdown_write(stream)

    def _abort(self, stream: TcpStream) -> None:
        if stream._machine.state is TcpState.CLOSED:
            return
        stream._machine.abort(trio.current_time())
        if stream._failure is None:
            stream._fail(trio.BrokenResourceError("TCP: the connection was aborted"))
        self._drain(stream)

    # ------------------------------------------------------------------ receive

    async def _receive_loop(self) -> None:
        endpoint = self._endpoint
        cpu = self._cpu
        while True:
            try:
                src, dst, payload = await endpoint.recv()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
            self._input(src, dst, payload)
            if cpu is not None:
                await cpu.use(self._cost(max(0, len(payload) - HEADER_SIZE)))

    def _input(self, src: str, dst: str, payload: bytes) -> None:
        """Dispatch one segment from IP (its handler: source, destination, payload; the
        destination is ours).  Never raises for bad input: drops are counted."""
        self._counts["segments_in"] += 1
        if len(payload) < HEADER_SIZE:
            self._drop("short")
            return
        sport, dport = _PORTS.unpack_from(payload)
        stream = self._conns.get((dport, src, sport))
        now = self._now()
        if stream is not None:
            stream._machine.receive_segment(payload, now)
            self._drain(stream, now)
            return
        try:
            remote_bytes = ip_bytes(src)
            verify = self.params.checksum in ("both", "rx")
            segment = parse(payload, remote_bytes, self._local_bytes) if verify else parse(payload)
        except TcpFormatError as error:
            self._drop("checksum" if error.kind is TcpErrorKind.CHECKSUM else "malformed")
            return
        except ValueError:
            self._drop("malformed")
            return
        listener = self._listeners.get(dport)
        flags = segment.flags
        if (
            listener is not None
            and flags & TcpFlags.SYN
            and not flags & (TcpFlags.ACK | TcpFlags.RST)
        ):
            self._passive_open(listener, src, remote_bytes, segment, now)
            return
        if listener is not None and not flags & (TcpFlags.ACK | TcpFlags.RST):
            self._drop("not_syn")  # LISTEN ignores it (RFC 9293 §3.10.7.2)
            return
        # No connection (or LISTEN receiving an ACK): RFC 9293 §3.10.7.1's RST; never answer RST.
        reply = reset_for(segment)
        if reply is None:
            self._drop("rst_no_connection")
            return
        self._drop("no_connection")
        tx = self.params.checksum in ("both", "tx")
        data = build(reply, self._local_bytes, remote_bytes) if tx else build(reply)
        self._counts["resets_sent"] += 1
        self._transmit(src, data)

    def _passive_open(
        self,
        listener: TcpListenerStream,
        src: str,
        remote_bytes: bytes,
        syn: Segment,
        now: float,
    ) -> None:
        if listener._full():
            listener.dropped_syns += 1
            self._drop("backlog_full")
            return
        machine = TcpConnection.accept(
            syn,
            now,
            iss=self._isn(),
            config=self.params.config(self._mss_for(src)),
            local_ip=self._local_bytes,
            remote_ip=remote_bytes,
        )
        stream = TcpStream(self, machine, (src, machine.remote_port), listener)
        listener._pending.add(stream)
        self._conns[stream._key] = stream
        self._counts["passive_opens"] += 1
        self._drain(stream)

    # ------------------------------------------------------------------ timers and output

    async def _timer_loop(self) -> None:
        timers = self._timers
        while True:
            while timers and (
                timers[0][2]._queued_at != timers[0][0]
                or self._conns.get(timers[0][2]._key) is not timers[0][2]
            ):
                heapq.heappop(timers)  # stale: superseded, or the connection is gone
            self._sleeping_until = timers[0][0] if timers else math.inf
            self._timer_kick = trio.Event()
            with trio.move_on_at(self._sleeping_until):
                await self._timer_kick.wait()
            self._sleeping_until = -math.inf  # awake: no kicks needed
            now = trio.current_time()
            while timers and timers[0][0] <= now:
                deadline, _, stream = heapq.heappop(timers)
                if stream._queued_at != deadline or self._conns.get(stream._key) is not stream:
                    continue
                stream._queued_at = None
                at = stream._timer_at
                if at is None:
                    continue  # the timer was stopped
                if at > now:  # it moved later since this entry was queued
                    stream._queued_at = at
                    heapq.heappush(timers, (at, next(self._tie), stream))
                    continue
                stream._timer_at = None
                stream._machine.handle_timer(now)
                self._drain(stream, now)

    async def _send_loop(self) -> None:
        queue = self._outq
        cpu = self._cpu
        send = self.ip.send
        while True:
            while not queue:
                await self._out_lot.park()
            dst, segment = queue.popleft()
            if cpu is not None:
                await cpu.use(self._cost(len(segment) - HEADER_SIZE))
            try:
                await send(dst, _TCP, segment)
            except LocalProtocolError:
                self._counts["send_errors"] += 1  # unreachable, or over the MTU
                continue
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            self._counts["segments_out"] += 1

    def _close(self) -> None:
        self._closed = True
        error = trio.BrokenResourceError("TCP: the TCP layer is closed")
        for stream in list(self._conns.values()):
            stream._fail(error)
        for listener in list(self._listeners.values()):
            listener._closed = True
            listener._lot.unpark_all()
        self._conns.clear()
        self._listeners.clear()
        self._endpoint.close()


def _world_rng(ip: IpService, params: TcpParams) -> random.Random:
    if params.seed is not None:
        return random.Random(params.seed)
    cpu = ip.modeled_cpu
    if cpu is not None:
        return cpu.world.rng(f"tcp:{ip.address}")
    return random.Random()  # seeded by the OS: ISNs not guessable (RFC 9293 §3.4.1)


@register_layer
class TcpLayer(Layer[TcpParams]):
    """TCP over IP (paper 000 §7.7-7.8), interoperable with the Linux kernel's TCP."""

    name = "tcp"
    requires = IpService
    provides = StreamService
    Params = TcpParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[TcpStack]:
        """Run TCP over ``below`` and yield its :class:`TcpStack`."""
        self.require_below(below)
        ip = typing.cast(IpService, below)
        stack = TcpStack(ip, self.params, _world_rng(ip, self.params))
        if self.params.service_port:
            stack._service_listener = stack._listen(self.params.service_port, self.params.backlog)
        tasks = [
            (stack._receive_loop, "tcp demultiplexer"),
            (stack._timer_loop, "tcp timers"),
            (stack._send_loop, "tcp sender"),
        ]
        async with serve(stack, tasks, stack._close):
            yield stack
