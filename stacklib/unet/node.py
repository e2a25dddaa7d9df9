"""A node: one host with its NI and the OS service that manages it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from stacklib.unet.ni import NetworkInterface
from stacklib.unet.os_service import OSService

if TYPE_CHECKING:
    from stacklib.sim import Host


@attrs.frozen
class Node:
    """A machine on a network: its host (CPU and other modeled resources), NI and OS service."""

    name: str
    host: Host
    ni: NetworkInterface
    os: OSService


def total_drops(nodes: Iterable[Node]) -> dict[str, int]:
    """Drops by reason summed over the NIs of ``nodes`` (a network's ``dropped()``)."""
    total: Counter[str] = Counter()
    for node in nodes:
        total.update(node.ni.dropped)
    return dict(total)
