"""The U-Net Active Messages machine for one peer: sans-IO, no trio, no clock.

UAM (paper 000 §5.1) makes Active Messages reliable over U-Net with "a window-based flow
control protocol with a fixed window size (w)" and "a standard 'go back N' retransmission
mechanism".  One :class:`UamMachine` holds both halves of the conversation with one peer:

* **one reliable stream per direction.**  Every PDU but ACK gets the next ``seq`` (modulo
  65536) when it is first transmitted; the peer accepts only the next ``seq`` it expects, so
  delivery is exactly once and in order.  Requests, store chunks and gets consume the window:
  at most ``window`` of them are unacknowledged; replies do not (a request handler cannot wait),
  so at most ``window`` requests and about ``window`` replies are kept for retransmission and at
  most ``2 * window`` arrivals wait for their handlers: the 4w buffers of paper 000 §5.1.1.
  Arrivals beyond 2w are dropped (counted ``no_buffer``) and come again by retransmission.
* **acknowledgment after the handler.**  A message is acknowledged once the driver has taken
  its event (its handler ran, paper 000 §5.1.2).  Every PDU carries the cumulative ``ack``, so a
  reply acknowledges its request; an explicit ACK goes out only when nothing else is about to:
  when ``window // 2`` handled messages are unacknowledged, ``ack_delay`` after the first, or at
  once when a duplicate shows the peer missed an acknowledgment.
* **go-back-N.**  One timer covers the oldest unacknowledged PDU; it restarts whenever the
  acknowledgment advances.  On expiry every unacknowledged PDU is sent again, in order.  After
  ``max_retries`` expiries without progress the peer is declared failed (:class:`PeerFailed`),
  i.e. ``rto * (max_retries + 1)`` after the oldest unacknowledged PDU was last acknowledged or
  first sent.
* **bulk transfers** in chunks of ``chunk_size`` data bytes (4160, paper 000 §5.2): a store
  is a run of STORE PDUs, the last carrying the completion handler; a get is a run of GETs,
  each answered by one GET_REPLY, so requests and replies stay one to one.

Inputs take ``now``: :meth:`~UamMachine.request`, :meth:`~UamMachine.reply`,
:meth:`~UamMachine.store`, :meth:`~UamMachine.get`, :meth:`~UamMachine.reply_get`,
:meth:`~UamMachine.send_message`, :meth:`~UamMachine.receive`,
:meth:`~UamMachine.handle_timer`.  Outputs are pulled: :meth:`~UamMachine.datagrams_to_send`,
:meth:`~UamMachine.next_event` (or :meth:`~UamMachine.take`, its allocation-free form for
requests and replies), :meth:`~UamMachine.get_timer`.  Taking an event *is* handling
it: a :class:`RequestReceived` (or :class:`GetReceived`) may be answered with one
:meth:`~UamMachine.reply` (:meth:`~UamMachine.reply_get`) until the next event is taken; any
other reply raises :class:`~stacklib.errors.LocalProtocolError` (a reply handler may not reply,
paper 000 §5: it would allow live-lock).

States: OPEN --max_retries expiries without progress--> FAILED (final: sends raise, input is
counted as ``ignored``).  Bad input never raises: it is dropped and counted.

Speed (real transports, docs/uam.md): the machine's state and its per-PDU work are a *core*
(:mod:`~stacklib.layers.uam.machine_core`), in C where ``stacklib compile`` built it and in
Python elsewhere; a well-formed REQUEST, REPLY or ACK is decoded there without a :class:`Pdu`,
and every other datagram goes through :func:`~stacklib.layers.uam.wire.parse` here, so what is
counted for bad input is the same.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, TypeAlias

import attrs

from stacklib.errors import LocalProtocolError
from stacklib.layers.uam.machine_core import (
    C_CORE,
    GET,
    MASK,
    REQUEST,
    Arrival,
    MachineCore,
    check_args,
    check_handler,
)
from stacklib.layers.uam.wire import (
    CHUNK_SIZE,
    SEQ_MODULUS,
    STATUS_BAD_ADDRESS,
    STATUS_OK,
    WORD_MAX,
    Bulk,
    Pdu,
    PduType,
    UamFormatError,
    build,
    parse,
)

__all__ = [
    "INBOX_REGION",
    "Arrival",
    "Delivered",
    "Event",
    "GetReceived",
    "GetReplyReceived",
    "PeerFailed",
    "ReplyReceived",
    "RequestReceived",
    "StoreReceived",
    "UamMachine",
    "UamState",
    "UamStatistics",
    "machine_class",
]

#: Region id reserved for the datagram face: a store into it is a message for ``recv()``.
INBOX_REGION: Final = 0xFFFF
_HALF: Final = SEQ_MODULUS // 2


class UamState(enum.Enum):
    """The machine's state."""

    OPEN = "open"
    FAILED = "failed"  #: gave up after max_retries timeouts without progress; final


