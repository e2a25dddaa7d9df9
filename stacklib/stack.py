"""Layers and stacks: composing protocols bottom-up over a transport.

A layer (paper 000 §7.2's "toolbox" piece) is three things side by side: a construct wire format
for its PDU, a sans-IO core holding the protocol state (events in; PDUs, deliveries and the next
timer deadline out; no I/O, no clock), and a thin trio driver that feeds the core from the
service below and offers a service above.  This module holds what every layer shares: the
:class:`Layer` base class with its declared services, the registry that recipes name layers by,
and :func:`open_stack`, which checks the fit and opens the layers in order (:func:`open_stacks`
opens several side by side, for layers such as Split-C's whose opening waits for the peers).

See docs/writing-a-layer.md for a layer written end to end.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import attrs
import trio

from stacklib import builtin
from stacklib.errors import AssemblyError
from stacklib.registry import Registry
from stacklib.services import Service

if TYPE_CHECKING:
    from stacklib.sim import Resource


@attrs.frozen
class Placement:
    """Where a stack runs among its peers, as a recipe knows it (:meth:`Layer.place`)."""

    #: This stack's node: 0 .. ``nodes`` - 1 (a Split-C layer takes it as its rank).
    node: int
    #: How many nodes the recipe built.
    nodes: int
    #: Every other node's index -> the peer id the bottom service reaches it by (a U-Net
    #: endpoint's channel id, or a library's peer index).
    channels: Mapping[int, int]
    #: The node's simulated host CPU in virtual time, to charge modeled computation to; None in
    #: real time.
    cpu: Resource | None = None


P = TypeVar("P")


class Layer(abc.ABC, Generic[P]):
    """A protocol layer with parameters of type ``P``.  Subclasses name it
    (``class ArqLayer(Layer[ArqParams])``), set the class attributes and implement
    :meth:`open`; mypy then checks ``self.params`` and the constructor's argument."""

    #: Registry name, used by recipes (``[[layers]] kind = "..."``).
    name: ClassVar[str]
    #: The service this layer needs from the layer below.
    requires: ClassVar[type[Service]]
    #: The service this layer offers to the layer above.
    provides: ClassVar[type[Service]]
    #: An attrs class of the layer's parameters, validated strictly from recipes; its
    #: defaults must make a working layer (``Layer()`` uses them).
    Params: type[P]

    def __init__(self, params: P | None = None) -> None:
        self.params: P = params if params is not None else self.Params()

    def __repr__(self) -> str:
        return f"<layer {self.name}>"

    def place(self, placement: Placement) -> None:
        """Learn where the stack runs before :meth:`open` (recipes call it on every layer).

        Most layers need nothing of it; one that does (Split-C's rank and channel map) fills
        what its parameters leave open, so a recipe need not spell each node out.
        """
        return None

    def require_below(self, below: Service) -> None:
        """Raise :class:`AssemblyError` unless ``below`` provides what this layer requires
        (for layers opened directly, without :func:`open_stack`'s check)."""
        if not isinstance(below, self.requires):
            kind = self.requires.kind
            raise AssemblyError(
                f"layer {self.name!r} requires {_a(kind)} {kind!r} service "
                f"({self.requires.__name__}), got {type(below).__name__}"
            )

    @abc.abstractmethod
    def open(self, below: Service) -> AbstractAsyncContextManager[Service]:
        """Run the layer over ``below``: an async context manager yielding the service above.

        Background tasks (timers, a receive loop) live in a nursery inside it, so leaving the
        context stops them.
        """


S = TypeVar("S", bound=Service)


@asynccontextmanager
async def serve(
    service: S,
    tasks: Sequence[tuple[Callable[[], Awaitable[object]], str]],
    close: Callable[[], object],
) -> AsyncIterator[S]:
    """Yield ``service`` while its background ``tasks`` (function, name) run in a nursery.

    The shape of a layer driver's ``open``: leaving the block cancels the tasks and calls
    ``close``; an exception raised in the block is re-raised as itself, outside the nursery,
    so the caller does not get it wrapped in an ExceptionGroup.
    """
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        for function, name in tasks:
            nursery.start_soon(function, name=name)
        try:
            yield service
        except BaseException as error:
            body_error = error
        finally:
            nursery.cancel_scope.cancel()
            close()
    if body_error is not None:
        raise body_error


