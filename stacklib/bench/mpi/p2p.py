# mypy: ignore-errors
# (A script for the system Python, where mpi4py lives; it is not in the checked environment.)
"""mpi4py between two ranks: ping-pong, message rate and bulk transfer (one JSON line).

A standalone script for the system Python with mpi4py (it does not import stacklib):
``mpirun -n 2 python3 p2p.py [--iterations N] [--messages M] [--bulk-messages B] [--size S]``.
Rank 0 prints ``{"buffer": s, "pickle": s, "read": s, "rma": s, "rate": s, "bulk": s, ...}``:
the mean round trip of ``size``-byte messages with buffer ``Send``/``Recv`` and with pickled
``send``/``recv``, the mean remote read of 8 bytes as a 16-byte request answered with
``Send``/``Recv`` (the shape of a Split-C read over Active Messages) and as one-sided ``Get``,
and the seconds rank 0 took to receive ``M`` ``size``-byte (``B`` 64 KiB) messages that rank 1
sent with ``Send``, from the first arrival to the last, scaled to ``M`` (as
stacklib.bench.real times its streams).  Rank 1 then gets one message back, so neither leaves
while the other still waits.  ``cpus``: each rank's CPUs, as mpirun bound them.
"""

import argparse
import json
import os
import time

from mpi4py import MPI

BULK = 65536
WARMUP = 200


def pingpong_buffer(comm, peer, size, count, lead):
    message = bytearray(size)
    reply = bytearray(size)
    send, recv = comm.Send, comm.Recv
    out, into = [message, MPI.BYTE], [reply, MPI.BYTE]
    start = time.perf_counter()
    if lead:
        for _ in range(count):
            send(out, peer)
            recv(into, peer)
    else:
        for _ in range(count):
            recv(into, peer)
            send(out, peer)
    return (time.perf_counter() - start) / count


def pingpong_pickle(comm, peer, size, count, lead):
    message = bytes(size)
    send, recv = comm.send, comm.recv
    start = time.perf_counter()
    if lead:
        for _ in range(count):
            send(message, peer)
            recv(source=peer)
    else:
        for _ in range(count):
            recv(source=peer)
            send(message, peer)
    return (time.perf_counter() - start) / count


def read_sendrecv(comm, peer, count, lead):
    """A remote read as a request and a reply with buffer Send/Recv: a 16-byte request (what
    Split-C's read carries: kind, size, region, op, offset) answered with the 8 bytes at the
    offset it names, as a Split-C read over Active Messages does at its target."""
    memory = bytearray(range(64))
    request = bytearray(16)
    value = bytearray(8)
    send, recv = comm.Send, comm.Recv
    start = time.perf_counter()
    if lead:
        out, into = [request, MPI.BYTE], [value, MPI.BYTE]
        request[8:12] = (8).to_bytes(4, "little")
        for _ in range(count):
            send(out, peer, 3)
            recv(into, peer, 4)
        if value != memory[8:16]:
            raise SystemExit(f"p2p.py: read {bytes(value)!r}")
    else:
        into = [request, MPI.BYTE]
        view = memoryview(memory)
        for _ in range(count):
            recv(into, peer, 3)
            offset = int.from_bytes(request[8:12], "little")
            send([view[offset : offset + 8], MPI.BYTE], peer, 4)
    return (time.perf_counter() - start) / count


def read_rma(comm, peer, count, lead):
    """A remote read as MPI one-sided ``Get`` of 8 bytes (passive target: ``Lock_all`` once,
    then ``Get`` and ``Flush`` per read); the target waits in a barrier meanwhile."""
    memory = bytearray(range(64))
    window = MPI.Win.Create(memory, 1, comm=comm)
    value = bytearray(8)
    elapsed = 0.0
    if lead:
        window.Lock_all()
        get, flush = window.Get, window.Flush
        into, target = [value, MPI.BYTE], [8, 8, MPI.BYTE]
        for _ in range(WARMUP):
            get(into, peer, target=target)
            flush(peer)
        start = time.perf_counter()
        for _ in range(count):
            get(into, peer, target=target)
            flush(peer)
        elapsed = (time.perf_counter() - start) / count
        window.Unlock_all()
        if value != memory[8:16]:
            raise SystemExit(f"p2p.py: got {bytes(value)!r}")
    comm.Barrier()
    window.Free()
    return elapsed


def stream(comm, peer, size, count, receiver):
    """Rank 1 sends ``count`` messages, rank 0 receives them: seconds at the receiver."""
    buffer = bytearray(size)
    spec = [buffer, MPI.BYTE]
    if not receiver:
        send = comm.Send
        for _ in range(count):
            send(spec, peer, 1)
        comm.Recv([bytearray(1), MPI.BYTE], peer, 2)  # the receiver has everything
        return 0.0
    recv = comm.Recv
    recv(spec, peer, 1)
    start = time.perf_counter()
    for _ in range(count - 1):
        recv(spec, peer, 1)
    elapsed = time.perf_counter() - start
    comm.Send([bytearray(1), MPI.BYTE], peer, 2)
    # The first arrival starts the clock, so count-1 intervals were timed.
    return elapsed * count / max(count - 1, 1)


def main():
    parser = argparse.ArgumentParser(prog="p2p.py")
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--messages", type=int, default=200000)
    parser.add_argument("--bulk-messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=40)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit(f"p2p.py runs on 2 ranks, not {comm.Get_size()}")
    rank = comm.Get_rank()
    peer, lead = 1 - rank, rank == 0
    result = {}
    pingpong_buffer(comm, peer, args.size, WARMUP, lead)
    result["buffer"] = pingpong_buffer(comm, peer, args.size, args.iterations, lead)
    pingpong_pickle(comm, peer, args.size, WARMUP, lead)
    result["pickle"] = pingpong_pickle(comm, peer, args.size, args.iterations, lead)
    read_sendrecv(comm, peer, WARMUP, lead)
    result["read"] = read_sendrecv(comm, peer, args.iterations, lead)
    comm.Barrier()
    result["rma"] = read_rma(comm, peer, args.iterations, lead)
    comm.Barrier()
    result["rate"] = stream(comm, peer, args.size, args.messages, lead)
    comm.Barrier()
    result["bulk"] = stream(comm, peer, BULK, args.bulk_messages, lead)
    cpus = comm.gather(sorted(os.sched_getaffinity(0)), 0)
    if lead:
        result.update(
            cpus=cpus,
            iterations=args.iterations,
            messages=args.messages,
            bulk_messages=args.bulk_messages,
            size=args.size,
            library=MPI.Get_library_version().splitlines()[0].strip(" \0"),
        )
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
