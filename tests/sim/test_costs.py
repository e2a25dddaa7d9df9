"""Cost profiles as strict data, citations of published parameters, and the hosts' per-message
UDP and TCP costs."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

from stacklib.errors import ConfigError
from stacklib.sim import Citation, Cost, CostProfile, citations, cited, us
from stacklib.sim.costs import ProtocolCosts
from stacklib.transports.sim.hosts import HOSTS

GOOD: dict[str, Any] = {
    "name": "sba200",
    "description": "Fore SBA-200 with U-Net firmware",
    "cite": "paper 000 §4.2",
    "ops": {
        "send": {"resource": "cpu", "fixed_us": 1.5, "cite": "paper 003 §4.4.3"},
        "udp.checksum": {"resource": "cpu", "per_byte_us": 0.01},
        "fw.tx": {"resource": "ni", "fixed_us": 10, "per_byte_us": 0.05},
    },
}


def test_us_and_cost_seconds() -> None:
    assert us(1) == 1e-6
    assert us(2.5) == 2.5e-6
    cost = Cost("ni", fixed_us=10.0, per_byte_us=0.05)
    assert cost.seconds() == pytest.approx(10e-6)
    assert cost.seconds(1000) == pytest.approx(60e-6)
    with pytest.raises(ValueError):
        Cost("ni", fixed_us=-1.0)
    with pytest.raises(ValueError):
        Cost("ni", per_byte_us=math.nan)


def test_from_mapping_builds_an_immutable_profile() -> None:
    profile = CostProfile.from_mapping(GOOD, "recipes/atm.toml")
    assert profile.name == "sba200"
    assert profile.cite == "paper 000 §4.2"
    assert profile.ops["send"] == Cost("cpu", 1.5, 0.0, "paper 003 §4.4.3")
    assert profile.ops["fw.tx"].fixed_us == 10.0
    assert isinstance(profile.ops["fw.tx"].fixed_us, float)
    assert profile.cost("udp.checksum").seconds(1500) == pytest.approx(15e-6)
    with pytest.raises(TypeError):
        profile.ops["new"] = Cost("cpu")  # type: ignore[index]
    assert profile == CostProfile.from_mapping(GOOD, "again")
    hash(profile)


def test_unknown_operation_names_op_and_profile() -> None:
    profile = CostProfile.from_mapping(GOOD, "x")
    with pytest.raises(KeyError, match=r"'sba200'.*'recv'"):
        profile.cost("recv")


def _broken(path: list[str], value: Any, delete: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {**GOOD, "ops": {k: dict(v) for k, v in GOOD["ops"].items()}}
    target = data
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "key", "reason"),
    [
        (["colour"], "red", "colour", "unknown key"),
        (["ops", "send", "fixed"], 1.0, "ops.send.fixed", "unknown key"),
        (["ops", "udp.checksum", "extra"], 1, 'ops."udp.checksum".extra', "unknown key"),
        (["ops", "send", "fixed_us"], "7", "ops.send.fixed_us", "number"),
        (["ops", "send", "fixed_us"], True, "ops.send.fixed_us", "number"),
        (["ops", "send", "per_byte_us"], -0.5, "ops.send.per_byte_us", ">= 0"),
        (["ops", "send", "fixed_us"], math.inf, "ops.send.fixed_us", "finite"),
        (["ops", "send", "resource"], 3, "ops.send.resource", "string"),
        (["ops", "send", "resource"], "", "ops.send.resource", "empty"),
        (["ops", "send", "cite"], ["paper"], "ops.send.cite", "string"),
        (["ops", "send"], 1.5, "ops.send", "table"),
        (["ops"], [], "ops", "table"),
        (["name"], None, "name", "string"),
        (["description"], 1, "description", "string"),
    ],
)
def test_from_mapping_is_strict(path: list[str], value: Any, key: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        CostProfile.from_mapping(_broken(path, value), "recipes/bad.toml")
    assert info.value.where == "recipes/bad.toml"
    assert info.value.key == key
    assert key in str(info.value)


@pytest.mark.parametrize(
    ("path", "key"),
    [(["name"], "name"), (["ops"], "ops"), (["ops", "send", "resource"], "ops.send.resource")],
)
def test_from_mapping_requires_keys(path: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match="missing") as info:
        CostProfile.from_mapping(_broken(path, None, delete=True), "bad.toml")
    assert info.value.key == key


@attrs.frozen
class LinkParams:
    bandwidth_mbps: float = cited(140.0, "paper 000 §4.1", "Mbit/s")
    label: str = "taxi"


@attrs.frozen
class NIParams:
    send_overhead_us: float = cited(7.0, "paper 000 Table 1", "us")
    firmware: str = cited("u-net", "paper 000 §4.2.2")
    link: LinkParams = attrs.field(factory=LinkParams)
    queue_depth: int = 64


def test_cited_fields_are_ordinary_attrs_fields_with_defaults() -> None:
    params = NIParams()
    assert params.send_overhead_us == 7.0
    assert NIParams(send_overhead_us=9.5).send_overhead_us == 9.5
    meta = attrs.fields(NIParams).send_overhead_us.metadata
    assert meta == {"cite": "paper 000 Table 1", "unit": "us"}


def test_citations_lists_nested_cited_fields_with_current_values() -> None:
    params = NIParams(send_overhead_us=9.5, link=LinkParams(bandwidth_mbps=155.0))
    assert citations(params) == [
        Citation("send_overhead_us", 9.5, "us", "paper 000 Table 1"),
        Citation("firmware", "u-net", "", "paper 000 §4.2.2"),
        Citation("link.bandwidth_mbps", 155.0, "Mbit/s", "paper 000 §4.1"),
    ]
    with pytest.raises(TypeError):
        citations(42)


def test_from_mapping_rejects_a_non_table() -> None:
    with pytest.raises(ConfigError, match="expected a table"):
        CostProfile.from_mapping([1, 2], "bad.toml")  # type: ignore[arg-type]


def test_protocol_costs_are_cited_and_live_in_the_host_model() -> None:
    ss20 = HOSTS["ss20"].protocol
    assert (ss20.udp_datagram_us, ss20.tcp_segment_us) == (4.5, 5.4)
    cited_ = {c.name: c.cite for c in citations(ss20)}
    assert "Table 3" in cited_["udp_datagram_us"] and "Table 3" in cited_["tcp_segment_us"]
    # Other hosts by clock rate from the SS-20's 60 MHz.
    p120 = HOSTS["p120"].protocol
    assert p120.udp_datagram_us == pytest.approx(2.25)
    assert p120.tcp_segment_us == pytest.approx(2.7)
    assert all(host.protocol.udp_datagram_us > 0 for host in HOSTS.values())
    with pytest.raises(ValueError, match="udp_datagram_us"):
        ProtocolCosts(udp_datagram_us=-1.0)
