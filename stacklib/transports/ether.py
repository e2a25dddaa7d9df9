"""The ether transport: U-Net/FE frames on a real Ethernet segment through an AF_PACKET socket.

U-Net/FE (paper 001 §3) puts U-Net messages straight into Ethernet frames: a channel is the
remote host's MAC address and a one-byte U-Net port (paper 001 §3.1), and every frame has the
format of :mod:`stacklib.wire.unet_eth` (EtherType 0x88B5, 2-byte length, 1-byte port, padded
to 60 bytes).  A frame names only the destination port, so a node demultiplexes an arrival by
(source MAC, destination port): an endpoint holds at most one channel per remote host, as in
U-Net/FE.

Here each node owns one raw packet socket (``AF_PACKET``, ``SOCK_RAW``) bound to one interface
and to EtherType 0x88B5, so the kernel hands it only U-Net frames; every other EtherType is
filtered out before user space (no count).  The kernel still runs the driver and the socket
layer, a system call per frame (U-Net/FE's was a lighter fast trap, paper 003 Fig 3); the
Ethernet FCS is the NIC's and the kernel's business.  The socket is non-blocking and waited on
with ``trio.lowlevel.wait_readable`` (``trio.socket`` accepts AF_PACKET too, but the NI drains
every waiting frame per wake-up with plain calls), so polling, ``await recv()`` and upcalls
(:meth:`EtherNI.serve`) work as on every transport.  Arrivals that are not for this node are dropped
and counted: malformed frames (``malformed``), frames for a (source, port) without a channel
(``unknown-tag``), and frames for an endpoint whose receive queue is full (``recv-queue-full``:
Ethernet has no back-pressure).  Frames the kernel marks for another host (a promiscuous or
bridged interface) or as broadcast/multicast are counted in :attr:`EtherNI.ignored`.

Needs CAP_NET_RAW.  A real per-host transport cannot be built for a list of node names in one
process the way recipes build networks (:func:`_build` explains the constraint), so the API is
per process: ``EtherNetwork(interface).add_node(name)``, with the peer's address
(:class:`EtherAddress`: MAC and port) learned out of band.  ``python -m
stacklib.transports.ether --peer IFACE PORT REMOTE_MAC REMOTE_PORT`` runs an echo peer, and
``python -m stacklib.transports.ether --bench [N]`` (root) compares round trips with kernel UDP
over one veth pair (:func:`bench_ether`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import attrs
import trio

from stacklib.errors import ChannelError
from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.socket_ni import HandleNetwork, SocketNI
from stacklib.unet.endpoint import Channel, DropReason, Endpoint
from stacklib.unet.ni import Payload
from stacklib.unet.node import Node
from stacklib.unet.os_service import OSService, Policy
from stacklib.unet.polled import PolledEndpoint
from stacklib.wire import unet_eth
from stacklib.wire.descriptor import SendDescriptor

ETH_P_UNET = unet_eth.ETHERTYPE_UNET
MAX_MESSAGE = unet_eth.MAX_MESSAGE
#: IEEE 802 Local Experimental EtherType 2: bare frames of the benchmark baseline, which the
#: U-Net sockets (0x88B5) never see.
ETH_P_RAW = 0x88B6
#: ``sll_pkttype`` values (linux/if_packet.h).
PACKET_HOST, PACKET_OUTGOING = 0, 4
#: Not in Python's socket module: ask the kernel not to loop our own frames back (Linux 4.20).
_SOL_PACKET, _PACKET_IGNORE_OUTGOING = 263, 23
_PAD = unet_eth.MIN_FRAME - unet_eth.HEADER_SIZE
_pack_header = unet_eth.HEADER_CODEC.pack


@attrs.frozen
class EtherAddress:
    """An endpoint of the ether transport: its host's MAC address and its one-byte port."""

    mac: str
    port: int

    def __str__(self) -> str:
        return f"{self.mac}/{self.port}"


