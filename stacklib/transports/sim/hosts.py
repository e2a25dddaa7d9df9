"""Host machines of the papers' clusters, as data with citations.

The host's CPU speed matters where the host does protocol work: the SBA-100's user-level AAL5
library and traps (paper 000 §4.1), the DC21140's kernel trap and interrupt routines
(paper 001 §3, paper 003 §4.3), and computation charged by application benchmarks.  NI models
take their host-side costs from the papers' own measurements on these machines; this table
names the machines and carries what the papers say of them.
"""

from __future__ import annotations

import attrs

from stacklib.sim.costs import ProtocolCosts, cited

#: The SPARCstation-20's per-message UDP and TCP costs (paper 000 Table 3's calibration).
SS20_PROTOCOL = ProtocolCosts()


def _by_clock(mhz: float) -> ProtocolCosts:
    """The SS-20's protocol costs on a host of ``mhz``, by the ratio of clock rates (the
    first-order model of host-side work, docs/reproduction.md): no paper measures U-Net UDP
    or TCP on another host."""
    return SS20_PROTOCOL.scaled(60.0 / mhz)


@attrs.frozen
class HostModel:
    """A workstation of the papers."""

    name: str
    cpu: str
    mhz: float
    io_bus: str
    cite: str
    #: Memory-copy speed, bytes per microsecond (MB/s), where a paper states or implies it.
    copy_mb_per_s: float = 0.0
    #: Host CPU per UDP datagram and per TCP segment, beyond copies and checksums, which the
    #: UDP and TCP layers charge where the host is simulated (their ``datagram_us`` and
    #: ``segment_us`` override it); the SS-20's unless given.
    protocol: ProtocolCosts = SS20_PROTOCOL


HOSTS: dict[str, HostModel] = {
    "ss20": HostModel(
        "ss20",
        "60 MHz SuperSPARC (SPARCstation-20)",
        60.0,
        "SBus",
        "paper 000 §4.1-4.2: 60Mhz SPARCstation-20s running SunOS 4.1.3",
        # UAM block transfers cost 0.2 us/byte per round trip vs raw U-Net's ~0.125, for two
        # copies per direction (paper 000 §5.2): (0.2 - 0.125) / 4 = 0.019 us/byte per copy.
        copy_mb_per_s=53.0,
        protocol=SS20_PROTOCOL,
    ),
    "ss10": HostModel(
        "ss10",
        "50 MHz SuperSPARC (SPARCstation-10)",
        50.0,
        "SBus",
        "paper 000 §4.2: three 50Mhz SPARCstation-10",
        copy_mb_per_s=44.0,
        protocol=_by_clock(50.0),
    ),
    "p120": HostModel(
        "p120",
        "120 MHz Pentium",
        120.0,
        "PCI",
        "paper 003 §4.1, §4.3.2: 120 Mhz Pentium systems running Linux",
        copy_mb_per_s=70.0,  # paper 003 §4.4.1: "memory-copy speed is about 70Mbytes/sec"
        protocol=_by_clock(120.0),
    ),
    "p133": HostModel(
        "p133",
        "133 MHz Pentium",
        133.0,
        "PCI",
        "paper 001 §3: a 133Mhz Pentium system running Linux",
        copy_mb_per_s=70.0,
        protocol=_by_clock(133.0),
    ),
    "ppro200": HostModel(
        "ppro200",
        "200 MHz Pentium Pro (440FX, 256 KB L2)",
        200.0,
        "32-bit 33 MHz PCI (133 MB/s)",
        "paper 004 §3",
        protocol=_by_clock(200.0),
    ),
}


@attrs.frozen
class PciBus:
    """A 32-bit 33 MHz PCI bus (paper 004 §3: 133 MB/s)."""

    peak_mb_per_s: float = cited(133.0, "paper 004 §3: 32-bit 33 MHz PCI, 133 MB/s", "MB/s")
