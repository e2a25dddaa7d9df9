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

Speed (real transports, docs/uam.md): a well-formed REQUEST, REPLY or ACK is decoded with one
struct call (``SMALL_CODECS``) and accepted without a :class:`Pdu`; every other datagram goes
through :func:`~stacklib.layers.uam.wire.parse`, so what is counted for bad input is the same.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from typing import Final, TypeAlias, cast

import attrs

from stacklib.errors import LocalProtocolError
from stacklib.layers.uam.wire import (
    CHUNK_SIZE,
    HEADER_SIZE,
    MAX_ARGS,
    SEQ_MODULUS,
    SMALL_CODECS,
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
]

#: Region id reserved for the datagram face: a store into it is a message for ``recv()``.
INBOX_REGION: Final = 0xFFFF
_HALF: Final = SEQ_MODULUS // 2
_MASK: Final = SEQ_MODULUS - 1
_REQUEST: Final = int(PduType.REQUEST)
_REPLY: Final = int(PduType.REPLY)
_ACK: Final = int(PduType.ACK)
_SMALL_MAX: Final = HEADER_SIZE + 4 * MAX_ARGS  # the largest PDU without a bulk header
_GET: Final = int(PduType.GET)
_NONE: Final = 0  # no open request or get (the type byte of none)
_PACK0: Final = SMALL_CODECS[0].pack
_PACK1: Final = SMALL_CODECS[1].pack
_PACK2: Final = SMALL_CODECS[2].pack
_PACK3: Final = SMALL_CODECS[3].pack
_PACK4: Final = SMALL_CODECS[4].pack
#: SMALL_CODECS[n].unpack, bound once (compiled, a module's Final is a C static).
_UNPACK: Final = tuple(codec.unpack for codec in SMALL_CODECS)


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


Arrival: TypeAlias = tuple[int, int, tuple[int, ...], int, Bulk | None, bytes]
"""A PDU accepted in order and waiting for its handler: (type, handler, args, seq, bulk, data).
:meth:`UamMachine.take` hands requests and replies out in this form."""

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


class _Out:
    """A PDU kept until acknowledged; its header is built at each transmission, so a
    retransmission carries the current ack.  ``type`` is the type byte (a :class:`PduType`
    or its int).

    A plain class, not attrs: compiled (stacklib compile), its constructor is native; one
    is made per PDU sent.
    """

    __slots__ = (
        "acked",
        "args",
        "bulk",
        "credit",
        "data",
        "handler",
        "seq",
        "transmissions",
        "type",
    )

    def __init__(
        self,
        type: int,
        handler: int = 0,
        args: tuple[int, ...] = (),
        bulk: Bulk | None = None,
        data: bytes = b"",
        credit: bool = False,  # consumes window space (requests, store chunks, gets)
    ) -> None:
        self.type = type
        self.handler = handler
        self.args = args
        self.bulk = bulk
        self.data = data
        self.credit = credit
        self.seq = -1
        self.transmissions = 0
        self.acked = False


def _pack_small(kind: int, handler: int, seq: int, ack: int, words: tuple[int, ...]) -> bytes:
    """A REQUEST or REPLY (no bulk header) in one struct call with fixed arguments (a call
    with ``*args`` builds a tuple first)."""
    # The words as objects: compiled, each would otherwise be unboxed and boxed again (a new
    # int object for every word above 256).
    args: tuple[object, ...] = words
    nargs = len(args)
    if nargs == 4:
        return _PACK4(kind, handler, seq, ack, 4, args[0], args[1], args[2], args[3])
    if nargs == 0:
        return _PACK0(kind, handler, seq, ack, 0)
    if nargs == 1:
        return _PACK1(kind, handler, seq, ack, 1, args[0])
    if nargs == 2:
        return _PACK2(kind, handler, seq, ack, 2, args[0], args[1])
    return _PACK3(kind, handler, seq, ack, 3, args[0], args[1], args[2])


