"""TCP sequence-number arithmetic (RFC 9293 §3.4: all arithmetic is modulo 2**32) and the
control bits as plain ints for the per-segment paths."""

from __future__ import annotations

from stacklib.layers.tcp.wire import TcpFlags

__all__ = [
    "ACK",
    "FIN",
    "PSH",
    "RST",
    "SEQ_HALF",
    "SEQ_MASK",
    "SEQ_MOD",
    "SYN",
    "seq_add",
    "seq_diff",
    "seq_geq",
    "seq_gt",
    "seq_leq",
    "seq_lt",
]

SEQ_MOD = 1 << 32
SEQ_MASK = SEQ_MOD - 1
SEQ_HALF = 1 << 31


def seq_add(a: int, n: int) -> int:
    """``a + n`` modulo 2**32."""
    return (a + n) & SEQ_MASK


def seq_diff(a: int, b: int) -> int:
    """``a - b`` as a signed distance in -2**31 .. 2**31 - 1 (the nearer way round).

    The connection's per-segment paths (output engine, window and ACK bookkeeping) write this
    expression out in place, ``((a - b + _HALF) & _MASK) - _HALF``: a Python call costs more
    than the arithmetic, and they run it dozens of times per segment.
    """
    return ((a - b + SEQ_HALF) & SEQ_MASK) - SEQ_HALF


def seq_lt(a: int, b: int) -> bool:
    """``a`` comes before ``b`` in sequence space."""
    return seq_diff(a, b) < 0


def seq_leq(a: int, b: int) -> bool:
    """``a`` is ``b`` or comes before it."""
    return seq_diff(a, b) <= 0


def seq_gt(a: int, b: int) -> bool:
    """``a`` comes after ``b``."""
    return seq_diff(a, b) > 0


def seq_geq(a: int, b: int) -> bool:
    """``a`` is ``b`` or comes after it."""
    return seq_diff(a, b) >= 0


# The control bits as plain ints for the per-segment paths: ``&`` and ``|`` on TcpFlags (an
# IntFlag) run enum's Python code, several times per segment; on ints they are one C operation.
FIN = int(TcpFlags.FIN)
SYN = int(TcpFlags.SYN)
RST = int(TcpFlags.RST)
PSH = int(TcpFlags.PSH)
ACK = int(TcpFlags.ACK)
