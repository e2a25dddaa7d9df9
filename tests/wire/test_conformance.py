"""Every registered wire format passes the conformance suite of stacklib.testing: build then
parse is identity over its strategy, and malformed input raises only its FormatError."""

from __future__ import annotations

import pytest

from stacklib.testing import check_format, format_names
from stacklib.wire import registry


def test_every_registered_format_can_be_checked() -> None:
    # A format registered without build, strategy or error would silently escape the suite.
    incomplete = sorted(set(format_names(complete=False)) - set(format_names()))
    assert incomplete == []
    assert {"arq", "uam", "unet-eth", "atm-cell", "aal5-pdu", "tcp", "udp"} <= set(format_names())
    for name in format_names():
        info = registry.formats()[name]
        assert info.error is not None and info.error.__module__ == info.parse.__module__


@pytest.mark.parametrize("name", format_names())
def test_format_conforms(name: str) -> None:
    check_format(name)
