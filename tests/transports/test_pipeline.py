"""The pipelined-stage recurrence of stacklib.sim.pipeline, checked by hand and by property.

The recurrence (module docstring of stacklib/sim/pipeline.py)::

    start      = max(busy_until, first_in)          # last_in for store-and-forward
    first_out  = start + head + per_unit
    last_out   = max(start + head + units * per_unit, last_in + per_unit)   # cut-through
    busy_until = last_out + tail

Hand-worked cases use multiples of 0.25 so that every sum is exact in binary floating point and
the assertions can be equalities.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.sim import Resource, Simulation
from stacklib.sim.pipeline import delay, stage


def _resource(name: str = "r") -> Resource:
    return Simulation().resource(name)


# ----------------------------------------------------------------------------- by hand


def test_single_unit_is_head_plus_one_unit() -> None:
    r = _resource()
    first, last = stage(r, 1.0, 1.0, 1, 0.5, head=0.25)
    assert (first, last) == (1.75, 1.75)
    assert r.busy_until == 1.75
    assert r.busy_time == 0.75
    assert r.holds == 1


def test_single_unit_without_head_or_tail() -> None:
    r = _resource()
    assert stage(r, 2.0, 2.0, 1, 0.5) == (2.5, 2.5)
    assert r.busy_until == 2.5


def test_slower_stage_is_its_own_bottleneck() -> None:
    # Upstream delivers 5 units at 1.0 s each: the first at 1.0, the last at 5.0.  This stage
    # needs 2.0 s per unit, so it, not the upstream, decides when the last unit leaves.
    r = _resource()
    first, last = stage(r, 1.0, 5.0, 5, 2.0, head=0.5)
    assert first == 1.0 + 0.5 + 2.0
    assert last == 1.0 + 0.5 + 5 * 2.0  # start + head + n*u  (> last_in + u = 7.0)
    assert r.busy_until == last


def test_faster_stage_waits_for_the_last_unit_from_upstream() -> None:
    # Same upstream; this stage needs only 0.25 s per unit, so it cannot emit the last unit
    # before it has received it: last_out = last_in + per_unit.
    r = _resource()
    first, last = stage(r, 1.0, 5.0, 5, 0.25)
    assert first == 1.25
    assert last > 1.0 + 5 * 0.25  # the start + n*u bound alone would be too early
    assert last == 5.0 + 0.25
    assert r.busy_until == 5.25
    # busy_time counts the work done (n * u), not the time spent waiting for upstream units.
    assert r.busy_time == 5 * 0.25


def test_cut_through_last_out_is_the_max_of_both_bounds() -> None:
    for per_unit in (0.25, 0.5, 1.0, 1.5, 3.0):
        r = _resource()
        first_in, last_in, units, head = 2.0, 6.0, 5, 0.75
        _, last = stage(r, first_in, last_in, units, per_unit, head=head)
        assert last == max(first_in + head + units * per_unit, last_in + per_unit)


def test_store_and_forward_starts_at_the_last_unit() -> None:
    r = _resource()
    first, last = stage(r, 1.0, 5.0, 4, 0.5, head=0.25, store_and_forward=True)
    assert first == 5.0 + 0.25 + 0.5
    assert last == 5.0 + 0.25 + 4 * 0.5
    # Cut-through would have started at first_in and finished earlier.
    ct = _resource()
    assert stage(ct, 1.0, 5.0, 4, 0.5, head=0.25)[1] < last


def test_busy_resource_queues_fifo() -> None:
    r = _resource()
    # Message A holds the resource from 0 to 4.
    assert stage(r, 0.0, 0.0, 4, 1.0) == (1.0, 4.0)
    # Message B is ready at 1.0 but must wait for A.
    assert stage(r, 1.0, 1.0, 2, 1.0) == (5.0, 6.0)
    assert r.busy_until == 6.0
    # Message C arrives after the resource is free: no waiting.
    assert stage(r, 10.0, 10.0, 1, 1.0) == (11.0, 11.0)
    assert r.holds == 3
    assert r.busy_time == 4.0 + 2.0 + 1.0


def test_queueing_order_is_reservation_order_not_arrival_order() -> None:
    # Stages queue FIFO in the order they are reserved (pipeline.py docstring): a message
    # reserved later waits even if its units were ready earlier.
    r = _resource()
    assert stage(r, 5.0, 5.0, 1, 1.0) == (6.0, 6.0)
    assert stage(r, 0.0, 0.0, 1, 1.0) == (7.0, 7.0)


def test_tail_extends_the_hold_but_not_the_output() -> None:
    r = _resource()
    first, last = stage(r, 0.0, 0.0, 2, 1.0, head=0.5, tail=0.75)
    assert (first, last) == (1.5, 2.5)
    assert r.busy_until == 2.5 + 0.75
    assert r.busy_time == 0.5 + 2 * 1.0 + 0.75
    # The next message waits through the tail (an inter-frame gap, a post-processing step).
    assert stage(r, 0.0, 0.0, 1, 1.0) == (4.25, 4.25)


def test_delay_shifts_both_ends_and_holds_nothing() -> None:
    assert delay(1.0, 3.0, 0.5) == (1.5, 3.5)
    assert delay(2.0, 2.0, 0.0) == (2.0, 2.0)


# ----------------------------------------------------------------------------- by property

# Times and durations are multiples of 0.25 so the comparisons below are exact.
_quarter = st.integers(min_value=0, max_value=400).map(lambda q: q * 0.25)
_message = st.tuples(
    _quarter,  # first_in
    _quarter,  # last_in - first_in
    st.integers(min_value=1, max_value=64),  # units
    st.integers(min_value=0, max_value=16).map(lambda q: q * 0.25),  # per_unit
    st.integers(min_value=0, max_value=16).map(lambda q: q * 0.25),  # head
    st.integers(min_value=0, max_value=16).map(lambda q: q * 0.25),  # tail
    st.booleans(),  # store_and_forward
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_message, min_size=1, max_size=12))
def test_stage_never_emits_before_it_receives(
    messages: list[tuple[float, float, int, float, float, float, bool]],
) -> None:
    r = _resource()
    for first_in, spread, units, per_unit, head, tail, saf in messages:
        last_in = first_in + spread
        before = r.busy_until
        first, last = stage(r, first_in, last_in, units, per_unit, head, tail, saf)
        # Outputs never precede inputs, nor the end of earlier reservations (FIFO).
        assert first >= first_in + head + per_unit
        assert first >= before + head + per_unit
        assert last >= last_in
        assert last >= first
        if saf:
            assert first >= last_in + head + per_unit
        elif per_unit > 0:
            assert last >= last_in + per_unit
        # Units leave at most one per per_unit.
        assert last - first >= (units - 1) * per_unit
        # The resource's reservation horizon only grows and covers the message and its tail.
        assert r.busy_until >= before
        assert r.busy_until == last + tail
    assert r.holds == len(messages)
