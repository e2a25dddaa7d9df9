"""The ``splitc`` recipe workload: one Split-C benchmark program on the recipe's network.

A recipe names the network (``[transport]``: ``sim-atm``, ``sim-fe``, ``memory``, ...), the
endpoints (``[endpoint]``) and the layers: UAM (``[[layers]] kind = "uam"``) and on it Split-C
(``kind = "splitc"``, node i is rank i; left out, this workload makes Split-C over UAM
itself, with the same results).  The workload runs the program SPMD, one rank per node, and
reports each rank's verified result and times, as ``stacklib splitc run`` does::

    [workload]
    kind = "splitc"
    benchmark = "ssortlg"     # a name of ``stacklib splitc list``
    sizes = [4096]            # the program's size arguments (left out: the paper's)
    nodes = 8                 # ranks, one per node
    machine = "atm-003"       # whose computation costs (left out: computation is free in
                              # virtual time, measured in real time)

``machine`` names a machine of :mod:`stacklib.transports.sim.machines` for its CPU costs
only: the network is the recipe's transport, so ``machine = "atm-003"`` over
``kind = "sim-atm"`` with ``host = "ss20"`` is paper 003's ATM cluster, and the same machine
over ``sim-fe`` asks what those workstations would do on Fast Ethernet.  Endpoints and UAM
need room for every peer's window (:func:`stacklib.bench.splitc.cluster.endpoint_config`,
:data:`~stacklib.bench.splitc.cluster.SPLITC_UAM`): the shipped recipes use those values, so
a recipe gives the same times as ``stacklib splitc run`` on the same machine.
"""

from __future__ import annotations

import typing
from typing import Any

import attrs

from stacklib.bench import Session, WorkloadKind, register_workload
from stacklib.bench.result import Column, Result
from stacklib.errors import ConfigError
from stacklib.layers.splitc import SplitC
from stacklib.services import ActiveMessageService
from stacklib.sim import Simulation

__all__ = ["SPLITC", "SplitcWorkloadParams", "run_splitc"]