def open_packet_socket(interface: str, ethertype: int = ETH_P_UNET) -> socket.socket:
    """A non-blocking raw packet socket on ``interface`` receiving only ``ethertype`` frames."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ethertype))
    try:
        sock.setblocking(False)
        sock.bind((interface, ethertype))
        # An older kernel refuses it: outgoing frames are then filtered by pkttype instead.
        with contextlib.suppress(OSError):
            sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
    except BaseException:
        sock.close()
        raise
    return sock


class EtherNI(SocketNI):
    """The NI of one node: a raw packet socket on one interface."""

    kind = "ether"

    def __init__(self, name: str, host: Host, network: EtherNetwork) -> None:
        super().__init__(
            name,
            host,
            inline_threshold=network.inline_threshold,
            max_message=MAX_MESSAGE,
            direct_access=False,
        )
        self.network = network
        self.interface = network.interface
        self._init_socket(open_packet_socket(self.interface))
        # The bound address holds the interface's MAC (correct in any namespace, unlike sysfs).
        self._mac_bytes = bytes(self.sock.getsockname()[4][:6])
        self.mac = unet_eth.mac_str(self._mac_bytes)
        self._buffer = bytearray(65536)  # an MTU above 1500 must not truncate a frame silently
        #: Frames the kernel refused for good (interface down): visible losses.
        self.lost = 0
        #: Frames for another host, broadcast or multicast: not U-Net traffic for this node.
        self.ignored = 0

    def address_of(self, endpoint: Endpoint) -> EtherAddress:
        return EtherAddress(self.mac, endpoint.port)

    def _tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, EtherAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not an EtherAddress")
        try:
            mac = unet_eth.mac(remote.mac)
        except ValueError as error:
            raise ChannelError(f"{self!r}: {error}") from None
        if not 0 <= remote.port <= 0xFF or not 0 <= endpoint.port <= 0xFF:
            raise ChannelError(f"{self!r}: U-Net/FE ports are one byte, got {remote}")
        if mac == self._mac_bytes:
            raise ChannelError(f"{self!r}: {remote} is this node's own MAC address")
        # Sent: destination MAC and port.  Received: source MAC and our port (paper 001 §3.1).
        return (mac, remote.port), (mac, endpoint.port)

    def _transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        tag: tuple[bytes, int] = channel.tx_tag  # type: ignore[assignment]
        mac, port = tag
        length = len(data)
        header = _pack_header(mac, self._mac_bytes, length, port)
        parts: list[Payload] = [header, data]
        if length < _PAD:
            parts.append(bytes(_PAD - length))  # the 60-byte minimum frame (paper 001 §3.2)
        try:
            self.sock.sendmsg(parts)
        except (BlockingIOError, InterruptedError):
            self._tx_blocked = True
            return False  # transmit queue full: back-pressure, retried by progress()
        except OSError as error:
            if error.errno == errno.ENOBUFS:
                self._tx_blocked = True
                return False
            if error.errno not in (errno.ENETDOWN, errno.ENXIO, errno.ENODEV):
                raise
            self.lost += 1
        self._injected(endpoint, descriptor, length)
        return True

    def progress(self) -> int:
        """Read every waiting frame and deliver it; retry sends the kernel refused."""
        delivered = 0
        buffer = self._buffer
        view = memoryview(buffer)
        recv = self.sock.recvfrom_into
        demux = self._demux
        while True:
            try:
                size, address = recv(buffer)
            except (BlockingIOError, InterruptedError):
                break
            if address[2] != PACKET_HOST:
                if address[2] != PACKET_OUTGOING:
                    self.ignored += 1
                continue
            try:
                frame = unet_eth.parse(view[:size], strict_min=False)
            except unet_eth.UNetEthFormatError:
                self.drop(DropReason.MALFORMED)
                continue
            key = (frame.src, frame.port)
            entry = demux.get(key)
            if entry is not None and entry[0].recv_queue.full:
                self.drop(DropReason.RECV_QUEUE_FULL, entry[0])
                continue
            self._deliver(key, frame.payload)
            delivered += 1
        if self._tx_blocked:
            self._tx_blocked = False
            self._resume()
        return delivered

    async def _wait_writable(self) -> None:
        # The packet socket has no writable edge for a full device queue everywhere; a short
        # sleep retries without spinning.
        with trio.move_on_after(0.001):
            await trio.lowlevel.wait_writable(self.sock)


class EtherEndpoint(PolledEndpoint):
    """An endpoint whose receive and send calls run the NI."""

    ni: EtherNI


EtherNI.endpoint_class = EtherEndpoint


class EtherNetwork(HandleNetwork):
    """This process's U-Net/FE node(s) on one Ethernet interface.

    Every host on the segment makes its own ``EtherNetwork`` on its interface and adds one node;
    channels name remote endpoints by :class:`EtherAddress`.  One node per interface: a second
    socket on the same interface would see the same frames under the same MAC, so the two nodes
    could not tell their traffic apart (separate processes on one interface share that problem:
    each counts the other's frames as ``unknown-tag``; a kernel filter per port would fix it).
    """

    kind = "ether"

    def __init__(
        self, interface: str, world: World | None = None, *, inline_threshold: int = 64
    ) -> None:
        self.world = world if world is not None else RealWorld()
        if self.world.virtual:
            raise ValueError("the ether transport runs in real time only")
        try:
            socket.if_nametoindex(interface)
        except OSError:
            raise ValueError(f"no network interface named {interface!r} here") from None
        self.interface = interface
        self.inline_threshold = inline_threshold
        self.nodes: dict[str, Node] = {}

    def add_node(
        self, name: str, profile: CostProfile | None = None, *, policy: Policy | None = None
    ) -> Node:
        """Add this host's node: a packet socket on the interface (needs CAP_NET_RAW)."""
        if self.nodes:
            raise ValueError(f"{self.interface} already has node {next(iter(self.nodes))!r}")
        host = Host(name, self.world, profile)
        ni = EtherNI(name, host, self)
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        return node


# ==================================================================== the echo peer


def peer_main(
    interface: str, port: int, remote: EtherAddress, *, mode: str = "trio", udp: int = 7797
) -> None:
    """Echo every message from ``remote`` on ``interface``; prints ``ready MAC PORT`` once
    listening, and this node's counters as one JSON line when stdin closes (the parent's
    signal to stop).

    ``mode``: ``poll`` (busy-polling loop), ``trio`` (``await recv``/``send``); or, for the
    benchmark's baselines over the same link, ``udp`` (a bare blocking kernel UDP echo on port
    ``udp``) or ``raw`` (a bare blocking echo of :data:`ETH_P_RAW` frames) instead.
    """
    network = EtherNetwork(interface)
    node = network.add_node("peer")
    endpoint = node.os.create_endpoint(node.os.process("echo"), port=port)
    assert isinstance(endpoint, EtherEndpoint)
    channel = node.os.create_channel(endpoint.owner, endpoint, remote)
    ni = endpoint.ni
    stdin = sys.stdin.fileno()

    async def echo_trio() -> None:
        while True:
            message = await endpoint.recv()
            await endpoint.send(channel, message.data)

    async def echo_poll() -> None:
        # Busy polling (paper 000 §3.1), with a checkpoint now and then for the stdin watcher.
        poll, send = endpoint.poll, endpoint.send_nowait
        spins = 0
        while True:
            message = poll()
            if message is None:
                spins += 1
                if spins & 63 == 0:
                    os.sched_yield()  # both processes may share a CPU (see shm.relax)
                    await trio.lowlevel.checkpoint()
                continue
            send(channel, message.data)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo_poll if mode == "poll" else echo_trio)
            print(f"ready {ni.mac} {endpoint.port}", flush=True)
            await trio.lowlevel.wait_readable(stdin)
            nursery.cancel_scope.cancel()

    try:
        if mode in ("udp", "raw"):
            if mode == "udp":
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind(("0.0.0.0", udp))
            else:
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_RAW))
                sock.bind((interface, ETH_P_RAW))
            with sock:
                target = _udp_echo if mode == "udp" else _raw_echo
                threading.Thread(target=target, args=(sock,), daemon=True).start()
                print(f"ready {ni.mac} {endpoint.port}", flush=True)
                select.select([stdin], [], [])
        else:
            trio.run(run)
        stats = {
            "dropped": dict(ni.dropped),
            "ignored": ni.ignored,
            "received": ni.received,
            "sent": ni.sent,
            "send_errors": dict(ni.send_errors),
        }
        print(json.dumps(stats), flush=True)
    finally:
        network.close()


