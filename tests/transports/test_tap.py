"""The TAP transport against the real Linux kernel, whose side lives in a network namespace.

Frames are parsed and built here by hand with struct, independently of stacklib's own IP layer
(only the last test runs that layer over a TAP).  Each test makes its own namespace; the kernel
interface is 10.99.0.1/24 and stacklib plays 10.99.0.2 on the other end of the TAP "cable".
"""

from __future__ import annotations

import functools
import gc
import hashlib
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from stacklib.bench.streams import TcpStreamParams, UdpPingPongParams
from stacklib.errors import ChannelError
from stacklib.layers.ip.wire import build_ipv4_simple
from stacklib.netns import (
    capability_problem,
    links,
    namespaces,
    netns,
    netns_argv,
    ping_argv,
    remove_stale,
    run_in,
    veth_pair,
)
from stacklib.recipes import load_recipe, run_recipe
from stacklib.transports.tap import (
    FrameSizeError,
    TapAddress,
    TapDevice,
    TapError,
    TapNetwork,
    create_tap,
    open_tap,
    temporary_name_prefix,
)
from stacklib.unet import EndpointConfig, connect

PROBLEM = capability_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

PREFIX = "sltest"
KERNEL_IP = bytes([10, 99, 0, 1])
STACK_IP = bytes([10, 99, 0, 2])
BROADCAST = b"\xff" * 6
ETH = struct.Struct("!6s6sH")
ARP = struct.Struct("!HHBBH6s4s6s4s")
IPV4 = struct.Struct("!BBHHHBBH4s4s")
ETHERTYPE_IPV4, ETHERTYPE_ARP = 0x0800, 0x0806
RECIPES = Path(__file__).resolve().parents[2] / "stacklib" / "recipes"
TIMEOUT = 5  # seconds for one exchange; the tests take well under one each


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers_from_killed_runs() -> None:
    if PROBLEM is None:
        remove_stale(PREFIX)


@pytest.fixture
def ns() -> Iterator[str]:
    with netns(PREFIX) as name:
        yield name


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ethertype(frame: bytes) -> int:
    return int(ETH.unpack_from(frame)[2])


def is_arp_request_for(target: bytes) -> Callable[[bytes], bool]:
    def match(frame: bytes) -> bool:
        if ethertype(frame) != ETHERTYPE_ARP:
            return False
        fields = ARP.unpack_from(frame, ETH.size)
        return bool(fields[4] == 1 and fields[8] == target)

    return match


def is_ipv4(protocol: int) -> Callable[[bytes], bool]:
    def match(frame: bytes) -> bool:
        return ethertype(frame) == ETHERTYPE_IPV4 and frame[ETH.size + 9] == protocol

    return match


async def recv_matching(tap: TapDevice, wanted: Callable[[bytes], bool]) -> bytes:
    """The next frame ``wanted`` accepts; others (IPv6 router solicitations, MLD) are skipped."""
    with trio.fail_after(TIMEOUT):
        while True:
            frame = await tap.recv()
            if wanted(frame):
                return frame


def arp_reply(request: bytes, mac: bytes) -> bytes:
    """Answer an ARP request from the kernel: ``mac`` has the address it asked for."""
    _, _, _, _, _, sender_mac, sender_ip, _, target_ip = ARP.unpack_from(request, ETH.size)
    arp = ARP.pack(1, ETHERTYPE_IPV4, 6, 4, 2, mac, target_ip, sender_mac, sender_ip)
    return ETH.pack(sender_mac, mac, ETHERTYPE_ARP) + arp


