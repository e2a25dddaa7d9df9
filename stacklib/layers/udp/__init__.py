"""UDP over IP over U-Net (paper 000 §7.6): ports, a checksum applications may switch off,
computed in the same pass as the copy, a per-channel PCB cache and receive buffers sized by the
application.  :mod:`~stacklib.layers.udp.wire` is the format, :mod:`~stacklib.layers.udp.driver`
the layer (``"udp"``).  See docs/tcpip.md.
"""

from __future__ import annotations

from stacklib.layers.udp.driver import UdpLayer, UdpParams, UdpSocketImpl, UdpStack
from stacklib.layers.udp.wire import ChecksumPolicy, UdpDatagram, UdpFormatError

__all__ = [
    "ChecksumPolicy",
    "UdpDatagram",
    "UdpFormatError",
    "UdpLayer",
    "UdpParams",
    "UdpSocketImpl",
    "UdpStack",
]
