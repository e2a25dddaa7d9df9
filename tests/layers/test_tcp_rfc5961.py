"""RFC 5961 in the sans-IO core: blind in-window data with an old ACK is dropped and answered by
a challenge ACK (§5.2), and challenge ACKs are rate-limited (§7); the RST and SYN checks (§3,
§4) share the limit."""

from __future__ import annotations

import pytest

from stacklib.layers.tcp.machine import DropReason, TcpConfig, seq_add
from stacklib.layers.tcp.wire import TcpFlags, parse
from tests.layers.test_tcp_machine import Net, b_of, established, next_seq, segment_to


def _busy(config: TcpConfig | None = None) -> Net:
    """A connection on which a has sent 3000 bytes (all acknowledged) and b 500."""
    n = established(config, config)
    n.now = 1.0
    n.a.send(b"a" * 3000)
    b_of(n).send(b"b" * 500)
    n.run()
    assert bytes(n.received["a"]) == b"b" * 500
    n.received["a"].clear()
    return n


def _forge(n: Net, ack_below_una: int, payload: bytes = b"EVIL") -> bytes:
    """A segment to a at exactly its RCV.NXT (in window), acknowledging far below its SND.UNA."""
    return segment_to(
        n,
        "a",
        seq=next_seq(n, "b"),
        ack=seq_add(next_seq(n, "a"), -ack_below_una),
        flags=TcpFlags.ACK | TcpFlags.PSH,
        window=8192,
        payload=payload,
    )


@pytest.mark.parametrize("below", [1_000_000, (1 << 31) - 5, 8192 + 1])
def test_in_window_data_with_an_old_ack_is_dropped_and_challenged(below: int) -> None:
    n = _busy()
    rcv_nxt = next_seq(n, "b")
    n.a.receive_segment(_forge(n, below), n.now)
    assert n.a.read() == b"" and n.a.readable == 0
    (out,) = n.a.segments_to_send(n.now)
    challenge = parse(out)
    assert challenge.flags == TcpFlags.ACK and challenge.ack == rcv_nxt and not challenge.payload
    stats = n.a.statistics()
    assert stats.dropped.get(DropReason.OLD_ACK) == 1 and stats.challenge_acks == 1
    assert stats.bytes_received == 500
    # The genuine next segment still arrives, and the stream has no forged bytes in it.
    b_of(n).send(b"good")
    n.run()
    assert bytes(n.received["a"]) == b"good"


def test_an_old_ack_within_max_snd_wnd_is_acceptable() -> None:
    # SND.UNA - MAX.SND.WND <= SEG.ACK: a late but genuine segment (its data is taken).
    n = _busy()
    n.a.receive_segment(_forge(n, 8192, payload=b"late"), n.now)
    assert n.a.read() == b"late"
    assert DropReason.OLD_ACK not in n.a.statistics().dropped


def test_challenge_acks_are_rate_limited() -> None:
    n = _busy(TcpConfig(challenge_ack_limit=3, challenge_ack_interval=1.0))
    for _ in range(10):
        n.a.receive_segment(_forge(n, 1_000_000), n.now)
    # In-window RSTs and SYNs draw on the same budget (RFC 5961 §7).
    rst = segment_to(n, "a", seq=seq_add(next_seq(n, "b"), 1), flags=TcpFlags.RST)
    n.a.receive_segment(rst, n.now)
    assert len(n.a.segments_to_send(n.now)) == 3
    stats = n.a.statistics()
    assert stats.challenge_acks == 3 and stats.challenge_acks_suppressed == 8
    assert stats.dropped[DropReason.OLD_ACK] == 10 and stats.dropped[DropReason.CHALLENGED] == 1
    # A new interval, a new budget.
    later = n.now + 1.0
    n.a.receive_segment(_forge(n, 1_000_000), later)
    assert len(n.a.segments_to_send(later)) == 1
    assert n.a.read() == b""


def test_a_zero_limit_sends_no_challenge_acks() -> None:
    n = _busy(TcpConfig(challenge_ack_limit=0))
    n.a.receive_segment(_forge(n, 1_000_000), n.now)
    assert n.a.segments_to_send(n.now) == [] and n.a.read() == b""
    assert n.a.statistics().challenge_acks_suppressed == 1
