# mypy: ignore-errors
# (A script for the system Python, where mpi4py lives; it is not in the checked environment.)
"""mpi4py SPMD programs: the small-message radix sort and a barrier/all-reduce loop (one JSON
line), the counterparts of stacklib's Split-C ``rsortsm-store`` and ``collectives``.

A standalone script for the system Python with mpi4py (it does not import stacklib, nor
numpy): ``mpirun -n N python3 spmd.py [--keys K] [--rounds R] [--seed S] [--only sort|reduce]``.
Rank 0 prints ``{"sort": [ok, total, compute], "reduce": [ok, total, compute]}``: verified on
every rank, the longest time a rank spent from a barrier to a barrier (seconds), and the mean
time of the local computation in it.

The sort is the radix sort of paper 003 §5.1 with 8-bit digits: per digit a local histogram,
every rank's histogram to every rank (``allgather``), each key's place in the sorted array,
then every key sent to its place two keys per message (one nonblocking ``Isend`` of the place
and two keys when two neighbouring keys go to neighbouring places, else one key), in the order
of the keys, the receives posted first; the receiver places them.  Verified: sorted on every
rank, ordered across ranks, and the same multiset as the input (count, sum and a sum of
squares modulo a prime).  The loop is ``R`` rounds of ``Barrier`` then ``allreduce`` of a
number that every rank can check.
"""

import argparse
import json
import random
import time
from array import array

from mpi4py import MPI

SENTINEL = 0xFFFFFFFF  # marks the absent second key; never a key
BITS = 8


def keys_of(seed, rank, n):
    rng = random.Random(seed * 1_000_003 + rank)
    return [rng.randrange(SENTINEL) for _ in range(n)]


def fingerprint(keys):
    return [len(keys), sum(keys), sum(k * k % 9973 for k in keys)]


def radix_sort(comm, n, seed):
    rank, p = comm.Get_rank(), comm.Get_size()
    buckets, mask = 1 << BITS, (1 << BITS) - 1
    keys = keys_of(seed, rank, n)
    cur = list(keys)
    clock = time.perf_counter
    compute = 0.0
    comm.Barrier()
    start = clock()
    for shift in range(0, 32, BITS):
        began = clock()
        digits = [(k >> shift) & mask for k in cur]
        hist = [0] * buckets
        for d in digits:
            hist[d] += 1
        compute += clock() - began
        table = comm.allgather(hist)
        began = clock()
        before = [0] * buckets  # keys of lower digits everywhere, and of this digit below rank
        total = 0
        for b in range(buckets):
            before[b] = total + sum(table[r][b] for r in range(rank))
            total += sum(table[r][b] for r in range(p))
        order = sorted(range(n), key=digits.__getitem__)
        ordered = [cur[i] for i in order]
        pos = []
        for i in order:
            d = digits[i]
            pos.append(before[d])
            before[d] += 1
        compute += clock() - began
        # Messages in the keys' order: [place, key, key or SENTINEL] to the place's rank.
        target = [0] * n
        dests, words = [], array("I")
        i = 0
        while i < n:
            d, o = divmod(pos[i], n)
            two = i + 1 < n and pos[i + 1] == pos[i] + 1 and o + 1 < n
            second = ordered[i + 1] if two else SENTINEL
            if d == rank:
                target[o] = ordered[i]
                if two:
                    target[o + 1] = second
            else:
                dests.append(d)
                words.extend((o, ordered[i], second))
            i += 2 if two else 1
        counts = [0] * p
        for d in dests:
            counts[d] += 1
        incoming = comm.alltoall(counts)
        inbox = array("I", bytes(12 * sum(incoming)))
        into, out = memoryview(inbox), memoryview(words)
        requests = []
        slot = 0
        for source in range(p):
            for _ in range(incoming[source]):
                requests.append(comm.Irecv([into[slot : slot + 3], MPI.UNSIGNED], source, 7))
                slot += 3
        comm.Barrier()  # every receive is posted
        for index, d in enumerate(dests):
            requests.append(comm.Isend([out[3 * index : 3 * index + 3], MPI.UNSIGNED], d, 7))
        MPI.Request.Waitall(requests)
        for slot in range(0, len(inbox), 3):
            o = inbox[slot]
            target[o] = inbox[slot + 1]
            if inbox[slot + 2] != SENTINEL:
                target[o + 1] = inbox[slot + 2]
        cur = target
    comm.Barrier()
    total = clock() - start
    # Verify, outside the timed section.
    local = all(cur[i] <= cur[i + 1] for i in range(len(cur) - 1))
    ends = comm.allgather((cur[0], cur[-1]) if cur else None)
    previous, ordered_everywhere = -1, True
    for end in ends:
        if end is not None:
            ordered_everywhere &= end[0] >= previous
            previous = end[1]
    difference = [a - b for a, b in zip(fingerprint(cur), fingerprint(keys), strict=True)]
    same = [sum(column) for column in zip(*comm.allgather(difference), strict=True)]
    ok = comm.allreduce(int(local and ordered_everywhere and not any(same)), op=MPI.MIN) == 1
    return ok, total, compute


def barrier_reduce(comm, rounds):
    rank, p = comm.Get_rank(), comm.Get_size()
    base = p * (p - 1) // 2
    ok = True
    comm.Barrier()
    start = time.perf_counter()
    for i in range(rounds):
        comm.Barrier()
        ok &= comm.allreduce(rank + i, op=MPI.SUM) == base + p * i
    comm.Barrier()
    total = time.perf_counter() - start
    ok = comm.allreduce(int(ok), op=MPI.MIN) == 1
    return ok, total, 0.0


def main():
    parser = argparse.ArgumentParser(prog="spmd.py")
    parser.add_argument("--keys", type=int, default=4096, help="keys per rank")
    parser.add_argument("--rounds", type=int, default=1000, help="barrier/all-reduce rounds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=["sort", "reduce"])
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    result = {}
    if args.only in (None, "sort"):
        result["sort"] = radix_sort(comm, args.keys, args.seed)
    if args.only in (None, "reduce"):
        result["reduce"] = barrier_reduce(comm, args.rounds)
    gathered = comm.gather(result, 0)
    if comm.Get_rank() == 0:
        summary = {
            name: [
                all(r[name][0] for r in gathered),
                max(r[name][1] for r in gathered),
                sum(r[name][2] for r in gathered) / len(gathered),
            ]
            for name in result
        }
        summary["ranks"] = comm.Get_size()
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