def echo_reply(request: bytes, mac: bytes) -> bytes:
    """Answer an ICMP echo request frame, with both checksums computed afresh."""
    _, src_mac, _ = ETH.unpack_from(request)
    header_length = (request[ETH.size] & 0x0F) * 4
    ip_header = request[ETH.size : ETH.size + header_length]
    total_length = IPV4.unpack_from(ip_header)[2]
    icmp = request[ETH.size + header_length : ETH.size + total_length]
    version, tos, length, ident, frag, _, proto, _, src, dst = IPV4.unpack_from(ip_header)
    header = IPV4.pack(version, tos, length, ident, frag, 64, proto, 0, dst, src)
    header += ip_header[IPV4.size :]  # options, if any, echoed unchanged
    header = header[:10] + struct.pack("!H", checksum(header)) + header[12:]
    reply = b"\x00\x00\x00\x00" + icmp[4:]
    reply = reply[:2] + struct.pack("!H", checksum(reply)) + reply[4:]
    return ETH.pack(src_mac, mac, ETHERTYPE_IPV4) + header + reply


async def run_ping(ns: str, nursery: trio.Nursery, *, wait: float = 5.0) -> trio.Process:
    """Start one ping of 10.99.0.2 inside ``ns`` in the background (ends as soon as answered)."""
    command = ping_argv(ns, "10.99.0.2", count=1, wait=wait)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process: trio.Process = await nursery.start(
        functools.partial(trio.run_process, command, check=False, **quiet)
    )
    return process


# ---------------------------------------------------------------------- the namespace helpers


def test_netns_is_deleted_even_when_the_body_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), netns(PREFIX) as name:
        assert name in namespaces()
        assert name.startswith(f"{PREFIX}-{os.getpid()}-")
        raise RuntimeError("boom")
    assert name not in namespaces()


