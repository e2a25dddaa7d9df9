"""``stacklib bench faults``: the standing reliability run.

Campaigns, each a row of one table (tried, delivered, lost, corrupt delivered, retransmitted,
faults applied, wall time):

* ``uam``: Active Messages requests through the simulated SBA-200 cluster with faults on the
  fabric (loss, corruption, duplication, reordering; 20% of messages in all by default), in
  virtual time; every request carries its number and a check word, and the receiver verifies
  exactly-once, in-order delivery and the check word of each;
* ``formats``: every registered wire format fed seeded random bytes, truncations and bit flips
  of its own valid values; anything but the format's documented error is a crash;
* ``daemon``: a fresh OS-service daemon under a low descriptor limit flooded with malformed
  requests on hundreds of connections while a channel it set up carries messages; the daemon
  must live and the channel lose nothing.

Nothing lost, nothing corrupt delivered, no crash: a campaign that breaks one of these raises
:class:`ReliabilityError` naming it, after the table's row is filled.  docs/reliability.md has
the figures and the commands.
"""

from __future__ import annotations

import random
import time
import typing
import zlib
from collections.abc import Callable
from typing import Any

import attrs
import trio

from stacklib.bench.result import Column, Result
from stacklib.errors import StacklibError
from stacklib.reporting import progress
from stacklib.services import ActiveMessageService

__all__ = ["FaultsParams", "ReliabilityError", "bench_faults", "fuzz_formats", "uam_campaign"]

CAMPAIGNS = ("uam", "tcp", "formats", "daemon")


class ReliabilityError(StacklibError):
    """A campaign lost a message, delivered a corrupt one, or crashed."""


@attrs.frozen
class FaultsParams:
    """What ``stacklib bench faults`` runs."""

    #: UAM requests sent through the faulty fabric.
    messages: int = 100_000
    #: The fraction of messages hit by each of loss, corruption, duplication and reordering.
    rate: float = 0.05
    #: Random inputs per registered format.
    fuzz: int = 20_000
    #: Bytes moved over TCP.
    tcp_bytes: int = 10 << 20
    #: Malformed requests sent to the daemon.
    flood: int = 20_000
    seed: int = 1
    campaigns: tuple[str, ...] = CAMPAIGNS


def _check_word(number: int) -> int:
    return zlib.crc32(number.to_bytes(4, "big")) & 0x7FFFFFFF


def uam_campaign(messages: int, rate: float, seed: int) -> dict[str, Any]:
    """Send ``messages`` UAM requests from node 0 to node 1 over the simulated SBA-200 with
    ``rate`` of loss, corruption, duplication and reordering each; verify each arrival."""
    from stacklib.recipes import open_session, parse_recipe
    from stacklib.sim import Simulation

    recipe = parse_recipe(
        {
            "run": {"clock": "virtual", "seed": seed},
            "transport": {
                "kind": "sim-atm",
                "ni": "sba200",
                "faults": {"loss": rate, "corrupt": rate, "duplicate": rate, "reorder": rate},
            },
            "endpoint": {"segment_size": 524288, "tx_buffers": 32, "rx_buffers": 48},
            "layers": [{"kind": "uam", "window": 8, "rto_us": 2000.0, "max_retries": 64}],
            "workload": {"kind": "pingpong"},
        },
        "bench faults (uam)",
    )
    seen: list[int] = []
    bad = 0
    counters: dict[str, Any] = {}
    simulation = Simulation(seed=seed)

    async def main() -> None:
        async with open_session(recipe, simulation) as session:
            sender, receiver = (typing.cast(ActiveMessageService, s) for s in session.services)
            to_receiver = session.peers[0][1]

            def arrived(peer: int, number: int, check: int) -> None:
                nonlocal bad
                seen.append(number)
                if check != _check_word(number):
                    bad += 1

            receiver.register_handler(arrived, index=1)
            for number in range(messages):
                await sender.request(to_receiver, 1, number, _check_word(number))
            await sender.drain(to_receiver)
            await receiver.wait_until(lambda: len(seen) >= messages)
            counters.update(sender.statistics())

    simulation.run(main)
    expected = list(range(messages))
    return {
        "tried": messages,
        "delivered": len(seen),
        "lost": len(set(expected) - set(seen)),
        "corrupt": bad + (0 if seen == expected else 1),
        "retransmitted": counters.get("retransmitted", 0),
        "virtual_seconds": simulation.clock.current_time(),
    }


