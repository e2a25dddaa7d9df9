"""Bandwidth against message size, three ways (paper 004 §4.2 and Fig 9; paper 000 Fig 4).

* ``unidirectional`` (paper 004 Fig 9(b), paper 000 Fig 4 "raw U-Net"): node 0 sends ``N``
  messages of ``s`` bytes back to back; node 1 counts them and, once it has all ``N`` (or none
  arrived for ``timeout`` seconds), replies once with its count.  With ``t0`` the start of the
  first send, ``t1`` the arrival of that reply, ``w`` the one-way time of a small message (half
  the minimum round trip of ``probes`` control messages) and ``h`` how long node 1 held the reply
  after its last arrival (0 unless messages were lost)::

      delivered MB/s = received * s / (t1 - w - h - t0) / 1e6

  the rate the receiver consumed data at, as paper 000 §7.6 reports "bandwidth ... as actually
  received".  Each row also gives the paper 004 Fig 9(b) figure, timed at the sender alone:
  ``sender MB/s = N * s / (end of the N-th send - t0) / 1e6`` (the reciprocal of ``g``, scaled).
* ``pingpong`` (bidirectional ping-pong, paper 004 Fig 9(a)): one message in flight, alternately
  in each direction; each node waits after sending until it receives.  Over ``N`` round trips
  ``MB/s = 2 * N * s / (sum of round-trip times) / 1e6 = s / (RTT/2)``: "the reciprocal of
  RTT/2, scaled appropriately".
* ``simultaneous`` (bidirectional simultaneous, paper 004 Fig 9(c)): both nodes send ``N``
  messages and count what they receive, at the same time.  ``window`` bounds how far a node's
  sends run ahead of its receives: 1 (the default) is Fig 9(c)'s loop "SendMsg(); RecvMsg()"
  on each node, 0 lets both stream freely.  The figure is the aggregate of both directions over
  the time from node 1's start (the arrival of its start acknowledgment minus ``w``) to when the
  later of the two receivers finished (node 1's finish estimated from its reply as above).

MB/s are 10^6 bytes per second, Mbit/s 10^6 bits per second.  Time is trio's, so the same code
measures virtual time under a :class:`~stacklib.sim.Simulation` and real time otherwise.

Loss.  Raw U-Net drops a message when the receiver's buffers run out, and nothing here paces the
sender: a receiver counts what arrives and stops waiting after ``timeout`` seconds without an
arrival, and the rows report what was lost.  That wait is never part of a figure: the
follower's reply says how long it held the count after its last arrival (``h`` above),
measured when each reply is sent, so a lost reply and its resend do not count either.
Control messages (start, probe, end-of-run request) are retried ``retries`` times; a ping-pong
round trip that times out ends that size's ping-pong run (its late reply, if any, is recognised
as stale and dropped).

The harness (:class:`Leader` on node 0, :class:`Follower` on node 1) is shared with
:mod:`stacklib.bench.logp`.  Its control messages are ``CONTROL_SIZE`` (24) bytes starting with
0xFF; data messages of at least one byte start with a per-run tag that is never 0xFF, so stale
data from an abandoned run is recognised (zero-byte data cannot be).
"""

from __future__ import annotations

import enum
import math
import struct
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

import attrs
import trio

from stacklib.bench.params import check_sizes as _check_sizes
from stacklib.bench.params import count_valid, sizes_valid
from stacklib.bench.result import Cell, Column, Result
from stacklib.bench.workload import WorkloadKind, register_workload
from stacklib.errors import PeerUnreachable
from stacklib.reporting import progress
from stacklib.services import DatagramService

if TYPE_CHECKING:
    from stacklib.bench import Session

__all__ = [
    "CONTROL_SIZE",
    "BandwidthParams",
    "Follower",
    "Leader",
    "Mode",
    "PeerUnresponsive",
    "StreamOutcome",
    "bandwidth",
    "check_sizes",
    "open_harness",
    "run_bandwidth",
]

