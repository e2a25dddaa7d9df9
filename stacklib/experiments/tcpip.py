"""UDP and TCP over U-Net vs the SunOS kernel's (paper 000 §7, Figs 6-9, Table 3).

The U-Net side runs the real stacks (IP + UDP, IP + TCP) over two simulated SPARCstation-20s
with SBA-200s running U-Net firmware, in virtual time.  The kernel side is the cost model of
:mod:`stacklib.transports.sim.kernel` (SunOS 4.1.3, Fore's driver and firmware, or the 10 Mbit/s
Ethernet).  Figs 6-9 have no values in the text: the figures below are the numbers the text
states and the shapes it describes, each checked as a ratio; docs/kernel-path.md says how each
was read and which parameter was calibrated to which figure.

Asked for curves (``stacklib reproduce --plots``), the experiment measures Figs 6-9's curves
(:mod:`stacklib.reporting.plots.tcpip`) and reads its figures from them: every U-Net value is
a fresh simulation of its own, so the figures are the same either way.  The curves are named
``"fig6: kernel UDP, ATM"`` and so on, as :func:`fig6_curves` to :func:`fig9_curves` name them.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import trio

from stacklib.layers.ip import IpLayer, IpParams
from stacklib.layers.tcp.driver import TcpLayer, TcpParams, TcpStack, TcpStream
from stacklib.layers.udp import UdpLayer, UdpParams
from stacklib.layers.udp.driver import UdpSocketImpl, UdpStack
from stacklib.reporting.figures import Experiment, ExperimentResult, Figure, register_experiment
from stacklib.services import UNetService
from stacklib.sim import Simulation
from stacklib.stack import open_stack
from stacklib.transports.sim import AtmParams, build_atm
from stacklib.transports.sim import kernel as k
from stacklib.transports.sim.hosts import SS20_PROTOCOL
from stacklib.unet import Endpoint, EndpointConfig, connect

__all__ = [
    "SMALL",
    "TCP_SEGMENT_US",
    "UDP_DATAGRAM_US",
    "fig6_curves",
    "fig7_curves",
    "fig8_curves",
    "fig9_curves",
    "unet_tcp_bandwidth",
    "unet_tcp_rtt",
    "unet_udp_bandwidth",
    "unet_udp_rtt",
]

A, B = "10.0.0.1", "10.0.0.2"
ENDPOINT = EndpointConfig(
    segment_size=512 * 1024, tx_buffers=32, rx_buffers=48, free_queue=64, recv_queue=64
)
#: The small message of Table 3's round trips: 16 bytes of data, two cells with either
#: protocol's headers (docs/kernel-path.md: why two cells).
SMALL = 16
ROUND_TRIPS = 5
#: U-Net UDP host CPU per datagram and TCP per segment, each side, beyond copies and checksums:
#: the SPARCstation-20's, which the UDP and TCP layers charge themselves (the host model,
#: stacklib/transports/sim/hosts.py; docs/kernel-path.md).  Kept here as names of the figures.
UDP_DATAGRAM_US = SS20_PROTOCOL.udp_datagram_us  # calibrated to Table 3's 138 us UDP round trip
TCP_SEGMENT_US = SS20_PROTOCOL.tcp_segment_us  # calibrated to Table 3's 157 us TCP round trip
#: The TAXI fiber's 140 Mbit/s: "the maximum achievable bandwidth" of §7 (17.5 MB/s).
LINE_MB_S = 140 / 8

#: A curve: size (or window) -> value.
Curve = dict[int, float]
#: The sizes and windows of Figs 6-9's curves.
RTT_SIZES = (0, 16, 100, 250, 500, 750, 1000, 1500, 2000, 3000, 4000)
UDP_BW_SIZES = (512, 1024, 2048, 3072, 4096, 6144, 8192)
KERNEL_UDP_SIZES = tuple(range(256, 9217, 64))
WINDOWS = (4096, 8192, 16384, 32768, 65535)


def _run(main: Callable[[Endpoint, Endpoint, int, int], Awaitable[None]]) -> None:
    sim = Simulation(seed=1)
    cluster = build_atm(sim, AtmParams(ni="sba200"), ["a", "b"], None)
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    ep_a = a.os.create_endpoint(a.os.process("ip-a"), ENDPOINT)
    ep_b = b.os.create_endpoint(b.os.process("ip-b"), ENDPOINT)
    ch_a, ch_b = connect(ep_a, ep_b)
    sim.run(main, ep_a, ep_b, ch_a, ch_b)


def _ip(address: str, peer: str, channel: int) -> IpLayer:
    return IpLayer(IpParams(address=address, peers={peer: channel}))


@asynccontextmanager
async def _udp_pair(
    ep_a: Endpoint, ep_b: Endpoint, ch_a: int, ch_b: int, datagram_us: float | None
) -> AsyncIterator[tuple[UdpSocketImpl, UdpSocketImpl]]:
    params = UdpParams(rcvbuf_bytes=4 << 20, rcvbuf_datagrams=4096, datagram_us=datagram_us)
    async with (
        open_stack(UNetService(ep_a), [_ip(A, B, ch_a), UdpLayer(params)]) as a,
        open_stack(UNetService(ep_b), [_ip(B, A, ch_b), UdpLayer(params)]) as b,
    ):
        assert isinstance(a, UdpStack) and isinstance(b, UdpStack)
        yield await a.bind(1000), await b.bind(7)


def unet_udp_rtt(size: int, datagram_us: float | None = None) -> float:
    """U-Net UDP echo round trip of ``size`` bytes, microseconds (``datagram_us``: the UDP
    layer's per-datagram cost; absent, the host's)."""
    result: list[float] = []

    async def main(ep_a: Endpoint, ep_b: Endpoint, ch_a: int, ch_b: int) -> None:
        async with (
            _udp_pair(ep_a, ep_b, ch_a, ch_b, datagram_us) as (a, b),
            trio.open_nursery() as nursery,
        ):

            async def echo() -> None:
                while True:
                    data, peer = await b.recvfrom()
                    await b.sendto(data, peer)

            nursery.start_soon(echo)
            data = bytes(size)
            for i in range(2 + ROUND_TRIPS):
                if i == 2:
                    start = trio.current_time()
                await a.sendto(data, (B, 7))
                await a.recvfrom()
            result.append((trio.current_time() - start) / ROUND_TRIPS * 1e6)
            nursery.cancel_scope.cancel()

    _run(main)
    return result[0]


def unet_udp_bandwidth(
    size: int, datagrams: int = 200, datagram_us: float | None = None
) -> tuple[float, int]:
    """U-Net UDP stream of ``datagrams`` of ``size`` bytes: (received MB/s, datagrams lost)."""
    result: list[tuple[float, int]] = []

    async def main(ep_a: Endpoint, ep_b: Endpoint, ch_a: int, ch_b: int) -> None:
        async with _udp_pair(ep_a, ep_b, ch_a, ch_b, datagram_us) as (a, b):
            data = bytes(size)
            got = 0
            start = trio.current_time()
            end = start

            async def receive() -> None:
                nonlocal got, end
                while got < datagrams:
                    await b.recvfrom()
                    got += 1
                    end = trio.current_time()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                for _ in range(datagrams):
                    await a.sendto(data, (B, 7))
                with trio.move_on_after(0.1):  # virtual time: whatever is still coming
                    while got < datagrams:
                        await trio.sleep(0.001)
                nursery.cancel_scope.cancel()
            result.append((got * size / (end - start) / 1e6, datagrams - got))

    _run(main)
    return result[0]


@asynccontextmanager
async def _tcp_pair(
    ep_a: Endpoint, ep_b: Endpoint, ch_a: int, ch_b: int, params: TcpParams
) -> AsyncIterator[tuple[TcpStream, TcpStream]]:
    async with (
        open_stack(UNetService(ep_a), [_ip(A, B, ch_a), TcpLayer(params)]) as a,
        open_stack(UNetService(ep_b), [_ip(B, A, ch_b), TcpLayer(params)]) as b,
    ):
        assert isinstance(a, TcpStack) and isinstance(b, TcpStack)
        listener = await b.listen(80)
        client = await a.connect_to(B, 80)
        server = await listener.accept()
        yield client, server
        await client.aclose()
        await server.aclose()


def _tcp_params(window: int = 8192, segment_us: float | None = None) -> TcpParams:
    return TcpParams(send_buffer=window, receive_buffer=window, segment_us=segment_us)


def unet_tcp_rtt(size: int, segment_us: float | None = None) -> float:
    """U-Net TCP request-response round trip of ``size`` bytes, microseconds."""
    result: list[float] = []

    async def main(ep_a: Endpoint, ep_b: Endpoint, ch_a: int, ch_b: int) -> None:
        async with _tcp_pair(ep_a, ep_b, ch_a, ch_b, _tcp_params(segment_us=segment_us)) as (
            c,
            s,
        ):
            data = bytes(size)

            async def exact(stream: TcpStream) -> None:
                got = 0
                while got < size:
                    got += len(await stream.receive_some(size - got))

            for i in range(2 + ROUND_TRIPS):
                if i == 2:
                    start = trio.current_time()
                await c.send_all(data)
                await exact(s)
                await s.send_all(data)
                await exact(c)
            result.append((trio.current_time() - start) / ROUND_TRIPS * 1e6)

    _run(main)
    return result[0]


def unet_tcp_bandwidth(
    window: int = 8192, total: int = 1 << 20, segment_us: float | None = None
) -> float:
    """U-Net TCP bulk transfer of ``total`` bytes in 8 KB writes, MB/s."""
    result: list[float] = []

    async def main(ep_a: Endpoint, ep_b: Endpoint, ch_a: int, ch_b: int) -> None:
        params = _tcp_params(window, segment_us)
        async with _tcp_pair(ep_a, ep_b, ch_a, ch_b, params) as (c, s):
            got = 0

            async def receive() -> None:
                nonlocal got
                while got < total:
                    got += len(await s.receive_some(65536))

            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                chunk = bytes(8192)
                for _ in range(total // len(chunk)):
                    await c.send_all(chunk)
            result.append(total / (trio.current_time() - start) / 1e6)

    _run(main)
    return result[0]


def tcpip(curves: bool = False) -> ExperimentResult:
    """Paper 000 §7: Table 3's UDP and TCP rows, Fig 8's bandwidths, Figs 6, 7, 9's shapes;
    with ``curves``, Figs 6-9's curves too, the figures read from them."""
    atm, eth = k.ATM, k.ETHERNET
    rtt_sizes = RTT_SIZES if curves else (SMALL,)
    udp_rtts = {n: unet_udp_rtt(n) for n in rtt_sizes}
    tcp_rtts = {n: unet_tcp_rtt(n) for n in rtt_sizes}
    udp_streams = {n: unet_udp_bandwidth(n) for n in (UDP_BW_SIZES if curves else (4096,))}
    tcp_bws = {w: unet_tcp_bandwidth(w) for w in (WINDOWS if curves else (8192,))}
    udp_rtt, tcp_rtt = udp_rtts[SMALL], tcp_rtts[SMALL]
    udp_bw, udp_lost = udp_streams[4096]
    tcp_bw = tcp_bws[8192]
    kernel_tcp = k.tcp_bandwidth(atm, 64 * 1024)
    saw_low, saw_high = k.udp_bandwidth(2559, atm), k.udp_bandwidth(2560, atm)
    peak = max(k.udp_bandwidth(n, atm).received_mb_s for n in range(1024, 9161, 512))
    figures = [
        Figure("Table 3: UDP round trip (16 B)", 138, udp_rtt, "us",
               "paper 000 Table 3 (calibrated: ProtocolCosts.udp_datagram_us)"),
        Figure("Table 3: UDP bandwidth, 4 KB", 120, udp_bw * 8, "Mbit/s", "paper 000 Table 3"),
        Figure("U-Net UDP stream: datagrams received / sent", 1.0, (200 - udp_lost) / 200,
               "ratio", "paper 000 §7.6: U-Net UDP 'does not experience any losses'", 0.0),
        Figure("Table 3: TCP round trip (16 B)", 157, tcp_rtt, "us",
               "paper 000 Table 3 (calibrated: ProtocolCosts.tcp_segment_us)"),
        Figure("Table 3: TCP bandwidth (8 KB window)", 115, tcp_bw * 8, "Mbit/s",
               "paper 000 Table 3"),
        Figure("Fig 8: U-Net TCP, 8 KB window", 14.5, tcp_bw, "MB/s",
               "paper 000 §7.7: '14-15 Mbytes/sec ... using an 8Kbyte window'"),
        Figure("Fig 8: kernel TCP/ATM, 64 KB window", 9.5, kernel_tcp, "MB/s",
               "paper 000 §7.7: 'not more than 9-10 Mbytes/sec' (calibrated)", 0.06),
        Figure("§7: kernel TCP / 140 Mbit/s line rate", 0.55, kernel_tcp / LINE_MB_S, "ratio",
               "paper 000 §7: 'not more than 55% of the maximum achievable bandwidth' "
               "(follows from the Fig 8 calibration)", 0.10),
        Figure("Fig 6: kernel UDP RTT (16 B), ATM / Ethernet", 1.25,
               k.udp_rtt(SMALL, atm) / k.udp_rtt(SMALL, eth), "ratio",
               "paper 000 §7: ATM latency 'larger ... than going over Ethernet' (estimated; "
               "property > 1)", 0.15),
        Figure("Fig 6: kernel TCP RTT (16 B), ATM / Ethernet", 1.25,
               k.tcp_rtt(SMALL, atm) / k.tcp_rtt(SMALL, eth), "ratio",
               "paper 000 §7: as for UDP (estimated; property > 1)", 0.15),
        Figure("Fig 6: kernel UDP RTT (1000 B), ATM / Ethernet", 0.5,
               k.udp_rtt(1000, atm) / k.udp_rtt(1000, eth), "ratio",
               "paper 000 §7: the ATM penalty is for small messages only (estimated; "
               "property < 1)", 0.5),
        Figure("Fig 7: kernel UDP saw-tooth, 2560 B / 2559 B", 1.2,
               saw_high.sent_mb_s / saw_low.sent_mb_s, "ratio",
               "paper 000 §7.3: 1 KB clusters, remainder < 512 B in 112-byte mbufs "
               "(estimated; property > 1)", 0.15),
        Figure("Fig 7: kernel UDP, 4 KB / peak", 0.65,
               k.udp_bandwidth(4096, atm).received_mb_s / peak, "ratio",
               "paper 000 §7: peak 'only ... larger than 8Kbytes' (estimated; property < 1)",
               0.3),
        Figure("Fig 7: kernel UDP 8 KB stream, received / sent", 0.75,
               k.udp_bandwidth(8192, atm).received_mb_s / k.udp_bandwidth(8192, atm).sent_mb_s,
               "ratio", "paper 000 §7.3, §7.6: losses at the 52 KB socket buffer (estimated; "
               "property < 1)", 0.3),
        Figure("Fig 9: kernel / U-Net UDP RTT (16 B)", 6.0, k.udp_rtt(SMALL, atm) / udp_rtt,
               "ratio", "paper 000 §7.6, Fig 9 (estimated from the model; property > 1)", 0.5),
        Figure("Fig 9: kernel / U-Net TCP RTT (16 B)", 6.0, k.tcp_rtt(SMALL, atm) / tcp_rtt,
               "ratio", "paper 000 §7.7, Fig 9 (estimated from the model; property > 1)", 0.5),
    ]  # fmt: skip
    if not curves:
        return ExperimentResult(figures)
    unet_udp_bw = {n: stream[0] for n, stream in udp_streams.items()}
    drawn = {
        **_fig6(RTT_SIZES),
        **_fig7(unet_udp_bw, KERNEL_UDP_SIZES),
        **_fig8(tcp_bws, WINDOWS),
        **_fig9(udp_rtts, tcp_rtts, RTT_SIZES),
    }
    return ExperimentResult(figures, drawn)


