"""The shared-memory transport: U-Net between processes of one host, no system call per message.

Paper 000 §3 takes the kernel off the data path by letting the NI and the process share the
endpoint's memory.  Between two processes of one host there is no NI to trust, so this
transport shares, per channel, exactly what the two endpoints of that channel exchange and
nothing else:

* **A channel region** (a file in a directory under ``/dev/shm``, mapped by both processes)
  holds a header page and two single-producer/single-consumer byte rings, one per direction.
  A process can reach only the regions of its own channels, so garbage it writes reaches only
  the peer of that channel, which validates every record before use (paper 000 §3.2 protection
  by construction: no region holds a third endpoint's data).
* **A ring** is ``ring_bytes`` of records, each an 8-byte header (``length: u32``,
  ``kind: u32``) and the message padded to 16 bytes.  ``tail`` (written only by the producer)
  and ``head`` (written only by the consumer) are free-running byte counters on separate cache
  lines; a record never wraps (a PAD record fills the end of the ring instead).  The message is
  copied once, by the sender, from its segment into the record; the receiving NI copies it from
  the record into the endpoint's receive buffer (or inline descriptor) and only then frees the
  record, so the peer cannot change a message after it was validated.  A full ring is
  back-pressure: the send descriptor stays queued, nothing is lost.
* **Ordering**: the producer writes the record, then the tail; x86-64 keeps stores in order, so
  a consumer that sees the tail sees the record.  (Python has no fences; on weakly ordered CPUs
  this transport would need a C helper.)
* **Receive models** (paper 000 §3.1): polling (:meth:`Endpoint.poll` pulls from the rings);
  blocking (``await ep.recv()`` polls for ``spin_time`` seconds with trio checkpoints, then
  sleeps on the node's wake FIFO after raising a "sleeping" flag in each incoming ring; a sender
  writes one byte to the FIFO only when it sees that flag, so a busy receiver costs the sender no
  system call); upcalls, via :meth:`ShmNI.serve`, which pumps the rings and lets the generic
  endpoint machinery raise them.  Setting the flag and checking the ring race without a fence
  (store-load reordering), so a sleeper never waits longer than ``max_sleep`` before checking
  again: a lost wake-up costs at most that, never a hang.
* **Peer death**: each side records its pid in its half of the header page; a sleeper checks
  the peer with a pidfd (or ``kill(pid, 0)``) and fails the channel with :class:`PeerGone` once
  the ring is drained, as it does when the peer closes the channel.

Set-up is the OS service's job and stays off the data path.  Here a :class:`ChannelBroker`
creates or attaches the region; :class:`FileBroker` does it with files (an atomic ``link`` makes
the creator unique), and the daemon (:mod:`stacklib.daemon`) checks ``SO_PEERCRED`` and passes
region descriptors over a UNIX socket through the same interface.

The package, one job per module: :mod:`~stacklib.transports.shm.region` (layout, header,
brokers), :mod:`~stacklib.transports.shm.ring` (one direction's records),
:mod:`~stacklib.transports.shm.link` (a channel's rings and peer liveness),
:mod:`~stacklib.transports.shm.ni`, :mod:`~stacklib.transports.shm.polling` (the endpoint's
calls that never wait), :mod:`~stacklib.transports.shm.endpoint` (its ``await`` faces) and
:mod:`~stacklib.transports.shm.network`.  Benchmark peer processes live in
:mod:`stacklib.bench.peers.shm`.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from stacklib.errors import PeerGone
from stacklib.sim import World
from stacklib.sim.costs import CostProfile
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.shm.endpoint import ShmEndpoint, relax
from stacklib.transports.shm.link import ShmLink
from stacklib.transports.shm.network import SPIN_TIME, ShmNetwork
from stacklib.transports.shm.ni import ShmNI
from stacklib.transports.shm.region import (
    HEADER_BYTES,
    MAGIC,
    NODE_NAME,
    RECLAIMED_WORD,
    REGION_HEADER,
    SIDE_WORD,
    STATE_ABSENT,
    STATE_ATTACHED,
    STATE_CLOSED,
    VERSION,
    ChannelBroker,
    FileBroker,
    RegionHeader,
    RegionSpec,
    ShmAddress,
    side_of,
)
from stacklib.transports.shm.ring import ALIGN, KIND_MESSAGE, KIND_PAD, RECORD_HEADER, Ring

__all__ = [
    "ALIGN",
    "HEADER_BYTES",
    "KIND_MESSAGE",
    "KIND_PAD",
    "MAGIC",
    "NODE_NAME",
    "RECLAIMED_WORD",
    "RECORD_HEADER",
    "REGION_HEADER",
    "SIDE_WORD",
    "SPIN_TIME",
    "STATE_ABSENT",
    "STATE_ATTACHED",
    "STATE_CLOSED",
    "VERSION",
    "ChannelBroker",
    "FileBroker",
    "PeerGone",
    "RegionHeader",
    "RegionSpec",
    "Ring",
    "ShmAddress",
    "ShmEndpoint",
    "ShmLink",
    "ShmNI",
    "ShmNetwork",
    "ShmParams",
    "relax",
    "side_of",
]


@attrs.frozen
class ShmParams:
    """Recipe parameters of the shm transport."""

    ring_bytes: int = attrs.field(default=1 << 20, validator=attrs.validators.ge(4096))
    max_message: int = attrs.field(default=65535, validator=attrs.validators.ge(1))
    inline_threshold: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    spin_us: float = attrs.field(default=SPIN_TIME * 1e6, validator=attrs.validators.ge(0.0))
    max_sleep_ms: float = attrs.field(default=20.0, validator=attrs.validators.gt(0.0))


def _build(
    world: World, params: ShmParams, names: Sequence[str], profile: CostProfile | None
) -> ShmNetwork:
    network = ShmNetwork(
        world,
        ring_bytes=params.ring_bytes,
        max_message=params.max_message,
        inline_threshold=params.inline_threshold,
        spin_time=params.spin_us * 1e-6,
        max_sleep=params.max_sleep_ms * 1e-3,
    )
    for name in names:
        network.add_node(name, profile)
    return network


register_transport(
    TransportKind(
        name="shm",
        Params=ShmParams,
        build=_build,
        description="U-Net between processes over shared-memory rings; no syscall per message",
        clock="real",
    )
)
