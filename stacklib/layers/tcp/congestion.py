"""Congestion control behind a small controller interface: NewReno today (RFC 5681), room for
others (CUBIC, RFC 9438) without touching the connection.

The split follows Linux's ``tcp_congestion_ops`` and smoltcp's ``congestion`` module: a
controller owns the congestion window and slow-start threshold and decides how they grow and
shrink; loss *recovery* -- which segment to resend, fast recovery's window inflation and
NewReno's partial ACKs (RFC 6582) -- stays with the connection, which knows the sequence
space.  The connection reads ``cwnd`` per segment, so it is a plain attribute.
"""

from __future__ import annotations

import abc

__all__ = ["CWND_CAP", "CongestionController", "NewReno", "initial_window"]

CWND_CAP = 1 << 30  # a bound far above any window (no window scaling: 64 KiB)


def initial_window(mss: int) -> int:
    """RFC 5681 §3.1, equation 1."""
    if mss > 2190:
        return 2 * mss
    if mss > 1095:
        return 3 * mss
    return 4 * mss


class CongestionController(abc.ABC):
    """The congestion window ``cwnd`` and threshold ``ssthresh`` (bytes) and their rules."""

    name: str
    cwnd: int
    ssthresh: int

    def __init__(self) -> None:
        self.cwnd = 0  # no sending before the handshake completes
        self.ssthresh = CWND_CAP

    def start(self, window: int) -> None:
        """The handshake completed: begin with ``window`` bytes (the connection chose it: the
        initial window, or one segment after a lost SYN, RFC 5681 §3.1)."""
        self.cwnd = window

    @abc.abstractmethod
    def on_ack(self, acked: int, mss: int) -> None:
        """``acked`` new bytes were acknowledged outside recovery: grow the window."""

    @abc.abstractmethod
    def on_congestion(self, flight: int, mss: int) -> None:
        """Loss detected by duplicate ACKs with ``flight`` bytes outstanding: set ``ssthresh``
        (the connection then inflates ``cwnd`` for fast recovery from it)."""

    @abc.abstractmethod
    def on_timeout(self, flight: int, mss: int, *, first: bool) -> None:
        """The retransmission timer expired (``first``: the first expiry for this data)."""


class NewReno(CongestionController):
    """RFC 5681's slow start and congestion avoidance, halving on loss (with RFC 6582's
    recovery in the connection)."""

    name = "newreno"

    def on_ack(self, acked: int, mss: int) -> None:
        cwnd = self.cwnd
        if cwnd < self.ssthresh:
            cwnd += acked if acked < mss else mss  # slow start (RFC 5681 eq. 2)
        else:
            cwnd += max(1, mss * mss // cwnd)  # congestion avoidance (eq. 3)
        self.cwnd = cwnd if cwnd < CWND_CAP else CWND_CAP

    def on_congestion(self, flight: int, mss: int) -> None:
        self.ssthresh = max(flight // 2, 2 * mss)  # RFC 5681 eq. 4

    def on_timeout(self, flight: int, mss: int, *, first: bool) -> None:
        if first:  # later timeouts of the same data keep ssthresh (RFC 5681 §3.1)
            self.ssthresh = max(flight // 2, 2 * mss)
        self.cwnd = mss  # the loss window