register_experiment(
    Experiment(
        "tcpip",
        "UDP and TCP: U-Net vs the SunOS kernel (paper 000 §7, Table 3)",
        tcpip,
        run_curves=functools.partial(tcpip, curves=True),
        seconds=2.0,  # wall time, measured once on a 2-core machine (--json wall_seconds)
    )
)


# --- Figs 6-9's curves (stacklib reproduce --plots) -----------------------------------------


def fig6_curves(sizes: Sequence[int] = RTT_SIZES) -> dict[str, Curve]:
    """Paper 000 Fig 6: the kernel's UDP and TCP round trips over ATM and Ethernet (model),
    microseconds."""
    return _unnamed(_fig6(sizes), "fig6: ")


def fig7_curves(
    unet_sizes: Sequence[int] = UDP_BW_SIZES, kernel_sizes: Sequence[int] = KERNEL_UDP_SIZES
) -> dict[str, Curve]:
    """Paper 000 Fig 7: UDP bandwidth vs datagram size, MB/s: U-Net (simulated) and the kernel
    over ATM as the sender perceives it and as received (model: the mbuf saw-tooth)."""
    unet = {n: unet_udp_bandwidth(n)[0] for n in unet_sizes}
    return _unnamed(_fig7(unet, kernel_sizes), "fig7: ")


