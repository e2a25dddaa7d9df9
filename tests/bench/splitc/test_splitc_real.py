"""Split-C programs as real processes over udp: on loopback, and with each rank in its own
network namespace (root only); namespaces are deleted afterwards, also when a rank fails."""

from __future__ import annotations

import pytest

from stacklib import compiled, netns
from stacklib.cli import main as cli_main
from stacklib.commands.splitc import NETNS_PREFIX, rank_environment


def _ours() -> list[str]:
    return [name for name in netns.namespaces() if name.startswith(NETNS_PREFIX + "-")]


@pytest.mark.slow
def test_udp_on_loopback_with_three_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(["splitc", "run", "mm4x4", "-n", "3", "--transport", "udp", "--small"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "mm4x4 on 3 ranks over udp: verified" in out
    assert "communication" in out


@pytest.mark.parametrize("copy", [None, "/cache/compiled/abc"])
def test_real_ranks_run_the_compiled_copy_unless_pure(
    copy: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = None if copy is None else {compiled.ENVIRONMENT: copy}
    monkeypatch.setattr(compiled, "worker_environment", lambda: found)
    monkeypatch.setenv("STACKLIB_SOMETHING", "kept")
    env = rank_environment(pure=False)
    err = capsys.readouterr().err
    assert env["STACKLIB_SOMETHING"] == "kept"
    if copy is None:
        assert env[compiled.ENVIRONMENT] == "0"
        assert "pure Python modules (`stacklib compile`" in err
    else:
        assert env[compiled.ENVIRONMENT] == copy
        assert f"compiled hot path in {copy}" in err
    # --pure: never, also where this process was started with STACKLIB_COMPILED=1.
    monkeypatch.setenv(compiled.ENVIRONMENT, "1")
    env = rank_environment(pure=True)
    assert env[compiled.ENVIRONMENT] == "0"
    assert "ranks run the pure Python modules\n" in capsys.readouterr().err


@pytest.mark.slow
def test_a_pure_run_over_shm(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["splitc", "run", "rsortsm", "--transport", "shm", "--small", "--pure"]
    assert cli_main(argv) == 0
    captured = capsys.readouterr()
    assert "rsortsm on 2 ranks over shm: verified" in captured.out
    assert "ranks run the pure Python modules" in captured.err


def test_netns_applies_to_udp_and_xdp_only(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main(["splitc", "run", "mm4x4", "--transport", "shm", "--netns", "--small"])
    assert status == 2
    assert "--netns applies to udp and xdp, not shm" in capsys.readouterr().err
    status = cli_main(["splitc", "run", "mm4x4", "--transport", "xdp", "--small"])
    assert status == 2
    assert "namespace each (--netns)" in capsys.readouterr().err


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


@pytest.mark.slow
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
