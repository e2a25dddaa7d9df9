"""The daemon's wire format: requests, replies, and their framing.

Every message is a 4-byte big-endian length and a body (:data:`BODY`) of ``version: u8,
type: u8, seq: u32`` followed by the type's fields.  Replies echo ``seq``.  The per-transfer
messages (SEND_DIRECT and its DONE) also have struct-speed codecs (:data:`FAST_CODECS`).
"""

from __future__ import annotations

import enum
from typing import Any

import attrs
import construct as cs

from stacklib.errors import ChannelError, FormatError, PermissionDenied
from stacklib.wire.codec import FixedCodec, derive_codec

PROTOCOL_VERSION = 1
#: Largest body accepted; requests are a few dozen bytes, so anything bigger is garbage.
MAX_BODY = 4096


class DaemonFormatError(FormatError):
    """Bytes that are not a daemon protocol message."""


class DaemonError(ChannelError):
    """The daemon refused a request (``code`` says why) or cannot be reached."""

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class DaemonDenied(DaemonError, PermissionDenied):
    """The daemon refused a request for lack of ownership or authorization."""


class ErrorCode(enum.IntEnum):
    MALFORMED = 1
    FORGED_PID = 2
    NOT_OWNER = 3
    BAD_TAG = 4
    DENIED = 5
    IN_USE = 6
    BAD_SPEC = 7
    INTERNAL = 8
    BAD_RANGE = 9
    #: The daemon closes this connection: over a connection limit, or idle holding nothing.
    BUSY = 10


#: The refusals that are about ownership or authorization (raised as :class:`DaemonDenied`).
DENIALS = {ErrorCode.FORGED_PID, ErrorCode.NOT_OWNER, ErrorCode.DENIED}


class MsgType(enum.IntEnum):
    CREATE_ENDPOINT = 1
    OPEN_CHANNEL = 2
    CLOSE_CHANNEL = 3
    CLOSE_ENDPOINT = 4
    STATUS = 5
    REGISTER = 6
    DEREGISTER = 7
    OPEN_POOL = 8
    SEND_DIRECT = 9
    OPEN_QUEUE = 10
    DOORBELL = 11
    OPEN_XSK = 12
    GRANT_PORT = 13
    REVOKE_PORT = 14
    CLOSE_XSK = 15
    OK = 128
    CHANNEL = 129
    ERROR = 130
    STATUS_REPLY = 131
    POOL = 132
    DONE = 133
    QUEUE = 134
    XSK = 135


# ==================================================================== wire format

_Name = cs.PascalString(cs.Int8ub, "utf8")
_Text = cs.PascalString(cs.Int16ub, "utf8")

