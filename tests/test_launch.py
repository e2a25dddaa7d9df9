"""``stacklib spawn`` and :func:`stacklib.launch.bootstrap`: ranks over shm and udp."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from stacklib import launch
from stacklib.launch import (
    LAUNCHER_VARIABLES,
    OVERSUBSCRIBED_SPIN,
    LaunchError,
    bootstrap,
    program_argv,
    rank_from_environment,
    shm_spin_time,
    shm_wait_policy,
)
from stacklib.transports.shm import SPIN_TIME
from stacklib.unet import polled

TIMEOUT = 30

#: Every rank says hello to every other and checks what it got.
EXCHANGE = """
import os
import re
import trio
from stacklib.launch import bootstrap
from stacklib.transports.shm import PeerGone

async def main() -> None:
    with bootstrap() as me:
        for other, channel in me.channels.items():
            await me.endpoint.send(channel, f"hello {me.rank}->{other}".encode())
        got = {}
        with trio.fail_after(20):
            while len(got) < me.size - 1:
                try:
                    message = await me.endpoint.recv()
                except PeerGone:  # a rank that has all its messages may leave first
                    continue
                got[me.rank_of(message.channel)] = message.data.decode()
        assert got == {o: f"hello {o}->{me.rank}" for o in range(me.size) if o != me.rank}, got
        # One write (atomic on a pipe): the ranks share the launcher's stdout.
        os.write(1, f"rank {me.rank} of {me.size} ok over {me.transport}\\n".encode())

trio.run(main)
"""

#: Rank 1 fails once the others are up; they would sleep for a minute if not killed.
FAILING = """
import os, sys, time
rank, size = int(os.environ["STACKLIB_RANK"]), int(os.environ["STACKLIB_SIZE"])
directory = sys.argv[1]
if rank == 1:
    while len(os.listdir(directory)) < size - 1:
        time.sleep(0.01)
    sys.exit(3)
# Written beside the directory, then moved in: a file in it is whole (its readers wait for
# the directory to fill).
staged = os.path.join(directory, os.pardir, f"{rank}.pid.staged")
with open(staged, "w") as handle:
    handle.write(str(os.getpid()))
os.replace(staged, os.path.join(directory, f"{rank}.pid"))
time.sleep(60)
"""


def run_spawn(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stacklib.launch", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize("transport", ["shm", "udp"])
def test_three_ranks_exchange_messages(tmp_path: Path, transport: str) -> None:
    program = tmp_path / "exchange.py"
    program.write_text(EXCHANGE)
    before = _stacklib_shm()
    result = run_spawn("-n", "3", "--transport", transport, str(program))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        f"rank {r} of 3 ok over {transport}" for r in range(3)
    ]
    if os.path.isdir("/dev/shm"):
        assert _stacklib_shm() <= before  # the rendezvous directory is gone


def _stacklib_shm() -> set[str]:
    """stacklib's entries in /dev/shm (other programs', such as Open MPI's, come and go)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm") if name.startswith("stacklib")}


def test_a_failing_rank_stops_the_others(tmp_path: Path) -> None:
    program = tmp_path / "failing.py"
    program.write_text(FAILING)
    pids = tmp_path / "pids"
    pids.mkdir()
    result = run_spawn("-n", "3", str(program), str(pids))
    assert result.returncode == 3
    assert "rank 1 of 3 exited with status 3" in result.stderr
    survivors = [int((pids / f"{r}.pid").read_text()) for r in (0, 2)]
    for pid in survivors:  # killed and reaped by spawn before it returned
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_usage_errors() -> None:
    result = run_spawn("-n", "0", "whatever")
    assert result.returncode == 2 and "at least 1" in result.stderr


