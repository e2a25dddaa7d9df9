"""stacklib.testing and stacklib.sansio: the sans-IO contract, the scripted faulty link between
two machines, the faulty datagram service under a layer, the format conformance suite and the
two-node helper."""

from __future__ import annotations

import re
from collections import deque
from pathlib import Path

import pytest
import trio

from stacklib.errors import FormatError
from stacklib.layers.arq import ArqLayer, ArqMachine, ArqParams, ArqService
from stacklib.layers.uam import UamMachine
from stacklib.sansio import Machine
from stacklib.services import DatagramService, Service, UNetService
from stacklib.sim import Simulation
from stacklib.testing import (
    FaultLayer,
    FaultParams,
    Faults,
    FaultyService,
    Link,
    check_format,
    invert_first_byte,
    run_virtual,
    two_nodes,
)
from stacklib.wire.registry import FormatInfo

# --- the sans-IO contract ---------------------------------------------------------------------


class Toy:
    """The smallest machine: sends what it is told to, reports what it receives as events."""

    def __init__(self) -> None:
        self.outbox: list[bytes] = []
        self.inbox: deque[bytes] = deque()
        self.timer: float | None = None
        self.fired: list[float] = []

    def say(self, data: bytes, now: float) -> None:
        self.outbox.append(data)

    def receive(self, datagram: bytes | bytearray | memoryview, now: float) -> None:
        self.inbox.append(bytes(datagram))

    def datagrams_to_send(self, now: float) -> list[bytes]:
        out, self.outbox = self.outbox, []
        return out

    def get_timer(self) -> float | None:
        return self.timer

    def handle_timer(self, now: float) -> None:
        if self.timer is not None and now >= self.timer:
            self.timer = None
            self.fired.append(now)

    def next_event(self) -> bytes | None:
        return self.inbox.popleft() if self.inbox else None


def test_machines_keep_the_sans_io_contract() -> None:
    machines: list[Machine[object]] = [ArqMachine(), UamMachine(), Toy()]  # mypy: signatures
    for machine in machines:
        assert isinstance(machine, Machine)

    class NoEvents:
        def receive(self, datagram: bytes, now: float) -> None: ...
        def datagrams_to_send(self, now: float) -> list[bytes]: ...
        def get_timer(self) -> float | None: ...
        def handle_timer(self, now: float) -> None: ...

    assert not isinstance(NoEvents(), Machine)


# --- faults -----------------------------------------------------------------------------------


def test_a_script_names_datagrams_by_number() -> None:
    faults = Faults(script={2: "drop", 3: "dup", 5: "late:0.5"})
    assert [faults.next() for _ in range(6)] == [None, "drop", "duplicate", None, "late:0.5", None]


@pytest.mark.parametrize("fault", ["lost", "late:", "late:x", "late:-1", ""])
def test_an_unknown_fault_is_refused_by_name(fault: str) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        Faults(script={1: fault})


def test_rates_are_probabilities_that_add_up_to_at_most_one() -> None:
    with pytest.raises(ValueError, match="drop"):
        Faults(drop=1.5)
    with pytest.raises(ValueError, match="add up"):
        Faults(drop=0.6, duplicate=0.6)


def test_random_faults_are_seeded_and_a_script_does_not_shift_them() -> None:
    def draw(script: dict[int, str]) -> list[str | None]:
        faults = Faults(script=script, drop=0.2, duplicate=0.1, reorder=0.1, corrupt=0.1, seed=4)
        return [faults.next() for _ in range(200)]

    plain = draw({})
    assert plain == draw({})
    assert {"drop", "duplicate", "reorder", "corrupt", None} == set(plain)
    scripted = draw({7: "drop"})
    assert scripted[6] == "drop"
    assert scripted[:6] + scripted[7:] == plain[:6] + plain[7:]


# --- the link between two machines ------------------------------------------------------------


def say(link: Link[Toy], side: str, *words: bytes) -> None:
    for word in words:
        link.input(side, lambda machine, now, word=word: machine.say(word, now))


def heard(link: Link[Toy], side: str) -> list[tuple[float, object]]:
    return link.events[side]