def _mutations(info: Any, rng: random.Random, count: int) -> list[bytes]:
    """Random inputs for a format: random bytes, and (where it can build values) bit flips and
    truncations of a valid encoding of an empty-ish value."""
    inputs = [rng.randbytes(rng.randrange(0, 96)) for _ in range(count // 2)]
    seeds: list[bytes] = []
    if info.build is not None:
        for length in (0, 8, 64, 200):
            for candidate in (bytes(length), rng.randbytes(length)):
                try:
                    seeds.append(bytes(info.build(info.parse(candidate))))
                except Exception:  # not a valid encoding: no seed from it
                    continue
    while len(inputs) < count:
        if not seeds:
            inputs.append(rng.randbytes(rng.randrange(0, 96)))
            continue
        base = bytearray(rng.choice(seeds))
        if base and rng.random() < 0.7:
            for _ in range(rng.randrange(1, 4)):
                bit = rng.randrange(len(base) * 8)
                base[bit // 8] ^= 1 << (bit % 8)
        else:
            base = base[: rng.randrange(0, len(base) + 1)]
        inputs.append(bytes(base))
    return inputs


def fuzz_formats(count: int, seed: int) -> dict[str, Any]:
    """Feed every registered format ``count`` inputs; any exception but its documented error
    is a crash (counted, and the first one named)."""
    from stacklib.wire.registry import formats

    rng = random.Random(seed)
    tried = rejected = 0
    crashes: list[str] = []
    for name, info in formats().items():
        expected: type[BaseException] = info.error or StacklibError
        for data in _mutations(info, rng, count):
            tried += 1
            try:
                info.parse(data)
            except expected:
                rejected += 1
            except Exception as error:  # the finding this campaign exists for
                crashes.append(f"{name}: {type(error).__name__}: {error} on {data.hex()[:64]}")
    return {
        "tried": tried,
        "delivered": tried - rejected - len(crashes),
        "lost": 0,
        "corrupt": len(crashes),
        "retransmitted": 0,
        "rejected": rejected,
        "first_crash": crashes[0] if crashes else "",
    }


def tcp_campaign(nbytes: int, rate: float, seed: int) -> dict[str, Any]:
    """Move ``nbytes`` over one TCP connection (ip + tcp, MSS 1400) between two simulated
    Fast Ethernet hosts whose fabric loses, duplicates, reorders and corrupts ``rate`` of frames
    each (a corrupted frame fails the NI's FCS check, as on a real card); verify every byte by
    SHA-256."""
    import hashlib

    from stacklib.layers.tcp.driver import TcpStack
    from stacklib.recipes import open_session, parse_recipe
    from stacklib.sim import Simulation

    recipe = parse_recipe(
        {
            "run": {"clock": "virtual", "seed": seed},
            "transport": {
                "kind": "sim-fe",
                "interconnect": "hub",
                "faults": {
                    "loss": rate,
                    "duplicate": rate,
                    "reorder": rate,
                    "corrupt": rate,
                },
            },
            "layers": [
                {"kind": "ip", "address": "10.0.0.{node1}"},
                {"kind": "tcp", "mss": 1400},
            ],
            "workload": {"kind": "tcp-stream"},
        },
        "bench faults (tcp)",
    )
    data = random.Random(seed).randbytes(nbytes)
    seen: dict[str, Any] = {}
    simulation = Simulation(seed=seed)

    async def main() -> None:
        async with open_session(recipe, simulation) as session:
            client, server = (typing.cast(TcpStack, s) for s in session.services)
            peer = session.peers[0][1]
            received = bytearray()

            async def serve() -> None:
                _, stream = await server.accept()
                async with stream:
                    while chunk := await stream.receive_some(65536):
                        received.extend(chunk)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve)
                stream = await client.connect(peer)
                async with stream:
                    for start in range(0, nbytes, 65536):
                        await stream.send_all(data[start : start + 65536])
                seen["retransmitted"] = stream.statistics().retransmissions
            seen["received"] = bytes(received)

    simulation.run(main)
    got = seen["received"]
    return {
        "tried": nbytes,
        "delivered": len(got),
        "lost": max(0, nbytes - len(got)),
        "corrupt": int(hashlib.sha256(got).digest() != hashlib.sha256(data).digest()),
        "retransmitted": seen["retransmitted"],
    }


def daemon_campaign(requests: int, seed: int, nofile: int = 256) -> dict[str, Any]:
    """Flood a fresh OS-service daemon (run with RLIMIT_NOFILE ``nofile``) with ``requests``
    malformed requests on hundreds of connections, some left idle, while two endpoints
    exchange messages through a channel it set up; the pair must lose nothing and the daemon
    must live."""
    import os
    import shutil
    import socket
    import tempfile

    from stacklib.daemon import DaemonBroker, DaemonClient
    from stacklib.daemon.process import start_daemon, stop_daemon
    from stacklib.transports.shm import ShmAddress, ShmNetwork

    rng = random.Random(seed)
    workdir = tempfile.mkdtemp(prefix="sl-faults-")  # short: a socket path fits in 108 bytes
    path = os.path.join(workdir, "d.sock")
    daemon = start_daemon(path, nofile=nofile)
    exchanged = lost = connections = 0
    counters: dict[str, Any] = {}
    sockets: list[socket.socket] = []
    brokers: list[DaemonBroker] = []
    try:
        if daemon.poll() is not None:
            raise ReliabilityError(f"daemon: it exited on start (status {daemon.returncode})")
        brokers = [DaemonBroker(path, start=False), DaemonBroker(path, start=False)]
        with (
            ShmNetwork(directory=workdir, broker=brokers[0]) as net_a,
            ShmNetwork(directory=workdir, broker=brokers[1]) as net_b,
        ):
            a, b = net_a.add_node("a"), net_b.add_node("b")
            ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
            ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
            ch_a = a.os.create_channel(ep_a.owner, ep_a, ShmAddress("b", 1))
            b.os.create_channel(ep_b.owner, ep_b, ShmAddress("a", 1))  # both ends: connected

            async def exchange(number: int) -> bool:
                payload = number.to_bytes(4, "big") * 4
                with trio.move_on_after(5):
                    await ep_a.send(ch_a, payload)
                    return (await ep_b.recv()).data == payload
                return False

            for number in range(requests):
                if number % 50 == 0:  # the channel carries messages all through the flood
                    exchanged += 1
                    lost += not trio.run(exchange, number)
                if number % 4 == 0 or not sockets:
                    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    conn.settimeout(1)
                    try:
                        conn.connect(path)
                    except OSError:
                        conn.close()
                        continue
                    sockets.append(conn)
                    connections += 1
                target = rng.choice(sockets)
                garbage = rng.randbytes(rng.randrange(0, 64))
                frame = rng.choice([garbage, len(garbage).to_bytes(4, "big") + garbage])
                try:
                    target.sendall(frame)
                except OSError:  # the daemon closed it: shed or refused, as it may
                    sockets.remove(target)
                    target.close()
        alive = daemon.poll() is None
        if alive:
            with DaemonClient(path, start=False) as client:
                counters = dict(client.status().get("counters", {}))
    finally:
        for conn in sockets:
            conn.close()
        for broker in brokers:
            broker.close()
        stop_daemon(daemon)
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "tried": requests,
        "delivered": exchanged - lost,
        "lost": lost,
        "corrupt": 0 if alive else 1,
        "retransmitted": 0,
        "connections": connections,
        "daemon_counters": counters,
    }


CAMPAIGN_RUNNERS: dict[str, Callable[[FaultsParams], dict[str, Any]]] = {
    "uam": lambda p: uam_campaign(p.messages, p.rate, p.seed),
    "formats": lambda p: fuzz_formats(p.fuzz, p.seed),
    "tcp": lambda p: tcp_campaign(p.tcp_bytes, p.rate, p.seed),
    "daemon": lambda p: daemon_campaign(p.flood, p.seed),
}


def bench_faults(params: FaultsParams | None = None) -> Result:
    """Run the campaigns of ``params``; raise :class:`ReliabilityError` naming every campaign
    that lost, corrupted or crashed (the result is attached as ``error.result``)."""
    params = params or FaultsParams()
    unknown = [c for c in params.campaigns if c not in CAMPAIGN_RUNNERS]
    if unknown:
        raise ValueError(f"no campaign {unknown[0]!r} (campaigns: {', '.join(CAMPAIGN_RUNNERS)})")
    rows = []
    failures = []
    interrupted: str | None = None
    for campaign in params.campaigns:
        start = time.perf_counter()
        try:
            with progress.step(campaign):
                row = CAMPAIGN_RUNNERS[campaign](params)
        except BaseException as stop:
            if not progress.is_interrupt(stop):
                raise
            interrupted = campaign
            break
        row["campaign"] = campaign
        row["wall_s"] = time.perf_counter() - start
        rows.append(row)
        if row["lost"] or row["corrupt"]:
            failures.append(f"{campaign}: {row['lost']} lost, {row['corrupt']} corrupt or crashed")
    result = Result(
        title=f"Reliability under faults (rate {params.rate:g} each, seed {params.seed})",
        columns=[
            Column("campaign", "campaign"),
            Column("tried", "tried"),
            Column("delivered", "delivered / parsed"),
            Column("lost", "lost"),
            Column("corrupt", "corrupt or crashed"),
            Column("retransmitted", "retransmitted"),
            Column("wall_s", "wall", "s", 1),
        ],
        rows=rows,
    )
    if interrupted is not None:
        # Ctrl-C: the campaigns that finished, and which did not.
        not_run = params.campaigns[len(rows) + 1 :]
        detail = f"interrupted in {interrupted}" + (
            f"; not run: {', '.join(not_run)}" if not_run else ""
        )
        raise progress.Interrupted(result, detail)
    if failures:
        error = ReliabilityError("; ".join(failures))
        error.result = result  # type: ignore[attr-defined]
        raise error
    return result
