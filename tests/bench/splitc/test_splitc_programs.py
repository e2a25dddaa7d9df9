"""The Split-C benchmark programs: correct at small sizes on the memory transport, simulated
clusters and machines, and as real processes over shm; simulated times are deterministic and
split into computation and communication."""

from __future__ import annotations

import pytest

from stacklib.bench.splitc.cluster import run_spmd
from stacklib.bench.splitc.programs import SMALL_SIZES, RankResult, make_program, matmul
from stacklib.cli import main as cli_main
from stacklib.layers.splitc import SplitC
from stacklib.transports.sim.machines import MACHINES

BENCHMARKS = list(SMALL_SIZES)


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_correct_on_memory(benchmark: str) -> None:
    run = run_spmd(make_program(benchmark, small=True), 3, "memory")
    assert all(r.ok for r in run.results), run.results


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_correct_on_a_simulated_cluster(benchmark: str) -> None:
    machine = MACHINES["atm-003"]
    run = run_spmd(make_program(benchmark, small=True, machine=machine), 4, "atm-003")
    assert all(r.ok for r in run.results), run.results
    for r in run.results:
        assert 0 < r.compute <= r.total
        assert r.comm == pytest.approx(r.total - r.compute)


@pytest.mark.parametrize("machine", ["fe-003", "cm5", "meiko"])
def test_other_machines(machine: str) -> None:
    for benchmark in ("mm128", "ssortsm", "rsortlg"):
        program = make_program(benchmark, small=True, machine=MACHINES[machine])
        run = run_spmd(program, 2, machine)
        assert all(r.ok for r in run.results)


def test_a_wrong_result_is_reported() -> None:
    # Ranks that disagree on the matrices (seeds differ by rank) cannot verify the product.
    async def skewed(sc: SplitC) -> RankResult:
        return await matmul(2, 4, seed=1 + sc.rank)(sc)

    run = run_spmd(skewed, 2, "memory")
    assert not all(r.ok for r in run.results)


def test_simulated_times_are_deterministic() -> None:
    machine = MACHINES["atm-003"]
    times = [
        [
            r.total
            for r in run_spmd(
                make_program("rsortsm", small=True, machine=machine), 3, "atm-003", seed=2
            ).results
        ]
        for _ in range(2)
    ]
    assert times[0] == times[1]


def test_computation_follows_the_machine() -> None:
    # The same matrix multiply computes longer on the CM-5's slower CPU than on the Meiko's.
    compute = {}
    for name in ("cm5", "meiko"):
        program = make_program("mm128", small=True, machine=MACHINES[name])
        compute[name] = max(r.compute for r in run_spmd(program, 2, name).results)
    assert compute["cm5"] / compute["meiko"] == pytest.approx(40 / 33, rel=1e-6)


@pytest.mark.slow
def test_the_cli_over_shm_processes(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(["splitc", "run", "ssortsm", "-n", "2", "--transport", "shm", "--small"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "ssortsm on 2 ranks over shm: verified" in out


def test_the_cli_in_virtual_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["splitc", "run", "rsortlg", "-n", "2", "--transport", "cm5", "--small"]) == 0
    assert "verified" in capsys.readouterr().out
    assert cli_main(["splitc", "list"]) == 0
    assert "meiko" in capsys.readouterr().out


@pytest.mark.parametrize(("block", "op"), [(16, "madd_small_us"), (32, "madd_us")])
def test_block_multiply_cost_depends_on_the_block_size(block: int, op: str) -> None:
    # 2x2 blocks on 2 ranks: each rank multiplies 2 C blocks x 2 steps of block^3 multiply-adds.
    machine = MACHINES["atm-003"]
    run = run_spmd(matmul(2, block, machine=machine), 2, "atm-003")
    per_madd = getattr(machine.cpu(0), op) * 1e-6
    for r in run.results:
        assert r.ok
        assert r.compute == pytest.approx(4 * block**3 * per_madd)


def test_barrier_per_iteration_with_uneven_blocks() -> None:
    # 3x3 blocks on 2 ranks: 5 and 4 C blocks; the rank with fewer joins the last barriers.
    run = run_spmd(matmul(3, 4, barrier_every=1), 2, "memory")
    assert all(r.ok for r in run.results)
    with pytest.raises(ValueError, match="barrier_every"):
        matmul(2, 4, barrier_every=-1)


def test_barrier_per_iteration_makes_the_hot_spot_cost() -> None:
    # In step k every rank fetches A(i, k) from rank k mod P: in step, they queue at one link.
    machine = MACHINES["atm-003"]
    times = {
        every: max(
            r.comm
            for r in run_spmd(
                matmul(8, 16, barrier_every=every, machine=machine), 8, "atm-003"
            ).results
        )
        for every in (0, 1)
    }
    assert times[1] > 2 * times[0]
