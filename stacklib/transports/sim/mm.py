"""U-Net/MM inside the simulated NIs: the PCA-200/Linux and DC21140/NT implementations
(paper 002 §4-§5).

Each NI holds one :class:`~stacklib.unet.mm.MemoryManager` (its TLB and the kernel module) over
one :class:`~stacklib.unet.mm.PhysicalMemory`, and every process owning an endpoint on it has a
paged :class:`~stacklib.unet.mm.AddressSpace` (:meth:`MemoryManagedNI.address_space`).

**Descriptor form.** A send fragment or a free-queue entry names either a segment offset, as in
base-level U-Net, or a virtual address in the owning process's address space: a
:class:`~stacklib.wire.descriptor.Fragment` whose offset has bit 31 (:data:`VIRTUAL`) set
(:func:`virtual`).  The 32-bit offset field of the wire format is unchanged; bit 31 is free
because a user address space of the period is 2 GB (Windows NT 4.0's split; paper 002 §5.2).
A receive descriptor names the buffers it filled the same way, and
:meth:`MemoryManagedNI.read_message` reads them from the address space.

**Transmit.** A descriptor with virtual fragments is translated page by page through the TLB
when the NI takes it; the steps (a hit, or a miss with its handshake, interrupt, pin and unpin)
are charged one after the other on the resources Table 1's profile names (the i960 busy-waits
a miss, paper 002 §5.1.1), and the message goes out once they are done.  A privilege violation
is an error status (:attr:`SendError.PRIVILEGE`).  A paged-out page suspends that endpoint
alone until the deferred page-in completes; the NI keeps serving the others.

**Receive.** Virtual free-queue entries move to the NI's pre-translation queue whenever the NI
looks at the free queue (on each arrival and after each delivery); the first ``pretranslate``
of them are kept translated.  A message goes into virtual buffers when the endpoint has any
posted, otherwise into segment buffers.  An arrival with no pre-translated buffer is dropped and
counted (:attr:`DropReason.NO_FREE_BUFFER`, and ``dropped_no_buffer`` in the TLB statistics).

**Close** invalidates the endpoint's entries and unpins their pages.  The TLB statistics are in
the NI's statistics (:class:`MmNIStatistics`).

Segment-offset descriptors take exactly the base NI's path, so an MM NI without virtual buffers
gives the baseline's numbers.  The Table 1 costs are the 133 MHz Pentium's and are not scaled by
host clock.  The DC21140/NT NI keeps paper 003's DC21140 model underneath (Table 1's NT and Linux
queue handling differ by under 2 us) and adds NT's TLB costs in the trap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import attrs

from stacklib.errors import ConfigError, UNetError
from stacklib.sim import CostProfile, Resource, World
from stacklib.transports import TransportKind, register_transport
from stacklib.transports.sim import (
    AtmParams,
    FastEthernetParams,
    SimCluster,
    build_atm,
    build_fe,
)
from stacklib.transports.sim.atm import I960NI
from stacklib.transports.sim.ethernet import Dc21140NI
from stacklib.transports.sim.ni import SimNI
from stacklib.unet.endpoint import Channel, DropReason, Endpoint
from stacklib.unet.mm.core import (
    BufferReturned,
    MemoryManager,
    MmParams,
    MmStatistics,
    PageInDone,
    Resumed,
    Status,
)
from stacklib.unet.mm.costs import DC21140_NT_MM, PCA200_LINUX_MM
from stacklib.unet.mm.memory import AddressSpace, PhysicalMemory
from stacklib.unet.mm.tlb import TlbGeometry
from stacklib.unet.ni import NIStatistics, Payload
from stacklib.unet.os_service import Principal
from stacklib.wire.descriptor import (
    DescriptorStatus,
    Fragment,
    RecvDescriptor,
    RecvKind,
    SendDescriptor,
    SendError,
)

__all__ = [
    "VIRTUAL",
    "AtmMmParams",
    "Dc21140NtMmNI",
    "FastEthernetMmParams",
    "MemoryManagedNI",
    "MmNIStatistics",
    "MmRecipeParams",
    "Pca200MmNI",
    "is_virtual",
    "virtual",
    "virtual_address",
]

#: Bit 31 of a fragment's offset: the fragment names a virtual address, not a segment offset.
VIRTUAL = 1 << 31


def virtual(address: int, length: int) -> Fragment:
    """A fragment naming ``length`` bytes at virtual ``address`` of the owning process."""
    if not 0 <= address < VIRTUAL or not 0 <= address + length <= VIRTUAL:
        raise UNetError(f"virtual buffer {address:#x}+{length} is outside the 2 GB user space")
    return Fragment(VIRTUAL | address, length)


def is_virtual(fragment: Fragment) -> bool:
    """Whether ``fragment`` names a virtual address."""
    return fragment.offset >= VIRTUAL


def virtual_address(fragment: Fragment) -> int:
    """The virtual address a virtual fragment names."""
    return fragment.offset - VIRTUAL


@attrs.frozen
class MmNIStatistics(NIStatistics):
    """An MM NI's statistics: the base counters plus its TLB's."""

    mm: MmStatistics | None = None


@attrs.define(slots=True, eq=False)
class _Pending:
    descriptor: SendDescriptor
    port: int
    transfers: list[int]
    data: bytes
    #: When the translation steps are done and the data may move.
    ready: float


class MemoryManagedNI(SimNI):
    """U-Net/MM on a simulated NI: mixed in before the NI model's class."""

    mm: MemoryManager
    #: The implementation's paper 002 Table 1 costs; set by each NI class.
    mm_profile: ClassVar[CostProfile]

    def __init__(
        self,
        *args: object,
        mm: MmParams | None = None,
        memory: PhysicalMemory | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._mm_setup(self.mm_profile, mm or self.default_mm_params(), memory)

    @classmethod
    def default_mm_params(cls) -> MmParams:
        """The TLB of this implementation when a recipe gives none."""
        return MmParams()

    def _mm_setup(
        self, profile: CostProfile, params: MmParams, memory: PhysicalMemory | None
    ) -> None:
        self.mm = MemoryManager(params, memory or PhysicalMemory(), profile)
        self._spaces: dict[Principal, AddressSpace] = {}
        self._pending: dict[int, _Pending] = {}
        self._timer_at: float | None = None
        self._waiting_room = False
        #: Free buffers handed back unfilled (page-in late, privilege), oldest first.
        self.returned: list[BufferReturned] = []
        self._cpu = self.host.resource("cpu")
        self._disk = self.host.resource("disk")

    # ------------------------------------------------------------------ processes

    def address_space(self, endpoint: Endpoint) -> AddressSpace:
        """The address space of the process owning ``endpoint`` (one per process and NI)."""
        space = self._spaces.get(endpoint.owner)
        if space is None:
            # Numbered per NI in order of appearance (the TLB hashes the pid): deterministic.
            space = AddressSpace(len(self._spaces) + 1, self.mm.memory)
            self._spaces[endpoint.owner] = space
        return space

    def attach_endpoint(self, endpoint: Endpoint) -> None:
        super().attach_endpoint(endpoint)
        self.mm.open_endpoint(endpoint.port, self.address_space(endpoint))

    def detach_endpoint(self, endpoint: Endpoint) -> None:
        super().detach_endpoint(endpoint)
        if self.mm.is_open(endpoint.port):
            for key in [k for k, p in self._pending.items() if p.port == endpoint.port]:
                del self._pending[key]  # its transfers are released by close_endpoint
            self._charge(self.mm.close_endpoint(endpoint.port), self.world.now(), receive=False)

    # ------------------------------------------------------------------ charging

    def _resource(self, name: str, receive: bool) -> Resource:
        if name == "ni":
            return self._ni_resource(receive)
        if name == "disk":
            return self._disk
        return self._cpu

    def _ni_resource(self, receive: bool) -> Resource:
        return self.engine

    def _charge(self, steps: Sequence[str], start: float, *, receive: bool) -> float:
        """Reserve ``steps`` one after the other from ``start``; when the last one ends.

        The NI's processor waits for the whole sequence (the i960 busy-waits a miss).
        """
        ops = self.mm_profile.ops
        end = start
        for step in steps:
            cost = ops.get(step)
            if cost is None:
                continue  # a step this implementation does not have costs nothing
            resource = self._resource(cost.resource, receive)
            begin = resource.busy_until if resource.busy_until > end else end
            end = begin + cost.seconds()
            resource.busy_until = end
            resource.busy_time += end - begin
            resource.holds += 1
        engine = self._ni_resource(receive)
        if steps and engine.busy_until < end:
            engine.busy_until = end
        return end

    # ------------------------------------------------------------------ deferred page-ins

    def _arm(self) -> None:
        deadline = self.mm.get_timer()
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            self._timer_at = deadline
            self.world.call_at(deadline, self._on_timer, deadline)

    def _on_timer(self, when: float) -> None:
        if self._timer_at != when:
            return  # superseded by an earlier deadline, which re-arms
        self._timer_at = None
        now = self.world.now()
        self.mm.handle_timer(now)
        self._events(now)
        self._arm()

    def _events(self, now: float) -> None:
        """The kernel thread pins each paged-in page; resumed endpoints are served again."""
        resume = now
        woke = False
        while (event := self.mm.next_event()) is not None:
            if isinstance(event, PageInDone):
                resume = max(resume, self._charge(event.steps, now, receive=False))
            elif isinstance(event, Resumed):
                woke = True
            else:
                self.returned.append(event)
        if woke:
            self._schedule_poll(resume)

    # ------------------------------------------------------------------ send path

    def validate(self, endpoint: Endpoint, descriptor: SendDescriptor) -> SendError:
        fragments = descriptor.fragments
        if descriptor.inline is not None or not any(f.offset >= VIRTUAL for f in fragments):
            return super().validate(endpoint, descriptor)
        # Virtual fragments are checked by the TLB when the NI translates them.
        if descriptor.channel not in endpoint.channels:
            return SendError.UNKNOWN_CHANNEL
        if len(fragments) > self.max_fragments:
            return SendError.BAD_SHAPE
        size = endpoint.segment.size
        length = 0
        for offset, part in fragments:
            if part <= 0:
                return SendError.BAD_SHAPE
            if offset < VIRTUAL and offset + part > size:
                return SendError.OUT_OF_BOUNDS
            if offset >= VIRTUAL and offset + part > 2 * VIRTUAL:
                return SendError.OUT_OF_BOUNDS
            length += part
        if length > self.max_message:
            return SendError.TOO_LONG
        if descriptor.dest_offset is not None and not self.direct_access:
            return SendError.DIRECT_UNSUPPORTED
        return SendError.NONE

    def transmit(
        self, endpoint: Endpoint, channel: Channel, descriptor: SendDescriptor, data: Payload
    ) -> bool:
        pending = self._pending.get(id(descriptor))
        if pending is None:
            if descriptor.inline is not None or not any(
                f.offset >= VIRTUAL for f in descriptor.fragments
            ):
                return super().transmit(endpoint, channel, descriptor, data)
            now = self.world.now()
            ready = self.tx_ready(now)
            if ready > now:
                self._schedule_poll(ready)
                return False
            if not self._translate(endpoint, descriptor, now):
                return descriptor.status is DescriptorStatus.ERROR  # popped if in error
            pending = self._pending[id(descriptor)]
        now = self.world.now()
        if pending.ready > now:
            self._schedule_poll(pending.ready)  # the data moves once the steps are done
            return False
        return super().transmit(endpoint, channel, descriptor, pending.data)

    def _translate(self, endpoint: Endpoint, descriptor: SendDescriptor, now: float) -> bool:
        """Translate a descriptor's virtual fragments; True when its transfer may start."""
        mm = self.mm
        port = endpoint.port
        steps: list[str] = []
        transfers: list[int] = []
        parts: list[bytes] = []
        view = endpoint.segment.view
        status = Status.OK
        ready_at: float | None = None
        for offset, length in descriptor.fragments:
            if offset < VIRTUAL:
                parts.append(bytes(view[offset : offset + length]))
                continue
            result = mm.translate_send(now, port, offset - VIRTUAL, length)
            steps += result.steps
            status = result.status
            if status is not Status.OK or result.transfer is None:
                ready_at = result.ready_at
                break
            transfers.append(result.transfer)
            parts.append(mm.dma_read(result.transfer))
        if status is not Status.OK:
            for transfer in transfers:
                steps += mm.complete(transfer)
        end = self._charge(steps, now, receive=False)
        if status is Status.OK:
            self._pending[id(descriptor)] = _Pending(
                descriptor, port, transfers, b"".join(parts), end
            )
            return True
        if status is Status.ERROR:
            self._fail(endpoint, descriptor, SendError.PRIVILEGE, end, now)
        elif status is Status.NO_ROOM and not self._pending:
            # No transfer in flight will free an entry: the buffer needs more pinned pages
            # than the cap allows, so waiting would never end.
            self._fail(endpoint, descriptor, SendError.TOO_LONG, end, now)
        elif status is Status.NO_ROOM:
            self._waiting_room = True  # retried when a transfer completes
        elif ready_at is not None or status is Status.DEFERRED:
            self._arm()  # SUSPENDED: the page-in's own timer resumes it
        return False

    def _fail(
        self,
        endpoint: Endpoint,
        descriptor: SendDescriptor,
        error: SendError,
        end: float,
        now: float,
    ) -> None:
        """End ``descriptor`` with ``error`` (counted); the NI moves on once its steps are done."""
        descriptor.status = DescriptorStatus.ERROR
        descriptor.error = error
        endpoint.send_errors[error.name] += 1
        self.send_errors[error.name] += 1
        if end > now:
            self._schedule_poll(end)  # the next descriptor waits for the NI

    def _tx_done(self, endpoint: Endpoint, descriptor: SendDescriptor, length: int) -> None:
        pending = self._pending.pop(id(descriptor), None)
        if pending is not None and self.mm.is_open(endpoint.port):
            now = self.world.now()
            steps: list[str] = []
            for transfer in pending.transfers:
                steps += self.mm.complete(transfer)
            self._charge(steps, now, receive=False)
            if self._waiting_room:
                self._waiting_room = False
                self._schedule_poll(now)
        super()._tx_done(endpoint, descriptor, length)

    # ------------------------------------------------------------------ receive path

    def _pull(self, endpoint: Endpoint) -> None:
        """Move the virtual entries of ``endpoint``'s free queue to the pre-translation queue."""
        free = endpoint.free_queue
        if not any(entry.offset >= VIRTUAL for entry in free):
            return
        kept: list[Fragment] = []
        while (entry := free.pop()) is not None:
            if entry.offset >= VIRTUAL and entry.length > 0:
                self.mm.post_free(endpoint.port, entry.offset - VIRTUAL, entry.length)
            elif entry.offset >= VIRTUAL:
                self.drop(DropReason.BAD_FREE_BUFFER, endpoint)
            else:
                kept.append(entry)
        for entry in kept:
            free.push(entry)

    def deliver_to(
        self, endpoint: Endpoint, channel: int, data: Payload, dest_offset: int | None
    ) -> None:
        port = endpoint.port
        if (
            dest_offset is not None
            or len(data) <= self.inline_threshold
            or endpoint.closed
            or not self.mm.is_open(port)
        ):
            super().deliver_to(endpoint, channel, data, dest_offset)
            return
        self._pull(endpoint)
        if not self.mm.free_buffers(port):
            super().deliver_to(endpoint, channel, data, dest_offset)
            return
        if len(data) > self.max_message:
            self.drop(DropReason.TOO_LONG, endpoint)
            return
        now = self.world.now()
        mm = self.mm
        steps = list(mm.pretranslate(now, port))
        result = mm.arrival(now, port, len(data))
        steps += result.steps
        end = self._charge(steps, now, receive=True)
        self._events(now)
        self._arm()
        if result.status is not Status.OK or result.transfer is None:
            self.drop(DropReason.NO_FREE_BUFFER, endpoint)
            return
        fragments = tuple(virtual(address, length) for address, length in result.buffers)
        self.world.call_at(
            end, self._deliver_virtual, endpoint, channel, bytes(data), fragments, result.transfer
        )

    def _deliver_virtual(
        self,
        endpoint: Endpoint,
        channel: int,
        data: bytes,
        fragments: tuple[Fragment, ...],
        transfer: int,
    ) -> None:
        """The translated buffers are ready: DMA the message in and push its descriptor."""
        if endpoint.closed or not self.mm.is_open(endpoint.port):
            self.drop(DropReason.ENDPOINT_CLOSED)
            return
        now = self.world.now()
        mm = self.mm
        if endpoint.recv_queue.full:
            mm.complete(transfer)
            self.drop(DropReason.RECV_QUEUE_FULL, endpoint)
            return
        mm.dma_write(transfer, data)
        steps = list(mm.complete(transfer))
        length = len(data)
        endpoint.recv_queue.push(RecvDescriptor(channel, length, RecvKind.BUFFERS, fragments))
        endpoint.received += 1
        endpoint.received_bytes += length
        self.received += 1
        self.received_bytes += length
        endpoint.notify_arrived(length)
        # Keep the next buffers translated while the NI is otherwise idle.
        if mm.is_open(endpoint.port):
            self._pull(endpoint)
            steps += mm.pretranslate(now, endpoint.port)
        self._charge(steps, now, receive=True)
        self._events(now)
        self._arm()

    def read_message(self, endpoint: Endpoint, descriptor: RecvDescriptor) -> bytes:
        """A copy of a received message, from virtual buffers or the segment."""
        if not any(f.offset >= VIRTUAL for f in descriptor.fragments):
            return endpoint.read(descriptor)
        space = self.address_space(endpoint)
        remaining = descriptor.length
        parts: list[bytes] = []
        for fragment in descriptor.fragments:
            take = min(fragment.length, remaining)
            parts.append(space.read(virtual_address(fragment), take))
            remaining -= take
        return b"".join(parts)

    # ------------------------------------------------------------------ statistics

    def statistics(self) -> MmNIStatistics:
        base = super().statistics()
        return MmNIStatistics(**attrs.asdict(base, recurse=False), mm=self.mm.statistics())


class Pca200MmNI(MemoryManagedNI, I960NI):
    """U-Net/MM on the PCA-200: the TLB in the i960 firmware, misses served by Linux
    (paper 002 §5.1)."""

    kind = "pca200-mm"
    mm_profile = PCA200_LINUX_MM

    def _ni_resource(self, receive: bool) -> Resource:
        return self.rx_engine if receive else self.engine


class Dc21140NtMmNI(MemoryManagedNI, Dc21140NI):
    """U-Net/MM on the DC21140 under Windows NT: a software TLB in the kernel, translation in
    the fast trap, a victim list that grows while transmits are pending (paper 002 §5.2)."""

    kind = "dc21140-nt-mm"
    mm_profile = DC21140_NT_MM

    @classmethod
    def default_mm_params(cls) -> MmParams:
        return MmParams(TlbGeometry(victim_grows=True), zero_map_in=False)

    def _ni_resource(self, receive: bool) -> Resource:
        return self.cpu  # the kernel's trap and interrupt handler run on the host


# ---------------------------------------------------------------------- transports


@attrs.frozen
class MmRecipeParams:
    """The U-Net/MM part of a recipe: TLB sizes and pre-translation depth (paper 002 §5)."""

    entries: int = 1024
    ways: int = 1
    victim: int = 16
    #: OS cap on valid entries (pinned pages); 0: no cap.
    max_valid: int = 0
    pretranslate: int = 4

    def build(self, *, victim_grows: bool, zero_map_in: bool) -> MmParams:
        try:
            geometry = TlbGeometry(
                self.entries, self.ways, self.victim, victim_grows, self.max_valid or None
            )
            return MmParams(geometry, zero_map_in, self.pretranslate)
        except ValueError as error:
            raise ConfigError("transport", "mm", str(error)) from error


@attrs.frozen
class AtmMmParams(AtmParams):
    """Recipe parameters of ``sim-atm-mm``: ``sim-atm``'s (PCA-200 only) plus ``mm``."""

    ni: Literal["pca200"] = "pca200"
    link: Literal["taxi-140", "oc-3"] = "oc-3"
    mm: MmRecipeParams = attrs.Factory(MmRecipeParams)


def build_atm_mm(
    world: World, params: AtmMmParams, names: Sequence[str], profile: CostProfile | None
) -> SimCluster:
    mm = params.mm.build(victim_grows=False, zero_map_in=True)
    return build_atm(world, params, names, profile, Pca200MmNI, mm=mm)


@attrs.frozen
class FastEthernetMmParams(FastEthernetParams):
    """Recipe parameters of ``sim-fe-mm``: ``sim-fe``'s plus ``mm``."""

    mm: MmRecipeParams = attrs.Factory(MmRecipeParams)


def build_fe_mm(
    world: World, params: FastEthernetMmParams, names: Sequence[str], profile: CostProfile | None
) -> SimCluster:
    mm = params.mm.build(victim_grows=True, zero_map_in=False)
    return build_fe(world, params, names, profile, Dc21140NtMmNI, mm=mm)


register_transport(
    TransportKind(
        name="sim-atm-mm",
        Params=AtmMmParams,
        build=build_atm_mm,
        description="PCA-200 with U-Net/MM (a TLB in the i960 firmware, misses served by "
        "Linux, paper 002 §5.1) on an ASX-200 switch, in virtual time",
        clock="virtual",
    )
)

register_transport(
    TransportKind(
        name="sim-fe-mm",
        Params=FastEthernetMmParams,
        build=build_fe_mm,
        description="DC21140 with U-Net/MM under Windows NT (a software TLB in the kernel "
        "trap, paper 002 §5.2) on a Fast Ethernet hub or switch, in virtual time",
        clock="virtual",
    )
)
