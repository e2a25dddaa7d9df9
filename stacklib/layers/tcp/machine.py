"""The TCP connection (RFC 9293) as a sans-IO machine: no trio, no sockets, no clock.

One :class:`TcpConnection` is one connection; :class:`TcpListener` turns SYNs arriving at a
listening port into connections in SYN-RECEIVED.  The API has aioquic's shape: inputs take
``now`` (seconds, from the driver's clock) -- :meth:`~TcpConnection.connect`,
:meth:`~TcpConnection.receive_segment`, :meth:`~TcpConnection.handle_timer`,
:meth:`~TcpConnection.shutdown_write`, :meth:`~TcpConnection.abort`; the application's byte
calls :meth:`~TcpConnection.send` and :meth:`~TcpConnection.read` need no time; outputs are
pulled -- :meth:`~TcpConnection.segments_to_send` (wire-ready bytes, checksummed per policy),
:meth:`~TcpConnection.next_event` and :meth:`~TcpConnection.get_timer`.

What it does (docs/tcp-core.md has the details and what is deferred):

* the RFC 9293 §3.3.2 state diagram, as data (:data:`TRANSITIONS`), incl. simultaneous open
  and close; RST generation and processing per §3.10.7, with RFC 5961 blind-reset protection
  (an RST is honoured only at exactly RCV.NXT; in-window RSTs and SYNs get a challenge ACK);
* sequence numbers modulo 2**32 (:func:`seq_lt` and friends), the ISN from the caller;
* MSS negotiation (RFC 9293 §3.7.1; 2048 by default, U-Net TCP's segment size, paper 000
  §7.8); a receive window equal to the application's free buffer space (paper 000 §7.4) with
  receiver SWS avoidance, Nagle and sender SWS avoidance (RFC 9293 §3.8.6.2);
* RTO per RFC 6298 with clock granularity G (1 ms by default, paper 000 §7.8), Karn's
  algorithm, exponential backoff, and an abort after ``max_retransmissions``;
* slow start, congestion avoidance, fast retransmit / fast recovery (RFC 5681) with NewReno
  partial ACKs (RFC 6582); zero-window probing with a backed-off persist timer (RFC 1122
  §4.2.2.17); optional delayed ACK (off by default, paper 000 §7.8) and keepalive (RFC 1122
  §4.2.3.6).

Malformed or unacceptable input never raises: it is dropped and counted by :class:`DropReason`.
Application calls that the state forbids raise :class:`~stacklib.errors.LocalProtocolError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from stacklib.errors import LocalProtocolError
from stacklib.layers.tcp.wire import (
    HEADER_WORDS,
    HeaderTemplate,
    IPv4Address,
    Segment,
    TcpErrorKind,
    TcpFlags,
    TcpFormatError,
    TcpOptions,
    build,
    parse,
    pseudo_sum,
    sum_ok,
)

__all__ = [
    "TRANSITIONS",
    "ChecksumPolicy",
    "Closed",
    "Connected",
    "ConnectionAborted",
    "ConnectionReset",
    "DataReceived",
    "DeliveryProblem",
    "DropReason",
    "EndOfStream",
    "Event",
    "TcpConfig",
    "TcpConnection",
    "TcpListener",
    "TcpState",
    "TcpStatistics",
    "Trigger",
    "reset_for",
    "seq_add",
    "seq_diff",
    "seq_geq",
    "seq_gt",
    "seq_leq",
    "seq_lt",
]

from stacklib.layers.tcp.config import ChecksumPolicy, DropReason, TcpConfig, TcpStatistics
from stacklib.layers.tcp.congestion import CWND_CAP, CongestionController, initial_window
from stacklib.layers.tcp.events import (
    Closed,
    Connected,
    ConnectionAborted,
    ConnectionReset,
    DataReceived,
    DeliveryProblem,
    EndOfStream,
    Event,
)
from stacklib.layers.tcp.reassembly import Reassembler
from stacklib.layers.tcp.rtt import RttEstimator
from stacklib.layers.tcp.sendbuf import SendBuffer
from stacklib.layers.tcp.seq import ACK as _ACK
from stacklib.layers.tcp.seq import FIN as _FIN
from stacklib.layers.tcp.seq import PSH as _PSH
from stacklib.layers.tcp.seq import RST as _RST
from stacklib.layers.tcp.seq import SEQ_HALF as _HALF
from stacklib.layers.tcp.seq import SEQ_MASK as _MASK
from stacklib.layers.tcp.seq import SYN as _SYN
from stacklib.layers.tcp.seq import seq_add, seq_diff, seq_geq, seq_gt, seq_leq, seq_lt
from stacklib.layers.tcp.states import KEEPALIVE as _KEEPALIVE
from stacklib.layers.tcp.states import PEER_KNOWS as _PEER_KNOWS
from stacklib.layers.tcp.states import RECEIVING as _RECEIVING
from stacklib.layers.tcp.states import SENDING as _SENDING
from stacklib.layers.tcp.states import SYNCHRONIZED as _SYNCHRONIZED
from stacklib.layers.tcp.states import TRANSITIONS, TcpState, Trigger

_S = TcpState

# --- helpers -----------------------------------------------------------------------------------


def reset_for(segment: Segment) -> Segment | None:
    """The RST answering ``segment`` sent to a connection that does not exist (RFC 9293
    §3.10.7.1), or None if ``segment`` is itself an RST (never answer an RST)."""
    if segment.flags & TcpFlags.RST:
        return None
    if segment.flags & TcpFlags.ACK:
        return Segment(
            src_port=segment.dst_port,
            dst_port=segment.src_port,
            seq=segment.ack,
            flags=TcpFlags.RST,
        )
    return Segment(
        src_port=segment.dst_port,
        dst_port=segment.src_port,
        seq=0,
        ack=seq_add(segment.seq, segment.seg_len),
        flags=TcpFlags.RST | TcpFlags.ACK,
    )


_DEFAULT_MSS = 536  # RFC 9293 §3.7.1: assumed when the peer sends no MSS option
_MAX_WINDOW = 0xFFFF  # no window scaling: the header field is the window
# Header prediction's control words: data offset 5 (no options), then ACK or ACK|PSH only.
_PREDICTED_ACK = 0x5000 | _ACK
_PREDICTED_PSH = 0x5000 | _ACK | _PSH


class TcpConnection:
    """One TCP connection, sans-IO.

    Create it for an active open and call :meth:`connect`, or get one from
    :meth:`TcpListener.receive_segment` (or :meth:`accept`) for a passive open.  ``iss`` is the
    initial send sequence number, chosen by the caller (RFC 9293 §3.4.1 wants it
    unpredictable; simulations want it deterministic).  ``local_ip`` and ``remote_ip`` are used
    only for the checksum's pseudo-header.
    """

    def __init__(
        self,
        *,
        local_port: int,
        remote_port: int,
        iss: int,
        config: TcpConfig | None = None,
        local_ip: IPv4Address = 0,
        remote_ip: IPv4Address = 0,
    ) -> None:
        for name, port in (("local_port", local_port), ("remote_port", remote_port)):
            if not 0 <= port <= 0xFFFF:
                raise ValueError(f"{name} must be in 0..65535, got {port}")
        if not 0 <= iss <= _MASK:
            raise ValueError(f"iss must be in 0..2**32-1, got {iss}")
        cfg = config if config is not None else TcpConfig()
        self.config = cfg
        self.local_port = local_port
        self.remote_port = remote_port
        self.local_ip = local_ip
        self.remote_ip = remote_ip
        self._tx_sum = cfg.checksum in (ChecksumPolicy.BOTH, ChecksumPolicy.TX)
        rx_sum = cfg.checksum in (ChecksumPolicy.BOTH, ChecksumPolicy.RX)
        self._rx_addresses: tuple[IPv4Address, IPv4Address] | tuple[()] = (
            (remote_ip, local_ip) if rx_sum else ()
        )
        # Per-connection constants of the per-segment paths: the header template (ports and
        # pseudo-header sum) and the received segments' pseudo-header sum.
        self._template = (
            HeaderTemplate(local_port, remote_port, local_ip, remote_ip)
            if self._tx_sum
            else HeaderTemplate(local_port, remote_port)
        )
        self._rx_pair = pseudo_sum(remote_ip, local_ip) if rx_sum else None
        self._state = TcpState.CLOSED
        self._used = False  # a connection opens once
        self._passive = False
        # Send sequence space (RFC 9293 §3.3.1).
        self._iss = iss
        self._snd_una = iss
        self._snd_nxt = iss
        self._snd_max = iss  # highest sequence number sent + 1 (snd_nxt goes back on RTO)
        self._snd_wnd = 0
        self._snd_wl1 = 0
        self._snd_wl2 = 0
        self._max_snd_wnd = 0
        self._send = SendBuffer(seq_add(iss, 1), cfg.send_buffer)
        self._sndbuf = self._send.data  # the same bytearray, for the per-segment paths
        self._fin_queued = False  # the application shut down writing
        # Receive sequence space.
        self._irs = 0
        self._rcv_nxt = 0
        self._rcv_adv = 0  # right edge of the window last advertised (never moves left)
        self._rcvbuf = bytearray()  # in order, not yet read
        self._reassembly = Reassembler()
        self._ooo = self._reassembly.segments  # the same dict: tested per segment
        self._eff_mss = min(cfg.mss, _DEFAULT_MSS)
        # RTT and RTO (RFC 6298).
        self._rtt = RttEstimator(
            initial=cfg.rto_initial,
            rto_min=cfg.rto_min,
            rto_max=cfg.rto_max,
            granularity=cfg.clock_granularity,
        )
        self._rtt_seq: int | None = None  # the one timed sequence number (Karn: never a resend)
        self._rtt_time = 0.0
        self._retries = 0  # consecutive timeouts without progress
        self._first_retry_at = 0.0  # when the first of those timeouts fired (for R2's time)
        # Congestion control (RFC 5681, RFC 6582).
        self._cc: CongestionController = cfg.congestion()
        self._dupacks = 0
        self._in_recovery = False
        self._recover = iss
        self._first_partial = True
        # Timers: absolute deadlines or None.
        self._rtx_at: float | None = None
        self._persist_at: float | None = None
        self._persist_backoff = 0
        self._force_send = False  # persist expiry with an open window: override SWS once
        self._delack_at: float | None = None
        self._keepalive_at: float | None = None
        self._keepalive_sent = 0
        self._timewait_at: float | None = None
        # ACK scheduling.
        self._ack_pending = False
        self._unacked_segments = 0
        # Outputs.
        self._outbox: list[bytes] = []
        self._events: deque[Event] = deque()
        # Counters.
        self._segments_in = self._segments_out = 0
        self._bytes_sent = self._bytes_received = 0
        self._retransmissions = self._timeouts = self._fast_retransmits = 0
        self._dup_acks_in = self._zw_probes = self._ka_probes = self._challenge_acks = 0
        self._dropped: dict[DropReason, int] = {}
        # Challenge ACK rate limit (RFC 5961 §7): the current interval's start and count.
        self._challenge_window_start = -float("inf")
        self._challenges_in_window = 0
        self._challenges_suppressed = 0

    def __repr__(self) -> str:
        return (
            f"<TcpConnection {self.local_port}->{self.remote_port} {self._state.value} "
            f"una={self._snd_una} nxt={self._snd_nxt} rcv_nxt={self._rcv_nxt}>"
        )

    # ------------------------------------------------------------------ construction

    @classmethod
    def accept(
        cls,
        syn: Segment,
        now: float,
        *,
        iss: int,
        config: TcpConfig | None = None,
        local_ip: IPv4Address = 0,
        remote_ip: IPv4Address = 0,
    ) -> TcpConnection:
        """A connection in SYN-RECEIVED answering ``syn`` (a LISTEN's reaction, RFC 9293
        §3.10.7.2); its SYN+ACK is ready in :meth:`segments_to_send`.  ``syn`` must carry SYN
        and neither ACK nor RST (ValueError otherwise: the listener filters those)."""
        if not syn.flags & TcpFlags.SYN or syn.flags & (TcpFlags.ACK | TcpFlags.RST):
            raise ValueError(f"not an initial SYN: {syn}")
        conn = cls(
            local_port=syn.dst_port,
            remote_port=syn.src_port,
            iss=iss,
            config=config,
            local_ip=local_ip,
            remote_ip=remote_ip,
        )
        conn._used = True
        conn._passive = True
        conn._state = TcpState.LISTEN
        conn._segments_in += 1
        conn._keepalive_touch(now)
        conn._take_syn(syn)
        conn._move(Trigger.RCV_SYN)
        conn._output(now)
        return conn

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> TcpState:
        """The current RFC 9293 state."""
        return self._state

    @property
    def send_room(self) -> int:
        """How many bytes :meth:`send` accepts now (0 when sending is not allowed)."""
        state = self._state
        # ESTABLISHED first, by identity: set membership hashes the enum in Python.
        if (state is not _S.ESTABLISHED and state not in _SENDING) or self._fin_queued:
            return 0
        return self._send.capacity - len(self._sndbuf)

    @property
    def readable(self) -> int:
        """Bytes :meth:`read` can return now."""
        return len(self._rcvbuf)

    @property
    def send_queued(self) -> int:
        """Bytes accepted by :meth:`send` and not yet acknowledged by the peer."""
        return len(self._sndbuf)

    def _move(self, trigger: Trigger) -> None:
        new = TRANSITIONS.get((self._state, trigger))
        if new is None:
            raise LocalProtocolError(f"TCP: {trigger.value} is not allowed in {self._state.value}")
        self._state = new

    def _illegal(self, call: str, why: str) -> LocalProtocolError:
        return LocalProtocolError(f"TCP: {call} in state {self._state.value}: {why}")

    # ------------------------------------------------------------------ application calls

    def connect(self, now: float) -> None:
        """Active open (RFC 9293 §3.10.1): send a SYN, enter SYN-SENT."""
        if self._used:
            raise self._illegal("connect()", "a connection opens only once")
        self._used = True
        self._keepalive_touch(now)
        self._move(Trigger.CONNECT)
        self._output(now)

    def send(self, data: bytes | bytearray | memoryview) -> int:
        """Queue bytes for the peer; returns how many were accepted (bounded by the send buffer's
        free space, :attr:`send_room`).  Allowed in SYN-SENT, SYN-RECEIVED (queued until
        ESTABLISHED), ESTABLISHED and CLOSE-WAIT, before :meth:`shutdown_write`."""
        state = self._state
        if state is not _S.ESTABLISHED and state not in _SENDING:
            raise self._illegal("send()", "the connection is not open for sending")
        if self._fin_queued:
            raise self._illegal("send()", "writing was shut down")
        return self._send.push(data)

    def read(self, max_bytes: int | None = None) -> bytes:
        """Up to ``max_bytes`` (all if None) received bytes, in order.  Freeing buffer space
        opens the window; an update is sent when the right edge can move by min(buffer / 2,
        MSS) (receiver SWS avoidance, RFC 9293 §3.8.6.2.2)."""
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative, got {max_bytes}")
        n = len(self._rcvbuf) if max_bytes is None else min(max_bytes, len(self._rcvbuf))
        if n == 0:
            return b""
        out = bytes(self._rcvbuf[:n])
        del self._rcvbuf[:n]
        if self._state in _RECEIVING and self._window_update_due():
            self._ack_pending = True
        return out

    def shutdown_write(self, now: float) -> None:
        """Send a FIN after the queued bytes (RFC 9293 §3.10.4, CLOSE).  In SYN-SENT the
        connection is simply closed; in SYN-RECEIVED the FIN waits for ESTABLISHED."""
        state = self._state
        if self._fin_queued or state not in _SENDING:
            raise self._illegal("shutdown_write()", "writing is already shut down or not open")
        if state is TcpState.SYN_SENT:
            self._move(Trigger.CLOSE)
            self._finish(Closed())
            return
        self._fin_queued = True
        if state is not TcpState.SYN_RECEIVED:
            self._move(Trigger.CLOSE)
        self._output(now)

    def abort(self, now: float) -> None:
        """Reset the connection (RFC 9293 §3.10.5, ABORT): send an RST if the peer knows the
        connection, discard everything, enter CLOSED with a :class:`Closed` event.  A no-op in
        CLOSED."""
        if self._state is TcpState.CLOSED:
            return
        self._reset_peer()
        self._move(Trigger.ABORT)
        self._finish(Closed())
        self._rcvbuf.clear()

    # ------------------------------------------------------------------ outputs

    def segments_to_send(self, now: float) -> list[bytes]:
        """The segments to transmit now, oldest first, as wire bytes; each is returned once."""
        self._output(now)
        out = self._outbox
        self._outbox = []
        return out

    def next_event(self) -> Event | None:
        """The next event for the application, or None."""
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        """The earliest deadline at which :meth:`handle_timer` must be called, or None."""
        # Written out (no tuple, no loop): the driver asks after every segment.
        deadline = self._rtx_at
        t = self._persist_at
        if t is not None and (deadline is None or t < deadline):
            deadline = t
        t = self._delack_at
        if t is not None and (deadline is None or t < deadline):
            deadline = t
        t = self._keepalive_at
        if t is not None and (deadline is None or t < deadline):
            deadline = t
        t = self._timewait_at
        if t is not None and (deadline is None or t < deadline):
            deadline = t
        return deadline

    def statistics(self) -> TcpStatistics:
        """A frozen snapshot of the counters and estimators."""
        return TcpStatistics(
            state=self._state,
            segments_in=self._segments_in,
            segments_out=self._segments_out,
            bytes_sent=self._bytes_sent,
            bytes_received=self._bytes_received,
            retransmissions=self._retransmissions,
            timeouts=self._timeouts,
            fast_retransmits=self._fast_retransmits,
            dup_acks=self._dup_acks_in,
            zero_window_probes=self._zw_probes,
            keepalive_probes=self._ka_probes,
            challenge_acks=self._challenge_acks,
            challenge_acks_suppressed=self._challenges_suppressed,
            srtt=self._rtt.srtt,
            rttvar=self._rtt.rttvar,
            rto=self._rtt.rto,
            cwnd=self._cc.cwnd,
            ssthresh=self._cc.ssthresh,
            snd_wnd=self._snd_wnd,
            rcv_wnd=self._rcv_window(),
            mss=self._eff_mss,
            send_queued=len(self._sndbuf),
            receive_queued=len(self._rcvbuf),
            dropped=dict(self._dropped),
        )

    # ------------------------------------------------------------------ timers

    def handle_timer(self, now: float) -> None:
        """Act on every timer that has expired at ``now`` (others are left alone)."""
        if self._timewait_at is not None and now >= self._timewait_at:
            self._move(Trigger.TIMEOUT)
            self._finish(Closed())
            return
        if self._rtx_at is not None and now >= self._rtx_at:
            self._on_rto(now)
            if self._state is TcpState.CLOSED:
                return
        if self._persist_at is not None and now >= self._persist_at:
            self._on_persist(now)
        if self._delack_at is not None and now >= self._delack_at:
            self._delack_at = None
            self._ack_pending = True
        if self._keepalive_at is not None and now >= self._keepalive_at:
            self._on_keepalive(now)
        if self._state is not TcpState.CLOSED:
            self._output(now)

    def _on_rto(self, now: float) -> None:
        """RFC 6298 §5.4-5.7, RFC 5681 §3.1 (eq. 4), RFC 6582 §3.2 step 4."""
        self._rtx_at = None
        synchronized = self._state in _SYNCHRONIZED
        if synchronized and self._snd_una == self._snd_max:
            return  # nothing outstanding (a stale timer)
        cfg = self.config
        if self._retries == 0:
            self._first_retry_at = now
        if synchronized:
            limit, r2_time = cfg.max_retransmissions, cfg.r2_time
        else:
            limit, r2_time = cfg.max_syn_retransmissions, cfg.r2_syn_time
        if self._retries >= limit and now - self._first_retry_at >= r2_time:
            # R2 (RFC 9293 §3.8.3): give up, and tell the peer where it knows the connection.
            self._reset_peer()
            self._finish(
                ConnectionAborted(
                    reason=f"no acknowledgment after {self._retries} retransmissions "
                    f"in {now - self._first_retry_at:g} s"
                )
            )
            self._move_closed()
            return
        self._retries += 1
        if self._retries == cfg.r1:
            self._events.append(DeliveryProblem(retransmissions=self._retries))  # R1
        self._timeouts += 1
        if synchronized:
            self._cc.on_timeout(self._flight(), self._eff_mss, first=self._retries == 1)
            self._in_recovery = False
            self._dupacks = 0
            self._recover = self._snd_max
        self._rtt.back_off()
        self._rtt_seq = None  # Karn: the timed segment is being resent
        self._retransmit_head(now)
        self._rtx_at = now + self._rtt.rto

    def _on_persist(self, now: float) -> None:
        """Zero-window probe (RFC 9293 §3.8.6.1, RFC 1122 §4.2.2.17), Linux style: a segment
        one below SND.NXT with no data, which any receiver answers with an ACK and its window.
        With a window open but too small for SWS avoidance, send what fits instead."""
        self._persist_at = None
        if self._usable() > 0:
            self._force_send = True
            return
        self._zw_probes += 1
        self._emit(seq_add(self._snd_nxt, -1), TcpFlags.ACK)
        self._persist_backoff += 1
        self._persist_at = now + self._persist_interval()

    def _persist_interval(self) -> float:
        return min(self._rtt.rto * (1 << min(self._persist_backoff, 30)), self.config.persist_max)

    def _on_keepalive(self, now: float) -> None:
        """RFC 1122 §4.2.3.6: after ``keepalive_idle`` of silence, probe; after
        ``keepalive_probes`` unanswered probes, abort."""
        cfg = self.config
        self._keepalive_at = None
        if self._state not in _KEEPALIVE or cfg.keepalive_idle is None:
            return
        if self._snd_una != self._snd_max:  # retransmission covers liveness for now
            self._keepalive_at = now + cfg.keepalive_idle
            return
        if self._keepalive_sent >= cfg.keepalive_probes:
            self._finish(ConnectionAborted(reason="keepalive: the peer stopped answering"))
            self._move_closed()
            return
        self._keepalive_sent += 1
        self._ka_probes += 1
        self._emit(seq_add(self._snd_nxt, -1), TcpFlags.ACK)
        self._keepalive_at = now + cfg.keepalive_interval

    def _keepalive_touch(self, now: float) -> None:
        self._keepalive_sent = 0
        idle = self.config.keepalive_idle
        self._keepalive_at = None if idle is None or self._state not in _KEEPALIVE else now + idle

    # ------------------------------------------------------------------ input

    def receive_segment(self, segment: bytes | bytearray | memoryview, now: float) -> None:
        """Feed one segment (TCP header and payload, as IP delivered it).  Never raises on bad
        input: malformed and unacceptable segments are dropped and counted."""
        if (
            self._state is TcpState.ESTABLISHED
            and len(segment) >= 20
            and self._predicted(segment, now)
        ):
            return
        try:
            seg = parse(segment, *self._rx_addresses)
        except TcpFormatError as exc:
            self._drop(
                DropReason.CHECKSUM if exc.kind is TcpErrorKind.CHECKSUM else DropReason.MALFORMED
            )
            return
        if seg.src_port != self.remote_port or seg.dst_port != self.local_port:
            self._drop(DropReason.WRONG_PORT)
            return
        self._segments_in += 1
        state = self._state
        if state is TcpState.CLOSED or state is TcpState.LISTEN:
            self._drop(DropReason.CLOSED)
            reply = reset_for(seg)
            if reply is not None:
                self._emit_segment(reply)
            return
        if state in _KEEPALIVE:
            self._keepalive_touch(now)
        if state is TcpState.SYN_SENT:
            self._on_syn_sent(seg, now)
        else:
            self._on_synchronized(seg, now)

    def _predicted(self, segment: bytes | bytearray | memoryview, now: float) -> bool:
        """Header prediction (Van Jacobson's, as in 4.4BSD's tcp_input): in ESTABLISHED, the
        next in-order segment with only ACK (and PSH) set, no options, that either acknowledges
        new data or carries data that fits the window, nothing else going on (no recovery, no
        out-of-order queue, no FIN queued).  Handled here with the same effect as the full
        path, without a Segment object; False, nothing changed, for everything else."""
        sport, dport, seq, ack, control, window, _, _ = HEADER_WORDS.unpack_from(segment)
        if (
            (control != _PREDICTED_ACK and control != _PREDICTED_PSH)
            or seq != self._rcv_nxt
            or sport != self.remote_port
            or dport != self.local_port
            or self._ooo
            or self._fin_queued
            or self._in_recovery
        ):
            return False
        size = len(segment) - 20
        advance = ((ack - self._snd_una + _HALF) & _MASK) - _HALF
        if advance > 0:
            if ((ack - self._snd_max + _HALF) & _MASK) - _HALF > 0:
                return False  # acknowledges what was never sent
        elif advance < 0 or not size:
            return False  # an old ACK, or a duplicate one: the full path counts them
        if size and size > ((self._rcv_adv - seq + _HALF) & _MASK) - _HALF:
            return False  # beyond the window: the full path trims it
        rx_pair = self._rx_pair
        if rx_pair is not None and not sum_ok(segment, rx_pair):
            self._drop(DropReason.CHECKSUM)
            return True
        self._segments_in += 1
        # _keepalive_touch(now), written out (ESTABLISHED is a keepalive state).
        self._keepalive_sent = 0
        idle = self.config.keepalive_idle
        self._keepalive_at = None if idle is None else now + idle
        if advance > 0:
            self._on_new_ack(ack, now)
        # RFC 9293 §3.10.7.4's window update, as _on_ack does it (SND.UNA <= SEG.ACK here).
        wl1 = ((self._snd_wl1 - seq + _HALF) & _MASK) - _HALF
        if wl1 < 0 or (wl1 == 0 and ((self._snd_wl2 - ack + _HALF) & _MASK) - _HALF <= 0):
            if window > self._snd_wnd:
                self._persist_backoff = 0
            self._snd_wnd = window
            if window > self._max_snd_wnd:
                self._max_snd_wnd = window
            self._snd_wl1, self._snd_wl2 = seq, ack
        if size:
            # _deliver(), written out.
            rcvbuf = self._rcvbuf
            rcvbuf += segment[20:]
            self._rcv_nxt = (seq + size) & _MASK
            self._bytes_received += size
            self._events.append(DataReceived(available=len(rcvbuf)))
            if self.config.delayed_ack is None:
                self._ack_pending = True
            else:
                self._unacked_segments += 1
                if self._unacked_segments >= 2:  # RFC 5681 §4.2: ACK at least every 2nd
                    self._ack_pending = True
                elif self._delack_at is None:
                    self._delack_at = now + self.config.delayed_ack
        return True

    def _on_syn_sent(self, seg: Segment, now: float) -> None:
        """RFC 9293 §3.10.7.3."""
        flags = seg.flags
        if flags & TcpFlags.ACK and (seq_leq(seg.ack, self._iss) or seq_gt(seg.ack, self._snd_max)):
            self._drop(DropReason.BAD_ACK)
            if not flags & TcpFlags.RST:
                self._emit_segment(
                    Segment(
                        src_port=self.local_port,
                        dst_port=self.remote_port,
                        seq=seg.ack,
                        flags=TcpFlags.RST,
                    )
                )
            return
        if flags & TcpFlags.RST:
            if flags & TcpFlags.ACK:  # acceptable ACK (checked above): connection refused
                self._move(Trigger.RESET)
                self._finish(ConnectionReset())
            else:
                self._drop(DropReason.RST_IGNORED)
            return
        if not flags & TcpFlags.SYN:
            self._drop(DropReason.NOT_SYN)
            return
        self._take_syn(seg)
        if flags & TcpFlags.ACK:
            self._snd_una = seg.ack
            self._on_syn_acked(now)
            self._snd_wnd = seg.window
            self._max_snd_wnd = max(self._max_snd_wnd, seg.window)
            self._snd_wl1, self._snd_wl2 = seg.seq, seg.ack
            self._move(Trigger.RCV_SYN_ACK)
            self._established(now)
            self._ack_pending = True
            # Data carried on the SYN is not taken (it is not acknowledged, so it comes again).
        else:
            # Simultaneous open: answer SYN+ACK with our ISS (RFC 9293 §3.5, Figure 8).
            self._move(Trigger.RCV_SYN)
            self._send_syn(now, retransmission=False)

    def _take_syn(self, seg: Segment) -> None:
        """Record the peer's ISN, MSS and initial window from its SYN."""
        self._irs = seg.seq
        self._rcv_nxt = seq_add(seg.seq, 1)
        self._rcv_adv = seq_add(self._rcv_nxt, self._free_space())
        peer_mss = seg.options.mss if seg.options.mss else _DEFAULT_MSS
        self._eff_mss = max(1, min(self.config.mss, peer_mss))
        self._snd_wnd = seg.window
        self._max_snd_wnd = max(self._max_snd_wnd, seg.window)
        self._snd_wl1 = seg.seq

    def _on_syn_acked(self, now: float) -> None:
        """Our SYN is acknowledged: an RTT sample unless it was resent, the window starts."""
        if self._rtt_seq is not None:
            self._rtt.sample(now - self._rtt_time)
            self._rtt_seq = None
        self._retries = 0
        self._rtx_at = None
        if self._snd_nxt == self._iss or seq_lt(self._snd_nxt, self._snd_una):
            self._snd_nxt = self._snd_una
        cfg = self.config
        iw = initial_window(self._eff_mss)
        if cfg.initial_cwnd is not None:
            iw = cfg.initial_cwnd * self._eff_mss
        # RFC 5681 §3.1: after a lost SYN the initial window is one segment.
        self._cc.start(self._eff_mss if self._timeouts else iw)
        self._recover = self._iss

    def _established(self, now: float) -> None:
        self._events.append(Connected())
        self._keepalive_touch(now)
        if self._fin_queued:  # shutdown_write() in SYN-RECEIVED, RFC 9293 §3.10.4
            self._move(Trigger.CLOSE)

    def _on_synchronized(self, seg: Segment, now: float) -> None:
        """RFC 9293 §3.10.7.4, for SYN-RECEIVED and the synchronized states."""
        flags = int(seg.flags)
        seq = seg.seq
        wnd = self._rcv_window()
        state = self._state
        # RST first, with RFC 5961 §3.2: only an exact match resets; an in-window RST is
        # answered with a challenge ACK (a real peer then sends an exact RST); others dropped.
        if flags & _RST:
            if seq == self._rcv_nxt:
                self._reset_by_peer()
            elif 0 <= seq_diff(seq, self._rcv_nxt) < max(wnd, 1):
                self._challenge_ack(now)
            else:
                self._drop(DropReason.RST_IGNORED)
            return
        if (
            state is TcpState.SYN_RECEIVED
            and flags & _SYN
            and not flags & _ACK
            and seq == self._irs
        ):
            # The peer resent its SYN: our SYN+ACK was lost.  Answer it again.
            self._send_syn(now)
            return
        if not self._acceptable(seg, wnd):
            if seq_leq(seq_add(seq, seg.seg_len), self._rcv_nxt) and seg.seg_len:
                self._drop(DropReason.DUPLICATE)
            else:
                self._drop(DropReason.OUT_OF_WINDOW)
            if state is TcpState.TIME_WAIT and flags & _FIN:
                self._timewait_at = now + 2 * self.config.msl  # a resent FIN restarts 2*MSL
            self._send_ack()
            return
        if flags & _SYN:
            self._challenge_ack(now)  # RFC 5961 §4: a SYN in a synchronized state
            return
        if not flags & _ACK:
            self._drop(DropReason.NO_ACK)
            return
        ack = seg.ack
        if state is TcpState.SYN_RECEIVED:
            if seq_lt(self._snd_una, ack) and seq_leq(ack, self._snd_max):
                self._snd_una = ack
                self._on_syn_acked(now)
                self._snd_wnd = seg.window
                self._max_snd_wnd = max(self._max_snd_wnd, seg.window)
                self._snd_wl1, self._snd_wl2 = seq, ack
                self._move(Trigger.RCV_ACK_OF_SYN)
                self._established(now)
            else:
                self._drop(DropReason.BAD_ACK)
                self._emit_segment(
                    Segment(
                        src_port=self.local_port,
                        dst_port=self.remote_port,
                        seq=ack,
                        flags=TcpFlags.RST,
                    )
                )
                return
        elif not self._on_ack(seg, now):
            return
        if self._state is TcpState.CLOSED:
            return
        self._on_text(seg, now)

    def _acceptable(self, seg: Segment, wnd: int) -> bool:
        """The four cases of RFC 9293 §3.10.7.4, with Linux's allowance: at a zero window, a
        segment at exactly RCV.NXT is taken for its ACK (and a bare FIN) and its data dropped."""
        rel = ((seg.seq - self._rcv_nxt + _HALF) & _MASK) - _HALF
        length = seg.seg_len
        if wnd == 0:
            return rel == 0
        if length == 0:
            return 0 <= rel < wnd
        end = rel + length - 1
        return (0 <= rel < wnd) or (0 <= end < wnd)

    def _on_ack(self, seg: Segment, now: float) -> bool:
        """The ACK field in a synchronized state (RFC 9293 §3.10.7.4 fifth, RFC 5681, RFC
        6582).  False if the segment must be dropped."""
        ack = seg.ack
        if ((ack - self._snd_max + _HALF) & _MASK) - _HALF > 0:
            # RFC 9293 §3.10.7.4 and RFC 5961 §5.2: drop it, send an ACK -- rate-limited, for
            # two ends that disagree about what was sent would otherwise trade ACKs forever.
            self._challenge_ack(now, DropReason.BAD_ACK)
            return False
        old_una = self._snd_una
        una_to_ack = ((ack - old_una + _HALF) & _MASK) - _HALF
        if una_to_ack < -self._max_snd_wnd:
            # RFC 5961 §5.2: acceptable is SND.UNA - MAX.SND.WND <= SEG.ACK <= SND.NXT; an older
            # ACK is a blind injection (its data must not reach the application).
            self._challenge_ack(now, DropReason.OLD_ACK)
            return False
        if una_to_ack > 0:
            self._on_new_ack(ack, now)
        elif (
            ack == old_una
            and self._snd_una != self._snd_max
            and not seg.payload
            and not int(seg.flags) & (_SYN | _FIN)
            and seg.window == self._snd_wnd
        ):
            self._on_dup_ack(now)
        # Window update (RFC 9293 §3.10.7.4): only from a segment newer than the last one used.
        if ((old_una - ack + _HALF) & _MASK) - _HALF <= 0 and (  # seq_leq(old_una, ack)
            ((self._snd_wl1 - seg.seq + _HALF) & _MASK) - _HALF < 0
            or (self._snd_wl1 == seg.seq and seq_leq(self._snd_wl2, ack))
        ):
            if seg.window > self._snd_wnd:
                self._persist_backoff = 0
            self._snd_wnd = seg.window
            self._max_snd_wnd = max(self._max_snd_wnd, seg.window)
            self._snd_wl1, self._snd_wl2 = seg.seq, ack
        if self._state is TcpState.CLOSED:
            return False
        fin_acked = self._fin_queued and self._snd_una == (self._fin_seq() + 1) & _MASK
        state = self._state
        if fin_acked:
            if state is TcpState.FIN_WAIT_1:
                self._move(Trigger.RCV_ACK_OF_FIN)
                self._keepalive_touch(now)
            elif state is TcpState.CLOSING:
                self._move(Trigger.RCV_ACK_OF_FIN)
                self._enter_time_wait(now)
            elif state is TcpState.LAST_ACK:
                self._move(Trigger.RCV_ACK_OF_FIN)
                self._finish(Closed())
                return False
        return True

    def _on_new_ack(self, ack: int, now: float) -> None:
        acked = ((ack - self._snd_una + _HALF) & _MASK) - _HALF
        rtt_seq = self._rtt_seq
        if rtt_seq is not None and ((ack - rtt_seq + _HALF) & _MASK) - _HALF > 0:
            self._rtt.sample(now - self._rtt_time)
            self._rtt_seq = None
        # Drop acknowledged bytes from the send buffer (the FIN is not in it).
        self._send.acknowledge(ack)
        self._snd_una = ack
        if ((self._snd_nxt - ack + _HALF) & _MASK) - _HALF < 0:
            self._snd_nxt = ack
        self._retries = 0
        mss = self._eff_mss
        if self._in_recovery:
            if seq_geq(ack, self._recover):
                # Full ACK (RFC 6582 §3.2 step 3): deflate to min(ssthresh, FlightSize + SMSS).
                cc = self._cc
                cc.cwnd = min(cc.ssthresh, max(self._flight(), mss) + mss)
                self._in_recovery = False
                self._dupacks = 0
            else:
                # Partial ACK: resend the next hole, deflate by the amount acked, add one SMSS
                # back if that was at least one SMSS; restart the timer on the first only.
                self._retransmit_head(now)
                cc = self._cc
                cc.cwnd = max(cc.cwnd - acked + (mss if acked >= mss else 0), mss)
                if self._first_partial:
                    self._first_partial = False
                    self._rtx_at = now + self._rtt.rto
                return
        else:
            self._dupacks = 0
            self._cc.on_ack(acked, mss)
        # RFC 6298 §5.2-5.3: stop the timer when all is acknowledged, else restart it.
        self._rtx_at = None if self._snd_una == self._snd_max else now + self._rtt.rto

    def _on_dup_ack(self, now: float) -> None:
        """RFC 5681 §3.2 with RFC 6582 §3.2 step 2 (no new recovery before ``recover``)."""
        self._dup_acks_in += 1
        self._dupacks += 1
        mss = self._eff_mss
        if self._in_recovery:
            cc = self._cc
            cc.cwnd = min(cc.cwnd + mss, CWND_CAP)  # inflate per extra dup ACK
            return
        if self._dupacks == self.config.dupack_threshold and seq_geq(self._snd_una, self._recover):
            self._fast_retransmits += 1
            self._cc.on_congestion(self._flight(), mss)
            self._recover = self._snd_max
            self._in_recovery = True
            self._first_partial = True
            self._rtt_seq = None  # Karn
            self._retransmit_head(now)
            self._cc.cwnd = self._cc.ssthresh + self.config.dupack_threshold * mss

    def _on_text(self, seg: Segment, now: float) -> None:
        """Segment text and FIN (RFC 9293 §3.10.7.4 seventh and eighth)."""
        payload = seg.payload
        fin = bool(int(seg.flags) & _FIN)
        if not payload and not fin:
            return
        if self._state not in _RECEIVING:
            # The peer's FIN already arrived: nothing can follow it (RFC 9293 §3.10.7.4).
            if payload:
                self._drop(DropReason.AFTER_FIN)
            self._send_ack()
            return
        seq = seg.seq
        # Trim to the window: what precedes RCV.NXT, and what runs past the advertised edge.
        head = ((self._rcv_nxt - seq + _HALF) & _MASK) - _HALF
        if head > 0:
            if head > len(payload):  # the FIN too was seen already
                self._send_ack()
                return
            payload = payload[head:]
            seq = self._rcv_nxt
        room = ((self._rcv_adv - seq + _HALF) & _MASK) - _HALF
        if len(payload) > room:
            payload = payload[: max(room, 0)]
            fin = False
            self._ack_pending = True  # tell the sender what was taken
        if seq != self._rcv_nxt:
            # Out of order: keep it for later, and send a duplicate ACK at once (RFC 5681 §4.2)
            # so the sender can count three of them.
            self._reassembly.add(seq, payload, fin)
            self._send_ack()
            return
        filled_gap = bool(self._ooo)
        before = self._bytes_received
        if payload:
            self._deliver(payload)
        if not fin and self._ooo:
            for piece in self._reassembly.take(self._rcv_nxt):
                self._deliver(piece)
            fin = self._reassembly.fin_at(self._rcv_nxt)
        if self._bytes_received != before:
            self._events.append(DataReceived(available=len(self._rcvbuf)))
        if fin:
            self._on_fin(now)
            return
        if filled_gap or self.config.delayed_ack is None:
            self._ack_pending = True
        else:
            self._unacked_segments += 1
            if self._unacked_segments >= 2:  # RFC 5681 §4.2: ACK at least every 2nd segment
                self._ack_pending = True
            elif self._delack_at is None:
                self._delack_at = now + self.config.delayed_ack

    def _deliver(self, payload: bytes) -> None:
        self._rcvbuf += payload
        self._rcv_nxt = (self._rcv_nxt + len(payload)) & _MASK
        self._bytes_received += len(payload)

    def _on_fin(self, now: float) -> None:
        self._reassembly.clear()
        self._rcv_nxt = seq_add(self._rcv_nxt, 1)
        self._ack_pending = True
        self._events.append(EndOfStream())
        state = self._state
        self._move(Trigger.RCV_FIN)
        if self._state is TcpState.TIME_WAIT:
            self._enter_time_wait(now)
        elif state is TcpState.ESTABLISHED:
            self._keepalive_touch(now)

    def _enter_time_wait(self, now: float) -> None:
        self._rtx_at = self._persist_at = self._delack_at = self._keepalive_at = None
        self._timewait_at = now + 2 * self.config.msl

    def _reset_by_peer(self) -> None:
        """An acceptable RST (RFC 9293 §3.10.7.4 second)."""
        event: Event = Closed() if self._state is TcpState.TIME_WAIT else ConnectionReset()
        self._move(Trigger.RESET)
        self._finish(event)

    def _reset_peer(self) -> None:
        """Tell the peer this end is going away (RFC 9293 §3.10.5), in the states where it
        knows the connection.  The RST carries SND.MAX: the peer's RCV.NXT is at most that,
        so the RST is either exact or in its window (then its challenge ACK, answered by
        reset_for once this end is CLOSED, carries the exact number, RFC 5961 §3.2)."""
        if self._state in _PEER_KNOWS:
            self._emit(self._snd_max, _RST)

    def _move_closed(self) -> None:
        if self._state is not TcpState.CLOSED:
            self._move(Trigger.ABORT)

    def _finish(self, event: Event) -> None:
        """Enter CLOSED (already moved, or moved by the caller after) and discard everything."""
        self._events.append(event)
        self._rtx_at = self._persist_at = self._delack_at = None
        self._keepalive_at = self._timewait_at = None
        self._send.clear()
        self._reassembly.clear()
        self._ack_pending = False
        if not isinstance(event, Closed):
            self._rcvbuf.clear()

    # ------------------------------------------------------------------ output engine

    def _free_space(self) -> int:
        return min(max(self.config.receive_buffer - len(self._rcvbuf), 0), _MAX_WINDOW)

    def _rcv_window(self) -> int:
        if self._state in (TcpState.CLOSED, TcpState.LISTEN, TcpState.SYN_SENT):
            return 0
        return max(((self._rcv_adv - self._rcv_nxt + _HALF) & _MASK) - _HALF, 0)

    def _window_can_move(self) -> bool:
        edge = (self._rcv_nxt + self._free_space()) & _MASK
        threshold = min(self.config.receive_buffer // 2, self._eff_mss)
        return ((edge - self._rcv_adv + _HALF) & _MASK) - _HALF >= max(threshold, 1)

    def _window_update_due(self) -> bool:
        """After a read: send a window update only if the window the peer knows has closed to
        half the buffer or less and the update would at least double it (Linux's rule,
        tcp_cleanup_rbuf).  A wider window needs none: the ACKs of the data still coming carry
        the new edge, and an update per read would be a third segment per data segment."""
        known = max(((self._rcv_adv - self._rcv_nxt + _HALF) & _MASK) - _HALF, 0)
        if 2 * known > min(self.config.receive_buffer, _MAX_WINDOW):
            return False
        if not self._window_can_move():
            return False
        return self._free_space() >= 2 * known

    def _advertise(self) -> int:
        """The window to put in a segment: the right edge moves only by min(buffer / 2, MSS)
        or more (receiver SWS avoidance) and never moves left (RFC 9293 §3.8.6.2.2)."""
        rcv_nxt = self._rcv_nxt
        # _window_can_move() and _free_space(), written out with comparisons rather than
        # min() and max() calls: this runs for every segment.
        receive_buffer = self.config.receive_buffer
        room = receive_buffer - len(self._rcvbuf)
        if room < 0:
            room = 0
        elif room > _MAX_WINDOW:
            room = _MAX_WINDOW
        edge = (rcv_nxt + room) & _MASK
        threshold = receive_buffer // 2
        if threshold > self._eff_mss:
            threshold = self._eff_mss
        if threshold < 1:
            threshold = 1
        if ((edge - self._rcv_adv + _HALF) & _MASK) - _HALF >= threshold:
            self._rcv_adv = edge
        window = ((self._rcv_adv - rcv_nxt + _HALF) & _MASK) - _HALF
        if window < 0:
            return 0
        return window if window < _MAX_WINDOW else _MAX_WINDOW

    def _flight(self) -> int:
        return seq_diff(self._snd_max, self._snd_una)

    def _usable(self) -> int:
        outstanding = ((self._snd_nxt - self._snd_una + _HALF) & _MASK) - _HALF
        return min(self._snd_wnd, self._cc.cwnd) - outstanding

    def _fin_seq(self) -> int:
        return (self._send.seq + len(self._sndbuf)) & _MASK

    def _output(self, now: float) -> None:
        """Send what the state, the windows, Nagle and SWS avoidance allow, then any ACK owed."""
        state = self._state
        if state is TcpState.CLOSED or state is TcpState.LISTEN:
            return
        if state is TcpState.SYN_SENT or state is TcpState.SYN_RECEIVED:
            if self._snd_nxt == self._iss:
                self._send_syn(now)
            return
        if state is not TcpState.TIME_WAIT:
            if self._fin_queued or self._snd_nxt != (self._send.seq + len(self._sndbuf)) & _MASK:
                self._send_data(now)
            else:
                self._force_send = False  # nothing to send: what _send_data would conclude
        if self._ack_pending:
            self._send_ack()
        self._update_persist(now)

    def _send_syn(self, now: float, *, retransmission: bool = True) -> None:
        resend = self._snd_max != self._iss
        flags = TcpFlags.SYN
        if self._state is TcpState.SYN_RECEIVED:
            flags |= TcpFlags.ACK
        self._emit(self._iss, flags, options=TcpOptions(mss=self.config.mss))
        self._snd_nxt = self._snd_max = seq_add(self._iss, 1)
        if resend:
            self._retransmissions += retransmission
            self._rtt_seq = None  # Karn
        elif self._rtt_seq is None:
            self._rtt_seq, self._rtt_time = self._iss, now
        if self._rtx_at is None:
            self._rtx_at = now + self._rtt.rto

    def _send_data(self, now: float) -> None:
        cfg = self.config
        mss = self._eff_mss
        fin_seq = (self._send.seq + len(self._sndbuf)) & _MASK  # _fin_seq()
        while True:
            unsent = ((fin_seq - self._snd_nxt + _HALF) & _MASK) - _HALF
            if unsent > 0:
                # _usable(), written out: min(SND.WND, cwnd) less what is outstanding.
                cwnd = self._cc.cwnd
                usable = self._snd_wnd if self._snd_wnd < cwnd else cwnd
                usable -= ((self._snd_nxt - self._snd_una + _HALF) & _MASK) - _HALF
                size = mss if mss < unsent else unsent
                if usable < size:
                    size = usable
                if size <= 0:
                    break
                resend = ((self._snd_nxt - self._snd_max + _HALF) & _MASK) - _HALF < 0
                if not resend and size < mss and not self._force_send:
                    # Sender SWS avoidance and Nagle (RFC 9293 §3.8.6.2.1, RFC 1122 4.2.3.4):
                    # a short segment only if it empties the queue and nothing is in flight
                    # (or Nagle is off, or the FIN goes with it), or if it is half the largest
                    # window the peer offered.
                    tail_ok = size == unsent and (
                        not cfg.nagle or self._snd_una == self._snd_max or self._fin_queued
                    )
                    if not tail_ok and not (self._max_snd_wnd and size >= self._max_snd_wnd // 2):
                        break
                self._force_send = False
                fin = self._fin_queued and size == unsent
                self._send_range(self._snd_nxt, size, fin, now)
                self._snd_nxt = snd_nxt = (self._snd_nxt + size + fin) & _MASK
                if ((snd_nxt - self._snd_max + _HALF) & _MASK) - _HALF > 0:
                    self._snd_max = snd_nxt
                if fin:
                    break
            elif unsent == 0 and self._fin_queued:
                # A bare FIN (first time or resent after go-back-N); like Linux, not held back
                # by a zero window (it carries no data).
                self._send_range(self._snd_nxt, 0, True, now)
                self._snd_nxt = seq_add(self._snd_nxt, 1)
                if seq_gt(self._snd_nxt, self._snd_max):
                    self._snd_max = self._snd_nxt
                break
            else:
                break
        self._force_send = False

    def _send_range(self, seq: int, size: int, fin: bool, now: float) -> None:
        """Emit data ``seq .. seq + size`` (and a FIN): a first transmission or a resend."""
        start = ((seq - self._send.seq + _HALF) & _MASK) - _HALF
        payload = self._sndbuf[start : start + size]  # one copy; the header is added to it
        flags = _ACK
        if payload and start + size == len(self._sndbuf):
            flags |= _PSH
        if fin:
            flags |= _FIN
        if ((seq - self._snd_max + _HALF) & _MASK) - _HALF < 0:
            self._retransmissions += 1
            self._rtt_seq = None  # Karn: no sample from anything resent
        else:
            self._bytes_sent += size
            if self._rtt_seq is None:
                self._rtt_seq, self._rtt_time = seq, now
        self._emit(seq, flags, payload)
        if self._rtx_at is None:
            self._rtx_at = now + self._rtt.rto

    def _retransmit_head(self, now: float) -> None:
        """Resend the first unacknowledged segment whatever the windows (RFC 5681 §3.2 step 2,
        RFC 6298 §5.4); then go back: SND.NXT continues after it (go-back-N)."""
        if self._state is TcpState.SYN_SENT or self._state is TcpState.SYN_RECEIVED:
            self._snd_nxt = self._iss
            self._send_syn(now)
            return
        if self._snd_una == self._snd_max:
            return
        una = self._snd_una
        remaining = max(seq_diff(self._fin_seq(), una), 0)
        # Resend only what was sent: bytes past SND.MAX would be acknowledged beyond what the
        # ACK check allows (SEG.ACK <= SND.MAX), so the peer's ACK of them would be dropped.
        outstanding = seq_diff(self._snd_max, una)
        size = min(self._eff_mss, remaining, outstanding)
        fin = self._fin_queued and size == remaining and outstanding > remaining
        self._send_range(una, size, fin, now)
        if not self._in_recovery:
            # After a timeout: go back, the rest follows as the reset cwnd allows (go-back-N).
            self._snd_nxt = seq_add(una, size + fin)

    def _update_persist(self, now: float) -> None:
        """Run the persist timer while data waits, nothing is in flight and nothing could be
        sent (a zero window, or one too small for SWS avoidance)."""
        # Cheapest test first: in a transfer the retransmission timer runs (data in flight).
        if (
            self._rtx_at is None
            and self._snd_una == self._snd_max
            and ((self._send.seq + len(self._sndbuf) - self._snd_nxt + _HALF) & _MASK) - _HALF > 0
        ):
            if self._persist_at is None:
                self._persist_at = now + self._persist_interval()
        else:
            self._persist_at = None
            if self._snd_wnd > 0:
                self._persist_backoff = 0

    def _send_ack(self) -> None:
        self._emit(self._snd_nxt, _ACK)

    def _challenge_ack(self, now: float, reason: DropReason = DropReason.CHALLENGED) -> None:
        """Drop the segment for ``reason`` and answer it with an ACK, at most
        ``challenge_ack_limit`` per ``challenge_ack_interval`` (RFC 5961 §7): a blind attacker
        must not turn its guesses into a flood of ACKs."""
        self._drop(reason)
        cfg = self.config
        if now - self._challenge_window_start >= cfg.challenge_ack_interval:
            self._challenge_window_start = now
            self._challenges_in_window = 0
        if self._challenges_in_window >= cfg.challenge_ack_limit:
            self._challenges_suppressed += 1
            return
        self._challenges_in_window += 1
        self._challenge_acks += 1
        self._send_ack()

    def _emit(
        self,
        seq: int,
        flags: int,
        payload: bytes | bytearray = b"",
        options: TcpOptions | None = None,
    ) -> None:
        ack = 0
        window = 0
        if type(flags) is not int:
            flags = int(flags)  # a TcpFlags
        if flags & _ACK:
            ack = self._rcv_nxt
            window = self._advertise()
            self._ack_pending = False
            self._delack_at = None
            self._unacked_segments = 0
        elif not flags & _RST:
            window = (
                self._advertise() if self._state is not TcpState.SYN_SENT else self._free_space()
            )
        if options is None:
            # Fast path, every data segment and ACK: the bytes from the connection's header
            # template, the same bytes build() makes of the Segment below.
            self._segments_out += 1
            data = self._template.build(seq, ack, flags, window, payload)
            self._outbox.append(data)
            return
        segment = Segment(
            src_port=self.local_port,
            dst_port=self.remote_port,
            seq=seq,
            ack=ack,
            flags=TcpFlags(flags),
            window=window,
            options=options,
            payload=bytes(payload),
        )
        self._emit_segment(segment)

    def _emit_segment(self, segment: Segment) -> None:
        self._segments_out += 1
        if self._tx_sum:
            self._outbox.append(build(segment, self.local_ip, self.remote_ip))
        else:
            self._outbox.append(build(segment))

    def _drop(self, reason: DropReason) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1


# --- LISTEN ----------------------------------------------------------------------------------


class TcpListener:
    """A passive open on ``local_port`` (RFC 9293 §3.10.7.2, LISTEN).

    :meth:`receive_segment` answers a SYN with a new :class:`TcpConnection` in SYN-RECEIVED
    (the driver adds it to its connection table and hands it to ``accept`` once it reports
    :class:`Connected`); an ACK gets an RST; an RST and anything else are ignored.  ``isn``
    chooses each connection's ISS from ``now`` (a clock-driven generator, RFC 9293 §3.4.1, or
    a seeded one in simulations).
    """

    def __init__(
        self,
        *,
        local_port: int,
        isn: Callable[[float], int],
        config: TcpConfig | None = None,
        local_ip: IPv4Address = 0,
    ) -> None:
        if not 0 <= local_port <= 0xFFFF:
            raise ValueError(f"local_port must be in 0..65535, got {local_port}")
        self.local_port = local_port
        self.local_ip = local_ip
        self.config = config if config is not None else TcpConfig()
        self._isn = isn
        self._outbox: list[tuple[IPv4Address, bytes]] = []
        self._dropped: dict[DropReason, int] = {}
        self.accepted = 0  #: connections created

    @property
    def state(self) -> TcpState:
        """Always LISTEN."""
        return TcpState.LISTEN

    def receive_segment(
        self, segment: bytes | bytearray | memoryview, now: float, *, remote_ip: IPv4Address
    ) -> TcpConnection | None:
        """Feed a segment for this port from no known connection; a new connection if it was an
        acceptable SYN.  Never raises on bad input."""
        policy = self.config.checksum
        try:
            if policy in (ChecksumPolicy.BOTH, ChecksumPolicy.RX):
                seg = parse(segment, remote_ip, self.local_ip)
            else:
                seg = parse(segment)
        except TcpFormatError as exc:
            reason = (
                DropReason.CHECKSUM if exc.kind is TcpErrorKind.CHECKSUM else DropReason.MALFORMED
            )
            self._drop(reason)
            return None
        if seg.dst_port != self.local_port:
            self._drop(DropReason.WRONG_PORT)
            return None
        flags = seg.flags
        if flags & TcpFlags.RST:
            self._drop(DropReason.RST_IGNORED)
            return None
        if flags & TcpFlags.ACK:
            reply = reset_for(seg)
            if reply is not None:
                self._send(remote_ip, reply)
            self._drop(DropReason.BAD_ACK)
            return None
        if not flags & TcpFlags.SYN:
            self._drop(DropReason.NOT_SYN)
            return None
        self.accepted += 1
        return TcpConnection.accept(
            seg,
            now,
            iss=self._isn(now) & _MASK,
            config=self.config,
            local_ip=self.local_ip,
            remote_ip=remote_ip,
        )

    def segments_to_send(self) -> list[tuple[IPv4Address, bytes]]:
        """RSTs to send, as (remote address, segment bytes)."""
        out = self._outbox
        self._outbox = []
        return out

    @property
    def dropped(self) -> Mapping[DropReason, int]:
        """Segments ignored, by reason."""
        return dict(self._dropped)

    def _send(self, remote_ip: IPv4Address, segment: Segment) -> None:
        policy = self.config.checksum
        if policy in (ChecksumPolicy.BOTH, ChecksumPolicy.TX):
            self._outbox.append((remote_ip, build(segment, self.local_ip, remote_ip)))
        else:
            self._outbox.append((remote_ip, build(segment)))

    def _drop(self, reason: DropReason) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