def _udp_echo(sock: socket.socket) -> None:
    """A bare kernel UDP echo (blocking socket), the baseline of the kernel path."""
    recvfrom, sendto = sock.recvfrom, sock.sendto
    with contextlib.suppress(OSError):  # the socket closed under us: the peer is stopping
        while True:
            data, peer = recvfrom(65536)
            sendto(data, peer)


def _raw_echo(sock: socket.socket) -> None:
    """A bare AF_PACKET echo (blocking socket): frames sent back with the MACs swapped."""
    with contextlib.suppress(OSError):
        while True:
            frame = sock.recv(65536)
            sock.send(frame[6:12] + frame[:6] + frame[12:])


def raw_pingpong(interface: str, peer_mac: str, iterations: int, size: int = 40) -> float:
    """Mean round trip (s) of bare frames (EtherType :data:`ETH_P_RAW`, no U-Net layers) to a
    ``--mode raw`` peer, blocking: the kernel's raw-frame path alone."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_RAW)) as sock:
        sock.bind((interface, ETH_P_RAW))
        sock.settimeout(5)
        own = bytes(sock.getsockname()[4][:6])
        frame = unet_eth.mac(peer_mac) + own + ETH_P_RAW.to_bytes(2, "big") + bytes(max(size, 46))
        for index in range(iterations + 100):
            if index == 100:
                start = time.perf_counter()
            sock.send(frame)
            sock.recv(65536)
    return (time.perf_counter() - start) / iterations


def pingpong(endpoint: Endpoint, channel: int, iterations: int, size: int = 40) -> float:
    """Mean round trip (s) of ``size``-byte messages echoed by a peer, busy-polling."""
    message = bytes(size)
    send, poll = endpoint.send_nowait, endpoint.poll
    for index in range(iterations + 100):
        if index == 100:  # the first 100 warm caches and ARP-free paths up
            start = time.perf_counter()
        send(channel, message)
        deadline = time.monotonic() + 5
        while poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("ether ping-pong: no echo within 5 s")
    return (time.perf_counter() - start) / iterations


async def trio_pingpong(endpoint: Endpoint, channel: int, iterations: int, size: int = 40) -> float:
    """Like :func:`pingpong`, with blocking ``await send``/``await recv`` (sleeps in trio)."""
    message = bytes(size)
    with trio.fail_after(60):
        for index in range(iterations + 100):
            if index == 100:
                start = time.perf_counter()
            await endpoint.send(channel, message)
            await endpoint.recv()
    return (time.perf_counter() - start) / iterations


def udp_pingpong(address: tuple[str, int], iterations: int, size: int = 40) -> float:
    """Mean round trip (s) over a kernel UDP socket to an echo at ``address`` (blocking)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.settimeout(5)
        message = bytes(size)
        for index in range(iterations + 100):
            if index == 100:
                start = time.perf_counter()
            sock.send(message)
            sock.recv(65536)
    return (time.perf_counter() - start) / iterations


