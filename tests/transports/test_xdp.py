"""The xdp transport on real veth pairs: U-Net/FE frames through AF_XDP sockets.

Most tests put both ends of one veth pair in this process's namespace with a node on each end
(one process, two "hosts", two XDP programs); the process tests run a node in a namespace and
kill it.  Every interface and namespace is removed, even on failure.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import trio

from stacklib.errors import ChannelError, UNetError
from stacklib.netns import (
    capability_problem,
    links,
    local_veth,
    netns,
    netns_argv,
    remove_stale_links,
    veth_pair,
)
from stacklib.transports import TRANSPORTS
from stacklib.transports.ether import EtherAddress
from stacklib.transports.xdp import XdpNetwork, XdpParams, XskLayout
from stacklib.transports.xdp.attach import PortTaken, XdpAttachment
from stacklib.transports.xdp.bpf import BpfError, bpf_problem, run_program
from stacklib.transports.xdp.program import XDP_DROP, XDP_PASS, XDP_REDIRECT
from stacklib.transports.xdp.xsk import xdp_problem
from stacklib.unet import Endpoint
from stacklib.wire import unet_eth

PROBLEM = capability_problem() or bpf_problem() or xdp_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

SOURCE = "02:00:00:00:00:09"


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers_from_killed_runs() -> None:
    if PROBLEM is None:
        remove_stale_links("slx")


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    """Both ends of a veth pair in this namespace, up, without addresses."""
    with local_veth("slx") as (a, b):
        yield a, b
    assert a not in links() and b not in links()


@pytest.fixture
def pair(veth: tuple[str, str]) -> Iterator[tuple[XdpNetwork, XdpNetwork]]:
    with XdpNetwork(veth[0]) as net_a, XdpNetwork(veth[1]) as net_b:
        yield net_a, net_b


def endpoints(net_a: XdpNetwork, net_b: XdpNetwork) -> tuple[Endpoint, Endpoint, int, int]:
    a, b = net_a.add_node("a"), net_b.add_node("b")
    ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
    ep_b = b.os.create_endpoint(b.os.process("y"), port=2)
    ch_a = a.os.create_channel(ep_a.owner, ep_a, ep_b.address)
    ch_b = b.os.create_channel(ep_b.owner, ep_b, ep_a.address)
    return ep_a, ep_b, ch_a, ch_b


def wait_poll(endpoint: Endpoint, timeout: float = 5.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        message = endpoint.poll()
        if message is not None:
            return message.data
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing arrived at {endpoint!r}")


def frame(destination: str, port: int, payload: bytes, ethertype: int = 0x88B5) -> bytes:
    header = unet_eth.mac(destination) + unet_eth.mac(SOURCE) + ethertype.to_bytes(2, "big")
    body = len(payload).to_bytes(2, "big") + bytes([port]) + payload
    return (header + body).ljust(60, b"\0")


def test_registered_and_parameters_checked() -> None:
    assert TRANSPORTS["xdp"].Params is XdpParams
    with pytest.raises(ValueError, match="mode"):
        XdpParams(mode="turbo")
    with pytest.raises(ValueError, match="power of two"):
        XskLayout(frames=1000)
    with pytest.raises(ValueError, match="2048 or 4096"):
        XskLayout(frame_size=8192)
    with pytest.raises(ValueError, match="no network interface"):
        XdpNetwork("sl-no-such-if")


def test_the_program_sorts_frames(veth: tuple[str, str]) -> None:
    """Run the attached program on frames without sending them (BPF_PROG_TEST_RUN): U-Net
    frames for a granted port are redirected, for another port dropped; IP, ARP and runts
    pass to the kernel; the counters follow."""
    with XdpNetwork(veth[0]) as net:
        node = net.add_node("a")
        node.os.create_endpoint(node.os.process("x"), port=3)
        attachment = net.attachment
        assert attachment is not None
        mac = node.ni.mac  # type: ignore[attr-defined]
        before = attachment.counters()
        cases = [
            (frame(mac, 3, b"mine"), XDP_REDIRECT),
            (frame(mac, 4, b"not granted"), XDP_DROP),
            (frame(mac, 3, b"ip", ethertype=0x0800), XDP_PASS),
            (frame(mac, 3, b"arp", ethertype=0x0806), XDP_PASS),
            (frame(mac, 3, b"")[:16], XDP_PASS),  # shorter than the U-Net header
        ]
        for data, action in cases:
            assert run_program(attachment.program_fd, data) == action
        after = attachment.counters()
        assert {name: after[name] - before[name] for name in after} == {
            "redirected": 1,
            "no-socket": 1,
            "passed": 3,
        }


def test_every_size_both_ways_and_counted(pair: tuple[XdpNetwork, XdpNetwork]) -> None:
    ep_a, ep_b, ch_a, ch_b = endpoints(*pair)
    limit = ep_a.ni.max_message
    assert limit == unet_eth.MAX_MESSAGE  # MTU 1500
    for size in [0, 1, 39, 40, 41, 64, 100, 1000, limit]:
        data = os.urandom(size)
        ep_a.send_nowait(ch_a, data)
        assert wait_poll(ep_b) == data
        ep_b.send_nowait(ch_b, data[::-1])
        assert wait_poll(ep_a) == data[::-1]
    for net in pair:
        stats = net.nodes[next(iter(net.nodes))].ni.socket_statistics()  # type: ignore[attr-defined]
        assert stats["program"]["redirected"] == 9
        assert stats["socket"]["rx_dropped"] == 0
        assert stats["zero_copy"] is False  # veth has no zero-copy


def test_general_path_and_batches(pair: tuple[XdpNetwork, XdpNetwork]) -> None:
    """Frames queued behind each other take the descriptor path; send_many wakes the kernel
    once per batch the kernel takes; everything arrives in order."""
    ep_a, ep_b, ch_a, _ = endpoints(*pair)
    messages = [i.to_bytes(4, "big") * 10 for i in range(300)]
    kicks = ep_a.ni.xsk.kicks  # type: ignore[attr-defined]
    assert ep_a.send_many(ch_a, messages) == 300  # type: ignore[attr-defined]
    assert ep_a.ni.xsk.kicks - kicks <= 300 // 32 + 2  # type: ignore[attr-defined]
    got = [wait_poll(ep_b) for _ in messages]
    assert got == messages


def test_oversized_message_is_refused(pair: tuple[XdpNetwork, XdpNetwork]) -> None:
    ep_a, _, ch_a, _ = endpoints(*pair)
    with pytest.raises(UNetError, match="exceeds"):
        ep_a.send_nowait(ch_a, bytes(ep_a.ni.max_message + 1))


def test_mtu_bounds_the_message_and_skb_mode_takes_jumbo_frames(veth: tuple[str, str]) -> None:
    """Native XDP on a veth refuses a peer MTU above 3506: the attachment falls back to SKB
    mode, and the NI's largest message follows the MTU (a frame above it would vanish)."""
    for name in veth:
        subprocess.run(["ip", "link", "set", name, "mtu", "4000"], check=True)
    with (
        XdpNetwork(veth[0], layout=XskLayout(frame_size=4096)) as net_a,
        XdpNetwork(veth[1], layout=XskLayout(frame_size=4096)) as net_b,
    ):
        ep_a, ep_b, ch_a, _ = endpoints(net_a, net_b)
        assert net_a.attachment is not None and net_a.attachment.mode == "skb"
        assert ep_a.ni.max_message == 4096 - 256 - unet_eth.HEADER_SIZE
        data = os.urandom(3000)
        ep_a.send_nowait(ch_a, data)
        assert wait_poll(ep_b) == data
    with pytest.raises(BpfError, match="native"):
        XdpAttachment(veth[0], "native").close()


