"""Virtual time, resources and cost profiles: the time-and-cost foundation of stacklib.

One code path, two worlds (docs/architecture.md "Time and cost"): :class:`RealWorld`, where modeled
costs cost nothing because real time is spent for real, and :class:`Simulation`, where they hold
named resources of a :class:`Host` in deterministic virtual time.  Run a simulation with
``sim.run(main)`` or ``trio.run(main, clock=sim.clock)``.
"""

from __future__ import annotations

from stacklib.sim.clock import VirtualClock, derive_seed
from stacklib.sim.costs import Citation, Cost, CostProfile, citations, cited, us
from stacklib.sim.resources import Host, Resource
from stacklib.sim.world import RealWorld, Simulation, SimulationStatistics, World

__all__ = [
    "Citation",
    "Cost",
    "CostProfile",
    "Host",
    "RealWorld",
    "Resource",
    "Simulation",
    "SimulationStatistics",
    "VirtualClock",
    "World",
    "citations",
    "cited",
    "derive_seed",
    "us",
]
