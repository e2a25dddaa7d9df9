"""The machines of the papers' Split-C comparisons, as data with citations (paper 000 Table 2,
paper 003 §5), and a simple NI for the two supercomputers.

A :class:`Machine` names its network (a simulated U-Net cluster, or :class:`MachineNI` for the
CM-5 and the Meiko CS-2), the host of each rank, and what local computation costs there
(:class:`CpuCosts`, per operation of the benchmark programs).  The Split-C benchmarks charge
their computation to the rank's simulated CPU from these costs (stacklib/bench/splitc).

The papers give clock rates, not costs per operation.  The costs of the SPARCstation-20 and the
120 MHz Pentium are **calibrated** from the 2-node columns of paper 003 Table 1 only (docs/splitc.md
says how); other hosts scale by clock rate from them (a first-order model, as
:func:`stacklib.transports.sim.host_scale`); the 4- and 8-node columns and Table 2 are
predictions.

:class:`MachineNI` models a machine by paper 000 Table 2's three numbers: the message overhead
(host CPU per message, half on each side), the round trip (the rest of it is wire latency) and
the network bandwidth.  It is the memory transport with those costs in virtual time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from stacklib.errors import ConfigError
from stacklib.sim import Host, World
from stacklib.transports.memory import MemoryAddress, MemoryNetwork, MemoryNI
from stacklib.transports.sim import (
    AtmParams,
    FastEthernetParams,
    SimCluster,
    build_atm,
    build_fe,
)
from stacklib.transports.sim.params import FaultParams
from stacklib.unet.endpoint import Channel, Endpoint
from stacklib.unet.ni import Payload
from stacklib.unet.node import Node
from stacklib.unet.os_service import OSService
from stacklib.wire.descriptor import SendDescriptor

__all__ = [
    "CALIBRATED_HOSTS",
    "CALIBRATION_POINTS",
    "HOST_CPUS",
    "MACHINES",
    "SMALL_BLOCK_BYTES",
    "CpuCosts",
    "Machine",
    "MachineNI",
    "NetworkModel",
    "build_machine",
]


@attrs.frozen
class CpuCosts:
    """Microseconds of local computation per operation on one host."""

    #: One double-precision multiply-add (matrix multiply of large blocks, conjugate gradient).
    madd_us: float
    #: One key through a linear pass (histogram, bucket, pack, place).
    key_us: float
    #: One comparison of a local sort (a sort of n keys costs n log2 n of them).
    compare_us: float
    #: One edge examined by connected components.
    edge_us: float
    #: One multiply-add of a block multiply whose three blocks fit in the first-level data
    #: cache (:data:`SMALL_BLOCK_BYTES`: mm 16x16's 2 KB blocks), which costs differently from
    #: one that streams 128 KB blocks through the second level.
    madd_small_us: float
    cite: str

    def scaled(self, factor: float, cite: str) -> CpuCosts:
        """These costs times ``factor`` (a slower clock: factor > 1)."""
        return CpuCosts(
            self.madd_us * factor,
            self.key_us * factor,
            self.compare_us * factor,
            self.edge_us * factor,
            self.madd_small_us * factor,
            cite,
        )


#: A block multiply charges :attr:`CpuCosts.madd_small_us` when its three blocks of doubles
#: fit in this many bytes: the Pentium's 8 KB first-level data cache, the smaller of the two
#: hosts' (not in the papers: the Pentium's and the SuperSPARC's data sheets).
SMALL_BLOCK_BYTES = 8 * 1024


#: Calibrated against paper 003 Table 1's 2-node ATM column (SPARCstation-20s): mm 128x128
#: for the multiply-add, mm 16x16 for the small-block one, rsortlg for a key, ssortlg for a
#: comparison (docs/splitc.md); the values ``calibrate("atm")`` in
#: stacklib/bench/splitc/programs.py gives, rounded.
SS20 = CpuCosts(
    madd_us=0.1019,
    key_us=0.7082,
    compare_us=0.0993,
    edge_us=0.7082,  # no paper figure: taken equal to a key
    madd_small_us=0.1183,
    cite="calibrated: paper 003 Table 1, ATM 2 nodes (mm 128x128, mm 16x16, rsortlg, ssortlg)",
)
#: Calibrated against paper 003 Table 1's 2-node FE column (120 MHz Pentiums).
P120 = CpuCosts(
    madd_us=0.2128,
    key_us=0.7834,
    compare_us=0.0916,
    edge_us=0.7834,  # no paper figure: taken equal to a key
    madd_small_us=0.1592,
    cite="calibrated: paper 003 Table 1, FE 2 nodes (mm 128x128, mm 16x16, rsortlg, ssortlg)",
)

#: The calibration points (seconds): paper 003 Table 1's 2-node columns, network -> benchmark
#: -> time, each fixing one cost of the host in :data:`CALIBRATED_HOSTS`, in this order
#: (``calibrate`` in stacklib.bench.splitc.programs re-derives them).
CALIBRATION_POINTS: dict[str, dict[str, float]] = {
    "atm": {"mm128": 56.59, "mm16": 1.26, "rsortlg": 4.73, "ssortlg": 2.03},
    "fe": {"mm128": 117.00, "mm16": 1.67, "rsortlg": 5.35, "ssortlg": 2.06},
}
#: Network -> (cluster, calibrated host): the 2-node runs use the first two ranks.
CALIBRATED_HOSTS: dict[str, tuple[str, str]] = {
    "atm": ("atm-003", "ss20"),
    "fe": ("fe-003", "p120"),
}

HOST_CPUS: dict[str, CpuCosts] = {
    "ss20": SS20,
    "ss10": SS20.scaled(60.0 / 50.0, "SS-20 costs x 60/50 MHz (paper 000 §4.2)"),
    "p120": P120,
    "p90": P120.scaled(120.0 / 90.0, "Pentium 120 costs x 120/90 MHz (paper 003 §5)"),
    # paper 000 Table 2: "the CM-5's processors are slower than the Meiko's and the ATM
    # cluster's"; by clock from the SS-20 (a SPARC-2 does less per clock than a SuperSPARC,
    # which this first-order model ignores).
    "cm5": SS20.scaled(60.0 / 33.0, "SS-20 costs x 60/33 MHz (paper 000 Table 2: 33 MHz SPARC-2)"),
    "meiko": SS20.scaled(
        60.0 / 40.0, "SS-20 costs x 60/40 MHz (paper 000 Table 2: 40 MHz SuperSPARC)"
    ),
}


#: Bytes of the message Table 2's round trip is measured with: a UAM request of four words.
SMALL_MESSAGE = 24


@attrs.frozen
class NetworkModel:
    """Paper 000 Table 2's communication figures of a machine (its "Mb/s" column is read as
    MB/s: the U-Net ATM row's 14 is the 14-15 MB/s of paper 000 §4.2)."""

    overhead_us: float
    round_trip_us: float
    bandwidth_mb_per_s: float
    cite: str

    @property
    def latency_us(self) -> float:
        """One way, less the overheads: the round trip is two overheads and two latencies."""
        return self.round_trip_us / 2 - self.overhead_us