def test_kernel_traffic_passes_and_foreign_frames_are_dropped(veth: tuple[str, str]) -> None:
    """ARP and IP still reach the kernel on an interface with the program attached; U-Net
    frames for a port nobody was granted are dropped in the kernel and counted; frames for
    another MAC and malformed ones are dropped by the NI and counted."""
    a, b = veth
    subprocess.run(["ip", "addr", "add", "10.231.7.1/24", "dev", a], check=True)
    with netns("slxping") as ns:
        subprocess.run(["ip", "link", "set", b, "netns", ns], check=True)
        subprocess.run(netns_argv(ns, "ip", "addr", "add", "10.231.7.2/24", "dev", b), check=True)
        subprocess.run(netns_argv(ns, "ip", "link", "set", b, "up"), check=True)
        subprocess.run(["ip", "link", "set", a, "up"], check=True)
        with XdpNetwork(a) as net:
            node = net.add_node("a")
            endpoint = node.os.create_endpoint(node.os.process("x"), port=1)
            # The raw frames below come from this (made-up) source MAC.
            endpoint_channel = node.os.create_channel(
                endpoint.owner, endpoint, EtherAddress(SOURCE, 9)
            )
            ping = subprocess.run(
                netns_argv(ns, sys.executable, "-m", "stacklib.netns", "ping", "10.231.7.1", "3"),
                capture_output=True,
                text=True,
            )
            assert ping.returncode == 0, ping.stdout + ping.stderr
            mac = node.ni.mac  # type: ignore[attr-defined]
            raw = [
                frame(mac, 7, b"nobody has port 7"),  # no socket: the program drops it
                frame("02:00:00:00:00:77", 1, b"for another MAC"),
                frame(mac, 1, b"x")[:14] + b"\xff\xff\x01" + bytes(43),  # length beyond frame
                frame(mac, 1, b"welcome"),
            ]
            script = (
                "import socket,sys;s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW);"
                f"s.bind(({b!r},0));[s.send(bytes.fromhex(x)) for x in sys.argv[1:]]"
            )
            subprocess.run(
                netns_argv(ns, sys.executable, "-c", script, *(f.hex() for f in raw)), check=True
            )
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and endpoint.poll() is None:
                pass
            stats = node.ni.socket_statistics()  # type: ignore[attr-defined]
            assert stats["program"]["no-socket"] == 1
            assert stats["program"]["passed"] >= 2  # ARP and ICMP at least
            assert stats["ignored"] == 1
            assert node.ni.dropped["malformed"] == 1
            assert node.ni.received == 1
            assert endpoint_channel == 0


