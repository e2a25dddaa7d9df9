"""The Split-C runtime: a global address space over Active Messages (paper 000 §6).

"A Split-C program comprises one thread of control per processor from a single code image and
the threads interact through reads and writes on shared data" (paper 000 §6).  Each rank of an
SPMD program holds a :class:`SplitC` over its
:class:`~stacklib.services.ActiveMessageService` (U-Net Active Messages,
:class:`~stacklib.layers.uam.UamService`, or the Myrinet GAM library's Active Messages,
:class:`~stacklib.transports.sim.myrinet_libs.GamActiveMessages`):

* regions are named numpy arrays every rank registers collectively, in the same order (the
  SPMD model GAM assumes); their sizes are exchanged, so every rank knows every rank's bounds;
* a :class:`GlobalPtr` is (rank, region, element offset), typed by the region's dtype;
  ``gp + n`` moves it within its rank; a :class:`SpreadArray` spreads one index space over all
  ranks (cyclic, as Split-C's ``a[i]::``, or blocked);
* a scalar read or write is one request and one reply (:mod:`~stacklib.layers.splitc.wire`);
  ``get``/``put`` start one and complete at :meth:`SplitC.sync`; ``store`` sends one request
  and no reply, and the target counts the bytes for :meth:`SplitC.store_sync`;
* bulk variants of any size "map into Active Message bulk gets and stores" (paper 000 §6);
* barrier, broadcast, reduction and all-gather are block stores through rank 0.

Local accesses (the pointer's rank is this rank) go straight to the array and never touch the
network.  The target checks every scalar access and answers an access outside its region with
a status that the caller gets as :class:`SplitcAccessError`; bulk accesses and stores are
checked by the caller against the exchanged sizes (and the service refuses them at the target
too).

Handlers run wherever the Active Message service runs them (UAM: in its background poller,
``background_poll=True``), or inside :meth:`SplitC.poll` and the waits.  The waits poll, so
both faces work: the trio face (``await sc.read(gp)``, ``await sc.sync()``, ``async with
sc.split_phase():``) and the polling face (``get_nowait``, ``put_nowait``, ``store_nowait``,
:meth:`SplitC.poll`, :attr:`SplitC.done`).
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Literal, cast

import attrs
import numpy as np
import numpy.typing as npt
import trio

from stacklib.errors import LocalProtocolError, PeerUnreachable, RemoteProtocolError
from stacklib.layers.splitc.wire import (
    SCALAR_SIZES,
    Kind,
    SplitcFormatError,
    Status,
    reply_fields,
    reply_words,
    request_fields,
    request_words,
)
from stacklib.layers.uam.service import UamService
from stacklib.services import ActiveMessageService, Service
from stacklib.sim import Resource

__all__ = [
    "GlobalPtr",
    "Pending",
    "SplitC",
    "SplitcAccessError",
    "SpreadArray",
    "open_splitc",
]

_OPS: Final = 1 << 16  #: op ids are 16 bits (wire.py)


def _native_reads() -> Callable[..., Any] | None:
    try:  # built by ``stacklib compile`` into the compiled copy only
        from stacklib.layers.splitc._splitccore import ScalarReadHandler
    except ImportError:
        return None
    return ScalarReadHandler


#: The request handler whose C table answers scalar reads inside UAM's express poll
#: (``_splitccore.c``), where it is built; else None (the Python handler alone).
_NATIVE_READS: Final = _native_reads()
#: How often :meth:`SplitC.compute` lets the protocol's work in (an estimate: the papers do not
#: say how often the benchmarks poll; 1 ms is well inside UAM's 4 ms timeout).
COMPUTE_SLICE: Final = 1e-3
_H_REQUEST: Final = "splitc.request"
_H_REPLY: Final = "splitc.reply"
_H_STORED: Final = "splitc.stored"
_H_PUT: Final = "splitc.put"
_H_GOT: Final = "splitc.got"
_H_COLL: Final = "splitc.coll"
_H_COLL_WORDS: Final = "splitc.coll.words"
#: A collective's payload of at most this many bytes (a barrier's, a scalar's reduction)
#: travels in one request's words, a length and three data words, like a scalar store: a
#: store goes through UAM's general bulk path, some 30 us of interpreted work compiled.
_COLL_IN_WORDS: Final = 12
_COLL_WORDS: Final = struct.Struct(">III")
_COLL_REGION: Final = "splitc.collective"
# The wire codes the scalar fast paths compare and build (wire.py's Kind): plain int constants,
# inlined in the compiled copy.
_READ_CODE: Final = 1
_VALUE_CODE: Final = 5
_ACK_CODE: Final = 6
_WORD_MAX: Final = 0xFFFFFFFF
# An 8-byte element as a message's two value words, and back; bound methods taken once (a
# method look-up per call otherwise).
_ELEMENT_WORDS: Final = struct.Struct(">II")
_WORDS_OF: Final = _ELEMENT_WORDS.unpack_from
_ELEMENT_OF: Final = _ELEMENT_WORDS.pack
#: struct formats that decode a native element as numpy's ``item()`` does (same Python type
#: and value); other dtypes (complex, datetime, byte-swapped) take numpy.
_STRUCT_CHARS: Final = frozenset("?bBhHiIlLqQefd")
_REDUCERS: Final[dict[str, Callable[..., Any]]] = {
    "sum": np.add,
    "max": np.maximum,
    "min": np.minimum,
    "prod": np.multiply,
}


class SplitcAccessError(RemoteProtocolError):
    """A remote access outside the target's region (or to a region it does not have); the
    target was left untouched."""


class GlobalPtr:
    """A typed global pointer: element ``offset`` of region ``region`` on rank ``rank``.

    Arithmetic moves it within its rank (``gp + 3`` is three elements further), as on a
    Split-C global pointer; spread arrays give the other layout.

    A value: equal to and hashed as another pointer with the same three fields.  Read-only by
    contract (the type checker refuses an assignment to a field; nothing checks at run time).
    A plain class rather than a frozen attrs one because every access reads its fields and
    pointer arithmetic builds one: the compiled copy builds and reads this class natively.
    """

    __slots__ = ("offset", "rank", "region")

    def __init__(self, rank: int, region: str, offset: int = 0) -> None:
        self.rank: Final = rank
        self.region: Final = region
        self.offset: Final = offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GlobalPtr):
            return NotImplemented
        return (
            self.rank == other.rank and self.region == other.region and self.offset == other.offset
        )

    def __hash__(self) -> int:
        return hash((self.rank, self.region, self.offset))

    def __repr__(self) -> str:
        return f"GlobalPtr(rank={self.rank!r}, region={self.region!r}, offset={self.offset!r})"

    def __add__(self, n: int) -> GlobalPtr:
        return GlobalPtr(self.rank, self.region, self.offset + n)

    def __sub__(self, n: int) -> GlobalPtr:
        return GlobalPtr(self.rank, self.region, self.offset - n)


@attrs.frozen
class SpreadArray:
    """One index space spread over every rank's region ``region``: element ``i`` lives on rank
    ``i % size`` at ``i // size`` (``"cyclic"``, Split-C's spread layout) or on rank
    ``i // per_rank`` at ``i % per_rank`` (``"block"``)."""

    region: str
    size: int
    per_rank: int
    layout: Literal["cyclic", "block"] = "cyclic"

    def __len__(self) -> int:
        return self.size * self.per_rank

    def __getitem__(self, i: int) -> GlobalPtr:
        if not 0 <= i < len(self):
            raise IndexError(f"Split-C: index {i} outside spread array of {len(self)}")
        if self.layout == "cyclic":
            return GlobalPtr(i % self.size, self.region, i // self.size)
        return GlobalPtr(i // self.per_rank, self.region, i % self.per_rank)


class Pending:
    """A split-phase operation: complete after :meth:`SplitC.sync` (or once :attr:`done`).

    ``dtype`` (gets) is the type of the value fetched; ``decode``, if given, the ``unpack`` of a
    ``struct.Struct`` of that dtype's native element, which :attr:`value` uses instead of numpy
    (the same Python value, without building an array and a numpy scalar per read).
    """

    __slots__ = ("_decode", "_dtype", "_operation", "_raw", "_target", "done", "error")

    def __init__(
        self,
        operation: str,
        target: object,
        dtype: np.dtype[Any] | None = None,
        decode: Callable[[bytes], tuple[Any, ...]] | None = None,
    ) -> None:
        # The description is formatted only when shown: most operations never are.
        self._operation = operation
        self._target = target
        self.done = False
        self.error: SplitcAccessError | None = None
        self._dtype = dtype
        self._decode = decode
        self._raw = b""

    @property
    def what(self) -> str:
        """The operation and its target, e.g. ``"get <GlobalPtr ...>"``."""
        return f"{self._operation} {self._target}"

    def __repr__(self) -> str:
        state = "done" if self.done else "pending"
        return f"<Pending {self.what} {state}>"

    @property
    def value(self) -> Any:
        """The value a get fetched; :class:`LocalProtocolError` before it completed."""
        if not self.done:
            raise LocalProtocolError(
                f"Split-C: {self.what} is not complete: call sync() before using its value"
            )
        if self.error is not None:
            raise self.error
        if self._dtype is None:
            return None
        decode = self._decode
        if decode is not None:
            try:
                return decode(self._raw)[0]
            except struct.error:
                pass  # not one element (a malformed reply): numpy raises its error below
        return np.frombuffer(self._raw, self._dtype, count=1)[0].item()

    def is_done(self) -> bool:
        """:attr:`done`, as a predicate for a wait (a bound method: no closure per wait)."""
        return self.done

    def _complete(self, raw: bytes = b"", error: SplitcAccessError | None = None) -> None:
        self._raw = raw
        self.error = error
        self.done = True


class _Region:
    """One registered region: its index, name and flat array, UAM's id for it, and the
    number of elements on each rank (known after the collective exchange)."""

    # A plain class: mypyc does not compile an attrs class with a memoryview field.
    def __init__(
        self, index: int, name: str, array: npt.NDArray[Any], uam_id: int, sizes: tuple[int, ...]
    ) -> None:
        self.index = index
        self.name = name
        self.array = array  # flat view of the user's array
        self.uam_id = uam_id
        self.sizes = sizes  # elements on each rank
        # The array's bytes and element size, looked up once: a scalar access through them
        # costs a memoryview slice, not numpy views and array construction.
        self.raw: memoryview = array.view(np.uint8).data
        self.nbytes = len(self.raw)
        self.itemsize = int(array.itemsize)
        self.dtype: np.dtype[Any] = array.dtype
        self.scalar_type: type = array.dtype.type
        #: Whether scalar accesses may address it (its elements have 1, 2, 4 or 8 bytes).
        self.scalar = self.itemsize in SCALAR_SIZES
        #: Decodes one native element (a struct's unpack; None: numpy does; Pending.value).
        self.decode: Callable[[bytes], tuple[Any, ...]] | None = None
        char = self.dtype.char
        if self.dtype.isnative and char in _STRUCT_CHARS and struct.calcsize(char) == self.itemsize:
            self.decode = struct.Struct(char).unpack

    def element_words(self, offset: int) -> tuple[int, int]:
        """The ``itemsize`` bytes at byte ``offset`` as a message's two value words (big-endian,
        zero-padded on the right: wire.py's value field); the caller checked the bounds."""
        size = self.itemsize
        if size == 8:
            high, low = _WORDS_OF(self.raw, offset)
            return high, low
        return int.from_bytes(self.raw[offset : offset + size], "big") << (32 - 8 * size), 0

    def __repr__(self) -> str:
        return f"<Split-C region {self.index} {self.name!r}, {len(self.array)} elements>"


def _four_words(w0: object, w1: object, w2: object, w3: object) -> bool:
    """Four plain 32-bit ints (as :func:`~stacklib.layers.splitc.wire.plain_word_tuple` checks a
    tuple; compiled, a native call with no tuple built)."""
    return (
        type(w0) is int
        and type(w1) is int
        and type(w2) is int
        and type(w3) is int
        and 0 <= w0 <= _WORD_MAX
        and 0 <= w1 <= _WORD_MAX
        and 0 <= w2 <= _WORD_MAX
        and 0 <= w3 <= _WORD_MAX
    )


def _given(w0: object, w1: object, w2: object, w3: object) -> tuple[int, ...]:
    """The words a handler was given (the tuple its ``*words`` was): the parameters up to the
    last one not None."""
    if w3 is not None:
        words: tuple[object, ...] = (w0, w1, w2, w3)
    elif w2 is not None:
        words = (w0, w1, w2)
    elif w1 is not None:
        words = (w0, w1)
    elif w0 is not None:
        words = (w0,)
    else:
        words = ()
    return cast(tuple[int, ...], words)


class SplitC(Service):
    """One rank of a Split-C program; see the module docstring and docs/splitc.md.

    Made by :func:`open_splitc` (or ``SplitcLayer``), which registers the handlers before
    anything can arrive and ends with a barrier, so every rank is ready when it returns.
    """

    kind = "splitc"

    def __init__(
        self,
        am: ActiveMessageService,
        rank: int,
        channels: Mapping[int, int],
        *,
        cpu: Resource | None = None,
        slot_bytes: int = 64 * 1024,
    ) -> None:
        size = len(channels) + 1
        if not 0 <= rank < size or rank in channels or set(channels) != set(range(size)) - {rank}:
            raise LocalProtocolError(
                f"Split-C: rank {rank} with channels to ranks {sorted(channels)}: every other "
                f"rank of 0..{size - 1} needs one channel"
            )
        self.am = am
        self.rank = rank
        self.size = size
        self._peer = dict(channels)
        self._rank_of = {peer: r for r, peer in channels.items()}
        self._cpu = cpu
        self._slot = slot_bytes
        self._regions: dict[str, _Region] = {}
        self._by_index: list[_Region] = []
        self._ops: dict[int, Pending] = {}
        self._next_op = 0
        self._put_peers: dict[int, list[Pending]] = {}
        self._errors: list[SplitcAccessError] = []
        self._stored = 0
        self._coll_in: dict[int, deque[bytes]] = {r: deque() for r in range(size)}
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "reads",
                "writes",
                "gets",
                "puts",
                "stores",
                "bulk_gets",
                "bulk_puts",
                "bulk_stores",
                "bulk_bytes",
                "local",
                "refused",
                "malformed",
                "collectives",
            ),
            0,
        )
        #: Virtual (or wall) seconds spent in :meth:`compute`.
        self.compute_time = 0.0
        # The scalar paths name their handlers by index: a name is a lookup per message.
        # Over UAM, with the C extension built, the two handlers are objects that call
        # _on_request and _on_reply and whose C tables let UAM's express poll answer a scalar
        # read and complete its reply without a Python call (what the fast paths do).
        self._native: Any = None
        native_reply: Any = None
        if _NATIVE_READS is not None and isinstance(am, UamService):
            self._native = _NATIVE_READS(self._on_request)
            native_reply = _NATIVE_READS(self._on_reply, self._ops)
        self._request_handler = am.register_handler(
            self._on_request if self._native is None else self._native, name=_H_REQUEST
        )
        self._reply_handler = am.register_handler(
            self._on_reply if native_reply is None else native_reply, name=_H_REPLY
        )
        if self._native is not None:
            self._native.reply_handler = self._reply_handler
        # ... and call the service's sends through bound methods taken once, or, over UAM,
        # through the service itself (compiled: a native call, without the argument parsing
        # of a Python one).
        self._request_nowait: Callable[..., None] = am.request_nowait
        self._reply: Callable[..., None] = am.reply
        self._uam: UamService | None = am if isinstance(am, UamService) else None
        am.register_handler(self._on_stored, name=_H_STORED)
        am.register_handler(self._on_put, name=_H_PUT)
        am.register_handler(self._on_got, name=_H_GOT)
        am.register_handler(self._on_coll, name=_H_COLL)
        am.register_handler(self._on_coll_words, name=_H_COLL_WORDS)
        self._coll = np.zeros(size * slot_bytes, np.uint8)
        self._coll_id = am.register_region(self._coll.data, name=_COLL_REGION)

    def __repr__(self) -> str:
        return f"<SplitC rank {self.rank} of {self.size}, regions {sorted(self._regions)}>"

    # ------------------------------------------------------------------ regions and pointers

    async def all_register(self, name: str, array: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Make ``array`` (C-contiguous, writable) this rank's part of region ``name``.

        Collective: every rank registers its regions in the same order; the sizes are
        exchanged so that accesses can be checked against the target's bounds.
        """
        if name in self._regions:
            raise LocalProtocolError(f"Split-C: region {name!r} is already registered")
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise LocalProtocolError(f"Split-C: region {name!r} must be a C-contiguous ndarray")
        if not array.flags.writeable:
            raise LocalProtocolError(f"Split-C: region {name!r} must be writable")
        if len(self._by_index) >= 256:
            raise LocalProtocolError("Split-C: at most 256 regions")
        flat = array.reshape(-1)
        # Register with UAM before the exchange: once any rank has every size, every rank
        # has registered, so no store can reach a region that is not there yet.
        # The same for the region table that scalar requests use.
        uam_id = self.am.register_region(flat.view(np.uint8).data, name=f"splitc:{name}")
        region = _Region(len(self._by_index), name, flat, uam_id, ())
        self._by_index.append(region)
        if self._native is not None:
            self._native.add_region(region.raw, region.itemsize)
        sizes = await self.all_gather(len(flat))
        region.sizes = tuple(int(s) for s in sizes)
        self._regions[name] = region
        return array

    async def all_alloc(self, name: str, shape: int | Sequence[int], dtype: Any) -> Any:
        """Allocate a zeroed array of ``shape`` and register it as region ``name``
        (collective)."""
        return await self.all_register(name, np.zeros(shape, dtype))

    async def all_spread(
        self,
        name: str,
        per_rank: int,
        dtype: Any,
        layout: Literal["cyclic", "block"] = "cyclic",
    ) -> SpreadArray:
        """Allocate ``per_rank`` elements on every rank as region ``name`` and return the
        spread array over them (collective)."""
        await self.all_alloc(name, per_rank, dtype)
        return SpreadArray(name, self.size, per_rank, layout)

    def local(self, name: str) -> npt.NDArray[Any]:
        """This rank's part of region ``name``, flat."""
        return self._region(name).array

    def ptr(self, rank: int, name: str, offset: int = 0) -> GlobalPtr:
        """A global pointer to element ``offset`` of ``name`` on ``rank``."""
        self._region(name)
        if not 0 <= rank < self.size:
            raise LocalProtocolError(f"Split-C: rank {rank} outside 0..{self.size - 1}")
        return GlobalPtr(rank, name, offset)

    def _region(self, name: str) -> _Region:
        try:
            return self._regions[name]
        except KeyError:
            raise LocalProtocolError(
                f"Split-C: no region {name!r} (registered: {sorted(self._regions)})"
            ) from None

    def _check(self, gp: GlobalPtr, count: int) -> _Region:
        """Check a bulk access or store against the target's size (known from registration)."""
        region = self._region(gp.region)
        if not 0 <= gp.rank < self.size:
            raise LocalProtocolError(f"Split-C: rank {gp.rank} outside 0..{self.size - 1}")
        if count < 0 or gp.offset < 0 or gp.offset + count > region.sizes[gp.rank]:
            self.counters["refused"] += 1
            raise SplitcAccessError(
                f"Split-C: {count} elements at {gp.offset} of {gp.region!r} on rank {gp.rank}: "
                f"outside its {region.sizes[gp.rank]} elements"
            )
        return region

    # ------------------------------------------------------------------ scalar accesses

    async def read(self, gp: GlobalPtr) -> Any:
        """The value at ``gp`` (blocking: one request and reply when remote)."""
        pending = await self.get(gp)
        await self.am.wait_until(pending.is_done)
        return pending.value

    async def write(self, gp: GlobalPtr, value: Any) -> None:
        """Write ``value`` at ``gp`` and wait for the target's acknowledgment."""
        pending = await self.put(gp, value)
        await self.am.wait_until(pending.is_done)
        if pending.error is not None:
            raise pending.error

    async def get(self, gp: GlobalPtr) -> Pending:
        """Start fetching the value at ``gp``; it is complete after :meth:`sync`."""
        request, pending = self._scalar(gp, Kind.READ, None)
        if request is None:
            return pending
        await self.am.request(self._peer[gp.rank], self._request_handler, *request)
        return pending

    async def put(self, gp: GlobalPtr, value: Any) -> Pending:
        """Start writing ``value`` at ``gp``; complete (acknowledged) after :meth:`sync`."""
        request, pending = self._scalar(gp, Kind.WRITE, value)
        if request is None:
            return pending
        await self.am.request(self._peer[gp.rank], self._request_handler, *request)
        return pending

    async def store(self, gp: GlobalPtr, value: Any) -> None:
        """One-way store of ``value`` at ``gp`` (one scalar, or several filling at most 8
        bytes); the target counts its bytes for :meth:`store_sync`."""
        words = self._store(gp, value)
        if words is not None:
            await self.am.request(self._peer[gp.rank], self._request_handler, *words)

    def get_nowait(self, gp: GlobalPtr) -> Pending:
        """:meth:`get` that raises :class:`trio.WouldBlock` when the service cannot send
        yet (UAM: its window is full)."""
        # A remote element, the common case, inline: what _nowait does through _scalar, with
        # the request's words passed as they are built (request_words's checks hold by
        # construction: size, region index (< 256 regions) and op are in range).
        region = self._regions.get(gp.region)
        channel = self._peer.get(gp.rank)
        offset = gp.offset
        if (
            region is None
            or channel is None  # this rank (or none)
            or not region.scalar
            or type(offset) is not int
            or not 0 <= offset * region.itemsize <= _WORD_MAX
        ):
            return self._nowait(gp, Kind.READ, None)
        size = region.itemsize
        counters = self.counters
        counters["gets"] += 1
        pending = Pending("get", gp, region.dtype, region.decode)
        op = self._new_op(pending)
        first = (_READ_CODE << 28) | (size << 24) | (region.index << 16) | op
        uam = self._uam
        try:
            if uam is not None:
                uam.request_nowait(channel, self._request_handler, first, offset * size, 0, 0)
            else:
                self._request_nowait(channel, self._request_handler, first, offset * size, 0, 0)
        except trio.WouldBlock:
            del self._ops[op]  # not sent: forget it (as _nowait)
            counters["gets"] -= 1
            raise
        return pending

    def put_nowait(self, gp: GlobalPtr, value: Any) -> Pending:
        """:meth:`put` that raises :class:`trio.WouldBlock` when the service cannot send
        yet (UAM: its window is full)."""
        return self._nowait(gp, Kind.WRITE, value)

    def store_nowait(self, gp: GlobalPtr, value: Any) -> None:
        """:meth:`store` that raises :class:`trio.WouldBlock` when the service cannot send
        yet (UAM: its window is full)."""
        words = self._store(gp, value)
        if words is not None:
            try:
                self._request_nowait(self._peer[gp.rank], self._request_handler, *words)
            except trio.WouldBlock:
                self.counters["stores"] -= 1
                raise

    def _nowait(self, gp: GlobalPtr, kind: Kind, value: Any) -> Pending:
        request, pending = self._scalar(gp, kind, value)
        if request is not None:
            try:
                self._request_nowait(self._peer[gp.rank], self._request_handler, *request)
            except trio.WouldBlock:
                # Not sent: forget the operation (request_nowait polled, as a sender with a
                # full window does, paper 000 §5.1.2).
                del self._ops[request_op(request)]
                self.counters["gets" if kind is Kind.READ else "puts"] -= 1
                raise
        return pending

    def _scalar(
        self, gp: GlobalPtr, kind: Kind, value: Any
    ) -> tuple[tuple[int, int, int, int] | None, Pending]:
        region = self._region(gp.region)
        size = region.itemsize
        if not region.scalar:
            raise LocalProtocolError(
                f"Split-C: scalar access to {gp.region!r}: elements of {size} bytes (1, 2, 4, 8)"
            )
        read = kind is Kind.READ
        name = "get" if read else "put"
        self.counters["gets" if read else "puts"] += 1
        if read:
            pending = Pending(name, gp, region.dtype, region.decode)
            raw = b""
        else:
            pending = Pending(name, gp)
            raw = _encode(region, value)
        if gp.rank == self.rank:
            self.counters["local"] += 1
            offset = gp.offset
            if not 0 <= offset < len(region.array):
                self.counters["refused"] += 1
                error = SplitcAccessError(f"Split-C: {name} {gp}: outside this rank's region")
                self._errors.append(error)
                pending._complete(error=error)
            elif read:
                pending._complete(bytes(region.raw[offset * size : (offset + 1) * size]))
            else:
                region.raw[offset * size : (offset + 1) * size] = raw
                pending._complete()
            return None, pending
        if gp.offset < 0:
            self.counters["refused"] += 1
            raise SplitcAccessError(f"Split-C: {name} {gp}: negative offset")
        op = self._new_op(pending)
        offset = gp.offset * size
        if read and type(offset) is int and offset <= _WORD_MAX:
            # request_words(READ, size, region.index, op, offset, b"") without its checks:
            # size, region index (< 256 regions) and op are in range by construction.
            first = (_READ_CODE << 28) | (size << 24) | (region.index << 16) | op
            return (first, offset, 0, 0), pending
        return request_words(kind, size, region.index, op, offset, raw), pending

    def _store(self, gp: GlobalPtr, value: Any) -> tuple[int, int, int, int] | None:
        region = self._region(gp.region)
        # One message carries up to 8 bytes: one scalar, or several small ones side by side
        # (the small-message sorts send two 32-bit keys per message, paper 003 §5.1).
        raw = np.asarray(value, dtype=region.array.dtype).reshape(-1).tobytes()
        size = len(raw)
        if size not in SCALAR_SIZES:
            raise LocalProtocolError(
                f"Split-C: a store carries 1, 2, 4 or 8 bytes, not {size}: use bulk_store"
            )
        self._check(gp, size // region.itemsize)
        self.counters["stores"] += 1
        if gp.rank == self.rank:
            self.counters["local"] += 1
            start = gp.offset * region.itemsize
            region.array.view(np.uint8)[start : start + size] = np.frombuffer(raw, np.uint8)
            self._stored += size
            return None
        offset = gp.offset * region.itemsize
        return request_words(Kind.STORE, size, region.index, 0, offset, raw)

    def _new_op(self, pending: Pending) -> int:
        if len(self._ops) >= _OPS:
            raise LocalProtocolError("Split-C: 65536 operations outstanding; call sync()")
        op = self._next_op
        while op in self._ops:
            op = (op + 1) % _OPS
        self._next_op = (op + 1) % _OPS
        self._ops[op] = pending
        return op

    # ------------------------------------------------------------------ bulk accesses

    async def bulk_get(self, dst: GlobalPtr, src: GlobalPtr, count: int) -> Pending:
        """Start fetching ``count`` elements at ``src`` into ``dst`` (on this rank); complete
        after :meth:`sync`.  One Active Message block get of any size."""
        if dst.rank != self.rank:
            raise LocalProtocolError(f"Split-C: bulk_get destination {dst} is not on this rank")
        local = self._check(dst, count)
        region = self._check(src, count)
        if local.itemsize != region.itemsize:
            raise LocalProtocolError("Split-C: bulk_get between regions of different dtypes")
        self.counters["bulk_gets"] += 1
        pending = Pending("bulk_get", src)
        size = region.itemsize
        if src.rank == self.rank or count == 0:
            self.counters["local"] += src.rank == self.rank
            data = region.array[src.offset : src.offset + count].copy()
            local.array[dst.offset : dst.offset + count] = data
            pending._complete()
            return pending
        self.counters["bulk_bytes"] += count * size
        op = self._new_op(pending)
        await self.am.get(
            self._peer[src.rank],
            (region.uam_id, src.offset * size),
            count * size,
            (local.uam_id, dst.offset * size),
            _H_GOT,
            op,
        )
        return pending

    async def bulk_put(self, dst: GlobalPtr, data: npt.ArrayLike) -> Pending:
        """Start writing ``data`` at ``dst``; complete (acknowledged) after :meth:`sync`.
        One Active Message block store of any size."""
        region, raw = self._bulk(dst, data)
        self.counters["bulk_puts"] += 1
        pending = Pending("bulk_put", dst)
        if raw is None:
            pending._complete()
            return pending
        peer = self._peer[dst.rank]
        await self.am.store(peer, raw, (region.uam_id, dst.offset * region.itemsize), _H_PUT)
        self._put_peers.setdefault(peer, []).append(pending)
        return pending

    async def bulk_store(self, dst: GlobalPtr, data: npt.ArrayLike) -> None:
        """One-way block store of ``data`` at ``dst``; the target counts its bytes for
        :meth:`store_sync`."""
        region, raw = self._bulk(dst, data, store=True)
        self.counters["bulk_stores"] += 1
        if raw is not None:
            peer = self._peer[dst.rank]
            await self.am.store(peer, raw, (region.uam_id, dst.offset * region.itemsize), _H_STORED)

    async def bulk_read(self, dst: GlobalPtr, src: GlobalPtr, count: int) -> None:
        """Blocking :meth:`bulk_get`."""
        pending = await self.bulk_get(dst, src, count)
        await self.am.wait_until(pending.is_done)

    async def bulk_write(self, dst: GlobalPtr, data: npt.ArrayLike) -> None:
        """Blocking :meth:`bulk_put`: returns once the target has the data."""
        await self.bulk_put(dst, data)
        if dst.rank != self.rank:
            await self._drain_puts(self._peer[dst.rank])

    def _bulk(
        self, dst: GlobalPtr, data: npt.ArrayLike, store: bool = False
    ) -> tuple[_Region, bytes | None]:
        region = self._region(dst.region)
        array = np.ascontiguousarray(data, dtype=region.array.dtype).reshape(-1)
        self._check(dst, len(array))
        if dst.rank == self.rank:
            self.counters["local"] += 1
            region.array[dst.offset : dst.offset + len(array)] = array
            if store:
                self._stored += array.nbytes
            return region, None
        self.counters["bulk_bytes"] += array.nbytes
        return region, array.tobytes()

    # ------------------------------------------------------------------ completion

    @property
    def done(self) -> bool:
        """Whether every get and put started so far has completed (bulk puts: only after
        :meth:`sync`, which waits for their acknowledgments)."""
        return not self._ops and not self._put_peers

    @property
    def modeled(self) -> bool:
        """Whether :meth:`compute` charges a modeled CPU (a simulated host)."""
        return self._cpu is not None

    @property
    def stored(self) -> int:
        """Bytes stored into this rank and not yet consumed by :meth:`store_sync`."""
        return self._stored

    def poll(self) -> int:
        """Run the handlers of whatever has arrived (the polling face); returns how many."""
        return self.am.poll()

    def acknowledge(self) -> int:
        """Run the handlers of whatever has arrived and send the owed acknowledgments now
        (:meth:`~stacklib.services.ActiveMessageService.acknowledge`); returns how many
        handlers ran.  Call it before a long computation on a real transport, where the rank
        answers nobody until it ends."""
        return self.am.acknowledge()

    async def sync(self) -> None:
        """Wait until every get and put this rank started has completed.

        Raises :class:`SplitcAccessError` if any of them was refused since the last sync.
        """
        await self.am.wait_until(lambda: not self._ops)
        for peer in list(self._put_peers):
            await self._drain_puts(peer)
        if self._errors:
            errors, self._errors = self._errors, []
            first = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise SplitcAccessError(f"{first}{more}")

    async def _drain_puts(self, peer: int) -> None:
        # A store is acknowledged once its handler has run (UAM, GAM), so the data is in place.
        await self.am.drain(peer)
        for pending in self._put_peers.pop(peer, []):
            pending._complete()

    async def store_sync(self, nbytes: int) -> None:
        """Wait until ``nbytes`` have been stored into this rank, then consume them."""
        await self.am.wait_until(lambda: self._stored >= nbytes)
        self._stored -= nbytes

    async def all_store_sync(self) -> None:
        """Collective: return once every store by every rank has arrived; resets the count."""
        for peer in self._peer.values():
            await self.am.drain(peer)
        await self.barrier()
        self._stored = 0

    def split_phase(self) -> AbstractAsyncContextManager[SplitC]:
        """``async with sc.split_phase():`` start gets and puts; they complete on exit."""
        return _SplitPhase(self)

    # ------------------------------------------------------------------ collectives

    async def barrier(self) -> None:
        """Wait until every rank has entered the barrier."""
        await self._gather(b"\0", 0)
        await self._broadcast_bytes(b"\0", 0)

    async def broadcast(self, value: Any, root: int = 0) -> Any:
        """``value`` of rank ``root``, on every rank (a scalar or an ndarray)."""
        array = np.asarray(value)
        data = _pack_array(array) if self.rank == root else b""
        out = _unpack_array(await self._broadcast_bytes(data, root))
        return _scalar(out)

    async def all_reduce(self, value: Any, op: str = "sum") -> Any:
        """``op`` ("sum", "max", "min", "prod") of every rank's ``value`` (scalar or ndarray,
        elementwise), on every rank."""
        reducer = _REDUCERS.get(op)
        if reducer is None:
            raise LocalProtocolError(f"Split-C: unknown reduction {op!r} ({sorted(_REDUCERS)})")
        parts = await self._gather(_pack_array(np.asarray(value)), 0)
        data = b""
        if parts is not None:
            arrays = [_unpack_array(p) for p in parts]
            total = arrays[0]
            for other in arrays[1:]:
                total = reducer(total, other)
            data = _pack_array(np.asarray(total))
        return _scalar(_unpack_array(await self._broadcast_bytes(data, 0)))

    async def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (scalar or ndarray), in rank order, on every rank."""
        parts = await self._gather(_pack_array(np.asarray(value)), 0)
        data = b""
        if parts is not None:
            data = _pack_array(np.stack([_unpack_array(p) for p in parts]))
        return [_scalar(a) for a in _unpack_array(await self._broadcast_bytes(data, 0))]

    async def _gather(self, data: bytes, root: int) -> list[bytes] | None:
        self.counters["collectives"] += 1
        if self.rank != root:
            await self._send_coll(root, data)
            return None
        parts = []
        for source in range(self.size):
            parts.append(data if source == root else await self._recv_coll(source))
        return parts

    async def _broadcast_bytes(self, data: bytes, root: int) -> bytes:
        if self.rank != root:
            return await self._recv_coll(root)
        for target in range(self.size):
            if target != root:
                await self._send_coll(target, data)
        return data

    async def _send_coll(self, target: int, data: bytes) -> None:
        if len(data) > self._slot:
            raise LocalProtocolError(
                f"Split-C: collective of {len(data)} bytes exceeds slot_bytes={self._slot}"
            )
        if len(data) <= _COLL_IN_WORDS:
            words = _COLL_WORDS.unpack(data.ljust(_COLL_IN_WORDS, b"\0"))
            await self.am.request(self._peer[target], _H_COLL_WORDS, len(data), *words)
            return
        offset = self.rank * self._slot
        await self.am.store(self._peer[target], data, (self._coll_id, offset), _H_COLL)

    async def _recv_coll(self, source: int) -> bytes:
        queue = self._coll_in[source]
        await self.am.wait_until(lambda: bool(queue))
        return queue.popleft()

    async def finish(self, linger: float = 0.01) -> None:
        """Collective: a barrier, then stay for ``linger`` seconds so that the last
        acknowledgments go out (UAM delays them, paper 000 §5.1.1) before the layer closes.

        After the barrier every rank has everything it needs, so a peer that already left
        while this rank waits for its acknowledgments is not an error.
        """
        await self.barrier()
        with trio.move_on_after(linger):
            try:
                await self.am.drain()
            except PeerUnreachable:
                return
            await trio.sleep(linger)

    # ------------------------------------------------------------------ computation

    async def compute(self, seconds: float) -> None:
        """Charge ``seconds`` of local computation to this rank's CPU (simulated hosts: it
        takes ``seconds`` plus whatever the protocol's work on that CPU takes meanwhile; real
        hosts: nothing, the computation took its own time)."""
        if seconds < 0:
            raise LocalProtocolError(f"Split-C: negative computation time {seconds}")
        self.compute_time += seconds
        cpu = self._cpu
        if cpu is None or seconds <= 0:
            return
        # The protocol comes first: UAM's work (replies, acknowledgments, copies) holds the
        # CPU whenever it has some, and the computation advances only by the time left over,
        # checked every COMPUTE_SLICE, as if the program polled that often.  (Holding the CPU
        # for the whole computation would leave peers' requests unserved until it ends, and
        # UAM would time out.)
        remaining = seconds
        while remaining > 0:
            step = min(COMPUTE_SLICE, remaining)
            before = cpu.busy_time
            await trio.sleep(step)
            stolen = min(step, cpu.busy_time - before)
            remaining -= step - stolen

    def statistics(self) -> Mapping[str, object]:
        """Operation counters, plus the Active Message service's (under ``"uam"``)."""
        return {**self.counters, "uam": self.am.statistics()}

    # ------------------------------------------------------------------ handlers

    # The handlers take the words as four parameters, not ``*words``: compiled, the service's
    # call then builds no tuple and the wrapper skips the general argument parsing.  UAM passes
    # 0-4 words, never None (a word not given is None); _given() rebuilds the tuple of before
    # for the general paths.

    def _on_request(
        self,
        peer: int,
        w0: object = None,
        w1: object = None,
        w2: object = None,
        w3: object = None,
    ) -> None:
        # The common case first: a well-formed READ of one whole element inside the region,
        # answered with the element as the reply's value words, no bytes in between.  It is the
        # general path's answer (tests/layers/splitc compare them); anything else takes that.
        if _four_words(w0, w1, w2, w3):
            first: int = w0  # type: ignore[assignment]
            index = (first >> 16) & 0xFF
            if first >> 28 == _READ_CODE and index < len(self._by_index):
                region = self._by_index[index]
                size = (first >> 24) & 0xF
                offset: int = w1  # type: ignore[assignment]
                if size == region.itemsize and region.scalar and offset + size <= region.nbytes:
                    high, low = region.element_words(offset)
                    # (Not named like the general path's ``answer``: mypyc types a local once,
                    # and an int-typed local would turn the Kind below into a plain int.)
                    reply_first = (_VALUE_CODE << 28) | (size << 24) | (first & 0xFFFF)
                    uam = self._uam
                    if uam is not None:
                        uam.reply(self._reply_handler, reply_first, 0, high, low)
                    else:
                        self._reply(self._reply_handler, reply_first, 0, high, low)
                    return
        words = _given(w0, w1, w2, w3)
        try:
            kind, size, index, op, offset, data = request_fields(words)
        except SplitcFormatError:
            self.counters["malformed"] += 1
            return
        status = Status.OK
        value = b""
        if index >= len(self._by_index):
            status = Status.NO_REGION
        else:
            region = self._by_index[index]
            view = region.raw
            end = offset + size
            exact = size == region.itemsize
            packed = kind is Kind.STORE and size % region.itemsize == 0
            if not (exact or packed) or end > len(view):
                status = Status.OUT_OF_BOUNDS
            elif kind is Kind.READ:
                value = bytes(view[offset:end])
            else:
                view[offset:end] = data[:size]
        if status is not Status.OK:
            self.counters["refused"] += 1
        if kind is Kind.STORE:
            if status is Status.OK:
                self._stored += size
            return  # one-way: the sender checked the bounds before sending
        answer = Kind.VALUE if kind is Kind.READ else Kind.ACK
        self._reply(self._reply_handler, *reply_words(answer, size, status, op, value))

    def _on_reply(
        self,
        peer: int,
        w0: object = None,
        w1: object = None,
        w2: object = None,
        w3: object = None,
    ) -> None:
        # The common case first: a well-formed VALUE or ACK with status OK for an operation
        # outstanding (the general path's outcome; anything else takes that path).
        if _four_words(w0, w1, w2, w3):
            first: int = w0  # type: ignore[assignment]
            code = first >> 28
            size = (first >> 24) & 0xF
            if (
                _VALUE_CODE <= code <= _ACK_CODE  # VALUE, ACK
                and (first >> 16) & 0xFF == 0
                # size in SCALAR_SIZES (1, 2, 4, 8) as arithmetic: no set look-up
                and ((0 < size <= 8 and not size & (size - 1)) or (size == 0 and code == _ACK_CODE))
            ):
                # (get and del, not pop(op, None): compiled, two native dict operations
                # instead of a method looked up and called.)
                ops = self._ops
                op = first & 0xFFFF
                pending = ops.get(op)
                if pending is not None:
                    del ops[op]
                    pending._complete(_ELEMENT_OF(w2, w3)[:size])
                    return
        words = _given(w0, w1, w2, w3)
        try:
            _, size, status, op, value = reply_fields(words)
        except SplitcFormatError:
            self.counters["malformed"] += 1
            return
        pending = self._ops.pop(op, None)
        if pending is None:
            self.counters["malformed"] += 1
            return
        if status is not Status.OK:
            error = SplitcAccessError(
                f"Split-C: {pending.what}: rank {self._rank_of.get(peer)} refused it "
                f"({status.name.lower().replace('_', ' ')})"
            )
            self._errors.append(error)
            pending._complete(error=error)
        else:
            pending._complete(value[:size])

    def _on_stored(self, peer: int, region: int, offset: int, nbytes: int) -> None:
        self._stored += nbytes

    def _on_put(self, peer: int, region: int, offset: int, nbytes: int) -> None:
        pass  # the data is in place; UAM's acknowledgment completes the put at the sender

    def _on_got(self, peer: int, region: int, offset: int, nbytes: int, op: int) -> None:
        pending = self._ops.pop(op, None)
        if pending is not None:
            pending._complete()

    def _on_coll(self, peer: int, region: int, offset: int, nbytes: int) -> None:
        source = self._rank_of.get(peer)
        if source is None:
            self.counters["malformed"] += 1
            return
        # Copy out now: the next collective from the same rank reuses the slot.
        self._coll_in[source].append(self._coll[offset : offset + nbytes].tobytes())

    def _on_coll_words(
        self,
        peer: int,
        w0: object = None,
        w1: object = None,
        w2: object = None,
        w3: object = None,
    ) -> None:
        """A small collective's payload: its length, then the bytes in three words."""
        source = self._rank_of.get(peer)
        if source is None or not _four_words(w0, w1, w2, w3):
            self.counters["malformed"] += 1
            return
        length: int = w0  # type: ignore[assignment]
        if length > _COLL_IN_WORDS:
            self.counters["malformed"] += 1
            return
        self._coll_in[source].append(_COLL_WORDS.pack(w1, w2, w3)[:length])


def request_op(words: Sequence[int]) -> int:
    """The op id in a request's first word (wire.py: kind, size, region, op)."""
    return words[0] & 0xFFFF


def _encode(region: _Region, value: Any) -> bytes:
    if type(value) is region.scalar_type:  # a numpy scalar of the region's type, as is
        return cast(np.generic, value).tobytes()
    return np.asarray(value, dtype=region.array.dtype).reshape(1).tobytes()


#: The dtypes of the scalars a collective packs in two bytes and its data (a marker byte no
#: header length starts with, and the dtype's index here): a reduction of one number then fits
#: in one request (:data:`_COLL_IN_WORDS`).
_SCALAR_DTYPES: Final = ("<i8", "<f8", "|b1", "<i4", "<u8", "<u4", "<f4")
_SCALAR_CODES: Final = {dtype: code for code, dtype in enumerate(_SCALAR_DTYPES)}
_SCALAR_MARK: Final = 0xFF


def _pack_array(array: npt.NDArray[Any]) -> bytes:
    """dtype, shape and data of ``array`` in one byte string (collectives' payload)."""
    if array.ndim == 0:
        code = _SCALAR_CODES.get(array.dtype.str)
        if code is not None:
            return bytes((_SCALAR_MARK, code)) + array.tobytes()
    header = f"{array.dtype.str}|{','.join(str(n) for n in array.shape)}|".encode()
    return len(header).to_bytes(2, "big") + header + np.ascontiguousarray(array).tobytes()


def _unpack_array(data: bytes) -> npt.NDArray[Any]:
    if data[0] == _SCALAR_MARK:  # (a header is never 0xFF00 bytes long)
        return np.frombuffer(data[2:], np.dtype(_SCALAR_DTYPES[data[1]])).reshape(()).copy()
    length = int.from_bytes(data[:2], "big")
    # (From the right: a dtype's own string may hold "|", as "|u1" does.)
    dtype, shape, _ = data[2 : 2 + length].decode().rsplit("|", 2)
    dims = tuple(int(n) for n in shape.split(",") if n)
    return np.frombuffer(data[2 + length :], np.dtype(dtype)).reshape(dims).copy()


def _scalar(array: npt.NDArray[Any]) -> Any:
    return array.item() if array.ndim == 0 else array


def open_splitc(
    am: ActiveMessageService,
    rank: int | None = None,
    channels: Mapping[int, int] | None = None,
    *,
    cpu: Resource | None = None,
    slot_bytes: int = 64 * 1024,
    linger: float = 0.01,
) -> AbstractAsyncContextManager[SplitC]:
    """Run Split-C over ``am`` as ``rank``, with ``channels[r]`` the peer of rank ``r``.

    Open it right after the service, with no checkpoint in between (as ``open_stack`` does), so
    the handlers are registered before it runs any: a request to an empty slot is dropped.
    ``rank`` defaults to ``STACKLIB_RANK``; returns after a barrier, when every rank is ready.
    Leaving the block runs :meth:`SplitC.finish` with ``linger`` (seconds).
    """
    if rank is None:
        rank = int(os.environ.get("STACKLIB_RANK", "0"))
    if channels is None:
        raise LocalProtocolError("Split-C: channels (rank -> peer) are required")
    return _OpenSplitC(SplitC(am, rank, channels, cpu=cpu, slot_bytes=slot_bytes), linger)


# The two context managers are classes, not @asynccontextmanager generators, so that mypyc
# compiles this module (it does not compile async generators; stacklib/compiled.py).


class _SplitPhase:
    def __init__(self, sc: SplitC) -> None:
        self._sc = sc

    async def __aenter__(self) -> SplitC:
        return self._sc

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:  # as a generator would: an error in the block skips the sync
            await self._sc.sync()


class _OpenSplitC:
    def __init__(self, sc: SplitC, linger: float) -> None:
        self._sc = sc
        self._linger = linger

    async def __aenter__(self) -> SplitC:
        await self._sc.barrier()
        return self._sc

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            await self._sc.finish(self._linger)
