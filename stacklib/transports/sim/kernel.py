"""The SunOS 4.1.3 kernel UDP/TCP path as a cost model (paper 000 §7, Figs 6-9).

Paper 000 compares U-Net UDP and TCP with the kernel's, over the Fore SBA-200 (running Fore's
firmware, driven by Fore's driver) and over the 10 Mbit/s Ethernet of the time.  The figures
(6-9) have no values in the text; the text states their shapes and a few numbers, and this
model is built from those and from the simulated NIs' own calibrations:

* the BSD mbuf scheme (§7.3): data goes into 1 KB clusters; a remainder below 512 bytes is
  copied into 112-byte small mbufs, which have no reference count, so the Fore driver must copy
  them once more; this is the saw-tooth of Fig 7;
* the socket receive buffer of at most 52 KB (§7.3): a UDP stream the receiver cannot keep up
  with overruns it and datagrams are dropped; it also caps TCP's window;
* the BSD timers (§7.8): ``pr_slow_timeout`` every 500 ms (retransmission granularity) and the
  delayed ACK of every second segment "for up to 200ms" (``pr_fast_timeout``);
* the SBA-200 under Fore's firmware (§4.2.1, :class:`ForeFirmwareParams`, calibrated to its
  ~160 us round trip and 13 MB/s at 4 KB) and the 140 Mbit/s TAXI link.

The model is analytic: every stage's time is computed from the message size, in virtual (model)
time, so it is exact and fast.  Each number carries its source, marked "calibrated" (fitted to
the figure named) or "estimated" (not in the paper; chosen as docs/kernel-path.md explains).
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

from stacklib.sim.costs import cited
from stacklib.transports.sim.hosts import HOSTS
from stacklib.transports.sim.links import AAL5_TRAILER, CELL_BYTES, CELL_PAYLOAD, TAXI_140
from stacklib.transports.sim.params import ForeFirmwareParams

__all__ = [
    "ATM",
    "ETHERNET",
    "KernelNetwork",
    "KernelParams",
    "MbufChain",
    "PathCosts",
    "UdpStream",
    "mbufs",
    "tcp_bandwidth",
    "tcp_path",
    "tcp_rtt",
    "timer_wait",
    "udp_bandwidth",
    "udp_path",
    "udp_rtt",
]

IP_UDP_HEADERS = 28
IP_TCP_HEADERS = 40
US = 1e-6


@attrs.frozen
class KernelParams:
    """Host-side costs of SunOS 4.1.3 on a 60 MHz SPARCstation-20, in microseconds."""

    copy_us_per_byte: float = cited(
        1.0 / HOSTS["ss20"].copy_mb_per_s,
        "stacklib.transports.sim.hosts: the SS-20's copy speed (from paper 000 §5.2)",
        "us/byte",
    )
    checksum_us_per_100_bytes: float = cited(
        1.0, "paper 000 §7.6: 1 us per 100 bytes on a SPARCStation 20", "us"
    )
    syscall_us: float = cited(
        25.0, "estimated: a sendto/recvfrom system call on SunOS 4.1.3 (Fig 6)", "us"
    )
    wakeup_us: float = cited(
        45.0, "estimated: waking the receiving process and switching to it (Fig 6)", "us"
    )
    udp_ip_us: float = cited(
        30.0, "estimated: UDP and IP processing per datagram, each side (Fig 6)", "us"
    )
    tcp_ip_us: float = cited(
        45.0, "estimated: TCP and IP processing per segment, each side (Figs 6, 9)", "us"
    )
    cluster_bytes: int = cited(1024, "paper 000 §7.3: 'large 1Kbyte buffers'", "bytes")
    small_threshold: int = cited(
        512, "paper 000 §7.3: the remainder, 'if less than 512 bytes', goes to small mbufs", "bytes"
    )
    small_mbuf_bytes: int = cited(112, "paper 000 §7.3: 'small mbufs of 112 bytes each'", "bytes")
    cluster_us: float = cited(
        4.0, "estimated: allocate a reference-counted cluster and map it (Fig 7)", "us"
    )
    small_mbuf_us: float = cited(
        14.0,
        "estimated: allocate a small mbuf and copy it again in the Fore driver, since small "
        "mbufs have no reference count (paper 000 §7.3); sets the depth of Fig 7's saw-tooth",
        "us",
    )
    socket_buffer: int = cited(
        52 * 1024, "paper 000 §7.3: socket receive buffer 'max. 52Kbytes in SunOS'", "bytes"
    )
    slow_timeout: float = cited(
        0.5, "paper 000 §7.8: pr_slow_timeout 'has a granularity of 500 milliseconds'", "s"
    )
    #: BSD's smallest retransmission timeout, in slow-timer ticks (TCPTV_MIN = 2 ticks).
    rto_min_ticks: int = cited(2, "4.3BSD tcp_timer.h: TCPTV_MIN is 2 slow ticks (1 s)", "ticks")
    delayed_ack: float = cited(
        0.2,
        "paper 000 §7.8: 'delay the acknowledgment of every second packet for up to 200ms'",
        "s",
    )


@attrs.frozen
class KernelNetwork:
    """A network below the kernel: its driver, NI and wire."""

    name: str
    #: Largest IP packet (fragments above it).
    mtu: int
    #: TCP's segment size: BSD's tcp_mss rounds MTU - 40 down to whole 1 KB clusters.
    mss: int
    #: Driver per packet at send, and at receive including the interrupt.
    driver_tx_us: float
    driver_rx_us: float
    #: Driver copies per byte, each side (into / out of the NI's host buffers).
    driver_us_per_byte: float
    #: Whether the driver has to copy small mbufs again (Fore's buffering scheme, §7.3).
    copies_small_mbufs: bool
    kind: Literal["atm", "ethernet"]


#: The Fore SBA-200 driver path (Fore firmware; paper 000 §4.2.1, §7).
ATM = KernelNetwork(
    name="fore-atm",
    mtu=9188,  # RFC 1626's IP MTU over AAL5, as Fore's driver used
    mss=8192,  # 9188 - 40 rounded down to 1 KB clusters (4.3BSD-Reno tcp_mss)
    driver_tx_us=70.0,  # estimated (Fig 6: ATM above Ethernet for small messages)
    driver_rx_us=90.0,  # estimated (Fig 6), includes the interrupt
    driver_us_per_byte=0.040,  # calibrated: kernel TCP 9-10 MB/s with a 64K window (§7.7, Fig 8)
    copies_small_mbufs=True,
    kind="atm",
)

#: The on-board Lance Ethernet of the SPARCstation-20 (10 Mbit/s).
ETHERNET = KernelNetwork(
    name="ethernet",
    mtu=1500,
    mss=1024,  # 1460 rounded down to one cluster (4.3BSD-Reno tcp_mss)
    driver_tx_us=30.0,  # estimated
    driver_rx_us=45.0,  # estimated, includes the interrupt
    driver_us_per_byte=1.0 / HOSTS["ss20"].copy_mb_per_s,  # one copy to/from the Lance buffers
    copies_small_mbufs=False,
    kind="ethernet",
)

FORE = ForeFirmwareParams()
SWITCH_US = 7.0  # the ASX-200 (paper 003 §4.1), as in stacklib.transports.sim.build_atm
ETHER_BIT_US = 0.1  # 10 Mbit/s
ETHER_OVERHEAD = 14 + 4 + 8 + 12  # header, CRC, preamble, inter-frame gap
ETHER_MIN_FRAME = 64


@attrs.frozen
class MbufChain:
    """How BSD stores ``nbytes`` of data: clusters, and small mbufs for a short remainder."""

    clusters: int
    small: int
    small_bytes: int


def mbufs(nbytes: int, p: KernelParams) -> MbufChain:
    """The §7.3 allocation: 1 KB clusters; a remainder < 512 B in 112-byte small mbufs."""
    clusters, rest = divmod(nbytes, p.cluster_bytes)
    if rest >= p.small_threshold:
        return MbufChain(clusters + 1, 0, 0)
    return MbufChain(clusters, -(-rest // p.small_mbuf_bytes), rest)


def _mbuf_us(nbytes: int, p: KernelParams, net: KernelNetwork) -> float:
    chain = mbufs(nbytes, p)
    cost = chain.clusters * p.cluster_us + chain.small * p.small_mbuf_us
    if net.copies_small_mbufs:
        cost += chain.small_bytes * p.copy_us_per_byte
    return cost


def _fragments(payload: int, net: KernelNetwork) -> list[int]:
    """IP packet sizes (headers included) for ``payload`` bytes above IP."""
    room = (net.mtu - 20) // 8 * 8
    sizes = []
    while True:
        piece = min(payload, room)
        sizes.append(piece + 20)
        payload -= piece
        if payload <= 0:
            return sizes


def _wire_us(packet: int, net: KernelNetwork) -> tuple[float, float]:
    """(Latency of one packet from the driver to the receiving driver, its bottleneck time)."""
    if net.kind == "ethernet":
        wire = (max(packet + 18, ETHER_MIN_FRAME) + 20) * 8 * ETHER_BIT_US
        return wire, wire
    cells = -(-(packet + AAL5_TRAILER) // CELL_PAYLOAD)
    cell_wire = CELL_BYTES * 8 / TAXI_140.rate_bps / US
    per_cell = max(FORE.tx_cell_us, cell_wire, FORE.rx_cell_us)
    latency = FORE.tx_msg_us + cells * per_cell + SWITCH_US + FORE.rx_msg_us
    return latency, max(FORE.tx_msg_us + cells * FORE.tx_cell_us, FORE.rx_msg_us + cells * per_cell)


def _sum_us(nbytes: int, p: KernelParams) -> float:
    return nbytes * p.checksum_us_per_100_bytes / 100


@attrs.frozen
class PathCosts:
    """Per-message costs of one direction (microseconds)."""

    send_cpu: float  # sending host, system call to driver
    network: float  # NI + wire + switch latency of the whole message
    network_busy: float  # the NI / wire bottleneck time per message
    receive_interrupt: float  # receiving host at interrupt level (driver, IP, UDP/TCP)
    receive_app: float  # receiving host at process level (wakeup, system call, copy out)

    @property
    def one_way(self) -> float:
        return self.send_cpu + self.network + self.receive_interrupt + self.receive_app


def udp_path(nbytes: int, net: KernelNetwork, p: KernelParams | None = None) -> PathCosts:
    """Costs of one UDP datagram of ``nbytes`` of data through the kernel."""
    p = p or KernelParams()
    packets = _fragments(nbytes + 8, net)
    data = nbytes + 8
    per_byte = p.copy_us_per_byte + net.driver_us_per_byte
    send = p.syscall_us + p.udp_ip_us + _mbuf_us(nbytes, p, net) + _sum_us(data, p)
    send += len(packets) * net.driver_tx_us + nbytes * per_byte
    wires = [_wire_us(packet, net) for packet in packets]
    # Fragments pipeline: the last one's latency after the others' bottleneck times.
    network = sum(busy for _, busy in wires[:-1]) + wires[-1][0]
    busy = sum(b for _, b in wires)
    interrupt = len(packets) * net.driver_rx_us + p.udp_ip_us + _sum_us(data, p)
    interrupt += _mbuf_us(nbytes, p, net) + nbytes * net.driver_us_per_byte
    app = p.wakeup_us + p.syscall_us + nbytes * p.copy_us_per_byte
    return PathCosts(send, network, busy, interrupt, app)


def tcp_path(nbytes: int, net: KernelNetwork, p: KernelParams | None = None) -> PathCosts:
    """Costs of one TCP segment of ``nbytes`` of data (at most the MSS) through the kernel."""
    p = p or KernelParams()
    per_byte = p.copy_us_per_byte + net.driver_us_per_byte
    sums = _sum_us(nbytes + 20, p)
    send = p.syscall_us + p.tcp_ip_us + net.driver_tx_us + _mbuf_us(nbytes, p, net) + sums
    send += nbytes * per_byte
    network, busy = _wire_us(nbytes + IP_TCP_HEADERS, net)
    interrupt = net.driver_rx_us + p.tcp_ip_us + sums + _mbuf_us(nbytes, p, net)
    interrupt += nbytes * net.driver_us_per_byte
    app = p.wakeup_us + p.syscall_us + nbytes * p.copy_us_per_byte
    return PathCosts(send, network, busy, interrupt, app)


def udp_rtt(nbytes: int, net: KernelNetwork, p: KernelParams | None = None) -> float:
    """Kernel UDP round trip (echo) of ``nbytes``, microseconds."""
    return 2 * udp_path(nbytes, net, p).one_way


def tcp_rtt(nbytes: int, net: KernelNetwork, p: KernelParams | None = None) -> float:
    """Kernel TCP round trip (request-response; the ACK rides on the reply), microseconds."""
    if nbytes > net.mss:
        raise ValueError(f"{nbytes} bytes is more than one {net.mss}-byte segment")
    return 2 * tcp_path(nbytes, net, p).one_way


@attrs.frozen
class UdpStream:
    """A UDP stream's outcome: bandwidth as perceived at the sender and as received (MB/s)."""

    sent_mb_s: float
    received_mb_s: float
    dropped: int
    datagrams: int