def test_the_link_delivers_after_the_delay_and_applies_each_fault() -> None:
    script = {2: "drop", 3: "dup", 4: "reorder", 6: "corrupt", 7: "late:0.5"}
    link = Link(Toy(), Toy(), delay=0.1, faults=script)
    say(link, "a", b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8")
    link.run(until=10.0)
    got = heard(link, "b")
    assert [data for _, data in got] == [b"1", b"3", b"3", b"5", b"4", b"\xc9", b"8", b"7"]
    assert {when for when, _ in got[:-1]} == {0.1}
    assert got[-1][0] == pytest.approx(0.6)
    assert [(s.number, s.source, s.fault) for s in link.sent][1:3] == [
        (2, "a", "drop"),
        (3, "a", "duplicate"),
    ]
    assert dict(link.faults.counts) == {
        "drop": 1,
        "duplicate": 1,
        "reorder": 1,
        "corrupt": 1,
        "late": 1,
    }
    assert heard(link, "a") == []


def test_the_link_runs_timers_in_time_order_and_silences_a_side() -> None:
    a, b = Toy(), Toy()
    link = Link(a, b, delay=0.1, silent="b")
    a.timer, b.timer = 2.0, 1.0
    say(link, "b", b"lost")
    say(link, "a", b"kept")
    link.run(until=1.5)
    assert (b.fired, a.fired, link.now) == ([1.0], [], 1.5)
    link.run(until=3.0)
    assert a.fired == [2.0]
    assert [data for _, data in heard(link, "b")] == [b"kept"]
    assert heard(link, "a") == []
    assert [s.fault for s in link.sent] == ["drop", None]


def test_the_link_drops_the_third_datagram_of_an_arq_exchange() -> None:
    link = Link(ArqMachine(rto=1.0), ArqMachine(rto=1.0), delay=0.01, faults={3: "drop"})
    for word in (b"x", b"y"):
        link.input("a", lambda machine, now, word=word: machine.send(word, now))
    link.run(until=10.0)
    assert [e.data for _, e in link.events["b"]] == [b"x", b"y"]  # type: ignore[attr-defined]
    retransmitted = [s.time for s in link.from_side("a")][1:]
    assert retransmitted == pytest.approx([0.02, 1.02])  # DATA1, lost, then after one rto


def test_link_misuse_is_named() -> None:
    with pytest.raises(ValueError, match="delay"):
        Link(Toy(), Toy(), delay=-1.0)
    with pytest.raises(ValueError, match="silent"):
        Link(Toy(), Toy(), delay=0.0, silent="c")
    with pytest.raises(ValueError, match="side"):
        Link(Toy(), Toy(), delay=0.0).machine("c")


def test_the_default_corruption_inverts_the_first_byte() -> None:
    assert invert_first_byte(b"\x01\x02") == b"\xfe\x02"
    assert invert_first_byte(b"") == b""


# --- the faulty service under a layer ---------------------------------------------------------


def test_the_faulty_layer_applies_the_script_to_what_is_sent() -> None:
    got: list[bytes] = []
    script = {2: "drop", 3: "dup", 4: "reorder", 6: "corrupt", 7: "late:0.001"}

    async def main(sim: Simulation) -> None:
        async with two_nodes(sim, [FaultLayer(FaultParams(script=script))]) as (a, b):
            assert isinstance(a.service, FaultyService)
            assert isinstance(b.service, FaultyService)
            assert a.service.capability(object) is None  # it lends no endpoint
            for word in (b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8"):
                await a.service.send(a.peer, word)
            got.extend([(await b.service.recv())[1] for _ in range(8)])
            assert a.service.statistics()["sent"] == 8

    run_virtual(main)
    assert got == [b"1", b"3", b"3", b"5", b"4", b"\xc9", b"8", b"7"]


def test_two_nodes_wraps_the_bottom_services() -> None:
    seen: list[object] = []

    def wrap(index: int, bottom: Service) -> Service:
        assert isinstance(bottom, UNetService)
        return FaultyService(bottom, Faults(script={1: "drop"})) if index == 0 else bottom

    async def main(sim: Simulation) -> None:
        async with two_nodes(sim, wrap=wrap) as (a, b):
            assert isinstance(a.service, FaultyService) and a.bottom is a.service
            assert isinstance(b.service, UNetService)
            for word in (b"lost", b"kept"):
                await a.service.send(a.peer, word)
            seen.append(await b.service.recv())
            seen.append(b.peer)

    run_virtual(main)
    assert seen == [(seen[1], b"kept"), seen[1]]


async def test_a_late_fault_without_a_nursery_says_what_it_needs() -> None:
    class Sink(DatagramService):
        peers = (1,)
        max_message = 100

        async def send(self, peer: int, data: bytes | bytearray | memoryview) -> None:
            raise AssertionError("nothing may be sent")

        async def recv(self) -> tuple[int, bytes]:
            raise trio.EndOfChannel

    service = FaultyService(Sink(), Faults(script={1: "late:1"}))
    with pytest.raises(RuntimeError, match="nursery"):
        await service.send(1, b"x")


# --- two nodes --------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["memory", "sim-atm"])
def test_two_nodes_run_arq_over_a_lossy_layer_in_virtual_time(transport: str) -> None:
    seen: dict[str, object] = {}
    faults = FaultLayer(FaultParams(drop=0.2, duplicate=0.05, reorder=0.05, seed=3))

    async def main(sim: Simulation) -> None:
        layers = [faults, ArqLayer(ArqParams(rto_us=500.0, max_retries=12))]
        async with two_nodes(sim, layers, transport=transport) as (a, b):
            assert isinstance(a.service, ArqService) and isinstance(b.service, ArqService)
            assert a.endpoint is not None and a.node.name == "a"
            for i in range(50):
                await a.service.send(a.peer, bytes([i]))
            seen["got"] = [(await b.service.recv())[1] for _ in range(50)]
            seen["retransmitted"] = a.service.peer_statistics(a.peer).retransmitted

    run_virtual(main)
    assert seen["got"] == [bytes([i]) for i in range(50)]
    assert isinstance(seen["retransmitted"], int) and seen["retransmitted"] > 0
    assert [service.faults.counts["drop"] > 0 for service in faults.opened] == [True, True]


def test_run_virtual_turns_a_hang_into_a_failure() -> None:
    async def main(sim: Simulation) -> None:
        await trio.sleep_forever()

    with pytest.raises(trio.TooSlowError):
        run_virtual(main, timeout=1.0)


# --- the format conformance suite -------------------------------------------------------------


class ToyError(FormatError):
    pass


def toy_strategy() -> object:
    from hypothesis import strategies as st

    return st.integers(0, 0xFFFF)


def toy_parse(data: bytes) -> int:
    if len(data) != 2:
        raise ToyError(f"{len(data)} bytes")
    return int.from_bytes(data, "big")


def toy(**fields: object) -> FormatInfo:
    options: dict[str, object] = {
        "name": "toy",
        "parse": toy_parse,
        "describe": lambda value: [],
        "summary": "two bytes",
        "build": lambda value: value.to_bytes(2, "big"),
        "strategy": toy_strategy,
        "error": ToyError,
    }
    options.update(fields)
    return FormatInfo(**options)  # type: ignore[arg-type]


def test_a_conforming_format_passes() -> None:
    check_format(toy(), max_examples=20)


def test_a_parser_that_lets_another_error_escape_fails_the_suite() -> None:
    def leaky(data: bytes) -> int:
        return data[0] << 8 | data[1]  # IndexError on short input

    with pytest.raises(AssertionError, match="IndexError"):
        check_format(toy(parse=leaky), max_examples=20)


def test_a_build_that_does_not_round_trip_fails_the_suite() -> None:
    with pytest.raises(AssertionError, match="parsed"):
        check_format(toy(build=lambda value: (value ^ 1).to_bytes(2, "big")), max_examples=20)


def test_a_format_without_its_conformance_fields_is_refused() -> None:
    with pytest.raises(ValueError, match="strategy, error"):
        check_format(toy(strategy=None, error=None))
    with pytest.raises(KeyError, match="no format named 'nope'"):
        check_format("nope")


# --- docs/testing.md stays true ---------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "testing.md"


def test_the_guide_examples_run_and_its_excerpts_are_in_the_tests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = GUIDE.read_text()
    examples = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(examples) == 2
    for example in examples:
        exec(compile(example, str(GUIDE), "exec"), {"__name__": "__main__"})
    assert "ms:" in capsys.readouterr().out
    sources = (REPO / "tests" / "wire" / "test_conformance.py").read_text()
    for excerpt in re.findall(r"```py\n(.*?)```", text, flags=re.DOTALL):
        for line in excerpt.splitlines():
            assert line.strip() in sources, line