Mode = Literal["unidirectional", "pingpong", "simultaneous"]
MODES: tuple[Mode, ...] = ("unidirectional", "pingpong", "simultaneous")

#: Something that occupies the calling node's CPU for a number of seconds (see logp.compute).
Compute = Callable[[float], Awaitable[None]]


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _mode_tuple(value: Iterable[Mode]) -> tuple[Mode, ...]:
    return tuple(value)


def _modes_valid(
    instance: object, attribute: attrs.Attribute[tuple[Mode, ...]], value: tuple[Mode, ...]
) -> None:
    if not value:
        raise ValueError("modes must not be empty")
    unknown = [mode for mode in value if mode not in MODES]
    if unknown:
        raise ValueError(f"unknown bandwidth mode {unknown[0]!r} (known: {', '.join(MODES)})")


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < value < math.inf:
        raise ValueError(f"{attribute.name} must be finite and > 0, not {value!r}")


@attrs.frozen
class BandwidthParams:
    """Recipe parameters of the bandwidth workload."""

    #: Message sizes in bytes (paper 000 Fig 4 spans 4 bytes to 5 Kbytes).
    sizes: tuple[int, ...] = attrs.field(
        default=(4, 16, 64, 256, 1024, 2048, 4096, 8192),
        converter=_int_tuple,
        validator=sizes_valid,
    )
    #: Messages per size and direction (round trips in ping-pong mode).
    messages: int = attrs.field(default=1000, validator=count_valid(1))
    #: Untimed messages of the same mode and size before each measurement.
    warmup: int = attrs.field(default=20, validator=count_valid(0))
    modes: tuple[Mode, ...] = attrs.field(
        default=MODES, converter=_mode_tuple, validator=_modes_valid
    )
    #: simultaneous: how far each node's sends may run ahead of what it has received.  1 is
    #: paper 004 Fig 9(c), where each node loops "SendMsg(); RecvMsg()"; 0 lets both stream.
    window: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    #: Seconds without an arrival after which a receiver stops waiting (message loss).
    timeout: float = attrs.field(default=0.5, validator=_positive)
    #: Control round trips that measure the small-message one-way time (the minimum is kept).
    probes: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    #: Resends of an unanswered control message before the peer is declared unresponsive.
    retries: int = attrs.field(default=3, validator=attrs.validators.ge(0))


class PeerUnresponsive(PeerUnreachable):
    """The other node did not answer a control message, even after retries."""


# --------------------------------------------------------------------------- wire

#: First byte of every control message; a data message's first byte (its tag) is never this.
_MAGIC = 0xFF
#: magic, op, phase, a (N, or a count), b (a size, or a count), c (a window), hold (seconds).
_CONTROL = struct.Struct("!BBHIIId")
CONTROL_SIZE = _CONTROL.size


class _Op(enum.IntEnum):
    BEGIN_ECHO = 1  # follower echoes data
    BEGIN_COUNT = 2  # follower counts N data messages, then replies COUNT
    BEGIN_STREAM = 3  # follower sends N (within a window) and counts N, then replies COUNT
    BEGIN_SEND = 4  # follower sends N, counts nothing
    ACK = 5
    PING = 6
    PONG = 7
    END = 8  # leader asks for the COUNT again
    COUNT = 9  # a: messages the follower counted, b: messages it sent
    BUSY = 10  # follower still counting: ask again later


_BEGINS = {_Op.BEGIN_ECHO, _Op.BEGIN_COUNT, _Op.BEGIN_STREAM, _Op.BEGIN_SEND}


@attrs.frozen(slots=True)
class _Control:
    op: _Op
    phase: int
    a: int = 0
    b: int = 0
    c: int = 0
    hold: float = 0.0

    def pack(self) -> bytes:
        return _CONTROL.pack(_MAGIC, self.op, self.phase, self.a, self.b, self.c, self.hold)


