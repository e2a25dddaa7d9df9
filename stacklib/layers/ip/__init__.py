"""IPv4 over U-Net and over Ethernet (paper 000 §7.1, §7.5), with ICMP echo and ARP.

:mod:`~stacklib.layers.ip.wire` holds the formats (IPv4, ICMP, ARP, Ethernet II) and the
Internet checksum; :mod:`~stacklib.layers.ip.machine` the sans-IO parts (fragment reassembly,
the ARP cache); :mod:`~stacklib.layers.ip.service` the contracts (:class:`IpService`,
:class:`UdpService`, :class:`FrameService`); :mod:`~stacklib.layers.ip.driver` the trio layers
``"ip"`` (over U-Net channels) and ``"ip-ether"`` (over Ethernet frames).  See docs/tcpip.md.
"""

from __future__ import annotations

from stacklib.layers.ip.driver import (
    IpEtherLayer,
    IpEtherParams,
    IpEtherStack,
    IpLayer,
    IpParams,
    IpStack,
    UNetIpStack,
)
from stacklib.layers.ip.machine import ArpCache, Reassembler, Transmit
from stacklib.layers.ip.service import (
    FrameService,
    IpService,
    ProtocolEndpoint,
    UdpService,
    UdpSocket,
)

__all__ = [
    "ArpCache",
    "FrameService",
    "IpEtherLayer",
    "IpEtherParams",
    "IpEtherStack",
    "IpLayer",
    "IpParams",
    "IpService",
    "IpStack",
    "ProtocolEndpoint",
    "Reassembler",
    "Transmit",
    "UNetIpStack",
    "UdpService",
    "UdpSocket",
]
