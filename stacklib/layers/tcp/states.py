"""The TCP connection states and RFC 9293 Figure 5 as data: (state, trigger) -> state."""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = [
    "KEEPALIVE",
    "PEER_KNOWS",
    "RECEIVING",
    "SENDING",
    "SYNCHRONIZED",
    "TRANSITIONS",
    "TcpState",
    "Trigger",
]


class TcpState(enum.Enum):
    """The connection states of RFC 9293 §3.3.2."""

    CLOSED = "CLOSED"
    LISTEN = "LISTEN"
    SYN_SENT = "SYN-SENT"
    SYN_RECEIVED = "SYN-RECEIVED"
    ESTABLISHED = "ESTABLISHED"
    FIN_WAIT_1 = "FIN-WAIT-1"
    FIN_WAIT_2 = "FIN-WAIT-2"
    CLOSE_WAIT = "CLOSE-WAIT"
    CLOSING = "CLOSING"
    LAST_ACK = "LAST-ACK"
    TIME_WAIT = "TIME-WAIT"


class Trigger(enum.Enum):
    """What moves a connection between states (the arcs of RFC 9293 Figure 5)."""

    CONNECT = "active open"
    RCV_SYN = "SYN received"
    RCV_SYN_ACK = "SYN+ACK received"
    RCV_ACK_OF_SYN = "ACK of our SYN received"
    CLOSE = "application shut down writing"
    RCV_FIN = "FIN received"
    RCV_ACK_OF_FIN = "ACK of our FIN received"
    TIMEOUT = "2*MSL timeout"
    RESET = "RST received"
    ABORT = "aborted"


_S = TcpState
_T = Trigger
TRANSITIONS: Mapping[tuple[TcpState, Trigger], TcpState] = {
    (_S.CLOSED, _T.CONNECT): _S.SYN_SENT,
    (_S.LISTEN, _T.RCV_SYN): _S.SYN_RECEIVED,
    (_S.SYN_SENT, _T.RCV_SYN): _S.SYN_RECEIVED,  # simultaneous open
    (_S.SYN_SENT, _T.RCV_SYN_ACK): _S.ESTABLISHED,
    (_S.SYN_SENT, _T.CLOSE): _S.CLOSED,
    (_S.SYN_RECEIVED, _T.RCV_ACK_OF_SYN): _S.ESTABLISHED,
    (_S.ESTABLISHED, _T.CLOSE): _S.FIN_WAIT_1,
    (_S.ESTABLISHED, _T.RCV_FIN): _S.CLOSE_WAIT,
    (_S.FIN_WAIT_1, _T.RCV_ACK_OF_FIN): _S.FIN_WAIT_2,
    (_S.FIN_WAIT_1, _T.RCV_FIN): _S.CLOSING,  # simultaneous close
    (_S.FIN_WAIT_2, _T.RCV_FIN): _S.TIME_WAIT,
    (_S.CLOSE_WAIT, _T.CLOSE): _S.LAST_ACK,
    (_S.CLOSING, _T.RCV_ACK_OF_FIN): _S.TIME_WAIT,
    (_S.LAST_ACK, _T.RCV_ACK_OF_FIN): _S.CLOSED,
    (_S.TIME_WAIT, _T.TIMEOUT): _S.CLOSED,
    **{(s, _T.RESET): _S.CLOSED for s in _S if s not in (_S.CLOSED, _S.LISTEN)},
    **{(s, _T.ABORT): _S.CLOSED for s in _S if s is not _S.CLOSED},
}
"""(state, trigger) -> next state: RFC 9293 Figure 5 as data; anything else is illegal."""

# States in which our SYN has been acknowledged and both sequence spaces are known.
SYNCHRONIZED = frozenset(_S) - {_S.CLOSED, _S.LISTEN, _S.SYN_SENT, _S.SYN_RECEIVED}
RECEIVING = frozenset({_S.ESTABLISHED, _S.FIN_WAIT_1, _S.FIN_WAIT_2})  # peer may still send
SENDING = frozenset({_S.SYN_SENT, _S.SYN_RECEIVED, _S.ESTABLISHED, _S.CLOSE_WAIT})
KEEPALIVE = frozenset({_S.ESTABLISHED, _S.CLOSE_WAIT, _S.FIN_WAIT_2})
# States whose peer has a connection an RST can close (not after its FIN was acknowledged).
PEER_KNOWS = frozenset(
    {_S.SYN_RECEIVED, _S.ESTABLISHED, _S.FIN_WAIT_1, _S.FIN_WAIT_2, _S.CLOSE_WAIT}
)
