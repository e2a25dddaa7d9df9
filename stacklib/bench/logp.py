"""LogP parameters by the method of paper 004 §4.1 and Fig 3 (after Culler et al., its ref [8]).

Per message size, with node 0 timing everything on its own clock:

* ``RTT/2``: half the mean round trip of a ping-pong (Fig 3(a)).
* ``g``: the steady-state interval between the ends of successive sends while node 0 sends ``N``
  messages back to back and node 1 consumes them (Fig 3(b) with ``D = 0``).  Steady state: the
  second half of the sends (:func:`steady_interval`).
* ``Os`` by delay injection (Fig 3(b)): node 0 computes for ``D`` after each send; the interval
  is ``g(D) = Os + max(Idle, D)``.  ``D`` is swept over ``delay_factors x g``; every point where
  ``g(D)`` grew past ``g(0)`` lies on the slope-1 part, and ``Os`` is the mean of ``g(D) - D``
  over those points (§4.1.3, :func:`fit_delays`).
* ``Or`` the same way at the receiver (Fig 3(c), used for BIP, FM and PM): node 1 streams,
  node 0 computes for ``D`` after each receive, ``g(D) = Or + max(Idle, D)`` (§4.1.4).
* ``gr``: the receive gap, the steady interval between successive receives of that stream with
  ``D = 0`` (the receiver's counterpart of ``g``; none for request-reply).
* ``request_reply`` stacks (AM-style: each request is answered inside the library, so the sender
  also pays for replies): the Fig 3(b) sweep gives ``g(D) = Os + Or + max(Idle, D)``; ``Os`` is
  then timed directly on a burst of ``burst`` sends short enough that no reply arrives during it
  (§4.1.3, "N is below the network's buffering capacity"), and ``Or = intercept - Os``, which
  is the paper's ``Or = g(0) - Os - Idle`` with ``Idle = g(0) - intercept``.
* ``L = RTT/2 - Os - Or`` (§4.1.5).

"Computation" must occupy the CPU the stack's overheads are charged to, so that they contend as
on a real host: :func:`compute` holds the host's ``"cpu"`` resource under a simulation and
busy-waits in real time.  (In real time over an in-process transport both nodes share one
Python thread, so node 0's busy-wait stalls node 1 as well; the in-process numbers are then a
single-CPU system's.)  Which stage of the path lands in which parameter depends on the stack,
as paper 004 Table 3 shows for its five libraries; the method only finds where the host CPU is
busy.
"""

from __future__ import annotations

import math
import statistics
import time
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from stacklib.bench.bandwidth import CONTROL_SIZE, Leader, check_sizes, open_harness
from stacklib.bench.params import count_valid, sizes_valid
from stacklib.bench.result import Cell, Column, Result
from stacklib.bench.workload import WorkloadKind, register_workload
from stacklib.reporting import progress
from stacklib.services import DatagramService
from stacklib.sim import Host, World

if TYPE_CHECKING:
    from stacklib.bench import Session

__all__ = [
    "CPU",
    "DelayFit",
    "LogPParams",
    "compute",
    "fit_delays",
    "logp",
    "run_logp",
    "session_host",
    "steady_interval",
]

