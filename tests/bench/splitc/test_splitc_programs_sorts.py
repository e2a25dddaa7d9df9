"""The small-message sorts (a blocking write per pair of keys in the radix sort, one-way stores
in input order in the sample sort) and the re-runnable calibration of the machines' CPU costs."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import trio

from stacklib.bench.splitc.cluster import run_spmd
from stacklib.bench.splitc.programs import (
    calibrate,
    extrapolate,
    make_program,
    radix_sort,
    sample_sort,
)
from stacklib.layers.splitc import SplitC
from stacklib.transports.sim.machines import HOST_CPUS, MACHINES

ATM = MACHINES["atm-003"]


def _remote(stats: list[dict[str, object]], kind: str) -> int:
    return sum(int(s[kind]) - int(s["local"]) for s in stats)  # type: ignore[call-overload]


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("keys", [200, 201])
def test_small_message_radix_sort_is_correct_on_memory(blocking: bool, keys: int) -> None:
    run = run_spmd(radix_sort(keys, bulk=False, blocking=blocking), 3, "memory")
    assert all(r.ok for r in run.results), run.results


@pytest.mark.parametrize("blocking", [True, False])
def test_small_message_radix_sort_is_correct_on_a_simulated_cluster(blocking: bool) -> None:
    run = run_spmd(radix_sort(301, bulk=False, blocking=blocking, machine=ATM), 4, "atm-003")
    assert all(r.ok for r in run.results), run.results


def _write_round_trip_us() -> float:
    async def program(sc: SplitC) -> float:
        await sc.all_alloc("x", 1, np.uint64)
        await sc.barrier()
        if sc.rank:
            return 0.0
        await sc.write(sc.ptr(1, "x"), 1)
        start = trio.current_time()
        for _ in range(20):
            await sc.write(sc.ptr(1, "x"), 1)
        return (trio.current_time() - start) / 20 * 1e6

    return float(run_spmd(program, 2, "atm-003").results[0])


def test_the_blocking_radix_sort_takes_a_round_trip_per_message() -> None:
    keys = 512
    runs = {
        blocking: run_spmd(
            radix_sort(keys, bulk=False, blocking=blocking, machine=ATM), 2, "atm-003"
        )
        for blocking in (True, False)
    }
    writes = _remote(runs[True].statistics, "puts")
    stores = _remote(runs[False].statistics, "stores")
    # The same pairs either way: four passes, about half the keys to the other rank.
    assert writes == stores
    assert 2 * 4 * keys / 2 / 2 <= writes <= 2 * 4 * keys / 2
    assert all(s["stores"] == 0 for s in runs[True].statistics)
    # One request and one reply per write: each rank's communication is its writes' round
    # trips, one after another (both ranks write at once, as in the sort).
    rtt = _write_round_trip_us() * 1e-6
    for r, stats in zip(runs[True].results, runs[True].statistics, strict=True):
        mine = int(stats["puts"]) - int(stats["local"])
        assert r.comm == pytest.approx(mine * rtt, rel=0.15)
    # One-way stores do not wait: far less time per message.
    store = max(r.comm for r in runs[False].results)
    assert store < 0.5 * max(r.comm for r in runs[True].results)


def test_the_small_message_sample_sort_sends_in_input_order() -> None:
    # Without a presort the keys for the peers interleave: more stores than peers' runs, and
    # no key operations for a presort (one linear pass of n keys plus the samples).
    keys = 400
    small = run_spmd(sample_sort(keys, bulk=False, machine=ATM), 2, "atm-003").results
    bulk = run_spmd(sample_sort(keys, bulk=True, machine=ATM), 2, "atm-003").results
    assert all(r.ok for r in small + bulk)
    for s, b in zip(small, bulk, strict=True):
        assert s.ops["key"] == 64 + keys
        assert b.ops["key"] == 64 + 2 * keys


def test_a_machine_can_carry_trial_costs() -> None:
    doubled = HOST_CPUS["ss20"].scaled(2.0, "trial")
    machine = attrs.evolve(ATM, costs={"ss20": doubled})
    assert machine.cpu(0) == doubled
    assert machine.cpu(7) == HOST_CPUS["ss10"]  # other hosts keep theirs
    program = make_program("rsortlg", small=True, machine=machine)
    base = make_program("rsortlg", small=True, machine=ATM)
    trial = run_spmd(program, 2, "atm-003").results[0]
    plain = run_spmd(base, 2, "atm-003").results[0]
    assert trial.compute == pytest.approx(2 * plain.compute)
    assert trial.ops == plain.ops


def test_calibration_recovers_the_costs_that_made_the_targets() -> None:
    # Targets simulated with the SS-20's costs; starting 30% off, the calibration must find
    # them again (the small sizes keep the run fast; the method is the same at full size).
    sizes = {"mm128": (2, 32), "mm16": (4, 8), "rsortlg": (4000,), "ssortlg": (4000,)}
    targets = {
        b: max(r.total for r in run_spmd(make_program(b, s, machine=ATM), 2, "atm-003").results)
        for b, s in sizes.items()
    }
    lines: list[str] = []
    found = calibrate(
        "atm",
        targets=targets,
        sizes=sizes,
        start=HOST_CPUS["ss20"].scaled(1.3, "a guess"),
        progress=lines.append,
    )
    expected = HOST_CPUS["ss20"]
    for op in ("madd_us", "madd_small_us", "key_us", "compare_us"):
        assert getattr(found, op) == pytest.approx(getattr(expected, op), rel=0.02), op
    assert found.edge_us == found.key_us
    assert found.cite.startswith("calibrated: atm 2 nodes")
    assert lines and all("target" in line for line in lines)


def test_calibration_refuses_an_unknown_network() -> None:
    with pytest.raises(ValueError, match="network"):
        calibrate("myrinet")


def test_extrapolation_follows_the_line_of_the_runs() -> None:
    fit = extrapolate("rsortsm", "atm-003", 2, sizes=(64, 128, 256), keys=1024)
    assert [r[0] for r in fit.runs] == [64, 128, 256]
    totals = [r[1] for r in fit.runs]
    assert totals[0] < totals[1] < totals[2] < fit.total
    # A round trip per message: the time is linear in the keys.
    assert fit.residual < 0.05
    slope = (totals[2] - totals[0]) / (256 - 64)
    assert fit.total == pytest.approx(totals[2] + slope * (1024 - 256), rel=0.05)
    with pytest.raises(ValueError, match="two sizes"):
        extrapolate("rsortsm", "atm-003", 2, sizes=(64,))
