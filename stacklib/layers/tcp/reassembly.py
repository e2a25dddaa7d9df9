"""The receive side's out-of-order queue: segments beyond RCV.NXT kept until the gap fills."""

from __future__ import annotations

from stacklib.layers.tcp.seq import seq_add, seq_diff, seq_leq

__all__ = ["Reassembler"]


class Reassembler:
    """Out-of-order data within the window, by sequence number, and where an out-of-order FIN
    sits.  ``segments`` is the live dict (the connection tests its truth per segment, which
    costs nothing for a dict and a Python call for an object)."""

    __slots__ = ("fin", "segments")

    def __init__(self) -> None:
        self.segments: dict[int, bytes] = {}
        self.fin: int | None = None  #: sequence number of a FIN that arrived out of order

    def add(self, seq: int, payload: bytes, fin: bool) -> None:
        """Keep ``payload`` starting at ``seq`` (a longer copy of a start wins), and the FIN
        after it if ``fin``."""
        if payload and len(payload) > len(self.segments.get(seq, b"")):
            self.segments[seq] = payload
        if fin:
            self.fin = seq_add(seq, len(payload))

    def take(self, rcv_nxt: int) -> list[bytes]:
        """The pieces that now continue the stream at ``rcv_nxt``, in order, with what precedes
        ``rcv_nxt`` cut off; what they cover is removed, and so is anything wholly old."""
        out: list[bytes] = []
        segments = self.segments
        progressed = True
        while progressed and segments:
            progressed = False
            for start in list(segments):
                data = segments[start]
                if seq_leq(seq_add(start, len(data)), rcv_nxt):
                    del segments[start]
                elif seq_leq(start, rcv_nxt):
                    del segments[start]
                    piece = data[seq_diff(rcv_nxt, start) :]
                    out.append(piece)
                    rcv_nxt = seq_add(rcv_nxt, len(piece))
                    progressed = True
        return out

    def fin_at(self, rcv_nxt: int) -> bool:
        """The out-of-order FIN comes right at ``rcv_nxt``."""
        return self.fin is not None and self.fin == rcv_nxt

    def clear(self) -> None:
        self.segments.clear()
        self.fin = None