_PAYLOADS: dict[int, Any] = {
    MsgType.CREATE_ENDPOINT: cs.Struct("pid" / cs.Int32ub, "node" / _Name, "port" / cs.Int16ub),
    MsgType.OPEN_CHANNEL: cs.Struct(
        "pid" / cs.Int32ub,
        "node" / _Name,
        "port" / cs.Int16ub,
        "remote_node" / _Name,
        "remote_port" / cs.Int16ub,
        "ring_bytes" / cs.Int32ub,
        "max_message" / cs.Int32ub,
    ),
    MsgType.CLOSE_CHANNEL: cs.Struct(
        "pid" / cs.Int32ub, "channel" / cs.Int32ub, "side" / cs.Int8ub
    ),
    MsgType.CLOSE_ENDPOINT: cs.Struct("pid" / cs.Int32ub, "node" / _Name, "port" / cs.Int16ub),
    MsgType.STATUS: cs.Struct("pid" / cs.Int32ub),
    MsgType.REGISTER: cs.Struct("pid" / cs.Int32ub, "address" / cs.Int64ub, "length" / cs.Int64ub),
    MsgType.DEREGISTER: cs.Struct(
        "pid" / cs.Int32ub, "address" / cs.Int64ub, "length" / cs.Int64ub
    ),
    MsgType.OPEN_POOL: cs.Struct(
        "pid" / cs.Int32ub,
        "node" / _Name,
        "port" / cs.Int16ub,
        "slots" / cs.Int32ub,
        "data_bytes" / cs.Int64ub,
    ),
    MsgType.SEND_DIRECT: cs.Struct(
        "pid" / cs.Int32ub,
        "channel" / cs.Int32ub,
        "side" / cs.Int8ub,
        "address" / cs.Int64ub,
        "length" / cs.Int32ub,
        "cookie" / cs.Int32ub,
    ),
    MsgType.OPEN_QUEUE: cs.Struct("pid" / cs.Int32ub, "slots" / cs.Int32ub),
    MsgType.DOORBELL: cs.Struct("pid" / cs.Int32ub),
    MsgType.OPEN_XSK: cs.Struct(
        "pid" / cs.Int32ub,
        "interface" / _Name,
        "queue" / cs.Int32ub,
        "frames" / cs.Int32ub,
        "frame_size" / cs.Int32ub,
        "zero_copy" / cs.Int8ub,
        "mode" / cs.Int8ub,
    ),
    MsgType.GRANT_PORT: cs.Struct("pid" / cs.Int32ub, "socket" / cs.Int32ub, "port" / cs.Int16ub),
    MsgType.REVOKE_PORT: cs.Struct("pid" / cs.Int32ub, "socket" / cs.Int32ub, "port" / cs.Int16ub),
    MsgType.CLOSE_XSK: cs.Struct("pid" / cs.Int32ub, "socket" / cs.Int32ub),
    MsgType.OK: cs.Struct(),
    MsgType.CHANNEL: cs.Struct(
        "channel" / cs.Int32ub,
        "side" / cs.Int8ub,
        "ring_bytes" / cs.Int32ub,
        "max_message" / cs.Int32ub,
    ),
    MsgType.ERROR: cs.Struct("code" / cs.Int16ub, "text" / _Text),
    MsgType.STATUS_REPLY: cs.Struct("text" / _Text),
    MsgType.QUEUE: cs.Struct("slots" / cs.Int32ub),
    MsgType.POOL: cs.Struct("slots" / cs.Int32ub, "data_bytes" / cs.Int64ub),
    MsgType.DONE: cs.Struct(
        "cookie" / cs.Int32ub, "status" / cs.Int8ub, "length" / cs.Int32ub, "channel" / cs.Int32ub
    ),
    MsgType.XSK: cs.Struct(
        "socket" / cs.Int32ub,
        "ifindex" / cs.Int32ub,
        "queue" / cs.Int32ub,
        "frames" / cs.Int32ub,
        "frame_size" / cs.Int32ub,
        "zero_copy" / cs.Int8ub,
        "mode" / _Name,
    ),
}

#: The body of every message (after the 4-byte big-endian length prefix).
BODY = cs.Struct(
    "version" / cs.Const(PROTOCOL_VERSION, cs.Int8ub),
    "type" / cs.Int8ub,
    "seq" / cs.Int32ub,
    "payload" / cs.Switch(cs.this.type, _PAYLOADS, default=cs.Error),
    cs.Terminated,
)


@attrs.frozen
class CreateEndpoint:
    pid: int
    node: str
    port: int
    type = MsgType.CREATE_ENDPOINT


@attrs.frozen
class OpenChannel:
    pid: int
    node: str
    port: int
    remote_node: str
    remote_port: int
    ring_bytes: int
    max_message: int
    type = MsgType.OPEN_CHANNEL


@attrs.frozen
class CloseChannel:
    pid: int
    channel: int
    side: int
    type = MsgType.CLOSE_CHANNEL


@attrs.frozen
class CloseEndpoint:
    pid: int
    node: str
    port: int
    type = MsgType.CLOSE_ENDPOINT


@attrs.frozen
class Status:
    pid: int
    type = MsgType.STATUS


@attrs.frozen
class Register:
    """Let transfers read ``length`` bytes at ``address`` of the caller (whole pages)."""

    pid: int
    address: int
    length: int
    type = MsgType.REGISTER


@attrs.frozen
class Deregister:
    pid: int
    address: int
    length: int
    type = MsgType.DEREGISTER


