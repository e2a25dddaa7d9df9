"""TCP under loss, in the sans-IO core: a retransmission never runs past what was sent, R1/R2
(RFC 9293 §3.8.3) are parameters, and an aborting side resets its peer."""

from __future__ import annotations

import pytest

from stacklib.layers.tcp.driver import TcpParams
from stacklib.layers.tcp.machine import (
    ConnectionAborted,
    ConnectionReset,
    DeliveryProblem,
    DropReason,
    TcpConfig,
    TcpState,
)
from stacklib.layers.tcp.wire import TcpFlags
from tests.layers.test_tcp_machine import b_of, data_from, drop_if, established, state

MSS = 1400


def test_a_retransmission_ends_where_the_first_transmission_ended() -> None:
    # A short segment (1,192 bytes: Nagle lets it go with nothing in flight) is lost while more
    # bytes wait behind it (Nagle holds them: data is in flight).  The timeout resends the
    # head; if it carried a full MSS, the peer would acknowledge bytes past SND.MAX and every
    # such ACK would be dropped as BAD_ACK until the connection aborted.
    cfg = TcpConfig(mss=MSS)
    n = established(cfg, cfg, fault=drop_if(lambda side, seg: side == "a" and bool(seg.payload)))
    n.now = 1.0
    first, rest = b"f" * 1192, b"r" * 1000
    assert n.a.send(first) == len(first)
    n.pump()
    assert n.a.send(rest) == len(rest)
    n.run()
    assert bytes(n.received["b"]) == first + rest
    assert DropReason.BAD_ACK not in n.a.statistics().dropped
    assert state(n.a) is TcpState.ESTABLISHED
    sizes = [len(seg.payload) for _, seg in data_from(n, "a")]
    assert sizes[:2] == [1192, 1192]  # the first transmission, then its retransmission


def test_a_retransmission_after_the_fin_resends_the_fin() -> None:
    cfg = TcpConfig(mss=MSS)
    n = established(cfg, cfg, fault=drop_if(lambda side, seg: side == "a" and bool(seg.payload)))
    n.now = 1.0
    n.a.send(b"x" * 100)
    n.a.shutdown_write(n.now)
    n.run(until=2.0)
    segments = [seg for _, seg in data_from(n, "a")]
    assert len(segments) == 2 and all(seg.flags & TcpFlags.FIN for seg in segments)
    assert bytes(n.received["b"]) == b"x" * 100
    assert state(b_of(n)) is TcpState.CLOSE_WAIT


def _black_hole(cfg: TcpConfig) -> tuple[object, list[tuple[float, object]]]:
    """``a`` sends 100 bytes into a link that loses all of a's segments but its RSTs."""
    n = established(cfg)
    n.fault = lambda i, side, data: (
        [(0.0, data)] if side == "b" or data[13] & int(TcpFlags.RST) else []
    )
    n.now = 1.0
    n.a.send(b"x" * 100)
    n.run()
    return n, n.events["a"]


def test_r1_reports_a_delivery_problem_once_and_r2_aborts_and_resets_the_peer() -> None:
    n, events = _black_hole(TcpConfig(r1=2, max_retransmissions=4, r2_time=0.0))
    kinds = [type(e) for _, e in events]
    assert kinds.count(DeliveryProblem) == 1
    assert kinds[-1] is ConnectionAborted
    problem = next(e for _, e in events if isinstance(e, DeliveryProblem))
    assert problem.retransmissions == 2
    assert state(n.a) is TcpState.CLOSED  # type: ignore[attr-defined]
    # The RST reached b, whose connection is closed too (the peer learns, RFC 9293 §3.10.5).
    b = b_of(n)  # type: ignore[arg-type]
    assert state(b) is TcpState.CLOSED
    assert ConnectionReset() in [e for _, e in n.events["b"]]  # type: ignore[attr-defined]


def test_r2_is_a_count_and_a_time() -> None:
    # 0.2 s RTO doubling: timeouts at 1.2, 1.6, 2.4, 4.0, 7.2; three retransmissions are done
    # by 2.4 s, but R2 also waits until 5 s have passed since the first (at 1.2 s): the
    # timeout at 4.0 s sends a fourth, the one at 7.2 s gives up.
    _, events = _black_hole(TcpConfig(max_retransmissions=3, r2_time=5.0))
    when, last = events[-1]
    assert isinstance(last, ConnectionAborted)
    assert when == pytest.approx(7.2)
    _, events = _black_hole(TcpConfig(max_retransmissions=3, r2_time=0.0))
    assert events[-1][0] == pytest.approx(4.0)


@pytest.mark.parametrize(
    "fields",
    [{"r1": 0}, {"r2_time": -1.0}, {"r2_syn_time": float("nan")}, {"challenge_ack_limit": -1}],
)
def test_bad_retransmission_parameters_are_refused(fields: dict[str, float]) -> None:
    name = next(iter(fields))
    with pytest.raises(ValueError, match=name):
        TcpConfig(**fields)  # type: ignore[arg-type]


def test_defaults_follow_rfc_9293() -> None:
    cfg = TcpConfig()
    assert cfg.r1 == 3 and cfg.r1 < cfg.max_retransmissions
    assert cfg.r2_time >= 100 and cfg.r2_syn_time >= 180


def test_the_layer_passes_r2_to_its_connections() -> None:
    cfg = TcpParams(max_retransmissions=4, r2_time=0.5, r2_syn_time=7.0).config()
    assert (cfg.max_retransmissions, cfg.r2_time, cfg.r2_syn_time) == (4, 0.5, 7.0)
    with pytest.raises(ValueError, match="r2_time"):
        TcpParams(r2_time=-1.0)