def test_veth_pair_joins_two_namespaces() -> None:
    with netns(PREFIX) as a, netns(PREFIX) as b:
        assert veth_pair(a, b, "10.98.0.1/24", "10.98.0.2/24") == ("veth0", "veth1")
        assert "veth0" in links(a) and "veth1" in links(b)
        result = subprocess.run(
            ping_argv(a, "10.98.0.2", wait=5.0), capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_fallback_ping_for_machines_without_ping() -> None:
    def fallback_ping(ns: str, address: str, wait: str) -> int:
        command = [sys.executable, "-m", "stacklib.netns", "ping", address, "1", wait]
        return run_in(ns, *command, check=False).returncode

    with netns(PREFIX) as ns:
        run_in(ns, "ip", "link", "set", "dev", "lo", "up")
        assert fallback_ping(ns, "127.0.0.1", "5") == 0
        assert fallback_ping(ns, "10.1.2.3", "0.2") != 0  # no route at all


# ---------------------------------------------------------------------- the TAP device


async def test_kernel_arp_request_reaches_stacklib(ns: str) -> None:
    async with open_tap(netns=ns, address="10.99.0.1/24") as tap:
        assert tap.name in links(ns) and tap.netns == ns
        assert tap.mac[0] & 0x02 and not tap.mac[0] & 0x01  # locally administered unicast
        assert tap.mac != tap.kernel_mac
        async with trio.open_nursery() as nursery:
            await run_ping(ns, nursery)
            frame = await recv_matching(tap, is_arp_request_for(STACK_IP))
            nursery.cancel_scope.cancel()  # nobody answers this ping
    dst, src, _ = ETH.unpack_from(frame)
    htype, ptype, hlen, plen, op, sha, spa, _, tpa = ARP.unpack_from(frame, ETH.size)
    assert (dst, src) == (BROADCAST, tap.kernel_mac)
    assert (htype, ptype, hlen, plen, op) == (1, ETHERTYPE_IPV4, 6, 4, 1)
    assert (sha, spa, tpa) == (tap.kernel_mac, KERNEL_IP, STACK_IP)


async def test_ping_from_the_namespace_is_answered_through_the_tap(ns: str) -> None:
    async with open_tap(netns=ns, address="10.99.0.1/24") as tap:
        async with trio.open_nursery() as nursery:
            ping = await run_ping(ns, nursery)
            request = await recv_matching(tap, is_arp_request_for(STACK_IP))
            await tap.send(arp_reply(request, tap.mac))
            echo = await recv_matching(tap, is_ipv4(1))
            await tap.send(echo_reply(echo, tap.mac))
            with trio.fail_after(TIMEOUT):
                assert await ping.wait() == 0

        # The kernel's echo request, checked the way a receiver would.
        dst_mac, src_mac, _ = ETH.unpack_from(echo)
        assert (dst_mac, src_mac) == (tap.mac, tap.kernel_mac)  # it learned our MAC by ARP
        ip_header = echo[ETH.size : ETH.size + 20]
        assert checksum(ip_header) == 0
        assert IPV4.unpack_from(ip_header)[8:] == (KERNEL_IP, STACK_IP)
        total_length = IPV4.unpack_from(ip_header)[2]
        icmp = echo[ETH.size + 20 : ETH.size + total_length]
        assert icmp[0] == 8 and checksum(icmp) == 0

        sent = [len(arp_reply(request, tap.mac)), len(echo_reply(echo, tap.mac))]
        stats = tap.statistics()
        assert (stats["frames_out"], stats["bytes_out"]) == (2, sum(sent))
        frames_in, bytes_in = stats["frames_in"], stats["bytes_in"]
        assert isinstance(frames_in, int) and isinstance(bytes_in, int)
        assert frames_in >= 2 and bytes_in >= len(request) + len(echo)  # and IPv6 chatter
        assert stats["dropped"] == {}


@pytest.mark.parametrize("mtu", [1500, 9000])
async def test_a_frame_longer_than_the_mtu_is_refused_naming_it(ns: str, mtu: int) -> None:
    async with open_tap(netns=ns, mtu=mtu) as tap:
        assert (tap.mtu, tap.max_frame) == (mtu, mtu + 14)
        assert f"mtu {mtu} " in run_in(ns, "ip", "link", "show", "dev", tap.name).stdout
        header = ETH.pack(BROADCAST, tap.mac, ETHERTYPE_IPV4)
        await tap.send(header + bytes(mtu))  # exactly the largest frame
        with pytest.raises(FrameSizeError, match=f"exceeds MTU {mtu} "):
            await tap.send(header + bytes(mtu + 1))
        with pytest.raises(FrameSizeError, match="shorter than an Ethernet header"):
            await tap.send(header[:13])
        stats = tap.statistics()
        assert (stats["frames_out"], stats["bytes_out"]) == (1, mtu + 14)
        assert stats["dropped"] == {"too-long": 1, "too-short": 1}


async def test_a_received_frame_longer_than_the_mtu_is_dropped_and_counted(ns: str) -> None:
    async with open_tap(netns=ns, address="10.99.0.1/24") as tap:
        # Raise the kernel's MTU behind the device's back and let it send one big datagram and
        # one small one to our (statically known) MAC.
        run_in(ns, "ip", "link", "set", "dev", tap.name, "mtu", "3000")
        run_in(ns, "ip", "neigh", "add", "10.99.0.2", "lladdr", tap.mac.hex(":"), "dev", tap.name)
        send_two = (
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            "[s.sendto(b'x' * n, ('10.99.0.2', 9)) for n in (2500, 10)]"
        )
        await trio.run_process(netns_argv(ns, sys.executable, "-c", send_two))
        frame = await recv_matching(tap, is_ipv4(17))
        assert len(frame) == 14 + 20 + 8 + 10
        assert tap.statistics()["dropped"] == {"too-long": 1}


async def test_a_frame_sent_while_the_interface_is_down_is_lost_and_counted(ns: str) -> None:
    async with open_tap(netns=ns) as tap:
        run_in(ns, "ip", "link", "set", "dev", tap.name, "down")
        await tap.send(ETH.pack(BROADCAST, tap.mac, ETHERTYPE_IPV4) + bytes(46))
        stats = tap.statistics()
        assert (stats["frames_out"], stats["dropped"]) == (0, {"write-error": 1})


async def test_deleting_the_interface_ends_a_waiting_receiver(ns: str) -> None:
    async with open_tap(netns=ns) as tap:

        async def receive() -> None:
            with pytest.raises(trio.EndOfChannel, match="gone"):
                while True:
                    await tap.recv()  # IPv6 chatter may come first

        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                await trio.run_process(["ip", "-n", ns, "link", "delete", "dev", tap.name])
        with pytest.raises(trio.BrokenResourceError, match="write failed"):
            await tap.send(ETH.pack(BROADCAST, tap.mac, ETHERTYPE_IPV4) + bytes(46))
        assert tap.statistics()["dropped"] == {"write-error": 1}
        assert [frame async for frame in tap] == []  # iteration ends too


async def test_closing_wakes_a_receiver_and_is_idempotent(ns: str) -> None:
    async with open_tap(netns=ns) as tap:
        # The receiver may see some IPv6 chatter first, then blocks until the close.
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:

                async def receive() -> None:
                    with pytest.raises(trio.ClosedResourceError):
                        while True:
                            await tap.recv()

                nursery.start_soon(receive)
                await trio.testing.wait_all_tasks_blocked()
                await tap.aclose()
        await tap.aclose()
        assert tap.closed and tap.name not in links(ns)
        with pytest.raises(trio.ClosedResourceError):
            await tap.send(bytes(60))
        with pytest.raises(trio.ClosedResourceError):
            tap.recv_nowait()


async def test_a_named_interface_and_a_name_clash(ns: str) -> None:
    async with open_tap("sl0", netns=ns) as tap:
        assert tap.name == "sl0" and "sl0" in links(ns)
        with pytest.raises(TapError, match="File exists"):
            async with open_tap("sl0", netns=ns):
                pass  # pragma: no cover
        assert links(ns).count("sl0") == 1
    assert "sl0" not in links(ns)
    assert not {name for name in links() if name.startswith(temporary_name_prefix())}


async def test_a_tap_in_this_process_namespace() -> None:
    name = f"slt{os.getpid()}"[:15]
    async with open_tap(name, mtu=1400) as tap:
        assert tap.netns is None and tap.name == name
        shown = subprocess.run(
            ["ip", "link", "show", "dev", name], capture_output=True, text=True, check=True
        ).stdout
        assert "mtu 1400 " in shown and ",UP" in shown
    assert name not in links()


async def test_nothing_is_left_behind_even_on_failure() -> None:
    # Other test runs may make namespaces and interfaces meanwhile: look only for ours.
    def ours() -> tuple[set[str], set[str]]:
        spaces = {n for n in namespaces() if n.startswith(f"{PREFIX}-{os.getpid()}-")}
        interfaces = {n for n in links() if n.startswith(temporary_name_prefix())}
        return spaces, interfaces

    assert ours() == (set(), set())
    kept: list[tuple[str, str]] = []
    with pytest.raises(RuntimeError, match="mid-test"), netns(PREFIX) as ns:
        async with open_tap(netns=ns, address="10.99.0.1/24") as tap:
            assert ours() == ({ns}, set())
            kept.append((ns, tap.name))
            raise RuntimeError("mid-test")
    ((ns, name),) = kept
    assert ns not in namespaces() and name not in links()
    assert ours() == (set(), set())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mtu": 67}, "mtu must be"),
        ({"mac": b"\x01\0\0\0\0\0"}, "unicast"),
        ({"name": "a/b"}, "interface name"),
        ({"name": "x" * 16}, "interface name"),
        ({"address": "10.99.0.300/24"}, "10.99.0.300"),
    ],
)
async def test_bad_arguments_are_refused_before_anything_is_created(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        async with open_tap(**kwargs):  # type: ignore[arg-type]
            pass  # pragma: no cover


async def test_the_ip_layer_over_a_tap_answers_the_kernels_ping(ns: str) -> None:
    from stacklib.layers.ip.driver import IpEtherLayer, IpEtherParams

    async with open_tap(netns=ns, address="10.99.0.1/24") as tap:
        async with IpEtherLayer(IpEtherParams(address="10.99.0.2")).open(tap) as ip:
            with trio.fail_after(TIMEOUT):
                ping = await trio.run_process(
                    ping_argv(ns, "10.99.0.2", wait=TIMEOUT), check=False, capture_stdout=True
                )
            assert ping.returncode == 0, ping.stdout
            assert ip.statistics()["echo_replies"] == 1
        frames_out = tap.statistics()["frames_out"]
        assert isinstance(frames_out, int) and frames_out >= 2  # ARP reply, echo reply


# The kernel's side of the 8 KB UDP exchange: send a datagram to stacklib from port 5000, then
# expect it back reversed; print the SHA-256 of what came back.
KERNEL_UDP = """
import hashlib, socket, sys
data = bytes(range(256)) * 32 + b"kernel"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.99.0.1", 5000))
s.settimeout(%(timeout)s)
s.sendto(data, ("10.99.0.2", 6000))
back, peer = s.recvfrom(65535)
print(hashlib.sha256(back).hexdigest(), len(back), peer[0], peer[1])
sys.exit(0 if back == data[::-1] else 1)
"""


@pytest.mark.skipif(shutil.which("ping") is None, reason="needs ping -s (iputils)")
async def test_the_kernels_large_ping_is_answered_in_fragments(ns: str) -> None:
    from stacklib.layers.ip.driver import IpEtherLayer, IpEtherParams

    async with (
        open_tap(netns=ns, address="10.99.0.1/24") as tap,
        IpEtherLayer(IpEtherParams(address="10.99.0.2")).open(tap) as ip,
    ):
        argv = netns_argv(ns, "ping", "-n", "-c", "1", "-s", "4000", "-W", str(TIMEOUT))
        with trio.fail_after(TIMEOUT):
            ping = await trio.run_process([*argv, "10.99.0.2"], check=False, capture_stdout=True)
        assert ping.returncode == 0, ping.stdout
        assert b"4008 bytes from 10.99.0.2" in ping.stdout
        stats = ip.statistics()
        assert stats["echo_replies"] == 1 and stats["reassembled"] == 1
        assert stats["fragmented"] == 1 and stats["fragments_sent"] == 3  # 1480+1480+1048


async def test_8_kb_udp_datagrams_both_ways_with_the_kernel(ns: str) -> None:
    from stacklib.layers.ip.driver import IpEtherLayer, IpEtherParams
    from stacklib.layers.udp import UdpLayer, UdpParams

    data = bytes(range(256)) * 32 + b"kernel"  # 8198 bytes: six fragments at MTU 1500
    async with (
        open_tap(netns=ns, address="10.99.0.1/24") as tap,
        IpEtherLayer(IpEtherParams(address="10.99.0.2")).open(tap) as ip,
        UdpLayer(UdpParams()).open(ip) as udp,
    ):
        sock = await udp.bind(6000)
        kernel: list[subprocess.CompletedProcess[bytes]] = []

        async def run_kernel() -> None:
            script = KERNEL_UDP % {"timeout": TIMEOUT}
            argv = netns_argv(ns, sys.executable, "-c", script)
            kernel.append(await trio.run_process(argv, check=False, capture_stdout=True))

        with trio.fail_after(2 * TIMEOUT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_kernel)
                got, (source, port) = await sock.recvfrom()
                assert (got, source, port) == (data, "10.99.0.1", 5000)
                await sock.sendto(got[::-1], (source, port))
        assert kernel[0].returncode == 0, kernel[0].stdout
        digest = hashlib.sha256(data[::-1]).hexdigest()
        assert kernel[0].stdout.decode().split() == [digest, "8198", "10.99.0.2", "6000"]
        stats = ip.statistics()
        assert stats["reassembled"] == 1 and stats["fragments_sent"] == 6


# --- the tap node transport: stacklib hosts bridged by the kernel -------------------------------


def test_create_tap_blocks_and_leaves_nothing_behind(ns: str) -> None:
    tap = create_tap(netns=ns, mtu=1400)
    try:
        assert tap.name in links(ns) and tap.mtu == 1400 and tap.fileno() >= 0
    finally:
        tap.close()
    assert tap.name not in links(ns)


A_IP, B_IP = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])