def _check_args(args: Sequence[object]) -> tuple[int, ...]:
    # ``object``, not ``int``: compiled (stacklib compile), an element typed int would be
    # unboxed on the way in, and True would pass as 1.
    if len(args) <= MAX_ARGS:
        # The common case first: plain ints in range (one comparison chain per word).
        for arg in args:
            if type(arg) is not int:  # (compiled: a pointer comparison)
                break
            word: int = arg  # an int now: compared natively (compiled)
            if not 0 <= word <= WORD_MAX:
                break
        else:
            # (An annotated assignment, not cast(): in the pure modules cast is a call.)
            words: tuple[int, ...] = args if type(args) is tuple else tuple(args)  # type: ignore[arg-type]
            return words
    if len(args) > MAX_ARGS:
        raise LocalProtocolError(f"UAM: at most {MAX_ARGS} argument words, got {len(args)}")
    for arg in args:
        if isinstance(arg, bool) or not isinstance(arg, int) or not 0 <= arg <= WORD_MAX:
            raise LocalProtocolError(f"UAM: argument {arg!r} is not a 32-bit unsigned word")
    return cast(tuple[int, ...], tuple(args))


def _check_handler(handler: int) -> int:
    if type(handler) is int and 0 <= handler <= 255:
        return handler
    if isinstance(handler, bool) or not isinstance(handler, int) or not 0 <= handler <= 255:
        raise LocalProtocolError(f"UAM: handler index {handler!r} is not in 0..255")
    return handler


