"""The XDP program: U-Net/FE frames to their endpoint's socket, everything else to the kernel.

Run by the driver for every frame that arrives on the interface, before the kernel's stack
sees it.  In C it would read::

    if (data + 17 > data_end || eth->h_proto != htons(0x88B5)) {   // not U-Net/FE
        count(PASSED); return XDP_PASS;                              // ARP, IP: the kernel's
    }
    action = bpf_redirect_map(&sockets, data[16] /* U-Net port */, XDP_DROP);
    count(action == XDP_REDIRECT ? REDIRECTED : NO_SOCKET);
    return action;

The port map (``XSKMAP``, key: the one-byte U-Net port of paper 001 §3.1) is the
demultiplexing table of U-Net's NI: the OS service writes which socket owns which port, and a
frame for a port nobody registered is dropped in the kernel and counted, never delivered to a
process that does not own it.  The counters live in an ``ARRAY`` map (:data:`COUNTERS`), added to
atomically, read with :func:`read_counters`.

The program is assembled here (eBPF instructions as numbers, :mod:`.bpf` encodes them): eleven
lines of C do not justify a compiler at install time.
"""

from __future__ import annotations

import struct

from stacklib.transports.xdp.bpf import Insn, map_lookup
from stacklib.wire import unet_eth

__all__ = ["COUNTERS", "read_counters", "unet_redirect"]

#: The counters of the program's map, by index.
COUNTERS = ("redirected", "no-socket", "passed")
REDIRECTED, NO_SOCKET, PASSED = range(3)

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)
_BPF_FUNC_MAP_LOOKUP_ELEM = 1
_BPF_FUNC_REDIRECT_MAP = 51
_PSEUDO_MAP_FD = 1
#: Offsets in struct xdp_md.
_DATA, _DATA_END = 0, 4
#: Where the U-Net/FE header's fields sit in the frame.
_ETHERTYPE_AT = 12
_PORT_AT = unet_eth.HEADER_SIZE - 1
#: The EtherType as a little-endian load of its two big-endian bytes reads it.
_ETHERTYPE_LE = int.from_bytes(unet_eth.ETHERTYPE_UNET.to_bytes(2, "big"), "little")

# Opcodes: class | size/op | source.
_LDX_W, _LDX_H, _LDX_B = 0x61, 0x69, 0x71
_STX_W, _ST_W = 0x63, 0x62
_ATOMIC_ADD_DW = 0xDB
_LD_IMM64 = 0x18
_MOV64_X, _MOV64_K, _ADD64_K = 0xBF, 0xB7, 0x07
_JGT_X, _JNE_K, _JEQ_K, _JA = 0x2D, 0x55, 0x15, 0x05
_CALL, _EXIT = 0x85, 0x95
R0, R1, R2, R3, R4, R6, R7, R8, R10 = 0, 1, 2, 3, 4, 6, 7, 8, 10


def _load_map(register: int, fd: int) -> list[Insn]:
    return [(_LD_IMM64, register, _PSEUDO_MAP_FD, 0, fd), (0, 0, 0, 0, 0)]


def _count(counters_fd: int, index: int) -> list[Insn]:
    """counters[index] += 1 (atomic); clobbers r0-r5."""
    return [
        (_ST_W, R10, 0, -8, index),  # the key on the stack
        *_load_map(R1, counters_fd),
        (_MOV64_X, R2, R10, 0, 0),
        (_ADD64_K, R2, 0, 0, -8),
        (_CALL, 0, 0, 0, _BPF_FUNC_MAP_LOOKUP_ELEM),
        (_JEQ_K, R0, 0, 2, 0),  # no such element: skip the add
        (_MOV64_K, R1, 0, 0, 1),
        (_ATOMIC_ADD_DW, R0, R1, 0, 0),  # lock *(u64 *)(r0 + 0) += r1
    ]


def unet_redirect(sockets_fd: int, counters_fd: int) -> list[Insn]:
    """The program, bound to the port map ``sockets_fd`` and the counter map ``counters_fd``."""
    count_redirect = _count(counters_fd, REDIRECTED)
    count_no_socket = _count(counters_fd, NO_SOCKET)
    count_passed = _count(counters_fd, PASSED)
    # The U-Net branch, after the checks: redirect, count, return the action kept in r8.
    unet: list[Insn] = [
        (_LDX_B, R7, R2, _PORT_AT, 0),  # r7 = the U-Net port
        *_load_map(R1, sockets_fd),
        (_MOV64_X, R2, R7, 0, 0),
        (_MOV64_K, R3, 0, 0, XDP_DROP),  # the action when the port has no socket
        (_CALL, 0, 0, 0, _BPF_FUNC_REDIRECT_MAP),
        (_MOV64_X, R8, R0, 0, 0),
        (_JNE_K, R0, 0, len(count_redirect) + 1, XDP_REDIRECT),
        *count_redirect,
        (_JA, 0, 0, len(count_no_socket), 0),
        *count_no_socket,
        (_MOV64_X, R0, R8, 0, 0),
        (_EXIT, 0, 0, 0, 0),
    ]
    passed: list[Insn] = [*count_passed, (_MOV64_K, R0, 0, 0, XDP_PASS), (_EXIT, 0, 0, 0, 0)]
    checks: list[Insn] = [
        (_LDX_W, R2, R1, _DATA, 0),
        (_LDX_W, R3, R1, _DATA_END, 0),
        (_MOV64_X, R4, R2, 0, 0),
        (_ADD64_K, R4, 0, 0, unet_eth.HEADER_SIZE),
        (_JGT_X, R4, R3, 0, 0),  # too short for a U-Net header: patched to jump to `passed`
        (_LDX_H, R4, R2, _ETHERTYPE_AT, 0),
        (_JNE_K, R4, 0, 0, _ETHERTYPE_LE),  # another protocol: patched likewise
    ]
    for index in (4, 6):
        code, dst, src, _, imm = checks[index]
        checks[index] = (code, dst, src, len(checks) - index - 1 + len(unet), imm)
    return [*checks, *unet, *passed]


def read_counters(counters_fd: int) -> dict[str, int]:
    """The program's counters, by name (:data:`COUNTERS`)."""
    return {
        name: struct.unpack("=Q", map_lookup(counters_fd, struct.pack("=I", index), 8))[0]
        for index, name in enumerate(COUNTERS)
    }
