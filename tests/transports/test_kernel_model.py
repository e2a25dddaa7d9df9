"""The SunOS kernel path cost model (stacklib.transports.sim.kernel) and the ``tcpip``
experiment (paper 000 §7): the shapes the paper's text states, and the U-Net side's numbers."""

from __future__ import annotations

import pytest

from stacklib.experiments import tcpip
from stacklib.reproduce import EXPERIMENTS
from stacklib.transports.sim import kernel as k
from stacklib.transports.sim.kernel import ATM, ETHERNET, KernelParams, MbufChain, mbufs


def test_mbuf_allocation_follows_section_7_3() -> None:
    p = KernelParams()
    assert mbufs(0, p) == MbufChain(0, 0, 0)
    assert mbufs(1024, p) == MbufChain(1, 0, 0)
    assert mbufs(1024 + 100, p) == MbufChain(1, 1, 100)
    assert mbufs(1024 + 112, p) == MbufChain(1, 1, 112)
    assert mbufs(1024 + 113, p) == MbufChain(1, 2, 113)
    assert mbufs(1024 + 511, p) == MbufChain(1, 5, 511)
    assert mbufs(1024 + 512, p) == MbufChain(2, 0, 0)  # a remainder >= 512 B takes a cluster


def test_fig7_saw_tooth_at_every_cluster_boundary() -> None:
    for clusters in range(1, 8):
        below = k.udp_bandwidth(clusters * 1024 + 511, ATM).sent_mb_s
        above = k.udp_bandwidth(clusters * 1024 + 512, ATM).sent_mb_s
        assert above > below * 1.05
    # The tooth shows at the receiver too: its driver fills mbufs the same way.
    below_rx = k.udp_bandwidth(2 * 1024 + 511, ATM).received_mb_s
    assert k.udp_bandwidth(2 * 1024 + 512, ATM).received_mb_s > below_rx
    # Costlier small mbufs deepen the tooth.
    dear = KernelParams(small_mbuf_us=30.0)
    deep = (
        k.udp_bandwidth(1536, ATM, p=dear).sent_mb_s / k.udp_bandwidth(1535, ATM, p=dear).sent_mb_s
    )
    base = k.udp_bandwidth(1536, ATM).sent_mb_s / k.udp_bandwidth(1535, ATM).sent_mb_s
    assert deep > base > 1


def test_udp_peak_needs_large_datagrams_and_losses_come_from_the_socket_buffer() -> None:
    received = {n: k.udp_bandwidth(n, ATM).received_mb_s for n in (1024, 2048, 4096, 8192)}
    assert received[1024] < received[2048] < received[4096] < received[8192]
    big = k.udp_bandwidth(8192, ATM)
    assert big.dropped > 0 and big.received_mb_s < big.sent_mb_s
    # A burst that fits the 52 KB socket buffer is not lost; a longer one is.
    assert k.udp_bandwidth(8192, ATM, datagrams=6).dropped == 0
    assert k.udp_bandwidth(8192, ATM, datagrams=60).dropped > 0
    # A bigger socket buffer (what U-Net leaves to the application) absorbs more.
    roomy = KernelParams(socket_buffer=1 << 20)
    assert k.udp_bandwidth(8192, ATM, datagrams=60, p=roomy).dropped == 0


def test_fig6_atm_slower_than_ethernet_for_small_messages_only() -> None:
    for size in (0, 16, 40):
        assert k.udp_rtt(size, ATM) > k.udp_rtt(size, ETHERNET)
        assert k.tcp_rtt(size, ATM) > k.tcp_rtt(size, ETHERNET)
    assert k.udp_rtt(1000, ATM) < k.udp_rtt(1000, ETHERNET)
    assert k.tcp_rtt(16, ATM) > k.udp_rtt(16, ATM)
    with pytest.raises(ValueError, match="segment"):
        k.tcp_rtt(2000, ETHERNET)


def test_fig8_kernel_tcp_window_socket_buffer_and_timers() -> None:
    big = k.tcp_bandwidth(ATM, 64 * 1024)
    assert 9.0 <= big <= 10.0  # paper 000 §7.7
    assert big / (140 / 8) <= 0.56  # §7: "not more than 55%"
    # The 52 KB socket buffer caps the window: 64 KB buys nothing over 52 KB.
    assert k.tcp_bandwidth(ATM, 52 * 1024) == big
    assert k.tcp_bandwidth(ATM, 8192) < k.tcp_bandwidth(ATM, 16384) < big
    # A lone segment whose ACK waits for the 200 ms fast timer: about 8 KB per 100 ms.
    lone = k.tcp_bandwidth(ATM, 8192, window_updates=False)
    assert lone == pytest.approx(8192 / 0.1 / 1e6, rel=0.02)
    # A lost segment costs two 500 ms slow-timer ticks: 1% loss is ruinous.
    assert k.tcp_bandwidth(ATM, 64 * 1024, loss=0.01) < big / 10
    assert k.timer_wait(0.001) == 0.5 and k.timer_wait(0.6) == 1.0
    # Ethernet: bounded by the 10 Mbit/s wire.
    assert 1.0 < k.tcp_bandwidth(ETHERNET, 64 * 1024) < 1.25


def test_unet_side_matches_table_3() -> None:
    assert tcpip.unet_udp_rtt(tcpip.SMALL) == pytest.approx(138, rel=0.05)
    assert tcpip.unet_tcp_rtt(tcpip.SMALL) == pytest.approx(157, rel=0.05)
    # The benchmark's per-datagram charge is what lifts UDP from the raw two-cell round trip.
    assert tcpip.unet_udp_rtt(tcpip.SMALL, datagram_us=0) < 125
    bandwidth, lost = tcpip.unet_udp_bandwidth(4096, datagrams=50)
    assert lost == 0 and bandwidth * 8 == pytest.approx(120, rel=0.1)


def test_unet_tcp_beats_kernel_tcp_with_a_smaller_window() -> None:
    unet = tcpip.unet_tcp_bandwidth(8192, total=256 * 1024)
    assert unet > k.tcp_bandwidth(ATM, 64 * 1024) > k.tcp_bandwidth(ATM, 8192)


def test_experiment_is_registered_and_its_shape_figures_hold() -> None:
    assert EXPERIMENTS["tcpip"].run is tcpip.tcpip
    figures = {f.name: f for f in tcpip.tcpip().figures}
    shape = [f for name, f in figures.items() if "Fig 6" in name or "Fig 7" in name]
    assert len(shape) >= 5 and all(f.ok for f in shape)
    assert all(f.ok for name, f in figures.items() if "Fig 9" in name)
    assert figures["Table 3: UDP round trip (16 B)"].ok
    assert figures["Table 3: TCP round trip (16 B)"].ok
