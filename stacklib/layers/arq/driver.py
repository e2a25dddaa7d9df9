"""The trio driver of the stop-and-wait ARQ layer: a reliable service over a datagram service.

The driver makes no protocol decisions; :mod:`stacklib.layers.arq.machine` does.  It keeps one
:class:`~stacklib.layers.arq.machine.ArqMachine` per peer and runs them with the generic
:class:`stacklib.driver.Driver` (a receive task and a pump), telling it what to do with the
machines' events: a delivered message goes to the inbox that :meth:`ArqService.recv` reads, a
failed peer is reported there and to every later call for it.

Flow control: :meth:`ArqService.send` waits while ``max_queue`` messages to that peer are queued
or unacknowledged; the receive task stops reading from below while ``max_queue`` delivered
messages wait for :meth:`ArqService.recv`, so a receiver that stops reading looks, to its
peers, like one that stopped answering (their retransmissions back off, then they give up).
"""

from __future__ import annotations

import math
import typing
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
import trio.lowlevel

from stacklib.driver import Driver
from stacklib.errors import LocalProtocolError, PeerUnreachable
from stacklib.layers.arq.machine import ArqMachine, ArqStatistics, Delivered, Event, PeerFailed
from stacklib.layers.arq.wire import HEADER_SIZE
from stacklib.services import DatagramService, ReliableService, Service
from stacklib.stack import Layer, register_layer, serve

__all__ = ["ArqLayer", "ArqParams", "ArqService"]


