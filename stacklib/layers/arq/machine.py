"""The stop-and-wait ARQ machine for one peer: sans-IO, no trio, no clock.

Stop-and-wait is the simplest automatic-repeat-request protocol: send one DATA, wait for its
ACK, retransmit it when the ACK does not come in time, and only then send the next.  It is
go-back-N with a window of one, the scheme UAM uses for reliable Active Messages (paper 000
§5.1.1).  One :class:`ArqMachine` holds both halves of the conversation with one peer:

* sender: a queue of messages, at most one DATA unacknowledged, a retransmission timer that
  starts at ``rto`` and doubles with each retransmission (exponential backoff); after
  ``max_retries`` retransmissions without an ACK the peer is declared failed;
* receiver: the next sequence number expected; that DATA is delivered and ACKed, the one before
  it (a retransmission whose ACK was lost) is ACKed again but not delivered, anything else is
  dropped.

The API has the aioquic shape.  Inputs take ``now`` (seconds, from whatever
clock the driver uses): :meth:`~ArqMachine.send`, :meth:`~ArqMachine.receive`,
:meth:`~ArqMachine.handle_timer`.  Outputs are pulled: :meth:`~ArqMachine.datagrams_to_send`,
:meth:`~ArqMachine.next_event` (:class:`Delivered` or :class:`PeerFailed`) and
:meth:`~ArqMachine.get_timer`, the deadline at which to call ``handle_timer``.

States (:class:`ArqState`)::

    IDLE --send--> WAITING --ACK, queue empty--> IDLE
                   WAITING --ACK, more queued--> WAITING (next DATA)
                   WAITING --timer, retries left--> WAITING (retransmit, backoff)
                   WAITING --timer, no retries left--> FAILED (PeerFailed event)

FAILED is final: :meth:`~ArqMachine.send` raises :class:`~stacklib.errors.LocalProtocolError`,
input is ignored (counted), the timer is off.  Malformed input never raises: it is dropped and
counted in :class:`ArqStatistics`.

Limits, by design: there is no connection set-up, so both ends start at ``initial_seq`` and a
peer that restarts is not recognised (its DATA is dropped until this end declares it failed);
with 16-bit sequence numbers a DATA delayed in the network by 65536 messages would be taken
for a new one.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TypeAlias

import attrs

from stacklib.errors import LocalProtocolError
from stacklib.layers.arq.wire import SEQ_MODULUS, ArqFormatError, Pdu, PduType, build, parse

__all__ = [
    "ArqMachine",
    "ArqState",
    "ArqStatistics",
    "Delivered",
    "Event",
    "PeerFailed",
]


class ArqState(enum.Enum):
    """Where the sending half is (the receiving half has no states, only ``expected``)."""

    IDLE = "idle"  #: nothing unacknowledged
    WAITING = "waiting"  #: one DATA in flight, retransmission timer running
    FAILED = "failed"  #: gave up after max_retries; final


@attrs.frozen(kw_only=True)
class Delivered:
    """A message from the peer, delivered exactly once and in order."""

    data: bytes


@attrs.frozen(kw_only=True)
class PeerFailed:
    """The peer did not acknowledge a DATA after ``retransmissions`` retransmissions.

    ``undelivered`` messages (the one in flight and those queued behind it) may never have
    reached the peer; the machine has discarded them.
    """

    retransmissions: int
    undelivered: int


Event: TypeAlias = Delivered | PeerFailed


@attrs.frozen(kw_only=True)
class ArqStatistics:
    """A snapshot of one machine's counters (and, in ``queued``, its current backlog)."""

    sent: int  #: DATA PDUs sent for the first time (one per message)
    retransmitted: int  #: DATA PDUs sent again after a timeout
    acks: int  #: ACKs received that confirmed the DATA in flight
    acks_sent: int  #: ACKs sent (for new DATA and for duplicates)
    delivered: int  #: messages delivered to the application
    duplicates: int  #: DATA received again (re-ACKed, not delivered)
    malformed: int  #: datagrams dropped because they did not parse
    out_of_window: int  #: DATA dropped: neither the expected seq nor the one before it
    stale_acks: int  #: ACKs dropped: not for the DATA in flight (late or duplicated)
    ignored: int  #: datagrams dropped because the machine had failed
    queued: int  #: messages accepted by send() and not yet acknowledged


