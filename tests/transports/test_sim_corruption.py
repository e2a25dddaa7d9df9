"""Corruption on the simulated fabric flips real bits, end to end in virtual time: the link
checks (AAL5 CRC-32, the Ethernet FCS) catch wire errors, the transports' checksums (UDP, TCP)
catch what got past the link, the reliable layers (UAM, TCP) resend, and the application
receives nothing corrupt (SHA-256 of what arrives)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from stacklib.layers.ip import IpLayer, IpParams
from stacklib.layers.tcp import TcpLayer
from stacklib.layers.uam import UamLayer, UamParams
from stacklib.layers.udp import UdpLayer
from stacklib.services import UNetService
from stacklib.sim import Simulation
from stacklib.stack import Layer, open_stack
from stacklib.transports.sim import (
    AtmParams,
    FastEthernetParams,
    FaultParams,
    build_atm,
    build_fe,
)
from stacklib.transports.sim.links import OC3, EthernetLink, flip_bits
from stacklib.unet import EndpointConfig, connect
from stacklib.unet.endpoint import DropReason

A, B = "10.0.0.1", "10.0.0.2"
CONFIG = EndpointConfig(segment_size=512 * 1024, tx_buffers=32, rx_buffers=48, free_queue=64)
Main = Callable[[Any, Any, int, int], Awaitable[None]]


def run(
    kind: str, faults: FaultParams, layers: Callable[[str, str, int], list[Layer[Any]]],
    main: Main, seed: int = 3,
) -> dict[str, Any]:  # fmt: skip
    """Run ``main(a, b, peer_of_b_at_a, peer_of_a_at_b)`` over ``layers`` on a simulated pair
    (``kind`` "atm" or "fe") with ``faults``; returns the NIs and fabric for the counters."""
    sim = Simulation(seed=seed)
    cluster = (
        build_atm(sim, AtmParams(host="ss20", faults=faults), ["a", "b"], None)
        if kind == "atm"
        else build_fe(sim, FastEthernetParams(host="p120", faults=faults), ["a", "b"], None)
    )
    na, nb = cluster.nodes["a"], cluster.nodes["b"]
    ep_a = na.os.create_endpoint(na.os.process("a"), CONFIG)
    ep_b = nb.os.create_endpoint(nb.os.process("b"), CONFIG)
    ch_a, ch_b = connect(ep_a, ep_b)

    async def body() -> None:
        with trio.fail_after(600):
            async with (
                open_stack(UNetService(ep_a), layers(A, B, ch_a)) as a,
                open_stack(UNetService(ep_b), layers(B, A, ch_b)) as b,
            ):
                await main(a, b, ch_a, ch_b)

    sim.run(body)
    return {"a": na.ni, "b": nb.ni, "fabric": cluster.fabric.statistics()}


def ip_udp(me: str, peer: str, channel: int) -> list[Layer[Any]]:
    return [IpLayer(IpParams(address=me, peers={peer: channel})), UdpLayer()]


def digests(messages: list[bytes]) -> list[str]:
    return [hashlib.sha256(m).hexdigest() for m in messages]


MESSAGES = [random.Random(i).randbytes(200 + 19 * i) for i in range(60)]  # fit one FE frame


# --- the link checks run on the flipped bits ---------------------------------------------------


def test_the_aal5_crc_and_the_fcs_catch_flipped_bits() -> None:
    data = random.Random(1).randbytes(1000)
    for bits in ((0,), (7, 8), (8 * 999 + 7,), (8 * 1007,), (3, 4000, 8000)):
        assert OC3.check(data, bits) is None  # the trailer's CRC-32 covers every bit
        assert EthernetLink().check(data, bits[:1] if bits[0] < 8000 else (5,)) is None
    assert OC3.check(data, ()) == data  # nothing flipped: the PDU passes
    assert flip_bits(b"\x00\x00", (0, 15)) == b"\x80\x01"


# --- raw U-Net over ATM: the AAL5 CRC ----------------------------------------------------------


def test_wire_corruption_on_atm_is_caught_by_the_aal5_crc() -> None:
    got: list[bytes] = []

    async def main(a: UNetService, b: UNetService, pa: int, pb: int) -> None:
        for m in MESSAGES:
            await a.send(pa, m)
        with trio.move_on_after(1.0):
            while True:
                got.append((await b.recv())[1])

    out = run("atm", FaultParams(corrupt=0.01), lambda *_: [], main)
    receiver, fabric = out["b"], out["fabric"]
    assert fabric.corrupted > 5 and receiver.crc_errors == fabric.corrupted
    assert receiver.statistics().dropped[DropReason.CORRUPTED] == fabric.corrupted
    assert len(got) == len(MESSAGES) - fabric.corrupted
    assert set(digests(got)) <= set(digests(MESSAGES))  # nothing corrupt reached the application


def test_wire_corruption_on_fast_ethernet_is_caught_by_the_fcs() -> None:
    got: list[bytes] = []

    async def main(a: UNetService, b: UNetService, pa: int, pb: int) -> None:
        for m in MESSAGES:
            await a.send(pa, m)
        with trio.move_on_after(1.0):
            while True:
                got.append((await b.recv())[1])

    out = run("fe", FaultParams(corrupt=0.2), lambda *_: [], main)
    assert out["fabric"].corrupted > 5 and out["b"].fcs_errors == out["fabric"].corrupted
    assert len(got) == len(MESSAGES) - out["fabric"].corrupted
    assert set(digests(got)) <= set(digests(MESSAGES))


# --- past the link check: the transports' checksums ---------------------------------------------


def test_udp_counts_checksum_drops_of_errors_the_link_missed() -> None:
    got: list[bytes] = []
    stats: dict[str, Any] = {}

    async def main(a: Any, b: Any, pa: int, pb: int) -> None:
        sock = await b.bind(9)
        sender = await a.bind(9)
        for m in MESSAGES:
            await sender.sendto(m, (B, 9))
        with trio.move_on_after(1.0):
            while True:
                got.append((await sock.recvfrom())[0])
        stats.update(b.statistics())

    out = run("fe", FaultParams(corrupt_undetected=0.2), ip_udp, main)
    hit = out["fabric"].corrupted_undetected
    assert hit > 5 and out["b"].fcs_errors == 0  # delivered by the link
    # A flipped bit lands in the IP header (IP's checksum), or in UDP's header or data.
    dropped = stats["dropped"].get("checksum", 0)
    assert dropped > 0 and len(got) <= len(MESSAGES) - dropped
    assert set(digests(got)) <= set(digests(MESSAGES))


def test_tcp_counts_checksum_drops_and_the_stream_arrives_intact() -> None:
    data = random.Random(5).randbytes(100_000)
    got = bytearray()
    stats: dict[str, Any] = {}

    def layers(me: str, peer: str, channel: int) -> list[Layer[Any]]:
        return [IpLayer(IpParams(address=me, peers={peer: channel})), TcpLayer()]

    async def main(a: Any, b: Any, pa: int, pb: int) -> None:
        listener = await b.listen(80)
        client = await a.connect_to(B, 80)
        server = await listener.accept()
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                await client.send_all(data)
                await client.send_eof()

            nursery.start_soon(send)
            while chunk := await server.receive_some(65536):
                got.extend(chunk)
        stats.update(b.statistics())
        stats["a"] = a.statistics()

    out = run("fe", FaultParams(corrupt_undetected=0.1), layers, main)
    assert out["fabric"].corrupted_undetected > 5
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    caught = stats["dropped"].get("checksum", 0) + stats["a"]["dropped"].get("checksum", 0)
    assert caught > 0


# --- UAM: reliable over the AAL5 CRC, and over UDP's checksum ----------------------------------


def test_uam_resends_what_the_aal5_crc_dropped() -> None:
    got: list[bytes] = []

    def layers(me: str, peer: str, channel: int) -> list[Layer[Any]]:
        return [UamLayer(UamParams(rto_us=2000))]

    async def main(a: Any, b: Any, pa: int, pb: int) -> None:
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                for m in MESSAGES:
                    await a.send(pa, m)

            nursery.start_soon(send)
            for _ in MESSAGES:
                got.append((await b.recv())[1])

    out = run("atm", FaultParams(corrupt=0.01), layers, main)
    assert out["fabric"].corrupted > 0
    assert out["a"].crc_errors + out["b"].crc_errors == out["fabric"].corrupted
    assert digests(got) == digests(MESSAGES)  # all, in order, intact


def test_uam_over_udp_resends_what_udps_checksum_dropped() -> None:
    got: list[bytes] = []

    def layers(me: str, peer: str, channel: int) -> list[Layer[Any]]:
        return [*ip_udp(me, peer, channel), UamLayer(UamParams(rto_us=5000))]

    async def main(a: Any, b: Any, pa: int, pb: int) -> None:
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                for m in MESSAGES:
                    await a.send(pa, m)

            nursery.start_soon(send)
            for _ in MESSAGES:
                got.append((await b.recv())[1])
        sa, sb = a.statistics(), b.statistics()
        # Every PDU UDP's checksum dropped was data (resent by go-back-N) or an ACK (lost).
        assert sa["retransmitted"] + sb["acks_sent"] - sa["acks_received"] > 0

    out = run("fe", FaultParams(corrupt_undetected=0.05), layers, main)
    assert out["fabric"].corrupted_undetected > 0
    assert digests(got) == digests(MESSAGES)


# --- determinism -------------------------------------------------------------------------------


def test_same_seed_same_corruption() -> None:
    def once(seed: int) -> tuple[object, ...]:
        got: list[bytes] = []

        async def main(a: UNetService, b: UNetService, pa: int, pb: int) -> None:
            for m in MESSAGES:
                await a.send(pa, m)
            with trio.move_on_after(1.0):
                while True:
                    got.append((await b.recv())[1])

        out = run("atm", FaultParams(corrupt=0.01, corrupt_undetected=0.01), lambda *_: [],
                  main, seed)  # fmt: skip
        return out["fabric"], out["b"].crc_errors, tuple(digests(got))

    assert once(11) == once(11)
    assert once(11) != once(12)