def fig8_curves(windows: Sequence[int] = WINDOWS, total: int = 1 << 20) -> dict[str, Curve]:
    """Paper 000 Fig 8's comparison: TCP bulk bandwidth vs window, MB/s: U-Net TCP (simulated,
    ``total`` bytes) and the kernel over ATM (model, the window capped by its 52 KB buffer)."""
    unet = {w: unet_tcp_bandwidth(w, total) for w in windows}
    return _unnamed(_fig8(unet, windows), "fig8: ")


def fig9_curves(sizes: Sequence[int] = RTT_SIZES) -> dict[str, Curve]:
    """Paper 000 Fig 9: UDP and TCP round trips, U-Net (simulated) and kernel over ATM."""
    udp = {n: unet_udp_rtt(n) for n in sizes}
    tcp = {n: unet_tcp_rtt(n) for n in sizes}
    return _unnamed(_fig9(udp, tcp, sizes), "fig9: ")


# The figures' curves from measured U-Net values, named as the experiment's result names them.


def _unnamed(curves: dict[str, Curve], prefix: str) -> dict[str, Curve]:
    return {key.removeprefix(prefix): points for key, points in curves.items()}


def _fig6(sizes: Sequence[int]) -> dict[str, Curve]:
    atm, eth = k.ATM, k.ETHERNET
    return {
        "fig6: kernel UDP, ATM": {n: k.udp_rtt(n, atm) for n in sizes},
        "fig6: kernel UDP, Ethernet": {n: k.udp_rtt(n, eth) for n in sizes},
        # The model's TCP round trip is one segment's: up to the MSS (1 KB on Ethernet).
        "fig6: kernel TCP, ATM": {n: k.tcp_rtt(n, atm) for n in sizes if n <= atm.mss},
        "fig6: kernel TCP, Ethernet": {n: k.tcp_rtt(n, eth) for n in sizes if n <= eth.mss},
    }


