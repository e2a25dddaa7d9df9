"""The Myrinet libraries as recipe transports (``sim-myrinet-<library>``): the shipped recipes
give the numbers of the ``myrinet`` experiment's sessions, layers stack on a library, and the
transport's table is checked strictly."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from stacklib.bench import workload_kind
from stacklib.bench.logp import LogPParams, run_logp
from stacklib.errors import ConfigError, Deadlock, PeerUnreachable
from stacklib.experiments.myrinet import open_session
from stacklib.recipes import load_recipe, parse_recipe, run_recipe
from stacklib.transports.sim.myrinet_libs import LIBRARIES

REPO_RECIPES = Path(__file__).resolve().parents[2] / "stacklib" / "recipes"


def _data(library: str) -> dict[str, Any]:
    return tomllib.loads((REPO_RECIPES / f"myrinet-{library}.toml").read_text())


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_recipe_gives_the_experiments_numbers(library: str) -> None:
    recipe = load_recipe(REPO_RECIPES / f"myrinet-{library}.toml")
    assert recipe.transport.name == f"sim-myrinet-{library}"
    from_recipe = run_recipe(recipe)
    sim, session = open_session(library)
    from_session = sim.run(recipe.workload.run, session, recipe.workload_params)
    assert from_recipe.rows == from_session.rows
    assert all(row["rtt_us"] > 0 for row in from_recipe.rows)  # type: ignore[operator]


def test_logp_through_a_recipe_is_the_experiments() -> None:
    params = LogPParams(sizes=(16,), burst=8, messages=60, iterations=4, warmup=1)
    data = _data("fm")
    data["workload"] = {"kind": "logp", "sizes": [16], "burst": 8, "messages": 60}
    data["workload"].update(iterations=4, warmup=1)
    from_recipe = run_recipe(parse_recipe(data, "fm-logp.toml"))
    sim, session = open_session("fm")
    assert from_recipe.rows == sim.run(run_logp, session, params).rows
    assert workload_kind("logp").accepts(LIBRARIES["fm"])


def test_bips_synchronization_is_a_transport_key() -> None:
    def rtt(synchronize: bool) -> float:
        data = _data("bip")
        data["transport"]["synchronize"] = synchronize
        data["workload"]["sizes"] = [4096]
        return float(run_recipe(parse_recipe(data, "bip.toml")).rows[0]["rtt_us"])  # type: ignore[arg-type]

    assert rtt(True) > rtt(False)  # the rendezvous before each large message costs time


def test_a_datagram_layer_stacks_on_a_library() -> None:
    data = _data("vmmc")
    data["layers"] = [{"kind": "arq"}]
    data["workload"]["sizes"] = [64]
    layered = run_recipe(parse_recipe(data, "arq-on-vmmc.toml")).rows[0]["rtt_us"]
    data["layers"] = []
    bare = run_recipe(parse_recipe(data, "vmmc.toml")).rows[0]["rtt_us"]
    assert layered > bare  # type: ignore[operator]  (ARQ's header and acknowledgments)


@pytest.mark.parametrize(
    ("change", "key", "reason"),
    [
        ({"transport": {"kind": "sim-myrinet-gm"}}, "transport.kind", "no transport named"),
        ({"transport": {"kind": "sim-myrinet-fm", "tokens": 4}}, "transport.tokens", "unknown key"),
        (
            {"transport": {"kind": "sim-myrinet-am", "synchronize": True}},
            "transport.synchronize",
            "unknown key",
        ),
        ({"run": {"clock": "real"}}, "run.clock", "runs only in virtual time"),
        ({"endpoint": {"rx_buffers": 8}}, "endpoint", "not U-Net endpoints"),
        ({"layers": [{"kind": "tcp"}]}, "layers", "requires an 'ip' service"),
    ],
)
def test_bad_tables_are_config_errors(change: dict[str, Any], key: str, reason: str) -> None:
    data = _data("pm")
    data.update(change)
    with pytest.raises(ConfigError, match=reason) as caught:
        parse_recipe(data, "bad.toml")
    assert caught.value.key == key


def test_a_host_profile_is_refused() -> None:
    data = _data("pm")
    data["host"] = {"profile": {"name": "faster", "ops": {}}}
    with pytest.raises(ConfigError, match="no profile"):
        run_recipe(parse_recipe(data, "profiled.toml"))


def _splitc_over(library: str, nodes: int) -> dict[str, Any]:
    data = tomllib.loads((REPO_RECIPES / "splitc-myrinet-fm.toml").read_text())
    data["transport"]["kind"] = f"sim-myrinet-{library}"
    data["workload"].update(small=True, nodes=nodes)
    del data["workload"]["sizes"]
    return data


@pytest.mark.parametrize("library", ["am", "fm", "pm", "vmmc"])
def test_splitc_over_uam_over_a_library_on_four_nodes(library: str) -> None:
    result = run_recipe(parse_recipe(_splitc_over(library, 4), "splitc.toml"))
    assert result.facts["verified"] == "yes" and len(result.rows) == 4


def test_bips_synchronous_sends_deadlock_the_all_to_all_and_the_run_says_so() -> None:
    # Every rank's large synchronous send waits for a receive its peer, itself sending, never
    # posts.  A rank with a message still unacknowledged to such a peer (the last small
    # collective before the exchange travels in a request) resends it until UAM gives the
    # peer up; with nothing unacknowledged every task would wait and the simulation would
    # report the deadlock itself (Deadlock, naming the waiting tasks).
    with pytest.raises((PeerUnreachable, Deadlock), match=r"peer \d acknowledged nothing|waiting"):
        run_recipe(parse_recipe(_splitc_over("bip", 4), "splitc-bip.toml"))
    two = run_recipe(parse_recipe(_splitc_over("bip", 2), "splitc-bip2.toml"))
    assert two.facts["verified"] == "yes"


def test_the_command_offers_every_library() -> None:
    from stacklib.commands.myrinet import LIBRARY_NAMES

    assert tuple(sorted(LIBRARIES)) == LIBRARY_NAMES