def test_two_nodes_exchange_ipv4_frames_through_the_kernels_bridge() -> None:
    with TapNetwork(netns=None, mtu=1400) as network:
        made = network.netns
        assert made in namespaces() and network.bridge in links(made)
        a, b = network.add_node("a"), network.add_node("b")
        ep_a = a.os.create_endpoint(a.os.process("pa"), EndpointConfig())
        ep_b = b.os.create_endpoint(b.os.process("pb"), EndpointConfig())
        ch_a, ch_b = connect(ep_a, ep_b)
        # A well-formed IPv4 packet: a bridge with br_netfilter drops malformed ones.
        packet = build_ipv4_simple(A_IP, B_IP, 17, b"hi", 64, 1)

        async def exchange() -> bytes:
            with trio.fail_after(TIMEOUT):
                await ep_a.send(ch_a, packet)
                message = await ep_b.recv()
                assert message.channel == ch_b
                big = build_ipv4_simple(
                    bytes([10, 0, 0, 2]), bytes([10, 0, 0, 1]), 17, bytes(1380), 64, 2
                )
                await ep_b.send(ch_b, big)  # the MTU exactly
                assert (await ep_a.recv()).data == big
                return message.data

        assert trio.run(exchange) == packet
        with pytest.raises(ChannelError, match="unicast"):
            a.ni.tags(ep_a, TapAddress("ff:ff:ff:ff:ff:ff"))
        with pytest.raises(ChannelError, match="own MAC"):
            a.ni.tags(ep_a, a.ni.address_of(ep_a))
        with pytest.raises(ChannelError, match="not a TapAddress"):
            a.ni.tags(ep_a, "10.0.0.1")
    assert made not in namespaces()  # closing removed the namespace it made


