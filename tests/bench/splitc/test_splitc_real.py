"""Split-C programs as real processes over udp: on loopback, and with each rank in its own
network namespace (root only); namespaces are deleted afterwards, also when a rank fails."""

from __future__ import annotations

import pytest

from stacklib import netns
from stacklib.cli import main as cli_main
from stacklib.commands.splitc import NETNS_PREFIX


def _ours() -> list[str]:
    return [name for name in netns.namespaces() if name.startswith(NETNS_PREFIX + "-")]


def test_udp_on_loopback_with_three_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(["splitc", "run", "mm4x4", "-n", "3", "--transport", "udp", "--small"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "mm4x4 on 3 ranks over udp: verified" in out
    assert "communication" in out


def test_netns_applies_to_udp_only(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(["splitc", "run", "mm4x4", "--transport", "shm", "--netns", "--small"])
    assert status == 2
    assert "--netns applies to udp, not shm" in capsys.readouterr().err


def test_netns_without_the_capability_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(netns, "capability_problem", lambda: "CAP_NET_ADMIN is missing")
    status = cli_main(["splitc", "run", "mm4x4", "--transport", "udp", "--netns", "--small"])
    assert status == 2
    assert "needs network namespaces: CAP_NET_ADMIN is missing" in capsys.readouterr().err


needs_netns = pytest.mark.skipif(
    netns.capability_problem() is not None, reason=f"{netns.capability_problem()}"
)


@needs_netns
def test_udp_between_namespaces(capsys: pytest.CaptureFixture[str]) -> None:
    before = _ours()
    argv = ["splitc", "run", "ssortsm", "-n", "3", "--transport", "udp", "--netns", "--small"]
    status = cli_main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "ssortsm on 3 ranks over udp (netns): verified" in out
    assert _ours() == before


@needs_netns
def test_namespaces_are_deleted_when_a_rank_fails(capsys: pytest.CaptureFixture[str]) -> None:
    before = _ours()
    argv = ["splitc", "run", "nosuch", "-n", "2", "--transport", "udp", "--netns", "--small"]
    assert cli_main(argv) != 0
    assert "exited with status" in capsys.readouterr().err
    assert _ours() == before