def _parse_control(data: bytes) -> _Control | None:
    if len(data) != CONTROL_SIZE or data[0] != _MAGIC:
        return None
    _, op, phase, a, b, c, hold = _CONTROL.unpack(data)
    try:
        return _Control(_Op(op), phase, a, b, c, hold)
    except ValueError:
        return None


def _tag(phase: int) -> int:
    return phase % _MAGIC


def _data(phase: int, size: int) -> bytes:
    if size == 0:
        return b""
    body = bytes(i & 0xFF for i in range(1, size))
    return bytes([_tag(phase)]) + body


def _is_data(data: bytes, phase: int, size: int) -> bool:
    """Whether ``data`` is a data message of the run ``phase`` (of ``size`` bytes)."""
    if len(data) != size:
        return False
    return size == 0 or data[0] == _tag(phase)


class _Window:
    """Keeps a node's sender at most ``size`` messages ahead of what the node has received
    (0: no limit).  With 1 each node alternates send and receive, paper 004 Fig 9(c)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.received = 0
        self.sent = 0
        self.closed = False
        #: Set when :meth:`send_all` has returned.
        self.finished = trio.Event()
        self._event = trio.Event()

    def arrived(self) -> None:
        self.received += 1
        self._wake()

    def close(self) -> None:
        """The receive side is done: a sender still waiting for its turn stops."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def send_all(self, service: DatagramService, peer: int, message: bytes, n: int) -> None:
        """Send ``n`` copies of ``message`` as the window allows."""
        try:
            send = service.send
            for index in range(n):
                if self.size:
                    while self.received <= index - self.size:
                        if self.closed:
                            return
                        await self._event.wait()
                await send(peer, message)
                self.sent += 1
        finally:
            self.finished.set()


# --------------------------------------------------------------------------- follower


class Follower:
    """Node 1's side of the harness: obeys the leader's control messages, forever."""

    def __init__(self, service: DatagramService, timeout: float) -> None:
        self.service = service
        self.timeout = timeout
        self._peer = -1
        self._phase = -1
        self._op = _Op.BEGIN_ECHO
        self._n = 0
        self._size = 0
        self._counting = False
        self._done = False
        self._count = 0
        self._last = 0.0
        self._sender = trio.CancelScope()
        self._sender_started = False
        self._window = _Window(0)

    async def serve(self) -> None:
        now = trio.current_time
        async with trio.open_nursery() as nursery:
            while True:
                deadline = self._last + self.timeout if self._counting else math.inf
                received: tuple[int, bytes] | None = None
                with trio.move_on_at(deadline):
                    received = await self.service.recv()
                if received is None:
                    # Nothing for ``timeout`` seconds: the rest was lost; report what came.
                    await self._finish()
                    continue
                peer, data = received
                if self._counting and _is_data(data, self._phase, self._size):
                    self._count += 1
                    self._last = now()
                    self._window.arrived()
                    if self._count >= self._n:
                        await self._finish()
                    continue
                if self._op is _Op.BEGIN_ECHO and _is_data(data, self._phase, self._size):
                    await self.service.send(peer, data)
                    continue
                control = _parse_control(data)
                if control is not None:
                    await self._on_control(peer, control, nursery)
                # Anything else is stale data of an abandoned run: ignore it.

    async def _on_control(self, peer: int, control: _Control, nursery: trio.Nursery) -> None:
        op = control.op
        if op in _BEGINS:
            if control.phase != self._phase:  # not a resend of the current start
                self._start(peer, control)
            await self._reply(_Control(_Op.ACK, control.phase))
            if op in (_Op.BEGIN_STREAM, _Op.BEGIN_SEND) and not self._sender_started:
                # After the ACK, so the leader can time our start from it.
                self._sender_started = True
                nursery.start_soon(self._stream, self._sender, _data(self._phase, self._size))
        elif op is _Op.PING:
            await self.service.send(peer, _Control(_Op.PONG, control.phase).pack())
        elif op is _Op.END and control.phase == self._phase:
            if self._done:
                await self._reply(self._count_reply())
            else:
                await self._reply(_Control(_Op.BUSY, self._phase))

    def _start(self, peer: int, control: _Control) -> None:
        self._sender.cancel()  # an abandoned run's stream, if still going
        self._sender = trio.CancelScope()
        self._sender_started = False
        self._peer = peer
        self._phase = control.phase
        self._op = control.op
        self._n = control.a
        self._size = control.b
        self._count = 0
        self._done = False
        self._counting = control.op in (_Op.BEGIN_COUNT, _Op.BEGIN_STREAM)
        self._last = trio.current_time()
        self._window = _Window(control.c if control.op is _Op.BEGIN_STREAM else 0)

    async def _stream(self, scope: trio.CancelScope, message: bytes) -> None:
        with scope:
            await self._window.send_all(self.service, self._peer, message, self._n)

    def _count_reply(self) -> _Control:
        # The hold runs to this reply's sending, not the first one's: when the first COUNT is
        # lost the leader times the one answering its END, and a hold fixed at the first
        # would leave that wait (``timeout``) inside the measured transfer.
        hold = trio.current_time() - self._last
        return _Control(_Op.COUNT, self._phase, self._count, self._window.sent, hold=hold)

    async def _finish(self) -> None:
        self._counting = False
        self._window.close()
        if self._sender_started:
            # Report once our own stream is out too, so the count of what we sent is final;
            # the hold covers the wait.
            await self._window.finished.wait()
        self._done = True
        await self._reply(self._count_reply())

    async def _reply(self, control: _Control) -> None:
        await self.service.send(self._peer, control.pack())


