"""An optional compiled copy of the simulator's hot path, for long simulations.

A simulated UAM message is some 130 Python calls through the simulator's heap, the resources,
the NI's rings and descriptors, UAM's protocol machine and Split-C's wire format
(docs/performance.md, "Split-C in virtual time").  ``stacklib compile`` copies the package's
sources into a cache directory named after their hash and compiles :data:`HOT_MODULES` there
with mypyc (part of mypy: ``pip install 'stacklib[fast]'``; it needs a C compiler).  The
modules are the same source, unchanged: only how they run differs.

The copy also holds the C extensions of :data:`C_EXTENSIONS` (the shm ring's per-message
core, the UAM machine's core), compiled with the compiler this Python was built with; their
Python references run wherever they are not built.

A process started with ``STACKLIB_COMPILED=1`` (or ``=DIR``, a copy's directory) imports
stacklib's subpackages from the copy, but only from a copy built from exactly the sources
installed (the hash of every ``.py``, ``.c`` and ``.h`` file): after any edit it warns and runs the
pure modules until ``stacklib compile`` is run again.  ``stacklib splitc table1`` and
``stacklib reproduce --full`` start their worker processes this way when a copy exists
(``--pure``: never), and build one first for a run at the papers' sizes when mypyc is
installed.

What differs in compiled modules: a function called with an argument of the wrong type raises
``TypeError`` at once (the pure code raises its documented error a little later), and
monkeypatching a module's globals, or replacing a method on an instance of a compiled class,
does not reach the compiled code.  The simulated numbers are the same (tests/test_compiled.py
runs simulations both ways; the suites of tests/transports, layers, unet, bench and recipes
pass on the compiled copy but for tests that replace methods or pass ill-typed arguments).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import warnings
from collections.abc import Callable, MutableSequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# mypyc reads ``@mypyc_attr(...)`` on a class only when the name resolves to mypy_extensions'
# own; without mypy installed (pure Python) a stand-in returns the class unchanged.
if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:

        def mypyc_attr(*attrs: str, **kwattrs: Any) -> Any:
            return lambda cls: cls


__all__ = [
    "HOT_MODULES",
    "available",
    "build",
    "cache_root",
    "can_build",
    "mypyc_attr",
    "prune",
    "remove",
    "source_hash",
    "worker_environment",
]

#: Compiled, relative to the package: the modules every simulated message passes through (the
#: simulator, the U-Net NI and endpoint, the simulated NIs and fabric, UAM, Split-C's runtime
#: and wire format).  Their classes that other modules subclass carry ``mypyc_attr``.
HOT_MODULES: tuple[str, ...] = (
    "sim/pipeline.py",
    "sim/resources.py",
    "sim/world.py",
    "sim/clock.py",
    "unet/ring.py",
    "unet/ni.py",
    "unet/endpoint_types.py",
    "unet/endpoint.py",
    "unet/polled.py",
    "wire/descriptor.py",
    "transports/sim/fabric.py",
    "transports/sim/ni.py",
    "transports/sim/atm.py",
    "transports/sim/ethernet.py",
    "transports/shm/ring_core.py",
    "transports/shm/ring.py",
    "transports/shm/link.py",
    "transports/shm/polling.py",
    "transports/shm/endpoint.py",
    "transports/shm/ni.py",
    "layers/uam/paths.py",
    "layers/uam/service.py",
    "layers/uam/event_path.py",
    "layers/uam/lean_path.py",
    "layers/uam/task_path.py",
    "layers/splitc/wire.py",
    "layers/splitc/runtime.py",
)
#: C extensions built into the copy beside them, relative to the package: the shm ring's
#: per-message core and the UAM machine's core (their Python references, ring_core.py and
#: machine_core.py, run where they are not built), and Split-C's request handler that answers
#: scalar reads in UAM's express poll (where it is not built, the runtime's Python handler),
#: and the cheap half of a trio cancellation point (reference: ``polled.cancelled``).
#: (machine.py is not in HOT_MODULES: its class derives from the core, a C type in the copy,
#: which mypyc cannot compile a class on.)
C_EXTENSIONS: tuple[str, ...] = (
    "transports/shm/_ringcore.c",
    "layers/uam/_uamcore.c",
    "layers/splitc/_splitccore.c",
    "unet/_trioprobe.c",
    "unet/_quickawait.c",
)
ENVIRONMENT = "STACKLIB_COMPILED"
#: Compiled copies kept after a build: the new one and the most recently built others (each
#: is some 20 MB, and every edit of the sources makes a new one).
KEEP_COPIES = 3
_HASH_FILE = "SOURCE_HASH"


def package_dir() -> Path:
    """The directory of the stacklib package being run."""
    return Path(__file__).resolve().parent


def source_hash(root: Path | None = None) -> str:
    """SHA-256 over the relative path and bytes of every ``.py``, ``.c`` and ``.h`` file of
    the package (a copy built from other C sources is stale too)."""
    base = root or package_dir()
    digest = hashlib.sha256()
    for path in sorted([*base.rglob("*.py"), *base.rglob("*.c"), *base.rglob("*.h")]):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_root() -> Path:
    """Where compiled copies live: ``$STACKLIB_CACHE/compiled``, else
    ``~/.cache/stacklib/compiled``."""
    base = os.environ.get("STACKLIB_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "stacklib") / "compiled"


def _complete(copy: Path, digest: str) -> bool:
    """Whether ``copy`` holds every compiled module of the sources hashed ``digest`` (False
    also where this process may not read it, e.g. another user's cache)."""
    hash_file = copy / _HASH_FILE
    try:
        if not hash_file.is_file() or hash_file.read_text().strip() != digest:
            return False
        for module in (*HOT_MODULES, *C_EXTENSIONS):
            source = copy / "stacklib" / module
            if not any(source.parent.glob(f"{source.stem}.*.so")):
                return False
    except OSError:
        return False
    return True


def available() -> Path | None:
    """The compiled copy of the sources installed, or None."""
    digest = source_hash()
    copy = cache_root() / digest
    return copy if _complete(copy, digest) else None


def can_build() -> bool:
    """Whether mypyc is installed (``pip install 'stacklib[fast]'``), so :func:`build` may
    work (it also needs a C compiler)."""
    import importlib.util

    return importlib.util.find_spec("mypyc") is not None


def build(progress: Callable[[str], None] | None = None) -> Path:
    """Compile :data:`HOT_MODULES` in a copy of the package (or return the existing copy);
    ``RuntimeError`` names what is missing when mypyc or the compiler is not there."""
    existing = available()
    if existing is not None:
        return existing
    if not can_build():
        raise RuntimeError(
            "stacklib compile needs mypyc, which comes with mypy: pip install 'stacklib[fast]'"
        )
    digest = source_hash()
    root = cache_root()
    work = root / f"{digest}.building-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(
        package_dir(), work / "stacklib", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    # mypyc type-checks what it compiles: the untyped libraries are taken as Any, as in the
    # project's own mypy settings (pyproject.toml).
    (work / "mypy.ini").write_text(
        "[mypy]\n"
        + "".join(
            f"[mypy-{name}.*]\nignore_missing_imports = True\n"
            for name in ("construct", "crcmod", "hypothesis", "matplotlib", "rich")
        )
    )
    if progress is not None:
        progress(f"compiling {len(HOT_MODULES)} modules with mypyc in {work} ...")
    command = [sys.executable, "-m", "mypyc", *(f"stacklib/{m}" for m in HOT_MODULES)]
    result = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"mypyc failed (exit {result.returncode}):\n{tail}")
    for extension in C_EXTENSIONS:
        try:
            _compile_c(work / "stacklib" / extension, work / "stacklib")
        except RuntimeError:
            shutil.rmtree(work, ignore_errors=True)
            raise
    shutil.rmtree(work / "build", ignore_errors=True)
    (work / _HASH_FILE).write_text(digest + "\n")
    final = root / digest
    try:
        work.rename(final)
    except OSError:  # another build finished first: keep it
        shutil.rmtree(work, ignore_errors=True)
    if not _complete(final, digest):
        raise RuntimeError(f"the compiled copy in {final} is incomplete")
    prune(keep=KEEP_COPIES, current=final)
    return final


