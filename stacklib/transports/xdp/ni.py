"""The NI of an xdp node: U-Net/FE frames through one AF_XDP socket's rings.

The frames are the ether transport's (:mod:`stacklib.wire.unet_eth`: Ethernet header, 2-byte
length, 1-byte U-Net port, padded to 60 bytes), so an xdp node and an ether node talk to each
other.  A node demultiplexes an arrival by (source MAC, destination port), as U-Net/FE does
(paper 001 §3.1); the XDP program has already sent it only frames for ports granted to this
socket (:mod:`.program`).

Receive (:meth:`XdpNI.progress`): every frame waiting in RX is checked (addressed to this MAC
or broadcast, a length that fits, a channel for its tag), copied into its endpoint, and its
buffer goes back to FILL in one batch.  Send (:meth:`XdpNI.transmit`): the frame is written into
a send buffer of the UMEM and its descriptor into TX; the kernel is woken at once
(``send_nowait``), or once per batch the kernel takes in one wake-up
(:attr:`~stacklib.transports.xdp.xsk.XskSocket.tx_budget`) inside :meth:`XdpEndpoint.send_many`.
Waiting: ``await recv()`` polls for ``spin_time`` seconds, then sleeps in poll(2) on the socket.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from stacklib.errors import ChannelError
from stacklib.sim import Host
from stacklib.transports.ether import EtherAddress, remote_mac
from stacklib.transports.socket_ni import HandleNI
from stacklib.transports.xdp.xsk import XDP_PACKET_HEADROOM, XskSocket
from stacklib.unet.endpoint import Channel, DropReason, Endpoint, Message
from stacklib.unet.ni import Payload
from stacklib.unet.polled import PolledEndpoint
from stacklib.wire import unet_eth
from stacklib.wire.descriptor import DescriptorStatus, SendDescriptor

if TYPE_CHECKING:
    from stacklib.transports.xdp.network import XdpNetwork

__all__ = ["PortGrants", "XdpEndpoint", "XdpNI", "interface_mac", "interface_mtu"]

_HEADER = unet_eth.HEADER_SIZE
_PAD_TO = unet_eth.MIN_FRAME
_ZEROS = bytes(_PAD_TO)
_BROADCAST = b"\xff" * 6
#: The U-Net/FE header (see :mod:`stacklib.wire.unet_eth`) as written from a channel's fixed
#: 14-byte prefix (destination, source, EtherType), and a TX descriptor {addr, len, options}.
_pack_frame_header = struct.Struct(">14sHB").pack_into
_pack_descriptor = struct.Struct("=QII").pack_into
_ETHERTYPE = unet_eth.ETHERTYPE_UNET.to_bytes(2, "big")
_SIOCGIFMTU = 0x8921
_SIOCGIFHWADDR = 0x8927
_WRAP = 0xFFFFFFFF


class PortGrants(Protocol):
    """Whoever holds the port map for this socket: the process itself (root) or the daemon."""

    def grant(self, port: int) -> None:
        """Deliver ``port``'s frames to this socket; raise if another socket holds it."""

    def revoke(self, port: int) -> None:
        """Stop delivering ``port``'s frames."""


def interface_mtu(interface: str) -> int:
    """The interface's MTU, read in this process's namespace (SIOCGIFMTU)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16si", interface.encode()[:15], 0)
        return int(struct.unpack("16si", fcntl.ioctl(sock, _SIOCGIFMTU, request))[1])


def interface_mac(interface: str) -> bytes:
    """The interface's MAC address (SIOCGIFHWADDR): no privilege needed, unlike a packet
    socket, so a process handed its socket by the daemon can ask too."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16s18x", interface.encode()[:15])
        return bytes(fcntl.ioctl(sock, _SIOCGIFHWADDR, request)[18:24])