# --------------------------------------------------------------------------- leader


@attrs.frozen
class StreamOutcome:
    """What the leader saw of one streaming run (times on trio's clock, in seconds)."""

    #: Start of the leader's first send, or the ACK's arrival if the leader does not send.
    start: float
    #: Arrival of the follower's start acknowledgment.
    ack_at: float
    #: Messages the leader sent.
    sent: int
    #: End of each of the leader's sends (streams without a window).
    send_times: tuple[float, ...]
    #: Each data arrival the leader counted (after its receive returned, before any compute).
    recv_times: tuple[float, ...]
    #: What the follower counted, when it counts, and what it sent.
    peer_count: int | None = None
    peer_sent: int = 0
    #: Arrival of the follower's COUNT reply, and how long it held that reply after its last
    #: arrival (its own clock, a duration).
    reply_at: float | None = None
    peer_hold: float = 0.0

    def peer_done(self, one_way: float) -> float | None:
        """When the follower consumed its last message: reply arrival - one way - hold."""
        if self.reply_at is None:
            return None
        return self.reply_at - one_way - self.peer_hold


@attrs.frozen
class EchoOutcome:
    """A ping-pong run: the round-trip times of the round trips that completed."""

    attempted: int
    rtts: tuple[float, ...]


class Leader:
    """Node 0's side of the harness: runs measurements, the follower obliges."""

    def __init__(
        self, service: DatagramService, peer: int, timeout: float, retries: int = 3
    ) -> None:
        self.service = service
        self.peer = peer
        self.timeout = timeout
        self.retries = retries
        self._phase = 0

    def _next_phase(self) -> int:
        self._phase = (self._phase + 1) & 0xFFFF
        return self._phase

    async def _request(self, control: _Control, answer: _Op) -> tuple[_Control, float]:
        """Send ``control`` until ``answer`` for its phase arrives; its arrival time."""
        packed = control.pack()
        for _ in range(self.retries + 1):
            await self.service.send(self.peer, packed)
            with trio.move_on_after(self.timeout):
                while True:
                    _, data = await self.service.recv()
                    reply = _parse_control(data)
                    if reply is not None and reply.op is answer and reply.phase == control.phase:
                        return reply, trio.current_time()
        raise PeerUnresponsive(
            f"no {answer.name} to {control.op.name} after {self.retries + 1} tries "
            f"of {self.timeout} s"
        )

    async def _begin(self, op: _Op, n: int, size: int, window: int = 0) -> tuple[int, float]:
        phase = self._next_phase()
        _, at = await self._request(_Control(op, phase, n, size, window), _Op.ACK)
        return phase, at

    async def one_way(self, probes: int) -> float:
        """Half the minimum round trip of ``probes`` control messages: a small one-way time."""
        best = math.inf
        for _ in range(probes):
            phase = self._next_phase()
            start = trio.current_time()
            _, at = await self._request(_Control(_Op.PING, phase), _Op.PONG)
            best = min(best, at - start)
        return best / 2

    async def echo(self, n: int, size: int) -> EchoOutcome:
        """``n`` round trips of ``size``-byte messages, each timed (paper 004 Fig 3(a))."""
        phase, _ = await self._begin(_Op.BEGIN_ECHO, 0, size)
        message = _data(phase, size)
        send, recv, now = self.service.send, self.service.recv, trio.current_time
        rtts: list[float] = []
        for attempt in range(n):
            start = now()
            await send(self.peer, message)
            with trio.move_on_after(self.timeout) as scope:
                while not _is_data((await recv())[1], phase, size):
                    pass
            if scope.cancelled_caught:
                return EchoOutcome(attempt + 1, tuple(rtts))
            rtts.append(now() - start)
        return EchoOutcome(n, tuple(rtts))

    async def send_stream(
        self, n: int, size: int, delay: float = 0.0, compute: Compute | None = None
    ) -> StreamOutcome:
        """Send ``n`` messages, computing ``delay`` seconds after each; the follower counts."""
        phase, ack_at = await self._begin(_Op.BEGIN_COUNT, n, size)
        message = _data(phase, size)
        send, peer, now = self.service.send, self.peer, trio.current_time
        times: list[float] = []
        start = now()
        for _ in range(n):
            await send(peer, message)
            times.append(now())
            if delay and compute is not None:
                await compute(delay)
        _, reply = await self._collect(phase, size, 0, want_count=True)
        return self._outcome(start, ack_at, n, times, [], reply)

    async def receive_stream(
        self, n: int, size: int, delay: float = 0.0, compute: Compute | None = None
    ) -> StreamOutcome:
        """The follower sends ``n`` messages; count them, computing ``delay`` after each."""
        phase, ack_at = await self._begin(_Op.BEGIN_SEND, n, size)
        times, _ = await self._collect(phase, size, n, delay=delay, compute=compute)
        return self._outcome(ack_at, ack_at, 0, [], times, None)

    async def exchange(self, n: int, size: int, window: int = 0) -> StreamOutcome:
        """Both nodes send ``n`` messages, each at most ``window`` ahead of what it received
        (0: no limit), and count what they receive."""
        phase, ack_at = await self._begin(_Op.BEGIN_STREAM, n, size, window)
        credit = _Window(window)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(credit.send_all, self.service, self.peer, _data(phase, size), n)
            received, reply = await self._collect(phase, size, n, want_count=True, window=credit)
        return self._outcome(start, ack_at, credit.sent, [], received, reply)

    @staticmethod
    def _outcome(
        start: float,
        ack_at: float,
        sent: int,
        send_times: list[float],
        recv_times: list[float],
        reply: tuple[_Control, float] | None,
    ) -> StreamOutcome:
        if reply is None:
            return StreamOutcome(start, ack_at, sent, tuple(send_times), tuple(recv_times))
        control, reply_at = reply
        return StreamOutcome(
            start,
            ack_at,
            sent,
            tuple(send_times),
            tuple(recv_times),
            peer_count=control.a,
            peer_sent=control.b,
            reply_at=reply_at,
            peer_hold=control.hold,
        )

    async def _collect(
        self,
        phase: int,
        size: int,
        n: int,
        *,
        want_count: bool = False,
        delay: float = 0.0,
        compute: Compute | None = None,
        window: _Window | None = None,
    ) -> tuple[list[float], tuple[_Control, float] | None]:
        """Count up to ``n`` data messages of ``phase`` (until ``timeout`` passes without one)
        and, if ``want_count``, wait for the follower's COUNT, asking again with END when it is
        silent for ``timeout``.  Returns the arrival times and the COUNT with its arrival."""
        recv, now = self.service.recv, trio.current_time
        times: list[float] = []
        counting = n > 0
        reply: tuple[_Control, float] | None = None
        last = now()  # the last sign of life: a counted arrival, or a BUSY
        silent = 0
        while counting or (want_count and reply is None):
            received: tuple[int, bytes] | None = None
            with trio.move_on_at(last + self.timeout):
                received = await recv()
            if received is None:
                if counting:
                    counting = False  # the rest of the stream was lost
                    if window is not None:
                        window.close()
                else:
                    silent += 1
                    if silent > self.retries:
                        raise PeerUnresponsive(f"no COUNT for run {phase} from the follower")
                    await self.service.send(self.peer, _Control(_Op.END, phase).pack())
                last = now()
                continue
            data = received[1]
            if counting and _is_data(data, phase, size):
                last = now()
                times.append(last)
                if window is not None:
                    window.arrived()
                if len(times) >= n:
                    counting = False
                if delay and compute is not None:
                    await compute(delay)
                continue
            control = _parse_control(data)
            if control is None or control.phase != phase:
                continue
            if control.op is _Op.COUNT:
                reply = (control, now())
            elif control.op is _Op.BUSY:
                silent = 0
                last = now()
        return times, reply