def _compile_c(source: Path, package: Path) -> Path:
    """Compile one C extension module next to its source, with the compiler and flags this
    Python was built with; ``RuntimeError`` with the compiler's complaint if it fails.
    ``package``: the stacklib tree whose shared headers it includes (``"unet/native_queue.h"``)."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = source.with_name(source.stem + suffix)
    flags = ["-shared", "-fPIC", "-O2", "-Wall", f"-I{sysconfig.get_paths()['include']}"]
    flags.append(f"-I{package}")
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]
    command = [*compiler, *flags, str(source), "-o", str(target)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"compiling {source.name} failed (exit {result.returncode}):\n{tail}")
    return target


def prune(keep: int = KEEP_COPIES, current: Path | None = None) -> list[Path]:
    """Delete all but the ``keep`` most recently built compiled copies (``current`` always
    stays); returns what was removed.  Builds in progress are left alone."""
    root = cache_root()
    if not root.is_dir():
        return []
    copies = [
        path
        for path in root.iterdir()
        if path.is_dir() and len(path.name) == 64 and (path / _HASH_FILE).is_file()
    ]
    copies.sort(key=lambda path: (path == current, (path / _HASH_FILE).stat().st_mtime))
    stale = copies[: max(0, len(copies) - max(keep, 1))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def remove() -> list[Path]:
    """Delete every compiled copy; returns what was removed."""
    root = cache_root()
    removed = sorted(root.iterdir()) if root.is_dir() else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def worker_environment() -> dict[str, str] | None:
    """What a worker process's environment needs to run the compiled copy (None: none)."""
    copy = available()
    return {ENVIRONMENT: str(copy)} if copy is not None else None


def _activate(package_path: MutableSequence[str]) -> str | None:
    """Called by ``stacklib/__init__.py`` before any subpackage is imported: put the compiled
    copy first on the package's search path if ``$STACKLIB_COMPILED`` asks for one and it
    matches the sources; returns its directory, or None."""
    wanted = os.environ.get(ENVIRONMENT, "")
    if wanted in ("", "0"):
        return None
    digest = source_hash()
    copy = cache_root() / digest if wanted == "1" else Path(wanted)
    if not _complete(copy, digest):
        warnings.warn(
            f"{ENVIRONMENT}={wanted}: no compiled copy of these sources (run `stacklib "
            "compile` after changing them); running the pure modules",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    package_path.insert(0, str(copy / "stacklib"))
    _load_runtime(copy)
    return str(copy)


def _load_runtime(copy: Path) -> None:
    """Load mypyc's shared runtime module, which sits at the top of the copy, by its file.
    (The copy's directory on ``sys.path`` would also let a spawned process, which inherits
    ``sys.path``, find the copy's ``stacklib`` before the installed one, whatever its own
    ``$STACKLIB_COMPILED`` says.)"""
    import importlib.util

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for runtime in copy.glob(f"*__mypyc{suffix}"):
        name = runtime.name[: -len(suffix)]
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, runtime)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
