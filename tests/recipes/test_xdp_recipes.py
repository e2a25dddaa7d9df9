"""Every layer over the xdp transport, from its recipe, between two network namespaces.

Each test starts two ranks with ``stacklib.launch.spawn(transport="xdp", netns=True)`` (each
rank in a namespace of its own, the namespaces bridged, as two hosts on one segment) running
tests/recipes/xdp_rank.py or ``stacklib run RECIPE``.  They need root, network namespaces,
bpf(2) and AF_XDP, and skip naming what is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stacklib.errors import ConfigError
from stacklib.launch import LaunchError, spawn
from stacklib.netns import capability_problem
from stacklib.recipes import load_recipe, run_recipe
from stacklib.recipes.ranks import run_rank
from stacklib.transports.xdp.bpf import bpf_problem
from stacklib.transports.xdp.xsk import xdp_problem

RANK = str(Path(__file__).with_name("xdp_rank.py"))


def _problem() -> str | None:
    for check in (capability_problem, bpf_problem, xdp_problem):
        problem = check()
        if problem is not None:
            return problem
    return None


needs_xdp = pytest.mark.skipif(_problem() is not None, reason=f"no AF_XDP here: {_problem()}")


def _ranks(capfd: pytest.CaptureFixture[str], *args: str) -> str:
    status = spawn(2, RANK, args, transport="xdp", netns=True)
    out = capfd.readouterr().out
    assert status == 0, out
    return out


@pytest.mark.slow
@needs_xdp
def test_raw_unet_frames_both_ways_and_the_kernel_still_answers_ping(
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert "ping ok" in _ranks(capfd, "frames", "unet-xdp")


@pytest.mark.slow
@needs_xdp
def test_uam_delivers_a_multi_megabyte_stream(capfd: pytest.CaptureFixture[str]) -> None:
    assert f"stream ok {4 << 20}" in _ranks(capfd, "stream", "uam-xdp")


@pytest.mark.slow
@needs_xdp
def test_tcp_over_ip_delivers_a_multi_megabyte_stream(capfd: pytest.CaptureFixture[str]) -> None:
    assert f"tcp ok {4 << 20}" in _ranks(capfd, "tcp", "tcp-xdp")


@pytest.mark.slow
@needs_xdp
def test_udp_datagrams_both_ways(capfd: pytest.CaptureFixture[str]) -> None:
    assert "udp ok" in _ranks(capfd, "udp", "udp-xdp")


@pytest.mark.slow
@needs_xdp
@pytest.mark.parametrize(
    ("recipe", "expected"),
    [
        ("splitc-xdp", "verified: yes"),
        ("unet-xdp", "RTT median"),
        ("tcp-xdp", "bandwidth"),
    ],
)
def test_stacklib_run_as_two_ranks(
    capfd: pytest.CaptureFixture[str], recipe: str, expected: str
) -> None:
    small = {
        "splitc-xdp": [],
        "unet-xdp": ["--set", "workload.iterations=50", "--set", "workload.warmup=5"],
        "tcp-xdp": ["--set", "workload.size=262144", "--set", "workload.rtt_iterations=5"],
    }[recipe]
    args = ["stacklib", "run", recipe, *small]
    status = spawn(2, args[0], args[1:], transport="xdp", netns=True)
    out = capfd.readouterr().out
    assert status == 0, out
    assert expected in out and "ranks: 2" in out


@pytest.mark.slow
@needs_xdp
def test_splitc_ranks_through_the_launcher_over_xdp(capfd: pytest.CaptureFixture[str]) -> None:
    from stacklib.cli import main

    args = ["splitc", "run", "rsortsm", "-n", "2", "--transport", "xdp", "--netns", "--small"]
    status = main(args)
    out = capfd.readouterr().out
    assert status == 0, out
    assert "rsortsm on 2 ranks over xdp (netns): verified" in out


def test_a_one_node_per_process_recipe_says_how_to_start_its_ranks() -> None:
    recipe = load_recipe("tcp-xdp")
    assert recipe.transport.per_process
    with pytest.raises(ConfigError, match="stacklib spawn -n 2 --transport xdp --netns"):
        run_recipe(recipe)
    with pytest.raises(ConfigError, match="one node per process"):
        run_rank(recipe, {})


def test_a_rank_of_the_wrong_transport_or_count_is_refused(tmp_path: Path) -> None:
    recipe = load_recipe("udp-xdp")
    env = {
        "STACKLIB_RANK": "0",
        "STACKLIB_SIZE": "2",
        "STACKLIB_RENDEZVOUS": str(tmp_path),
        "STACKLIB_TRANSPORT": "ether",
    }
    with pytest.raises(ConfigError, match="STACKLIB_TRANSPORT=ether"):
        run_rank(recipe, env)
    with pytest.raises(ConfigError, match="runs on 2 nodes, but 3 ranks"):
        run_rank(recipe, {**env, "STACKLIB_SIZE": "3", "STACKLIB_TRANSPORT": "xdp"})


def test_spawn_wants_namespaces_for_xdp() -> None:
    with pytest.raises(LaunchError, match="--netns"):
        spawn(2, sys.executable, transport="xdp")
    with pytest.raises(LaunchError, match="not shm"):
        spawn(2, sys.executable, transport="shm", netns=True)
