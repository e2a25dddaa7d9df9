"""UDP: the format and its checksum (golden bytes, round trips, any input, codec vs construct)
and the layer: echo both ways, checksum policies, receive-buffer overflow, the PCB cache, the
MTU, a peer's fragments, costs in virtual time over a simulated U-Net ATM pair (the checksum's
and the per-datagram cost from the host model) and none without a simulated host."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from stacklib.errors import AssemblyError, LocalProtocolError
from stacklib.layers.ip import IpLayer, IpParams, UdpService, wire
from stacklib.layers.ip.wire import Ipv4Packet
from stacklib.layers.udp import ChecksumPolicy, UdpDatagram, UdpFormatError, UdpLayer, UdpParams
from stacklib.layers.udp import wire as udp_wire
from stacklib.layers.udp.wire import UdpErrorKind
from stacklib.services import UNetService
from stacklib.sim import Simulation
from stacklib.stack import layer_class, open_stack
from stacklib.wire import registry
from tests.layers.test_ip_driver import A, B, Pair, make_pair, run_virtual

# --- the format --------------------------------------------------------------------------------


def test_golden_bytes_checksum_by_hand() -> None:
    # 10.0.0.1:1234 -> 10.0.0.2:7, data "hi".  By hand, the 16-bit words: pseudo-header
    # 0a00 0001 0a00 0002 0011 000a, header 04d2 0007 000a 0000, data 6869:
    # sum = 0x1400 + 0x0003 + 0x0011 + 0x000a + 0x04d2 + 0x0007 + 0x000a + 0x6869 = 0x816a,
    # checksum = ~0x816a = 0x7e95.
    built = udp_wire.build(UdpDatagram(1234, 7, b"hi"), A, B)
    assert built == bytes.fromhex("04d20007000a7e95") + b"hi"
    pseudo = wire.ip_bytes(A) + wire.ip_bytes(B) + bytes.fromhex("0011000a")
    assert wire.checksum_reference(pseudo + built) == 0
    parsed = udp_wire.parse(built, A, B)
    assert parsed == UdpDatagram(1234, 7, b"hi") and parsed.checksum == 0x7E95
    assert udp_wire.build(UdpDatagram(1234, 7, b"hi"), A, B, compute=False)[6:8] == b"\0\0"


def test_a_computed_zero_is_sent_as_all_ones() -> None:
    # Choose data that makes the sum 0xffff, so the checksum computes to 0.
    base = udp_wire.build(UdpDatagram(1, 2, b"\0\0"), A, B)
    fix = int.from_bytes(base[6:8], "big")  # adding these data bytes complements the sum
    built = udp_wire.build(UdpDatagram(1, 2, fix.to_bytes(2, "big")), A, B)
    assert built[6:8] == b"\xff\xff"
    assert udp_wire.parse(built, A, B).data == fix.to_bytes(2, "big")


@given(udp_wire.datagrams(), wire.addresses(), wire.addresses(), st.binary(max_size=4))
def test_round_trip_and_trailing_bytes(d: UdpDatagram, src: str, dst: str, trailer: bytes) -> None:
    for compute in (True, False):
        built = udp_wire.build(d, src, dst, compute=compute)
        assert udp_wire.parse(built + trailer, src, dst) == d
        assert udp_wire.parse_reference(memoryview(built + trailer), src, dst) == d


@given(st.binary(max_size=24), st.booleans())
def test_any_input_raises_only_its_error_and_agrees_with_reference(data: bytes, addr: bool) -> None:
    src, dst = (A, B) if addr else (None, None)
    try:
        d = udp_wire.parse(data, src, dst)
    except UdpFormatError as error:
        with pytest.raises(UdpFormatError) as reference:
            udp_wire.parse_reference(data, src, dst)
        assert reference.value.kind == error.kind
    else:
        assert udp_wire.parse_reference(data, src, dst) == d


def test_checks() -> None:
    good = udp_wire.build(UdpDatagram(1, 2, b"data"), A, B)
    for data, kind in [
        (good[:7], UdpErrorKind.SHORT),
        (good[:4] + b"\x00\x07" + good[6:], UdpErrorKind.LENGTH),
        (good[:4] + b"\x00\x20" + good[6:], UdpErrorKind.LENGTH),
        (good[:-1] + b"X", UdpErrorKind.CHECKSUM),
    ]:
        with pytest.raises(UdpFormatError) as error:
            udp_wire.parse(data, A, B)
        assert error.value.kind == kind
    assert udp_wire.parse(good[:-1] + b"X", A, B, verify=False).data == b"datX"


@given(st.tuples(*[st.integers(0, 0xFFFF)] * 4))
def test_codec_agrees_with_construct(values: tuple[int, int, int, int]) -> None:
    packed = udp_wire.HEADER_CODEC.pack(*values)
    names = udp_wire.HEADER_CODEC.names
    assert packed == udp_wire.HEADER_FORMAT.build(dict(zip(names, values, strict=True)))
    assert udp_wire.HEADER_CODEC.unpack(packed) == values


def test_policy_and_decode() -> None:
    assert [(p.tx, p.rx) for p in ChecksumPolicy] == [
        (True, True), (True, False), (False, True), (False, False)
    ]  # fmt: skip
    text = registry.decode("udp", udp_wire.build(UdpDatagram(53, 4000, b"x"), A, B))
    assert "dst_port: 4000" in text


# --- the layer ---------------------------------------------------------------------------------


async def open_udp(pair: Pair, params: UdpParams | None = None):  # type: ignore[no-untyped-def]
    """(stack a, stack b) contexts: IP + UDP over each endpoint."""
    layers_a = [IpLayer(IpParams(address=A, peers={B: pair.ch_a})), UdpLayer(params)]
    layers_b = [IpLayer(IpParams(address=B, peers={A: pair.ch_b})), UdpLayer(params)]
    return open_stack(UNetService(pair.ep_a), layers_a), open_stack(
        UNetService(pair.ep_b), layers_b
    )


async def echo_server(udp: UdpService, port: int, task_status=trio.TASK_STATUS_IGNORED):  # type: ignore[no-untyped-def]
    sock = await udp.bind(port)
    task_status.started()
    async with sock:
        while True:
            data, peer = await sock.recvfrom()
            await sock.sendto(data, peer)


async def test_echo_both_ways_in_real_time() -> None:
    ca, cb = await open_udp(make_pair())
    async with ca as a, cb as b, trio.open_nursery() as nursery:
        assert isinstance(a, UdpService) and isinstance(b, UdpService)
        await nursery.start(echo_server, b, 7)
        await nursery.start(echo_server, a, 7)
        client_a, client_b = await a.bind(), await b.bind(5000)
        assert client_a.local_address == (A, 49152)
        for i in range(50):
            message = bytes([i]) * (i * 37)
            await client_a.sendto(message, (B, 7))
            assert await client_a.recvfrom() == (message, (B, 7))
            await client_b.sendto(message, (A, 7))
            assert await client_b.recvfrom() == (message, (A, 7))
        stats = b.statistics()
        assert stats["delivered"] == 100 and stats["checksums_verified"] == 100
        # One miss per flow, then hits: the PCB cache (paper 000 §7.6).
        assert stats["pcb_misses"] == 2 and stats["pcb_hits"] == 98
        nursery.cancel_scope.cancel()


async def test_checksum_off_and_on() -> None:
    pair = make_pair()
    sent: list[bytes] = []
    ca, cb = await open_udp(pair)
    async with ca as a, cb as b:
        off = await a.bind(1, checksum="none")
        rx_only = await b.bind(2, checksum="rx")
        await off.sendto(b"unprotected", (B, 2))
        assert await rx_only.recvfrom() == (b"unprotected", (A, 1))
        assert b.statistics()["checksums_verified"] == 0  # nothing to verify: field was 0
        assert a.statistics()["checksums_computed"] == 0
        with pytest.raises(LocalProtocolError, match="checksum policy"):
            await a.bind(3, checksum="sometimes")
    # A corrupted checksum: dropped under "both", delivered under "none".
    pair = make_pair()
    async with (
        IpLayer(IpParams(address=B, peers={A: pair.ch_b})).open(UNetService(pair.ep_b)) as ip_b,
        UdpLayer().open(ip_b) as b,
    ):
        checked = await b.bind(10)
        unchecked = await b.bind(11, checksum="none")
        raw = UNetService(pair.ep_a)
        for port in (10, 11):
            segment = bytearray(udp_wire.build(UdpDatagram(9, port, b"payload"), A, B))
            segment[-1] ^= 1
            packet = wire.build_ipv4(Ipv4Packet(A, B, 17, bytes(segment)))
            sent.append(packet)
            await raw.send(pair.ch_a, packet)
        assert await unchecked.recvfrom() == (b"payloae", (A, 9))
        assert b.statistics()["dropped"] == {"checksum": 1}
        assert checked.statistics()["received"] == 0


async def test_receive_buffer_sized_by_the_application_and_overflow_counted() -> None:
    ca, cb = await open_udp(make_pair())
    async with ca as a, cb as b:
        small = await b.bind(9, rcvbuf_datagrams=3)
        tiny = await b.bind(10, rcvbuf_bytes=100)
        sender = await a.bind()
        for i in range(5):
            await sender.sendto(b"%d" % i, (B, 9))
            await sender.sendto(bytes(40), (B, 10))
        await sender.sendto(b"last", (B, 9))
        await trio.testing.wait_all_tasks_blocked()
        assert [(await small.recvfrom())[0] for _ in range(3)] == [b"0", b"1", b"2"]
        assert small.statistics()["overflows"] == 3  # 3, 4 and "last"
        assert tiny.statistics()["received"] == 2 and tiny.statistics()["overflows"] == 3
        assert b.statistics()["overflows"] == 6


async def test_mtu_ports_and_closing() -> None:
    ca, cb = await open_udp(make_pair())
    async with ca as a, cb as b:
        sock = await a.bind(7)
        receiver = await b.bind(7)
        await sock.sendto(bytes(9180 - 28), (B, 7))  # exactly the MTU
        assert len((await receiver.recvfrom())[0]) == 9152
        assert b.ip.statistics()["reassembled"] == 0
        big = bytes(range(256)) * 255 + bytes(227)  # 65,507 bytes: the most one datagram holds
        await sock.sendto(big, (B, 7))  # IP fragments it
        assert await receiver.recvfrom() == (big, (A, 7))
        assert b.ip.statistics()["reassembled"] == 1
        assert a.max_message == 65507
        with pytest.raises(LocalProtocolError, match="65507 bytes"):
            await sock.sendto(bytes(65508), (B, 7))
        with pytest.raises(LocalProtocolError, match="already bound"):
            await a.bind(7)
        for bad in ((B, 0), (B, 70000), ("10.0.0", 7)):
            with pytest.raises(LocalProtocolError):
                await sock.sendto(b"", bad)
        await sock.sendto(b"to nobody", (B, 8))
        await trio.testing.wait_all_tasks_blocked()
        assert b.statistics()["dropped"] == {"no_port": 1}
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await receiver.recvfrom()

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            receiver.close()
        await b.bind(7)  # free again
    with pytest.raises(trio.ClosedResourceError):
        await sock.sendto(b"", (B, 7))


async def test_a_peers_fragmented_datagram_is_reassembled() -> None:
    pair = make_pair()
    async with (
        IpLayer(IpParams(address=B, peers={A: pair.ch_b})).open(UNetService(pair.ep_b)) as ip_b,
        UdpLayer().open(ip_b) as b,
    ):
        sock = await b.bind(4000)
        data = bytes(range(256)) * 40
        segment = udp_wire.build(UdpDatagram(1, 4000, data), A, B)
        raw = UNetService(pair.ep_a)
        for offset in reversed(range(0, len(segment), 2960)):
            piece = segment[offset : offset + 2960]
            more = offset + 2960 < len(segment)
            packet = Ipv4Packet(A, B, 17, piece, identification=3, more_fragments=more,
                                fragment_offset=offset)  # fmt: skip
            await raw.send(pair.ch_a, wire.build_ipv4(packet))
        assert await sock.recvfrom() == (data, (A, 1))


def test_echo_and_costs_in_virtual_time_over_unet_atm() -> None:
    sim = Simulation(seed=1)
    pair = make_pair(sim, kind="atm")
    result: dict[str, float] = {}

    async def main() -> None:
        checksums: tuple[Literal["none", "both"], ...] = ("none", "both")
        for checksum in checksums:
            ca, cb = await open_udp(pair, UdpParams(checksum=checksum))
            async with ca as a, cb as b, trio.open_nursery() as nursery:
                await nursery.start(echo_server, b, 7)
                sock = await a.bind()
                cpu = pair.ep_a.ni.host.resource("cpu")
                busy = cpu.busy_time
                start = trio.current_time()
                for _ in range(5):
                    await sock.sendto(bytes(1000), (B, 7))
                    await sock.recvfrom()
                result[f"rtt_{checksum}"] = (trio.current_time() - start) / 5
                result[f"cpu_{checksum}"] = cpu.busy_time - busy
                nursery.cancel_scope.cancel()

    run_virtual(sim, main)
    # With the checksum, each 1000-byte datagram costs a's CPU 10 us more per direction
    # (paper 000 §7.6: 1 us per 100 bytes), on top of the copies.
    extra = result["cpu_both"] - result["cpu_none"]
    assert extra == pytest.approx(5 * 2 * 10e-6, rel=1e-6)
    assert result["rtt_both"] > result["rtt_none"] > 0


def _cpu_per_round_trip(kind: str, datagram_us: float | None) -> float:
    """Seconds of node a's host CPU per 16-byte round trip through node b's echo."""
    sim = Simulation(seed=1)
    pair = make_pair(sim, kind=kind)
    spent: list[float] = []

    async def main() -> None:
        ca, cb = await open_udp(pair, UdpParams(datagram_us=datagram_us))
        async with ca as a, cb as b, trio.open_nursery() as nursery:
            await nursery.start(echo_server, b, 7)
            sock = await a.bind()
            cpu = pair.ep_a.ni.host.resource("cpu")
            busy = cpu.busy_time
            for _ in range(4):
                await sock.sendto(bytes(16), (B, 7))
                await sock.recvfrom()
            spent.append((cpu.busy_time - busy) / 4)
            nursery.cancel_scope.cancel()

    run_virtual(sim, main)
    return spent[0]


@pytest.mark.parametrize(("kind", "host_us"), [("atm", 4.5), ("fe", 4.5 * 60 / 120)])
def test_the_layer_charges_its_per_datagram_cost_from_the_host_model(
    kind: str, host_us: float
) -> None:
    # Node a sends one datagram and receives one per round trip: two per-datagram costs, the
    # SPARCstation-20's calibrated 4.5 us (paper 000 Table 3), the 120 MHz Pentium's by clock.
    free = _cpu_per_round_trip(kind, 0.0)
    assert _cpu_per_round_trip(kind, None) - free == pytest.approx(2 * host_us * 1e-6, rel=1e-9)
    assert _cpu_per_round_trip(kind, 10.0) - free == pytest.approx(2 * 10e-6, rel=1e-9)


async def test_nothing_is_charged_without_a_simulated_host() -> None:
    pair = make_pair()
    ca, cb = await open_udp(pair, UdpParams(datagram_us=1000.0))
    async with ca as a, cb as b, trio.open_nursery() as nursery:
        assert a.ip.modeled_cpu is None and a.ip.modeled_protocol is None
        await nursery.start(echo_server, b, 7)
        sock = await a.bind()
        with trio.fail_after(5):
            await sock.sendto(b"ping", (B, 7))
            assert (await sock.recvfrom())[0] == b"ping"
        assert a._datagram == 0.0  # the 1000 us are not charged: no CPU is simulated
        nursery.cancel_scope.cancel()


async def test_assembly_and_registration() -> None:
    assert layer_class("udp") is UdpLayer
    with pytest.raises(AssemblyError):
        async with UdpLayer().open(UNetService(make_pair().ep_a)):
            pass
    with pytest.raises(AssemblyError):
        async with open_stack(UNetService(make_pair().ep_a), [UdpLayer()]):
            pass
    bads: list[dict[str, Any]] = [
        {"rcvbuf_bytes": -1},
        {"checksum_us_per_100_bytes": -1.0},
        {"datagram_us": -1.0},
        {"datagram_us": "4.5"},
    ]
    for bad in bads:
        with pytest.raises(ValueError):
            UdpParams(**bad)


def test_docs_example_runs() -> None:
    import contextlib
    import io
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "tcpip.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "docs/tcpip.md", "exec"), {"__name__": "__main__"})
    assert out.getvalue().splitlines() == [
        "(b'hello over U-Net', ('10.0.0.2', 7))",
        "1 miss, {}",
    ]
