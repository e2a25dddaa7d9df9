"""The format registry behind ``stacklib decode``."""

from __future__ import annotations

import enum
import sys
import textwrap

import pytest

from stacklib.registry import RegistryError, UnknownName
from stacklib.wire import registry
from stacklib.wire.descriptor import DescriptorFormatError, Fragment, SendDescriptor, build_send
from stacklib.wire.unet_eth import UNetEthFormatError, UNetFrame, build, mac


def test_builtin_formats_are_listed() -> None:
    names = registry.formats()
    for name in ("unet-eth", "unet-send-desc", "unet-recv-desc", "unet-free-desc"):
        assert name in names
        assert names[name].name == name
        assert names[name].summary
    assert list(names) == sorted(names)


def test_decode_unet_eth() -> None:
    frame = UNetFrame(mac("02:00:00:00:00:02"), mac("02:00:00:00:00:01"), 7, bytes(range(40)))
    assert registry.decode("unet-eth", build(frame)) == textwrap.dedent(
        """\
        unet-eth: 60 bytes
          dst: 02:00:00:00:00:02
          src: 02:00:00:00:00:01
          ethertype: 0x88b5
          length: 40
          port: 7
          payload: 40 bytes: 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f..."""
    )


def test_decode_send_descriptor() -> None:
    raw = build_send(SendDescriptor(5, (Fragment(0, 40), Fragment(64, 2))))
    assert registry.decode("unet-send-desc", raw) == textwrap.dedent(
        """\
        unet-send-desc: 32 bytes
          channel: 5
          status: POSTED
          error: NONE
          length: 42
          dest_offset: none
          fragments (2):
            [0]: offset 0 length 40
            [1]: offset 64 length 2"""
    )


def test_decode_propagates_the_format_error() -> None:
    with pytest.raises(UNetEthFormatError):
        registry.decode("unet-eth", bytes(59))
    with pytest.raises(DescriptorFormatError):
        registry.decode("unet-free-desc", bytes(9))


def test_unknown_format_names_the_known_ones() -> None:
    with pytest.raises(UnknownName, match=r"no format named 'nope' \(known formats: .*unet-eth"):
        registry.decode("nope", b"")


class Colour(enum.IntEnum):
    RED = 1


def test_register_render_and_duplicates() -> None:
    def describe(value: bytes) -> list[registry.Field]:
        return [
            ("colour", Colour.RED),
            ("missing", None),
            ("raw", value),
            ("block", [("inner", 1), ("deeper", [("x", "y")])]),
        ]

    toy = registry.register("test-toy", bytes, describe, "a toy format")
    try:
        assert registry.decode("test-toy", b"\x01\x02") == textwrap.dedent(
            """\
            test-toy: 2 bytes
              colour: RED
              missing: none
              raw: 2 bytes: 0102
              block:
                inner: 1
                deeper:
                  x: y"""
        )
        assert registry.FORMATS.source("test-toy") == "run time"
        with pytest.raises(RegistryError, match="format name 'test-toy' is taken"):
            registry.register("test-toy", bytes, list, "again")
        assert registry.FORMATS["test-toy"] is toy
        with pytest.raises(ValueError, match="error must be a FormatError subclass"):
            registry.register("test-bad", bytes, list, "bad", error=ValueError)  # type: ignore[arg-type]
    finally:
        registry.FORMATS.unregister("test-toy")
    assert "test-toy" not in registry.formats()


def test_hex_preview() -> None:
    assert registry.hex_preview(b"") == "0 bytes"
    assert registry.hex_preview(b"\xab\xcd") == "2 bytes: abcd"
    assert registry.hex_preview(bytes(5), limit=2) == "5 bytes: 0000..."
    assert registry.hex_preview(bytes(32)) == "32 bytes: " + "00" * 32


def test_registry_imports_no_format_module() -> None:
    import subprocess

    code = (
        "import sys, stacklib.wire.registry\n"
        "print(sorted(m for m in sys.modules if m.startswith('stacklib.wire.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['stacklib.wire.registry']"
