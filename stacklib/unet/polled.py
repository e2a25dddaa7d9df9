"""NIs that the application's own calls drive: the real transports of today's machines.

A real transport has no NI processor of its own (the i960's role): the host does the NI's work
when the application sends or receives, or in a task that serves the NI.  :class:`PolledNI` is
that NI's shape (``progress`` moves what can move without blocking, ``idle_wait`` sleeps until
there may be more), and :class:`PolledEndpoint` the endpoint whose receive and send calls run
it.  Transports subclass both; the OS service creates the NI's ``endpoint_class``.
"""

from __future__ import annotations

import abc
import collections.abc
import os
import time
from collections.abc import Callable
from typing import Any, Final, cast

import attrs
import trio

from stacklib.compiled import mypyc_attr
from stacklib.unet.endpoint import Endpoint, Message
from stacklib.unet.ni import NetworkInterface
from stacklib.wire.descriptor import SendDescriptor


def _trio_has(wanted: dict[str, set[str]]) -> bool:
    """Whether each of trio's run classes named in ``wanted`` (attrs classes of
    ``trio._core._run``) has the fields given for it."""
    run_module = getattr(getattr(trio, "_core", None), "_run", None)
    for name, fields in wanted.items():
        try:
            found = {field.name for field in attrs.fields(getattr(run_module, name, None))}  # type: ignore[arg-type]
        except (TypeError, attrs.exceptions.NotAnAttrsClassError):
            return False
        if not fields <= found:
            return False
    return True


def _find_run_context() -> Any:
    """trio's per-thread run context if its tasks and runner have what :func:`cancel_point`
    reads (a few private fields, as the simulator's clock reads some: stacklib/sim/clock.py),
    else None: then :func:`cancel_point` always answers True and the caller awaits trio's own
    ``checkpoint_if_cancelled``, which is correct on any trio, only slower."""
    wanted = {
        "Task": {"_cancel_status", "_runner"},
        "CancelStatus": {"effectively_cancelled"},
        "Runner": {"ki_pending", "main_task"},
    }
    if not _trio_has(wanted):
        return None
    return getattr(getattr(getattr(trio, "_core", None), "_run", None), "GLOBAL_RUN_CONTEXT", None)


#: trio's run context, read by :func:`cancel_point` (None: a trio without the fields it reads).
_RUN_CONTEXT: Final[Any] = _find_run_context()


def _c_cancelled() -> Callable[[], bool] | None:
    """:func:`cancelled` in C (``_trioprobe.c``, built by ``stacklib compile`` into the
    compiled copy), set up with trio's run context and classes; None where it is not built."""
    if _RUN_CONTEXT is None:
        return None
    try:
        from stacklib.unet._trioprobe import cancelled as probe
        from stacklib.unet._trioprobe import install
    except ImportError:
        return None
    run_module = trio._core._run
    install(_RUN_CONTEXT, run_module.Task, run_module.CancelStatus)
    return probe


#: :func:`cancelled`'s C form where it is built (a third of an ``await`` that does not wait
#: is that test in Python: a thread-local's attribute and two attributes of trio's classes,
#: each through the generic look-up).
_C_CANCELLED: Final = _c_cancelled()


def _c_quick() -> Callable[..., Callable[..., Any]] | None:
    """``quick`` of ``_quickawait.c`` (built by ``stacklib compile`` into the compiled copy),
    its awaitables registered as :class:`collections.abc.Coroutine` (trio starts tasks only
    from coroutines); None where it is not built."""
    try:
        from stacklib.unet._quickawait import QuickAwait, quick
    except ImportError:
        return None
    collections.abc.Coroutine.register(QuickAwait)
    return quick


