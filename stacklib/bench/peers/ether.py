"""The echo peer and round-trip benchmark of the ether transport (U-Net/FE, paper 001 §3).

``python -m stacklib.bench.peers.ether --peer IFACE PORT REMOTE_MAC REMOTE_PORT`` runs an echo
peer (needs CAP_NET_RAW), and ``python -m stacklib.bench.peers.ether --bench [N]`` (root)
compares round trips with kernel UDP over one veth pair (:func:`bench_ether`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import trio

from stacklib.transports.ether import EtherAddress, EtherEndpoint, EtherNetwork
from stacklib.unet.endpoint import Endpoint
from stacklib.wire import unet_eth

#: IEEE 802 Local Experimental EtherType 2: bare frames of the benchmark baseline, which the
#: U-Net sockets (0x88B5) never see.
ETH_P_RAW = 0x88B6


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
                    os.sched_yield()  # both processes may share a CPU (see shm relax())
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
    """Run ``python -m stacklib.bench.peers.ether --peer`` (inside ``namespace`` if given) until
    the block ends; it is killed if it did not stop cleanly."""
    from stacklib.netns import netns_argv

    command = [sys.executable, "-m", "stacklib.bench.peers.ether", "--peer", interface, str(port)]
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
        prog="python -m stacklib.bench.peers.ether",
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


if __name__ == "__main__":
    # Delegate to the imported module so the classes are the package's own, not __main__ copies.
    from stacklib.bench.peers.ether import _main as main

    sys.exit(main(sys.argv[1:]))
