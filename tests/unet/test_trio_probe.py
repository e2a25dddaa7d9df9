"""The C form of the cheap cancellation test (``_trioprobe.c``) against ``polled.cancelled``.

The C form reads trio's run context once per thread switch (its task again only when the
context's dict changed) and two fields of trio's task and cancel-status classes at their
slots; the reference reads the three attributes.  Both are run side by side wherever the
answer can differ: inside and outside a trio task, in cancelled and shielded scopes, from two
tasks and from two threads in their own runs taking turns, on a thread that finds a
finished thread's emptied context, and on objects of other classes (the generic look-up).  The
extension is compiled here into a temporary directory with the compiler ``stacklib compile``
uses; the tests skip, saying why, where there is none.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import pytest
import trio

from stacklib.unet import polled
from tests.c_extension import load_c_extension


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    module = load_c_extension(
        "unet/_trioprobe.c", tmp_path_factory.mktemp("trioprobe"), "the C cancellation test"
    )
    assert polled._RUN_CONTEXT is not None  # the installed trio has what both read
    run = trio._core._run
    offsets = module.install(polled._RUN_CONTEXT, run.Task, run.CancelStatus)
    assert min(offsets) >= 0  # trio's classes are slotted: the fields are read at their slots
    return module


def both(probe: ModuleType) -> tuple[bool, bool]:
    """(the C form's answer, the reference's: polled.cancelled's Python body)."""
    context = polled._RUN_CONTEXT
    try:
        task = context.task
    except AttributeError:
        python = True
    else:
        python = bool(task._cancel_status.effectively_cancelled)
    return probe.cancelled(), python


def test_outside_trio_both_send_the_caller_to_trio(probe: ModuleType) -> None:
    assert both(probe) == (True, True)


def test_inside_scopes_both_see_the_calling_tasks_status(probe: ModuleType) -> None:
    async def main() -> list[tuple[bool, bool]]:
        seen = [both(probe)]
        with trio.CancelScope() as scope:
            scope.cancel()
            seen.append(both(probe))
            with trio.CancelScope(shield=True):
                seen.append(both(probe))
                async with trio.open_nursery() as nursery:  # another task, its own status

                    async def child() -> None:
                        seen.append(both(probe))

                    nursery.start_soon(child)
        seen.append(both(probe))
        return seen

    assert trio.run(main) == [(False, False), (True, True)] + [(False, False)] * 3


def test_two_tasks_taking_turns_each_see_their_own_status(probe: ModuleType) -> None:
    """The task kept while the context dict is unchanged: trio writes the field at every
    switch, so each turn of two tasks in one thread sees its own."""
    seen: dict[str, list[tuple[bool, bool]]] = {"cancelled": [], "running": []}

    async def turns(name: str) -> None:
        with trio.CancelScope(shield=name == "running") as scope:
            if name == "cancelled":
                scope.cancel()
            for _ in range(20):
                seen[name].append(both(probe))
                seen[name].append(both(probe))  # twice in a turn: the kept task
                await trio.lowlevel.cancel_shielded_checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(turns, "cancelled")
            nursery.start_soon(turns, "running")

    trio.run(main)
    assert seen["cancelled"] == [(True, True)] * 40
    assert seen["running"] == [(False, False)] * 40


def test_two_threads_taking_turns_each_see_their_own_task(probe: ModuleType) -> None:
    turns = [threading.Semaphore(1), threading.Semaphore(0)]
    seen: dict[str, list[tuple[bool, bool]]] = {"cancelled": [], "running": []}

    def run(name: str, mine: int) -> None:
        async def main() -> None:
            with trio.CancelScope() as scope:
                if name == "cancelled":
                    scope.cancel()
                for _ in range(20):
                    turns[mine].acquire()
                    seen[name].append(both(probe))
                    turns[1 - mine].release()

        trio.run(main)
        seen[name].append(both(probe))  # after its run: outside trio

    threads = [
        threading.Thread(target=run, args=("cancelled", 0)),
        threading.Thread(target=run, args=("running", 1)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen["cancelled"] == [(True, True)] * 21
    assert seen["running"] == [(False, False)] * 20 + [(True, True)]


def test_one_thread_before_during_and_after_its_runs(probe: ModuleType) -> None:
    """The context dict cached in a run is the one trio empties at its end (then no task:
    looked up again) and fills in the next run."""

    async def main() -> tuple[bool, bool]:
        return both(probe)

    assert both(probe) == (True, True)
    assert trio.run(main) == (False, False)
    assert both(probe) == (True, True)
    assert trio.run(main) == (False, False)


def test_objects_of_other_classes_take_the_generic_look_up(probe: ModuleType) -> None:
    """Installed with classes that are not trio's (so no slot offsets apply to the real
    task), the C form reads the fields by name and still answers as the reference."""

    class Fake:
        pass

    try:
        assert probe.install(polled._RUN_CONTEXT, Fake, Fake) == (-1, -1)

        async def main() -> list[tuple[bool, bool]]:
            seen = [both(probe)]
            with trio.CancelScope() as scope:
                scope.cancel()
                seen.append(both(probe))
            return seen

        assert trio.run(main) == [(False, False), (True, True)]
    finally:
        run = trio._core._run
        probe.install(polled._RUN_CONTEXT, run.Task, run.CancelStatus)


def test_install_names_its_arguments(probe: ModuleType) -> None:
    with pytest.raises(TypeError, match="run context and the two classes"):
        probe.install(polled._RUN_CONTEXT, 3, 4)
    fake: Any = object()
    with pytest.raises(TypeError):
        probe.install(fake)