def udp_bandwidth(
    nbytes: int, net: KernelNetwork, datagrams: int = 1000, p: KernelParams | None = None
) -> UdpStream:
    """A stream of ``datagrams`` datagrams of ``nbytes`` sent as fast as the sender can.

    ``sendto`` returns once the datagram is queued at the driver, so the sender perceives its
    own CPU rate.  The receiver's interrupt-level work preempts the application; what the
    application cannot read piles up in the socket buffer (at most 52 KB), beyond which
    datagrams are dropped (paper 000 §7.3, §7.6: "the losses can all be attributed to kernel
    buffering problems").
    """
    p = p or KernelParams()
    path = udp_path(nbytes, net, p)
    arrival = max(path.send_cpu, path.network_busy)  # us between datagrams on the wire
    spare = max(0.0, 1.0 - path.receive_interrupt / arrival)
    read = min(1.0 / arrival, spare / path.receive_app)  # datagrams the app reads per us
    duration = datagrams * arrival
    buffered = p.socket_buffer // nbytes if nbytes <= p.socket_buffer else 0
    received = min(datagrams, int(read * duration) + buffered)
    sent_mb_s = nbytes / path.send_cpu
    received_mb_s = received * nbytes / (duration + path.one_way)
    return UdpStream(sent_mb_s, received_mb_s, datagrams - received, datagrams)