CM5_NET = NetworkModel(
    overhead_us=3.0,
    round_trip_us=12.0,
    bandwidth_mb_per_s=10.0,
    cite="paper 000 Table 2: CM-5 message overhead 3 us, round trip 12 us, 10 MB/s",
)
MEIKO_NET = NetworkModel(
    overhead_us=11.0,
    round_trip_us=25.0,
    bandwidth_mb_per_s=39.0,
    cite="paper 000 Table 2: Meiko CS-2 message overhead 11 us, round trip 25 us, 39 MB/s",
)


class MachineNI(MemoryNI):
    """An NI with paper 000 Table 2's costs: half the message overhead on the sender's CPU,
    the bytes at the network bandwidth on the sender's link, the latency, then the other half
    on the receiver's CPU."""

    kind = "machine"

    def __init__(self, name: str, host: Host, network: MemoryNetwork, model: NetworkModel) -> None:
        super().__init__(name, host, network)
        # Every message pays Table 2's costs in transmit: never the memory transport's
        # immediate one-copy path, which skips it.
        self.immediate = False
        self.model = model
        self._link_free = 0.0

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        world = self.world
        model = self.model
        half = model.overhead_us * 0.5e-6
        sent = self.host.resource("cpu").hold(half)
        start = max(sent, self._link_free)
        self._link_free = start + len(data) / (model.bandwidth_mb_per_s * 1e6)
        # Table 2's round trip is of small messages and includes their time on the wire: the
        # latency is what is left after a four-word UAM request (24 bytes) has been sent.
        small = SMALL_MESSAGE / (model.bandwidth_mb_per_s * 1e6)
        arrival = self._link_free + max(0.0, model.latency_us * 1e-6 - small)
        destination: MemoryAddress = channel.tx_tag  # type: ignore[assignment]
        node = self.network.nodes[destination.node]
        key = (self.name, endpoint.port, destination.port)
        world.call_at(arrival, _receive, node, half, key, bytes(data), descriptor.dest_offset)
        self.injected(endpoint, descriptor, len(data))
        return True