def _positive_number(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _int_at_least(minimum: int) -> Callable[[object, attrs.Attribute[int], int], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an integer >= {minimum}, got {value!r}")

    return check


@attrs.frozen
class ArqParams:
    """Parameters of the ARQ layer (``[[layers]] kind = "arq"`` in a recipe)."""

    #: First retransmission timeout in microseconds; doubles with each retransmission.
    rto_us: float = attrs.field(default=1000.0, validator=_positive_number)
    #: Retransmissions of one message before its peer is reported unreachable.
    max_retries: int = attrs.field(default=8, validator=_int_at_least(0))
    #: Messages per peer queued or unacknowledged before send() waits; also how many delivered
    #: messages may wait for recv() before the layer stops reading from below.
    max_queue: int = attrs.field(default=64, validator=_int_at_least(1))


_Item = tuple[int, bytes | PeerFailed]


class ArqService(ReliableService):
    """Reliable messages to and from peers over a datagram service; made by :class:`ArqLayer`.

    Messages to one peer arrive exactly once and in order, or the peer is reported with
    :class:`~stacklib.errors.PeerUnreachable`: once from :meth:`recv`, and from every later
    :meth:`send` or :meth:`drain` for that peer.  After the layer is closed, :meth:`send`
    raises :class:`trio.ClosedResourceError` and :meth:`recv` returns what was already
    delivered, then raises :class:`trio.EndOfChannel`.
    """

    def __init__(self, below: DatagramService, params: ArqParams) -> None:
        self._below = below
        self._params = params
        self._failures: dict[int, str] = {}
        self._closed = False
        self._inbox_send, self._inbox = trio.open_memory_channel[_Item](math.inf)
        # One token per delivered message waiting in the inbox: bounds it at max_queue.
        self._inbox_room = trio.Semaphore(params.max_queue)
        self._progress = trio.Event()  # replaced each time it is set
        self._waiters = 0  # tasks waiting on _progress
        self.driver = Driver(
            below,
            self._new_machine,
            on_event=self._on_event,
            on_input=self._on_input,
            admit=self._inbox_room.acquire,
            on_progress=self._wake,
            on_end=self._inbox_send.close,  # no more input: recv() ends after the backlog
        )
        self._machines = self.driver.machines

    def __repr__(self) -> str:
        return f"<ArqService over {self._below!r}, {len(self._machines)} peers>"

    # ------------------------------------------------------------------ the service

    @property
    def peers(self) -> Sequence[int]:
        return self._below.peers

    @property
    def max_message(self) -> int:
        return max(0, self._below.max_message - HEADER_SIZE)

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` for ``peer``; waits while ``max_queue`` messages are unacknowledged.

        Returns once the message is queued, not when it is acknowledged (see :meth:`drain`).
        Raises :class:`PeerUnreachable` if the peer has failed, :class:`LocalProtocolError` for
        an unknown peer or a message longer than :attr:`max_message`.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if len(data) > self.max_message:
            raise LocalProtocolError(
                f"ARQ: message of {len(data)} bytes exceeds max_message {self.max_message}"
            )
        machine = self._machine(peer)
        while True:
            self._check_usable(peer)
            if machine.send_room:
                break
            await self._wait_progress()
        machine.send(data, self.driver.now())
        self.driver.kick()
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def recv(self) -> tuple[int, bytes]:
        """The next message as (peer, data); :class:`PeerUnreachable` once per failed peer."""
        peer, item = await self._inbox.receive()
        if isinstance(item, PeerFailed):
            raise PeerUnreachable(self._failures[peer])
        self._inbox_room.release()
        return peer, item

    async def drain(self, peer: int) -> None:
        """Wait until every message sent to ``peer`` is acknowledged."""
        await trio.lowlevel.checkpoint_if_cancelled()
        machine = self._machine(peer)
        while True:
            self._check_usable(peer)
            if not machine.queued:
                break
            await self._wait_progress()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def peer_statistics(self, peer: int) -> ArqStatistics:
        """The counters of the machine for ``peer`` (all zero if nothing was exchanged yet)."""
        machine = self._machines.get(peer)
        return (machine if machine is not None else self._new_machine(peer)).statistics()

    def statistics(self) -> Mapping[str, object]:
        """Totals over all peers, and ``"peers"``: an :class:`ArqStatistics` per peer."""
        per_peer = {peer: m.statistics() for peer, m in sorted(self._machines.items())}
        totals: dict[str, object] = {
            field.name: sum(getattr(s, field.name) for s in per_peer.values())
            for field in attrs.fields(ArqStatistics)
        }
        totals["failed_peers"] = sorted(self._failures)
        totals["peers"] = per_peer
        return totals

    def close(self) -> None:
        """Called when the layer closes: later sends raise, waiting calls wake."""
        self._closed = True
        self._inbox_send.close()
        self._progress.set()

    # ------------------------------------------------------------------ the driver's hooks

    def _new_machine(self, peer: int) -> ArqMachine:
        params = self._params
        return ArqMachine(
            rto=params.rto_us * 1e-6,
            max_retries=params.max_retries,
            max_queue=params.max_queue,
            max_payload=self.max_message,
        )

    def _on_input(self, peer: int, machine: ArqMachine) -> None:
        # The token taken before reading is kept by a delivered message (recv gives it back).
        if not self.driver.take_events(peer, machine):
            self._inbox_room.release()

    def _on_event(self, peer: int, event: Event) -> None:
        if isinstance(event, Delivered):
            self._inbox_send.send_nowait((peer, event.data))
            return
        self._failures[peer] = (
            f"ARQ: peer {peer} did not acknowledge after {event.retransmissions} "
            f"retransmissions; {event.undelivered} message(s) may not have arrived"
        )
        self._inbox_send.send_nowait((peer, event))
        self._wake()

    # ------------------------------------------------------------------ helpers

    def _machine(self, peer: int) -> ArqMachine:
        if peer not in self._machines and peer not in self._below.peers:
            raise LocalProtocolError(f"ARQ: no peer {peer} (peers: {list(self.peers)})")
        return self.driver.machine(peer)

    def _check_usable(self, peer: int) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the ARQ layer is closed")
        reason = self._failures.get(peer)
        if reason is not None:
            raise PeerUnreachable(reason)

    async def _wait_progress(self) -> None:
        self._waiters += 1
        try:
            await self._progress.wait()
        finally:
            self._waiters -= 1

    def _wake(self) -> None:
        if self._waiters:
            self._progress.set()
            self._progress = trio.Event()


@register_layer
class ArqLayer(Layer[ArqParams]):
    """Stop-and-wait ARQ: makes a datagram service reliable (docs/writing-a-layer.md)."""

    name = "arq"
    requires = DatagramService
    provides = ReliableService
    Params = ArqParams

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[ArqService]:
        """Run the layer over ``below`` and yield its :class:`ArqService`."""
        self.require_below(below)
        service = ArqService(typing.cast(DatagramService, below), self.params)
        async with serve(service, service.driver.tasks("arq"), service.close):
            yield service