def check_sizes(service: DatagramService, sizes: Iterable[int]) -> None:
    """Refuse sizes the stack cannot carry (and stacks too small for control messages) with a
    :class:`~stacklib.errors.ConfigError` naming the size and the limit."""
    _check_sizes(sizes, service.max_message, control=CONTROL_SIZE)


@asynccontextmanager
async def open_harness(
    client: DatagramService, server: DatagramService, peer: int, timeout: float, retries: int = 3
) -> AsyncIterator[Leader]:
    """Run a :class:`Follower` on ``server`` for the duration; yield the :class:`Leader` on
    ``client``, which reaches ``server`` as ``peer``."""
    follower = Follower(server, timeout)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.serve)
        yield Leader(client, peer, timeout, retries)
        nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------- bandwidth


def _rates(nbytes: int, messages: int, seconds: float | None) -> dict[str, Cell]:
    if seconds is None or not seconds > 0.0:
        return {"mb_s": None, "mbit_s": None, "msgs_s": None}
    return {
        "mb_s": nbytes / seconds / 1e6,
        "mbit_s": nbytes * 8 / seconds / 1e6,
        "msgs_s": messages / seconds,
    }


async def _measure(
    leader: Leader, mode: Mode, size: int, params: BandwidthParams, one_way: float
) -> dict[str, Cell]:
    n = params.messages
    row: dict[str, Cell] = {"mode": mode, "size": size}
    if mode == "unidirectional":
        out = await leader.send_stream(n, size)
        received = out.peer_count or 0
        done = out.peer_done(one_way)
        row.update(_rates(received * size, received, None if done is None else done - out.start))
        row.update(sent=n, received=received, lost=n - received)
        sending = out.send_times[-1] - out.start
        row["sender_mb_s"] = n * size / sending / 1e6 if sending > 0 else None
    elif mode == "pingpong":
        echo = await leader.echo(n, size)
        completed = len(echo.rtts)
        row.update(_rates(2 * completed * size, 2 * completed, math.fsum(echo.rtts)))
        row.update(sent=echo.attempted, received=completed, lost=echo.attempted - completed)
    else:
        out = await leader.exchange(n, size, params.window)
        received = len(out.recv_times) + (out.peer_count or 0)
        sent = out.sent + out.peer_sent
        ends = [t for t in (out.peer_done(one_way), *out.recv_times[-1:]) if t is not None]
        # The follower starts streaming right after it sends its ACK.
        start = min(out.start, out.ack_at - one_way)
        row.update(_rates(received * size, received, max(ends) - start if ends else None))
        row.update(sent=sent, received=received, lost=sent - received)
    return row


