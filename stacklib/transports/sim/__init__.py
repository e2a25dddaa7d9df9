"""Simulated network interfaces with cost models, in virtual time (paper 000 §4, paper 001 §3,
paper 003 §4, paper 004 §3).

A simulated cluster is a :class:`~stacklib.transports.sim.fabric.Fabric` (links and a switch or
hub) and one node per host, each with a modeled NI.  The models register as transports:
``sim-atm`` (SBA-100, SBA-200 and PCA-200 with U-Net firmware, Fore's firmware) and, as they
arrive, Fast Ethernet and Myrinet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import attrs

from stacklib.errors import ConfigError
from stacklib.sim import CostProfile, Host, World
from stacklib.sim.costs import cited
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.sim.atm import I960NI, Sba100NI
from stacklib.transports.sim.ethernet import FE_INTERCONNECTS, Dc21140NI
from stacklib.transports.sim.fabric import Fabric
from stacklib.transports.sim.hosts import HOSTS
from stacklib.transports.sim.links import OC3, TAXI_140, AtmLink, EthernetLink
from stacklib.transports.sim.myrinet import MyrinetParams, build_myrinet
from stacklib.transports.sim.ni import SimAddress, SimNI
from stacklib.transports.sim.params import I960_MODELS, Dc21140Params, FaultParams, Sba100Params
from stacklib.unet.node import Node
from stacklib.unet.os_service import OSService

ATM_LINKS: dict[str, AtmLink] = {"taxi-140": TAXI_140, "oc-3": OC3}


class SimCluster:
    """The nodes of a simulated cluster and the fabric joining them."""

    def __init__(self, world: World, fabric: Fabric) -> None:
        self.world = world
        self.fabric = fabric
        self.nodes: dict[str, Node] = {}

    def add(self, name: str, host: Host, ni: SimNI) -> Node:
        node = Node(name, host, ni, OSService(ni))
        self.nodes[name] = node
        return node


@attrs.frozen
class AtmParams:
    """Recipe parameters of the ``sim-atm`` transport."""

    ni: Literal["sba200", "pca200", "fore-firmware", "sba100"] = "sba200"
    link: Literal["taxi-140", "oc-3"] = "taxi-140"
    #: Per-node link technologies overriding ``link`` (node i gets ``links[i]``), e.g. an OC-3
    #: sender and a TAXI receiver as in paper 003 §4.4.2's bandwidth measurement.
    links: list[Literal["taxi-140", "oc-3"]] = attrs.Factory(list)
    #: Switch forwarding latency per cell.
    switch_latency_us: float = cited(
        7.0, "paper 003 §4.1: the ASX-200 forwards cells in about 7 us", "us"
    )
    #: The host machine (stacklib.transports.sim.hosts.HOSTS); host-side costs scale by clock
    #: rate from the machine the paper measured them on, the default.
    host: str | None = None
    faults: FaultParams = attrs.Factory(FaultParams)
    #: Replace model parameters by name, e.g. {tx_cell_us = 1.0}: "what if" experiments.
    overrides: dict[str, float] = attrs.Factory(dict)


def build_atm(
    world: World,
    params: AtmParams,
    names: Sequence[str],
    profile: CostProfile | None,
    i960_class: type[I960NI] = I960NI,
    **ni_options: Any,
) -> SimCluster:
    """An ATM cluster; ``i960_class`` and ``ni_options`` let a variant of the i960 NI (such as
    U-Net/MM's) reuse the fabric and host set-up."""
    fabric = Fabric(
        world,
        ATM_LINKS[params.link],
        topology="switch",
        latency=params.switch_latency_us * 1e-6,
        faults=params.faults,
        name="atm",
    )
    cluster = SimCluster(world, fabric)
    if len(params.links) > len(names):
        raise ConfigError("transport", "links", f"{len(params.links)} links for {len(names)} nodes")
    for index, name in enumerate(names):
        host = Host(name, world, profile)
        link = ATM_LINKS[params.links[index]] if index < len(params.links) else None
        ni: SimNI
        if params.ni == "sba100":
            sba100 = _override(Sba100Params(), params.overrides)
            host_name = params.host or sba100.reference_host
            ni = Sba100NI(
                name,
                host,
                fabric,
                sba100,
                link,
                host_scale=host_scale(sba100.reference_host, host_name),
            )
        else:
            model = _override(I960_MODELS[params.ni](), params.overrides)
            host_name = params.host or model.reference_host
            ni = i960_class(
                name,
                host,
                fabric,
                model,
                link,
                host_scale=host_scale(model.reference_host, host_name),
                **ni_options,
            )
        ni.host_copy_per_byte = copy_cost(host_name)
        ni.host_protocol = HOSTS[host_name].protocol
        cluster.add(name, host, ni)
    return cluster


P = TypeVar("P")


def copy_cost(host: str) -> float:
    """Seconds per byte of a memory copy on ``host`` (0 where no paper gives its speed)."""
    speed = HOSTS[host].copy_mb_per_s
    return 1e-6 / speed if speed else 0.0


def host_scale(reference: str, host: str) -> float:
    """How much longer host-side work takes on ``host`` than on the machine the paper measured
    it on: the ratio of clock rates (a first-order model; docs/reproduction.md)."""
    if host not in HOSTS:
        known = ", ".join(HOSTS)
        raise ConfigError("transport", "host", f"unknown host {host!r} (known: {known})")
    return HOSTS[reference].mhz / HOSTS[host].mhz


def _override(model: P, overrides: dict[str, float]) -> P:
    fields = {f.name for f in attrs.fields(type(model))}  # type: ignore[arg-type]
    for key in overrides:
        if key not in fields:
            raise ConfigError("transport", f"overrides.{key}", f"not a parameter of {model!r}")
    return attrs.evolve(model, **overrides)  # type: ignore[misc]


@attrs.frozen
class FastEthernetParams:
    """Recipe parameters of the ``sim-fe`` transport."""

    interconnect: Literal["hub", "bay28115", "fn100"] = "hub"
    #: The host machine; host-side costs scale by clock rate from paper 003's 120 MHz Pentium.
    host: str | None = None
    faults: FaultParams = attrs.Factory(FaultParams)
    #: Replace DC21140 model parameters by name.
    overrides: dict[str, float] = attrs.Factory(dict)


def build_fe(
    world: World,
    params: FastEthernetParams,
    names: Sequence[str],
    profile: CostProfile | None,
    ni_class: type[Dc21140NI] = Dc21140NI,
    **ni_options: Any,
) -> SimCluster:
    """A Fast Ethernet cluster; ``ni_class`` and ``ni_options`` as for :func:`build_atm`."""
    interconnect = FE_INTERCONNECTS[params.interconnect]
    fabric = Fabric(
        world,
        EthernetLink(),
        topology=interconnect.topology,
        latency=interconnect.latency_us * 1e-6,
        store_and_forward=True,
        faults=params.faults,
        name=f"fe-{interconnect.name}",
    )
    cluster = SimCluster(world, fabric)
    model = _override(Dc21140Params(), params.overrides)
    host_name = params.host or model.reference_host
    scale = host_scale(model.reference_host, host_name)
    for name in names:
        host = Host(name, world, profile)
        ni = ni_class(name, host, fabric, model, host_scale=scale, **ni_options)
        ni.host_copy_per_byte = copy_cost(host_name)
        ni.host_protocol = HOSTS[host_name].protocol
        cluster.add(name, host, ni)
    return cluster


register_transport(
    TransportKind(
        name="sim-fe",
        Params=FastEthernetParams,
        build=build_fe,
        description="DEC 21140 Fast Ethernet with U-Net/FE in the kernel, on a hub or a Bay "
        "28115 / Cabletron FN100 switch, in virtual time",
        clock="virtual",
    )
)

register_transport(
    TransportKind(
        name="sim-myrinet",
        Params=MyrinetParams,
        build=build_myrinet,
        description="Myrinet LANai 4.1 (PCI) with a raw U-Net control program: PIO, PIO+WC "
        "or DMA sends, one cut-through switch, in virtual time",
        clock="virtual",
    )
)

register_transport(
    TransportKind(
        name="sim-atm",
        Params=AtmParams,
        build=build_atm,
        description="Fore ATM NIs (SBA-100, SBA-200/PCA-200 U-Net firmware, Fore firmware) "
        "on an ASX-200 switch, in virtual time",
        clock="virtual",
    )
)

__all__ = ["AtmParams", "SimAddress", "SimCluster", "build_atm"]