def test_a_given_namespace_keeps_existing_without_the_bridge(ns: str) -> None:
    network = TapNetwork(netns=ns, bridge="slbr7", kernel_address="10.98.0.254/24")
    network.add_node("n0")
    assert "slbr7" in links(ns)
    network.close()
    network.close()  # idempotent
    assert ns in namespaces() and "slbr7" not in links(ns)


@pytest.mark.parametrize("name", ["udp-tap", "tcp-tap"])
def test_the_tap_recipes_run(name: str) -> None:
    recipe = load_recipe(RECIPES / f"{name}.toml")
    before = set(namespaces())
    if isinstance(recipe.workload_params, UdpPingPongParams):
        params: object = attrs.evolve(
            recipe.workload_params, sizes=(0, 1472), iterations=20, warmup=2
        )
    else:
        params = TcpStreamParams(size=300_000, chunk=65536, rtt_iterations=5, request=4)
    result = run_recipe(recipe, workload_params=params)
    if name == "udp-tap":
        assert result.facts["lost"] == 0 and result.facts["max_size"] == 1472
        assert [row["size"] for row in result.rows] == [0, 1472]
    else:
        assert result.facts["received"] == 300_000
        segments = result.facts["segments_sent_by_node0"]
        assert isinstance(segments, int) and segments >= 300_000 // 1460  # MSS from the MTU
    gc.collect()  # the run's network is garbage now: its namespace goes with it
    assert {n for n in namespaces() if n.startswith("sltap-")} <= before