class EchoPeer:
    """A running echo peer process (see :func:`echo_peer`)."""

    def __init__(self, process: subprocess.Popen[str], address: EtherAddress) -> None:
        self.process = process
        #: The peer endpoint's address, as it reported it.
        self.address = address
        self.stats: dict[str, Any] | None = None

    def stop(self, timeout: float = 10) -> dict[str, Any]:
        """Ask the peer to stop (close its stdin); returns its counters."""
        if self.stats is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.stats = json.loads(_readline(self.process, timeout))
            self.process.wait(timeout)
        return self.stats


def _readline(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line:
        raise TimeoutError(f"ether peer {process.args!r} said nothing (exit {process.poll()})")
    return line


@contextlib.contextmanager
def echo_peer(
    namespace: str | None,
    interface: str,
    port: int,
    remote: EtherAddress,
    *,
    mode: str = "trio",
    udp: int = 7797,
    cpu: int | None = None,
    timeout: float = 20,
) -> Iterator[EchoPeer]:
    """Run ``python -m stacklib.transports.ether --peer`` (inside ``namespace`` if given) until
    the block ends; it is killed if it did not stop cleanly."""
    from stacklib.netns import netns_argv

    command = [sys.executable, "-m", "stacklib.transports.ether", "--peer", interface, str(port)]
    command += [remote.mac, str(remote.port), "--mode", mode, "--udp", str(udp)]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    argv = netns_argv(namespace, *command) if namespace is not None else command
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        word, mac, peer_port = _readline(process, timeout).split()
        if word != "ready":
            raise RuntimeError(f"ether peer: unexpected {word!r}")
        yield EchoPeer(process, EtherAddress(mac, int(peer_port)))
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def bench_ether(iterations: int = 20000, size: int = 40) -> dict[str, float]:
    """Round trips (s) over one veth pair between this process (root namespace) and an echo
    peer in a fresh namespace: U-Net/FE frames over AF_PACKET vs bare kernel UDP sockets.

    Needs root; creates and always removes the namespace and the veth pair.  Call it from
    synchronous code (it runs trio itself).
    """
    from stacklib.netns import netns, veth_pair

    results: dict[str, float] = {}
    cpus = sorted(os.sched_getaffinity(0))
    # Pinned to two CPUs as in bench real (docs/transports.md), when there are two.
    mine, theirs = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
    # The root-side address is visible to the whole host: a subnet per process, so two runs
    # at once do not route into each other's link.
    subnet = f"10.97.{os.getpid() % 250}"
    with netns("slbench") as ns:
        local, remote = veth_pair(
            None, ns, f"{subnet}.1/24", f"{subnet}.2/24", name_a=f"slb{os.getpid()}", name_b="eth0"
        )
        try:
            for mode in ("poll", "trio", "raw", "udp"):
                with EtherNetwork(local) as network:
                    node = network.add_node("client")
                    endpoint = node.os.create_endpoint(node.os.process("bench"), port=1)
                    me = endpoint.address
                    assert isinstance(me, EtherAddress)
                    with echo_peer(ns, remote, 2, me, mode=mode, cpu=theirs) as peer:
                        channel = node.os.create_channel(endpoint.owner, endpoint, peer.address)
                        affinity = os.sched_getaffinity(0)
                        if mine is not None:
                            os.sched_setaffinity(0, {mine})
                        try:
                            if mode == "udp":
                                results["kernel udp"] = udp_pingpong(
                                    (f"{subnet}.2", 7797), iterations, size
                                )
                            elif mode == "raw":
                                results["bare AF_PACKET frames"] = raw_pingpong(
                                    local, peer.address.mac, iterations, size
                                )
                            else:
                                results[f"ether, client poll, peer {mode}"] = pingpong(
                                    endpoint, channel, iterations, size
                                )
                            if mode == "trio":
                                results["ether, both blocking (trio)"] = trio.run(
                                    trio_pingpong, endpoint, channel, iterations, size
                                )
                        finally:
                            os.sched_setaffinity(0, affinity)
                        peer.stop()
        finally:
            # The namespace's deletion takes the veth pair with it; say so explicitly anyway.
            subprocess.run(["ip", "link", "del", local], capture_output=True, check=False)
    return results


def _main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stacklib.transports.ether",
        description="Run a U-Net/FE echo peer on a raw Ethernet interface (needs CAP_NET_RAW).",
    )
    parser.add_argument("--peer", action="store_true", help="run as an echo peer (the only mode)")
    parser.add_argument("interface", help="the network interface, e.g. eth0")
    parser.add_argument("port", type=int, help="this peer's endpoint port (1-255)")
    parser.add_argument("remote_mac", help="the client's MAC address")
    parser.add_argument("remote_port", type=int, help="the client's endpoint port")
    parser.add_argument("--mode", choices=["poll", "trio", "raw", "udp"], default="trio")
    parser.add_argument("--udp", type=int, default=7797, help="the UDP port of --mode udp")
    parser.add_argument("--bench", type=int, metavar="N", help="run bench_ether(N) and exit")
    if argv[:1] == ["--bench"]:
        for name, rtt in bench_ether(int(argv[1]) if len(argv) > 1 else 20000).items():
            print(f"{name:32} {rtt * 1e6:8.2f} us round trip")
        return 0
    args = parser.parse_args(argv)
    peer_main(
        args.interface,
        args.port,
        EtherAddress(args.remote_mac, args.remote_port),
        mode=args.mode,
        udp=args.udp,
    )
    return 0


