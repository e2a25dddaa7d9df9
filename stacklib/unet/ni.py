"""The network-interface side of U-Net, independent of any hardware (paper 000 §3).

:class:`NetworkInterface` holds what every U-Net NI does, whether it is an i960 running U-Net
firmware, a kernel trap routine driving a DC21140, or an in-process memory transport:

* it services send queues: validates each descriptor against the owner's segment and channel
  table (a bad one gets an error status and nothing is read), stamps the channel's tag, hands
  the message to the transport and marks the descriptor injected;
* it demultiplexes arrivals by tag to (endpoint, channel) and drops unknown tags, counted;
* it fills receive buffers taken from the free queue (several per message if needed), or puts a
  small message inline in the receive descriptor, or, for direct-access U-Net, deposits data
  at the sender-named offset after checking it against the receiver's window;
* it raises the endpoint's upcalls.

The interface a transport writes against (docs/writing-a-transport.md) is public:

* it **implements** :meth:`~NetworkInterface.address_of` (an endpoint's address),
  :meth:`~NetworkInterface.tags` (a channel's transmit tag and receive key) and
  :meth:`~NetworkInterface.transmit` (put one validated message on the network);
* it **calls** :meth:`~NetworkInterface.injected` once a message has left the sender's
  buffers, :meth:`~NetworkInterface.resume` when a backed-up network can take more,
  :meth:`~NetworkInterface.deliver` when a message arrives (or reads :attr:`demux` and calls
  :meth:`~NetworkInterface.deliver_to` itself) and :meth:`~NetworkInterface.drop` for an
  arrival it discards;
* it **may extend** the OS service's set-up hooks (:meth:`~NetworkInterface.attach_endpoint`,
  :meth:`~NetworkInterface.register_channel` and their inverses, calling ``super()``),
  :meth:`~NetworkInterface.validate` (refuse more descriptors) and
  :meth:`~NetworkInterface.doorbell` (when the NI services a send queue).

Modeled NIs override the timing hooks to charge their costs; the memory transport uses the
defaults, which are immediate.  The NI talks to its endpoints only through their public
``notify_*`` methods and queues, and the OS service to the NI only through the set-up hooks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING

import attrs

from stacklib.compiled import mypyc_attr
from stacklib.errors import ChannelError
from stacklib.unet.endpoint import RECV_OP, SEND_OP, Channel, DropReason, Endpoint
from stacklib.wire.descriptor import (
    DescriptorStatus,
    Fragment,
    RecvDescriptor,
    RecvKind,
    SendDescriptor,
    SendError,
)

if TYPE_CHECKING:
    from stacklib.sim import Host
    from stacklib.sim.costs import ProtocolCosts

Payload = bytes | bytearray | memoryview


@attrs.frozen
class NIStatistics:
    """What an NI has seen: messages moved and drops by reason, across all endpoints."""

    sent: int
    sent_bytes: int
    received: int
    received_bytes: int
    send_errors: Mapping[str, int]
    dropped: Mapping[str, int]
    endpoints: int
    channels: int


BufferTrace = Callable[[Endpoint, int, tuple[Fragment, ...]], None]
_installed_trace: BufferTrace | None = None


def install_buffer_trace(trace: BufferTrace | None) -> BufferTrace | None:
    """Give every NI made from now on ``trace`` as its ``buffer_trace`` (None: none); returns
    the one installed before.  U-Net/MM's trace recorder uses it for a recipe's run
    (stacklib/unet/mm/trace.py, paper 002 §6.2).  A module-level setting rather than a class
    attribute, which the compiled NI (``stacklib compile``) would not see."""
    global _installed_trace
    previous, _installed_trace = _installed_trace, trace
    return previous


@mypyc_attr(allow_interpreted_subclasses=True)
class NetworkInterface:
    """Base class of U-Net NIs.  See the module docstring for the division of labour."""

    #: Short name of the NI kind, for recipes and statistics.
    kind = "abstract"
    #: The endpoint class the OS service creates on this NI (transports whose endpoints drive
    #: the NI themselves give their own).
    endpoint_class: type[Endpoint] = Endpoint

    def __init__(
        self,
        name: str,
        host: Host,
        *,
        inline_threshold: int = 64,
        max_message: int = 65535,
        alignment: int = 8,
        max_fragments: int = 16,
        direct_access: bool = False,
    ) -> None:
        self.name = name
        self.host = host
        self.world = host.world
        #: Messages up to this many bytes travel inside the descriptor (paper 000 §3.4).
        self.inline_threshold = inline_threshold
        self.max_message = max_message
        #: Alignment the NI requires of buffers (e.g. for DMA), paper 000 §3.4.
        self.alignment = alignment
        self.max_fragments = max_fragments
        #: Whether senders may name an offset in the destination segment (paper 000 §3.6).
        self.direct_access = direct_access
        self.endpoints: dict[int, Endpoint] = {}
        #: Called with (endpoint, 0 transmit / 1 receive, buffers) for every segment buffer the
        #: NI sends from or fills; None (the default) costs one attribute test.  An NI made while
        #: :func:`install_buffer_trace` has one installed starts with it.
        self.buffer_trace: BufferTrace | None = _installed_trace
        profile = host.profile
        #: Host CPU seconds of a message-level send / receive of n bytes, or None if free.
        #: Modeled NIs set their own; by default the host profile's "unet.send"/"unet.recv".
        self.host_send_cost: Callable[[int], float] | None = None
        self.host_recv_cost: Callable[[int], float] | None = None
        #: Host CPU seconds to deliver an upcall (a UNIX signal on SunOS, paper 000 §4.2.3).
        self.upcall_cost = 0.0
        #: Host CPU seconds per byte of a memory copy on this host (layers that copy data in
        #: and out of the segment, such as Active Messages, charge it); 0 where not modeled.
        self.host_copy_per_byte = 0.0
        #: Host CPU per message of the user-level UDP and TCP on this host (their layers charge
        #: it); None where not modeled.  Simulated transports set it from the host model.
        self.host_protocol: ProtocolCosts | None = None
        if profile is not None:
            if SEND_OP in profile.ops:
                self.host_send_cost = profile.ops[SEND_OP].seconds
            if RECV_OP in profile.ops:
                self.host_recv_cost = profile.ops[RECV_OP].seconds
        #: The tag table, rx_key -> (endpoint, channel id): written only by
        #: :meth:`register_channel` / :meth:`unregister_channel`; a transport reads it to
        #: demultiplex an arrival itself (then :meth:`deliver_to`).
        self.demux: dict[Hashable, tuple[Endpoint, int]] = {}
        #: Whether :meth:`pause_transmit` stopped the send path (read-only for transports).
        self.tx_paused = False
        self.sent = 0
        self.sent_bytes = 0
        self.received = 0
        self.received_bytes = 0
        self.send_errors: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # ------------------------------------------------------------------ a transport implements

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        """The (tx_tag, rx_key) of a channel from ``endpoint`` to ``remote``.

        ``tx_tag`` is what :meth:`transmit` finds in ``channel.tx_tag`` (where to send);
        ``rx_key`` is the key under which arrivals for this channel reach :meth:`deliver`, and
        must be unique on this NI (the OS service refuses a second registration).  Raise
        :class:`ChannelError` if ``remote`` is not an address this NI can reach.
        """
        raise NotImplementedError

    def address_of(self, endpoint: Endpoint) -> object:
        """The address peers use to reach ``endpoint``."""
        raise NotImplementedError

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        """Put one validated message on the network.

        ``data`` may be a view of the sender's segment, valid until the descriptor is marked
        injected.  Return True once the message is taken, after calling :meth:`injected` (or,
        for a message the transport rejects, after setting the descriptor's error status).
        Return False to leave the descriptor queued (the network is backed up); the transport
        then calls :meth:`resume` when it can take more.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ set-up (OS service)

    def attach_endpoint(self, endpoint: Endpoint) -> None:
        """The OS service created ``endpoint`` on this NI (a port must be free)."""
        if endpoint.port in self.endpoints:
            raise ChannelError(f"{self!r} already has an endpoint on port {endpoint.port}")
        self.endpoints[endpoint.port] = endpoint

    def detach_endpoint(self, endpoint: Endpoint) -> None:
        """The OS service closes ``endpoint``: unregister its channels, drop its send queue."""
        for channel in list(endpoint.channels.values()):
            self.unregister_channel(endpoint, channel)
        self.endpoints.pop(endpoint.port, None)
        # Descriptors still queued are dropped with the endpoint: its memory is gone.
        endpoint.send_queue.clear()

    def register_channel(self, endpoint: Endpoint, channel: Channel) -> None:
        """The OS service opens ``channel`` (tags from :meth:`tags`): arrivals keyed
        ``channel.rx_key`` go to ``endpoint``.  :class:`ChannelError` if the key is taken.
        A transport that extends it calls ``super()`` first and undoes its own set-up if that
        raises."""
        owner = self.demux.get(channel.rx_key)
        if owner is not None:
            raise ChannelError(
                f"tag {channel.rx_key!r} on {self!r} is already registered to {owner[0]!r}"
            )
        self.demux[channel.rx_key] = (endpoint, channel.id)
        endpoint.channels[channel.id] = channel

    def unregister_channel(self, endpoint: Endpoint, channel: Channel) -> None:
        """The OS service tears ``channel`` down (later arrivals for it are unknown tags)."""
        if self.demux.get(channel.rx_key, (None, None))[0] is endpoint:
            del self.demux[channel.rx_key]
        endpoint.channels.pop(channel.id, None)

    def is_registered(self, rx_key: Hashable) -> bool:
        """Whether a channel on this NI receives messages tagged ``rx_key``."""
        return rx_key in self.demux

    # ------------------------------------------------------------------ send path

    def doorbell(self, endpoint: Endpoint) -> None:
        """The application pushed a send descriptor: service that endpoint's send queue.

        An NI that polls (the i960) or is entered by a trap (the DC21140 kernel routine) is
        modeled by overriding this to schedule the service at the right time.
        """
        self.service(endpoint)

    def pause_transmit(self) -> None:
        """Stop taking send descriptors, as a backed-up network does (paper 000 §3.1)."""
        self.tx_paused = True

    def resume_transmit(self) -> None:
        """Take send descriptors again and drain every endpoint's send queue."""
        self.tx_paused = False
        self.resume()

    def resume(self) -> None:
        """A transport that refused a message in :meth:`transmit` can take more: service every
        endpoint's send queue again."""
        for endpoint in list(self.endpoints.values()):
            if endpoint.send_queue:
                self.service(endpoint)

    def service(self, endpoint: Endpoint) -> None:
        """Take descriptors off ``endpoint``'s send queue until it is empty or the NI is full
        (:meth:`transmit` returned False or :meth:`pause_transmit` was called)."""
        if endpoint.in_service:
            # Re-entered from a delivery this loop caused (an upcall that replied): the outer
            # loop is still running and will take the new descriptors.
            return
        endpoint.in_service = True
        queue = endpoint.send_queue
        progressed = False
        try:
            while not self.tx_paused:
                descriptor = queue.peek()
                if descriptor is None:
                    break
                error = self.validate(endpoint, descriptor)
                if error is not SendError.NONE:
                    queue.pop()
                    descriptor.status = DescriptorStatus.ERROR
                    descriptor.error = error
                    endpoint.send_errors[error.name] += 1
                    self.send_errors[error.name] += 1
                    progressed = True
                    continue
                channel = endpoint.channels[descriptor.channel]
                inline = descriptor.inline
                if inline is not None:
                    data: Payload = inline
                else:
                    view = endpoint.segment.view
                    fragments = descriptor.fragments
                    if len(fragments) == 1:
                        offset, length = fragments[0]
                        data = view[offset : offset + length]
                    else:
                        data = b"".join(
                            view[offset : offset + length] for offset, length in fragments
                        )
                if not self.transmit(endpoint, channel, descriptor, data):
                    break
                queue.pop()
                progressed = True
                if self.buffer_trace is not None and inline is None:
                    self.buffer_trace(endpoint, 0, descriptor.fragments)
        finally:
            endpoint.in_service = False
        if progressed:
            # Outside the guard: waking senders may push (and so service) more descriptors.
            endpoint.notify_sent()

    def validate(self, endpoint: Endpoint, descriptor: SendDescriptor) -> SendError:
        """Check a send descriptor without touching any data (paper 000 §3.2 protection):
        ``SendError.NONE`` or why it is refused.  A transport may extend it (call ``super()``
        first) to refuse more, e.g. sends on a channel whose peer is gone."""
        channel = endpoint.channels.get(descriptor.channel)
        if channel is None:
            return SendError.UNKNOWN_CHANNEL
        inline = descriptor.inline
        fragments = descriptor.fragments
        if inline is not None:
            if fragments:
                return SendError.BAD_SHAPE
            if len(inline) > self.inline_threshold:
                return SendError.INLINE_TOO_LONG
            length = len(inline)
        else:
            if not fragments or len(fragments) > self.max_fragments:
                return SendError.BAD_SHAPE
            size = endpoint.segment.size
            length = 0
            for offset, part in fragments:
                if offset < 0 or part < 0 or offset + part > size:
                    return SendError.OUT_OF_BOUNDS
                length += part
        if length > self.max_message:
            return SendError.TOO_LONG
        if descriptor.dest_offset is not None and not self.direct_access:
            return SendError.DIRECT_UNSUPPORTED
        return SendError.NONE

    def injected(self, endpoint: Endpoint, descriptor: SendDescriptor, length: int) -> None:
        """Mark a descriptor injected: its buffers may be reused (paper 000 §3.1).  A
        transport calls it from :meth:`transmit` once ``length`` bytes left the segment."""
        descriptor.status = DescriptorStatus.INJECTED
        endpoint.sent += 1
        endpoint.sent_bytes += length
        self.sent += 1
        self.sent_bytes += length

    # ------------------------------------------------------------------ receive path

    def deliver(self, rx_key: Hashable, data: Payload, dest_offset: int | None = None) -> None:
        """A message tagged ``rx_key`` arrived: demultiplex it and hand it to its endpoint.

        What a transport calls for every arrival.  ``data`` is copied before this returns, so
        it may be a view of a reused buffer.  An unknown tag is dropped and counted.
        """
        entry = self.demux.get(rx_key)
        if entry is None:
            self.dropped[DropReason.UNKNOWN_TAG] += 1
            return
        self.deliver_to(entry[0], entry[1], data, dest_offset)

    def drop(self, reason: DropReason, endpoint: Endpoint | None = None) -> None:
        """Count a message dropped for ``reason`` (on the endpoint too, when known)."""
        self.dropped[reason] += 1
        if endpoint is not None:
            endpoint.dropped[reason] += 1

    def deliver_to(
        self, endpoint: Endpoint, channel: int, data: Payload, dest_offset: int | None
    ) -> None:
        """Place one message into ``endpoint`` and push its receive descriptor, or drop it
        (counted) when the endpoint is closed, the queue is full or buffers run out.

        For a transport that demultiplexed the arrival itself (from :attr:`demux`).
        """
        if endpoint.closed:
            self.drop(DropReason.ENDPOINT_CLOSED)
            return
        length = len(data)
        if length > self.max_message:
            self.drop(DropReason.TOO_LONG, endpoint)
            return
        recv_queue = endpoint.recv_queue
        if recv_queue.full:
            self.drop(DropReason.RECV_QUEUE_FULL, endpoint)
            return
        if dest_offset is None and length <= self.inline_threshold:
            # The small-message case first (the branch below, taken without the others' tests).
            # Positional (channel, length, kind, fragments, inline): cheaper than a keyword.
            descriptor = RecvDescriptor(channel, length, RecvKind.INLINE, (), bytes(data))
        elif dest_offset is not None:
            if not endpoint.config.direct_access:
                self.drop(DropReason.DIRECT_NOT_ENABLED, endpoint)
                return
            start, end = endpoint.direct_window
            if dest_offset < start or dest_offset + length > end:
                self.drop(DropReason.DIRECT_OUT_OF_BOUNDS, endpoint)
                return
            endpoint.segment.view[dest_offset : dest_offset + length] = data
            descriptor = RecvDescriptor(channel, length, RecvKind.DIRECT, dest_offset=dest_offset)
        else:
            buffers = self._take_buffers(endpoint, length)
            if buffers is None:
                return
            if self.buffer_trace is not None:
                self.buffer_trace(endpoint, 1, buffers)
            view = endpoint.segment.view
            if len(buffers) == 1:
                offset = buffers[0].offset
                view[offset : offset + length] = data
            else:
                source = memoryview(data)
                position = 0
                for offset, size in buffers:
                    take = min(size, length - position)
                    view[offset : offset + take] = source[position : position + take]
                    position += take
            descriptor = RecvDescriptor(channel, length, RecvKind.BUFFERS, fragments=buffers)
        recv_queue.push(descriptor)
        endpoint.received += 1
        endpoint.received_bytes += length
        self.received += 1
        self.received_bytes += length
        endpoint.notify_arrived(length)

    def _take_buffers(self, endpoint: Endpoint, length: int) -> tuple[Fragment, ...] | None:
        """Pop enough valid free buffers for ``length`` bytes, or drop the message (None).

        Free-queue entries are the application's writes into NI-visible memory, so they are
        checked here, when the NI uses them: one outside the segment or misaligned is
        discarded and counted.  If the queue runs dry the message is dropped and the buffers
        already taken go back to the front of the queue's order (they are pushed back).
        """
        free = endpoint.free_queue
        segment = endpoint.segment
        taken: list[Fragment] = []
        total = 0
        while total < length:
            buffer = free.pop()
            if buffer is None:
                for kept in taken:
                    free.push(kept)
                self.drop(DropReason.NO_FREE_BUFFER, endpoint)
                return None
            offset, size = buffer
            if size <= 0 or not segment.contains(offset, size) or not segment.is_aligned(offset):
                self.drop(DropReason.BAD_FREE_BUFFER, endpoint)
                continue
            taken.append(buffer)
            total += size
        return tuple(taken)

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> NIStatistics:
        """A snapshot of the NI's counters."""
        return NIStatistics(
            sent=self.sent,
            sent_bytes=self.sent_bytes,
            received=self.received,
            received_bytes=self.received_bytes,
            send_errors=dict(self.send_errors),
            dropped=dict(self.dropped),
            endpoints=len(self.endpoints),
            channels=len(self.demux),
        )
