"""The retransmission timeout estimator of RFC 6298, on its own: samples in, RTO out."""

from __future__ import annotations

__all__ = ["RttEstimator"]


class RttEstimator:
    """SRTT, RTTVAR and RTO per RFC 6298 §2, with clock granularity ``granularity`` and the
    RTO clamped to [``rto_min``, ``rto_max``].  Karn's algorithm (which samples to take) is the
    caller's: it knows what was resent.  ``rto`` is a plain attribute, read per segment."""

    __slots__ = ("granularity", "rto", "rto_max", "rto_min", "rttvar", "srtt")

    def __init__(
        self, *, initial: float, rto_min: float, rto_max: float, granularity: float
    ) -> None:
        if not 0 < rto_min <= rto_max:
            raise ValueError(f"need 0 < rto_min <= rto_max, got {rto_min} and {rto_max}")
        self.granularity = granularity
        self.rto_min = rto_min
        self.rto_max = rto_max
        self.srtt: float | None = None  #: smoothed RTT (None before the first sample)
        self.rttvar: float | None = None
        self.rto = initial  #: the current retransmission timeout (RFC 6298 §2.1: initial)

    def sample(self, r: float) -> None:
        """Take one round-trip measurement ``r`` seconds (negative counts as 0): §2.2-2.4."""
        r = max(r, 0.0)
        if self.srtt is None or self.rttvar is None:
            self.srtt = r
            self.rttvar = r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r
        rto = self.srtt + max(self.granularity, 4 * self.rttvar)
        self.rto = min(max(rto, self.rto_min), self.rto_max)

    def back_off(self) -> None:
        """The timer expired: double the RTO, up to ``rto_max`` (§5.5)."""
        self.rto = min(self.rto * 2, self.rto_max)
