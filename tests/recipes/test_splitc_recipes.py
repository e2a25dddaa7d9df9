"""The ``splitc`` recipe workload: the shipped recipes run verified, a recipe gives the same
times as run_spmd on the same machine with the splitc layer or without it, and bad
parameters are ConfigErrors naming the key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import attrs
import pytest

from stacklib.bench.splitc.cluster import run_spmd
from stacklib.bench.splitc.programs import make_program
from stacklib.bench.splitc.workload import SplitcWorkloadParams
from stacklib.errors import AssemblyError, ConfigError
from stacklib.recipes import load_recipe, parse_recipe, run_recipe, workload_nodes
from stacklib.transports.sim.machines import MACHINES

REPO_RECIPES = Path(__file__).resolve().parents[2] / "stacklib" / "recipes"
# In one process: a one-node-per-process recipe (splitc-xdp) runs as ranks, between
# namespaces (tests/recipes/test_xdp_recipes.py).
SPLITC_RECIPES = [
    path
    for path in sorted(REPO_RECIPES.glob("splitc-*.toml"))
    if not load_recipe(path).transport.per_process
]


def test_the_three_recipes_are_shipped() -> None:
    names = {path.stem for path in SPLITC_RECIPES}
    assert {"splitc-atm", "splitc-fe", "splitc-memory"} <= names


@pytest.mark.parametrize("path", SPLITC_RECIPES, ids=lambda p: p.stem)
def test_recipe_runs_verified_at_test_sizes(path: Path) -> None:
    recipe = load_recipe(path)
    params = attrs.evolve(recipe.workload_params, sizes=(), small=True)
    result = run_recipe(recipe, workload_params=params)
    assert result.facts["verified"] == "yes"
    assert [row["rank"] for row in result.rows] == list(range(params.nodes))
    assert all(row["verified"] == "yes" for row in result.rows)
    total = result.facts["total_s"]
    assert isinstance(total, float) and total > 0
    assert result.facts["computation_s"] <= total  # type: ignore[operator]


def test_recipe_gives_run_spmds_times_on_the_same_machine() -> None:
    recipe = load_recipe(REPO_RECIPES / "splitc-atm.toml")
    assert recipe.workload_params.machine == "atm-003"
    params = attrs.evolve(recipe.workload_params, benchmark="ssortlg", sizes=(), small=True)
    result = run_recipe(recipe, workload_params=params)
    program = make_program("ssortlg", small=True, machine=MACHINES["atm-003"], seed=1)
    run = run_spmd(program, params.nodes, "atm-003", seed=1)
    # The same events at other absolute times: equal up to the last bits of the subtraction.
    same = pytest.approx([r.total * 1e3 for r in run.results], rel=1e-12)
    assert [row["total_ms"] for row in result.rows] == same
    computed = pytest.approx([r.compute * 1e3 for r in run.results], rel=1e-12)
    assert [row["compute_ms"] for row in result.rows] == computed


def test_the_splitc_layer_or_the_workload_makes_the_same_ranks() -> None:
    data = tomllib.loads((REPO_RECIPES / "splitc-fe.toml").read_text())
    assert [layer["kind"] for layer in data["layers"]] == ["uam", "splitc"]
    data["workload"].update(benchmark="rsortlg", small=True, nodes=4)
    del data["workload"]["sizes"]
    layered = run_recipe(parse_recipe(data, "layered.toml"))
    data["layers"] = data["layers"][:1]  # UAM on top: the workload makes Split-C itself
    made = run_recipe(parse_recipe(data, "made.toml"))
    assert layered.facts["verified"] == made.facts["verified"] == "yes"
    # The same events at other absolute times: equal up to the last bits of the subtraction.
    assert [row["rank"] for row in layered.rows] == [row["rank"] for row in made.rows]
    for key in ("total_ms", "compute_ms", "comm_ms"):
        same = pytest.approx([row[key] for row in made.rows], rel=1e-12)
        assert [row[key] for row in layered.rows] == same
    assert layered.facts["total_s"] == pytest.approx(made.facts["total_s"], rel=1e-12)
    assert made.facts["total_s"] > 0


def test_a_rank_in_a_recipes_splitc_layer_is_refused() -> None:
    data = _splitc(nodes=2)
    data["layers"] = [{"kind": "uam"}, {"kind": "splitc", "rank": 1}]
    recipe = parse_recipe(data, "ranked.toml")
    with pytest.raises(
        AssemblyError, match="node 0 was given rank 1: in a recipe node i is rank i"
    ):
        run_recipe(recipe)


def test_fewer_nodes_than_the_recipe_builds_for() -> None:
    recipe = load_recipe(REPO_RECIPES / "splitc-fe.toml")
    params = attrs.evolve(recipe.workload_params, sizes=(), small=True, nodes=2)
    assert workload_nodes(recipe.workload, params) == 2
    result = run_recipe(recipe, workload_params=params)
    assert len(result.rows) == 2 and result.facts["verified"] == "yes"


def _splitc(**workload: object) -> dict[str, object]:
    return {
        "run": {"clock": "virtual"},
        "transport": {"kind": "sim-atm"},
        "layers": [{"kind": "uam"}],
        "workload": {"kind": "splitc", "benchmark": "mm4x4", "small": True, **workload},
    }


@pytest.mark.parametrize(
    ("workload", "key", "reason"),
    [
        ({"benchmark": "quicksort"}, "workload", "benchmark 'quicksort' is not"),
        ({"benchmark": 3}, "workload.benchmark", "expected a string"),
        ({"sizes": [4]}, "workload", "sizes: mm4x4 (mm) takes 2 size arguments"),
        ({"sizes": [4, 0]}, "workload", "sizes must be positive"),
        ({"sizes": "big"}, "workload.sizes", "expected a list"),
        ({"nodes": 0}, "workload", "nodes"),
        ({"nodes": 65}, "workload", "nodes"),
        ({"nodes": 2.5}, "workload.nodes", "expected an integer"),
        ({"machine": "cray-t3d"}, "workload", "machine 'cray-t3d' is not a machine"),
        ({"ranks": 4}, "workload.ranks", "unknown key"),
    ],
)
def test_bad_parameters_name_the_key(workload: dict[str, object], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_recipe(_splitc(**workload), "bad.toml")
    assert caught.value.key == key
    assert reason in caught.value.reason


def test_splitc_needs_uam_below_it() -> None:
    data = _splitc()
    data["layers"] = []  # raw U-Net is not a reliable service
    needs = r"workload\.kind: workload 'splitc' needs an 'active-messages' or 'splitc' service"
    with pytest.raises(ConfigError, match=needs + " but the stack's top provides 'unet'"):
        parse_recipe(data, "bad.toml")
    data["layers"] = [{"kind": "arq"}]  # reliable, but not active messages: refused at load
    with pytest.raises(ConfigError, match=needs + " but the stack's top provides 'reliable'"):
        parse_recipe(data, "arq.toml")


def test_nodes_parameter_sets_the_node_count() -> None:
    recipe = parse_recipe(_splitc(nodes=3), "three.toml")
    assert isinstance(recipe.workload_params, SplitcWorkloadParams)
    assert workload_nodes(recipe.workload, recipe.workload_params) == 3
    assert len(recipe.node_params[0]) == 3
    pingpong = parse_recipe(
        {"transport": {"kind": "memory"}, "workload": {"kind": "pingpong"}}, "pp.toml"
    )
    assert workload_nodes(pingpong.workload, pingpong.workload_params) == 2
