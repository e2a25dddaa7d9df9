"""A benchmark's stacklib side on the pure modules and on the compiled copy, in one run.

``stacklib bench real`` times its stacklib rows twice when a compiled copy of these sources
exists (stacklib/compiled.py): once on the pure modules, once compiled, side by side.  A
measurement is a module-level function returning seconds; :func:`measure` runs it in this
process when this process already runs the wanted modules, else in a spawned worker process
whose environment selects them (the peer processes it spawns inherit that environment, so
both ends of a channel run the same modules).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import attrs

import stacklib
from stacklib import compiled

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

__all__ = ["Engine", "engines", "measure", "prepare"]


@attrs.frozen
class Engine:
    """Which modules a measurement runs: ``pure``, or ``compiled`` from the copy in ``copy``."""

    name: str
    copy: str | None = None

    @property
    def environment(self) -> str:
        """The value of ``$STACKLIB_COMPILED`` that selects these modules."""
        return "0" if self.copy is None else self.copy

    @property
    def suffix(self) -> str:
        """What a row measured on these modules adds to its name ("" for pure)."""
        return "" if self.copy is None else ", compiled"


PURE = Engine("pure")


def engines(pure: bool) -> list[Engine]:
    """The pure modules, and the compiled copy too unless ``pure`` or none matches these
    sources (:func:`stacklib.compiled.available`; :func:`prepare` builds one)."""
    copy = stacklib.COMPILED or (None if pure else compiled.available())
    if pure or copy is None:
        return [PURE]
    return [PURE, Engine("compiled", str(copy))]


def prepare(pure: bool, progress: Callable[[str], None]) -> None:
    """Build the compiled copy first (``stacklib compile``) when mypyc is installed and no
    copy matches the sources, unless ``pure``; say why not otherwise."""
    if pure or stacklib.COMPILED or compiled.available() is not None:
        return
    if not compiled.can_build():
        progress(
            "no compiled copy: `pip install 'stacklib[fast]'` (mypyc) and `bench real` builds "
            "one and shows compiled rows beside the pure ones"
        )
        return
    progress("compiling the hot path with mypyc first (stacklib compile), a minute or two")
    try:
        compiled.build()
    except RuntimeError as error:
        progress(f"stacklib compile failed, measuring the pure Python modules only: {error}")


def measure(engine: Engine, fn: Callable[..., float], *args: object) -> float:
    """``fn(*args)`` (seconds) on ``engine``'s modules: here if this process runs them, else
    in a spawned worker; ``RuntimeError`` if the worker fails or runs other modules."""
    here = stacklib.COMPILED
    if (engine.copy is None and here is None) or (engine.copy is not None and engine.copy == here):
        with _environment(engine.environment):
            return fn(*args)
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    # Not a daemon: the worker spawns the measurement's peer processes.
    process = context.Process(target=_worker, args=(sender, fn, args), name=f"bench-{engine.name}")
    with _environment(engine.environment):
        process.start()
    sender.close()
    try:
        ok, value, ran = receiver.recv()
    except EOFError:
        raise RuntimeError(f"the {engine.name} worker of {fn.__name__} died") from None
    finally:
        receiver.close()
        process.join()
    if not ok:
        raise RuntimeError(f"{fn.__name__} on the {engine.name} modules failed: {value}")
    if ran != engine.copy:
        raise RuntimeError(f"the {engine.name} worker of {fn.__name__} ran the modules in {ran}")
    return float(value)


def _worker(sender: Connection, fn: Callable[..., float], args: tuple[object, ...]) -> None:
    try:
        sender.send((True, fn(*args), stacklib.COMPILED))
    except Exception as error:  # reported in the parent, which raises
        sender.send((False, f"{type(error).__name__}: {error}", stacklib.COMPILED))
    finally:
        sender.close()


@contextlib.contextmanager
def _environment(value: str) -> Iterator[None]:
    """``$STACKLIB_COMPILED`` set to ``value`` while the block runs (processes spawned in it
    inherit it)."""
    saved = os.environ.get(compiled.ENVIRONMENT)
    os.environ[compiled.ENVIRONMENT] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[compiled.ENVIRONMENT]
        else:
            os.environ[compiled.ENVIRONMENT] = saved
