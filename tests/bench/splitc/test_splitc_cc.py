"""Connected components: its sweeps are the computation charged (the edges examined on a
simulated machine, their time on a real transport), its simulated times are those recorded
before that change, and its split-phase gets keep at most UAM's window unanswered per peer."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable

import pytest

from stacklib.bench.splitc import programs
from stacklib.bench.splitc.cluster import run_spmd
from stacklib.bench.splitc.programs import (
    CC_GET_WINDOW,
    RankResult,
    Work,
    connected_components,
    make_program,
)
from stacklib.layers.splitc import GlobalPtr, Pending, SplitC
from stacklib.layers.uam import UamParams
from stacklib.transports.sim.machines import MACHINES

Program = Callable[[SplitC], Awaitable[RankResult]]


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_work_takes_the_count_from_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(Work, "clock", staticmethod(clock))

    def compute() -> list[int]:
        clock.now += 2.5  # the computation takes 2.5 s of the (fake) clock
        return [1, 2, 3]

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, None)
        start = await work.begin()
        result = await work("edge", len, compute)
        assert result == [1, 2, 3]
        await work("key", 10, lambda: None)  # a plain count, as the other programs pass
        return await work.end(start, True)

    run = run_spmd(program, 2, "memory")
    for r in run.results:
        assert r.ops == {"edge": 3.0, "key": 10.0}
        assert r.compute == 2.5


def test_work_acknowledges_before_computations_longer_than_ack_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Real transports: a rank answers nobody while it computes, so Work sends the owed
    # acknowledgments first, unless the same operation last took less than UAM's ack_delay
    # (0.5 ms): then the delayed acknowledgment goes out in time anyway.
    clock = FakeClock()
    monkeypatch.setattr(Work, "clock", staticmethod(clock))
    calls: list[str] = []
    monkeypatch.setattr(SplitC, "acknowledge", lambda self: calls.append(f"{self.rank}") or 0)

    def taking(seconds: float) -> Callable[[], None]:
        def fn() -> None:
            clock.now += seconds

        return fn

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, None)
        start = await work.begin()
        if sc.rank == 0:
            calls.append("long")
            await work("edge", 1, taking(2.0))  # no history: acknowledges
            await work("edge", 1, taking(2.0))  # the last one was long: acknowledges
            calls.append("short")
            await work("madd", 1, taking(1e-5))  # no history: acknowledges
            await work("madd", 1, taking(1e-5))  # the last one took 10 us: does not
            await work("madd", 1, taking(1e-5))
            calls.append("end")
        return await work.end(start, True)

    run_spmd(program, 2, "memory")
    assert calls == ["long", "0", "0", "short", "0", "end"]


def test_work_does_not_acknowledge_on_a_simulated_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulated hosts serve their peers while they compute (SplitC.compute): nothing to do.
    calls: list[int] = []
    monkeypatch.setattr(SplitC, "acknowledge", lambda self: calls.append(self.rank) or 0)

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, None)
        start = await work.begin()
        await work("edge", 1, lambda: None)
        return await work.end(start, True)

    run = run_spmd(program, 2, "sim-atm")
    assert all(r.ok for r in run.results) and calls == []


def test_cc_computation_is_the_time_of_its_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each sweep to a fixed point moves the clock by one second.  Work times its function
    # alone (the function does not yield), so the ranks' computation adds up to the sweeps
    # run inside Work: all but the verification's one per rank.  Outside Work it would be 0.
    clock = FakeClock()
    monkeypatch.setattr(Work, "clock", staticmethod(clock))
    sweep = programs._propagate
    calls = 0

    def timed(labels: object, right: object, down: object) -> tuple[object, int]:
        nonlocal calls
        calls += 1
        clock.now += 1.0
        return sweep(labels, right, down)

    monkeypatch.setattr(programs, "_propagate", timed)
    n = 3
    run = run_spmd(connected_components(6, 24), n, "memory")
    assert all(r.ok for r in run.results)
    assert all(r.compute >= 1.0 for r in run.results)  # the first sweep, at least
    assert sum(r.compute for r in run.results) == calls - n


def test_cc_computation_is_measured_on_the_memory_transport() -> None:
    run = run_spmd(make_program("cc", (8, 32)), 2, "memory")
    assert all(r.ok for r in run.results)
    assert all(r.compute > 0 for r in run.results)


# Recorded before the sweeps moved into Work and the gets got their bound: (total of every
# rank, computation of each rank, edges of each rank), in virtual seconds.  The totals again
# when collectives of at most 12 bytes (the barriers, the reductions of one number) moved from
# a store into one request's words: 3-9% less (computation and edges the same).
RECORDED = {
    ("atm-003", 2, None): (
        0.0008581054716981153,
        (5.3115e-05, 0.00010623),
        (75.0, 150.0),
    ),
    ("atm-003", 4, (8, 32)): (
        0.00557439590026958,
        (0.000403674, 0.0007846856, 0.001023349, 0.0007988496),
        (570.0, 1108.0, 1445.0, 1128.0),
    ),
    ("fe-003", 4, (8, 32)): (
        0.007942354200000055,
        (0.000446538, 0.0008680072, 0.0011320129999999999, 0.0008836752),
        (570.0, 1108.0, 1445.0, 1128.0),
    ),
}


@pytest.mark.parametrize(("machine", "n", "size"), list(RECORDED))
def test_simulated_cc_gives_the_recorded_numbers(
    machine: str, n: int, size: tuple[int, int] | None
) -> None:
    total, compute, edges = RECORDED[machine, n, size]
    program = make_program("cc", size, machine=MACHINES[machine], small=size is None)
    run = run_spmd(program, n, machine)
    assert all(r.ok for r in run.results)
    assert [r.total for r in run.results] == pytest.approx([total] * n, rel=1e-12, abs=0)
    assert [r.compute for r in run.results] == pytest.approx(compute, rel=1e-12, abs=0)
    assert [r.ops["edge"] for r in run.results] == list(edges)


def _most_unanswered(program: Program, n: int, transport: str) -> tuple[list[bool], int]:
    """Run ``program`` and return whether each rank verified, and the most gets one rank
    had issued to another and not yet seen answered, over the run."""
    most = 0

    def spy(inner: Program) -> Program:
        async def wrapped(sc: SplitC) -> RankResult:
            get = sc.get
            issued: defaultdict[int, list[Pending]] = defaultdict(list)

            async def counting_get(gp: GlobalPtr) -> Pending:
                nonlocal most
                pending = await get(gp)
                issued[gp.rank].append(pending)
                most = max(most, sum(not p.done for p in issued[gp.rank]))
                return pending

            sc.get = counting_get  # type: ignore[method-assign]
            return await inner(sc)

        return wrapped

    run = run_spmd(spy(program), n, transport)
    return [r.ok for r in run.results], most


def test_cc_keeps_its_gets_within_the_bound() -> None:
    machine = MACHINES["atm-003"]
    # Unbounded, UAM's window is what limits the gets on the simulated NI ...
    ok, most = _most_unanswered(
        connected_components(8, 64, get_window=10**6, machine=machine), 3, "atm-003"
    )
    assert all(ok)
    assert most == UamParams().window == CC_GET_WINDOW
    # ... and a tighter bound is kept, with the same components.
    ok, most = _most_unanswered(
        connected_components(8, 64, get_window=2, machine=machine), 3, "atm-003"
    )
    assert all(ok)
    assert most == 2


def test_cc_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="get_window must be at least 1"):
        connected_components(4, 8, get_window=0)