# ==================================================================== registration


@attrs.frozen
class EtherParams:
    """Recipe parameters of the ether transport."""

    interface: str = "eth0"
    #: The named network namespace this process must be in (checked; a process cannot switch
    #: safely once threads and trio run, so start it with ``ip netns exec NS``).
    namespace: str | None = None
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))


def in_namespace(name: str) -> bool:
    """Whether this process is in the named network namespace ``name`` (``ip netns``)."""
    try:
        wanted = os.stat(f"/run/netns/{name}")
    except OSError:
        return False
    current = os.stat("/proc/self/ns/net")
    return (wanted.st_dev, wanted.st_ino) == (current.st_dev, current.st_ino)


def _build(
    world: World, params: EtherParams, names: Sequence[str], profile: CostProfile | None
) -> EtherNetwork:
    """Recipes build every node in one process; ether has one node per host (per interface),
    so only a one-node network can be built this way.  Its peers are other processes on other
    interfaces, started separately (``python -m stacklib.transports.ether --peer``)."""
    if len(names) != 1:
        raise ValueError(
            f"the ether transport builds one node per process (its interface's), got {len(names)}"
            "; start the peers as separate processes on their own interfaces"
        )
    if params.namespace is not None and not in_namespace(params.namespace):
        raise ValueError(
            f"the ether transport wants namespace {params.namespace!r}: run this process with "
            f"`ip netns exec {params.namespace} ...`"
        )
    network = EtherNetwork(params.interface, world, inline_threshold=params.inline_threshold)
    network.add_node(names[0], profile)
    return network


if __name__ == "__main__":
    # Delegate to the imported module so the classes are the package's own (see shm.py).
    from stacklib.transports.ether import _main as main

    sys.exit(main(sys.argv[1:]))
else:
    register_transport(
        TransportKind(
            name="ether",
            Params=EtherParams,
            build=_build,
            description="U-Net/FE frames on raw Ethernet via AF_PACKET (needs CAP_NET_RAW)",
            clock="real",
        )
    )