def _fig7(unet: Mapping[int, float], kernel_sizes: Sequence[int]) -> dict[str, Curve]:
    streams = {n: k.udp_bandwidth(n, k.ATM) for n in kernel_sizes}
    return {
        "fig7: U-Net UDP": dict(unet),
        "fig7: kernel UDP/ATM, sender": {n: s.sent_mb_s for n, s in streams.items()},
        "fig7: kernel UDP/ATM, received": {n: s.received_mb_s for n, s in streams.items()},
    }


def _fig8(unet: Mapping[int, float], windows: Sequence[int]) -> dict[str, Curve]:
    return {
        "fig8: U-Net TCP": dict(unet),
        "fig8: kernel TCP/ATM": {w: k.tcp_bandwidth(k.ATM, w) for w in windows},
    }


def _fig9(
    udp: Mapping[int, float], tcp: Mapping[int, float], sizes: Sequence[int]
) -> dict[str, Curve]:
    return {
        "fig9: U-Net UDP": dict(udp),
        "fig9: U-Net TCP": dict(tcp),
        "fig9: kernel UDP/ATM": {n: k.udp_rtt(n, k.ATM) for n in sizes},
        "fig9: kernel TCP/ATM": {n: k.tcp_rtt(n, k.ATM) for n in sizes if n <= k.ATM.mss},
    }
