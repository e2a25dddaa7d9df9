"""The U-Net architecture, independent of any network interface (paper 000 §3).

Endpoints with their segments, queues and channel tables; the NI's generic machinery; the OS
service that sets up endpoints and channels and enforces protection; kernel-emulated endpoints.
"""

from __future__ import annotations

from stacklib.unet.endpoint import (
    Channel,
    DropReason,
    Endpoint,
    EndpointConfig,
    EndpointStatistics,
    Message,
    UpcallCondition,
)
from stacklib.unet.ni import NetworkInterface, NIStatistics
from stacklib.unet.node import Node
from stacklib.unet.os_service import AllowAll, AllowList, OSService, Policy, Principal, connect
from stacklib.unet.ring import DescriptorRing
from stacklib.unet.segment import Segment
from stacklib.wire.descriptor import (
    DescriptorStatus,
    Fragment,
    RecvDescriptor,
    RecvKind,
    SendDescriptor,
    SendError,
)

__all__ = [
    "AllowAll",
    "AllowList",
    "Channel",
    "DescriptorRing",
    "DescriptorStatus",
    "DropReason",
    "Endpoint",
    "EndpointConfig",
    "EndpointStatistics",
    "Fragment",
    "Message",
    "NIStatistics",
    "NetworkInterface",
    "Node",
    "OSService",
    "Policy",
    "Principal",
    "RecvDescriptor",
    "RecvKind",
    "Segment",
    "SendDescriptor",
    "SendError",
    "UpcallCondition",
    "connect",
]
