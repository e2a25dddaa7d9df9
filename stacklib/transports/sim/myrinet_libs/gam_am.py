"""GAM's Active Messages as an :class:`~stacklib.services.ActiveMessageService`.

:class:`~stacklib.transports.sim.myrinet_libs.gam.Gam` has GAM's own surface (paper 004 §2):
requests and replies carry bytes and name handlers of two tables, handlers take a
:class:`~stacklib.transports.sim.myrinet_libs.gam.Token`, and its poll is a trio function,
because handling a message holds the host CPU.  :class:`GamActiveMessages` maps the GAM 1.1
surface that Split-C uses (paper 000 §5; :class:`~stacklib.services.ActiveMessageService`) onto
it, with GAM's costs and nothing else:

* **handlers and words**: one handler table of 256 entries (index or name), called
  ``fn(peer, *args)``; a request or reply carries its handler index and up to four 32-bit words
  in one short GAM message (at most 18 of GAM's 32 PIO bytes), dispatched by a GAM handler that
  the adapter registers;
* **reply**: from inside a request handler, once: the GAM token's reply (a request handler that
  does not reply gets GAM's empty reply, so the requester's token comes back);
* **store**: GAM bulk requests (its medium messages: copied into the bulk send buffer and DMAed
  out, up to ``max_request`` bytes each, the header included), each naming region, offset and
  the whole transfer; the target copies each into the region and runs the handler
  ``fn(peer, region, offset, nbytes, *args)`` with the last (GAM delivers in order);
* **get**: a short request naming the remote bytes; a GAM handler may not send a request
  (paper 004 §2), so the target queues it and serves it at its next asynchronous poll (any
  ``await`` of this service) with bulk requests back to the requester, whose handler runs
  when the last has landed; a get outside the target's regions comes back refused and the
  requester's next poll raises :class:`~stacklib.errors.RemoteProtocolError`;
* **poll**: :meth:`poll` is synchronous (:meth:`Gam.poll_nowait`: the handlers run at once and
  their host time is reserved on the CPU as the asynchronous poll would spend it), so it
  cannot serve gets; the waits (:meth:`wait_until`, :meth:`drain`, :meth:`request`, ...) poll
  GAM asynchronously and serve them;
* **acknowledge**: GAM replies at once, so nothing is ever owed: it is :meth:`poll`;
* **drain**: every request sent to the peer has had its reply (a store's reply leaves after
  its handler ran, so the data is in place);
* **failures**: none; GAM does not survive network errors (paper 004 Table 1: catastrophic).

The datagram face is GAM's own (:meth:`Gam.send`; :meth:`recv` polls as :meth:`Gam.recv` does
and serves gets too), so the generic workloads measure the same library as before.  An
exception raised by a handler is kept and raised by the next poll, after GAM has sent its
reply.  Make the adapter on every node before anything is sent (it registers its GAM handlers
in the same order everywhere); :meth:`capability` lends the :class:`Gam` underneath.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import trio

from stacklib.errors import LocalProtocolError, RemoteProtocolError
from stacklib.services import ActiveMessageService, ActiveMessageTables, Handler, RemoteAddress
from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs.gam import Gam, GamParams, Token

__all__ = ["GamActiveMessages"]

C = TypeVar("C")

_WORDS = struct.Struct("<BB")  #: handler index, number of words; the words follow
_STORE = struct.Struct("<BBHIII")  #: handler, words, region, offset, total, start; words, data
_GET = struct.Struct("<HHII")  #: transfer, region, offset, nbytes
_GOT = struct.Struct("<HBxII")  #: transfer, ok, start, total; then the data
_MAX_WORDS = 4
_WORD_LIMIT = 1 << 32
_TABLE = 256


def _words(args: Sequence[int]) -> bytes:
    if len(args) > _MAX_WORDS:
        raise LocalProtocolError(f"GAM: a message carries at most 4 words, not {len(args)}")
    for word in args:
        if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word < _WORD_LIMIT:
            raise LocalProtocolError(f"GAM: argument {word!r} is not a 32-bit word")
    return struct.pack(f"<{len(args)}I", *args)


def _unwords(data: bytes, count: int, start: int) -> tuple[int, ...]:
    return struct.unpack_from(f"<{count}I", data, start)


class GamActiveMessages(ActiveMessageService):
    """The Active Messages of one node's :class:`Gam` (module docstring).  Peers are node
    indices, as GAM's."""

    kind = "active-messages"

    def __init__(self, gam: Gam) -> None:
        self.gam = gam
        self._tables = ActiveMessageTables("GAM", _TABLE, max_regions=0x10000)
        self._handlers = self._tables.handlers
        self._regions = self._tables.regions
        #: (peer, transfer) -> where a get lands and what runs then
        self._gets: dict[tuple[int, int], tuple[int, int, int, tuple[int, ...]]] = {}
        self._next_get = 0
        #: Gets to serve: (peer, transfer, region, offset, nbytes)
        self._to_serve: deque[tuple[int, int, int, int, int]] = deque()
        self._serving = False
        self._errors: deque[BaseException] = deque()
        self._current: Token | None = None
        self.counters: dict[str, int] = dict.fromkeys(
            ("requests", "replies", "stores", "gets", "served", "unknown_handler", "bad_address"),
            0,
        )
        self._request_h = gam.register_request(self._on_request)
        self._store_h = gam.register_request(self._on_store)
        self._get_h = gam.register_request(self._on_get)
        self._got_h = gam.register_request(self._on_got)
        self._reply_h = gam.register_reply(self._on_reply)
        # A bulk request's data is what GAM's bulk buffer holds, less the header.
        self._chunk = gam.params.max_request - _STORE.size - 4 * _MAX_WORDS

    @classmethod
    def open(
        cls, cluster: Lanai4Cluster, params: GamParams | None = None
    ) -> list[GamActiveMessages]:
        """GAM on every node of ``cluster``, each behind its adapter."""
        return [cls(gam) for gam in Gam.open(cluster, params)]

    def __repr__(self) -> str:
        return f"<GamActiveMessages over {self.gam!r}>"

    def capability(self, kind: type[C]) -> C | None:
        """Lends the :class:`Gam` library underneath (``capability(Gam)``)."""
        return self.gam if isinstance(self.gam, kind) else None

    # ------------------------------------------------------------------ tables

    def register_handler(
        self, handler: Handler, index: int | None = None, name: str | None = None
    ) -> int:
        return self._tables.register_handler(handler, index, name)

    def register_region(self, buffer: bytearray | memoryview, name: str | None = None) -> int:
        return self._tables.register_region(buffer, name)

    def _handler(self, handler: int | str) -> int:
        # GAM carries the index in a word: check its range here, before anything is sent.
        index = self._tables.handler_index(handler)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < _TABLE:
            raise LocalProtocolError(f"GAM: handler index {handler!r} is not in 0..255")
        return index

    def _region(self, region: int | str) -> int:
        return self._tables.region_id(region)

    # ------------------------------------------------------------------ requests and replies

    def request_nowait(self, peer: int, handler: int | str, *args: int) -> None:
        self._raise_pending()
        payload = _WORDS.pack(self._handler(handler), len(args)) + _words(args)
        self.gam.request_nowait(peer, self._request_h, payload)
        self.counters["requests"] += 1

    async def request(self, peer: int, handler: int | str, *args: int) -> None:
        payload = _WORDS.pack(self._handler(handler), len(args)) + _words(args)
        await self.gam.request(peer, self._request_h, payload)
        self.counters["requests"] += 1
        await self._poll()

    def reply(self, handler: int | str, *args: int) -> None:
        token = self._current
        if token is None:
            raise LocalProtocolError(
                "GAM: a reply is allowed only from a request handler, once "
                "(a reply handler may not reply: paper 000 §5)"
            )
        payload = _WORDS.pack(self._handler(handler), len(args)) + _words(args)
        token.reply(self._reply_h, payload)
        self._current = None
        self.counters["replies"] += 1

    # ------------------------------------------------------------------ bulk transfers

    async def store(
        self,
        peer: int,
        data: bytes | bytearray | memoryview,
        remote: RemoteAddress,
        handler: int | str,
        *args: int,
    ) -> None:
        index = self._handler(handler)
        words = _words(args)
        region, offset = self._region(remote[0]), remote[1]
        self._check_address(region, offset, len(data))
        raw = bytes(data)
        total = len(raw)
        step = self._chunk
        for start in range(0, max(total, 1), step):
            header = _STORE.pack(index, len(args), region, offset, total, start)
            await self.gam.request(peer, self._store_h, header + words + raw[start : start + step])
        self.counters["stores"] += 1
        await self._poll()

    async def get(
        self,
        peer: int,
        remote: RemoteAddress,
        nbytes: int,
        local: RemoteAddress,
        handler: int | str,
        *args: int,
    ) -> None:
        local_region, local_offset = self._region(local[0]), local[1]
        view = self._regions.get(local_region)
        if view is None or not 0 <= local_offset <= len(view) - nbytes:
            raise LocalProtocolError(
                f"GAM: {nbytes} bytes at {local!r} are outside the local regions"
            )
        index = self._handler(handler)
        region, offset = self._region(remote[0]), remote[1]
        self._check_address(region, offset, nbytes)
        transfer = self._next_get
        while (peer, transfer) in self._gets:
            transfer = (transfer + 1) & 0xFFFF
        self._next_get = (transfer + 1) & 0xFFFF
        self._gets[peer, transfer] = (local_region, local_offset, index, tuple(args))
        try:
            await self.gam.request(peer, self._get_h, _GET.pack(transfer, region, offset, nbytes))
        except BaseException:
            del self._gets[peer, transfer]
            raise
        self.counters["gets"] += 1
        await self._poll()

    @staticmethod
    def _check_address(region: int, offset: int, nbytes: int) -> None:
        # The fields of the wire headers; the target checks the bounds.
        if not 0 <= region <= 0xFFFF or not 0 <= offset < _WORD_LIMIT:
            raise LocalProtocolError(f"GAM: no remote address ({region!r}, {offset!r})")
        if not 0 <= nbytes < _WORD_LIMIT:
            raise LocalProtocolError(f"GAM: a transfer of {nbytes} bytes")

    # ------------------------------------------------------------------ polling

    def poll(self) -> int:
        """Run the handlers of every message that has arrived (synchronously: gets wait for
        the next asynchronous poll); raises what a handler raised, once."""
        self._raise_pending()
        count = self.gam.poll_nowait()
        self._raise_pending()
        return count

    def acknowledge(self) -> int:
        """:meth:`poll`: GAM replies as it handles, so no acknowledgment is ever owed."""
        return self.poll()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        await self._poll()
        while not predicate():
            await self.gam.wait_until(self._work)
            await self._poll()

    def _work(self) -> bool:
        """Whether a poll has something to do: handlers to run, or gets nobody serves yet."""
        return self.gam.arrivals > 0 or (bool(self._to_serve) and not self._serving)

    async def drain(self, peer: int | None = None) -> None:
        gam = self.gam
        peers = [peer] if peer is not None else list(gam.peers)
        for each in peers:
            gam.peer(each)  # LibraryError for a bad peer
            await self.wait_until(lambda p=each: gam.outstanding(p) == 0)  # type: ignore[misc]

    async def _poll(self) -> None:
        """GAM's poll, then the gets that its handlers queued."""
        self._raise_pending()
        await self.gam.poll()
        if self._to_serve and not self._serving:
            await self._serve()
        self._raise_pending()

    async def _serve(self) -> None:
        self._serving = True
        try:
            while self._to_serve:
                get = self._to_serve.popleft()
                with trio.CancelScope(shield=True):  # a get, once begun, goes back whole
                    await self._serve_one(*get)
        finally:
            self._serving = False

    async def _serve_one(
        self, peer: int, transfer: int, region: int, offset: int, nbytes: int
    ) -> None:
        view = self._regions.get(region)
        if view is None or offset + nbytes > len(view):
            self.counters["bad_address"] += 1
            await self.gam.request(peer, self._got_h, _GOT.pack(transfer, 0, 0, nbytes))
            return
        data = bytes(view[offset : offset + nbytes])
        step = self._chunk
        for start in range(0, max(nbytes, 1), step):
            header = _GOT.pack(transfer, 1, start, nbytes)
            await self.gam.request(peer, self._got_h, header + data[start : start + step])
        self.counters["served"] += 1

    def _raise_pending(self) -> None:
        if self._errors:
            raise self._errors.popleft()

    # ------------------------------------------------------------------ GAM's handlers

    def _call(self, index: int, *args: object) -> None:
        handler = self._handlers[index]
        if handler is None:
            self.counters["unknown_handler"] += 1
            return
        try:
            handler(*args)
        except Exception as error:  # raised by the next poll, after GAM's reply has gone
            self._errors.append(error)

    def _on_request(self, token: Token, data: bytes) -> None:
        index, count = _WORDS.unpack_from(data)
        self._current = token
        try:
            self._call(index, token.src, *_unwords(data, count, _WORDS.size))
        finally:
            self._current = None

    def _on_reply(self, token: Token, data: bytes) -> None:
        index, count = _WORDS.unpack_from(data)
        self._call(index, token.src, *_unwords(data, count, _WORDS.size))

    def _on_store(self, token: Token, data: bytes) -> None:
        index, count, region, offset, total, start = _STORE.unpack_from(data)
        args = _unwords(data, count, _STORE.size)
        chunk = memoryview(data)[_STORE.size + 4 * count :]
        view = self._regions.get(region)
        if view is None or offset + total > len(view):
            self.counters["bad_address"] += 1  # counted per piece; the handler does not run
            return
        view[offset + start : offset + start + len(chunk)] = chunk
        if start + len(chunk) >= total:
            self._call(index, token.src, region, offset, total, *args)

    def _on_get(self, token: Token, data: bytes) -> None:
        transfer, region, offset, nbytes = _GET.unpack(data)
        self._to_serve.append((token.src, transfer, region, offset, nbytes))

    def _on_got(self, token: Token, data: bytes) -> None:
        transfer, ok, start, total = _GOT.unpack_from(data)
        key = (token.src, transfer)
        entry = self._gets.get(key)
        if entry is None:
            return
        region, offset, index, args = entry
        if not ok:
            del self._gets[key]
            self._errors.append(
                RemoteProtocolError(
                    f"GAM: peer {token.src} refused get {transfer}: address outside its regions"
                )
            )
            return
        chunk = memoryview(data)[_GOT.size :]
        self._regions[region][offset + start : offset + start + len(chunk)] = chunk
        if start + len(chunk) >= total:
            del self._gets[key]
            self._call(index, token.src, region, offset, total, *args)

    # ------------------------------------------------------------------ datagram face

    @property
    def peers(self) -> Sequence[int]:
        return self.gam.peers

    @property
    def max_message(self) -> int:
        return self.gam.max_message

    async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
        await self.gam.send(peer, data)

    async def recv(self) -> tuple[int, bytes]:
        gam = self.gam
        await self._poll()
        message = gam.take_message()
        while message is None:
            await gam.wait_until(self._work)
            await self._poll()
            message = gam.take_message()
        return message

    def statistics(self) -> Mapping[str, object]:
        """GAM's counters, plus the adapter's under ``"am"``."""
        return {**self.gam.statistics(), "am": dict(self.counters)}
