"""The exceptions stacklib raises.

Two families, kept apart on purpose (see docs/architecture.md, "Bad input and misuse"):

* Malformed input from the network is never an exception that escapes a layer: layers drop it and
  count the reason in their statistics.  Parsers raise :class:`FormatError` (one subclass per wire
  format) and the layer that called the parser catches it.
* Misuse of an API by the program (a descriptor outside the segment through a helper, a channel
  the caller does not own, a stack whose layers do not fit) raises an exception that names the
  problem.

Closing follows trio: an operation on an endpoint its owner (or the OS service) closed raises
:class:`EndpointClosed`, a :class:`trio.ClosedResourceError`; a channel whose peer process left
raises :class:`PeerGone`, a :class:`trio.BrokenResourceError`.  So ``async for`` over an endpoint
or a datagram service ends when it is closed, and ``except trio.BrokenResourceError`` (or
``PeerGone``) is how a program handles a peer that finished first.
"""

from __future__ import annotations

import trio


class StacklibError(Exception):
    """Base class of every exception stacklib raises on purpose."""


class FormatError(StacklibError, ValueError):
    """Malformed bytes for a wire format.  Each format module defines one subclass."""


class ConfigError(StacklibError, ValueError):
    """A recipe or parameter set is invalid.

    The message names where the problem is (file and key path) and why.
    """

    def __init__(self, where: str, key: str, reason: str) -> None:
        self.where = where
        self.key = key
        self.reason = reason
        location = f"{where}: {key}" if key else where
        super().__init__(f"{location}: {reason}")


class UNetError(StacklibError):
    """Misuse of the U-Net interface (paper 000 §3)."""


class PermissionDenied(UNetError, PermissionError):
    """The OS service refused a request: wrong owner, unauthorized tag or route."""


class ChannelError(UNetError):
    """A channel cannot be created or used: unknown id, tag already registered, closed."""


class SegmentError(UNetError, IndexError):
    """An access through the API falls outside a communication segment."""


class EndpointClosed(UNetError, trio.ClosedResourceError):
    """The endpoint was closed (by its owner, or reclaimed by the OS service).

    Raised by every send, post and receive call on the closed endpoint once nothing is left to
    receive; ``async for`` over the endpoint (or a service on it) ends instead.
    """


class PeerGone(ChannelError, trio.BrokenResourceError):
    """The process at the other end of a channel died or closed its side.

    The one error a real transport raises for a peer that left: once from a blocking
    ``recv()``, after every message the peer sent before leaving was received, and from every
    later send on that channel (``poll()`` and ``recv_nowait()`` just find nothing).
    Transports that can see a peer leave (shm, with or without the daemon) raise it; on
    datagram transports (udp, ether, tap) a departed peer looks like loss, as in paper 000 §3,
    and nothing is raised.
    """


class AssemblyError(StacklibError):
    """Layers of a stack do not fit: a layer needs a service the one below does not provide."""


class LocalProtocolError(StacklibError):
    """The application asked a protocol layer for something its rules forbid."""


class RemoteProtocolError(StacklibError):
    """The peer broke the protocol in a way the layer cannot recover from."""


class PeerUnreachable(StacklibError):
    """A reliable layer gave up on a peer that stopped answering."""


class Deadlock(StacklibError):
    """A simulation stalled: every task waits, and no event or timer will ever wake one."""