class XdpNI(HandleNI):
    """The NI of one node: one AF_XDP socket bound to one queue of one interface."""

    kind = "xdp"

    def __init__(
        self, name: str, host: Host, network: XdpNetwork, xsk: XskSocket, grants: PortGrants
    ) -> None:
        mtu = interface_mtu(network.interface)
        # A frame above the MTU vanishes at the peer while the sender sees success: refuse
        # messages that would make one.  Copy mode also puts received data 256 bytes into
        # its chunk.
        room = xsk.layout.frame_size - XDP_PACKET_HEADROOM - _HEADER
        super().__init__(
            name,
            host,
            inline_threshold=network.inline_threshold,
            max_message=min(mtu - (_HEADER - 14), room),
            direct_access=False,
        )
        self._init_waiting()
        self.network = network
        self.interface = network.interface
        self.xsk = xsk
        self.grants = grants
        self.spin_time = network.spin_time
        self._mac_bytes = interface_mac(self.interface)
        self.mac = unet_eth.mac_str(self._mac_bytes)
        self._chunk_mask = ~(xsk.layout.frame_size - 1)
        #: Frames for another MAC (promiscuous or bridged interfaces): not for this node.
        self.ignored = 0
        #: Frames written to TX since the kernel was last woken (batched sends).
        self._unkicked = 0
        self._batching = False

    def _handle(self) -> socket.socket:
        return self.xsk.sock

    def _close_handle(self) -> None:
        self.xsk.close()

    # ---------------------------------------------------------------- set-up
    def address_of(self, endpoint: Endpoint) -> EtherAddress:
        return EtherAddress(self.mac, endpoint.port)

    def attach_endpoint(self, endpoint: Endpoint) -> None:
        if not 0 <= endpoint.port <= 0xFF:
            raise ChannelError(f"{self!r}: U-Net/FE ports are one byte, got {endpoint.port}")
        super().attach_endpoint(endpoint)
        try:
            self.grants.grant(endpoint.port)
        except BaseException:
            super().detach_endpoint(endpoint)
            raise

    def detach_endpoint(self, endpoint: Endpoint) -> None:
        super().detach_endpoint(endpoint)
        if not self.xsk.closed:
            self.grants.revoke(endpoint.port)

    def tags(self, endpoint: Endpoint, remote: object) -> tuple[Hashable, Hashable]:
        mac = remote_mac(self, self._mac_bytes, endpoint, remote)
        port: int = remote.port  # type: ignore[attr-defined]
        # Sent: the frame's fixed first 14 bytes and the port; received: (source, our port).
        prefix = mac + self._mac_bytes + _ETHERTYPE
        return (prefix, port), (mac, endpoint.port)

    # ---------------------------------------------------------------- send path
    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        if not self.write_frame(channel.tx_tag, data):  # type: ignore[arg-type]
            self._tx_blocked = True
            return False
        self.injected(endpoint, descriptor, len(data))
        return True

    def write_frame(self, tag: tuple[bytes, int], data: Payload) -> bool:
        """Put one frame for ``tag`` (from :meth:`tags`) into TX and wake the kernel unless
        batching; False when every send buffer is in flight."""
        xsk = self.xsk
        free = xsk.tx_free
        if not free and not self._make_room():
            return False
        address = free.pop()
        prefix, port = tag
        length = len(data)
        umem = xsk.umem
        _pack_frame_header(umem, address, prefix, length, port)
        end = address + _HEADER + length
        umem[address + _HEADER : end] = data
        size = _HEADER + length
        if size < _PAD_TO:  # the 60-byte minimum frame (paper 001 §3.2), padded with zeros
            umem[end : address + _PAD_TO] = _ZEROS[: _PAD_TO - size]
            size = _PAD_TO
        tx = xsk.tx
        producer = tx.producer[0]
        _pack_descriptor(tx.memory, tx.desc + (producer & tx.mask) * 16, address, size, 0)
        tx.producer[0] = (producer + 1) & _WRAP
        self._unkicked += 1
        if not self._batching or self._unkicked >= self.xsk.tx_budget:
            self._kick()
        return True

    def write_frames(self, tag: tuple[bytes, int], messages: Sequence[Payload]) -> tuple[int, int]:
        """Put ``messages`` (each at most :attr:`max_message`, checked by the caller) into TX
        for ``tag`` in one pass, publishing and waking the kernel once per ``xsk.tx_budget`` frames;
        stops early when every send buffer is in flight.  Returns (messages, bytes) taken."""
        xsk = self.xsk
        free, umem, tx = xsk.tx_free, xsk.umem, xsk.tx
        memory, desc, mask = tx.memory, tx.desc, tx.mask
        prefix, port = tag
        producer = tx.producer[0]
        budget = xsk.tx_budget
        taken = nbytes = batch = 0
        for data in messages:
            if not free:
                tx.producer[0] = producer
                self._unkicked += batch
                batch = 0
                if not self._make_room():
                    break
            address = free.pop()
            length = len(data)
            _pack_frame_header(umem, address, prefix, length, port)
            end = address + _HEADER + length
            umem[address + _HEADER : end] = data
            size = _HEADER + length
            if size < _PAD_TO:
                umem[end : address + _PAD_TO] = _ZEROS[: _PAD_TO - size]
                size = _PAD_TO
            _pack_descriptor(memory, desc + (producer & mask) * 16, address, size, 0)
            producer = (producer + 1) & _WRAP
            taken += 1
            nbytes += length
            batch += 1
            if batch == budget:
                tx.producer[0] = producer
                self._unkicked += batch
                batch = 0
                self._kick()
        if batch:
            tx.producer[0] = producer
            self._unkicked += batch
        if self._unkicked:
            self._kick()
        return taken, nbytes

    def _kick(self) -> None:
        if self.xsk.kick():
            self._unkicked = 0

    def _make_room(self) -> bool:
        """Reclaim sent buffers; wake the kernel for the ones still in TX first."""
        xsk = self.xsk
        if xsk.reclaim():
            return True
        if xsk.tx_pending():
            self._kick()
        return xsk.reclaim() > 0

    def flush(self) -> None:
        """Wake the kernel for frames written but not yet kicked (end of a batch)."""
        if self._unkicked:
            self._kick()

    # ---------------------------------------------------------------- receive path
    def progress(self) -> int:
        """Deliver every frame waiting in RX, refill FILL once, retry refused sends."""
        xsk = self.xsk
        rx = xsk.rx
        consumer = rx.consumer[0]
        count = (rx.producer[0] - consumer) & _WRAP
        delivered = 0
        if count:
            quads, words, mask = rx.quads, rx.words, rx.mask
            umem, view = xsk.umem, xsk.view
            own, chunk = self._mac_bytes, self._chunk_mask
            demux, deliver, limit = self.demux, self.deliver, self.max_message
            returned = []
            for index in range(count):
                slot = (consumer + index) & mask
                address = quads[2 * slot]
                size = words[4 * slot + 2]
                returned.append(address & chunk)
                destination = umem[address : address + 6]
                if destination != own and destination != _BROADCAST:
                    self.ignored += 1
                    continue
                # The program checked the EtherType and that the header is there.
                length = umem[address + 14] << 8 | umem[address + 15]
                if length > size - _HEADER or length > limit:
                    self.drop(DropReason.MALFORMED)
                    continue
                key = (umem[address + 6 : address + 12], umem[address + 16])
                entry = demux.get(key)
                if entry is not None and entry[0].recv_queue.full:
                    self.drop(DropReason.RECV_QUEUE_FULL, entry[0])
                    continue
                start = address + _HEADER
                deliver(key, view[start : start + length])
                delivered += 1
            rx.consumer[0] = (consumer + count) & _WRAP
            xsk.refill(returned)
        elif xsk.fill_pending:
            xsk.refill([])
        if self._unkicked:
            self._kick()
        if self._tx_blocked and (xsk.tx_free or self._make_room()):
            self._tx_blocked = False
            self.resume()
        return delivered

    async def _wait_writable(self) -> None:
        # Copy mode completes sends inside the wake-up call: nothing to sleep on but time.
        await trio.sleep(0.0001)
        self._make_room()

    def socket_statistics(self) -> dict[str, Any]:
        """The kernel's counters for the socket and the program's, beside the NI's own."""
        stats: dict[str, Any] = {"socket": self.xsk.statistics()}
        counters = getattr(self.grants, "counters", None)
        if counters is not None:
            stats["program"] = counters()
        stats["ignored"] = self.ignored
        stats["zero_copy"] = self.xsk.zero_copy
        return stats