@attrs.frozen(kw_only=True)
class RequestReceived:
    """A request: run handler ``handler`` with ``args``; it may reply once, with ``token``."""

    handler: int
    args: tuple[int, ...]
    token: int


@attrs.frozen(kw_only=True)
class ReplyReceived:
    """A reply: run handler ``handler`` with ``args`` (it may not reply)."""

    handler: int
    args: tuple[int, ...]


@attrs.frozen(kw_only=True)
class StoreReceived:
    """One chunk of a block store: write ``data`` at ``offset + chunk`` of ``region``; after the
    last chunk (:attr:`last`) run ``handler`` with ``args``."""

    region: int
    offset: int
    total: int
    chunk: int
    data: bytes
    handler: int
    args: tuple[int, ...]

    @property
    def last(self) -> bool:
        return self.chunk + len(self.data) == self.total


@attrs.frozen(kw_only=True)
class GetReceived:
    """The peer asks for ``length`` bytes at ``offset + chunk`` of ``region``: answer with
    :meth:`UamMachine.reply_get` and ``token``."""

    region: int
    offset: int
    total: int
    chunk: int
    length: int
    xfer: int
    token: int


@attrs.frozen(kw_only=True)
class GetReplyReceived:
    """A chunk of the get numbered ``xfer`` (``ok`` False: the peer refused the address)."""

    xfer: int
    total: int
    chunk: int
    data: bytes
    ok: bool

    @property
    def last(self) -> bool:
        return not self.ok or self.chunk + len(self.data) == self.total


@attrs.frozen(kw_only=True)
class Delivered:
    """A message sent with :meth:`UamMachine.send_message` (the datagram face)."""

    data: bytes


@attrs.frozen(kw_only=True)
class PeerFailed:
    """The peer acknowledged nothing through ``retransmissions`` go-back-N timeouts;
    ``undelivered`` messages (sent or queued) may not have reached it."""

    retransmissions: int
    undelivered: int


Event: TypeAlias = (
    RequestReceived
    | ReplyReceived
    | StoreReceived
    | GetReceived
    | GetReplyReceived
    | Delivered
    | PeerFailed
)


@attrs.frozen(kw_only=True)
class UamStatistics:
    """A snapshot of one machine's counters (and, in the last three, its current state)."""

    sent: int  #: PDUs (not ACKs) sent for the first time
    retransmitted: int  #: PDUs sent again by go-back-N
    timeouts: int  #: retransmission timer expiries
    acks_sent: int  #: explicit ACK PDUs sent
    acks_received: int  #: explicit ACK PDUs received
    received: int  #: PDUs accepted in order
    handled: int  #: accepted PDUs whose events were taken (and so acknowledged)
    duplicates: int  #: PDUs received again (suppressed, re-acknowledged)
    out_of_order: int  #: PDUs ahead of the expected seq (dropped: go-back-N resends them)
    no_buffer: int  #: in-order PDUs dropped because 2w arrivals were waiting for handlers
    malformed: int  #: datagrams that did not parse
    stale_acks: int  #: ack fields outside the unacknowledged range
    ignored: int  #: datagrams dropped because the machine had failed
    unacked: int  #: PDUs sent and not yet acknowledged
    backlog: int  #: requests and chunks accepted and waiting for window space
    window_used: int  #: requests, chunks and gets unacknowledged (at most ``window``)


