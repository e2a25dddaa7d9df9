"""GAM's Active Messages as an ActiveMessageService: words, replies, stores, gets, the polling
face, errors, and Split-C directly over GAM on 2 and 4 nodes."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio

from stacklib.errors import AssemblyError, LocalProtocolError, RemoteProtocolError
from stacklib.layers.arq import ArqLayer
from stacklib.layers.splitc import SplitcLayer
from stacklib.layers.uam import UamLayer
from stacklib.recipes import parse_recipe, run_recipe
from stacklib.services import ActiveMessageService, DatagramService
from stacklib.stack import check_fit, open_stack
from stacklib.transports.sim.lanai4 import Lanai4Cluster
from stacklib.transports.sim.myrinet_libs import Gam, GamActiveMessages, GamParams
from tests.transports.myrinet_libs.conftest import simulate

REPO_RECIPES = Path(__file__).resolve().parents[3] / "stacklib" / "recipes"


def _pair(cluster: Lanai4Cluster, params: GamParams | None = None) -> list[GamActiveMessages]:
    return GamActiveMessages.open(cluster, params)


def test_it_is_an_active_message_service_lending_its_gam() -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        a, _ = _pair(cluster)
        assert isinstance(a, ActiveMessageService)
        assert isinstance(a.capability(Gam), Gam)
        assert a.capability(Lanai4Cluster) is None
        assert list(a.peers) == [1]

    simulate(body)


def test_a_request_runs_its_handler_and_the_reply_runs_at_the_requester() -> None:
    async def body(cluster: Lanai4Cluster) -> list[tuple[int, ...]]:
        a, b = _pair(cluster)
        got: list[tuple[int, ...]] = []
        # The same table on every node: indices travel, names resolve locally.
        b.register_handler(lambda peer, x, y: b.reply("answer", x + y, 0xFFFFFFFF), name="add")
        b.register_handler(lambda peer, *words: None, name="answer")
        a.register_handler(lambda peer, x, y: None, name="add")
        a.register_handler(lambda peer, *words: got.append((peer, *words)), name="answer")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.wait_until, lambda: False)  # b serves until cancelled
            await a.request(1, "add", 2, 3)
            await a.wait_until(lambda: bool(got))
            await a.drain(1)
            nursery.cancel_scope.cancel()
        return got

    assert simulate(body) == [(1, 5, 0xFFFFFFFF)]


def test_stores_of_any_size_land_whole_and_run_the_handler_once() -> None:
    size = 300_000  # three GAM bulk requests
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)

    async def body(cluster: Lanai4Cluster) -> tuple[bytes, list[tuple[int, ...]]]:
        a, b = _pair(cluster)
        target = bytearray(size + 16)
        runs: list[tuple[int, ...]] = []
        for node in (a, b):
            node.register_handler(lambda *args: runs.append(args), name="stored")
        a.register_region(bytearray(1), name="mine")
        b.register_region(bytearray(1), name="mine")
        b.register_region(target, name="target")
        a.register_region(bytearray(size + 16), name="target")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.wait_until, lambda: bool(runs))
            await a.store(1, payload, ("target", 8), "stored", 7)
            await a.drain(1)
        return bytes(target[8 : 8 + size]), runs

    data, runs = simulate(body)
    assert data == payload
    assert runs == [(0, 1, 8, size, 7)]  # peer, region id, offset, nbytes, words


def test_gets_are_served_at_the_targets_next_wait_and_refused_outside_its_regions() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[bytes, list[tuple[int, ...]], str]:
        a, b = _pair(cluster)
        source = bytearray(b"0123456789" * 20_000)
        local = bytearray(len(source))
        done: list[tuple[int, ...]] = []
        for node in (a, b):
            node.register_handler(lambda *args: done.append(args), name="got")
        a.register_region(local, name="data")
        b.register_region(source, name="data")
        refused = ""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.wait_until, lambda: False)
            await a.get(1, ("data", 0), len(source), ("data", 0), "got", 42)
            await a.wait_until(lambda: bool(done))
            await a.get(1, ("data", len(source) - 4), 8, ("data", 0), "got")
            try:
                await a.wait_until(lambda: False)
            except RemoteProtocolError as error:
                refused = str(error)
            nursery.cancel_scope.cancel()
        return bytes(local), done, refused

    local, done, refused = simulate(body)
    assert local == b"0123456789" * 20_000
    assert done == [(1, 0, 0, 200_000, 42)]
    assert "refused get" in refused


def test_the_polling_face_runs_handlers_and_would_block_without_tokens() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[int, int, list[int], bool]:
        a, b = _pair(cluster, GamParams(tokens=2))
        seen: list[int] = []
        for node in (a, b):
            node.register_handler(lambda peer, n: seen.append(n), name="count")
        a.request_nowait(1, "count", 1)
        a.request_nowait(1, "count", 2)
        blocked = False
        try:
            a.request_nowait(1, "count", 3)  # both tokens out, no reply yet
        except trio.WouldBlock:
            blocked = True
        await trio.sleep(100e-6)  # both requests land at b
        ran = b.poll()  # synchronous: handlers now, replies when the CPU has made them
        await trio.sleep(100e-6)
        replies = a.poll()
        a.request_nowait(1, "count", 3)  # the replies brought the tokens back
        return ran, replies, seen, blocked

    ran, replies, seen, blocked = simulate(body)
    assert blocked and ran == 2 and replies == 2 and seen == [1, 2]


def test_a_handlers_error_is_raised_by_the_next_poll_after_gam_replied() -> None:
    async def body(cluster: Lanai4Cluster) -> tuple[str, int]:
        a, b = _pair(cluster)

        def broken(peer: int) -> None:
            raise ValueError("handler bug")

        for node in (a, b):
            node.register_handler(broken, name="broken")
        await a.request(1, "broken")
        await trio.sleep(100e-6)
        message = ""
        try:
            b.poll()
        except ValueError as error:
            message = str(error)
        await a.drain(1)  # the library's reply still came back
        return message, a.gam.outstanding(1)

    assert simulate(body) == ("handler bug", 0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda am: am.reply("x"), "only from a request handler"),
        (lambda am: am.request_nowait(1, "x", 1, 2, 3, 4, 5), "at most 4 words"),
        (lambda am: am.request_nowait(1, "x", 1 << 32), "not a 32-bit word"),
        (lambda am: am.request_nowait(1, "nobody"), "no handler named 'nobody'"),
        (lambda am: am.register_handler(print, index=256), "not in 0..255"),
        (lambda am: am.register_region(b"read-only"), "must be writable"),
    ],
)
def test_misuse_raises_an_error_naming_the_problem(call: Any, message: str) -> None:
    async def body(cluster: Lanai4Cluster) -> None:
        a, _ = _pair(cluster)
        a.register_handler(print, name="x")
        with pytest.raises(LocalProtocolError, match=message):
            call(a)

    simulate(body)


def test_splitc_is_refused_over_a_reliable_service_that_is_not_active_messages() -> None:
    async def body(cluster: Lanai4Cluster) -> str:
        (gam, _) = Gam.open(cluster)
        try:
            async with open_stack(gam, [ArqLayer(), SplitcLayer(channels={1: 1})]):
                pass
        except AssemblyError as error:
            return str(error)
        return ""

    # Refused at assembly, before anything opens: check_fit sees the declared services.
    message = simulate(body)
    assert "layer 'splitc' (position 1) requires an 'active-messages' service" in message
    assert "layer 'arq' below it provides 'reliable' (ReliableService)" in message
    with pytest.raises(AssemblyError, match="requires an 'active-messages' service"):
        check_fit(DatagramService, [ArqLayer(), SplitcLayer()])
    check_fit(DatagramService, [UamLayer(), SplitcLayer()])  # UAM declares Active Messages


def _splitc_recipe(benchmark: str, nodes: int, over_uam: bool) -> dict[str, Any]:
    data = tomllib.loads((REPO_RECIPES / "splitc-myrinet-am.toml").read_text())
    if over_uam:  # Split-C over UAM over GAM's datagram face
        data["layers"] = [{"kind": "uam", "rto_us": 20000.0, "max_retries": 20}, *data["layers"]]
    # A machine's CPU costs, so that the computation is charged and can be compared.
    data["workload"].update(benchmark=benchmark, small=True, nodes=nodes, machine="atm-003")
    data["workload"].pop("sizes", None)
    return data


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("benchmark", ["mm4x4", "ssortlg", "rsortsm", "cc"])
def test_splitc_runs_directly_over_gam_as_over_uam_over_gam(benchmark: str, nodes: int) -> None:
    direct = run_recipe(parse_recipe(_splitc_recipe(benchmark, nodes, False), "gam.toml"))
    layered = run_recipe(parse_recipe(_splitc_recipe(benchmark, nodes, True), "uam.toml"))
    for result in (direct, layered):
        assert result.facts["verified"] == "yes"
        assert [row["rank"] for row in result.rows] == list(range(nodes))
    # The same program on the same data: the same computation, only the messages differ.
    computed = [row["compute_ms"] for row in direct.rows]
    assert computed == [row["compute_ms"] for row in layered.rows]
    assert all(ms > 0 for ms in computed)  # type: ignore[operator]


def test_the_recipe_runs_split_c_on_gam_with_no_layer_below_it() -> None:
    data = tomllib.loads((REPO_RECIPES / "splitc-myrinet-am.toml").read_text())
    assert data["transport"]["kind"] == "sim-myrinet-am"
    assert [layer["kind"] for layer in data["layers"]] == ["splitc"]