async def _warm(leader: Leader, mode: Mode, size: int, params: BandwidthParams) -> None:
    n = params.warmup
    if mode == "unidirectional":
        await leader.send_stream(n, size)
    elif mode == "pingpong":
        await leader.echo(n, size)
    else:
        await leader.exchange(n, size, params.window)


async def bandwidth(
    client: DatagramService, server: DatagramService, peer: int, params: BandwidthParams
) -> Result:
    """Measure the bandwidths of ``params.modes`` from ``client`` to ``server`` (``peer``)."""
    wall_start = time.perf_counter()
    rows: list[dict[str, Cell]] = []
    check_sizes(client, params.sizes)
    async with open_harness(client, server, peer, params.timeout, params.retries) as leader:
        one_way = await leader.one_way(params.probes)
        with progress.step("sizes", len(params.modes) * len(params.sizes)) as sweep:
            for mode in params.modes:
                for size in params.sizes:
                    if params.warmup:
                        await _warm(leader, mode, size, params)
                    rows.append(await _measure(leader, mode, size, params, one_way))
                    sweep.advance()
    wall = time.perf_counter() - wall_start
    lost = sum(typing.cast(int, row["lost"]) for row in rows)
    return Result(
        title="bandwidth vs message size (MB = 10^6 bytes)",
        columns=[
            Column("mode", "mode"),
            Column("size", "size", "bytes"),
            Column("mb_s", "bandwidth", "MB/s", 2),
            Column("mbit_s", "bandwidth", "Mbit/s", 1),
            Column("msgs_s", "messages/s", "", 0),
            Column("sender_mb_s", "at sender", "MB/s", 2),
            Column("sent", "sent"),
            Column("received", "received"),
            Column("lost", "lost"),
        ],
        rows=rows,
        facts={
            "messages_per_size": params.messages,
            "one_way_small_us": one_way * 1e6,
            "messages_lost": lost,
            # Reported apart from the figures: waiting out a loss is never timed.
            "timeout_s": params.timeout,
            "wall_seconds": wall,
        },
        notes=(
            "unidirectional: received bytes / (first send .. final reply - one small-message "
            "one-way time - reply hold), paper 004 Fig 9(b) and paper 000 §7.6; 'at sender' "
            "times the sends alone; a receiver's wait for lost messages (the timeout) is "
            "excluded, the losses are counted under 'lost'",
            "pingpong: 2 x size / RTT, paper 004 Fig 9(a); sent/received count round trips",
            f"simultaneous: both directions' bytes over the time until both receivers finished, "
            f"each node at most {params.window or 'any number of'} message(s) ahead, "
            "paper 004 Fig 9(c)",
        ),
    )


async def run_bandwidth(session: Session, params: BandwidthParams) -> Result:
    """The ``bandwidth`` workload: node 0 measures towards node 1."""
    # The recipe loader checked that the stack's top provides DatagramService.
    client = typing.cast(DatagramService, session.services[0])
    server = typing.cast(DatagramService, session.services[1])
    return await bandwidth(client, server, session.peers[0][1], params)


BANDWIDTH = register_workload(
    WorkloadKind(
        name="bandwidth",
        Params=BandwidthParams,
        run=run_bandwidth,
        description="unidirectional, ping-pong and simultaneous bandwidth vs message size",
    )
)