def _receive(node: Node, half: float, key: object, data: bytes, offset: int | None) -> None:
    node.host.resource("cpu").hold(half, node.ni.deliver, key, data, offset)


@attrs.frozen
class Machine:
    """A machine of the papers' comparisons."""

    name: str
    description: str
    #: "sim-atm", "sim-fe" or "table2" (a :class:`MachineNI` with :attr:`network`).
    kind: str
    #: The host of each rank, in rank order (the first N are used for N ranks).
    hosts: tuple[str, ...]
    cite: str
    network: NetworkModel | None = None
    #: Host name -> costs that replace :data:`HOST_CPUS`' (trial costs while calibrating).
    costs: Mapping[str, CpuCosts] = attrs.field(factory=dict)

    def cpu(self, rank: int) -> CpuCosts:
        """What computation costs on ``rank``'s host."""
        host = self.hosts[rank % len(self.hosts)]
        return self.costs.get(host) or HOST_CPUS[host]


MACHINES: dict[str, Machine] = {
    "unet-atm": Machine(
        "unet-atm",
        "U-Net ATM cluster: five 60 MHz SPARCstation-20s and three 50 MHz SPARCstation-10s, "
        "SBA-200, ASX-200",
        "sim-atm",
        ("ss20",) * 5 + ("ss10",) * 3,
        "paper 000 §4.2",
    ),
    "atm-003": Machine(
        "atm-003",
        "paper 003's ATM cluster: 4 SPARCstation-20s and 4 SPARCstation-10s, SBA-200, ASX-200",
        "sim-atm",
        ("ss20",) * 4 + ("ss10",) * 4,
        "paper 003 §5",
    ),
    "fe-003": Machine(
        "fe-003",
        "paper 003's Fast Ethernet cluster: seven 120 MHz and one 90 MHz Pentium, DC21140, "
        "Bay Networks 28115 switch",
        "sim-fe",
        ("p120",) * 7 + ("p90",),
        "paper 003 §5",
    ),
    "cm5": Machine(
        "cm5",
        "TMC CM-5: 33 MHz SPARC-2, 3 us overhead, 12 us round trip, 10 MB/s",
        "table2",
        ("cm5",),
        "paper 000 Table 2",
        CM5_NET,
    ),
    "meiko": Machine(
        "meiko",
        "Meiko CS-2: 40 MHz SuperSPARC, 11 us overhead, 25 us round trip, 39 MB/s",
        "table2",
        ("meiko",),
        "paper 000 Table 2",
        MEIKO_NET,
    ),
}


def build_machine(
    world: World, name: str, names: Sequence[str], faults: FaultParams | None = None
) -> SimCluster | MemoryNetwork:
    """The network of machine ``name`` with one node per name (``.nodes`` maps them)."""
    machine = MACHINES.get(name)
    if machine is None:
        raise ConfigError("transport", "machine", f"unknown machine {name!r} ({sorted(MACHINES)})")
    fault = faults or FaultParams()
    if machine.kind == "sim-atm":
        # Every node's NI is modeled with the SS-20's host costs; the SS-10s differ in
        # computation (CpuCosts), which dominates the programs.
        return build_atm(world, AtmParams(host="ss20", faults=fault), names, None)
    if machine.kind == "sim-fe":
        params = FastEthernetParams(interconnect="bay28115", host="p120", faults=fault)
        return build_fe(world, params, names, None)
    model = machine.network
    if model is None:
        raise ConfigError("transport", "machine", f"{name!r} has no network model")
    network = MemoryNetwork(world)
    for node_name in names:
        host = Host(node_name, world, None)
        ni = MachineNI(node_name, host, network, model)
        network.nodes[node_name] = Node(node_name, host, ni, OSService(ni))
    return network
