"""The Split-C experiment's pieces: Table 3's Split-C row, the Table 2 speedup definition, the
machines of paper 000 Table 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio

from stacklib.bench.splitc.cluster import run_spmd
from stacklib.experiments import splitc as experiment
from stacklib.layers.splitc import SplitC
from stacklib.transports.sim.machines import CM5_NET, HOST_CPUS, MACHINES, MEIKO_NET


def test_table3_split_c_row() -> None:
    rtt, bandwidth = experiment.split_c_store(round_trips=5, blocks=40)
    assert rtt == pytest.approx(72.0, rel=0.2)
    assert bandwidth == pytest.approx(118.0, rel=0.2)


def test_the_speedup_definition_reproduces_table2_from_table1() -> None:
    for benchmark, (atm, fe) in experiment.TABLE2.items():
        growth = 1.0 if benchmark.startswith("mm") else 4.0
        for network, paper in (("atm", atm), ("fe", fe)):
            times = experiment.TABLE1[benchmark]
            speedup = growth * times[network, 2] / times[network, 8]
            assert speedup == pytest.approx(paper, abs=0.15), (benchmark, network)


@pytest.mark.parametrize(("name", "model"), [("cm5", CM5_NET), ("meiko", MEIKO_NET)])
def test_table2_machines_round_trip(name: str, model: object) -> None:
    async def program(sc: SplitC) -> float:
        await sc.all_alloc("x", 1, np.int64)
        await sc.barrier()
        if sc.rank:
            return 0.0
        await sc.read(sc.ptr(1, "x"))
        start = trio.current_time()
        for _ in range(10):
            await sc.read(sc.ptr(1, "x"))
        return (trio.current_time() - start) / 10 * 1e6

    rtt = run_spmd(program, 2, name).results[0]
    assert rtt == pytest.approx(model.round_trip_us, rel=0.05)  # type: ignore[attr-defined]


def test_fig5_claims_are_checks_that_can_fail() -> None:
    times = {
        (b, m): (1.0, 0.5) for b in experiment.FIG5_SIZES for m in ("cm5", "meiko", "unet-atm")
    }
    claims = dict(experiment._fig5_claims(times))
    assert not claims["mm: CM-5 slowest (CPU and bandwidth)"]  # all equal: not slowest
    assert claims["ssortsm: ATM and Meiko roughly equal"]


def test_machines_are_cited_data() -> None:
    for machine in MACHINES.values():
        assert machine.cite.startswith("paper")
        for host in machine.hosts:
            assert HOST_CPUS[host].cite
    assert MACHINES["cm5"].cpu(0).madd_us > MACHINES["meiko"].cpu(0).madd_us
    assert MACHINES["atm-003"].cpu(7).madd_us > MACHINES["atm-003"].cpu(0).madd_us  # SS-10


def test_draw_the_figures(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    machines = ("cm5", "meiko", "unet-atm")
    fig5 = {(b, m): (2.0, 1.0) for b in experiment.FIG5_SIZES for m in machines}
    table1 = {
        (b, network, n): (1.0, 0.5)
        for b in experiment.DEFAULT_TABLE1
        for network in ("atm", "fe")
        for n in (2, 4, 8)
    }
    from stacklib.reporting.plots.splitc import draw_splitc

    paths = draw_splitc(tmp_path, fig5, table1, experiment.TABLE1)
    assert [p.name for p in paths] == ["splitc_fig5.png", "splitc_fig7.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_the_fast_configuration_covers_the_same_programs() -> None:
    assert list(experiment.FIG5_FAST) == list(experiment.FIG5_SIZES)
    assert set(experiment.SCALED_TABLE1) == set(experiment.DEFAULT_TABLE1)
    for benchmark, sizes in experiment.FIG5_FAST.items():
        assert sizes <= experiment.FIG5_SIZES[benchmark]  # smaller or the same


def test_machine_ni_charges_every_message() -> None:
    # The memory transport's immediate one-copy path would skip Table 2's costs.
    async def program(sc: SplitC) -> float:
        await sc.all_alloc("x", 1, np.int64)
        await sc.barrier()
        start = trio.current_time()
        if sc.rank == 0:
            await sc.write(sc.ptr(1, "x"), 7)
        return trio.current_time() - start

    run = run_spmd(program, 2, "cm5")
    assert run.results[0] * 1e6 >= CM5_NET.round_trip_us
