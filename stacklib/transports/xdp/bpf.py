"""The bpf(2) system call from Python: maps, XDP programs, links (no libbpf, no compiler).

What stacklib needs of eBPF is small: two maps (an ``XSKMAP`` from U-Net port to AF_XDP
socket, an ``ARRAY`` of counters), one hand-assembled XDP program (:mod:`.program`), and a
``bpf_link`` that attaches it to an interface.  Each is one ``bpf(cmd, attr, size)`` call with a
zero-padded ``union bpf_attr`` (the kernel accepts a larger attr whose unused tail is zero), so
ctypes and :mod:`struct` do it without libbpf.  The numbers are the kernel's UAPI
(``linux/bpf.h``); x86-64's system call number is 321 (aarch64: 280).

A link (``BPF_LINK_CREATE``) rather than the netlink ``IFLA_XDP`` attachment: the link is a
file descriptor, so the program leaves the interface when the last descriptor closes, including
when the process is killed; a netlink-attached program would stay and make the next socket on
the queue fail with EBUSY.

Every failure raises :class:`BpfError` (an ``OSError`` with the errno), with the verifier's
log for a refused program.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence

from stacklib.errors import StacklibError

__all__ = [
    "BPF_MAP_TYPE_ARRAY",
    "BPF_MAP_TYPE_XSKMAP",
    "BpfError",
    "Insn",
    "bpf_problem",
    "create_map",
    "link_create",
    "load_xdp_program",
    "map_delete",
    "map_lookup",
    "map_update",
    "program_id",
    "run_program",
]

_SYSCALL_NUMBER = {"x86_64": 321, "aarch64": 280}
# Commands (enum bpf_cmd).
BPF_MAP_CREATE, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM = 0, 1, 2, 3
BPF_PROG_LOAD = 5
BPF_PROG_TEST_RUN = 10
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_LINK_CREATE = 28
# Map and program types, attach types.
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_XSKMAP = 17
BPF_PROG_TYPE_XDP = 6
BPF_XDP = 37
#: ``XDP_FLAGS_*`` for the link: generic (SKB) mode or the driver's native mode.
XDP_FLAGS_SKB_MODE, XDP_FLAGS_DRV_MODE = 1 << 1, 1 << 2
_ATTR_SIZE = 144
_LOG_SIZE = 1 << 16

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class BpfError(StacklibError, OSError):
    """A bpf(2) call failed; ``errno`` is the kernel's, the message says which call and why."""


#: One eBPF instruction: (opcode, dst_reg, src_reg, offset, immediate).
Insn = tuple[int, int, int, int, int]


def bpf_problem() -> str | None:
    """Why this process cannot use bpf(2) for XDP here, or None if it can (probes a map)."""
    if platform.system() != "Linux":
        return f"bpf(2) needs Linux, this is {platform.system()}"
    if platform.machine() not in _SYSCALL_NUMBER:
        return f"stacklib knows bpf(2)'s number on x86_64 and aarch64, not {platform.machine()}"
    try:
        os.close(create_map(BPF_MAP_TYPE_ARRAY, 4, 8, 1, "sl_probe"))
    except BpfError as error:
        if error.errno == errno.EPERM:
            return "bpf(2) refused: CAP_BPF and CAP_NET_ADMIN are needed (run as root)"
        return f"bpf(2) does not work here: {error}"
    return None


def _call(cmd: int, attr: bytearray, what: str) -> int:
    buffer = (ctypes.c_char * len(attr)).from_buffer(attr)
    result = _syscall(_SYSCALL_NUMBER.get(platform.machine(), 321), cmd, buffer, len(attr))
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(code, f"bpf({what}): {os.strerror(code)}")
    return int(result)


def _attr(fmt: str, *values: object) -> bytearray:
    attr = bytearray(_ATTR_SIZE)
    struct.pack_into(fmt, attr, 0, *values)
    return attr


def _name(name: str) -> bytes:
    encoded = name.encode("ascii")[:15]  # BPF_OBJ_NAME_LEN is 16 with the NUL
    return encoded.ljust(16, b"\0")


def create_map(
    map_type: int, key_size: int, value_size: int, max_entries: int, name: str = ""
) -> int:
    """A new map's file descriptor."""
    attr = _attr("=IIIIIII16s", map_type, key_size, value_size, max_entries, 0, 0, 0, _name(name))
    return _call(BPF_MAP_CREATE, attr, f"create map {name!r}")


