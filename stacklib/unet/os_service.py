"""The operating-system service of U-Net: set-up and protection, never the data path.

Paper 000 §3.2: an OS service helps the application find the tag for a destination, performs
the authentication and authorization checks, registers the tag with the NI and returns a channel
identifier.  Protection then holds by two mechanisms: endpoints, segments and queues are only
accessible to their owner, and the NI tags outgoing messages from the channel table and delivers
incoming ones only to the endpoint their tag maps to.

In one Python process a :class:`Principal` stands for a process; the :class:`Endpoint` object is
the capability and the service hands it only to its owner.  Every set-up request names the
requesting principal and is checked against the endpoint's owner and the :class:`Policy`.
Real transports (shm) back the same interface with a daemon that identifies processes by
their credentials.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Protocol

import attrs

from stacklib.errors import ChannelError, PermissionDenied
from stacklib.unet.endpoint import Channel, Endpoint, EndpointConfig
from stacklib.unet.ni import NetworkInterface

_pids = itertools.count(1)


@attrs.frozen(eq=False)
class Principal:
    """A process, as the OS service knows it.  Compared by identity."""

    name: str
    pid: int = attrs.field(factory=lambda: next(_pids))

    def __repr__(self) -> str:
        return f"<Principal {self.name} pid={self.pid}>"


class Policy(Protocol):
    """Authorization of channel set-up: None to allow, or the reason for refusing."""

    def check_channel(
        self, principal: Principal, endpoint: Endpoint, remote: object
    ) -> str | None: ...


class AllowAll:
    """The default policy: any process may open a channel to any address it can reach."""

    def check_channel(self, principal: Principal, endpoint: Endpoint, remote: object) -> str | None:
        return None


@attrs.define
class AllowList:
    """Allow only the listed (principal name, remote) pairs, e.g. routes a cluster assigned."""

    allowed: set[tuple[str, object]] = attrs.field(factory=set)

    def allow(self, principal: Principal | str, remote: object) -> None:
        name = principal if isinstance(principal, str) else principal.name
        self.allowed.add((name, remote))

    def check_channel(self, principal: Principal, endpoint: Endpoint, remote: object) -> str | None:
        if (principal.name, remote) in self.allowed:
            return None
        return f"{principal.name} is not authorized to open a channel to {remote!r}"


class OSService:
    """Creates endpoints and channels on one NI for the processes of one host."""

    def __init__(
        self,
        ni: NetworkInterface,
        *,
        policy: Policy | None = None,
        first_port: int = 1,
        max_port: int = 255,
    ) -> None:
        self.ni = ni
        self.policy: Policy = policy if policy is not None else AllowAll()
        self._first_port = first_port
        self._max_port = max_port
        self.principals: dict[int, Principal] = {}
        self.kernel = self.process("kernel")
        self._emulation: NetworkInterface | None = None
        self.emulation_config: EndpointConfig | None = None

    def __repr__(self) -> str:
        return f"<OSService on {self.ni.name}>"

    def process(self, name: str) -> Principal:
        """Register a process and return its identity."""
        principal = Principal(name)
        self.principals[principal.pid] = principal
        return principal

    def _check_owner(self, principal: Principal, endpoint: Endpoint) -> None:
        if endpoint.os is not self:
            raise PermissionDenied(f"{endpoint!r} does not belong to {self!r}")
        if endpoint.owner is not principal:
            raise PermissionDenied(f"{principal!r} does not own {endpoint!r}")

    @property
    def emulation(self) -> NetworkInterface:
        """The kernel emulation of endpoints on this host (paper 000 §3.5), made on first use.

        It takes one real endpoint, owned by the kernel, configured by ``emulation_config``.
        """
        if self._emulation is None:
            from stacklib.unet.emulation import EmulatedNI

            self._emulation = EmulatedNI(self, self.emulation_config)
        return self._emulation

    def _free_port(self, ni: NetworkInterface, wanted: int | None) -> int:
        used = ni.endpoints
        if wanted is not None:
            if not self._first_port <= wanted <= self._max_port:
                raise ChannelError(
                    f"port {wanted} outside {self._first_port}..{self._max_port} on {ni!r}"
                )
            if wanted in used:
                raise ChannelError(f"port {wanted} on {ni!r} is in use")
            return wanted
        for port in range(self._first_port, self._max_port + 1):
            if port not in used:
                return port
        raise ChannelError(f"no free endpoint port on {ni!r}")

    def create_endpoint(
        self,
        owner: Principal,
        config: EndpointConfig | None = None,
        *,
        port: int | None = None,
        emulated: bool = False,
    ) -> Endpoint:
        """Allocate an endpoint for ``owner`` on this host's NI.

        With ``emulated=True`` the endpoint is a kernel-emulated one (paper 000 §3.5): the same
        API, multiplexed by the kernel over a single real endpoint.
        """
        if owner.pid not in self.principals or self.principals[owner.pid] is not owner:
            raise PermissionDenied(f"{owner!r} is not a process of {self!r}")
        ni = self.emulation if emulated else self.ni
        endpoint = ni.endpoint_class(
            port=self._free_port(ni, port),
            owner=owner,
            ni=ni,
            os_service=self,
            config=config if config is not None else EndpointConfig(),
        )
        ni.attach_endpoint(endpoint)
        return endpoint

    def create_channel(self, principal: Principal, endpoint: Endpoint, remote: object) -> int:
        """Open a channel from ``endpoint`` to the endpoint at address ``remote``.

        Checks ownership and the policy, asks the NI for the channel's tags, refuses a tag that
        is already registered (no process can capture another's traffic), registers it and
        returns the channel id the application names in send descriptors.
        """
        self._check_owner(principal, endpoint)
        endpoint.check_open()
        reason = self.policy.check_channel(principal, endpoint, remote)
        if reason is not None:
            raise PermissionDenied(reason)
        tx_tag, rx_key = endpoint.ni.tags(endpoint, remote)
        channel_id = next(i for i in itertools.count() if i not in endpoint.channels)
        endpoint.ni.register_channel(endpoint, Channel(channel_id, remote, tx_tag, rx_key))
        return channel_id

    def destroy_channel(self, principal: Principal, endpoint: Endpoint, channel_id: int) -> None:
        """Tear a channel down; later sends on it fail with UNKNOWN_CHANNEL."""
        self._check_owner(principal, endpoint)
        endpoint.ni.unregister_channel(endpoint, endpoint.channel(channel_id))

    def close_endpoint(self, principal: Principal, endpoint: Endpoint) -> None:
        """Close an endpoint: unregister its channels, drop its queues, wake its waiters."""
        self._check_owner(principal, endpoint)
        endpoint.ni.detach_endpoint(endpoint)
        endpoint.notify_closed()

    def reclaim(self, principal: Principal) -> int:
        """A process died: close every endpoint it owned.  Returns how many."""
        nis = [self.ni] if self._emulation is None else [self.ni, self._emulation]
        owned = [ep for ni in nis for ep in ni.endpoints.values() if ep.owner is principal]
        for endpoint in owned:
            self.close_endpoint(principal, endpoint)
        self.principals.pop(principal.pid, None)
        return len(owned)

    def tag_in_use(self, rx_key: Hashable) -> bool:
        """Whether a channel on this host's NI already receives messages tagged ``rx_key``."""
        return self.ni.is_registered(rx_key)


def connect(a: Endpoint, b: Endpoint) -> tuple[int, int]:
    """Open the two halves of a channel between endpoints ``a`` and ``b`` (each by its owner).

    Returns (channel id at ``a``, channel id at ``b``).  A convenience for programs that own
    both ends, such as tests and the workloads of recipes.
    """
    channel_a = a.os.create_channel(a.owner, a, b.address)
    try:
        channel_b = b.os.create_channel(b.owner, b, a.address)
    except BaseException:
        a.os.destroy_channel(a.owner, a, channel_a)
        raise
    return channel_a, channel_b
