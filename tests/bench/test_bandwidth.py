"""The bandwidth workload recovers known rates from synthetic stacks (paper 004 §4.2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from stacklib.bench import Session
from stacklib.bench.bandwidth import CONTROL_SIZE, BandwidthParams, run_bandwidth
from stacklib.bench.result import Cell, Result
from stacklib.config import structure
from stacklib.errors import ConfigError
from stacklib.services import UNetService
from stacklib.sim import Cost, CostProfile, RealWorld, Simulation, World
from stacklib.transports.memory import MemoryNetwork
from stacklib.unet import EndpointConfig, connect

US = 1e-6


def profile(
    send_us: float, recv_us: float, send_per_byte_us: float = 0.0, recv_per_byte_us: float = 0.0
) -> CostProfile:
    """A host whose U-Net send and receive cost exactly this much CPU time."""
    return CostProfile(
        "synthetic",
        {
            "unet.send": Cost("cpu", send_us, send_per_byte_us),
            "unet.recv": Cost("cpu", recv_us, recv_per_byte_us),
        },
    )


def make_session(
    world: World,
    *,
    latency_us: float = 0.0,
    costs: CostProfile | None = None,
    config: EndpointConfig | None = None,
) -> Session:
    """Two nodes of a memory network, raw U-Net on each, as recipes build them."""
    network = MemoryNetwork(world, latency=latency_us * US)
    nodes = [network.add_node(f"node{i}", costs) for i in range(2)]
    endpoints = [n.os.create_endpoint(n.os.process(f"app{i}"), config) for i, n in enumerate(nodes)]
    a, b = connect(endpoints[0], endpoints[1])
    return Session(world, network, [UNetService(ep) for ep in endpoints], [{1: a}, {0: b}])


def simulate(
    params: BandwidthParams,
    *,
    seed: int = 1,
    latency_us: float = 0.0,
    costs: CostProfile | None = None,
) -> Result:
    sim = Simulation(seed=seed)
    session = make_session(sim, latency_us=latency_us, costs=costs)
    return sim.run(run_bandwidth, session, params)


def rows_of(result: Result, mode: str) -> dict[int, Mapping[str, Cell]]:
    return {int(row["size"]): row for row in result.rows if row["mode"] == mode}  # type: ignore[arg-type]


def number(row: Mapping[str, Cell], key: str) -> float:
    value = row[key]
    assert isinstance(value, int | float), f"{key} is {value!r}"
    return float(value)


SIZES = (100, 1000, 4000)
N = 400
# Host costs in us: send 2 + 0.01/byte, receive 1 + 0.005/byte; 10 us on the wire.
SEND = (2.0, 0.01)
RECV = (1.0, 0.005)
LATENCY = 10.0


def send_us(size: int) -> float:
    return SEND[0] + SEND[1] * size


def recv_us(size: int) -> float:
    return RECV[0] + RECV[1] * size


PER_BYTE = profile(SEND[0], RECV[0], SEND[1], RECV[1])


def test_unidirectional_gives_the_rate_of_the_per_byte_send_cost() -> None:
    result = simulate(
        BandwidthParams(sizes=SIZES, messages=N, modes=("unidirectional",)),
        latency_us=LATENCY,
        costs=PER_BYTE,
    )
    for size, row in rows_of(result, "unidirectional").items():
        # The sender is the bottleneck: one message per send cost; 1 byte/us is 1 MB/s.
        assert number(row, "sender_mb_s") == pytest.approx(size / send_us(size), rel=1e-9)
        # Delivered: the last message also crosses the wire and is received; the reply's
        # one-way time (a small message, measured by probes) is subtracted exactly.
        elapsed = N * send_us(size) + LATENCY + recv_us(size)
        assert number(row, "mb_s") == pytest.approx(N * size / elapsed, rel=1e-9)
        assert number(row, "mb_s") == pytest.approx(size / send_us(size), rel=0.02)
        assert number(row, "mbit_s") == pytest.approx(8 * number(row, "mb_s"))
        assert number(row, "msgs_s") == pytest.approx(number(row, "mb_s") * 1e6 / size)
        assert (row["sent"], row["received"], row["lost"]) == (N, N, 0)
    small = CONTROL_SIZE
    assert result.facts["one_way_small_us"] == pytest.approx(
        send_us(small) + LATENCY + recv_us(small)
    )


def test_pingpong_bandwidth_is_size_over_half_the_round_trip() -> None:
    result = simulate(
        BandwidthParams(sizes=SIZES, messages=N, modes=("pingpong",)),
        latency_us=LATENCY,
        costs=PER_BYTE,
    )
    for size, row in rows_of(result, "pingpong").items():
        half_rtt = send_us(size) + LATENCY + recv_us(size)
        assert number(row, "mb_s") == pytest.approx(size / half_rtt, rel=1e-9)
        assert number(row, "msgs_s") == pytest.approx(1e6 / half_rtt, rel=1e-9)
        assert row["lost"] == 0


def test_simultaneous_with_window_1_alternates_send_and_receive_on_each_node() -> None:
    # Paper 004 Fig 9(c): each node loops "SendMsg(); RecvMsg()", so both directions carry
    # one message per one-way time: twice the ping-pong bandwidth.
    result = simulate(
        BandwidthParams(sizes=SIZES, messages=N, modes=("simultaneous",), window=1),
        latency_us=LATENCY,
        costs=PER_BYTE,
    )
    for size, row in rows_of(result, "simultaneous").items():
        half_rtt = send_us(size) + LATENCY + recv_us(size)
        assert number(row, "mb_s") == pytest.approx(2 * size / half_rtt, rel=0.02)
        assert (row["sent"], row["received"], row["lost"]) == (2 * N, 2 * N, 0)


def test_simultaneous_streams_are_bounded_by_each_cpu_sending_and_receiving() -> None:
    result = simulate(
        BandwidthParams(sizes=SIZES, messages=N, modes=("simultaneous",), window=0),
        latency_us=LATENCY,
        costs=PER_BYTE,
    )
    for size, row in rows_of(result, "simultaneous").items():
        # Each host's CPU sends one message and receives one per round: aggregate 2 messages.
        expected = 2 * size / (send_us(size) + recv_us(size))
        assert number(row, "mb_s") == pytest.approx(expected, rel=0.02)
        assert (row["sent"], row["received"], row["lost"]) == (2 * N, 2 * N, 0)


@pytest.mark.parametrize("window", [0, 1])
def test_losses_are_counted_and_the_run_ends(window: int) -> None:
    # Receiving costs ten times sending and raw U-Net does no flow control: the receiver's
    # buffers overflow and the NI drops (paper 000 §3.1).
    params = BandwidthParams(sizes=(1000,), messages=300, warmup=0, window=window)
    result = simulate(params, latency_us=LATENCY, costs=profile(1.0, 10.0))
    uni = rows_of(result, "unidirectional")[1000]
    assert 0 < number(uni, "received") < 300
    assert number(uni, "lost") == 300 - number(uni, "received")
    # What arrived was consumed at the receiver's pace, not the timeout's.
    assert number(uni, "mb_s") == pytest.approx(1000 / 10.0, rel=0.05)
    assert number(uni, "sender_mb_s") == pytest.approx(1000 / 1.0)
    assert result.facts["messages_lost"] == sum(number(r, "lost") for r in result.rows)
    assert all(number(row, "mb_s") > 0 for row in result.rows)


def test_same_seed_gives_identical_rows() -> None:
    params = BandwidthParams(sizes=(64, 1000), messages=100)
    first = simulate(params, seed=5, latency_us=LATENCY, costs=PER_BYTE)
    second = simulate(params, seed=5, latency_us=LATENCY, costs=PER_BYTE)
    assert first.rows == second.rows


@pytest.mark.parametrize("window", [0, 1])
async def test_all_modes_run_in_real_time_over_the_memory_transport(window: int) -> None:
    session = make_session(RealWorld())
    # Raw U-Net may drop here too (nothing paces the sender): a short timeout keeps that cheap.
    params = BandwidthParams(
        sizes=(0, 64, 1500), messages=50, warmup=2, window=window, timeout=0.05
    )
    result = await run_bandwidth(session, params)
    assert [(row["mode"], row["size"]) for row in result.rows] == [
        (mode, size)
        for mode in ("unidirectional", "pingpong", "simultaneous")
        for size in params.sizes
    ]
    for row in result.rows:
        assert number(row, "received") > 0
        assert number(row, "lost") == number(row, "sent") - number(row, "received") >= 0
        if row["size"]:
            assert number(row, "mb_s") > 0 and number(row, "msgs_s") > 0


async def test_a_size_beyond_the_stack_maximum_is_refused() -> None:
    session = make_session(RealWorld())
    with pytest.raises(ValueError, match="exceeds the stack's maximum"):
        await run_bandwidth(session, BandwidthParams(sizes=(10**6,)))


def test_params_load_strictly_from_recipe_tables() -> None:
    params = structure(
        BandwidthParams, {"sizes": [4, 40], "modes": ["pingpong"], "timeout": 1}, "x.toml"
    )
    assert params == BandwidthParams(sizes=(4, 40), modes=("pingpong",), timeout=1.0)
    with pytest.raises(ConfigError, match="must be one of"):
        structure(BandwidthParams, {"modes": ["sideways"]}, "x.toml", "workload")
    bad_tables: list[dict[str, object]] = [{"sizes": []}, {"messages": 0}, {"timeout": 0}]
    for bad in bad_tables:
        with pytest.raises(ConfigError):
            structure(BandwidthParams, bad, "x.toml", "workload")


def test_stale_data_of_an_abandoned_run_is_ignored() -> None:
    """A ping-pong reply that arrives after its timeout does not count for the next run."""

    async def main(sim: Simulation) -> Sequence[Mapping[str, Cell]]:
        # 2 ms on the wire against a 1 ms timeout: every echo is late.
        session = make_session(sim, latency_us=2000.0)
        params = BandwidthParams(
            sizes=(8, 16), messages=3, warmup=0, modes=("pingpong",), timeout=0.005
        )
        result = await run_bandwidth(session, params)
        return result.rows

    sim = Simulation(seed=1)
    rows = sim.run(main, sim)
    assert [(row["sent"], row["received"]) for row in rows] == [(3, 3), (3, 3)]
    late = Simulation(seed=1)

    async def too_slow(sim: Simulation) -> Sequence[Mapping[str, Cell]]:
        session = make_session(sim, latency_us=2000.0)
        params = BandwidthParams(
            sizes=(8, 16), messages=3, warmup=0, modes=("pingpong",), timeout=0.0035, retries=5
        )
        return (await run_bandwidth(session, params)).rows

    rows = late.run(too_slow, late)
    assert [(row["sent"], row["received"], row["lost"]) for row in rows] == [(1, 0, 1), (1, 0, 1)]


def lossy_rate(seed: int, timeout: float) -> tuple[float, int, Result]:
    """Raw U-Net bandwidth of 40-byte messages on the lossy SBA-200 recipe."""
    import attrs

    from stacklib.recipes import load_recipe, run_recipe

    recipe = load_recipe("unet-atm-lossy")
    params = attrs.evolve(recipe.workload_params, sizes=(40,), timeout=timeout)
    result = run_recipe(attrs.evolve(recipe, workload_params=params), seed=seed)
    (row,) = result.rows
    return number(row, "mb_s"), int(number(row, "lost")), result


def test_loss_does_not_put_the_timeout_into_the_figure() -> None:
    """Every seed measures the same link: 1% cell loss costs the lost messages, not a wait.
    Seed 13 loses the follower's first count reply; its resend must not be timed either."""
    rates = {}
    for seed in range(1, 16):
        rate, lost, result = lossy_rate(seed, 1.0)
        assert 0 < lost < 50
        assert result.facts["messages_lost"] == lost
        rates[seed] = rate
    median = sorted(rates.values())[7]
    # Seeds differ only in which messages are lost: within 2% of one another.
    assert all(abs(rate - median) <= 0.02 * median for rate in rates.values()), rates
    assert 4.5 < median < 5.5  # one 40-byte message every 8 us or so


def test_the_figure_does_not_depend_on_the_timeout() -> None:
    for seed in (1, 13):
        slow, _, _ = lossy_rate(seed, 1.0)
        fast, _, result = lossy_rate(seed, 0.05)
        assert fast == pytest.approx(slow, rel=1e-9)
        assert result.facts["timeout_s"] == 0.05  # reported beside the figure
