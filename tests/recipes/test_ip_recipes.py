"""Per-node layer parameters in recipes: ``{node}`` / ``{node1}`` templates and IP peers filled
from the channel table."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from stacklib.errors import ConfigError
from stacklib.layers.ip.driver import IpLayer
from stacklib.recipes import expand_node, load_recipe, parse_recipe, run_recipe


def ip_udp(ip: dict[str, Any] | None = None, **workload: Any) -> dict[str, object]:
    return {
        "transport": {"kind": "memory"},
        "layers": [{"kind": "ip", "address": "10.0.0.{node1}", **(ip or {})}, {"kind": "udp"}],
        "workload": {"kind": "udp-pingpong", "sizes": [0, 100], "iterations": 3, "warmup": 1}
        | workload,
    }


def test_expand_node_replaces_templates_in_strings_keys_and_lists() -> None:
    value = {"a": "x{node}-{node1}", "{node1}.k": [1, "n{node}"], "n": 5, "flag": True}
    assert expand_node(value, 2, "w", "k") == {
        "a": "x2-3",
        "3.k": [1, "n2"],
        "n": 5,
        "flag": True,
    }
    assert expand_node("plain", 0, "w", "k") == "plain"


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("10.0.0.{nod}", "layers[0].address"),
        ("10.0.0.{node+1}", "layers[0].address"),
        ("10.0.0.{}", "layers[0].address"),
    ],
)
def test_bad_template_is_a_config_error_naming_the_key(value: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_recipe(ip_udp({"address": value}), "bad.toml")
    assert caught.value.key == key
    assert "unknown template" in str(caught.value)
    assert str(caught.value).startswith("bad.toml: ")


def test_bad_template_in_a_table_key_names_the_nested_key() -> None:
    data = ip_udp({"peers": {"10.0.0.{peer}": 0}})
    with pytest.raises(ConfigError) as caught:
        parse_recipe(data, "bad.toml")
    assert caught.value.key.startswith("layers[0].peers")


def test_an_expanded_value_is_validated() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_recipe(ip_udp({"address": "10.0.0.9{node1}9"}), "bad.toml")  # 10.0.0.919
    assert caught.value.key == "layers[0]"
    assert "10.0.0.919" in str(caught.value)
    parse_recipe(ip_udp({"address": "10.0.0.2{node1}9"}), "ok.toml")


def test_shared_address_with_filled_peers_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_recipe(ip_udp({"address": "10.0.0.1"}), "bad.toml")
    assert caught.value.key == "layers[0].address"
    assert "{node1}" in str(caught.value)


def test_each_node_gets_its_address_and_peers_from_the_channels() -> None:
    recipe = parse_recipe(ip_udp(), "inline")
    assert recipe.layers[0][1].address == "10.0.0.1"
    assert [p.address for p in recipe.node_params[0]] == ["10.0.0.1", "10.0.0.2"]
    assert recipe.auto_peers == frozenset({0})
    node1 = recipe.make_layers(1, {0: 7})
    assert isinstance(node1[0], IpLayer)
    assert node1[0].params.address == "10.0.0.2"
    assert node1[0].params.peers == {"10.0.0.1": 7}
    node0 = recipe.make_layers()[0]
    assert isinstance(node0, IpLayer) and node0.params.peers == {}


def test_explicit_peers_are_kept() -> None:
    recipe = parse_recipe(ip_udp({"peers": {"10.0.0.9": 0}}), "inline")
    assert recipe.auto_peers == frozenset()
    layer = recipe.make_layers(0, {1: 3})[0]
    assert isinstance(layer, IpLayer)
    assert layer.params.peers == {"10.0.0.9": 0}


def test_recipes_without_templates_are_unchanged() -> None:
    data = {
        "transport": {"kind": "memory"},
        "layers": [{"kind": "arq", "rto_us": 500.0}],
        "workload": {"kind": "pingpong", "sizes": [8], "iterations": 2, "warmup": 0},
    }
    recipe = parse_recipe(data, "inline")
    assert recipe.node_params[0][0] == recipe.node_params[0][1] == recipe.layers[0][1]
    assert run_recipe(recipe).rows[0]["size"] == 8


def test_ip_udp_recipe_node0_reaches_node1_by_address() -> None:
    result = run_recipe(parse_recipe(ip_udp(), "inline"))
    assert result.facts["server"] == "10.0.0.2:7"
    assert result.facts["lost"] == 0
    assert [row["size"] for row in result.rows] == [0, 100]
    assert all(isinstance(row["rtt_us"], float) for row in result.rows)


def test_ip_udp_recipe_in_virtual_time_with_node_index() -> None:
    data = ip_udp({"address": "192.168.{node}.1"})
    data["run"] = {"clock": "virtual", "seed": 3}
    data["transport"] = {"kind": "memory", "latency_us": 10.0}
    result = run_recipe(parse_recipe(data, "inline"))
    assert result.facts["server"] == "192.168.1.1:7"
    assert result.facts["lost"] == 0


# --- layers on UDP's datagram face --------------------------------------------------------------

REPO_RECIPES = Path(__file__).resolve().parents[2] / "stacklib" / "recipes"


@pytest.mark.parametrize(
    ("name", "above"), [("arq-udp-atm", ["ip", "udp", "arq"]), ("uam-udp-fe", ["ip", "udp", "uam"])]
)
def test_a_layer_on_udp_runs_from_its_recipe_in_virtual_time(name: str, above: list[str]) -> None:
    data = tomllib.loads((REPO_RECIPES / f"{name}.toml").read_text())
    assert [layer["kind"] for layer in data["layers"]] == above
    result = run_recipe(load_recipe(REPO_RECIPES / f"{name}.toml"))
    rtts = [row["rtt_us"] for row in result.rows]
    assert [row["size"] for row in result.rows] == data["workload"]["sizes"]
    assert all(isinstance(rtt, float) and rtt > 0 for rtt in rtts)
    assert rtts == sorted(rtts)  # longer messages take longer
    # UDP's own datagram face, no layer above: the smallest message, quicker.
    bare = dict(data, layers=data["layers"][:2], workload={**data["workload"], "sizes": [0]})
    bare_rtts = [row["rtt_us"] for row in run_recipe(parse_recipe(bare, "bare.toml")).rows]
    assert bare_rtts[0] < rtts[0]  # type: ignore[operator]  (the layer's header and work)


@pytest.mark.parametrize("transport", ["memory", "shm"])
@pytest.mark.parametrize("layer", ["arq", "uam"])
def test_a_layer_on_udp_runs_on_a_transport_in_real_time(layer: str, transport: str) -> None:
    # shm: the real shared-memory transport, the same stack as over the simulated NIs.
    data: dict[str, Any] = {
        "run": {"clock": "real"},
        "transport": {"kind": transport},
        "layers": [{"kind": "ip", "address": "10.0.0.{node1}"}, {"kind": "udp"}, {"kind": layer}],
        "workload": {"kind": "pingpong", "sizes": [0, 100, 3000], "iterations": 5, "warmup": 1},
    }
    result = run_recipe(parse_recipe(data, f"{layer}-udp-{transport}.toml"))
    assert [row["size"] for row in result.rows] == [0, 100, 3000]
    assert result.facts["clock"] == "real"


def test_arq_on_udp_over_a_lossy_network_completes_every_round_trip() -> None:
    data = tomllib.loads((REPO_RECIPES / "arq-udp-atm.toml").read_text())
    data["transport"]["faults"] = {"loss": 0.01}  # per ATM cell: 2% of 100-byte PDUs, 20% of 1000
    data["workload"].update(sizes=[100, 1000], iterations=40, warmup=0)
    lossy = run_recipe(parse_recipe(data, "lossy.toml")).rows
    data["transport"]["faults"] = {"loss": 0.0}
    clean = run_recipe(parse_recipe(data, "clean.toml")).rows
    # ARQ resent what was lost: every round trip completed, some after a 2 ms timeout.
    assert [row["size"] for row in lossy] == [100, 1000]
    for hit, calm in zip(lossy, clean, strict=True):
        assert hit["rtt_us"] > calm["rtt_us"]  # type: ignore[operator]
        assert hit["min_us"] == pytest.approx(calm["min_us"])  # the fastest one lost nothing


def test_udps_face_port_is_a_checked_parameter() -> None:
    data = ip_udp()
    data["layers"][1]["port"] = 0  # type: ignore[index]
    with pytest.raises(ConfigError) as caught:
        parse_recipe(data, "bad.toml")
    assert caught.value.key.startswith("layers[1]")
