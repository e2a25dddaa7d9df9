"""The parts TCP's connection is made of, each on its own: the RFC 6298 estimator and the
out-of-order queue."""

from __future__ import annotations

import pytest

from stacklib.layers.tcp.reassembly import Reassembler
from stacklib.layers.tcp.rtt import RttEstimator
from stacklib.layers.tcp.seq import seq_add


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