if TYPE_CHECKING:
    _MethodsBase = MachineCore
else:
    _MethodsBase = object


class UamMachineMethods(_MethodsBase):
    """Everything of :class:`UamMachine` but its core: checks of the parameters, bulk
    transfers and their events, the general parse path, failure, statistics."""

    __slots__ = ()

    def __init__(
        self,
        *,
        window: int = 8,
        rto: float = 4e-3,
        max_retries: int = 8,
        ack_delay: float = 0.5e-3,
        chunk_size: int = CHUNK_SIZE,
        initial_seq: int = 0,
    ) -> None:
        if not 1 <= window < _HALF // 4:
            raise ValueError(f"window must be in 1..{_HALF // 4 - 1}, got {window}")
        if not rto > 0:  # also rejects NaN
            raise ValueError(f"rto must be positive, got {rto}")
        if not ack_delay >= 0:
            raise ValueError(f"ack_delay must not be negative, got {ack_delay}")
        if max_retries < 0:
            raise ValueError(f"max_retries must not be negative, got {max_retries}")
        if not 1 <= chunk_size <= CHUNK_SIZE:
            raise ValueError(f"chunk_size must be in 1..{CHUNK_SIZE}, got {chunk_size}")
        if not 0 <= initial_seq < SEQ_MODULUS:
            raise ValueError(f"initial_seq must be in 0..{SEQ_MODULUS - 1}, got {initial_seq}")
        super().__init__(
            int(window),
            float(rto),
            int(max_retries),
            float(ack_delay),
            int(chunk_size),
            int(initial_seq),
        )
        self._state = UamState.OPEN
        self._next_xfer = 0
        self._inbox_parts: list[bytes] = []

    def __repr__(self) -> str:
        return (
            f"<UamMachine {self._state.value} unacked={len(self._unacked)} "
            f"backlog={len(self._backlog)} expected={self._expected}>"
        )

    @property
    def state(self) -> UamState:
        return self._state

    @property
    def native(self) -> bool:
        """Whether the core runs in C (:mod:`~stacklib.layers.uam.machine_core`)."""
        return not isinstance(self, MachineCore)

    # ------------------------------------------------------------------ application inputs

    def store(
        self,
        region: int,
        offset: int,
        data: bytes | bytearray | memoryview,
        handler: int,
        args: Sequence[int],
        now: float,
    ) -> int:
        """Queue a block store of ``data`` (any size) into ``region`` at ``offset`` of the
        peer, whose handler ``handler`` runs with ``args`` after the last chunk.

        Needs ``request_room > 0``; the chunks then wait in the backlog for window space.
        Returns the transfer number.
        """
        handler = check_handler(handler)
        words = check_args(args)
        payload = bytes(data)  # a snapshot: the caller may reuse its buffer at once
        bulk = self._check_bulk(region, offset, len(payload))
        self._check_room()
        xfer = self._new_xfer()
        chunk_size = self.chunk_size
        chunks = range(0, len(payload), chunk_size) if payload else range(1)
        last = chunks[-1]
        for chunk in chunks:
            final = chunk == last
            self._queue(
                int(PduType.STORE),
                handler if final else 0,
                words if final else (),
                attrs.evolve(bulk, xfer=xfer, chunk=chunk),
                payload[chunk : chunk + chunk_size],
            )
        return xfer

    def get(self, region: int, offset: int, nbytes: int, now: float) -> int:
        """Queue a block get of ``nbytes`` from ``region`` at ``offset`` of the peer, one GET
        per chunk; the replies come back as :class:`GetReplyReceived` with the returned
        transfer number."""
        bulk = self._check_bulk(region, offset, nbytes)
        self._check_room()
        xfer = self._new_xfer()
        chunk_size = self.chunk_size
        chunks = range(0, nbytes, chunk_size) if nbytes else range(1)
        for chunk in chunks:
            length = min(chunk_size, nbytes - chunk)
            self._queue(GET, 0, (length,), attrs.evolve(bulk, xfer=xfer, chunk=chunk), b"")
        return xfer

    def send_message(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Queue ``data`` as one message for the peer's :class:`Delivered` (datagram face)."""
        self.store(INBOX_REGION, 0, data, 0, (), now)

    def reply_get(self, token: int, data: bytes | None, now: float) -> None:
        """Answer the :class:`GetReceived` that carried ``token`` with ``data``, or with a
        refusal (``None``: the address was outside the region or the region unknown)."""
        get = self._take_token(token, GET)
        bulk = get[4]
        if bulk is None:  # pragma: no cover - parse guarantees a GET has a bulk header
            raise LocalProtocolError("UAM: the GET being answered has no bulk header")
        length = get[2][0]
        if data is not None and len(data) != length:
            raise LocalProtocolError(f"UAM: a GET of {length} bytes answered with {len(data)}")
        status = STATUS_OK if data is not None else STATUS_BAD_ADDRESS
        self._send_now(int(PduType.GET_REPLY), status, (), bulk, bytes(data or b""), now)

    # ------------------------------------------------------------------ outputs

    if TYPE_CHECKING:  # the core's take, with the machine's event types

        def take(self) -> Arrival | Event | None: ...

    def next_event(self) -> Event | None:
        """Take the next event, or None.  Taking it means its handler runs now: the message
        counts as handled (and will be acknowledged), and the previous request can no longer
        be replied to."""
        taken = self.take()
        if not isinstance(taken, tuple):
            return taken
        kind, handler, args, seq = taken[0], taken[1], taken[2], taken[3]
        if kind == REQUEST:
            return RequestReceived(handler=handler, args=args, token=seq)
        return ReplyReceived(handler=handler, args=args)

    def statistics(self) -> UamStatistics:
        """A frozen snapshot of the counters."""
        return UamStatistics(
            sent=self._sent,
            retransmitted=self._retransmitted,
            timeouts=self._timeouts,
            acks_sent=self._acks_sent,
            acks_received=self._acks_received,
            received=self._received,
            handled=self._handled,
            duplicates=self._duplicates,
            out_of_order=self._out_of_order,
            no_buffer=self._no_buffer,
            malformed=self._malformed,
            stale_acks=self._stale_acks,
            ignored=self._ignored,
            unacked=len(self._unacked),
            backlog=len(self._backlog),
            window_used=self._credits_used,
        )

    # ------------------------------------------------------------------ what the core leaves

    def _check_room(self) -> None:
        if self._failed:
            raise LocalProtocolError("UAM: the peer failed; nothing more can be sent to it")
        if self.request_room <= 0:
            raise LocalProtocolError(
                f"UAM: the window of {self.window} is full; poll and wait for request_room"
            )

    def _check_args(self, args: Sequence[object]) -> tuple[int, ...]:
        return check_args(args)

    def _check_handler(self, handler: object) -> int:
        return check_handler(handler)

    def _take_token(self, token: int, kind: int) -> Arrival:
        if self._failed:
            raise LocalProtocolError("UAM: the peer failed; nothing more can be sent to it")
        pdu = self._open_pdu
        if token != self._open_token or self._open_type != kind or pdu is None:
            raise LocalProtocolError(
                "UAM: a reply is allowed only from a request handler, once "
                "(a reply handler may not reply: paper 000 §5)"
            )
        self._open_token = None
        return pdu

    def _receive_other(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        """Any datagram but a small well-formed REQUEST, REPLY or ACK: parsed in full, so
        that what is wrong with a bad one is counted."""
        try:
            pdu = parse(datagram)
        except UamFormatError:
            self._malformed += 1
            return
        self._on_ack(pdu.ack, now)
        if pdu.type is PduType.ACK:
            self._acks_received += 1
            return
        self._accept((int(pdu.type), pdu.handler, pdu.args, pdu.seq, pdu.bulk, pdu.data))

    def _build(
        self,
        kind: int,
        seq: int,
        ack: int,
        handler: int,
        args: tuple[int, ...],
        bulk: Bulk,
        data: bytes,
    ) -> bytes:
        return build(Pdu(PduType(kind), seq, ack, handler, args, bulk, data))

    def _check_bulk(self, region: int, offset: int, nbytes: int) -> Bulk:
        if isinstance(region, bool) or not isinstance(region, int) or not 0 <= region <= MASK:
            raise LocalProtocolError(f"UAM: region {region!r} is not in 0..{MASK}")
        if not 0 <= offset <= WORD_MAX or not 0 <= nbytes <= WORD_MAX - offset:
            raise LocalProtocolError(f"UAM: {nbytes} bytes at offset {offset} exceed 32 bits")
        return Bulk(region, 0, offset, nbytes, 0)

    def _new_xfer(self) -> int:
        xfer = self._next_xfer
        self._next_xfer = (xfer + 1) & MASK
        return xfer

    def _event(self, arrival: Arrival) -> Event | None:
        """The event of a bulk PDU (requests and replies are handed out by :meth:`take`)."""
        kind, handler, args, seq, bulk, data = arrival
        if bulk is None:  # pragma: no cover - parse guarantees bulk types have one
            return None
        if kind == PduType.STORE:
            if bulk.region == INBOX_REGION:
                return self._inbox(data, bulk)
            return StoreReceived(
                region=bulk.region,
                offset=bulk.offset,
                total=bulk.total,
                chunk=bulk.chunk,
                data=data,
                handler=handler,
                args=args,
            )
        if kind == PduType.GET:
            self._open_token = seq
            self._open_type = GET
            self._open_pdu = arrival
            return GetReceived(
                region=bulk.region,
                offset=bulk.offset,
                total=bulk.total,
                chunk=bulk.chunk,
                length=args[0],
                xfer=bulk.xfer,
                token=seq,
            )
        return GetReplyReceived(
            xfer=bulk.xfer,
            total=bulk.total,
            chunk=bulk.chunk,
            data=data,
            ok=handler == STATUS_OK,
        )

    def _inbox(self, data: bytes, bulk: Bulk) -> Delivered | None:
        parts = self._inbox_parts
        if bulk.chunk == 0:
            parts.clear()  # a new message (in-order delivery: the previous one completed)
        parts.append(data)
        if bulk.chunk + len(data) < bulk.total:
            return None
        self._inbox_parts = []
        return Delivered(data=b"".join(parts))

    def _fail(self) -> None:
        undelivered = len(self._unacked) + len(self._backlog)
        self._events.append(PeerFailed(retransmissions=self._retries, undelivered=undelivered))
        self._state = UamState.FAILED
        self._failed = True
        self._unacked.clear()
        self._backlog.clear()
        self._to_send.clear()
        self._credits_used = 0
        self._deadline = None
        self._ack_deadline = None
        self._ack_now = False


_SLOTS: Final = ("_state", "_next_xfer", "_inbox_parts")

if TYPE_CHECKING:
    _Core = MachineCore
else:
    _Core = C_CORE or MachineCore


class UamMachine(UamMachineMethods, _Core):
    """Reliable Active Messages with one peer (see the module docstring).

    ``window`` is w; ``rto`` the go-back-N timeout (seconds); ``max_retries`` the expiries
    without progress before the peer is declared failed; ``ack_delay`` how long a handled
    message may wait for a PDU to carry its acknowledgment; ``chunk_size`` the data bytes per
    bulk PDU.  Both ends must use the same ``initial_seq``.

    Its core is C where ``stacklib compile`` built it (:attr:`native`), else the Python
    reference; :func:`machine_class` makes the machine over either.
    """

    # The fields of the rest, in slots: without an instance dict, a method call need not
    # look for the method's name there first.
    __slots__ = _SLOTS


def machine_class(core: type[MachineCore]) -> type[UamMachine]:
    """:class:`UamMachine` over ``core``: :class:`~stacklib.layers.uam.machine_core.MachineCore`
    or a C core's class (the tests run one against the other)."""
    if core is _Core:
        return UamMachine
    namespace = {"__doc__": UamMachine.__doc__, "__slots__": _SLOTS}
    made = type("UamMachine", (UamMachineMethods, core), namespace)
    return made