def _benchmark_known(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    from stacklib.bench.splitc.programs import PAPER_SIZES

    if value not in PAPER_SIZES:
        raise ValueError(
            f"{attribute.name} {value!r} is not a Split-C benchmark "
            f"(known: {', '.join(PAPER_SIZES)})"
        )


def _machine_known(
    instance: object, attribute: attrs.Attribute[str | None], value: str | None
) -> None:
    from stacklib.transports.sim.machines import MACHINES

    if value is not None and value not in MACHINES:
        raise ValueError(
            f"{attribute.name} {value!r} is not a machine (known: {', '.join(MACHINES)})"
        )


@attrs.frozen
class SplitcWorkloadParams:
    """Recipe parameters of the ``splitc`` workload."""

    #: A benchmark of ``stacklib splitc list`` (paper 000 §6, paper 003 §5.1).
    benchmark: str = attrs.field(default="mm4x4", validator=_benchmark_known)
    #: The program's size arguments; empty: the paper's sizes (or the test sizes, ``small``).
    sizes: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    #: The test sizes of stacklib.bench.splitc.programs.SMALL_SIZES instead of the paper's.
    small: bool = False
    #: Ranks, one per node (the recipe builds this many nodes).
    nodes: int = attrs.field(default=2, validator=[attrs.validators.ge(1), attrs.validators.le(64)])
    #: The machine whose computation costs the ranks are charged (virtual time only).
    machine: str | None = attrs.field(default=None, validator=_machine_known)

    def __attrs_post_init__(self) -> None:
        from stacklib.bench.splitc.programs import PAPER_SIZES

        program, paper = PAPER_SIZES[self.benchmark]
        if self.sizes and len(self.sizes) != len(paper):
            raise ValueError(
                f"sizes: {self.benchmark} ({program}) takes {len(paper)} size "
                f"argument{'s' if len(paper) > 1 else ''}, e.g. {list(paper)}; got "
                f"{list(self.sizes)}"
            )
        if any(size < 1 for size in self.sizes):
            raise ValueError(f"sizes must be positive, got {list(self.sizes)}")


async def run_splitc(session: Session, params: SplitcWorkloadParams) -> Result:
    """Run ``params.benchmark`` with one rank on every node of ``session``."""
    import trio

    from stacklib.bench.splitc.cluster import SPLITC_UAM
    from stacklib.bench.splitc.programs import RankResult, make_program
    from stacklib.transports.sim.machines import MACHINES

    services = list(session.services)
    layered = all(isinstance(service, SplitC) for service in services)
    if not layered and not all(isinstance(service, ActiveMessageService) for service in services):
        raise ConfigError(
            "recipe",
            "layers",
            "the splitc workload runs over Split-C or Active Messages: end the layers with "
            "splitc or uam (or run on sim-myrinet-am, whose bottom is GAM's Active Messages)",
        )
    machine = MACHINES[params.machine] if params.machine is not None else None
    program = make_program(
        params.benchmark,
        params.sizes or None,
        machine=machine,
        small=params.small,
        seed=session.world.seed,
    )
    simulated = isinstance(session.world, Simulation)
    if layered:
        # The recipe's splitc layer made every rank (node i is rank i) and closes them.
        ranks = [typing.cast(SplitC, service) for service in services]
    else:
        nodes = list(session.network.nodes.values())
        # Every rank's Split-C before any checkpoint: the recipe opened UAM on every node
        # already, and a request reaching a UAM whose Split-C handlers are not registered yet
        # is dropped (open_splitc's rule, which holds here only if no rank starts before all
        # are made).
        ranks = [
            SplitC(
                typing.cast(ActiveMessageService, service),
                rank,
                session.peers[rank],
                cpu=nodes[rank].host.resource("cpu") if simulated else None,
            )
            for rank, service in enumerate(services)
        ]
    # As run_spmd: long enough for UAM's delayed acknowledgments and one retransmission.
    linger = (SPLITC_UAM.ack_delay_us + SPLITC_UAM.rto_us) * 1e-6
    results: list[RankResult | None] = [None] * len(ranks)

    async def rank_main(sc: SplitC) -> None:
        await sc.barrier()  # every rank is ready, as open_splitc
        results[sc.rank] = await program(sc)
        if not layered:
            await sc.finish(linger)

    async with trio.open_nursery() as nursery:
        for sc in ranks:
            nursery.start_soon(rank_main, sc)
    done = [r for r in results if r is not None]
    return _result(params, done, "virtual" if simulated else "wall")


def _result(params: SplitcWorkloadParams, results: list[Any], clock: str) -> Result:
    rows = [
        {
            "rank": rank,
            "total_ms": r.total * 1e3,
            "compute_ms": r.compute * 1e3,
            "comm_ms": r.comm * 1e3,
            "verified": "yes" if r.ok else "NO",
        }
        for rank, r in enumerate(results)
    ]
    total = max(r.total for r in results)
    compute = sum(r.compute for r in results) / len(results)
    machine = params.machine or "(none: computation is free in virtual time, measured in real)"
    return Result(
        title=f"Split-C {params.benchmark} on {len(results)} ranks ({clock} time)",
        columns=[
            Column("rank", "rank"),
            Column("total_ms", "total", "ms", 3),
            Column("compute_ms", "computation", "ms", 3),
            Column("comm_ms", "communication", "ms", 3),
            Column("verified", "verified"),
        ],
        rows=rows,
        facts={
            "benchmark": params.benchmark,
            "sizes": ",".join(map(str, params.sizes)) or ("small" if params.small else "paper's"),
            "machine": machine,
            "verified": "yes" if all(r.ok for r in results) else "NO: WRONG RESULT",
            "total_s": total,
            "computation_s": compute,
            "communication_s": max(0.0, total - compute),
        },
        notes=(
            "total: the slowest rank, barrier to barrier; computation: mean over ranks; "
            "communication: the rest (as stacklib splitc run)",
        ),
    )


SPLITC = register_workload(
    WorkloadKind(
        name="splitc",
        Params=SplitcWorkloadParams,
        run=run_splitc,
        description="a Split-C benchmark program (paper 000 §6, paper 003 §5.1), one rank per node",
        # Active Messages (Split-C is made over them) or the splitc layer itself.
        requires=(ActiveMessageService, SplitC),
    )
)
