"""The UAM layer's parameters (``[[layers]] kind = "uam"`` in a recipe), checked when made.

They live apart from :mod:`stacklib.layers.uam.driver`, which ``stacklib compile`` compiles:
mypyc does not take attrs fields with validators in a compiled class.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from stacklib.layers.uam.wire import CHUNK_SIZE
from stacklib.sim.costs import cited

__all__ = ["UamParams"]


def _positive_number(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{attribute.name} must be a number >= 0, got {value!r}")


def _int_in(low: int, high: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{attribute.name} must be an integer in {low}..{high}, got {value!r}")

    return check


@attrs.frozen
class UamParams:
    """Parameters of the UAM layer (``[[layers]] kind = "uam"`` in a recipe)."""

    #: w, the fixed window of requests per peer (paper 000 §5.1.1 gives no value).
    window: int = attrs.field(default=8, validator=_int_in(1, 4000))
    #: Go-back-N retransmission timeout, microseconds (fixed: no backoff).
    rto_us: float = attrs.field(default=4000.0, validator=_positive_number)
    #: Timeouts without progress before the peer is reported unreachable, i.e. after
    #: ``rto_us * (max_retries + 1)``.
    max_retries: int = attrs.field(default=8, validator=_int_in(0, 1_000_000))
    #: Longest wait for a PDU to carry an acknowledgment before an explicit ACK goes.
    ack_delay_us: float = attrs.field(default=500.0, validator=_non_negative)
    #: Data bytes per bulk buffer (capped by what the service below carries).
    chunk_size: int = cited(
        CHUNK_SIZE,
        "paper 000 §5.2: UAM buffers hold 4160 bytes of data",
        "bytes",
        validator=_int_in(1, CHUNK_SIZE),
    )
    #: Host CPU per PDU sent or received, on NIs that model the host.
    proto_us: float = cited(
        1.0,
        "calibrated: UAM's single-cell round trip is 71 us on the SBA-200, 6 us over raw "
        "U-Net's 65 (paper 000 §5.2 item 1); the copies take the rest",
        "us",
        validator=_non_negative,
    )
    #: Host CPU per data-carrying bulk PDU (STORE, GET_REPLY) sent or received, on top of
    #: ``proto_us``: buffer management and completion bookkeeping of block transfers.
    bulk_us: float = cited(
        3.4,
        "calibrated: UAM block transfer round trip 135 us + 0.2 us/byte (paper 000 §5.2 item "
        "2); four bulk PDUs handled per round trip",
        "us",
        validator=_non_negative,
    )
    #: Run handlers from a background task (False: only when the application polls).
    background_poll: bool = True
    #: Microseconds a waiting task polls without yielding to other trio tasks on a real NI
    #: that spins (the lean path; None: the NI's own ``hot_spin``, 20 us on shm).  A
    #: conversation with work on both sides between messages (an SPMD program's collectives)
    #: wants longer: a wait that outlasts it continues with a pass of trio's loop per poll.
    hot_spin_us: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(_non_negative)
    )
