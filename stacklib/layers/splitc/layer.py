"""``SplitcLayer``: Split-C as a stack layer over Active Messages (``[[layers]] kind = "splitc"``).

It runs over any :class:`~stacklib.services.ActiveMessageService`: U-Net Active Messages (the
``uam`` layer) or the Myrinet GAM library's Active Messages (the ``sim-myrinet-am`` transport's
bottom).  Assembly refuses anything else (``check_fit``: an
:class:`~stacklib.errors.AssemblyError` naming the need), as does opening over a service the
layer is handed directly.

Its rank and rank -> channel map come, in this order, from the constructor (or ``rank`` in the
recipe), from the recipe's placement (node ``i`` is rank ``i``, :meth:`SplitcLayer.place`), or
from the launcher (``STACKLIB_RANK``, ascending peers are ascending ranks).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs

from stacklib.errors import AssemblyError
from stacklib.layers.splitc.runtime import SplitC, open_splitc
from stacklib.services import ActiveMessageService, Service
from stacklib.sim import Resource
from stacklib.stack import Layer, Placement, register_layer

__all__ = ["SplitcLayer", "SplitcParams", "default_channels"]


def _optional_rank(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{attribute.name} must be a rank >= 0 or absent, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


@attrs.frozen
class SplitcParams:
    """Parameters of the Split-C layer."""

    #: This stack's rank; absent: the recipe's node index, else ``STACKLIB_RANK`` (which
    #: stacklib spawn sets).
    rank: int | None = attrs.field(default=None, validator=_optional_rank)
    #: Bytes each rank may contribute to one collective (broadcast, reduction, gather).
    slot_bytes: int = attrs.field(default=64 * 1024, validator=_positive)
    #: How long a rank stays after the closing barrier so UAM's last acknowledgments go out.
    linger_us: float = attrs.field(default=10_000.0, validator=_positive)


def default_channels(am: ActiveMessageService, rank: int) -> dict[int, int]:
    """Rank -> peer when the peers below, in ascending order, are the other ranks in ascending
    order (as :func:`stacklib.launch.bootstrap` creates the channels)."""
    others = [r for r in range(len(am.peers) + 1) if r != rank]
    return dict(zip(others, sorted(am.peers), strict=True))


@register_layer
class SplitcLayer(Layer[SplitcParams]):
    """Split-C's global address space over Active Messages (docs/splitc.md)."""

    name = "splitc"
    requires = ActiveMessageService
    provides = SplitC
    Params = SplitcParams

    def __init__(
        self,
        params: SplitcParams | None = None,
        *,
        channels: Mapping[int, int] | None = None,
        cpu: Resource | None = None,
    ) -> None:
        super().__init__(params)
        self.channels = channels
        self.cpu = cpu
        self.placed_rank: int | None = None

    def place(self, placement: Placement) -> None:
        """Rank = the recipe's node index, channels = its channel table, CPU = its host's
        (channels and CPU only where the constructor left them open).

        A recipe's one ``[[layers]]`` table serves every node, so a ``rank`` in it could be
        right for one node at most: it must be left out (or equal the node's index).
        """
        if self.params.rank is not None and self.params.rank != placement.node:
            raise AssemblyError(
                f"layer 'splitc' on node {placement.node} was given rank {self.params.rank}: "
                "in a recipe node i is rank i, so leave rank out"
            )
        self.placed_rank = placement.node
        if self.channels is None:
            self.channels = dict(placement.channels)
        if self.cpu is None:
            self.cpu = placement.cpu

    @asynccontextmanager
    async def open(self, below: Service) -> AsyncIterator[SplitC]:
        """Run Split-C over ``below`` (an :class:`ActiveMessageService`) and yield this rank's
        :class:`SplitC`; :class:`AssemblyError` naming the need for anything else."""
        self.require_below(below)
        assert isinstance(below, ActiveMessageService)  # require_below checked it
        p = self.params
        if p.rank is not None:
            rank = p.rank
        elif self.placed_rank is not None:
            rank = self.placed_rank
        else:
            rank = int(os.environ.get("STACKLIB_RANK", "0"))
        channels = self.channels if self.channels is not None else default_channels(below, rank)
        async with open_splitc(
            below,
            rank,
            channels,
            cpu=self.cpu,
            slot_bytes=p.slot_bytes,
            linger=p.linger_us * 1e-6,
        ) as sc:
            yield sc
