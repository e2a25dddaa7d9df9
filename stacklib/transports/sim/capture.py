"""Captures of simulated links that Wireshark and tshark open (docs/captures.md).

A capture taps a :class:`~stacklib.transports.sim.fabric.Fabric` and writes every delivered
message, stamped with the virtual time its last unit reached the receiving NI:

* Ethernet fabrics as LINKTYPE_ETHERNET: the U-Net/FE frame of paper 001 §3.2 (EtherType
  0x88B5, message length, destination port), MAC addresses ``02:00:00:00:00:NN`` (locally
  administered) by node;
* ATM fabrics as LINKTYPE_SUNATM: one record per AAL5 PDU with its VCI (the channel's), the
  AAL5 message after the pseudo-header.

Other links (Myrinet) have no capture format: asking for one raises
:class:`~stacklib.errors.ConfigError`.  A message lost on the fabric never reaches a tap; a
corrupted one is written as delivered and marked nowhere (the receiving NI drops it on its
CRC/FCS check).  Wireshark dissects the U-Net header, UAM and Split-C with the dissector stacklib
ships (:mod:`stacklib.wireshark`).
"""

from __future__ import annotations

import os

from stacklib.errors import ConfigError
from stacklib.transports.sim.fabric import Fabric, Packet
from stacklib.transports.sim.links import AtmLink, EthernetLink
from stacklib.wire import unet_eth
from stacklib.wire.pcap import LinkType, PcapWriter, sunatm_record


class FabricCapture:
    """Writes a fabric's traffic to a pcap file until closed."""

    def __init__(self, fabric: Fabric, path: str | os.PathLike[str]) -> None:
        tech = fabric.tech
        if isinstance(tech, EthernetLink):
            linktype = LinkType.ETHERNET
        elif isinstance(tech, AtmLink):
            linktype = LinkType.SUNATM
        else:
            # Myrinet has no link type Wireshark knows (a route header and a type word):
            # refuse before the run, not with a file nobody can read.
            raise ConfigError(
                "--pcap",
                "",
                f"{tech.name} links have no capture format (captures record Ethernet and ATM "
                "links: the sim-fe and sim-atm transports)",
            )
        self.fabric = fabric
        self.writer = PcapWriter.open(path, linktype)
        self._macs = {name: _mac(index) for index, name in enumerate(fabric.nis)}
        fabric.taps.append(self._tap)

    def _mac(self, node: str) -> bytes:
        mac = self._macs.get(node)
        if mac is None:
            mac = self._macs[node] = _mac(len(self._macs))
        return mac

    def _tap(self, at: float, packet: Packet) -> None:
        if self.writer.closed:
            return
        if self.writer.linktype == LinkType.ETHERNET:
            frame = unet_eth.build(
                unet_eth.UNetFrame(
                    dst=self._mac(packet.destination),
                    src=self._mac(packet.source),
                    port=int(packet.tag) & 0xFF if isinstance(packet.tag, int) else 0,
                    payload=packet.payload,
                )
            )
            self.writer.write(at, frame)
        else:
            vci = int(packet.tag) if isinstance(packet.tag, int) else 0
            self.writer.write(at, sunatm_record(0, vci, packet.payload))

    def close(self) -> None:
        if self._tap in self.fabric.taps:
            self.fabric.taps.remove(self._tap)
        self.writer.close()


def _mac(index: int) -> bytes:
    return bytes([0x02, 0, 0, 0, (index >> 8) & 0xFF, index & 0xFF])