class UamMachine:
    """Reliable Active Messages with one peer (see the module docstring).

    ``window`` is w; ``rto`` the go-back-N timeout (seconds); ``max_retries`` the expiries
    without progress before the peer is declared failed; ``ack_delay`` how long a handled
    message may wait for a PDU to carry its acknowledgment; ``chunk_size`` the data bytes per
    bulk PDU.  Both ends must use the same ``initial_seq``.
    """

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
        self.window = window
        self.rto = rto
        self.max_retries = max_retries
        self.ack_delay = ack_delay
        self.chunk_size = chunk_size
        self._ack_threshold = max(1, window // 2)
        self._state = UamState.OPEN
        self._failed = False  # self._state is UamState.FAILED (a flag: read on every call)
        # Sender half.
        self._next_seq = initial_seq
        self._unacked: deque[_Out] = deque()
        self._backlog: deque[_Out] = deque()  # credit PDUs waiting for window space
        self._to_send: list[_Out] = []
        self._credits_used = 0
        self._deadline: float | None = None
        self._retries = 0
        self._next_xfer = 0
        # Receiver half.
        self._expected = initial_seq
        self._handled_through = initial_seq  # the ack we advertise
        self._ready: deque[Arrival] = deque()
        self._owed = 0  # handled, not yet advertised
        self._ack_deadline: float | None = None
        self._ack_now = False
        self._open_token: int | None = None
        self._open_type = _NONE  # the type of what _open_token answers: _REQUEST or _GET
        self._open_pdu: Arrival | None = None
        self._inbox_parts: list[bytes] = []
        self._events: deque[Event] = deque()
        # Counters.
        self._sent = self._retransmitted = self._timeouts = 0
        self._acks_sent = self._acks_received = self._received = self._handled = 0
        self._duplicates = self._out_of_order = self._no_buffer = 0
        self._malformed = self._stale_acks = self._ignored = 0

    def __repr__(self) -> str:
        return (
            f"<UamMachine {self._state.value} unacked={len(self._unacked)} "
            f"backlog={len(self._backlog)} expected={self._expected}>"
        )

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> UamState:
        return self._state

    @property
    def request_room(self) -> int:
        """How many more requests (or bulk operations) are accepted now (0 once failed)."""
        if self._failed:
            return 0
        return max(0, self.window - self._credits_used - len(self._backlog))

    @property
    def idle(self) -> bool:
        """Nothing sent is unacknowledged and nothing waits to be sent."""
        return not (self._unacked or self._backlog)

    @property
    def backlog(self) -> int:
        """Requests and chunks accepted and waiting for window space."""
        return len(self._backlog)

    @property
    def pending(self) -> bool:
        """Events are waiting to be taken (handlers to run)."""
        return bool(self._events or self._ready)

    @property
    def arrivals_full(self) -> bool:
        """2w arrivals wait for their handlers: the next in-order PDU would be dropped (a
        driver that can leave datagrams waiting at the endpoint should stop taking them)."""
        return len(self._ready) >= 2 * self.window

    @property
    def has_output(self) -> bool:
        """False only if :meth:`datagrams_to_send` would return nothing and change nothing
        (a driver may then skip the call)."""
        return bool(self._backlog or self._to_send or self._owed or self._ack_now)

    # ------------------------------------------------------------------ application inputs

    def request(self, handler: int, args: Sequence[int], now: float) -> None:
        """Queue a request for handler ``handler`` of the peer with 0-4 word ``args``.

        Raises :class:`LocalProtocolError` when the window is full (``request_room == 0``:
        the driver polls and waits first), after failure, or for a bad handler or argument.
        """
        # (type(), not __class__: compiled, type() is a pointer comparison.)
        if type(handler) is not int or not 0 <= handler <= 255:
            _check_handler(handler)
        out = _Out(_REQUEST, handler, _check_args(args), None, b"", True)
        if self._failed or self._credits_used + len(self._backlog) >= self.window:
            self._check_room()
        self._backlog.append(out)

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
        _check_handler(handler)
        words = _check_args(args)
        payload = bytes(data)  # a snapshot: the caller may reuse its buffer at once
        bulk = self._check_bulk(region, offset, len(payload))
        self._check_room()
        xfer = self._new_xfer()
        chunks = range(0, len(payload), self.chunk_size) if payload else range(1)
        last = chunks[-1]
        for chunk in chunks:
            final = chunk == last
            self._backlog.append(
                _Out(
                    PduType.STORE,
                    handler if final else 0,
                    words if final else (),
                    attrs.evolve(bulk, xfer=xfer, chunk=chunk),
                    payload[chunk : chunk + self.chunk_size],
                    credit=True,
                )
            )
        return xfer

    def get(self, region: int, offset: int, nbytes: int, now: float) -> int:
        """Queue a block get of ``nbytes`` from ``region`` at ``offset`` of the peer, one GET
        per chunk; the replies come back as :class:`GetReplyReceived` with the returned
        transfer number."""
        bulk = self._check_bulk(region, offset, nbytes)
        self._check_room()
        xfer = self._new_xfer()
        chunks = range(0, nbytes, self.chunk_size) if nbytes else range(1)
        for chunk in chunks:
            length = min(self.chunk_size, nbytes - chunk)
            self._backlog.append(
                _Out(
                    PduType.GET,
                    0,
                    (length,),
                    attrs.evolve(bulk, xfer=xfer, chunk=chunk),
                    credit=True,
                )
            )
        return xfer

    def send_message(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Queue ``data`` as one message for the peer's :class:`Delivered` (datagram face)."""
        self.store(INBOX_REGION, 0, data, 0, (), now)

    def reply(self, token: int, handler: int, args: Sequence[int], now: float) -> None:
        """Reply to the request whose event carried ``token``: only while it is the event
        being handled, and once.  Replies do not wait for window space."""
        # (type(), not __class__: compiled, type() is a pointer comparison.)
        if type(handler) is not int or not 0 <= handler <= 255:
            _check_handler(handler)
        out = _Out(_REPLY, handler, _check_args(args))
        if token != self._open_token or self._open_type != _REQUEST or self._failed:
            self._take_token(token, _REQUEST)  # raises, naming the rule broken
        self._open_token = None
        self._assign(out, now)

    def reply_get(self, token: int, data: bytes | None, now: float) -> None:
        """Answer the :class:`GetReceived` that carried ``token`` with ``data``, or with a
        refusal (``None``: the address was outside the region or the region unknown)."""
        get = self._take_token(token, _GET)
        bulk = get[4]
        if bulk is None:  # pragma: no cover - parse guarantees a GET has a bulk header
            raise LocalProtocolError("UAM: the GET being answered has no bulk header")
        length = get[2][0]
        if data is not None and len(data) != length:
            raise LocalProtocolError(f"UAM: a GET of {length} bytes answered with {len(data)}")
        status = STATUS_OK if data is not None else STATUS_BAD_ADDRESS
        self._assign(_Out(PduType.GET_REPLY, status, (), bulk, bytes(data or b"")), now)

    # ------------------------------------------------------------------ network inputs

    def receive(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        """Feed one datagram from the peer.  Never raises on bad input: drops and counts it."""
        if self._failed:
            self._ignored += 1
            return
        size = len(datagram)
        if HEADER_SIZE <= size <= _SMALL_MAX and not size & 3:
            # Fast path: a well-formed REQUEST, REPLY or ACK decodes in one struct call.  Any
            # other datagram of these sizes goes through parse(), which counts what is wrong.
            nargs = (size - HEADER_SIZE) >> 2
            # (Typed: compiled, the fields below are then native ints.)
            fields: tuple[int, ...] = _UNPACK[nargs](datagram)
            kind, handler, seq, ack = fields[0], fields[1], fields[2], fields[3]
            if fields[4] == nargs:
                if kind in (_REQUEST, _REPLY):
                    unacked = self._unacked
                    if unacked and ((ack - unacked[0].seq) & _MASK) == 1:
                        # The common acknowledgment: exactly the oldest PDU (ping-pong).
                        out = unacked.popleft()
                        out.acked = True
                        if out.credit:
                            self._credits_used -= 1
                        self._retries = 0
                        self._deadline = now + self.rto if unacked else None
                    elif unacked or ack != self._next_seq:
                        self._on_ack(ack, now)
                    ready = self._ready
                    if seq == self._expected and len(ready) < 2 * self.window:
                        self._expected = (seq + 1) & _MASK  # in order, and a buffer free
                        self._received += 1
                        ready.append((kind, handler, fields[5:], seq, None, b""))
                    else:
                        self._accept((kind, handler, fields[5:], seq, None, b""))
                    return
                if kind == _ACK and not (nargs or handler or seq):
                    if self._unacked or ack != self._next_seq:
                        self._on_ack(ack, now)
                    self._acks_received += 1
                    return
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

    def _accept(self, arrival: Arrival) -> None:
        """The sequence check of a PDU that parsed: accept it in order, or count it."""
        seq = arrival[3]
        distance = (seq - self._expected) & _MASK
        if distance == 0:
            if len(self._ready) >= 2 * self.window:
                self._no_buffer += 1  # no arrival buffer: the sender will resend it
                return
            self._expected = (seq + 1) & _MASK
            self._received += 1
            self._ready.append(arrival)
        elif distance >= _HALF:
            # Already accepted: our acknowledgment was lost or is late.  Confirm again.
            self._duplicates += 1
            self._ack_now = True
        else:
            self._out_of_order += 1

    def handle_timer(self, now: float) -> None:
        """Act on whichever timers have expired at ``now`` (else do nothing)."""
        if self._ack_deadline is not None and now >= self._ack_deadline:
            self._ack_now = self._ack_now or self._owed > 0
            self._ack_deadline = None
        deadline = self._deadline
        if deadline is None or now < deadline or not self._unacked:
            return
        if self._retries >= self.max_retries:
            self._fail()
            return
        self._retries += 1
        self._timeouts += 1
        # Go back N: everything unacknowledged goes again, oldest first.
        self._to_send = list(self._unacked)
        self._deadline = now + self.rto

    def acknowledge_now(self) -> None:
        """Advertise everything handled at the next :meth:`datagrams_to_send`, without
        waiting for ``ack_delay`` or ``window // 2`` handled messages: the application is
        about to stop polling for a while (a long computation), and a delayed acknowledgment
        would wait for it while the peer's retransmission timer runs."""
        if self._owed:
            self._ack_now = True

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self, now: float) -> list[bytes]:
        """The datagrams to transmit to the peer now, in order; each is returned once."""
        if self._failed:
            return []
        backlog = self._backlog
        while backlog and self._credits_used < self.window:
            self._assign(backlog.popleft(), now)
        ack = self._handled_through
        out = []
        if self._to_send:
            for item in self._to_send:
                if item.acked:
                    continue
                if item.transmissions:
                    self._retransmitted += 1
                else:
                    self._sent += 1
                item.transmissions += 1
                if item.bulk is None:  # REQUEST or REPLY: one struct call
                    out.append(_pack_small(item.type, item.handler, item.seq, ack, item.args))
                else:
                    out.append(
                        build(
                            Pdu(
                                PduType(item.type),
                                item.seq,
                                ack,
                                item.handler,
                                item.args,
                                item.bulk,
                                item.data,
                            )
                        )
                    )
            self._to_send = []
            if out:
                self._owed = 0  # advertised (_advertised(), inline)
                self._ack_now = False
                self._ack_deadline = None
                return out
        owed = self._owed
        if not (owed or self._ack_now):
            return out
        if owed and self._ack_deadline is None:
            self._ack_deadline = now + self.ack_delay
        if self._ack_now or (
            owed
            and (
                owed >= self._ack_threshold
                or (self._ack_deadline is not None and now >= self._ack_deadline)
            )
        ):
            self._acks_sent += 1
            self._advertised()
            return [_PACK0(_ACK, 0, 0, ack, 0)]
        return out

    def next_event(self) -> Event | None:
        """Take the next event, or None.  Taking it means its handler runs now: the message
        counts as handled (and will be acknowledged), and the previous request can no longer
        be replied to."""
        taken = self.take()
        if not isinstance(taken, tuple):
            return taken
        kind, handler, args, seq = taken[0], taken[1], taken[2], taken[3]
        if kind == _REQUEST:
            return RequestReceived(handler=handler, args=args, token=seq)
        return ReplyReceived(handler=handler, args=args)

    def take(self) -> Arrival | Event | None:
        """:meth:`next_event` without the event object for the two common cases: a request
        or a reply comes as its :data:`Arrival` tuple (a request's token is its seq, element
        3), anything else as its event.  Same rules: taking it means its handler runs now."""
        self._open_token = None
        if self._events:
            return self._events.popleft()
        ready = self._ready
        while ready:
            arrival = ready.popleft()
            seq = arrival[3]
            self._handled_through = (seq + 1) & _MASK
            self._owed += 1
            self._handled += 1
            kind = arrival[0]
            if kind == _REQUEST:
                self._open_token = seq
                self._open_type = _REQUEST
                self._open_pdu = arrival
                return arrival
            if kind == _REPLY:
                return arrival
            event = self._event(arrival)
            if event is not None:
                return event
        return None

    def get_timer(self) -> float | None:
        """When to call :meth:`handle_timer` next, or None if no timer is running."""
        deadline, ack = self._deadline, self._ack_deadline
        if ack is None:
            return deadline
        return ack if deadline is None or ack < deadline else deadline

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

    # ------------------------------------------------------------------ internals

    def _check_room(self) -> None:
        if self._failed:
            raise LocalProtocolError("UAM: the peer failed; nothing more can be sent to it")
        if self.request_room <= 0:
            raise LocalProtocolError(
                f"UAM: the window of {self.window} is full; poll and wait for request_room"
            )

    def _check_bulk(self, region: int, offset: int, nbytes: int) -> Bulk:
        if isinstance(region, bool) or not isinstance(region, int) or not 0 <= region <= _MASK:
            raise LocalProtocolError(f"UAM: region {region!r} is not in 0..{_MASK}")
        if not 0 <= offset <= WORD_MAX or not 0 <= nbytes <= WORD_MAX - offset:
            raise LocalProtocolError(f"UAM: {nbytes} bytes at offset {offset} exceed 32 bits")
        return Bulk(region, 0, offset, nbytes, 0)

    def _new_xfer(self) -> int:
        xfer = self._next_xfer
        self._next_xfer = (xfer + 1) & _MASK
        return xfer

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

    def _assign(self, out: _Out, now: float) -> None:
        """Give ``out`` the next seq and put it in the retransmission buffer."""
        out.seq = self._next_seq
        self._next_seq = (self._next_seq + 1) & _MASK
        self._unacked.append(out)
        if out.credit:
            self._credits_used += 1
        self._to_send.append(out)
        if self._deadline is None:
            self._deadline = now + self.rto

    def _on_ack(self, ack: int, now: float) -> None:
        unacked = self._unacked
        if not unacked:
            if ack != self._next_seq:
                self._stale_acks += 1
            return
        count = (ack - unacked[0].seq) & _MASK
        if count == 0:
            return
        if count > len(unacked):
            self._stale_acks += 1  # behind the window (late) or beyond it (garbage)
            return
        for _ in range(count):
            out = unacked.popleft()
            out.acked = True
            if out.credit:
                self._credits_used -= 1
        self._retries = 0
        self._deadline = now + self.rto if unacked else None

    def _advertised(self) -> None:
        self._owed = 0
        self._ack_now = False
        self._ack_deadline = None

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
            self._open_type = _GET
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
        self._to_send = []
        self._credits_used = 0
        self._deadline = None
        self._ack_deadline = None
        self._ack_now = False
