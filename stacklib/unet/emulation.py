"""Kernel-emulated endpoints (paper 000 §3.5).

Communication segments and queues are scarce, and many applications do not need U-Net's full
performance, yet one interface for all of them is worth having.  The kernel therefore offers
emulated endpoints: to the application they are ordinary :class:`~stacklib.unet.Endpoint`
objects, but the kernel multiplexes all of them onto one real endpoint.

:class:`EmulatedNI` is that kernel service, written as an NI so that every piece of endpoint
logic (validation, buffers, inline messages, upcalls, statistics) is shared with real NIs:

* sending, it copies the message into the real endpoint's send buffers behind a two-byte
  multiplexing header (destination and source emulated port) and sends it on the real channel
  to the peer host's kernel endpoint;
* receiving, an upcall on the real endpoint (the interrupt) takes each message, reads the header
  and delivers the rest into the emulated endpoint whose tag it names, a second copy.

Wire format of the multiplexing header::

     0       1       2
    +-------+-------+----------------
    | dport | sport | message ...
    +-------+-------+----------------
"""

from __future__ import annotations

import typing
from collections.abc import Hashable
from typing import TYPE_CHECKING

import attrs
import construct
import trio

from stacklib.errors import ChannelError, FormatError
from stacklib.unet.endpoint import Channel, DropReason, Endpoint, EndpointConfig, UpcallCondition
from stacklib.unet.ni import NetworkInterface, Payload
from stacklib.wire.codec import derive_codec
from stacklib.wire.descriptor import SendDescriptor

if TYPE_CHECKING:
    from stacklib.unet.os_service import OSService


class EmulationFormatError(FormatError):
    """A kernel-emulation frame too short to hold its multiplexing header."""


#: The multiplexing header, the single source of truth for the fast codec below.
MUX_HEADER = construct.Struct(
    "dport" / construct.Int8ub,
    "sport" / construct.Int8ub,
)
_MUX = derive_codec(MUX_HEADER, EmulationFormatError)


def build_frame(dport: int, sport: int, message: Payload) -> bytes:
    """The frame the kernel sends on its real channel for one emulated message."""
    return _MUX.pack(dport, sport) + bytes(message)


def parse_frame(frame: bytes) -> tuple[int, int, memoryview]:
    """(destination port, source port, message) of a frame; :class:`EmulationFormatError` if
    it is shorter than the header."""
    dport, sport = _MUX.unpack(frame)
    return dport, sport, memoryview(frame)[_MUX.size :]


@attrs.frozen
class EmulatedAddress:
    """An emulated endpoint: its host kernel's real endpoint address and an emulated port."""

    kernel: object
    port: int


class EmulatedNI(NetworkInterface):
    """The kernel's emulation of U-Net endpoints over one real endpoint of ``os_service``."""

    kind = "emulated"

    def __init__(self, os_service: OSService, config: EndpointConfig | None = None) -> None:
        real_ni = os_service.ni
        super().__init__(
            f"{real_ni.name}/emulated",
            real_ni.host,
            inline_threshold=real_ni.inline_threshold,
            max_message=real_ni.max_message - _MUX.size,
            alignment=real_ni.alignment,
            direct_access=False,
        )
        self.os_service = os_service
        self.real = os_service.create_endpoint(os_service.kernel, config)
        self.real.set_upcall(UpcallCondition.NON_EMPTY, self._interrupt)
        self.real.on_send_space = self.resume
        self._kernel_channels: dict[object, int] = {}

    def address_of(self, endpoint: Endpoint) -> EmulatedAddress:
        return EmulatedAddress(self.real.address, endpoint.port)

    def _kernel_channel(self, kernel: object) -> int:
        channel = self._kernel_channels.get(kernel)
        if channel is None:
            os_service = self.os_service
            channel = os_service.create_channel(os_service.kernel, self.real, kernel)
            self._kernel_channels[kernel] = channel
        return channel

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        if not isinstance(remote, EmulatedAddress):
            raise ChannelError(f"{self!r} cannot reach {remote!r}: not an EmulatedAddress")
        channel = self._kernel_channel(remote.kernel)
        return (channel, remote.port, endpoint.port), (channel, remote.port, endpoint.port)

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        real_channel, dport, sport = typing.cast(tuple[int, int, int], channel.tx_tag)
        try:
            self.real.send_nowait(real_channel, build_frame(dport, sport, data))
        except trio.WouldBlock:
            return False  # the real endpoint is backed up; on_send_space resumes us
        self.injected(endpoint, descriptor, len(data))
        return True

    def _interrupt(self, real: Endpoint) -> None:
        """The real endpoint's receive upcall: demultiplex every pending message."""
        while (message := real.poll()) is not None:
            try:
                dport, sport, payload = parse_frame(message.data)
            except EmulationFormatError:
                self.drop(DropReason.MALFORMED)
                continue
            self.deliver((message.channel, sport, dport), payload)