def test_launcher_variables_map_to_rank_and_size() -> None:
    assert rank_from_environment({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}) == (
        2,
        4,
        "Open MPI mpirun",
    )
    assert rank_from_environment({"PMI_RANK": "0", "PMI_SIZE": "2"})[:2] == (0, 2)
    assert rank_from_environment({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == (
        5,
        8,
        "Slurm srun",
    )
    assert rank_from_environment({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "3"})[:2] == (
        1,
        3,
    )
    # stacklib's own variables win over a launcher's (spawn inside an allocation).
    both = {"STACKLIB_RANK": "1", "STACKLIB_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "9"}
    assert rank_from_environment(both) == (1, 2, "stacklib spawn")
    assert LAUNCHER_VARIABLES[0][:2] == ("STACKLIB_RANK", "STACKLIB_SIZE")
    for bad in ({}, {"PMI_RANK": "2", "PMI_SIZE": "2"}, {"PMI_RANK": "x", "PMI_SIZE": "2"}):
        with pytest.raises(LaunchError):
            rank_from_environment(bad)
    with pytest.raises(LaunchError, match="STACKLIB_RENDEZVOUS"):
        bootstrap({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})


def test_shm_ranks_wait_by_whether_each_can_have_a_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert 1 <= launch.usable_cpus() <= (os.cpu_count() or 1)
    monkeypatch.setattr(launch, "usable_cpus", lambda: 2)
    # A CPU each: shm's spin, the CPU given away after 64 empty polls in a row; more ranks
    # than CPUs: a longer spin that gives the CPU away after every empty poll.
    assert shm_wait_policy(1, {}) == shm_wait_policy(2, {}) == (SPIN_TIME, False)
    assert shm_wait_policy(3, {}) == shm_wait_policy(8, {}) == (OVERSUBSCRIBED_SPIN, True)
    assert shm_spin_time(8, {}) == OVERSUBSCRIBED_SPIN > SPIN_TIME > 0
    # STACKLIB_SPIN_US and STACKLIB_YIELD_WHEN_IDLE decide where they are set.
    assert shm_wait_policy(8, {"STACKLIB_SPIN_US": "200"}) == (pytest.approx(200e-6), True)
    assert shm_wait_policy(2, {"STACKLIB_SPIN_US": "0"}) == (0.0, False)
    assert shm_wait_policy(8, {"STACKLIB_YIELD_WHEN_IDLE": "0"})[1] is False
    assert shm_wait_policy(2, {"STACKLIB_YIELD_WHEN_IDLE": "1"})[1] is True
    for bad in ("x", "-1", "nan"):
        with pytest.raises(LaunchError, match="STACKLIB_SPIN_US"):
            shm_spin_time(2, {"STACKLIB_SPIN_US": bad})
    for bad in ("yes", "2", " 1"):
        with pytest.raises(LaunchError, match="STACKLIB_YIELD_WHEN_IDLE"):
            shm_wait_policy(2, {"STACKLIB_YIELD_WHEN_IDLE": bad})
    # bootstrap gives the rank's network the spin for the number of ranks, and makes the
    # process give the CPU away after every empty poll when the ranks outnumber the CPUs.
    yielded: list[bool] = []
    monkeypatch.setattr(launch, "yield_when_idle", yielded.append)
    for size, spin in ((2, SPIN_TIME), (4, OVERSUBSCRIBED_SPIN)):
        env = {"STACKLIB_RANK": "0", "STACKLIB_SIZE": str(size)}
        env |= {"STACKLIB_RENDEZVOUS": str(tmp_path), "STACKLIB_TRANSPORT": "shm"}
        with bootstrap(env) as me:
            assert me.network.spin_time == spin
            assert me.endpoint.ni.spin_time == spin
    assert yielded == [True]


def test_relax_gives_the_cpu_away_every_64th_empty_poll_or_after_every_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[None] = []
    monkeypatch.setattr(polled.os, "sched_yield", lambda: calls.append(None))
    try:
        for spins in range(1, 129):
            polled.relax(spins)
        assert len(calls) == 2  # at 64 and 128
        polled.yield_when_idle(True)
        for spins in range(1, 129):
            polled.relax(spins)
        assert len(calls) == 2 + 128
    finally:
        polled.yield_when_idle(False)
    polled.relax(1)
    assert len(calls) == 130


def test_program_is_a_file_or_a_module(tmp_path: Path) -> None:
    assert program_argv("x.py", ["a"]) == [sys.executable, "x.py", "a"]
    assert program_argv("pkg.mod") == [sys.executable, "-m", "pkg.mod"]
    script = tmp_path / "script"
    script.write_text("")
    assert program_argv(str(script)) == [sys.executable, str(script)]


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_udp_static_rendezvous_as_under_mpirun() -> None:
    """Two ranks as Open MPI would start them, with fixed addresses (no shared directory)."""
    static = f"static:127.0.0.1:{free_udp_port()},127.0.0.1:{free_udp_port()}"
    ranks = [
        bootstrap(
            {
                "OMPI_COMM_WORLD_RANK": str(r),
                "OMPI_COMM_WORLD_SIZE": "2",
                "STACKLIB_RENDEZVOUS": static,
            }
        )
        for r in (0, 1)
    ]
    try:
        assert [r.transport for r in ranks] == ["udp", "udp"]
        with trio.fail_after(5):
            await ranks[0].endpoint.send(ranks[0].channels[1], b"ping")
            message = await ranks[1].endpoint.recv()
            assert message.data == b"ping" and ranks[1].rank_of(message.channel) == 0
    finally:
        for rank in ranks:
            rank.close()
    with pytest.raises(LaunchError, match="2 addresses for 3 ranks"):
        bootstrap({"PMI_RANK": "0", "PMI_SIZE": "3", "STACKLIB_RENDEZVOUS": static})


def test_killing_the_launcher_kills_the_ranks(tmp_path: Path) -> None:
    program = tmp_path / "sleeper.py"
    program.write_text(FAILING.replace("if rank == 1:", "if False:"))
    pids = tmp_path / "pids"
    pids.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "stacklib.launch", "-n", "2", str(program), str(pids)],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(os.listdir(pids)) < 2:
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.01)
        ranks = [int((pids / f"{r}.pid").read_text()) for r in (0, 1)]
        launcher.terminate()
        assert launcher.wait(TIMEOUT) == 128 + signal.SIGTERM
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    for pid in ranks:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_documented_example_runs(tmp_path: Path) -> None:
    document = Path(__file__).resolve().parents[1] / "docs" / "launching.md"
    (block,) = re.findall(r"```python\n(.*?)```", document.read_text(), flags=re.DOTALL)
    program = tmp_path / "hello.py"
    program.write_text(block)
    result = run_spawn("-n", "3", str(program))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 6  # each rank hears from the two others


@pytest.mark.parametrize(
    ("pure", "preset", "expected"),
    [
        (False, None, "/cache/compiled/abc"),  # a copy of these sources exists: used
        (True, None, "0"),  # --pure: never
        (False, "0", "0"),  # the caller's own setting is passed on as it is
    ],
)
def test_ranks_run_the_compiled_copy_where_one_exists(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pure: bool,
    preset: str | None,
    expected: str,
) -> None:
    from stacklib import compiled
    from stacklib.launch import spawn

    copy = {compiled.ENVIRONMENT: "/cache/compiled/abc"}
    monkeypatch.setattr(compiled, "worker_environment", lambda: copy)
    if preset is None:
        monkeypatch.delenv(compiled.ENVIRONMENT, raising=False)
    else:
        monkeypatch.setenv(compiled.ENVIRONMENT, preset)
    program = tmp_path / "show.py"  # imports no stacklib: the path above is made up
    program.write_text(
        "import os, sys\n"
        "rank = os.environ['STACKLIB_RANK']\n"
        f"open(os.path.join({str(tmp_path)!r}, 'env' + rank), 'w')"
        ".write(os.environ.get('STACKLIB_COMPILED', 'unset'))\n"
    )
    assert spawn(2, str(program), pure=pure) == 0
    assert [(tmp_path / f"env{rank}").read_text() for rank in (0, 1)] == [expected] * 2
