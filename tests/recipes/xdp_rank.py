"""A rank of tests/recipes/test_xdp_recipes.py: ``python xdp_rank.py MODE RECIPE``.

Started by ``stacklib.launch.spawn(2, ..., transport="xdp", netns=True)``: each rank opens the
recipe's stack over AF_XDP in its own namespace (stacklib.recipes.ranks.open_rank), does
MODE's exchange with the other rank, checks what arrived and exits 0 only if all of it is
right (spawn then returns the first failing rank's status).

* ``frames``: raw U-Net, messages of 0..max bytes both ways, each checked; then rank 0 pings
  rank 1's kernel address on the same interface while both xdp nodes are open (ARP and ICMP
  pass the XDP program to the kernel).
* ``stream``: rank 0 sends 4 MiB as messages over the top service (UAM: reliable), then its
  SHA-256; rank 1 compares.
* ``tcp``: rank 0 connects to rank 1 and sends 4 MiB; rank 1 answers the SHA-256 of what it
  read; rank 0 compares.
* ``udp``: datagrams both ways between the ranks' UDP port 9000, each checked.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import random
import sys
import typing

import trio

from stacklib.launch import publish
from stacklib.layers.ip.service import UdpService
from stacklib.recipes import load_recipe
from stacklib.recipes.ranks import RankSession, open_rank
from stacklib.services import DatagramService, StreamService

STREAM_BYTES = 4 << 20
CHUNK = 1400


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


async def frames(session: RankSession) -> None:
    service = typing.cast(DatagramService, session.service)
    other = 1 - session.rank
    peer = session.peers[other]
    sizes = [0, 1, 40, 100, 1000, service.max_message]
    for i, size in enumerate(sizes * 5):
        if session.rank == 0:
            await service.send(peer, payload(i, size))
            got, data = await service.recv()
            assert (got, data) == (peer, payload(1000 + i, size)), f"reply {i} differs"
        else:
            got, data = await service.recv()
            assert (got, data) == (peer, payload(i, size)), f"message {i} differs"
            await service.send(peer, payload(1000 + i, size))
    if session.rank == 0:
        host = ipaddress.IPv4Address(os.environ["STACKLIB_HOST"])
        kernel = str(host + 1)  # rank 1's interface address (stacklib.netns.bridged_namespaces)
        ping = [sys.executable, "-m", "stacklib.netns", "ping", kernel, "3", "1"]
        status = (await trio.run_process(ping, check=False)).returncode
        assert status == 0, f"no answer from the kernel at {kernel} while xdp is attached"
        print("ping ok", flush=True)


async def stream(session: RankSession) -> None:
    service = typing.cast(DatagramService, session.service)
    peer = session.peers[1 - session.rank]
    data = payload(7, STREAM_BYTES)
    if session.rank == 0:
        for offset in range(0, len(data), CHUNK):
            await service.send(peer, data[offset : offset + CHUNK])
        await service.send(peer, b"sha256:" + hashlib.sha256(data).digest())
        _, verdict = await service.recv()
        assert verdict == b"same", verdict
        return
    digest = hashlib.sha256()
    received = 0
    while True:
        _, message = await service.recv()
        if message.startswith(b"sha256:") and received == STREAM_BYTES:
            break
        digest.update(message)
        received += len(message)
    same = message == b"sha256:" + digest.digest()
    await service.send(peer, b"same" if same else b"different")
    assert same, f"SHA-256 of {received} bytes differs"
    print(f"stream ok {received}", flush=True)


async def tcp(session: RankSession) -> None:
    service = typing.cast(StreamService, session.service)
    data = payload(9, STREAM_BYTES)
    if session.rank == 0:
        stream = await service.connect(int(ipaddress.IPv4Address(session.address_of(1))))
        async with stream:
            for offset in range(0, len(data), 65536):
                await stream.send_all(data[offset : offset + 65536])
            await stream.send_eof()
            answer = b""
            while chunk := await stream.receive_some(64):
                answer += chunk
        assert answer == hashlib.sha256(data).digest(), "SHA-256 differs"
        print(f"tcp ok {len(data)}", flush=True)
        return
    _, stream = await service.accept()
    async with stream:
        digest = hashlib.sha256()
        while chunk := await stream.receive_some(65536):
            digest.update(chunk)
        await stream.send_all(digest.digest())


async def udp(session: RankSession) -> None:
    service = typing.cast(UdpService, session.service)
    other = session.address_of(1 - session.rank)
    messages = [payload(i, 1 + 29 * i) for i in range(50)]
    async with await service.bind(9000) as sock:
        if session.rank == 0:
            for i, message in enumerate(messages):
                # Datagrams may be lost: resend until this one's echo comes back.
                while True:
                    await sock.sendto(message, (other, 9000))
                    with trio.move_on_after(0.5):
                        while True:
                            data, source = await sock.recvfrom()
                            if data == message[::-1]:
                                break
                        break
                assert source == (other, 9000), f"echo {i} from {source}"
            print("udp ok", flush=True)
            return
        seen: set[bytes] = set()

        async def echo() -> None:
            while True:
                data, source = await sock.recvfrom()
                assert source == (other, 9000), source
                seen.add(data)
                await sock.sendto(data[::-1], source)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            await _finished(session, 0)
            nursery.cancel_scope.cancel()
        assert seen == set(messages), f"{len(set(messages) - seen)} datagrams never came"


async def _finished(session: RankSession, rank: int) -> None:
    path = os.path.join(session.rendezvous, f"rank{rank}.finished")
    with trio.fail_after(60):
        while not os.path.exists(path):
            await trio.sleep(0.01)


MODES = {"frames": frames, "stream": stream, "tcp": tcp, "udp": udp}


async def main(mode: str, recipe_name: str) -> None:
    recipe = load_recipe(recipe_name)
    async with open_rank(recipe) as session:
        with trio.fail_after(120):
            await MODES[mode](session)
        # Stay attached until the other rank is done too (its last echo, its ping).
        publish(session.rendezvous, session.rank, "", kind="finished")
        for rank in range(session.size):
            await _finished(session, rank)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