def tcp_bandwidth(
    net: KernelNetwork,
    window: int = 64 * 1024,
    loss: float = 0.0,
    p: KernelParams | None = None,
    window_updates: bool = True,
) -> float:
    """Steady-state kernel TCP bulk bandwidth in MB/s with a ``window``-byte socket buffer.

    The window is capped by the 52 KB socket buffer (§7.3).  With room for two segments the
    receiver ACKs every second one at once, else the ACK waits for the application's read (a
    window update) or, with ``window_updates=False`` (the reader does not free enough of the
    buffer to warrant one), the delayed-ACK timer: 200 ms ticks, half a tick on average (§7.8).
    A lost segment (probability ``loss``) stalls the connection for the retransmission timeout,
    whole ticks of the 500 ms slow timer (§7.8).
    """
    p = p or KernelParams()
    window = min(window, p.socket_buffer)
    mss = min(net.mss, window)
    seg = tcp_path(mss, net, p)
    ack = tcp_path(0, net, p)
    # Per segment: the sender also takes half an ACK in, the receiver sends half an ACK.
    ack_in = ack.receive_interrupt / 2
    ack_out = (net.driver_tx_us + p.tcp_ip_us) / 2
    bottleneck = max(
        seg.send_cpu + ack_in, seg.network_busy, seg.receive_interrupt + seg.receive_app + ack_out
    )
    ack_latency = ack.send_cpu - p.syscall_us + ack.network + ack.receive_interrupt
    if window >= 2 * mss:
        loop = seg.send_cpu + seg.network + seg.receive_interrupt + bottleneck + ack_latency
    elif window_updates:
        loop = seg.one_way + ack_latency  # a window update after the application's read
    else:
        loop = seg.send_cpu + seg.network + seg.receive_interrupt + p.delayed_ack / 2 / US
    per_segment = max(bottleneck, loop * mss / window)
    rto = p.rto_min_ticks * p.slow_timeout / US
    per_segment += loss * rto
    return mss / per_segment


def timer_wait(delay: float, p: KernelParams | None = None) -> float:
    """When a BSD slow-timer timeout of ``delay`` seconds fires: whole 500 ms ticks (§7.8)."""
    p = p or KernelParams()
    return math.ceil(delay / p.slow_timeout) * p.slow_timeout
