"""The optional compiled copy of the simulator's hot path (stacklib/compiled.py): built from
the sources, used only when it matches them, and giving the pure modules' numbers."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stacklib import compiled
from stacklib.cli import main

# Small simulations whose numbers depend on every compiled module: Split-C writes and a radix
# sort of small messages over UAM on the simulated ATM and Fast Ethernet clusters; recipes on
# the Myrinet NI and the memory NI in virtual time (interpreted subclasses of compiled NIs);
# and a buffer trace of a UDP recipe (the hook every compiled NI reads).
PROGRAM = """
import json, stacklib
from stacklib.bench.real_am import splitc_read_cpu
from stacklib.bench.splitc.cluster import run_spmd
from stacklib.bench.splitc.programs import make_program
from stacklib.recipes import load_recipe, run_recipe
from stacklib.transports.sim.machines import MACHINES
from stacklib.unet.mm.trace import TraceRecorder
import stacklib.sim.world as world
atm = run_spmd(make_program("rsortsm", (256,), machine=MACHINES["atm-003"]), 4, "atm-003")
fe = run_spmd(make_program("rsortsm", (256,), machine=MACHINES["fe-003"]), 2, "fe-003")
recipes = {name: run_recipe(load_recipe(name)).rows for name in (
    "myrinet", "memory-table1-virtual")}
recorder = TraceRecorder()
with recorder.installed():
    run_recipe(load_recipe("udp-atm"))
# UAM request/reply and Split-C reads over an shm pair in this process: on the copy, the C
# cores' express lane with the compiled service (it raises on a wrong read or reply).
real = sorted(splitc_read_cpu(100, 1))
# The shm endpoint's await calls (on the copy: the quick calls in the class's dict), each
# face and send's keyword form, between two endpoints of this process.
import trio
from stacklib.bench.real import open_endpoint
from stacklib.transports.shm import ShmNetwork
from stacklib.transports.shm.endpoint import ShmEndpoint
async def faces(a, ch_a, b, ch_b):
    got = []
    for index in range(300):  # past a yield (every 256 calls)
        await a.send(ch_a, b"m%d" % index)
        got.append((await b.recv()).data)
        await b.send_payload_async(ch_b, b"p%d" % index)
        got.append((await a.recv_payload())[1])
    await a.send(ch_a, b"kw", dest_offset=None)
    got.append((await b.recv()).data)
    return got == [b"%s%d" % (f, i) for i in range(300) for f in (b"m", b"p")] + [b"kw"]
with ShmNetwork() as network:
    a, ch_a = open_endpoint(network, name="a", remote="b")
    b, ch_b = open_endpoint(network, name="b", remote="a")
    awaits = trio.run(faces, a, ch_a, b, ch_b)
print(json.dumps({
    "awaits": [awaits, type(vars(ShmEndpoint)["recv"]).__name__],
    "times": [r.total for r in atm.results + fe.results],
    "ok": [r.ok for r in atm.results + fe.results],
    "recipes": recipes,
    "trace": [(r.direction, r.node, r.address, r.length) for r in recorder.records],
    "real": real,
    "world": world.__file__,
    "compiled": stacklib.COMPILED,
}))
"""


PROBE = """
import stacklib


def pure_here() -> float:
    import stacklib.sim.world as world

    return 1.0 if world.__file__.endswith(".py") and stacklib.COMPILED is None else 0.0


if __name__ == "__main__":
    from stacklib.bench.engines import PURE, measure

    print("parent-compiled" if stacklib.COMPILED else "parent-pure")
    print("worker-pure" if measure(PURE, pure_here) == 1.0 else "worker-compiled")