@attrs.frozen
class OpenPool:
    """Create the receive pool of the caller's endpoint (reply POOL and its descriptor)."""

    pid: int
    node: str
    port: int
    slots: int
    data_bytes: int
    type = MsgType.OPEN_POOL


@attrs.frozen
class SendDirect:
    """Copy ``length`` bytes at ``address`` of the caller into the next posted buffer of the
    peer of ``channel`` (the caller owns ``side``); reply DONE with ``cookie``."""

    pid: int
    channel: int
    side: int
    address: int
    length: int
    cookie: int
    type = MsgType.SEND_DIRECT


@attrs.frozen
class OpenQueue:
    """Create the caller's request queue (reply QUEUE and its descriptor)."""

    pid: int
    slots: int
    type = MsgType.OPEN_QUEUE


@attrs.frozen
class Doorbell:
    """The caller's request queue has work and the daemon's mover sleeps (no reply)."""

    pid: int
    type = MsgType.DOORBELL


#: OPEN_XSK's ``zero_copy`` field: copy mode, zero-copy, or zero-copy where the driver has it.
XSK_COPY, XSK_ZERO_COPY, XSK_ANY_COPY = 0, 1, 2
#: OPEN_XSK's ``mode`` field: where the program is attached (if the daemon attaches it now).
XDP_MODES = {0: None, 1: "native", 2: "skb"}


@attrs.frozen
class OpenXsk:
    """Open an AF_XDP socket on ``interface``'s ``queue`` for the caller, with a UMEM of
    ``frames`` chunks of ``frame_size`` bytes (reply XSK with the socket and the UMEM's memfd).

    ``zero_copy`` is :data:`XSK_COPY`, :data:`XSK_ZERO_COPY` or :data:`XSK_ANY_COPY`; ``mode``
    a key of :data:`XDP_MODES` (used when this request attaches the interface's program).
    """

    pid: int
    interface: str
    queue: int
    frames: int
    frame_size: int
    zero_copy: int
    mode: int
    type = MsgType.OPEN_XSK


@attrs.frozen
class GrantPort:
    """Deliver U-Net ``port``'s frames to the caller's xdp ``socket`` (reply OK)."""

    pid: int
    socket: int
    port: int
    type = MsgType.GRANT_PORT


@attrs.frozen
class RevokePort:
    """Stop delivering ``port``'s frames to the caller's xdp ``socket`` (reply OK)."""

    pid: int
    socket: int
    port: int
    type = MsgType.REVOKE_PORT


@attrs.frozen
class CloseXsk:
    """The caller is done with its xdp ``socket``: revoke its ports and free its queue."""

    pid: int
    socket: int
    type = MsgType.CLOSE_XSK


@attrs.frozen
class XskGranted:
    """Reply to OPEN_XSK; the socket and the UMEM's memfd ride along (SCM_RIGHTS, in order).

    ``socket`` names it in GRANT_PORT, REVOKE_PORT and CLOSE_XSK; ``mode`` is how the program
    is attached (``native`` or ``skb``)."""

    socket: int
    ifindex: int
    queue: int
    frames: int
    frame_size: int
    zero_copy: int
    mode: str
    type = MsgType.XSK


@attrs.frozen
class QueueGranted:
    slots: int
    type = MsgType.QUEUE


@attrs.frozen
class PoolGranted:
    slots: int
    data_bytes: int
    type = MsgType.POOL


@attrs.frozen
class Done:
    """The completion of a SEND_DIRECT: an :class:`~stacklib.transports.xmem.XferStatus`."""

    cookie: int
    status: int
    length: int
    channel: int
    type = MsgType.DONE


@attrs.frozen
class Ok:
    type = MsgType.OK


@attrs.frozen
class ChannelGranted:
    """Reply to OPEN_CHANNEL; the region's descriptor rides along (SCM_RIGHTS)."""

    channel: int
    side: int
    ring_bytes: int
    max_message: int
    type = MsgType.CHANNEL


@attrs.frozen
class ErrorReply:
    code: int
    text: str
    type = MsgType.ERROR


