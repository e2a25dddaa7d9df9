"""The parts TCP's connection is made of, each on its own: the RFC 6298 estimator, the send
buffer, the out-of-order queue and the congestion controller (and that the connection uses the
one configured)."""

from __future__ import annotations

import pytest

from stacklib.layers.tcp.congestion import CongestionController, NewReno, initial_window
from stacklib.layers.tcp.machine import TcpConfig
from stacklib.layers.tcp.reassembly import Reassembler
from stacklib.layers.tcp.rtt import RttEstimator
from stacklib.layers.tcp.sendbuf import SendBuffer
from stacklib.layers.tcp.seq import seq_add
from tests.layers.test_tcp_machine import data_from, established


def estimator(**kw: float) -> RttEstimator:
    params = {"initial": 1.0, "rto_min": 0.2, "rto_max": 60.0, "granularity": 1e-3} | kw
    return RttEstimator(**params)


def test_rfc_6298_first_and_later_samples() -> None:
    rtt = estimator(rto_min=1e-6)
    assert rtt.srtt is None and rtt.rto == 1.0
    rtt.sample(0.1)  # §2.2: SRTT = R, RTTVAR = R/2, RTO = SRTT + max(G, 4 RTTVAR)
    assert (rtt.srtt, rtt.rttvar, rtt.rto) == pytest.approx((0.1, 0.05, 0.3))
    rtt.sample(0.2)  # §2.3: beta 1/4, alpha 1/8
    assert rtt.rttvar == pytest.approx(0.75 * 0.05 + 0.25 * 0.1)
    assert rtt.srtt == pytest.approx(0.875 * 0.1 + 0.125 * 0.2)
    assert rtt.rto == pytest.approx(rtt.srtt + 4 * rtt.rttvar)


def test_granularity_floor_clamp_and_backoff() -> None:
    rtt = estimator(rto_min=1e-6, granularity=0.01)
    for _ in range(50):
        rtt.sample(0.001)  # RTTVAR decays: G dominates
    assert rtt.rto == pytest.approx(0.001 + 0.01, rel=1e-2)
    rtt = estimator()
    rtt.sample(0.0)
    assert rtt.rto == 0.2  # rto_min
    for _ in range(20):
        rtt.back_off()
    assert rtt.rto == 60.0  # rto_max
    with pytest.raises(ValueError, match="rto_min"):
        estimator(rto_min=2.0, rto_max=1.0)


def test_reassembly_fills_gaps_in_order_and_drops_old_bytes() -> None:
    top = (1 << 32) - 3  # across the wrap
    r = Reassembler()
    r.add(seq_add(top, 6), b"ghi", fin=True)
    r.add(seq_add(top, 3), b"def", fin=False)
    r.add(seq_add(top, 3), b"de", fin=False)  # a shorter copy does not replace
    r.add(top, b"xyz", fin=False)
    assert r.take(seq_add(top, 1)) == [b"yz", b"def", b"ghi"]
    assert not r.segments and r.fin_at(seq_add(top, 9))
    r.add(10, b"old", fin=False)
    assert r.take(20) == [] and not r.segments
    r.add(30, b"a", fin=True)
    r.clear()
    assert not r.segments and r.fin is None


# --- congestion control ---------------------------------------------------------------------


def test_newreno_slow_start_avoidance_loss_and_timeout() -> None:
    cc = NewReno()
    assert cc.cwnd == 0 and cc.name == "newreno"
    cc.start(initial_window(1400))
    assert cc.cwnd == 3 * 1400  # RFC 5681 eq. 1
    cc.on_ack(700, 1400)
    cc.on_ack(5000, 1400)  # slow start: min(acked, SMSS) per ACK
    assert cc.cwnd == 3 * 1400 + 700 + 1400
    cc.on_congestion(20_000, 1400)
    assert cc.ssthresh == 10_000
    cc.cwnd = 10_000
    cc.on_ack(1400, 1400)  # congestion avoidance: SMSS^2 / cwnd
    assert cc.cwnd == 10_000 + 1400 * 1400 // 10_000
    cc.on_timeout(30_000, 1400, first=True)
    assert (cc.cwnd, cc.ssthresh) == (1400, 15_000)
    cc.on_timeout(2_000, 1400, first=False)  # a later expiry keeps ssthresh
    assert (cc.cwnd, cc.ssthresh) == (1400, 15_000)
    assert [initial_window(m) for m in (536, 1400, 2048, 9000)] == [2144, 4200, 6144, 18000]


class FixedWindow(CongestionController):
    """A controller that never moves: the connection must send by it alone."""

    name = "fixed"

    def start(self, window: int) -> None:
        self.cwnd = 2 * 2048  # two of the default MSS

    def on_ack(self, acked: int, mss: int) -> None:
        pass

    def on_congestion(self, flight: int, mss: int) -> None:
        pass

    def on_timeout(self, flight: int, mss: int, *, first: bool) -> None:
        pass


def test_the_connection_sends_by_the_configured_controller() -> None:
    big = TcpConfig(send_buffer=65535, receive_buffer=65535, congestion=FixedWindow)
    n = established(big, big)
    n.now = 1.0
    n.a.send(b"x" * 20_000)
    n.pump()
    # Two segments in flight, not NewReno's initial three, and never more as ACKs come back.
    assert [len(seg.payload) for _, seg in data_from(n, "a")] == [2048, 2048]
    n.run()
    assert bytes(n.received["b"]) == b"x" * 20_000
    assert n.a.statistics().cwnd == 4096


# --- the send buffer --------------------------------------------------------------------------


def test_send_buffer_bounds_copies_and_releases_across_the_wrap() -> None:
    start = (1 << 32) - 2
    buf = SendBuffer(start, capacity=5)
    chunk = bytearray(b"abcdefg")
    assert buf.push(chunk) == 5 and buf.room == 0 and buf.push(b"h") == 0
    chunk[0] = ord("z")  # the caller's buffer is not the stream
    assert bytes(buf.data) == b"abcde" and buf.end == 3
    buf.acknowledge(seq_add(start, 2))
    assert bytes(buf.data) == b"cde" and buf.seq == 0 and buf.room == 2
    buf.acknowledge(seq_add(start, 1))  # an old ACK releases nothing
    assert buf.seq == 0
    buf.acknowledge(4)  # the FIN's ACK is one past the bytes
    assert not buf.data and buf.seq == 3 and buf.end == 3
    with pytest.raises(ValueError, match="capacity"):
        SendBuffer(0, capacity=0)
