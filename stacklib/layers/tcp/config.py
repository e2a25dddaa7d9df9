"""A TCP connection's parameters (:class:`TcpConfig`), its counters (:class:`TcpStatistics`),
the checksum policy and the reasons a segment is dropped."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

import attrs

from stacklib.layers.tcp.congestion import CongestionController, NewReno
from stacklib.layers.tcp.states import TcpState

__all__ = ["ChecksumPolicy", "DropReason", "TcpConfig", "TcpStatistics"]


class ChecksumPolicy(enum.Enum):
    """Where the TCP checksum is handled in software."""

    BOTH = "compute on send, verify on receive"
    TX = "compute on send only"
    RX = "verify on receive only"
    NONE = "neither (offloaded, or protected below, e.g. by the AAL5 CRC)"


class DropReason(enum.Enum):
    """Why an incoming segment (or part of one) was not used."""

    MALFORMED = "did not parse"
    CHECKSUM = "checksum mismatch"
    WRONG_PORT = "ports are not this connection's"
    CLOSED = "connection is closed (answered with RST)"
    OUT_OF_WINDOW = "sequence number not acceptable"
    DUPLICATE = "data already received"
    RST_IGNORED = "RST not acceptable"
    CHALLENGED = "RST or SYN in window but not exact (challenge ACK sent, RFC 5961)"
    BAD_ACK = "ACK of something not sent"
    OLD_ACK = "ACK below SND.UNA - MAX.SND.WND (challenge ACK sent, RFC 5961 §5.2)"
    NO_ACK = "ACK bit off"
    AFTER_FIN = "data after the peer's FIN"
    NOT_SYN = "no SYN where one was required"


@attrs.frozen(kw_only=True)
class TcpConfig:
    """Per-connection parameters; the defaults are U-Net TCP's (paper 000 §7.8).

    Times are in seconds.  Retransmission gives up per RFC 9293 §3.8.3: after ``r1``
    retransmissions of the same segment the application gets a :class:`DeliveryProblem`; the
    connection aborts (an RST tells the peer) once the segment has been retransmitted
    ``max_retransmissions`` times (R2) *and* ``r2_time`` seconds have passed since its first
    retransmission (R2 "SHOULD correspond to at least 100 seconds"); a SYN likewise after
    ``max_syn_retransmissions`` and ``r2_syn_time`` (at least 3 minutes).  Challenge ACKs
    (RFC 5961 §7) are limited to ``challenge_ack_limit`` per ``challenge_ack_interval``.
    ``rto_min`` defaults to Linux's 200 ms rather than RFC 6298's 1 s:
    with RTTs of 60-700 µs (paper 000 §7.8) a 1 s floor would waste the 1 ms granularity, and
    200 ms still covers a Linux peer's delayed ACK.  ``delayed_ack`` None means acknowledge at
    once (paper 000 §7.8); a number delays a lone segment's ACK by that much, and every second
    segment is acknowledged at once.  ``initial_cwnd`` None uses RFC 5681 §3.1's rule.
    ``congestion`` makes each connection's congestion controller (NewReno by default).
    """

    mss: int = 2048
    send_buffer: int = 8192
    receive_buffer: int = 8192
    clock_granularity: float = 1e-3
    rto_initial: float = 1.0
    rto_min: float = 0.2
    rto_max: float = 60.0
    r1: int = 3
    max_retransmissions: int = 12
    r2_time: float = 100.0
    max_syn_retransmissions: int = 6
    r2_syn_time: float = 180.0
    challenge_ack_limit: int = 10
    challenge_ack_interval: float = 1.0
    delayed_ack: float | None = None
    nagle: bool = True
    msl: float = 30.0
    persist_max: float = 60.0
    keepalive_idle: float | None = None
    keepalive_interval: float = 75.0
    keepalive_probes: int = 9
    initial_cwnd: int | None = None
    dupack_threshold: int = 3
    congestion: Callable[[], CongestionController] = NewReno
    checksum: ChecksumPolicy = ChecksumPolicy.BOTH

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.mss <= 0xFFFF:
            raise ValueError(f"mss must be in 1..65535, got {self.mss}")
        for name in ("send_buffer", "receive_buffer", "max_syn_retransmissions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("clock_granularity", "rto_initial", "rto_min", "rto_max", "msl"):
            if not getattr(self, name) > 0:  # also rejects NaN
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.rto_min > self.rto_max:
            raise ValueError(f"rto_min {self.rto_min} exceeds rto_max {self.rto_max}")
        if self.delayed_ack is not None and not self.delayed_ack > 0:
            raise ValueError(f"delayed_ack must be positive or None, got {self.delayed_ack}")
        if self.keepalive_idle is not None and not self.keepalive_idle > 0:
            raise ValueError(f"keepalive_idle must be positive or None, got {self.keepalive_idle}")
        if self.max_retransmissions < 0 or self.keepalive_probes < 1:
            raise ValueError("max_retransmissions must be >= 0 and keepalive_probes >= 1")
        if self.r1 < 1:
            raise ValueError(f"r1 must be at least 1, got {self.r1}")
        for name in ("r2_time", "r2_syn_time"):
            if not getattr(self, name) >= 0:  # also rejects NaN
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)}")
        if self.challenge_ack_limit < 0 or not self.challenge_ack_interval > 0:
            raise ValueError(
                "challenge_ack_limit must be >= 0 and challenge_ack_interval positive, got "
                f"{self.challenge_ack_limit} per {self.challenge_ack_interval}"
            )
        if self.dupack_threshold < 1:
            raise ValueError(f"dupack_threshold must be >= 1, got {self.dupack_threshold}")


@attrs.frozen(kw_only=True)
class TcpStatistics:
    """A snapshot of one connection's counters and estimators (paper 000 §7.4: the application
    can see its retransmission counters and round-trip estimates)."""

    state: TcpState
    segments_in: int  #: segments received that parsed and matched the ports
    segments_out: int  #: segments produced (incl. retransmissions, ACKs, RSTs)
    bytes_sent: int  #: new payload bytes sent (first transmissions only)
    bytes_received: int  #: payload bytes delivered in order
    retransmissions: int  #: segments sent again (timeouts, fast and partial-ACK retransmits)
    timeouts: int  #: retransmission timer expiries
    fast_retransmits: int  #: entries into fast recovery
    dup_acks: int  #: duplicate ACKs received (RFC 5681 §2)
    zero_window_probes: int
    keepalive_probes: int
    challenge_acks: int  #: challenge ACKs sent (RFC 5961)
    challenge_acks_suppressed: int  #: challenge ACKs the rate limit withheld (RFC 5961 §7)
    srtt: float | None  #: smoothed RTT (None before the first sample)
    rttvar: float | None
    rto: float
    cwnd: int
    ssthresh: int
    snd_wnd: int  #: the peer's advertised window
    rcv_wnd: int  #: the window this end advertises now
    mss: int  #: effective send MSS
    send_queued: int  #: bytes accepted by send() and not yet acknowledged
    receive_queued: int  #: bytes received in order and not yet read
    dropped: Mapping[DropReason, int]