@attrs.frozen
class StatusReply:
    text: str
    type = MsgType.STATUS_REPLY


Request = (
    CreateEndpoint
    | OpenChannel
    | CloseChannel
    | CloseEndpoint
    | Status
    | Register
    | Deregister
    | OpenPool
    | SendDirect
    | OpenQueue
    | Doorbell
    | OpenXsk
    | GrantPort
    | RevokePort
    | CloseXsk
)
Reply = (
    Ok | ChannelGranted | ErrorReply | StatusReply | PoolGranted | Done | QueueGranted | XskGranted
)
#: Every request class: what the daemon answers, and what a reply must never be.
REQUESTS = (
    CreateEndpoint,
    OpenChannel,
    CloseChannel,
    CloseEndpoint,
    Status,
    Register,
    Deregister,
    OpenPool,
    SendDirect,
    OpenQueue,
    Doorbell,
    OpenXsk,
    GrantPort,
    RevokePort,
    CloseXsk,
)
Message = Request | Reply

_CLASSES: dict[int, type[Any]] = {
    cls.type: cls
    for cls in (
        CreateEndpoint,
        OpenChannel,
        CloseChannel,
        CloseEndpoint,
        Status,
        Register,
        Deregister,
        OpenPool,
        SendDirect,
        OpenQueue,
        Doorbell,
        OpenXsk,
        GrantPort,
        RevokePort,
        CloseXsk,
        XskGranted,
        QueueGranted,
        Ok,
        ChannelGranted,
        ErrorReply,
        StatusReply,
        PoolGranted,
        Done,
    )
}


def _fixed(kind: MsgType) -> FixedCodec:
    # The whole body of a fixed-size message, derived from the same construct definition.
    frame = cs.Struct(
        "version" / cs.Const(PROTOCOL_VERSION, cs.Int8ub),
        "type" / cs.Const(int(kind), cs.Int8ub),
        "seq" / cs.Int32ub,
        "payload" / _PAYLOADS[kind],
    )
    return derive_codec(frame, DaemonFormatError)


#: Struct-speed codecs of the per-transfer messages (SEND_DIRECT and its DONE), which are on
#: the data path of single-copy transfers; tests prove them equal to :data:`BODY`.
FAST_CODECS: dict[int, tuple[FixedCodec, type[Any]]] = {
    MsgType.SEND_DIRECT: (_fixed(MsgType.SEND_DIRECT), SendDirect),
    MsgType.DONE: (_fixed(MsgType.DONE), Done),
}


def encode(seq: int, message: Message) -> bytes:
    """One framed message: length prefix and body."""
    fast = FAST_CODECS.get(message.type)
    if fast is not None:
        codec = fast[0]
        try:
            return codec.size.to_bytes(4, "big") + codec.pack(seq, *attrs.astuple(message))
        except ValueError as error:
            raise DaemonFormatError(f"cannot encode {message!r}: {error}") from None
    try:
        body: bytes = BODY.build(
            {"type": int(message.type), "seq": seq, "payload": attrs.asdict(message)}
        )
    except (cs.ConstructError, UnicodeError, ValueError, OverflowError) as error:
        raise DaemonFormatError(f"cannot encode {message!r}: {error}") from None
    if len(body) > MAX_BODY:
        raise DaemonFormatError(f"{message!r} encodes to {len(body)} > {MAX_BODY} bytes")
    return len(body).to_bytes(4, "big") + body


def decode(body: bytes) -> tuple[int, Message]:
    """Parse one body (without its length prefix): (seq, message); DaemonFormatError if bad."""
    fast = FAST_CODECS.get(body[1]) if len(body) > 1 else None
    if fast is not None and len(body) == fast[0].size:
        values = fast[0].unpack(body)
        return int(values[0]), fast[1](*values[1:])
    try:
        parsed = BODY.parse(body)
    except (cs.ConstructError, UnicodeError, ValueError, OverflowError) as error:
        raise DaemonFormatError(f"bad message: {error}") from None
    fields = {k: v for k, v in parsed.payload.items() if not k.startswith("_")}
    return int(parsed.seq), _CLASSES[parsed.type](**fields)