class ArqMachine:
    """Stop-and-wait ARQ with one peer.

    ``rto`` is the first retransmission timeout in the driver's time unit (seconds); it doubles
    after each retransmission.  The peer is declared failed when the timer expires after
    ``max_retries`` retransmissions, i.e. ``rto * (2 ** (max_retries + 1) - 1)`` after the first
    transmission of the DATA it never acknowledged.  ``max_queue`` bounds the messages accepted
    and not yet acknowledged; ``max_payload`` (None: unbounded) the size of one message.  Both
    ends must use the same ``initial_seq``.
    """

    def __init__(
        self,
        *,
        rto: float = 1e-3,
        max_retries: int = 8,
        max_queue: int = 64,
        max_payload: int | None = None,
        initial_seq: int = 0,
    ) -> None:
        if not rto > 0:  # also rejects NaN
            raise ValueError(f"rto must be positive, got {rto}")
        if max_retries < 0:
            raise ValueError(f"max_retries must not be negative, got {max_retries}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        if max_payload is not None and max_payload < 0:
            raise ValueError(f"max_payload must not be negative, got {max_payload}")
        if not 0 <= initial_seq < SEQ_MODULUS:
            raise ValueError(f"initial_seq must be in 0..{SEQ_MODULUS - 1}, got {initial_seq}")
        self.rto = rto
        self.max_retries = max_retries
        self.max_queue = max_queue
        self.max_payload = max_payload
        self._state = ArqState.IDLE
        # Sender half.
        self._queue: deque[bytes] = deque()  # accepted, not yet transmitted
        self._next_seq = initial_seq  # seq of the next new DATA
        self._inflight: bytes | None = None  # the unacknowledged DATA PDU, as sent
        self._inflight_seq = 0
        self._retries = 0  # retransmissions of the DATA in flight
        self._deadline: float | None = None
        # Receiver half.
        self._expected = initial_seq
        self._last_delivered: int | None = None  # None until the first delivery
        # Outputs.
        self._outbox: list[bytes] = []
        self._events: deque[Event] = deque()
        # Counters.
        self._sent = self._retransmitted = self._acks = self._acks_sent = 0
        self._delivered = self._duplicates = self._malformed = 0
        self._out_of_window = self._stale_acks = self._ignored = 0

    def __repr__(self) -> str:
        return f"<ArqMachine {self._state.value} queued={self.queued} expected={self._expected}>"

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> ArqState:
        """The sending half's state."""
        return self._state

    @property
    def queued(self) -> int:
        """Messages accepted by :meth:`send` and not yet acknowledged."""
        return len(self._queue) + (self._inflight is not None)

    @property
    def send_room(self) -> int:
        """How many more messages :meth:`send` accepts now (0 once failed)."""
        if self._state is ArqState.FAILED:
            return 0
        return self.max_queue - self.queued

    # ------------------------------------------------------------------ inputs

    def send(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Queue one message for the peer; transmitted at once if nothing is in flight.

        Raises :class:`LocalProtocolError` if the peer has failed, the queue is full
        (``send_room == 0``: the driver waits for room first) or the message is too long.
        """
        if self._state is ArqState.FAILED:
            raise LocalProtocolError("ARQ: the peer failed; no more messages can be sent to it")
        if self.queued >= self.max_queue:
            raise LocalProtocolError(
                f"ARQ: {self.queued} messages already queued (max_queue); wait for send_room"
            )
        if self.max_payload is not None and len(data) > self.max_payload:
            raise LocalProtocolError(
                f"ARQ: message of {len(data)} bytes exceeds max_payload {self.max_payload}"
            )
        self._queue.append(bytes(data))  # a copy: the caller may reuse its buffer
        if self._state is ArqState.IDLE:
            self._transmit_next(now)

    def receive(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        """Feed one datagram from the peer.  Never raises on bad input: drops and counts it."""
        if self._state is ArqState.FAILED:
            self._ignored += 1
            return
        try:
            pdu = parse(datagram)
        except ArqFormatError:
            self._malformed += 1
            return
        if pdu.type is PduType.DATA:
            self._on_data(pdu)
        else:
            self._on_ack(pdu.seq, now)

    def handle_timer(self, now: float) -> None:
        """Act on the retransmission timer if it has expired at ``now`` (else do nothing)."""
        deadline = self._deadline
        if deadline is None or now < deadline or self._inflight is None:
            return
        if self._retries >= self.max_retries:
            self._fail()
            return
        self._retries += 1
        self._retransmitted += 1
        self._outbox.append(self._inflight)
        # Exponential backoff from the moment of retransmission: rto, 2 rto, 4 rto, ...
        self._deadline = now + self.rto * (1 << self._retries)

    # ------------------------------------------------------------------ outputs

    def datagrams_to_send(self, now: float) -> list[bytes]:
        """The datagrams to transmit to the peer now, oldest first; each is returned once.

        ``now`` is unused by stop-and-wait (it keeps the aioquic shape, where pacing needs it).
        """
        out = self._outbox
        self._outbox = []
        return out

    def next_event(self) -> Event | None:
        """The next event for the application, or None."""
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        """When to call :meth:`handle_timer` next, or None if no timer is running."""
        return self._deadline

    def statistics(self) -> ArqStatistics:
        """A frozen snapshot of the counters."""
        return ArqStatistics(
            sent=self._sent,
            retransmitted=self._retransmitted,
            acks=self._acks,
            acks_sent=self._acks_sent,
            delivered=self._delivered,
            duplicates=self._duplicates,
            malformed=self._malformed,
            out_of_window=self._out_of_window,
            stale_acks=self._stale_acks,
            ignored=self._ignored,
            queued=self.queued,
        )

    # ------------------------------------------------------------------ internals

    def _transmit_next(self, now: float) -> None:
        """Send the oldest queued message as a new DATA, or go IDLE if there is none."""
        if not self._queue:
            self._state = ArqState.IDLE
            self._inflight = None
            self._deadline = None
            return
        seq = self._next_seq
        self._next_seq = (seq + 1) % SEQ_MODULUS
        pdu = build(Pdu.data(seq, self._queue.popleft()))
        self._inflight, self._inflight_seq = pdu, seq
        self._retries = 0
        self._deadline = now + self.rto
        self._state = ArqState.WAITING
        self._sent += 1
        self._outbox.append(pdu)

    def _on_ack(self, seq: int, now: float) -> None:
        if self._inflight is None or seq != self._inflight_seq:
            # A second ACK for a DATA we retransmitted needlessly, or a delayed one.
            self._stale_acks += 1
            return
        self._acks += 1
        self._transmit_next(now)

    def _on_data(self, pdu: Pdu) -> None:
        seq = pdu.seq
        if seq == self._expected:
            self._expected = (seq + 1) % SEQ_MODULUS
            self._last_delivered = seq
            self._delivered += 1
            self._events.append(Delivered(data=pdu.payload))
            self._send_ack(seq)
        elif seq == self._last_delivered:
            # Our ACK was lost (or the DATA duplicated): confirm again so the sender moves on.
            self._duplicates += 1
            self._send_ack(seq)
        else:
            # Not something a stop-and-wait sender can have in flight now (a stale duplicate
            # or garbage that happened to parse): ACKing it could confirm a DATA never seen.
            self._out_of_window += 1

    def _send_ack(self, seq: int) -> None:
        self._acks_sent += 1
        self._outbox.append(build(Pdu.ack(seq)))

    def _fail(self) -> None:
        undelivered = self.queued
        self._events.append(PeerFailed(retransmissions=self._retries, undelivered=undelivered))
        self._state = ArqState.FAILED
        self._queue.clear()
        self._inflight = None
        self._deadline = None
        self._outbox.clear()  # nothing more goes to a peer we gave up on, not even ACKs
