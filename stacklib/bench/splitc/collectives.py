"""A barrier/all-reduce loop as a Split-C program: the collectives' cost alone.

``collectives`` (``stacklib splitc run collectives --size R --transport shm``) runs ``R``
rounds of a barrier and then an all-reduce of a number every rank can check; its counterpart
in mpi4py is stacklib/bench/mpi/spmd.py (``stacklib bench spmd`` runs both).
"""

from __future__ import annotations

import attrs

from stacklib.bench.splitc.programs import Program, RankResult, Work
from stacklib.layers.splitc import SplitC

__all__ = ["DEFAULT_ROUNDS", "SMALL_ROUNDS", "barrier_reduce"]

#: Rounds of :func:`barrier_reduce` without ``--size`` (and with ``--small``).
DEFAULT_ROUNDS = 1000
SMALL_ROUNDS = 20


def barrier_reduce(rounds: int, *, seed: int = 1) -> Program:
    """``rounds`` times: :meth:`SplitC.barrier`, then :meth:`SplitC.all_reduce` ("sum") of
    ``rank + round``, checked against ``size * (size - 1) / 2 + size * round`` on every rank;
    timed from a barrier to a barrier.  ``seed`` is accepted for the common interface."""
    if rounds < 1:
        raise ValueError(f"collectives needs at least one round, got {rounds}")

    async def program(sc: SplitC) -> RankResult:
        work = Work(sc, None)
        base = sc.size * (sc.size - 1) // 2
        ok = True
        start = await work.begin()
        for index in range(rounds):
            await sc.barrier()
            ok &= int(await sc.all_reduce(sc.rank + index, "sum")) == base + sc.size * index
        finish = await work.end(start, ok)
        everywhere = await sc.all_reduce(int(ok), "min") == 1
        return attrs.evolve(finish, ok=everywhere, detail=f"{rounds} rounds")

    return program
