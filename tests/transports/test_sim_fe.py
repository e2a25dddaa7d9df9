"""The DEC 21140 Fast Ethernet model (stacklib.transports.sim.ethernet) against the papers.

U-Net/FE lives in the kernel (paper 001 §3, paper 003 §4.3-4.4): a fast trap sends (paper 003
Fig 3, eight steps, about 4.2 us of host time), an interrupt routine receives and copies
(paper 003 Fig 4; inline below 64 bytes).  Round trips of 40 bytes: 57 us on a hub, 91 us
through the Cabletron FN100, about 25 us more per 100 bytes; bandwidth approaches about
97 Mbit/s from 1 KB on (paper 003 §4.4.2, paper 001 §3.4).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from stacklib.errors import ChannelError, ConfigError, UNetError
from stacklib.recipes import parse_recipe, run_recipe
from stacklib.sim import Simulation, citations
from stacklib.transports.sim import FastEthernetParams, SimCluster, build_fe
from stacklib.transports.sim.ethernet import Dc21140NI
from stacklib.transports.sim.links import EthernetLink
from stacklib.transports.sim.params import SEND_TRAP_STEPS, Dc21140Params
from stacklib.unet import (
    DescriptorStatus,
    Endpoint,
    EndpointConfig,
    Fragment,
    RecvKind,
    SendDescriptor,
    SendError,
    connect,
)

US = 1e-6


def _cluster(
    interconnect: str = "hub",
    names: tuple[str, ...] = ("a", "b"),
    config: EndpointConfig | None = None,
) -> tuple[Simulation, SimCluster, dict[str, Endpoint], int]:
    sim = Simulation()
    params = FastEthernetParams(interconnect=interconnect)  # type: ignore[arg-type]
    cluster = build_fe(sim, params, list(names), None)
    eps = {
        name: node.os.create_endpoint(node.os.process(f"app@{name}"), config)
        for name, node in cluster.nodes.items()
    }
    ch, _ = connect(eps["a"], eps["b"])
    return sim, cluster, eps, ch


def _rtts(interconnect: str, sizes: list[int]) -> dict[int, float]:
    recipe = parse_recipe(
        {
            "run": {"clock": "virtual"},
            "transport": {"kind": "sim-fe", "interconnect": interconnect},
            "workload": {"kind": "pingpong", "sizes": sizes, "iterations": 5, "warmup": 1},
        },
        "test",
    )
    return {int(r["size"]): float(r["rtt_us"]) for r in run_recipe(recipe).rows}  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- send trap


def test_send_trap_is_the_eight_steps_of_paper_003_fig_3() -> None:
    assert [cost for _, cost in SEND_TRAP_STEPS] == [0.5, 0.74, 0.37, 0.56, 0.92, 0.42, 0.24, 0.4]
    assert SEND_TRAP_STEPS[0][0] == "trap entry overhead"
    assert SEND_TRAP_STEPS[-1][0] == "return from trap"
    assert Dc21140Params().send_trap_us == pytest.approx(4.15, abs=1e-9)
    # Paper 003 §4.4.1: "approximately 4.2µs of which about 20% are consumed by the trap
    # overhead" (entry and return: 0.9 of 4.15 us).
    entry_and_return = SEND_TRAP_STEPS[0][1] + SEND_TRAP_STEPS[-1][1]
    assert entry_and_return / 4.15 == pytest.approx(0.2, abs=0.02)


@pytest.mark.parametrize("size", [40, 1000])
def test_send_trap_blocks_the_host_cpu_whatever_the_size(size: int) -> None:
    # Paper 003 §4.4: "The processor overhead for sending a message, independent of size, is
    # approximately 4.2µs"; the host, not a co-processor, does it (§4.4.3).
    sim, cluster, eps, ch = _cluster()

    async def main() -> float:
        await eps["a"].send(ch, bytes(size))
        returned = trio.current_time()
        await eps["b"].recv()
        return returned

    returned = sim.run(main)
    trap = Dc21140Params().send_trap_us * US
    assert returned == pytest.approx(trap, rel=1e-9)
    cpu = cluster.nodes["a"].host.resource("cpu")
    assert cpu.busy_time == pytest.approx(trap, rel=1e-9)
    assert cpu.holds == 1


def _receiver_cpu_us(size: int) -> float:
    """Host CPU time on the receiver for one message of ``size`` bytes, received."""
    sim, cluster, eps, ch = _cluster()

    async def main() -> None:
        await eps["a"].send(ch, bytes(size))
        await eps["b"].recv()

    sim.run(main)
    return cluster.nodes["b"].host.resource("cpu").busy_time / US


def test_receive_interrupt_and_copy_run_on_the_host_cpu() -> None:
    p = Dc21140Params()
    busy = {size: _receiver_cpu_us(size) for size in (40, 100)}
    assert busy[40] == pytest.approx(p.rx_handler_small_us + p.host_recv_us, rel=1e-9)
    # Fig 4's 100-byte path: allocate a receive buffer, copy 100 bytes instead of 40.
    extra = p.rx_buffer_alloc_us + p.copy_us_per_100_bytes - p.small_copy_us
    assert busy[100] == pytest.approx(busy[40] + extra, rel=1e-9)
    # Paper 003 §4.4.1: the small-message path saves about 15% by not allocating a buffer.
    saved = p.rx_buffer_alloc_us / (p.rx_handler_small_us + p.rx_buffer_alloc_us)
    assert saved == pytest.approx(0.15, abs=0.01)


# ----------------------------------------------------------------------------- round trips


def test_round_trip_of_40_bytes_on_each_interconnect() -> None:
    # Paper 003 §4.4.2: "ranges from 57µsec (hub) to 91µsec (FN100)".
    hub = _rtts("hub", [40])[40]
    bay = _rtts("bay28115", [40])[40]
    fn100 = _rtts("fn100", [40])[40]
    assert hub == pytest.approx(57.0, rel=0.05)
    assert fn100 == pytest.approx(91.0, rel=0.05)
    assert hub < bay < fn100


def test_round_trip_grows_about_25_us_per_100_bytes() -> None:
    rtts = _rtts("hub", [100, 1000, 1497])
    assert (rtts[1000] - rtts[100]) / 9 == pytest.approx(25.0, rel=0.10)
    assert (rtts[1497] - rtts[100]) / 13.97 == pytest.approx(25.0, rel=0.10)


def test_small_message_threshold_shows_as_a_step_at_64_bytes() -> None:
    # Paper 003 §4.4.2: the U-Net/FE curves bend "in the neighborhood of 64 bytes, which is the
    # threshold for the small-message optimization" (under 64 bytes inline, §4.3.3).
    rtts = _rtts("hub", [61, 62, 63, 64, 65])
    per_byte = rtts[63] - rtts[62]
    step = rtts[64] - rtts[63]
    assert 0 < per_byte < 0.5
    assert rtts[62] - rtts[61] == pytest.approx(per_byte, rel=1e-6)
    # From 64 bytes on the copy also grows with size (1.42 us per 100 bytes, each way).
    assert rtts[65] - rtts[64] == pytest.approx(per_byte + 2 * 0.0142, rel=1e-6)
    assert step > 1.5
    assert step > 5 * per_byte


def test_inline_below_64_bytes_buffers_from_64() -> None:
    sim, _, eps, ch = _cluster()
    kinds: dict[int, RecvKind] = {}

    async def main() -> None:
        for size in (0, 40, 63, 64, 1000):
            await eps["a"].send(ch, bytes([7]) * size)
            descriptor = await eps["b"].recv_descriptor()
            assert eps["b"].read(descriptor) == bytes([7]) * size
            kinds[size] = descriptor.kind
            eps["b"].release(descriptor)

    sim.run(main)
    assert kinds == {
        0: RecvKind.INLINE,
        40: RecvKind.INLINE,
        63: RecvKind.INLINE,
        64: RecvKind.BUFFERS,
        1000: RecvKind.BUFFERS,
    }


# ----------------------------------------------------------------------------- limits


def test_largest_message_is_1497_bytes() -> None:
    sim, cluster, eps, ch = _cluster()
    a = eps["a"]
    carried: list[int] = []
    payload = bytes(i & 0xFF for i in range(1497))

    async def main() -> None:
        await a.send(ch, payload)
        assert (await eps["b"].recv()).data == payload
        carried.append(cluster.fabric.statistics().carried)
        # The message-level API refuses 1498 bytes outright ...
        with pytest.raises(UNetError):
            a.send_nowait(ch, bytes(1498))
        # ... and the NI rejects a descriptor naming 1498 bytes, sending nothing.
        a.segment.view[a.app_area : a.app_area + 1498] = bytes(1498)
        descriptor = SendDescriptor(ch, fragments=(Fragment(a.app_area, 1498),))
        a.post_nowait(descriptor)
        await trio.sleep(1e-3)
        assert descriptor.status is DescriptorStatus.ERROR
        assert descriptor.error is SendError.TOO_LONG
        carried.append(cluster.fabric.statistics().carried)

    sim.run(main)
    assert carried == [1, 1]
    assert cluster.nodes["a"].ni.statistics().send_errors == {"TOO_LONG": 1}
    assert a.statistics().send_errors == {"TOO_LONG": 1}
    assert cluster.nodes["a"].ni.max_message == 1497
    # 1497 bytes + the 17-byte header is the largest Ethernet frame (1514 bytes + FCS).
    assert EthernetLink().shape(1497).wire_bytes - 20 == 1518


def test_one_channel_per_remote_host_per_endpoint() -> None:
    # Paper 001 §3.1: an endpoint is named by a MAC address and a one-byte U-Net port, and a
    # frame carries only the source MAC and the destination port.  The receiving kernel can
    # therefore tell apart messages for different local endpoints, but not messages from two
    # endpoints of the same remote host to the same local endpoint: one local endpoint can
    # hold only one channel per remote host, so a second channel from it to another endpoint
    # on that host must be refused.
    sim = Simulation()
    cluster = build_fe(sim, FastEthernetParams(), ["a", "b"], None)
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    owner_a, owner_b = a.os.process("x"), b.os.process("y")
    ea = a.os.create_endpoint(owner_a, port=1)
    eb1 = b.os.create_endpoint(owner_b, port=1)
    eb2 = b.os.create_endpoint(owner_b, port=2)
    connect(ea, eb1)
    with pytest.raises(ChannelError):
        a.os.create_channel(owner_a, ea, eb2.address)
    assert len(ea.channels) == 1
    # Another endpoint on a may talk to eb2, and eb2 to it.
    ea2 = a.os.create_endpoint(owner_a, port=2)
    connect(ea2, eb2)
    # Once ea's channel to b is gone, ea may open one to eb2 instead.
    (channel,) = ea.channels
    a.os.destroy_channel(owner_a, ea, channel)
    a.os.create_channel(owner_a, ea, eb2.address)


# ----------------------------------------------------------------------------- bandwidth


def test_bandwidth_at_1kb_approaches_97_mbit_s() -> None:
    # Paper 001 §3.4, paper 003 §4.4.2: "For messages as small as 1Kbyte the bandwidth
    # approaches the peak of about 97Mbps (taking into account Ethernet frame overhead)".
    recipe = parse_recipe(
        {
            "run": {"clock": "virtual"},
            "transport": {"kind": "sim-fe"},
            "workload": {
                "kind": "bandwidth",
                "sizes": [1024],
                "messages": 100,
                "warmup": 2,
                "modes": ["unidirectional"],
            },
        },
        "test",
    )
    (row,) = run_recipe(recipe).rows
    mbit_s: Any = row["mbit_s"]
    assert row["lost"] == 0
    assert mbit_s == pytest.approx(97.0, rel=0.03)
    assert mbit_s <= EthernetLink().payload_limit_bps(1024) / 1e6


# ----------------------------------------------------------------------------- parameters


def test_every_number_is_cited() -> None:
    params = Dc21140Params()
    cited = {c.name: c for c in citations(params)}
    numbers = [
        field.name
        for field in attrs.fields(Dc21140Params)
        if isinstance(getattr(params, field.name), int | float)
        and not isinstance(getattr(params, field.name), bool)
    ]
    assert "send_trap_us" in numbers and "inline_threshold" in numbers
    assert [n for n in numbers if n not in cited] == []
    assert all(cited[n].cite.strip() for n in numbers)


def test_overrides_reach_the_model_and_unknown_ones_are_rejected() -> None:
    sim = Simulation()
    params = FastEthernetParams(overrides={"send_trap_us": 10.0})
    cluster = build_fe(sim, params, ["a", "b"], None)
    ni = cluster.nodes["a"].ni
    assert isinstance(ni, Dc21140NI) and ni.params.send_trap_us == 10.0
    with pytest.raises(ConfigError, match=r"overrides\.tx_cell_us"):
        build_fe(Simulation(), FastEthernetParams(overrides={"tx_cell_us": 1.0}), ["a"], None)
