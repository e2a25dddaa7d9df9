"""Single-copy transfers through the OS service: correctness, protection, reclaiming, statistics."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stacklib.daemon import (
    BODY,
    FAST_CODECS,
    DaemonClient,
    DaemonDenied,
    DaemonError,
    DaemonFormatError,
    Deregister,
    Done,
    ErrorCode,
    MsgType,
    OpenPool,
    PoolGranted,
    Register,
    SendDirect,
    decode,
    encode,
)
from stacklib.transports import xmem
from stacklib.transports.shm import RegionSpec, ShmAddress
from stacklib.transports.xmem import (
    PAGE,
    PoolLayout,
    ReceivePool,
    RegistrationCache,
    XferStatus,
    XmemError,
)

pytestmark = pytest.mark.skipif(not xmem.available(), reason="no process_vm_readv in this libc")

SPEC = RegionSpec(1 << 16, 4096)
SOURCE = 1 << 18  # bytes of registered source memory in the correctness tests
_u32 = st.integers(0, 0xFFFFFFFF)
_u64 = st.integers(0, (1 << 64) - 1)

# ==================================================================== wire format


@given(
    st.one_of(
        st.builds(SendDirect, _u32, _u32, st.integers(0, 255), _u64, _u32, _u32),
        st.builds(Done, _u32, st.integers(0, 255), _u32, _u32),
    ),
    _u32,
)
def test_fast_codecs_agree_with_the_construct_definition(
    message: SendDirect | Done, seq: int
) -> None:
    frame = encode(seq, message)
    fields = {"type": int(message.type), "seq": seq, "payload": attrs.asdict(message)}
    assert frame[4:] == BODY.build(fields)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert decode(frame[4:]) == (seq, message)
    parsed = BODY.parse(frame[4:])
    assert {k: v for k, v in parsed.payload.items() if not k.startswith("_")} == attrs.asdict(
        message
    )


@given(
    st.one_of(
        st.builds(Register, _u32, _u64, _u64),
        st.builds(Deregister, _u32, _u64, _u64),
        st.builds(OpenPool, _u32, st.text(max_size=20), st.integers(0, 0xFFFF), _u32, _u64),
        st.builds(PoolGranted, _u32, _u64),
    ),
    _u32,
)
def test_new_requests_round_trip(message: object, seq: int) -> None:
    assert decode(encode(seq, message)[4:]) == (seq, message)  # type: ignore[arg-type]


@given(st.binary(min_size=2, max_size=40), st.sampled_from(sorted(FAST_CODECS)))
def test_bytes_shaped_like_a_fast_message_parse_or_raise_format_error(
    data: bytes, kind: int
) -> None:
    body = bytes([data[0], kind]) + data[2:]
    with contextlib.suppress(DaemonFormatError):
        seq, message = decode(body)
        assert encode(seq, message)[4:] == body  # what parses is exactly what it encodes


# ==================================================================== the registration cache


def test_cache_counts_pages_and_evicts_lru_or_fifo() -> None:
    cache = RegistrationCache(capacity=4, policy="lru", page=4096)
    assert cache.lookup(7, 4096 - 1, 2) == [0, 1]  # two pages touched by two bytes
    cache.insert(7, [0, 1])
    assert cache.lookup(7, 0, 8192) == []
    assert (cache.stats.hits, cache.stats.misses, cache.stats.pinned_bytes) == (2, 2, 8192)
    cache.insert(7, [2, 3])
    cache.lookup(7, 0, 1)  # page 0 is now the most recently used
    cache.insert(7, [4])
    assert cache.stats.evictions == 1
    assert cache.lookup(7, 0, 1) == [] and cache.lookup(7, 4096, 1) == [1]  # LRU evicted 1
    fifo = RegistrationCache(capacity=2, policy="fifo", page=4096)
    fifo.insert(1, [0, 1])
    fifo.lookup(1, 0, 1)
    fifo.insert(1, [2])
    assert fifo.lookup(1, 0, 1) == [0]  # FIFO evicts the oldest, used or not
    assert len(cache) == 4 and cache.stats.pinned_bytes == 4 * 4096
    assert cache.lookup(8, 0, 1) == [0]  # entries are per process
    assert cache.invalidate(7, 0, 4096) == 1 and cache.invalidate(7) == 3
    assert cache.stats.pinned_bytes == 0 and cache.stats.invalidations == 4
    assert cache.stats.pinned_bytes_max == 4 * 4096 and cache.stats.valid_entries == 0
    assert cache.lookup(7, 0, 0) == []


def test_cache_misuse_raises() -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        RegistrationCache(0)
    with pytest.raises(ValueError, match="eviction policy"):
        RegistrationCache(4, "random")
    with pytest.raises(ValueError, match="power of two"):
        RegistrationCache(4, page=3000)
    with pytest.raises(ValueError, match="power of two"):
        PoolLayout(3, PAGE)
    with pytest.raises(ValueError, match="whole pages"):
        PoolLayout(4, 100)


# ==================================================================== pools and raw moves


def test_pool_drops_garbage_posts_and_survives_corrupt_counters() -> None:
    layout = PoolLayout(4, 4 * PAGE)
    state = xmem.create_pool(layout, "test-pool")
    owner = ReceivePool(mmap.mmap(os.dup(state.fd), layout.total), layout)
    try:
        assert state.take(10) == (XferStatus.NO_BUFFER, 0, 0)
        owner.post(4 * PAGE, 16)  # past the end
        owner.post(0, 0)  # empty
        owner.post(PAGE, 100)
        assert state.take(10) == (XferStatus.OK, PAGE, 100)
        assert state.bad_posts == 2
        owner.post(0, 8)
        assert state.take(10) == (XferStatus.TOO_LONG, 0, 8)
        for slot in range(4):  # a full completion ring: no buffer is taken
            state.complete(0, 0, 1, slot)
        owner.post(0, PAGE)
        assert state.take(10)[0] is XferStatus.NO_BUFFER and owner.posted == 1
        assert [owner.poll() for _ in range(4)][3] == xmem.Completion(0, 0, 1, 3)
        assert owner.poll() is None
        owner._words[8] = 1 << 40  # the owner's free tail runs far ahead: unusable, no crash
        assert state.take(10)[0] is XferStatus.NO_BUFFER and state.corrupt
    finally:
        owner.close()
        state.close()


def test_raw_moves_report_errno_and_partial_transfers() -> None:
    source = mmap.mmap(-1, 2 * PAGE)
    source[:] = os.urandom(2 * PAGE)
    target = bytearray(2 * PAGE)
    here, there = xmem.address_of(target), xmem.address_of(source)
    assert xmem.read_from(os.getpid(), there + 5, here, 2 * PAGE - 5) == 2 * PAGE - 5
    assert target[: 2 * PAGE - 5] == source[5:]
    source.close()
    # The pages are gone now: EFAULT; a process that does not exist: ESRCH.
    with pytest.raises(XmemError) as caught:
        xmem.read_from(os.getpid(), there, here, PAGE)
    assert caught.value.errno == errno.EFAULT and caught.value.done == 0
    with pytest.raises(XmemError) as caught:
        xmem.write_to(2**22 + 12345, 4096, here, 16)
    assert caught.value.errno == errno.ESRCH
    # A range that runs off the end of a mapping moves what exists, then reports the fault.
    pages = mmap.mmap(-1, 2 * PAGE)
    start = xmem.address_of(pages)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    assert libc.munmap(start + PAGE, PAGE) == 0
    with pytest.raises(XmemError) as caught:
        xmem.read_from(os.getpid(), start + PAGE - 100, here, 200)
    assert caught.value.errno == errno.EFAULT and caught.value.done == 100
    pages.close()


# ==================================================================== through the daemon


def _start_daemon(path: str, *extra: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-m", "stacklib.daemon", "--socket", path, *extra])
    deadline = time.monotonic() + 20
    while not os.path.exists(path):
        assert process.poll() is None and time.monotonic() < deadline, "daemon did not start"
        time.sleep(0.01)
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(10) == 0
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


@pytest.fixture(scope="module")
def daemon() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="sc-")
    path = os.path.join(directory, "d.sock")
    process = _start_daemon(path)
    yield path
    _stop(process)
    shutil.rmtree(directory, ignore_errors=True)


_names = itertools.count()


@attrs.define
class Pair:
    """A sender and a receiver endpoint (two connections, so two owners) with a channel."""

    sender: DaemonClient
    receiver: DaemonClient
    local: ShmAddress
    remote: ShmAddress
    channel: int
    side: int
    pool: ReceivePool

    def close(self) -> None:
        self.pool.close()
        self.sender.close()
        self.receiver.close()


def _pair(path: str, slots: int = 8, data: int = 1 << 20) -> Pair:
    n = next(_names)
    local, remote = ShmAddress(f"s{n}", 1), ShmAddress(f"r{n}", 1)
    sender, receiver = DaemonClient(path, start=False), DaemonClient(path, start=False)
    sender.create_endpoint(local)
    receiver.create_endpoint(remote)
    grant, fd = sender.open_channel(local, remote, SPEC)
    os.close(fd)
    _, fd = receiver.open_channel(remote, local, SPEC)
    os.close(fd)
    pool = receiver.open_pool(remote, slots, data)
    return Pair(sender, receiver, local, remote, grant.channel, grant.side, pool)


@pytest.fixture(scope="module")
def pair(daemon: str) -> Iterator[tuple[Pair, bytearray, int]]:
    made = _pair(daemon)
    source = bytearray(os.urandom(SOURCE))
    address = xmem.address_of(source)
    made.sender.register_memory(address, SOURCE)
    yield made, source, address
    made.close()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_single_copy_delivers_exact_bytes_for_many_sizes_and_offsets(
    pair: tuple[Pair, bytearray, int], data: st.DataObject
) -> None:
    link, source, address = pair
    length = data.draw(
        st.one_of(
            st.sampled_from([0, 1, 7, PAGE - 1, PAGE, PAGE + 1, 65536]), st.integers(0, SOURCE)
        )
    )
    start = data.draw(st.integers(0, SOURCE - length))
    where = data.draw(st.integers(0, (1 << 20) - max(length, 1)))
    assert link.pool.post(where, max(length, 1))
    done = link.sender.send_direct(link.channel, link.side, address + start, length)
    assert (done.status, done.length, done.channel) == (XferStatus.OK, length, link.channel)
    completion = link.pool.poll()
    assert completion == xmem.Completion(where, length, link.channel, 0)
    assert link.pool.data[where : where + length] == source[start : start + length]


def test_pipelined_transfers_complete_in_order(pair: tuple[Pair, bytearray, int]) -> None:
    link, source, address = pair
    for index in range(8):
        link.pool.post(index * 65536, 65536)
    for index in range(8):
        link.sender.submit_direct(link.channel, link.side, address + index * 100, 1000, index)
    with pytest.raises(DaemonError, match="in flight"):
        link.sender.status()  # a synchronous request in the middle of a pipeline is misuse
    assert [link.sender.reap().cookie for _ in range(8)] == list(range(8))
    for index in range(8):
        completion = link.pool.poll()
        assert completion is not None and completion.cookie == index
        got = link.pool.data[completion.offset : completion.offset + 1000]
        assert got == source[index * 100 : index * 100 + 1000]
    with pytest.raises(DaemonError, match="no single-copy transfer"):
        link.sender.reap()


def _secret_holder() -> tuple[subprocess.Popen[str], int]:
    """Another process holding a secret page; returns it and the page's address there."""
    code = (
        "import mmap, sys; from stacklib.transports import xmem; m = mmap.mmap(-1, 1 << 16); "
        "m[:6] = b'SECRET'; print(xmem.address_of(m), flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    return holder, int(holder.stdout.readline())


def test_hostile_descriptors_get_error_statuses(daemon: str) -> None:
    link = _pair(daemon)
    other = _pair(daemon)  # a channel between two other endpoints
    mine = mmap.mmap(-1, 4 * PAGE)
    mine[:] = b"m" * (4 * PAGE)
    base = xmem.address_of(mine)
    holder, secret = _secret_holder()
    try:
        link.pool.post(0, 1 << 16)
        send = link.sender.send_direct
        # Memory it never registered, or registered only in part.
        assert send(link.channel, link.side, base, 16).status == XferStatus.NOT_REGISTERED
        link.sender.register_memory(base, 2 * PAGE)
        assert send(link.channel, link.side, base + PAGE, 2 * PAGE).status == (
            XferStatus.NOT_REGISTERED
        )
        # Another process's address: not its memory, so it cannot register or send it.
        assert send(link.channel, link.side, secret, 6).status == XferStatus.NOT_REGISTERED
        if not xmem.covered(xmem.readable_ranges(os.getpid()), secret, secret + PAGE):
            with pytest.raises(DaemonError) as refused:
                link.sender.register_memory(secret, PAGE)
            assert refused.value.code is ErrorCode.BAD_RANGE
        # A channel it does not own, and the other side of its own channel.
        assert send(other.channel, 0, base, 16).status == XferStatus.NOT_OWNER
        assert send(other.channel, 1, base, 16).status == XferStatus.NOT_OWNER
        assert send(link.channel, 1 - link.side, base, 16).status == XferStatus.NOT_OWNER
        assert send(10**6, 0, base, 16).status == XferStatus.NOT_OWNER
        # None of that took the posted buffer or touched the other pair's pool.
        assert link.pool.posted == 1 and link.pool.poll() is None and other.pool.poll() is None
        assert send(link.channel, link.side, base, 16).status == XferStatus.OK
        assert link.pool.poll() is not None
        # No buffer posted.
        assert send(link.channel, link.side, base, 16).status == XferStatus.NO_BUFFER
        # Registered, then unmapped behind the daemon's back: the cached pages fail cleanly.
        link.pool.post(0, 1 << 16)
        mine.close()
        done = send(link.channel, link.side, base, 16)
        assert done.status == XferStatus.BAD_ADDRESS
        assert link.pool.poll() == xmem.Completion(0, 0, link.channel, 0)  # returned unfilled
        # A forged pid on a transfer is refused like any forged request.
        link.sender.sock.sendall(encode(9, SendDirect(1, link.channel, link.side, base, 16, 0)))
        link.sender.in_flight += 1
        with pytest.raises(DaemonDenied) as forged:
            link.sender.reap()
        assert forged.value.code is ErrorCode.FORGED_PID
        status = link.sender.status()
        assert status["counters"]["direct_not_owner"] >= 4
        assert status["counters"]["forged_pid"] >= 1
    finally:
        holder.communicate("")
        link.close()
        other.close()


def test_short_buffer_is_returned_unfilled(daemon: str) -> None:
    link = _pair(daemon)
    source = bytearray(b"x" * 200)
    address = xmem.address_of(source)
    try:
        link.sender.register_memory(address, len(source))
        link.pool.post(64, 100)
        assert link.sender.send_direct(link.channel, link.side, address, 200).status == (
            XferStatus.TOO_LONG
        )
        assert link.pool.poll() == xmem.Completion(64, 0, link.channel, 0)
        assert bytes(link.pool.data[64:164]) == bytes(100)
        link.sender.deregister_memory(address, len(source))
        link.pool.post(64, 100)
        assert link.sender.send_direct(link.channel, link.side, address, 10).status == (
            XferStatus.NOT_REGISTERED
        )
        with pytest.raises(DaemonDenied):
            link.sender.deregister_memory(address, len(source))
    finally:
        link.close()


_SENDER_CODE = """
import os, sys
from stacklib.daemon import DaemonClient
from stacklib.transports import xmem
from stacklib.transports.shm import RegionSpec, ShmAddress as A
c = DaemonClient({path!r}, start=False)
c.create_endpoint(A({node!r}, 1))
grant, fd = c.open_channel(A({node!r}, 1), A({peer!r}, 1), RegionSpec(1 << 16, 4096))
os.close(fd)
{extra}
buffer = bytearray(b"d" * 8 * 4096)
address = xmem.address_of(buffer)
c.register_memory(address, len(buffer))
done = c.send_direct(grant.channel, grant.side, address, len(buffer))
print(grant.channel, done.status, flush=True)
sys.stdin.read()
"""


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_dead_peers_registrations_and_pool_are_reclaimed(daemon: str) -> None:
    watcher = DaemonClient(daemon, start=False)
    receiver = DaemonClient(daemon, start=False)
    n = next(_names)
    peer, node = ShmAddress(f"r{n}", 1), f"s{n}"
    receiver.create_endpoint(peer)
    _, fd = receiver.open_channel(peer, ShmAddress(node, 1), SPEC)
    os.close(fd)
    pool = receiver.open_pool(peer, 4, 1 << 16)
    pool.post(0, 1 << 16)
    before = watcher.status()
    code = _SENDER_CODE.format(path=daemon, node=node, peer=peer.node, extra="")
    sender = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert sender.stdout is not None
        channel, status = map(int, sender.stdout.readline().split())
        assert status == XferStatus.OK and pool.poll() == xmem.Completion(0, 8 * 4096, channel, 0)
        assert bytes(pool.data[: 8 * 4096]) == b"d" * 8 * 4096
        during = watcher.status()
        assert during["registrations"] == before["registrations"] + 1
        assert during["cache"]["pinned_bytes"] >= before["cache"]["pinned_bytes"] + 8 * 4096
        sender.kill()
        sender.wait()

        def reclaimed() -> bool:
            now = watcher.status()
            return bool(now["registrations"] == before["registrations"])

        _wait_for(reclaimed)
        after = watcher.status()
        assert after["cache"]["pinned_bytes"] == before["cache"]["pinned_bytes"]
        assert after["cache"]["valid_entries"] == before["cache"]["valid_entries"]
        assert after["counters"]["reclaimed_registrations"] >= 1
        # The receiver now dies too: its pool goes, and a new sender to it finds no peer.
        pool.close()
        receiver.close()
        _wait_for(lambda: watcher.status()["pools"] == before["pools"] - 1)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        if sender.stdout is not None:
            sender.stdout.close()
        if sender.stdin is not None:
            sender.stdin.close()
        watcher.close()


def test_a_transfer_to_a_peer_without_a_pool_or_gone_is_peer_gone(daemon: str) -> None:
    link = _pair(daemon)
    source = bytearray(64)
    address = xmem.address_of(source)
    try:
        link.sender.register_memory(address, 64)
        link.pool.close()
        link.receiver.close()  # the receiver's process is gone as far as the daemon knows
        _wait_for(
            lambda: (
                link.sender.send_direct(link.channel, link.side, address, 8).status
                == XferStatus.PEER_GONE
            )
        )
    finally:
        link.sender.close()


def test_cache_statistics_and_eviction_through_a_small_daemon() -> None:
    directory = tempfile.mkdtemp(prefix="sc-")
    path = os.path.join(directory, "d.sock")
    process = _start_daemon(path, "--cache-entries", "4", "--cache-policy", "fifo")
    try:
        link = _pair(path)
        source = mmap.mmap(-1, 8 * PAGE)
        address = xmem.address_of(source)
        link.sender.register_memory(address, 8 * PAGE)
        for _ in range(3):
            link.pool.post(0, 8 * PAGE)
        assert link.sender.send_direct(link.channel, link.side, address, 2 * PAGE).status == 0
        assert link.sender.send_direct(link.channel, link.side, address, 2 * PAGE).status == 0
        cache = link.sender.status()["cache"]
        assert (cache["misses"], cache["hits"], cache["evictions"]) == (2, 2, 0)
        assert cache["pinned_bytes"] == 2 * PAGE and cache["capacity"] == 4
        assert link.sender.send_direct(link.channel, link.side, address, 6 * PAGE).status == 0
        cache = link.sender.status()["cache"]
        # 6 pages through 4 entries: 2 hits, 4 misses, and the cache never holds more than 4.
        assert (cache["misses"], cache["hits"], cache["evictions"]) == (6, 4, 2)
        assert cache["valid_entries"] == 4 and cache["pinned_bytes"] == 4 * PAGE
        assert cache["pinned_bytes_max"] == 4 * PAGE
        source.close()
        link.close()
    finally:
        _stop(process)
        shutil.rmtree(directory, ignore_errors=True)


def test_pool_requests_are_checked(daemon: str) -> None:
    client = DaemonClient(daemon, start=False)
    n = next(_names)
    try:
        with pytest.raises(DaemonDenied):
            client.open_pool(ShmAddress(f"p{n}", 1), 4, PAGE)  # not its endpoint
        client.create_endpoint(ShmAddress(f"p{n}", 1))
        with pytest.raises(DaemonError) as bad:
            client.open_pool(ShmAddress(f"p{n}", 1), 3, PAGE)
        assert bad.value.code is ErrorCode.BAD_SPEC
        client.open_pool(ShmAddress(f"p{n}", 1), 4, PAGE).close()
        with pytest.raises(DaemonError) as again:
            client.open_pool(ShmAddress(f"p{n}", 1), 4, PAGE)
        assert again.value.code is ErrorCode.IN_USE
        with pytest.raises(DaemonError) as empty:
            client.register_memory(4096, 0)
        assert empty.value.code is ErrorCode.BAD_RANGE
        assert MsgType.DONE in FAST_CODECS
    finally:
        client.close()


# ==================================================================== the request queue


def _results(queue: xmem.RequestQueue, count: int) -> list[tuple[int, int, int, int]]:
    got: list[tuple[int, int, int, int]] = []
    deadline = time.monotonic() + 10
    while len(got) < count:
        result = queue.reap()
        if result is None:
            assert time.monotonic() < deadline, "the daemon never answered the queue"
            time.sleep(0.0005)  # lets the daemon's mover fall asleep: doorbells get exercised
            continue
        got.append(result)
    return got


def test_request_queue_moves_checks_and_answers_in_order(daemon: str) -> None:
    link = _pair(daemon)
    other = _pair(daemon)
    source = bytearray(os.urandom(64 * 1024))
    address = xmem.address_of(source)
    try:
        link.sender.register_memory(address, len(source))
        queue = link.sender.open_queue(8)
        with pytest.raises(DaemonError) as twice:
            link.sender.open_queue(8)
        assert twice.value.code is ErrorCode.IN_USE
        for index in range(4):
            link.pool.post(index * 8192, 8192)
        time.sleep(0.05)  # the mover sleeps now: the first submission rings the doorbell
        assert queue.submit(link.channel, link.side, address + 3, 5000, 1)
        assert queue.submit(other.channel, 0, address, 16, 2)  # not its channel
        assert queue.submit(link.channel, link.side, address + 1000, 8192, 3)
        assert queue.submit(link.channel, link.side, address - 2 * PAGE, 16, 4)  # unregistered
        assert queue.doorbells >= 1
        assert _results(queue, 4) == [
            (1, XferStatus.OK, 5000, link.channel),
            (2, XferStatus.NOT_OWNER, 0, other.channel),
            (3, XferStatus.OK, 8192, link.channel),
            (4, XferStatus.NOT_REGISTERED, 0, link.channel),
        ]
        first, second = link.pool.poll(), link.pool.poll()
        assert first is not None and second is not None
        assert link.pool.data[first.offset : first.offset + 5000] == source[3:5003]
        assert link.pool.data[second.offset : second.offset + 8192] == source[1000:9192]
        assert other.pool.poll() is None
        # A full submission ring pushes back instead of overwriting.
        accepted = sum(queue.submit(link.channel, link.side, address, 16, 9) for _ in range(200))
        assert 8 <= accepted < 200
        assert len(_results(queue, accepted)) == accepted
        # Garbage in its own queue's counters only stops its own queue; the daemon lives.
        queue._words[8] = 1 << 50
        time.sleep(0.05)
        assert link.sender.status()["clients"] >= 2
        queue.close()
    finally:
        link.close()
        other.close()


def test_forged_doorbell_is_refused(daemon: str) -> None:
    from stacklib.daemon import Doorbell

    client = DaemonClient(daemon, start=False)
    try:
        with pytest.raises(DaemonDenied) as forged:
            client.request(Doorbell(1))
        assert forged.value.code is ErrorCode.FORGED_PID
    finally:
        client.close()


# ==================================================================== the kernel's own door

_VICTIM = """
import mmap, sys
from stacklib.daemon import DaemonClient
from stacklib.transports import xmem
from stacklib.transports.shm import RegionSpec, ShmAddress as A
if sys.argv[1] == "protect":
    xmem.protect_process()
m = mmap.mmap(-1, 4096)
m[:6] = b"SECRET"
c = DaemonClient(sys.argv[2], start=False)
c.create_endpoint(A("victim", 1))
grant, fd = c.open_channel(A("victim", 1), A("sink", 1), RegionSpec(1 << 16, 4096))
c.register_memory(xmem.address_of(m), 4096)
print(xmem.address_of(m), grant.channel, grant.side, flush=True)
sys.stdin.readline()
done = c.send_direct(grant.channel, grant.side, xmem.address_of(m), 6)
print(done.status, flush=True)
sys.stdin.readline()
"""

_SNOOP = """
import sys
from stacklib.transports import xmem
buffer = bytearray(6)
try:
    xmem.read_from(int(sys.argv[1]), int(sys.argv[2]), xmem.address_of(buffer), 6)
    print(bytes(buffer).decode())
except OSError as error:
    print(error.errno)
"""


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
@pytest.mark.parametrize("mode", ["protect", "default"])
def test_a_protected_process_is_reachable_only_through_the_daemon(mode: str) -> None:
    """Two processes of one unprivileged uid: by default the kernel lets one read the other;
    once the victim is non-dumpable only the root daemon can, and only as authorized."""
    directory = tempfile.mkdtemp(prefix="sc-")
    os.chmod(directory, 0o755)  # the root daemon's socket must be reachable by nobody
    path = os.path.join(directory, "d.sock")
    allow = os.path.join(directory, "allow")
    with open(allow, "w", encoding="utf-8") as f:
        f.write("* victim:1\n* sink:1\n")  # root's sink and nobody's victim may pair up
    process = _start_daemon(path, "--allow", allow, "--socket-mode", "0666")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    victim = subprocess.Popen(
        [*nobody, "-c", _VICTIM, mode, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    sink = DaemonClient(path, start=False)
    try:
        assert victim.stdout is not None and victim.stdin is not None
        address, _, _ = map(int, victim.stdout.readline().split())
        snoop = subprocess.run(
            [*nobody, "-c", _SNOOP, str(victim.pid), str(address)],
            capture_output=True,
            text=True,
            timeout=20,
        )
        expected = str(errno.EPERM) if mode == "protect" else "SECRET"
        assert snoop.stdout.strip() == expected, snoop.stderr
        # The daemon still moves what the victim sends, into the buffer the sink posted.
        sink.create_endpoint(ShmAddress("sink", 1))
        _, fd = sink.open_channel(ShmAddress("sink", 1), ShmAddress("victim", 1), SPEC)
        os.close(fd)
        pool = sink.open_pool(ShmAddress("sink", 1), 4, PAGE)
        pool.post(0, PAGE)
        victim.stdin.write("\n")
        victim.stdin.flush()
        assert int(victim.stdout.readline()) == XferStatus.OK
        assert bytes(pool.data[:6]) == b"SECRET"
        pool.close()
    finally:
        if victim.stdin is not None:
            victim.stdin.close()
        victim.kill()
        victim.wait()
        if victim.stdout is not None:
            victim.stdout.close()
        sink.close()
        _stop(process)
        shutil.rmtree(directory, ignore_errors=True)


# ==================================================================== shared rings under attack

_ENTRY_FORMATS = [
    (xmem.FREE_ENTRY, xmem._FREE_ENTRY),
    (xmem.DONE_ENTRY, xmem._DONE_ENTRY),
    (xmem.SUBMIT_ENTRY, xmem._SUBMIT),
    (xmem.RESULT_ENTRY, xmem._RESULT),
]


@given(st.sampled_from(range(len(_ENTRY_FORMATS))), st.data())
def test_ring_entry_codecs_agree_with_their_construct_formats(
    which: int, data: st.DataObject
) -> None:
    fmt, codec = _ENTRY_FORMATS[which]
    raw = data.draw(st.binary(min_size=codec.size, max_size=codec.size))
    values = codec.unpack(raw)
    parsed = fmt.parse(raw)
    assert values == tuple(parsed[name] for name in codec.names)
    assert fmt.build(dict(zip(codec.names, values, strict=True))) == codec.pack(*values)


@settings(max_examples=150, deadline=None)
@given(
    st.binary(min_size=0, max_size=256),
    st.lists(st.integers(0, 12), min_size=4, max_size=4),
    st.integers(1, 1 << 20),
)
def test_garbage_in_a_pool_or_queue_never_escapes_its_bounds(
    entries: bytes, counters: list[int], length: int
) -> None:
    """What an owner writes into its own pool or queue (counters, entries) is all it controls:
    the daemon's side then yields only in-bounds buffers or refusals, and never crashes."""
    layout = PoolLayout(4, 4 * PAGE)
    pool = xmem.create_pool(layout, "test-garbage")
    queue_layout = xmem.QueueLayout(4)
    fd, region = xmem.create_queue(queue_layout, "test-garbage-queue")
    queue = xmem.QueueState(fd, region, queue_layout)
    try:
        for target in (pool.region, queue.region):
            words = memoryview(target)[: xmem.POOL_HEADER].cast("Q")
            for word, value in zip((8, 16, 24, 32), counters, strict=True):
                words[word] = value  # counters that may run backwards or too far ahead
            words.release()
            target[xmem.POOL_HEADER : xmem.POOL_HEADER + len(entries)] = entries
        for _ in range(6):
            status, offset, size = pool.take(length)
            if status is XferStatus.OK:
                assert size >= length and offset + size <= layout.data_bytes
            elif status is XferStatus.TOO_LONG:
                assert 0 < size < length and offset + size <= layout.data_bytes
            else:
                assert status is XferStatus.NO_BUFFER
        for _ in range(6):
            if queue.take() is None:
                break
        assert pool.bad_posts <= 4
    finally:
        pool.close()
        queue.close()


async def test_shm_endpoints_through_the_daemon_broker_also_copy_once(daemon: str) -> None:
    """Ring messages and single-copy transfers side by side on one pair of shm endpoints."""
    import trio

    from stacklib.daemon import DaemonBroker
    from stacklib.transports.shm import ShmEndpoint, ShmNetwork
    from stacklib.unet import connect

    broker = DaemonBroker(daemon, start=False)
    workdir = tempfile.mkdtemp(prefix="sc-")
    n = next(_names)
    try:
        with ShmNetwork(directory=workdir, broker=broker, ring_bytes=1 << 18) as network:
            a, b = network.add_node(f"ba{n}"), network.add_node(f"bb{n}")
            ep_a = a.os.create_endpoint(a.os.process("x"), port=1)
            ep_b = b.os.create_endpoint(b.os.process("y"), port=1)
            assert isinstance(ep_a, ShmEndpoint) and isinstance(ep_b, ShmEndpoint)
            ch_a, ch_b = connect(ep_a, ep_b)
            channel, side = broker.direct_channel(ep_a, ch_a)
            assert broker.direct_channel(ep_b, ch_b) == (channel, 1 - side)
            pool = broker.client.open_pool(ShmAddress(f"bb{n}", 1), 4, 1 << 16)
            source = bytearray(os.urandom(40000))
            broker.client.register_memory(xmem.address_of(source), len(source))
            pool.post(0, 1 << 16)
            done = broker.client.send_direct(channel, side, xmem.address_of(source), 40000)
            assert done.status == XferStatus.OK
            assert pool.data[:40000] == source
            with trio.fail_after(5):
                await ep_a.send(ch_a, b"and a ring message")
                assert (await ep_b.recv()).data == b"and a ring message"
            pool.close()
            with pytest.raises(DaemonError, match="not an endpoint of the shm"):
                broker.direct_channel(object(), 0)  # type: ignore[arg-type]
    finally:
        broker.close()
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_benchmark_runs_all_three_paths_and_reports_them() -> None:
    from stacklib.bench.single_copy import bench_single_copy

    result = bench_single_copy(sizes=(65536,), count=16, repeat=1, window=4)
    (row,) = result.rows
    assert row["size"] == "64 KiB" and row["met"] == "-"
    for key in ("single", "queued", "ring"):
        assert isinstance(row[key], float) and row[key] > 0
    assert result.facts["transfers per size and run"] == 16
    # The 64 KiB source, page by page, once (17 pages when it does not start on a page).
    assert result.facts["cache misses"] in (16, 17)
    with pytest.raises(ValueError, match="window"):
        bench_single_copy(count=2, window=4)