#: ``quick(fast, slow, test=None, method=None, arity=-1)``: a call whose ``call(obj, *args)``
#: is an awaitable with the result of ``fast(obj, *args)`` unless that is ``NotImplemented``
#: (or ``test()`` is true), else that of awaiting the coroutine ``slow(obj, *args)``
#: (``_quickawait.c``): an ``await`` that does not wait then makes no coroutine.  With
#: ``method``, the call is a method descriptor that stands in for that method in its class
#: (and passes it the calls it does not take: keywords, other than ``arity`` arguments).  None
#: where the C form is not built: the real transports' ``await`` calls are then their
#: coroutines.
QUICK: Final = _c_quick()


def cancel_point() -> bool:
    """The cheap half of a trio cancellation point, for a call that does not yield each time.

    Returns False when the calling trio task is not cancelled (nor, as the main task, owed a
    ``KeyboardInterrupt``).  Returns True otherwise, and also outside a trio task or on a trio
    without the fields this reads: the caller must then ``await
    trio.lowlevel.checkpoint_if_cancelled()``, which raises ``trio.Cancelled`` (or the
    interrupt, or ``RuntimeError`` outside trio).  The test ``checkpoint_if_cancelled`` makes,
    without building and awaiting a coroutine (some 0.15 us instead of 0.3: shm's whole
    round trip is a few us).  It does not count a cancellation point for
    ``trio.testing.assert_checkpoints``, which wants a schedule point too: a call that does
    not yield fails that check whatever it counts.
    """
    context = _RUN_CONTEXT
    if context is None:
        return True
    try:
        task = context.task
    except AttributeError:  # not in a trio task
        return True
    if task._cancel_status.effectively_cancelled:
        return True
    runner = task._runner
    return runner.ki_pending and task is runner.main_task


#: Whether :func:`others_runnable` can read trio's run queue (``Runner.runq``).
_RUNQ: Final = _RUN_CONTEXT is not None and _trio_has({"Runner": {"runq"}})


def others_runnable() -> bool:
    """Whether other trio tasks of this run are ready to run now (True too outside a trio
    task, or on a trio whose runner this cannot read): a task that would poll without yielding
    while it is the only one that can run should yield at once otherwise.  One length of
    trio's run queue, read without a call into trio."""
    if not _RUNQ:
        return True
    try:
        runner = _RUN_CONTEXT.runner
    except AttributeError:  # not in a trio run
        return True
    return bool(runner.runq)


def cancelled() -> bool:
    """:func:`cancel_point` without the keyboard-interrupt test: the cheaper test for the
    calls between two full ones.

    Returns False when the calling trio task is not cancelled; True when it is, and also
    outside a trio task or on a trio without the fields this reads (the caller then awaits
    ``trio.lowlevel.checkpoint_if_cancelled()``, as after :func:`cancel_point`).  A
    ``KeyboardInterrupt`` trio holds for the main task (one that arrived while trio's own code
    ran: elsewhere it is raised where the program is) is not seen: a caller that uses this
    must call :func:`cancel_point` at least every so many calls, and documents how many.  Some
    70-95 ns compiled against 95-130 for :func:`cancel_point` (three attribute reads of five).
    """
    if _C_CANCELLED is not None:
        return _C_CANCELLED()
    context = _RUN_CONTEXT
    if context is None:
        return True
    try:
        task = context.task
    except AttributeError:  # not in a trio task
        return True
    return bool(task._cancel_status.effectively_cancelled)


#: :func:`cancelled` as the quick calls' ``test``: its C form where built (called at its C
#: function, without a call through Python), else the function.
CANCELLED_TEST: Final[Callable[[], bool]] = _C_CANCELLED if _C_CANCELLED is not None else cancelled


class _YieldPolicy:
    """How often :func:`relax` gives the CPU away (a native attribute: read per empty poll)."""

    def __init__(self) -> None:
        self.mask = 63  # after empty polls whose count has these bits clear


_YIELD: Final = _YieldPolicy()


