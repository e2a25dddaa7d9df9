"""The five Myrinet libraries as recipe transports: ``sim-myrinet-am``, ``-bip``, ``-fm``,
``-pm`` and ``-vmmc``.

Each builds paper 004's LANai 4.1 platform (:class:`~stacklib.transports.sim.lanai4.Lanai4Cluster`,
virtual time) and opens the library on every node; the library's datagram face is the bottom of
the recipe's stack, where other transports have a U-Net endpoint.  The ``[transport]`` table
takes the library's parameters by name (``GamParams``, ``BipParams``, ...), validated strictly;
BIP also takes ``synchronize`` (default true: the benchmarks' synchronization for messages of
256 bytes and more, paper 004 §4.1, as the ``myrinet`` experiment runs it)::

    [run]
    clock = "virtual"

    [transport]
    kind = "sim-myrinet-bip"

    [workload]
    kind = "logp"

The generic workloads (``pingpong``, ``bandwidth``, ``logp``) then measure the library as
``stacklib reproduce --only myrinet`` does, and datagram layers may sit on it.  GAM's bottom
is its Active Messages (:class:`~stacklib.transports.sim.myrinet_libs.gam_am.GamActiveMessages`,
whose datagram face is GAM's own), so Split-C may sit directly on ``sim-myrinet-am``.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

import attrs

from stacklib.errors import ConfigError
from stacklib.services import ActiveMessageService, DatagramService, Service
from stacklib.sim import CostProfile, World
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs.base import MyrinetLibrary
from stacklib.transports.sim.myrinet_libs.bip import Bip, BipParams
from stacklib.transports.sim.myrinet_libs.fm import Fm, FmParams
from stacklib.transports.sim.myrinet_libs.gam import Gam, GamParams
from stacklib.transports.sim.myrinet_libs.gam_am import GamActiveMessages
from stacklib.transports.sim.myrinet_libs.pm import Pm, PmParams
from stacklib.transports.sim.myrinet_libs.vmmc import Vmmc, VmmcParams

__all__ = ["LIBRARY_TRANSPORTS", "BipRecipeParams", "open_library"]


@attrs.frozen
class BipRecipeParams(BipParams):
    """BIP's parameters plus how the benchmarks ran it."""

    #: Synchronize sender and receiver for messages of 256 bytes and more (paper 004 §4.1).
    synchronize: bool = True


def _build(world: World, params: Any, names: Sequence[str], profile: CostProfile | None) -> Any:
    if profile is not None:
        raise ConfigError(
            "recipe",
            "host.profile",
            "the LANai 4.1 platform's hosts are paper 004's 200 MHz Pentium Pros: no profile",
        )
    return Lanai4Cluster(world, nodes=names)


def open_library(
    cluster: Lanai4Cluster, library: type[MyrinetLibrary], params: Any = None
) -> list[MyrinetLibrary]:
    """``library`` on every node of ``cluster`` as paper 004's benchmarks ran it: BIP with
    their synchronization for messages of 256 bytes and more (§4.1) unless ``params`` (a
    :class:`BipRecipeParams`) turns it off."""
    if library is Bip:
        synchronize = params.synchronize if isinstance(params, BipRecipeParams) else True
        return list(Bip.open(cluster, params, synchronize=synchronize))
    return list(library.open(cluster, params))  # type: ignore[attr-defined]


def _opener(library: type[MyrinetLibrary]) -> Any:
    def open_nodes(
        cluster: Lanai4Cluster, params: Any
    ) -> tuple[list[Service], list[dict[int, int]]]:
        libs = open_library(cluster, library, params)
        count = len(libs)
        # A library's peer ids are the other nodes' indices.
        peers = [{j: j for j in range(count) if j != i} for i in range(count)]
        bottoms: list[Service] = list(libs)
        if library is Gam:  # before anything is sent: the adapters register GAM handlers
            bottoms = [GamActiveMessages(typing.cast(Gam, lib)) for lib in libs]
        return bottoms, peers

    return open_nodes


def _register(name: str, library: type[MyrinetLibrary], params: type[Any]) -> TransportKind:
    face = "Active Messages" if library is Gam else "datagram face"
    return register_transport(
        TransportKind(
            name=f"sim-myrinet-{name}",
            Params=params,
            build=_build,
            description=f"{library.__name__} (paper 004) on the LANai 4.1 platform, its "
            f"{face} at the bottom of the stack, in virtual time",
            clock="virtual",
            bottom=ActiveMessageService if library is Gam else DatagramService,
            open_nodes=_opener(library),
        )
    )


#: Transport name -> kind, in paper 004's column order.
LIBRARY_TRANSPORTS: dict[str, TransportKind] = {
    kind.name: kind
    for kind in (
        _register("am", Gam, GamParams),
        _register("bip", Bip, BipRecipeParams),
        _register("fm", Fm, FmParams),
        _register("pm", Pm, PmParams),
        _register("vmmc", Vmmc, VmmcParams),
    )
}
