"""The xdp transport: U-Net/FE over Linux AF_XDP sockets, the kernel only in set-up.

AF_XDP is U-Net's descendant (paper 000 §3.1): a process registers a memory region with the
kernel (the UMEM: U-Net's communication segment) and shares four rings with the driver (FILL and
RX: the free and receive queues; TX and COMPLETION: the send queue and its returned buffers).
The kernel copies frames and takes a wake-up call on transmit; no system call per received
frame, no socket layer.  An XDP program of stacklib's own (:mod:`.program`), loaded with bpf(2)
and attached through a bpf_link, sends only U-Net/FE frames (EtherType 0x88B5) to the socket
that owns their port and passes everything else, ARP and IP, to the kernel.

* :mod:`.bpf`: the bpf(2) calls; :mod:`.program`: the XDP program; :mod:`.attach`: the
  privileged set-up of an interface; :mod:`.xsk`: sockets, UMEM and rings; :mod:`.ni`: the NI;
  :mod:`.network`: a process's node; :mod:`.service`: the daemon's part (sockets handed over
  with ``SCM_RIGHTS``).

docs/xdp.md has the mapping, the set-up, what the kernel protects and the figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from stacklib.sim import World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.ether import check_one_node
from stacklib.transports.xdp.network import SPIN_TIME, XdpNetwork
from stacklib.transports.xdp.ni import XdpEndpoint, XdpNI
from stacklib.transports.xdp.xsk import XskLayout

__all__ = ["XdpEndpoint", "XdpNI", "XdpNetwork", "XdpParams", "XskLayout"]


@attrs.frozen
class XdpParams:
    """Recipe parameters of the xdp transport."""

    interface: str = "eth0"
    #: The named network namespace this process must be in (checked, as for ether).
    namespace: str | None = None
    queue: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    #: ``native``, ``skb`` or None (native, else SKB).
    mode: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(("native", "skb")))
    )
    #: True: insist on zero-copy; False: copy mode; None: zero-copy where the driver has it.
    zero_copy: bool | None = None
    frames: int = 4096
    frame_size: int = 2048
    spin_us: float = attrs.field(default=SPIN_TIME * 1e6, validator=attrs.validators.ge(0))
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    #: None: this process sets up alone (root); else the socket path of the daemon that hands
    #: it its socket (``"default"``: the daemon's default path), so it may be unprivileged.
    daemon: str | None = None


def _build(
    world: World, params: XdpParams, names: Sequence[str], profile: CostProfile | None
) -> XdpNetwork:
    """One node per process, as for ether: peers are other processes on other interfaces."""
    check_one_node("xdp", names, params.namespace)
    network = XdpNetwork(
        params.interface,
        world,
        queue=params.queue,
        layout=XskLayout(params.frames, params.frame_size),
        mode=params.mode,
        zero_copy=params.zero_copy,
        spin_time=params.spin_us * 1e-6,
        inline_threshold=params.inline_threshold,
    )
    if params.daemon is None:
        network.add_node(names[0], profile)
        return network
    from stacklib.transports.xdp.service import add_daemon_node

    try:
        add_daemon_node(network, names[0], profile, socket_path=params.daemon)
    except BaseException:
        network.close()
        raise
    return network


register_transport(
    TransportKind(
        name="xdp",
        Params=XdpParams,
        build=_build,
        description="U-Net/FE frames over AF_XDP sockets and an XDP program (root to set up)",
        clock="real",
        per_process=True,
    )
)