#: The host resource a computation occupies; cost profiles charge host overheads to it.
CPU = "cpu"


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _float_tuple(value: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


def _factors_valid(
    instance: object, attribute: attrs.Attribute[tuple[float, ...]], value: tuple[float, ...]
) -> None:
    if not value:
        raise ValueError("delay_factors must not be empty")
    if any(not 0.0 < f < math.inf for f in value):
        raise ValueError("delay_factors must be finite and > 0")


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and > 0, not {value!r}")


@attrs.frozen
class LogPParams:
    """Recipe parameters of the LogP workload."""

    #: Message sizes in bytes (paper 004 Figs 4-8 span 4 bytes to 4 Kbytes).
    sizes: tuple[int, ...] = attrs.field(
        default=(4, 16, 64, 256, 1024, 4096), converter=_int_tuple, validator=sizes_valid
    )
    #: Ping-pong round trips for RTT/2.
    iterations: int = attrs.field(default=200, validator=count_valid(1))
    #: Messages per stream (g and each point of a delay sweep); at least 4.
    messages: int = attrs.field(default=200, validator=count_valid(4))
    #: Untimed ping-pong round trips before RTT/2.
    warmup: int = attrs.field(default=10, validator=count_valid(0))
    #: Delays D of a sweep, as multiples of the interval measured with D = 0.  Any D above that
    #: interval exceeds Idle, so factors > 1 always reach the slope-1 part.
    delay_factors: tuple[float, ...] = attrs.field(
        default=(0.5, 1.0, 1.5, 2.0, 3.0), converter=_float_tuple, validator=_factors_valid
    )
    #: g(D) "grew" when it exceeds g(0) by more than this fraction (guards against noise).
    threshold: float = attrs.field(default=0.02, validator=attrs.validators.ge(0.0))
    #: The stack answers each message inside the library (Active Messages): see the module doc.
    request_reply: bool = False
    #: request_reply: sends timed for Os, few enough that no reply arrives meanwhile.
    burst: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    #: Seconds without an arrival after which a receiver stops waiting (message loss).
    timeout: float = attrs.field(default=0.5, validator=_positive)
    #: Resends of an unanswered control message before the peer is declared unresponsive.
    retries: int = attrs.field(default=3, validator=attrs.validators.ge(0))


async def compute(session_or_world: Session | World, host: Host | None, seconds: float) -> None:
    """Keep ``host``'s CPU busy for ``seconds``: paper 004 Fig 3's ``Spin(D)``.

    Under a simulation this holds the host's ``"cpu"`` resource, queueing FIFO with the send
    and receive overheads the cost profile charges there; in real time it busy-waits on
    :func:`time.perf_counter` without yielding, as a computation would.
    """
    world = session_or_world if isinstance(session_or_world, World) else session_or_world.world
    if not seconds > 0.0:
        return
    if world.virtual:
        if host is None:
            raise ValueError("a simulated computation needs the host whose CPU it occupies")
        await host.resource(CPU).use(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def session_host(session: Session, index: int) -> Host | None:
    """The host of node ``index`` of a session's network, if the transport exposes nodes."""
    nodes = getattr(session.network, "nodes", None)
    if not isinstance(nodes, Mapping) or index >= len(nodes):
        return None
    host = getattr(list(nodes.values())[index], "host", None)
    return host if isinstance(host, Host) else None


def steady_interval(times: Sequence[float], skip: float = 0.5) -> float | None:
    """Mean interval between successive timestamps after the first ``skip`` fraction.

    Skipping the start leaves out the transient while queues fill (paper 004 §4.1.2: "N large
    enough for the interval to reach its asymptotic limit").  None with fewer than 2 times.
    """
    count = len(times)
    if count < 2:
        return None
    first = min(int(count * skip), count - 2)
    return (times[-1] - times[first]) / (count - 1 - first)


@attrs.frozen
class DelayFit:
    """The slope-1 part of a delay sweep ``g(D) = X + max(Idle, D)``."""

    #: The mean of ``g(D) - D`` over :attr:`points`: X (Os, Or, or Os + Or); None if no point.
    intercept: float | None
    #: The (D, g(D)) points where g(D) grew past g(0).
    points: tuple[tuple[float, float], ...]
    #: Least-squares slope of g over :attr:`points` (1 when the model holds); None below 2.
    slope: float | None

    def idle(self, g0: float) -> float | None:
        """``Idle = g(0) - X``."""
        return None if self.intercept is None else g0 - self.intercept


def fit_delays(
    g0: float, points: Sequence[tuple[float, float | None]], threshold: float = 0.02
) -> DelayFit:
    """Paper 004 §4.1.3: average ``g(D) - D`` over the ``D`` with ``g(D) > g(0)``.

    A point counts as grown when ``g(D) > g0 * (1 + threshold)``.
    """
    grown = tuple(
        (d, g) for d, g in points if g is not None and g > g0 * (1.0 + threshold) and d > 0.0
    )
    if not grown:
        return DelayFit(None, (), None)
    intercept = statistics.fmean(g - d for d, g in grown)
    slope = None
    if len({d for d, _ in grown}) >= 2:
        slope = statistics.linear_regression([d for d, _ in grown], [g for _, g in grown]).slope
    return DelayFit(intercept, grown, slope)


async def _sweep(
    leader: Leader,
    size: int,
    params: LogPParams,
    g0: float,
    spin: typing.Callable[[float], typing.Awaitable[None]],
    *,
    at_receiver: bool,
) -> tuple[DelayFit, int]:
    points: list[tuple[float, float | None]] = []
    lost = 0
    for factor in params.delay_factors:
        delay = factor * g0
        if at_receiver:
            out = await leader.receive_stream(params.messages, size, delay, spin)
            points.append((delay, steady_interval(out.recv_times)))
            lost += params.messages - len(out.recv_times)
        else:
            out = await leader.send_stream(params.messages, size, delay, spin)
            points.append((delay, steady_interval(out.send_times)))
            lost += params.messages - (out.peer_count or 0)
    return fit_delays(g0, points, params.threshold), lost


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


async def _measure(
    leader: Leader,
    size: int,
    params: LogPParams,
    spin: typing.Callable[[float], typing.Awaitable[None]],
    notes: list[str],
) -> tuple[dict[str, Cell], int]:
    if params.warmup:
        await leader.echo(params.warmup, size)
    echo = await leader.echo(params.iterations, size)
    rtt_half = statistics.fmean(echo.rtts) / 2 if echo.rtts else None
    lost = echo.attempted - len(echo.rtts)

    stream = await leader.send_stream(params.messages, size)
    lost += params.messages - (stream.peer_count or 0)
    g = steady_interval(stream.send_times)
    os_ = or_ = None
    if g is not None and g > 0.0:
        fit, more = await _sweep(leader, size, params, g, spin, at_receiver=False)
        lost += more
        if fit.intercept is None:
            notes.append(f"size {size}: no delay raised g(D) above g(0); raise delay_factors")
        elif params.request_reply:
            burst = await leader.send_stream(params.burst, size)
            os_ = (burst.send_times[-1] - burst.start) / params.burst
            or_ = fit.intercept - os_
        else:
            os_ = fit.intercept
    gr = None
    if not params.request_reply:
        stream = await leader.receive_stream(params.messages, size)
        lost += params.messages - len(stream.recv_times)
        gr = steady_interval(stream.recv_times)
        if gr is not None and gr > 0.0:
            fit, more = await _sweep(leader, size, params, gr, spin, at_receiver=True)
            lost += more
            or_ = fit.intercept
            if or_ is None:
                notes.append(f"size {size}: no delay raised the receive interval; Or unknown")
    latency = None
    if rtt_half is not None and os_ is not None and or_ is not None:
        latency = rtt_half - os_ - or_
    row: dict[str, Cell] = {
        "size": size,
        "rtt_half_us": _us(rtt_half),
        "os_us": _us(os_),
        "or_us": _us(or_),
        "g_us": _us(g),
        "gr_us": _us(gr),
        "l_us": _us(latency),
    }
    return row, lost


async def logp(
    client: DatagramService,
    server: DatagramService,
    peer: int,
    params: LogPParams,
    *,
    world: World,
    host: Host | None,
) -> Result:
    """Measure LogP from ``client`` (on ``host``, in ``world``) to ``server`` (``peer``)."""
    if world.virtual and host is None:
        raise ValueError("LogP in a simulation needs node 0's host to charge computation to")

    async def spin(seconds: float) -> None:
        await compute(world, host, seconds)

    wall_start = time.perf_counter()
    rows: list[dict[str, Cell]] = []
    notes: list[str] = []
    lost = 0
    check_sizes(client, params.sizes)
    async with open_harness(client, server, peer, params.timeout, params.retries) as leader:
        with progress.step("sizes", len(params.sizes)) as sweep:
            for size in params.sizes:
                row, more = await _measure(leader, size, params, spin, notes)
                rows.append(row)
                lost += more
                sweep.advance()
    notes.append(
        "L = RTT/2 - Os - Or (paper 004 §4.1.5); Os, Or by delay injection, g(D) = "
        + ("Os + Or + max(Idle, D)" if params.request_reply else "O + max(Idle, D)")
        + " (paper 004 Fig 3, §4.1.3-4)"
    )
    return Result(
        title="LogP parameters vs message size (paper 004 §4.1)",
        columns=[
            Column("size", "size", "bytes"),
            Column("rtt_half_us", "RTT/2", "us", 2),
            Column("os_us", "Os", "us", 2),
            Column("or_us", "Or", "us", 2),
            Column("g_us", "g", "us", 2),
            Column("gr_us", "gr", "us", 2),
            Column("l_us", "L", "us", 2),
        ],
        rows=rows,
        facts={
            "method": "request-reply (AM)" if params.request_reply else "separate (Fig 3 b, c)",
            "messages_per_stream": params.messages,
            "messages_lost": lost,
            "control_message_bytes": CONTROL_SIZE,
            "wall_seconds": time.perf_counter() - wall_start,
        },
        notes=notes,
    )


async def run_logp(session: Session, params: LogPParams) -> Result:
    """The ``logp`` workload: node 0 measures towards node 1."""
    # The recipe loader checked that the stack's top provides DatagramService.
    client = typing.cast(DatagramService, session.services[0])
    server = typing.cast(DatagramService, session.services[1])
    return await logp(
        client,
        server,
        session.peers[0][1],
        params,
        world=session.world,
        host=session_host(session, 0),
    )


LOGP = register_workload(
    WorkloadKind(
        name="logp",
        Params=LogPParams,
        run=run_logp,
        description="LogP parameters (RTT/2, Os, Or, g, L) vs message size by delay injection",
    )
)