def test_ports_are_granted_once(veth: tuple[str, str]) -> None:
    with XdpNetwork(veth[0]) as net:
        node = net.add_node("a")
        node.os.create_endpoint(node.os.process("x"), port=5)
        attachment = net.attachment
        assert attachment is not None
        with pytest.raises(PortTaken, match="port 5"):
            attachment.grant(5, 999)
        with pytest.raises(ChannelError, match="outside"):
            node.os.create_endpoint(node.os.process("y"), port=300)
        # A second program on the same interface is refused with the way out.
        with pytest.raises(BpfError, match="already has an XDP program"):
            XdpAttachment(veth[0])


def _xdp_links(namespace: str) -> list[str]:
    shown = subprocess.run(
        netns_argv(namespace, "ip", "-j", "link", "show"), capture_output=True, text=True
    )
    return [link["ifname"] for link in json.loads(shown.stdout) if "xdp" in link]


_HOLDER = """
import sys, time
from stacklib.transports.xdp import XdpNetwork
net = XdpNetwork("eth0")
node = net.add_node("held")
node.os.create_endpoint(node.os.process("x"), port=1)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_a_killed_process_leaves_nothing_attached() -> None:
    with netns("slxkill") as ns_a, netns("slxkill") as ns_b:
        veth_pair(ns_a, ns_b, name_a="eth0", name_b="eth0")
        process = subprocess.Popen(
            netns_argv(ns_a, sys.executable, "-c", _HOLDER), stdout=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
            assert _xdp_links(ns_a) == ["eth0"]
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        deadline = time.monotonic() + 5
        while _xdp_links(ns_a) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _xdp_links(ns_a) == []
        # The next process gets the interface and its queue at once (bind retries EBUSY).
        again = subprocess.Popen(
            netns_argv(ns_a, sys.executable, "-c", _HOLDER), stdout=subprocess.PIPE, text=True
        )
        try:
            assert again.stdout is not None
            assert again.stdout.readline().strip() == "ready"
        finally:
            again.kill()
            again.wait()
            if again.stdout is not None:
                again.stdout.close()


def test_small_rings_recycle_buffers_under_a_burst(veth: tuple[str, str]) -> None:
    """With 32 receive and 32 send buffers a burst of 2,000 frames cycles every buffer through
    FILL/RX and TX/COMPLETION many times; whatever the receiver could not take is counted by
    the kernel, and what arrives is intact and in order."""
    layout = XskLayout(frames=64)
    with XdpNetwork(veth[0], layout=layout) as net_a, XdpNetwork(veth[1], layout=layout) as net_b:
        ep_a, ep_b, ch_a, _ = endpoints(net_a, net_b)
        got: list[bytes] = []
        for index in range(2000):
            while True:
                try:
                    ep_a.send_nowait(ch_a, index.to_bytes(4, "big") + bytes(36))
                    break
                except trio.WouldBlock:
                    pass
            message = ep_b.poll()
            if message is not None:
                got.append(message.data)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            message = ep_b.poll()
            if message is not None:
                got.append(message.data)
        numbers = [int.from_bytes(data[:4], "big") for data in got]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
        socket_stats = ep_b.ni.socket_statistics()["socket"]  # type: ignore[attr-defined]
        lost = socket_stats["rx_dropped"] + socket_stats["rx_fill_ring_empty_descs"]
        assert len(got) + lost >= 2000 or len(got) == 2000
        assert len(got) > 100


async def test_trio_recv_spins_then_sleeps_and_wakes(pair: tuple[XdpNetwork, XdpNetwork]) -> None:
    ep_a, ep_b, ch_a, ch_b = endpoints(*pair)

    async def echo() -> None:
        while True:
            message = await ep_b.recv()
            await ep_b.send(ch_b, message.data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        for size in (1, 500, 1400):
            payload = os.urandom(size)
            await ep_a.send(ch_a, payload)
            with trio.fail_after(5):
                assert (await ep_a.recv()).data == payload
        await trio.sleep(0.01)  # longer than the spin: the echo now sleeps in poll(2)
        await ep_a.send(ch_a, b"wake")
        with trio.fail_after(5):
            assert (await ep_a.recv()).data == b"wake"
        nursery.cancel_scope.cancel()


def test_digest_of_a_stream(pair: tuple[XdpNetwork, XdpNetwork]) -> None:
    ep_a, ep_b, ch_a, _ = endpoints(*pair)
    sent, received = hashlib.sha256(), hashlib.sha256()
    for index in range(500):
        chunk = os.urandom(1 + index % 1400)
        sent.update(chunk)
        ep_a.send_nowait(ch_a, chunk)
        received.update(wait_poll(ep_b))
    assert sent.hexdigest() == received.hexdigest()


def test_socket_bind_on_a_missing_queue_names_it(veth: tuple[str, str]) -> None:
    from stacklib.transports.xdp.xsk import XdpSetupError, open_socket

    with pytest.raises(XdpSetupError, match="queue 7") as error:
        open_socket(veth[0], 7)
    assert error.value.errno in (errno.EINVAL, errno.ENODEV, errno.ENXIO)
    assert socket.if_nametoindex(veth[0])


def test_zero_copy_is_used_where_offered_and_refused_clearly_where_not(
    veth: tuple[str, str],
) -> None:
    """veth has no zero-copy AF_XDP: insisting on it fails naming the step; the default falls
    back to copy mode and says so."""
    from stacklib.transports.xdp.xsk import XdpSetupError, open_socket

    with pytest.raises(XdpSetupError, match="cannot bind") as error:
        open_socket(veth[0], zero_copy=True)
    assert error.value.errno in (errno.EOPNOTSUPP, errno.EPROTONOSUPPORT, errno.EINVAL)
    opened = open_socket(veth[0])
    try:
        assert opened.zero_copy is False
    finally:
        opened.sock.close()
        os.close(opened.umem_fd)


def test_batches_both_ways_keep_order_and_stop_at_other_endpoints_frames(
    pair: tuple[XdpNetwork, XdpNetwork],
) -> None:
    """send_many writes a batch in one pass; recv_many takes this endpoint's frames at the
    head of RX in one pass and leaves the rest to the general path, so every message reaches
    its endpoint once and in order.  An oversized message refuses the whole batch."""
    ep_a, ep_b, ch_a, _ = endpoints(*pair)
    node_a, node_b = pair[0].nodes["a"], pair[1].nodes["b"]
    # A second pair of endpoints (one channel per remote host and endpoint in U-Net/FE).
    ep_d = node_a.os.create_endpoint(node_a.os.process("w"), port=4)
    ep_c = node_b.os.create_endpoint(node_b.os.process("z"), port=3)
    node_b.os.create_channel(ep_c.owner, ep_c, ep_d.address)
    ch_dc = node_a.os.create_channel(ep_d.owner, ep_d, ep_c.address)
    first = [b"b%d" % i for i in range(5)]
    second = [b"b%d" % i for i in range(5, 10)]
    assert ep_a.send_many(ch_a, first) == 5  # type: ignore[attr-defined]
    assert ep_d.send_many(ch_dc, [b"c0"]) == 1  # type: ignore[attr-defined]
    assert ep_a.send_many(ch_a, iter(second)) == 5  # type: ignore[attr-defined]
    with pytest.raises(UNetError, match="exceeds"):
        ep_a.send_many(ch_a, [b"fine", bytes(ep_a.ni.max_message + 1)])  # type: ignore[attr-defined]
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < 10 and time.monotonic() < deadline:
        got += [m.data for m in ep_b.recv_many(64)]  # type: ignore[attr-defined]
    assert got == first + second
    assert [m.data for m in ep_c.recv_many()] == [b"c0"]  # type: ignore[attr-defined]
    assert ep_b.recv_many() == [] and ep_b.received == 10  # type: ignore[attr-defined]
    assert ep_a.sent == 10 and ep_d.sent == 1