def _accept_layer(obj: object) -> type[Layer[Any]] | None:
    return obj if isinstance(obj, type) and issubclass(obj, Layer) else None


#: Every layer recipes can name (built-ins, entry points in ``stacklib.layers``, import paths).
LAYERS: Registry[type[Layer[Any]]] = Registry(
    "layer",
    builtin=builtin.LAYERS,
    name_of=lambda cls: cls.name,
    accept=_accept_layer,
    expected="a Layer subclass",
)

L = TypeVar("L", bound=type[Layer[Any]])


def register_layer(cls: L) -> L:
    """Class decorator: make a layer available to recipes under ``cls.name``."""
    LAYERS.register(cls)
    return cls


def layer_class(name: str) -> type[Layer[Any]]:
    """The layer registered as ``name`` (or an import path ``"module:Class"``); an unknown
    name raises :class:`~stacklib.registry.UnknownName` (a ``KeyError``) naming the known ones."""
    return LAYERS[name]


def _a(word: str) -> str:
    """The indefinite article for ``word``."""
    return "an" if word[:1] in ("a", "e", "i", "o", "u") else "a"


def check_fit(bottom: type[Service], layers: Sequence[Layer[Any]], bottom_name: str = "") -> None:
    """Raise :class:`AssemblyError` unless every layer gets the service it requires."""
    below_type = bottom
    below_name = bottom_name or f"the transport ({bottom.kind})"
    for position, layer in enumerate(layers):
        if not issubclass(below_type, layer.requires):
            needed = layer.requires
            raise AssemblyError(
                f"layer {layer.name!r} (position {position}) requires {_a(needed.kind)} "
                f"{needed.kind!r} service ({needed.__name__}), but {below_name} below it "
                f"provides {below_type.kind!r} ({below_type.__name__})"
            )
        below_type = layer.provides
        below_name = f"layer {layer.name!r}"


@asynccontextmanager
async def open_stack(bottom: Service, layers: Sequence[Layer[Any]]) -> AsyncIterator[Service]:
    """Open ``layers`` bottom-up over ``bottom`` and yield the top service.

    The fit is checked before anything is opened; leaving the context closes the layers top
    down.
    """
    check_fit(type(bottom), layers)
    async with AsyncExitStack() as stack:
        service = bottom
        for layer in layers:
            service = await stack.enter_async_context(layer.open(service))
            if not isinstance(service, layer.provides):
                raise AssemblyError(
                    f"layer {layer.name!r} declared {layer.provides.__name__} but opened "
                    f"{type(service).__name__}"
                )
        yield service


@asynccontextmanager
async def open_stacks(
    stacks: Sequence[tuple[Service, Sequence[Layer[Any]]]],
) -> AsyncIterator[list[Service]]:
    """Open several stacks side by side and yield their top services, in order.

    Each stack opens and closes in a task of its own, all at once: a layer whose opening or
    closing waits for its peers (Split-C's barriers) would hang :func:`open_stack` called for
    one node after another.  An error opening any stack cancels the others and is raised as
    itself, as is an error raised in the block.
    """
    count = len(stacks)
    tops: list[Service | None] = [None] * count
    all_open = trio.Event()
    release = trio.Event()
    opened = 0

    async def hold(index: int, bottom: Service, layers: Sequence[Layer[Any]]) -> None:
        nonlocal opened
        async with open_stack(bottom, layers) as top:
            tops[index] = top
            opened += 1
            if opened == count:
                all_open.set()
            await release.wait()

    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            for index, (bottom, layers) in enumerate(stacks):
                nursery.start_soon(hold, index, bottom, layers, name=f"stack {index}")
            if count == 0:
                all_open.set()
            await all_open.wait()
            try:
                yield [top for top in tops if top is not None]
            except BaseException as error:
                body_error = error
            finally:
                release.set()
    except BaseExceptionGroup as group:
        raise _first_error(group) from None
    if body_error is not None:
        raise body_error


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of ``group``: one node's error (the others' are usually the same)."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
