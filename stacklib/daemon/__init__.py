"""The U-Net OS service as a daemon: set-up, authentication and protection, and single copies.

Paper 000 §3.2: the OS service creates endpoints and channels, performs the authentication and
authorization checks and registers the tag; it is never on the data path of ring messages (it
moves only single-copy transfers, see below).  For the shm transport this daemon (one per
host, ``stacklib daemon`` or started on demand) does exactly that:

* it listens on a UNIX stream socket (:func:`default_socket_path`) and identifies each
  connected process by ``SO_PEERCRED`` (pid, uid, gid), never by what the process claims;
* a process registers endpoints (a shm node name and port; a node belongs to one process) and
  opens channels from its own endpoints; the :class:`DaemonPolicy` authorizes the tag (the
  remote address): same uid by default, or an allow-list file;
* the daemon creates each channel's region itself (a sealed ``memfd``: no name in any file
  system, so nobody can open it by path) and passes its descriptor with ``SCM_RIGHTS`` to
  exactly the two owners of the channel, writing each side's verified pid into the header;
* when a process's connection closes (it exited or died) the daemon reclaims its endpoints and
  channels and marks its side of each region closed and reclaimed, so the surviving peer's
  ``ShmLink.check_peer`` fails the channel with ``PeerGone``;
* a malformed or forged request (a pid that is not the caller's, a channel or endpoint it does
  not own, a bogus tag) gets an error reply, is logged and counted, and never stops the daemon;
* xdp (:mod:`~stacklib.daemon.xdp`): the daemon attaches the XDP program of an interface,
  opens each process's AF_XDP socket and passes it with its UMEM; only the daemon writes the
  port map, at the request of the socket's owner (docs/xdp-protection.md);
* single-copy transfers (:mod:`stacklib.transports.xmem`, paper 002 §4): a process registers
  memory it has, a receiver gets a receive pool it posts buffers into, and on SEND_DIRECT (or
  an entry in the sender's shared request queue) the daemon checks channel, side and
  registration and copies with one ``process_vm_readv`` from the sender into the peer's next
  posted buffer; failures are statuses on the DONE, never a crash.

Messages then flow through the per-channel rings (:mod:`stacklib.transports.shm`) with no
daemon involvement.  :class:`DaemonBroker` plugs the daemon into ``ShmNetwork(broker=...)``.

The package, one job per module: :mod:`~stacklib.daemon.protocol` (the wire format),
:mod:`~stacklib.daemon.policy` (credentials and authorization), :mod:`~stacklib.daemon.server`
(the daemon), :mod:`~stacklib.daemon.sockets` (where it listens; starting it on demand),
:mod:`~stacklib.daemon.client`, :mod:`~stacklib.daemon.broker` (the shm transport's broker)
and :mod:`~stacklib.daemon.cli` (``stacklib daemon``).
"""

from __future__ import annotations

from stacklib.daemon.broker import DaemonBroker, channel_path, echo_peer
from stacklib.daemon.cli import build_parser, cmd_daemon, main
from stacklib.daemon.client import DaemonClient
from stacklib.daemon.limits import (
    CLIENT_IDLE_TIMEOUT,
    MAX_CLIENTS_PER_UID,
    ConnectionLimits,
    choose_victim,
    clients_for_descriptors,
)
from stacklib.daemon.policy import AllowListFile, Cred, DaemonPolicy, SameUid, peer_cred
from stacklib.daemon.protocol import (
    BODY,
    DENIALS,
    FAST_CODECS,
    MAX_BODY,
    PROTOCOL_VERSION,
    REQUESTS,
    ChannelGranted,
    CloseChannel,
    CloseEndpoint,
    CloseXsk,
    CreateEndpoint,
    DaemonDenied,
    DaemonError,
    DaemonFormatError,
    Deregister,
    Done,
    Doorbell,
    ErrorCode,
    ErrorReply,
    GrantPort,
    Message,
    MsgType,
    Ok,
    OpenChannel,
    OpenPool,
    OpenQueue,
    OpenXsk,
    PoolGranted,
    QueueGranted,
    Register,
    Reply,
    Request,
    RevokePort,
    SendDirect,
    Status,
    StatusReply,
    XskGranted,
    decode,
    encode,
)
from stacklib.daemon.server import (
    MAX_WINDOWS,
    MOVER_MAX_SLEEP,
    MOVER_SPIN,
    Daemon,
    run_daemon,
)
from stacklib.daemon.sockets import (
    ENV_SOCKET,
    ON_DEMAND_IDLE,
    SOCKET_GROUP,
    bind_socket,
    connect,
    default_socket_path,
    socket_permissions,
)
from stacklib.daemon.state import ChannelState, ClientState
from stacklib.daemon.xdp import MAX_UMEM_BYTES, XdpService, XskState
from stacklib.transports.shm import RECLAIMED_WORD

__all__ = [
    "BODY",
    "CLIENT_IDLE_TIMEOUT",
    "DENIALS",
    "ENV_SOCKET",
    "FAST_CODECS",
    "MAX_BODY",
    "MAX_CLIENTS_PER_UID",
    "MAX_UMEM_BYTES",
    "MAX_WINDOWS",
    "MOVER_MAX_SLEEP",
    "MOVER_SPIN",
    "ON_DEMAND_IDLE",
    "PROTOCOL_VERSION",
    "RECLAIMED_WORD",
    "REQUESTS",
    "SOCKET_GROUP",
    "AllowListFile",
    "ChannelGranted",
    "ChannelState",
    "ClientState",
    "CloseChannel",
    "CloseEndpoint",
    "CloseXsk",
    "ConnectionLimits",
    "CreateEndpoint",
    "Cred",
    "Daemon",
    "DaemonBroker",
    "DaemonClient",
    "DaemonDenied",
    "DaemonError",
    "DaemonFormatError",
    "DaemonPolicy",
    "Deregister",
    "Done",
    "Doorbell",
    "ErrorCode",
    "ErrorReply",
    "GrantPort",
    "Message",
    "MsgType",
    "Ok",
    "OpenChannel",
    "OpenPool",
    "OpenQueue",
    "OpenXsk",
    "PoolGranted",
    "QueueGranted",
    "Register",
    "Reply",
    "Request",
    "RevokePort",
    "SameUid",
    "SendDirect",
    "Status",
    "StatusReply",
    "XdpService",
    "XskGranted",
    "XskState",
    "bind_socket",
    "build_parser",
    "channel_path",
    "choose_victim",
    "clients_for_descriptors",
    "cmd_daemon",
    "connect",
    "decode",
    "default_socket_path",
    "echo_peer",
    "encode",
    "main",
    "peer_cred",
    "run_daemon",
    "socket_permissions",
]
