"""A shm network: the nodes of this process whose endpoints talk through shared memory."""

from __future__ import annotations

import os
import shutil
import tempfile

from stacklib.sim import Host, RealWorld, World
from stacklib.sim.costs import CostProfile
from stacklib.transports.shm.ni import ShmNI
from stacklib.transports.shm.region import NODE_NAME, ChannelBroker, FileBroker, RegionSpec
from stacklib.unet.node import Node, total_drops
from stacklib.unet.os_service import OSService, Policy

#: Seconds a blocking call polls before it sleeps (a wake-up across CPUs costs 27-65 us on
#: these machines, so spinning about that long first is cheaper on a busy channel).
SPIN_TIME = 50e-6
#: Seconds ``await recv()`` polls without yielding to other tasks first: longer than a round
#: trip on a busy channel (a few microseconds), short enough not to starve other tasks.
HOT_SPIN = 20e-6


class ShmNetwork:
    """Nodes whose endpoints talk through shared memory in ``directory``.

    Every process that takes part makes its own ``ShmNetwork`` on the same directory and adds
    its own node(s); channels name remote nodes by name (:class:`ShmAddress`), which may live in
    another process.  Without a directory a private one is made under /dev/shm and removed by
    :meth:`close`.
    """

    kind = "shm"

    def __init__(
        self,
        world: World | None = None,
        *,
        directory: str | None = None,
        ring_bytes: int = 1 << 20,
        max_message: int = 65535,
        inline_threshold: int = 64,
        alignment: int = 8,
        spin_time: float = SPIN_TIME,
        hot_spin: float = HOT_SPIN,
        max_sleep: float = 0.02,
        broker: ChannelBroker | None = None,
    ) -> None:
        self.world = world if world is not None else RealWorld()
        if self.world.virtual:
            raise ValueError("the shm transport runs in real time only")
        if spin_time < 0 or hot_spin < 0 or max_sleep <= 0:
            raise ValueError("spin_time and hot_spin must be >= 0 and max_sleep > 0")
        self.spec = RegionSpec(ring_bytes, max_message)
        self.inline_threshold = inline_threshold
        self.alignment = alignment
        #: Seconds a blocking call polls before it sleeps (:data:`SPIN_TIME`).
        self.spin_time = spin_time
        #: Seconds ``await recv()`` polls without yielding first (:data:`HOT_SPIN`).
        self.hot_spin = hot_spin
        #: Longest sleep before re-checking rings and peers (bounds a lost wake-up).
        self.max_sleep = max_sleep
        self.owns_directory = directory is None
        if directory is None:
            base = "/dev/shm" if os.path.isdir("/dev/shm") else None
            directory = tempfile.mkdtemp(prefix="stacklib-shm-", dir=base)
        self.directory = directory
        self.broker: ChannelBroker = broker if broker is not None else FileBroker(directory)
        self.nodes: dict[str, Node] = {}

    def add_node(
        self, name: str, profile: CostProfile | None = None, *, policy: Policy | None = None
    ) -> Node:
        """Add a node (host, NI, OS service) named ``name`` in this process."""
        if not NODE_NAME.match(name):
            raise ValueError(f"node name {name!r} must match {NODE_NAME.pattern}")
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        host = Host(name, self.world, profile)
        ni = ShmNI(name, host, self)
        node = Node(name, host, ni, OSService(ni, policy=policy))
        self.nodes[name] = node
        return node

    def dropped(self) -> dict[str, int]:
        """Drops by reason summed over this process's NIs."""
        return total_drops(self.nodes.values())

    def close(self) -> None:
        """Close this process's nodes; remove the directory if this network made it."""
        for node in self.nodes.values():
            ni = node.ni
            if isinstance(ni, ShmNI):
                ni.close()
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ShmNetwork:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