"""


def run_program(environment: dict[str, str]) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,  # (a reply lost for good would leave the real exchange polling)
    )
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def test_the_source_hash_follows_every_python_and_c_file(tmp_path: Path) -> None:
    package = tmp_path / "package"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "notes.txt").write_text("not code\n")
    first = compiled.source_hash(package)
    assert compiled.source_hash(package) == first
    (package / "notes.txt").write_text("still not code\n")
    assert compiled.source_hash(package) == first
    (package / "sub" / "b.py").write_text("y = 3\n")
    second = compiled.source_hash(package)
    assert second != first
    (package / "sub" / "core.c").write_text("int x;\n")
    assert compiled.source_hash(package) != second


def test_a_copy_that_does_not_match_the_sources_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKLIB_CACHE", str(tmp_path))
    assert compiled.available() is None
    stale = tmp_path / "stale"
    (stale / "stacklib").mkdir(parents=True)
    (stale / "SOURCE_HASH").write_text("0" * 64 + "\n")
    monkeypatch.setenv(compiled.ENVIRONMENT, str(stale))
    path: list[str] = []
    with pytest.warns(RuntimeWarning, match="no compiled copy of these sources"):
        assert compiled._activate(path) is None
    assert path == []
    monkeypatch.setenv(compiled.ENVIRONMENT, "0")
    assert compiled._activate(path) is None


def test_prune_keeps_the_most_recent_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKLIB_CACHE", str(tmp_path))
    root = compiled.cache_root()
    copies = []
    for age in range(5):  # copies[0] is the oldest
        copy = root / (f"{age:x}" * 64)
        copy.mkdir(parents=True)
        (copy / "SOURCE_HASH").write_text(copy.name + "\n")
        os.utime(copy / "SOURCE_HASH", (1000 + age, 1000 + age))
        copies.append(copy)
    building = root / f"{'f' * 64}.building-123"  # another process's build: left alone
    building.mkdir()
    # The copy in use stays even when it is the oldest.
    removed = compiled.prune(keep=2, current=copies[0])
    assert removed == copies[1:4]
    assert sorted(root.iterdir()) == sorted([copies[0], copies[4], building])
    assert compiled.prune(keep=2) == []


def test_a_copy_this_process_may_not_read_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # E.g. a process of another user (a test's `setpriv` child) that inherits
    # STACKLIB_COMPILED=1 pointing into root's cache: it runs the pure modules, with a warning.
    copy = tmp_path / "copy"
    (copy / "stacklib").mkdir(parents=True)
    (copy / "SOURCE_HASH").write_text(compiled.source_hash() + "\n")

    def denied(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", denied)
    monkeypatch.setenv(compiled.ENVIRONMENT, str(copy))
    path: list[str] = []
    with pytest.warns(RuntimeWarning, match="no compiled copy of these sources"):
        assert compiled._activate(path) is None
    assert path == []


def test_compile_path_says_when_there_is_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STACKLIB_CACHE", str(tmp_path))
    assert main(["compile", "--path"]) == 1
    assert "no compiled copy" in capsys.readouterr().err
    assert main(["compile", "--clean"]) == 0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("mypyc") is None, reason="mypyc (stacklib[fast]) is not installed"
)
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)
def test_the_compiled_copy_gives_the_pure_modules_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKLIB_CACHE", str(tmp_path))
    # The C compiler's optimisation changes how fast the copy runs, not what it computes: a
    # quick build keeps this test short (stacklib compile itself builds at mypyc's -O3).
    monkeypatch.setenv("MYPYC_OPT_LEVEL", "0")
    copy = compiled.build()
    assert compiled.available() == copy
    assert compiled.build() == copy  # built once
    for module in (*compiled.HOT_MODULES, *compiled.C_EXTENSIONS):
        source = copy / "stacklib" / module
        assert list(source.parent.glob(f"{source.stem}.*.so")), module
    pure = run_program({"STACKLIB_CACHE": str(tmp_path), compiled.ENVIRONMENT: "0"})
    fast = run_program({"STACKLIB_CACHE": str(tmp_path), compiled.ENVIRONMENT: "1"})
    assert str(pure["world"]).endswith(".py") and pure["compiled"] is None
    assert str(fast["world"]).endswith(".so") and fast["compiled"] == str(copy)
    assert fast["ok"] == pure["ok"] == [True] * 6
    assert fast["times"] == pure["times"]  # the same simulation, to the last digit
    assert fast["recipes"] == pure["recipes"]
    assert fast["trace"] == pure["trace"] and pure["trace"]
    assert fast["real"] == pure["real"] == ["share", "splitc", "uam"]
    assert pure["awaits"] == [True, "function"] and fast["awaits"] == [True, "QuickCall"]
    # A process on the copy measures its benchmarks' pure rows in a spawned worker on the
    # pure modules (the worker inherits sys.path, which must not lead it into the copy).
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    answer = subprocess.run(
        [sys.executable, str(probe)],
        env={**os.environ, "STACKLIB_CACHE": str(tmp_path), compiled.ENVIRONMENT: "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert answer.stdout.split() == ["parent-compiled", "worker-pure"], answer.stdout
    assert compiled.remove() == [copy]
    assert compiled.available() is None


def test_a_full_run_builds_the_compiled_copy_first(monkeypatch: pytest.MonkeyPatch) -> None:
    import stacklib
    from stacklib.experiments import splitc as experiment

    built: list[int] = []
    lines: list[str] = []

    def build(progress: object = None) -> Path:
        built.append(1)
        return Path("copy")

    def fail(progress: object = None) -> Path:
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(stacklib, "COMPILED", None)
    monkeypatch.setattr(compiled, "available", lambda: None)
    monkeypatch.setattr(compiled, "build", build)
    monkeypatch.setattr(compiled, "can_build", lambda: True)
    experiment.prepare_engine(True, lines.append)  # --pure: never
    assert (built, lines) == ([], [])
    experiment.prepare_engine(False, lines.append)
    assert built == [1] and "compiling" in lines[-1]
    monkeypatch.setattr(compiled, "can_build", lambda: False)
    experiment.prepare_engine(False, lines.append)
    assert built == [1] and "pip install 'stacklib[fast]'" in lines[-1]
    monkeypatch.setattr(compiled, "can_build", lambda: True)
    monkeypatch.setattr(compiled, "build", fail)
    experiment.prepare_engine(False, lines.append)
    assert "no C compiler" in lines[-1] and "pure Python" in lines[-1]
    monkeypatch.setattr(compiled, "available", lambda: Path("copy"))
    experiment.prepare_engine(False, lines.append)  # a copy of these sources exists: nothing
    assert len(lines) == 4
