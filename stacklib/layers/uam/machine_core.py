"""The UAM machine's core: its state and its per-PDU operations, in a form C can take over.

:class:`~stacklib.layers.uam.machine.UamMachine` is this core plus what is rare: bulk
transfers and their events, the general parse path for any datagram that is not a small
well-formed REQUEST, REPLY or ACK, failure, statistics.  The core holds every field of the
machine and does what every request/reply round trip does (paper 000 §5.1): queue a request,
number it and keep it for go-back-N, build the small PDU with the current acknowledgment,
decode an arriving small PDU, check its sequence number and the acknowledgment it carries,
hand it out, time the retransmission and the delayed acknowledgment.

This module is the reference core, in Python.  ``_uamcore.c`` is the same core in C, which
``stacklib compile`` builds into the compiled copy (each operation one C call instead of some
hundreds of nanoseconds of interpreter and object work); :data:`C_CORE` is its class where it
is built.  Both forms produce the same datagrams, events, timers and counters for every input,
and raise the same errors (tests/layers/test_uam_machine_core.py runs one against the other
through random exchanges with loss, duplication, reordering and corruption).

What the core leaves to the machine it is part of, it calls as methods on ``self``:
:meth:`MachineCore._check_room`, :meth:`~MachineCore._check_args`,
:meth:`~MachineCore._check_handler` and :meth:`~MachineCore._take_token` (only to raise, with
the message), :meth:`~MachineCore._receive_other` (a datagram the small path does not take),
:meth:`~MachineCore._event` (a bulk arrival's event), :meth:`~MachineCore._build` (a bulk PDU)
and :meth:`~MachineCore._fail`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeAlias

from stacklib.errors import LocalProtocolError
from stacklib.layers.uam.wire import (
    HEADER_SIZE,
    MAX_ARGS,
    SEQ_MODULUS,
    SMALL_CODECS,
    WORD_MAX,
    Bulk,
    PduType,
)
from stacklib.unet.express import QUEUE_WAKE, NativeQueue

__all__ = ["C_CORE", "Arrival", "MachineCore", "check_args", "check_handler"]

HALF: Final = SEQ_MODULUS // 2
MASK: Final = SEQ_MODULUS - 1
REQUEST: Final = int(PduType.REQUEST)
REPLY: Final = int(PduType.REPLY)
ACK: Final = int(PduType.ACK)
GET: Final = int(PduType.GET)
NONE: Final = 0  # no open request or get (the type byte of none)
_SMALL_MAX: Final = HEADER_SIZE + 4 * MAX_ARGS  # the largest PDU without a bulk header
_PACK0: Final = SMALL_CODECS[0].pack
_PACK1: Final = SMALL_CODECS[1].pack
_PACK2: Final = SMALL_CODECS[2].pack
_PACK3: Final = SMALL_CODECS[3].pack
_PACK4: Final = SMALL_CODECS[4].pack
_UNPACK: Final = tuple(codec.unpack for codec in SMALL_CODECS)

Arrival: TypeAlias = tuple[int, int, tuple[int, ...], int, Bulk | None, bytes]
"""A PDU accepted in order and waiting for its handler: (type, handler, args, seq, bulk, data).
:meth:`MachineCore.take` hands requests and replies out in this form."""


class ExpressService(Protocol):
    """What :meth:`MachineCore.express_poll` needs of the service whose handlers it runs (the
    C form sets its current request and calls ``_dispatch`` itself, as ``_run_handlers``
    does)."""

    _poll_now: float

    def _run_handlers(self, peer: int, machine: Any) -> int: ...


class _Out:
    """A PDU kept until acknowledged; its header is built at each transmission, so a
    retransmission carries the current ack.  ``type`` is the type byte."""

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
        handler: int,
        args: tuple[int, ...],
        bulk: Bulk | None,
        data: bytes,
        credit: bool,  # consumes window space (requests, store chunks, gets)
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
    """A REQUEST or REPLY (no bulk header) in one struct call."""
    nargs = len(words)
    if nargs == 4:
        return _PACK4(kind, handler, seq, ack, 4, words[0], words[1], words[2], words[3])
    if nargs == 0:
        return _PACK0(kind, handler, seq, ack, 0)
    if nargs == 1:
        return _PACK1(kind, handler, seq, ack, 1, words[0])
    if nargs == 2:
        return _PACK2(kind, handler, seq, ack, 2, words[0], words[1])
    return _PACK3(kind, handler, seq, ack, 3, words[0], words[1], words[2])


def check_args(args: Sequence[object]) -> tuple[int, ...]:
    """``args`` as a tuple of 0-4 words; :class:`LocalProtocolError` naming what is wrong."""
    if len(args) > MAX_ARGS:
        raise LocalProtocolError(f"UAM: at most {MAX_ARGS} argument words, got {len(args)}")
    for arg in args:
        if isinstance(arg, bool) or not isinstance(arg, int) or not 0 <= arg <= WORD_MAX:
            raise LocalProtocolError(f"UAM: argument {arg!r} is not a 32-bit unsigned word")
    # Exactly a tuple of exact ints passes through as it is (both forms of the core).
    if type(args) is tuple and all(type(arg) is int for arg in args):
        return args
    return tuple(int(arg) for arg in args)  # type: ignore[call-overload]


def check_handler(handler: object) -> int:
    """``handler`` as a handler index; :class:`LocalProtocolError` unless an int in 0..255."""
    if isinstance(handler, bool) or not isinstance(handler, int) or not 0 <= handler <= 255:
        raise LocalProtocolError(f"UAM: handler index {handler!r} is not in 0..255")
    return int(handler)


def _words(args: Sequence[int]) -> tuple[int, ...] | None:
    """``args`` itself when it is a tuple of at most four exact ints that are words (the
    common case, checked without a call), else None: :func:`check_args` decides."""
    if type(args) is not tuple or len(args) > MAX_ARGS:
        return None
    for arg in args:
        if type(arg) is not int or not 0 <= arg <= WORD_MAX:
            return None
    return args


class MachineCore:
    """The reference core (see the module docstring).  Parameters are checked by the machine
    before they reach it."""

    def __init__(
        self,
        window: int,
        rto: float,
        max_retries: int,
        ack_delay: float,
        chunk_size: int,
        initial_seq: int,
    ) -> None:
        self.window = window
        self.rto = rto
        self.max_retries = max_retries
        self.ack_delay = ack_delay
        self.chunk_size = chunk_size
        self._ack_threshold = max(1, window // 2)
        self._failed = False
        # Sender half.
        self._next_seq = initial_seq
        self._unacked: list[_Out] = []
        self._backlog: list[_Out] = []  # credit PDUs waiting for window space
        self._to_send: list[_Out] = []
        self._credits_used = 0
        self._deadline: float | None = None
        self._retries = 0
        # Receiver half.
        self._expected = initial_seq
        self._handled_through = initial_seq  # the ack we advertise
        self._ready: list[Arrival] = []
        self._owed = 0  # handled, not yet advertised
        self._ack_deadline: float | None = None
        self._ack_now = False
        self._open_token: int | None = None
        self._open_type = NONE  # the type of what _open_token answers: REQUEST or GET
        self._open_pdu: Arrival | None = None
        self._events: list[object] = []
        # Counters.
        self._sent = self._retransmitted = self._timeouts = 0
        self._acks_sent = self._acks_received = self._received = self._handled = 0
        self._duplicates = self._out_of_order = self._no_buffer = 0
        self._malformed = self._stale_acks = self._ignored = 0
        # What the last express_poll / express_send took and wrote.
        self.express_taken = self.express_bytes = self.express_handled = 0
        self.express_sent = self.express_sent_bytes = self.express_wakes = 0
        self.express_broken = False

    # ------------------------------------------------------------------ left to the machine

    def _check_room(self) -> None:
        raise NotImplementedError

    def _check_args(self, args: Sequence[object]) -> tuple[int, ...]:
        raise NotImplementedError

    def _check_handler(self, handler: object) -> int:
        raise NotImplementedError

    def _take_token(self, token: int, kind: int) -> Arrival:
        raise NotImplementedError

    def _receive_other(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        raise NotImplementedError

    def _event(self, arrival: Arrival) -> object:
        raise NotImplementedError

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
        raise NotImplementedError

    def _fail(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ state

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

    # ------------------------------------------------------------------ inputs

    def request(self, handler: int, args: Sequence[int], now: float) -> None:
        """Queue a request for handler ``handler`` of the peer with 0-4 word ``args``.

        Raises :class:`LocalProtocolError` when the window is full (``request_room == 0``:
        the driver polls and waits first), after failure, or for a bad handler or argument.
        """
        if type(handler) is not int or not 0 <= handler <= 255:
            handler = self._check_handler(handler)
        words = _words(args)
        if words is None:
            words = self._check_args(args)
        if self._failed or self._credits_used + len(self._backlog) >= self.window:
            self._check_room()
        self._backlog.append(_Out(REQUEST, handler, words, None, b"", True))

    def reply(self, token: int, handler: int, args: Sequence[int], now: float) -> None:
        """Reply to the request whose event carried ``token``: only while it is the event
        being handled, and once.  Replies do not wait for window space."""
        if type(handler) is not int or not 0 <= handler <= 255:
            handler = self._check_handler(handler)
        words = _words(args)
        if words is None:
            words = self._check_args(args)
        if token != self._open_token or self._open_type != REQUEST or self._failed:
            self._take_token(token, REQUEST)  # raises, naming the rule broken
        self._open_token = None
        self._assign(_Out(REPLY, handler, words, None, b"", False), now)

    def _queue(
        self, kind: int, handler: int, args: tuple[int, ...], bulk: Bulk, data: bytes
    ) -> None:
        """Put a bulk PDU that consumes window space (a store chunk or a get) in the backlog."""
        self._backlog.append(_Out(kind, handler, args, bulk, data, True))

    def _send_now(
        self, kind: int, handler: int, args: tuple[int, ...], bulk: Bulk, data: bytes, now: float
    ) -> None:
        """Number a bulk PDU that does not consume window space (a get's reply) and send it."""
        self._assign(_Out(kind, handler, args, bulk, data, False), now)

    def receive(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        """Feed one datagram from the peer.  Never raises on bad input: drops and counts it."""
        if self._failed:
            self._ignored += 1
            return
        size = len(datagram)
        if HEADER_SIZE <= size <= _SMALL_MAX and not size & 3:
            # A well-formed REQUEST, REPLY or ACK decodes in one struct call.  Any other
            # datagram of these sizes goes to _receive_other, which counts what is wrong.
            nargs = (size - HEADER_SIZE) >> 2
            fields: tuple[int, ...] = _UNPACK[nargs](datagram)
            kind, handler, seq, ack = fields[0], fields[1], fields[2], fields[3]
            if fields[4] == nargs:
                if kind in (REQUEST, REPLY):
                    unacked = self._unacked
                    if unacked and ((ack - unacked[0].seq) & MASK) == 1:
                        # The common acknowledgment: exactly the oldest PDU (ping-pong).
                        out = unacked.pop(0)
                        out.acked = True
                        if out.credit:
                            self._credits_used -= 1
                        self._retries = 0
                        self._deadline = now + self.rto if unacked else None
                    elif unacked or ack != self._next_seq:
                        self._on_ack(ack, now)
                    arrival = (kind, handler, fields[5:], seq, None, b"")
                    if seq == self._expected and len(self._ready) < 2 * self.window:
                        self._expected = (seq + 1) & MASK  # in order, and a buffer free
                        self._received += 1
                        self._ready.append(arrival)
                    else:
                        self._accept(arrival)
                    return
                if kind == ACK and not (nargs or handler or seq):
                    if self._unacked or ack != self._next_seq:
                        self._on_ack(ack, now)
                    self._acks_received += 1
                    return
        self._receive_other(datagram, now)

    def _accept(self, arrival: Arrival) -> None:
        """The sequence check of a PDU that parsed: accept it in order, or count it."""
        seq = arrival[3]
        distance = (seq - self._expected) & MASK
        if distance == 0:
            if len(self._ready) >= 2 * self.window:
                self._no_buffer += 1  # no arrival buffer: the sender will resend it
                return
            self._expected = (seq + 1) & MASK
            self._received += 1
            self._ready.append(arrival)
        elif distance >= HALF:
            # Already accepted: our acknowledgment was lost or is late.  Confirm again.
            self._duplicates += 1
            self._ack_now = True
        else:
            self._out_of_order += 1

    def _on_ack(self, ack: int, now: float) -> None:
        """The cumulative acknowledgment ``ack``: release what it covers, restart the timer."""
        unacked = self._unacked
        if not unacked:
            if ack != self._next_seq:
                self._stale_acks += 1
            return
        count = (ack - unacked[0].seq) & MASK
        if count == 0:
            return
        if count > len(unacked):
            self._stale_acks += 1  # behind the window (late) or beyond it (garbage)
            return
        for out in unacked[:count]:
            out.acked = True
            if out.credit:
                self._credits_used -= 1
        del unacked[:count]
        self._retries = 0
        self._deadline = now + self.rto if unacked else None

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
            self._assign(backlog.pop(0), now)
        ack = self._handled_through
        out: list[bytes] = []
        if self._to_send:
            for item in self._to_send:
                if item.acked:
                    continue
                if item.transmissions:
                    self._retransmitted += 1
                else:
                    self._sent += 1
                item.transmissions += 1
                bulk = item.bulk
                if bulk is None:  # REQUEST or REPLY: one struct call
                    out.append(_pack_small(item.type, item.handler, item.seq, ack, item.args))
                else:
                    out.append(
                        self._build(
                            item.type, item.seq, ack, item.handler, item.args, bulk, item.data
                        )
                    )
            self._to_send = []
            if out:
                self._owed = 0  # advertised
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
            self._owed = 0
            self._ack_now = False
            self._ack_deadline = None
            return [_PACK0(ACK, 0, 0, ack, 0)]
        return out

    def take(self) -> object:
        """The next arrival for the application, or None: a request or a reply as its
        :data:`Arrival` tuple (a request's token is its seq, element 3), anything else as the
        event :meth:`_event` makes of it.  Taking it means its handler runs now: it counts as
        handled (and will be acknowledged), and the previous request can no longer be
        replied to."""
        self._open_token = None
        if self._events:
            return self._events.pop(0)
        ready = self._ready
        while ready:
            arrival = ready.pop(0)
            seq = arrival[3]
            self._handled_through = (seq + 1) & MASK
            self._owed += 1
            self._handled += 1
            kind = arrival[0]
            if kind == REQUEST:
                self._open_token = seq
                self._open_type = REQUEST
                self._open_pdu = arrival
                return arrival
            if kind == REPLY:
                return arrival
            event = self._event(arrival)
            if event is not None:
                return event
        return None

    # ------------------------------------------------------------------ the express lane

    def express_poll(
        self,
        rx: NativeQueue,
        clock: Callable[[], float] | float,
        handlers: Sequence[object],
        service: ExpressService,
        peer: int,
    ) -> int:
        """The lean poll of one machine straight from its peer's queue (stacklib.unet.express):
        take each message from ``rx``, feed it, and have ``service`` run the handlers of what
        it made ready (``_run_handlers``), until the queue is empty or broken.  The clock (a
        callable, or a float: the offset of trio's default clock, ``perf_counter() +
        offset``) is read at the first message and left in ``service._poll_now`` (the
        handlers' replies use it).  Returns how many messages it took, or -1 minus that
        number if it found the queue broken; :attr:`express_handled` counts the arrivals
        handled (when no handler raised), and :attr:`express_taken`, :attr:`express_bytes`
        and :attr:`express_broken` what it took (read them also after a handler raised).
        ``handlers`` is the service's table (the C form reads it itself)."""
        self.express_taken = self.express_bytes = self.express_handled = 0
        self.express_broken = False
        now = 0.0
        first = True
        while True:
            data = rx.take()
            if data is None:
                break
            if data.__class__ is not bytes:
                self.express_broken = True
                break
            if first:
                now = clock + time.perf_counter() if isinstance(clock, float) else clock()
                service._poll_now = now
                first = False
            self.express_taken += 1
            self.express_bytes += len(data)
            self.receive(data, now)
            self.express_handled += service._run_handlers(peer, self)
        taken = self.express_taken
        return -1 - taken if self.express_broken else taken

    def express_send(
        self, tx: NativeQueue, now: float
    ) -> tuple[int, int, int, list[bytes] | None] | None:
        """:meth:`datagrams_to_send` written to ``tx`` in order: None when there was nothing to
        send, else ``(sent, sent_bytes, wakes)`` of what went and the rest: None when all
        went, else the datagrams from the first ``tx`` refused (full, longer than its
        ``max_message``, broken) on, for the endpoint's general send.
        :attr:`express_sent`, :attr:`express_sent_bytes` and :attr:`express_wakes` hold the
        same counts."""
        self.express_sent = self.express_sent_bytes = self.express_wakes = 0
        datagrams = self.datagrams_to_send(now)
        if not datagrams:
            return None
        rest: list[bytes] | None = None
        for index, datagram in enumerate(datagrams):
            length = len(datagram)
            written = (
                tx.try_write(datagram)
                if length <= tx.max_message and datagram.__class__ is bytes
                else 0
            )
            if written <= 0:
                rest = datagrams[index:]
                break
            self.express_sent += 1
            self.express_sent_bytes += length
            self.express_wakes += written == QUEUE_WAKE
        return self.express_sent, self.express_sent_bytes, self.express_wakes, rest

    def get_timer(self) -> float | None:
        """When to call :meth:`handle_timer` next, or None if no timer is running."""
        deadline, ack = self._deadline, self._ack_deadline
        if ack is None:
            return deadline
        return ack if deadline is None or ack < deadline else deadline

    # ------------------------------------------------------------------ internals

    def _assign(self, out: _Out, now: float) -> None:
        """Give ``out`` the next seq and put it in the retransmission buffer."""
        out.seq = self._next_seq
        self._next_seq = (self._next_seq + 1) & MASK
        self._unacked.append(out)
        if out.credit:
            self._credits_used += 1
        self._to_send.append(out)
        if self._deadline is None:
            self._deadline = now + self.rto


def _c_core() -> type[MachineCore] | None:
    try:  # built by ``stacklib compile`` into the compiled copy only
        from stacklib.layers.uam._uamcore import MachineCore as c_core
    except ImportError:
        return None
    return c_core


#: The C core's class where it is built, else None.
C_CORE: Final = _c_core()