class XdpEndpoint(PolledEndpoint):
    """An endpoint whose calls run the NI; ``await recv()`` spins ``spin_time``, then sleeps.

    Fast paths, as on shm: with nothing queued, ``send_nowait`` writes the frame straight from
    the caller's bytes into a UMEM send buffer, and ``poll`` copies the next frame of the RX
    ring straight into the returned message when it is for this endpoint (the UMEM chunk is
    the receive buffer).  Anything else takes the general descriptor path.
    """

    ni: XdpNI

    def poll(self) -> Message | None:
        if self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed:
            return super().poll()
        ni = self.ni
        xsk = ni.xsk
        rx = xsk.rx
        consumer = rx.consumer[0]
        if rx.producer[0] == consumer:
            if ni._unkicked or ni._tx_blocked or xsk.fill_pending:
                ni.progress()
            return None
        slot = consumer & rx.mask
        address = rx.quads[2 * slot]
        umem = xsk.umem
        length = umem[address + 14] << 8 | umem[address + 15]
        entry = ni.demux.get((umem[address + 6 : address + 12], umem[address + 16]))
        if (
            entry is None
            or entry[0] is not self
            or umem[address : address + 6] != ni._mac_bytes
            or length > rx.words[4 * slot + 2] - _HEADER
            or length > ni.max_message
        ):
            return super().poll()  # the general path drops, counts or delivers elsewhere
        start = address + _HEADER
        data = umem[start : start + length]
        rx.consumer[0] = (consumer + 1) & _WRAP
        xsk.give_back(address & ni._chunk_mask)
        self.received += 1
        self.received_bytes += length
        ni.received += 1
        ni.received_bytes += length
        return Message(entry[1], data)

    def recv_many(self, limit: int = 64) -> list[Message]:
        """Up to ``limit`` waiting messages, without waiting (an empty list when none).

        With nothing queued it takes every frame for this endpoint at the head of the RX
        ring in one pass and returns their buffers to FILL at once; the first frame that is
        not (another endpoint's, malformed, for another MAC) ends the pass and the rest go
        through :meth:`poll`.  The contract is :meth:`Endpoint.recv_many`'s."""
        if limit < 1:
            raise ValueError(f"recv_many: limit must be at least 1, got {limit}")
        out: list[Message] = []
        if not (self.recv_queue or self._upcalls or self._upcall_error is not None or self.closed):
            ni = self.ni
            xsk = ni.xsk
            rx = xsk.rx
            consumer = rx.consumer[0]
            count = min((rx.producer[0] - consumer) & _WRAP, limit)
            if count:
                quads, words, mask, umem = rx.quads, rx.words, rx.mask, xsk.umem
                demux, own, chunk, largest = ni.demux, ni._mac_bytes, ni._chunk_mask, ni.max_message
                returned = []
                nbytes = 0
                for index in range(count):
                    slot = (consumer + index) & mask
                    address = quads[2 * slot]
                    length = umem[address + 14] << 8 | umem[address + 15]
                    entry = demux.get((umem[address + 6 : address + 12], umem[address + 16]))
                    if (
                        entry is None
                        or entry[0] is not self
                        or umem[address : address + 6] != own
                        or length > words[4 * slot + 2] - _HEADER
                        or length > largest
                    ):
                        break
                    start = address + _HEADER
                    out.append(Message(entry[1], umem[start : start + length]))
                    returned.append(address & chunk)
                    nbytes += length
                taken = len(out)
                if taken:
                    rx.consumer[0] = (consumer + taken) & _WRAP
                    xsk.refill(returned)
                    self.received += taken
                    self.received_bytes += nbytes
                    ni.received += taken
                    ni.received_bytes += nbytes
        if len(out) < limit:  # the rest, and a closed endpoint's error, the general way
            out += super().recv_many(limit - len(out))
        return out

    def send_nowait(
        self, channel: int, data: bytes | bytearray | memoryview, *, dest_offset: int | None = None
    ) -> SendDescriptor:
        if dest_offset is None and not self.send_queue and not self.closed:
            entry = self.channels.get(channel)
            ni = self.ni
            length = len(data)
            if (
                entry is not None
                and length <= ni.max_message
                and not ni.tx_paused
                and ni.write_frame(entry.tx_tag, data)  # type: ignore[arg-type]
            ):
                inline = data if type(data) is bytes else bytes(data)
                self.sent += 1
                self.sent_bytes += length
                ni.sent += 1
                ni.sent_bytes += length
                return SendDescriptor(channel, (), inline, None, DescriptorStatus.INJECTED)
        return super().send_nowait(channel, data, dest_offset=dest_offset)

    def send_many(self, channel: int, messages: Iterable[bytes | bytearray | memoryview]) -> int:
        """Send ``messages`` in order with one wake-up of the kernel per batch it takes
        (``ni.xsk.tx_budget`` frames); returns how many were taken (fewer when every send
        buffer is in flight, or the send queue filled up).  The contract is
        :meth:`Endpoint.send_many`'s: a closed endpoint, an unknown channel or a message above
        ``max_message`` raises before anything is sent.

        With nothing queued the frames go straight from the caller's bytes into the UMEM in
        one pass (no descriptor objects); otherwise each takes the general path."""
        batch = self._check_batch(channel, messages)
        ni = self.ni
        entry = self.channels[channel]
        if not self.send_queue and not ni.tx_paused:
            taken, nbytes = ni.write_frames(entry.tx_tag, batch)  # type: ignore[arg-type]
            self.sent += taken
            self.sent_bytes += nbytes
            ni.sent += taken
            ni.sent_bytes += nbytes
            return taken
        ni._batching = True
        taken = 0
        try:
            for data in batch:
                try:
                    self.send_nowait(channel, data)
                except trio.WouldBlock:
                    break
                taken += 1
        finally:
            ni._batching = False
            ni.flush()
        return taken


XdpNI.endpoint_class = XdpEndpoint