def _element(cmd: int, fd: int, key: bytes, value: bytearray | None, flags: int, what: str) -> None:
    key_buffer = ctypes.create_string_buffer(key, len(key))
    value_address = 0
    holder = None
    if value is not None:
        holder = (ctypes.c_char * len(value)).from_buffer(value)
        value_address = ctypes.addressof(holder)
    attr = _attr("=IIQQQ", fd, 0, ctypes.addressof(key_buffer), value_address, flags)
    _call(cmd, attr, what)
    del holder


def map_update(fd: int, key: bytes, value: bytes) -> None:
    """Set ``key`` to ``value`` in the map ``fd`` (BPF_ANY)."""
    _element(BPF_MAP_UPDATE_ELEM, fd, key, bytearray(value), 0, "update map element")


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes:
    """The value of ``key`` in the map ``fd``."""
    value = bytearray(value_size)
    _element(BPF_MAP_LOOKUP_ELEM, fd, key, value, 0, "look up map element")
    return bytes(value)


def map_delete(fd: int, key: bytes) -> None:
    """Remove ``key`` from the map ``fd``; a missing key raises :class:`BpfError` (ENOENT)."""
    _element(BPF_MAP_DELETE_ELEM, fd, key, None, 0, "delete map element")


def encode(program: Sequence[Insn]) -> bytes:
    """The instructions as the kernel reads them (8 bytes each, little-endian registers)."""
    return b"".join(
        struct.pack("<BBhi", code, (src << 4) | dst, offset, imm)
        for code, dst, src, offset, imm in program
    )


def load_xdp_program(program: Sequence[Insn], name: str, license: str = "GPL") -> int:
    """Load ``program`` as an XDP program; its file descriptor.  A refusal raises
    :class:`BpfError` with the verifier's log."""
    code = encode(program)
    insns = ctypes.create_string_buffer(code, len(code))
    license_buffer = ctypes.create_string_buffer(license.encode("ascii"))
    log = ctypes.create_string_buffer(_LOG_SIZE)
    # Declared for attachment through a link (BPF_XDP); an older kernel that refuses the
    # declaration loads it without.
    for expected in (BPF_XDP, 0):
        attr = _attr(
            "=IIQQIIQII16sII",
            BPF_PROG_TYPE_XDP,
            len(program),
            ctypes.addressof(insns),
            ctypes.addressof(license_buffer),
            1,
            _LOG_SIZE,
            ctypes.addressof(log),
            0,
            0,
            _name(name),
            0,
            expected,
        )
        try:
            return _call(BPF_PROG_LOAD, attr, f"load XDP program {name!r}")
        except BpfError as error:
            if error.errno == errno.EINVAL and expected and not log.value:
                continue
            detail = log.value.decode("ascii", "replace").strip()
            message = f"{error.strerror}" + (f"; the verifier says:\n{detail}" if detail else "")
            raise BpfError(error.errno, message) from None
    raise AssertionError("unreachable")  # pragma: no cover


def link_create(program_fd: int, ifindex: int, flags: int) -> int:
    """Attach the XDP program to interface ``ifindex`` through a bpf_link; the link's file
    descriptor (closing its last copy detaches the program)."""
    attr = _attr("=IIII", program_fd, ifindex, BPF_XDP, flags)
    return _call(BPF_LINK_CREATE, attr, f"attach XDP program to interface {ifindex}")


def program_id(fd: int) -> int:
    """The kernel's id of the program (or link) ``fd`` (``bpf_prog_info.id``)."""
    info = ctypes.create_string_buffer(256)
    attr = _attr("=IIQ", fd, 256, ctypes.addressof(info))
    _call(BPF_OBJ_GET_INFO_BY_FD, attr, "get object info")
    return int(struct.unpack_from("=I", info.raw, 4)[0])


def run_program(program_fd: int, frame: bytes) -> int:
    """Run the XDP program once on ``frame`` without attaching it (BPF_PROG_TEST_RUN); the
    action it returned (XDP_PASS, XDP_DROP, XDP_REDIRECT, ...).  Maps are the real ones."""
    data_in = ctypes.create_string_buffer(frame, len(frame))
    data_out = ctypes.create_string_buffer(len(frame) + 512)
    attr = _attr(
        "=IIIIQQII",
        program_fd,
        0,
        len(frame),
        len(data_out),
        ctypes.addressof(data_in),
        ctypes.addressof(data_out),
        1,
        0,
    )
    _call(BPF_PROG_TEST_RUN, attr, "test-run XDP program")
    return int(struct.unpack_from("=I", attr, 4)[0])