def yield_when_idle(on: bool) -> None:
    """Make :func:`relax` give the CPU away after every empty poll (``on``) or after 64 in a
    row (the default), for this whole process.

    For a process that shares its CPUs with more busy-polling processes than there are CPUs
    (the ranks of a program outnumbering the cores): each empty poll then lets another
    runnable process have the CPU at once, as an MPI library does when it finds its node
    oversubscribed, so a rank can keep polling, and answer without a wake-up, while the rank
    it waits for still gets the CPU it needs (docs/launching.md has the measurements).
    """
    _YIELD.mask = 0 if on else 63


def relax(spins: int) -> None:
    """Call from a busy-poll loop after each empty poll, with the count of empty polls since
    the last arrival (a count kept across arrivals would give the CPU away in the middle of a
    busy exchange, a system call on the round trip).

    The 64th empty poll in a row gives the CPU away (``sched_yield``): when both processes of a
    channel land on one CPU (2 cores and other load), the peer then runs within tens of
    microseconds instead of after a whole scheduler time slice.  Across CPUs it costs one
    system call per 64 empty polls, and none while messages flow.  After
    :func:`yield_when_idle`, every empty poll gives the CPU away.
    """
    if spins & _YIELD.mask == 0:
        os.sched_yield()


@mypyc_attr(allow_interpreted_subclasses=True)
class PolledNI(NetworkInterface):
    """An NI whose work is done by the host when asked: ``progress``, ``idle_wait``, ``serve``."""

    #: Seconds a waiting receiver polls (with checkpoints) before it sleeps in
    #: :meth:`idle_wait`; layers that wait on the NI themselves (UAM's lean path) read it.
    spin_time: float = 0.0
    #: Seconds a waiting receiver first polls *without* yielding to other trio tasks (a reply
    #: on a busy channel comes sooner than a scheduler pass takes); 0: none.
    hot_spin: float = 0.0

    @abc.abstractmethod
    def progress(self) -> int:
        """Deliver what has arrived and take what can be sent, without blocking; how much."""

    @abc.abstractmethod
    async def idle_wait(self) -> None:
        """Sleep until the NI may have something to do."""

    async def serve(self) -> None:
        """Run the NI in a task: deliver arrivals as they come (raising upcalls)."""
        while True:
            if not self.progress():
                await self.idle_wait()
            await trio.lowlevel.checkpoint()


@mypyc_attr(allow_interpreted_subclasses=True)
class PolledEndpoint(Endpoint):
    """An endpoint whose receive and send calls run its :class:`PolledNI`."""

    @property
    def polled_ni(self) -> PolledNI:
        """This endpoint's NI, typed (a compiled class may not narrow an inherited
        attribute's type, so subclasses narrow ``ni`` and this base uses this)."""
        return cast(PolledNI, self.ni)

    def poll(self) -> Message | None:
        if not self.recv_queue:
            self.polled_ni.progress()
        return super().poll()

    def send_nowait(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        try:
            return super().send_nowait(channel, data, dest_offset=dest_offset)
        except trio.WouldBlock:
            self.polled_ni.progress()
            return super().send_nowait(channel, data, dest_offset=dest_offset)

    async def send(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                descriptor = self.send_nowait(channel, data, dest_offset=dest_offset)
            except trio.WouldBlock:
                await self.polled_ni.idle_wait()
            else:
                break
        await trio.lowlevel.cancel_shielded_checkpoint()
        return descriptor

    async def recv(self) -> Message:
        """Wait for a message: poll for the NI's ``spin_time`` seconds with checkpoints (giving
        the CPU away now and then, :func:`relax`), then sleep in ``idle_wait``."""
        await trio.lowlevel.checkpoint_if_cancelled()
        message = self.poll()
        if message is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return message
        ni = self.polled_ni
        deadline = time.perf_counter() + ni.spin_time if ni.spin_time else 0.0
        spins = 0
        while message is None:
            self.check_open()
            if deadline and time.perf_counter() < deadline:
                spins += 1
                relax(spins)  # a peer sharing this CPU runs now, not after our time slice
                await trio.lowlevel.checkpoint()
            else:
                await ni.idle_wait()
            message = self.poll()
        return message
