"""The Wireshark dissector (stacklib/wireshark/stacklib.lua) and the service ports.

tshark loads the dissector on captures of the recipes; the fields it decodes must be the values
stacklib's own codecs read from the same file, and no frame may be malformed.  Skipped where
tshark is missing or built without Lua.
"""

from __future__ import annotations

import functools
import os
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from stacklib import wireshark
from stacklib.cli import main
from stacklib.commands._common import load_recipe
from stacklib.layers.splitc import wire as splitc_wire
from stacklib.layers.tcp.driver import TcpParams
from stacklib.layers.uam import wire as uam_wire
from stacklib.layers.udp.driver import UdpParams
from stacklib.recipes import run_recipe
from stacklib.wire import unet_eth
from stacklib.wire.pcap import LinkType, PcapWriter, parse_sunatm, read_pcap

LUA = wireshark.dissector_path()
TSHARK = shutil.which("tshark")


@functools.cache
def _tshark_version() -> str:
    assert TSHARK is not None
    return subprocess.run(
        [TSHARK, "-v"], capture_output=True, text=True, timeout=60, check=False
    ).stdout


def _missing() -> str | None:
    if TSHARK is None:
        return "tshark is not installed (apt-get install tshark to run this test)"
    version = _tshark_version()
    if not re.search(r"\bwith Lua\b", version) or "without Lua" in version:
        return "this tshark was built without Lua, so it cannot load stacklib.lua"
    return None


needs_tshark_lua = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")

WARNING = 0x00600000  #: the expert severity of a warning (PI_WARN); errors are above it


def tshark(path: Path, *args: str, lua: bool = True, home: Path | None = None) -> list[str]:
    """tshark's output lines on ``path``, with the dissector unless ``lua=False``.

    tshark runs with HOME at ``home`` (default: the capture's folder), so that it loads no
    personal plugin but those the test put there: a copy of the dissector installed in the real
    HOME would clash with the one given by ``-X lua_script``."""
    assert TSHARK is not None
    command = [TSHARK, "-n", "-r", str(path)]
    if lua:
        command += ["-X", f"lua_script:{LUA}"]
    done = subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": str(home if home is not None else path.parent)},
    )
    assert done.returncode == 0, done.stderr
    assert "Lua" not in done.stderr, done.stderr  # a script error is printed, not raised
    return done.stdout.splitlines()


def fields(
    path: Path, *names: str, lua: bool = True, alarms: bool = False, options: tuple[str, ...] = ()
) -> list[list[str]]:
    """One row per frame: the values of ``names`` (several occurrences joined by commas).

    Fails if a frame is malformed or has an expert warning or error (a malformed frame has an
    error), unless ``alarms``."""
    command = [*options, "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=|"]
    for name in (*names, "_ws.expert.severity"):
        command += ["-e", name]
    rows = [line.split("\t") for line in tshark(path, *command, lua=lua)]
    if not alarms:
        serious = [row for row in rows if any(int(v) >= WARNING for v in row[-1].split("|") if v)]
        assert serious == []
    return [row[:-1] for row in rows]


# --- captures of the recipes, made once per test session on small workloads -----------------

CAPTURES: dict[str, list[str]] = {
    "unet-fe-uam": ["workload.sizes=[0, 16, 100, 4000]", "workload.iterations=2"],
    "unet-atm-uam": ["workload.sizes=[0, 16, 100, 4000]", "workload.iterations=2"],
    "uam-udp-fe": ["workload.sizes=[16, 4000]", "workload.iterations=2"],
    # Blocking writes on two ranks: Split-C requests and replies (and collectives' stores).
    "splitc-fe": ['workload.benchmark="rsortsm"', "workload.sizes=[32]", "workload.nodes=2"],
    "splitc-atm": ['workload.benchmark="rsortsm"', "workload.sizes=[32]", "workload.nodes=2"],
    "tcp-fe": ["workload.size=32768", "workload.rtt_iterations=2"],
    "tcp-atm": ["workload.size=32768", "workload.rtt_iterations=2"],
}


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def make(recipe: str) -> Path:
        if recipe not in made:
            path = tmp_path_factory.mktemp("captures") / f"{recipe}.pcap"
            sets = [*CAPTURES[recipe]]
            if "uam" in recipe:
                sets.append("workload.warmup=0")
            run_recipe(load_recipe(recipe, sets), pcap=str(path))
            made[recipe] = path
        return made[recipe]

    return make


def messages(path: Path) -> list[tuple[int, bytes]]:
    """(U-Net port or VCI, message) of every record, read with stacklib's codecs."""
    linktype, records = read_pcap(path)
    if linktype == LinkType.ETHERNET:
        frames = [unet_eth.parse(record.data) for record in records]
        return [(frame.port, frame.payload) for frame in frames]
    packets = [parse_sunatm(record.data) for record in records]
    return [(packet.vci, packet.payload) for packet in packets]


def _hex_words(words: tuple[int, ...]) -> str:
    return "|".join(f"0x{word:08x}" for word in words)


UAM_FIELDS = ("uam.type", "uam.handler", "uam.status", "uam.seq", "uam.ack", "uam.nargs")
UAM_FIELDS += ("uam.arg", "uam.region", "uam.xfer", "uam.offset", "uam.total", "uam.chunk")


def uam_row(pdu: uam_wire.Pdu) -> list[str]:
    handler, status = (str(pdu.handler), "") if pdu.type != 6 else ("", str(pdu.handler))
    bulk = pdu.bulk
    tail = [""] * 5 if bulk is None else [str(v) for v in attrs_tuple(bulk)]
    row = [str(int(pdu.type)), handler, status, str(pdu.seq), str(pdu.ack)]
    return [*row, str(len(pdu.args)), _hex_words(pdu.args), *tail]


def attrs_tuple(bulk: uam_wire.Bulk) -> tuple[int, ...]:
    return (bulk.region, bulk.xfer, bulk.offset, bulk.total, bulk.chunk)


# --- the dissector file and the command -------------------------------------------------------


def test_the_dissector_ships_in_the_package_and_installs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert LUA.name == "stacklib.lua" and LUA.is_file()
    assert main(["wireshark", "--path"]) == 0
    assert capsys.readouterr().out.strip() == str(LUA)
    target = tmp_path / "plugins" / "deeper"
    assert main(["wireshark", "--install", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target / "stacklib.lua")
    assert (target / "stacklib.lua").read_bytes() == LUA.read_bytes()
    assert wireshark.personal_plugins_dir().parts[-4:] == (".local", "lib", "wireshark", "plugins")


@needs_tshark_lua
def test_wireshark_loads_the_installed_dissector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: Callable[[str], Path]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wireshark.install() == tmp_path / ".local/lib/wireshark/plugins/stacklib.lua"
    path = capture("unet-fe-uam")
    rows = tshark(path, "-T", "fields", "-e", "frame.protocols", lua=False, home=tmp_path)
    assert set(rows) == {"eth:ethertype:unet:uam"}


def test_installing_into_a_file_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["wireshark", "--install", str(blocker / "plugins")]) == 2
    assert str(blocker) in capsys.readouterr().err


def test_the_dissector_s_constants_are_stacklib_s() -> None:
    text = LUA.read_text()
    assert f"local ETHERTYPE_UNET = 0x{unet_eth.ETHERTYPE_UNET:04X}" in text
    assert f"local UDP_FACE_PORT = {UdpParams().port}" in text
    assert f"local UAM_HEADER = {uam_wire.HEADER_SIZE}" in text
    assert f"local UAM_BULK = {uam_wire.BULK_SIZE}" in text


# --- the ports ----------------------------------------------------------------------------------


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_wireshark_claims_neither_service_port() -> None:
    assert TSHARK is not None
    done = subprocess.run(
        [TSHARK, "-G", "decodes"], capture_output=True, text=True, timeout=60, check=True
    )
    claimed = {tuple(line.split("\t")[:2]) for line in done.stdout.splitlines() if "\t" in line}
    assert ("tcp.port", "5000") in claimed  # GSM IPA: why the port moved
    for table, port in (("tcp.port", TcpParams().service_port), ("udp.port", UdpParams().port)):
        assert (table, str(port)) not in claimed


@pytest.mark.skipif(TSHARK is None, reason="tshark is not installed")
def test_tcp_over_atm_dissects_as_tcp_without_the_dissector(capture: Callable[[str], Path]) -> None:
    path = capture("tcp-atm")
    rows = fields(path, "frame.protocols", "tcp.dstport", "tcp.srcport", lua=False)
    assert len(rows) > 20
    assert {row[0] for row in rows} <= {"atm:ip:tcp", "atm:ip:tcp:data"}
    assert all(str(TcpParams().service_port) in row[1:] for row in rows)


@needs_tshark_lua
def test_tcp_over_unet_fe_dissects_as_tcp(capture: Callable[[str], Path]) -> None:
    path = capture("tcp-fe")
    rows = fields(path, "frame.protocols", "unet.length", "ip.len")
    assert {row[0] for row in rows} == {
        "eth:ethertype:unet:ip:tcp",
        "eth:ethertype:unet:ip:tcp:data",
    }
    assert [row[1] for row in rows] == [row[2] for row in rows]  # the message is the datagram


# --- U-Net/FE and UAM -------------------------------------------------------------------------


@needs_tshark_lua
@pytest.mark.parametrize("recipe", ["unet-fe-uam", "unet-atm-uam"])
def test_uam_fields_are_what_stacklib_wrote(capture: Callable[[str], Path], recipe: str) -> None:
    path = capture(recipe)
    ether = recipe.startswith("unet-fe")
    first = ("unet.port", "unet.length") if ether else ("atm.vci", "frame.len")
    rows = fields(path, *first, *UAM_FIELDS)
    expected = [
        [str(tag), str(len(message)), *uam_row(uam_wire.parse(message))]
        for tag, message in messages(path)
    ]
    if not ether:  # tshark's frame length of a SunATM record leaves out the pseudo-header
        rows = [[row[0], str(int(row[1])), *row[2:]] for row in rows]
    assert rows == expected
    assert {row[2] for row in rows} >= {"4"}  # the message face's stores


@needs_tshark_lua
def test_uam_over_udp_is_dissected_on_the_face_s_port(capture: Callable[[str], Path]) -> None:
    path = capture("uam-udp-fe")
    rows = fields(path, "frame.protocols", "udp.dstport", "uam.type", "uam.seq")
    whole = [row for row in rows if row[0].endswith(":uam")]
    assert whole and all(row[1] == str(UdpParams().port) and row[2] == "4" for row in whole)
    # Every other frame is a fragment of a datagram that IP reassembles later.
    assert {row[0] for row in rows if row not in whole} == {"eth:ethertype:unet:ip:data"}


# --- Split-C ----------------------------------------------------------------------------------

SPLITC_FIELDS = ("splitc.kind", "splitc.size", "splitc.region", "splitc.status", "splitc.op")
SPLITC_FIELDS += ("splitc.offset", "splitc.value")


def splitc_row(pdu: uam_wire.Pdu) -> list[str]:
    """What the dissector shows of a Split-C request or reply; no fields for anything else."""
    if len(pdu.args) != 4 or (pdu.type, pdu.handler) not in ((1, 0), (2, 1)):
        return [""] * len(SPLITC_FIELDS)
    if pdu.type == 1:
        q = splitc_wire.parse_request(pdu.args)
        value = q.value.hex()
        return [f"{q.kind:d}", f"{q.size}", f"{q.region}", "", f"{q.op}", f"{q.offset}", value]
    r = splitc_wire.parse_reply(pdu.args)
    return [f"{r.kind:d}", f"{r.size}", "", f"{r.status:d}", f"{r.op}", "", r.value.hex()]


@needs_tshark_lua
@pytest.mark.parametrize("recipe", ["splitc-fe", "splitc-atm"])
def test_splitc_fields_are_what_stacklib_wrote(capture: Callable[[str], Path], recipe: str) -> None:
    path = capture(recipe)
    columns = ("frame.protocols", "_ws.col.Protocol", "_ws.col.Info")
    rows = fields(path, "uam.seq", *SPLITC_FIELDS, *columns)
    expected = [
        [str(pdu.seq), *splitc_row(pdu)]
        for pdu in (uam_wire.parse(message) for _, message in messages(path))
    ]
    assert [row[:-3] for row in rows] == expected
    assert all(row[-3].endswith(":uam:splitc") == (row[1] != "") for row in rows)
    kinds = {row[1] for row in rows}
    assert {"2", "6"} <= kinds  # blocking writes and their acknowledgments
    write = next(row for row in rows if row[1] == "2")
    assert write[-2] == "Split-C" and f"Split-C WRITE op={write[5]} size={write[2]}" in write[-1]


# --- the guess agrees with stacklib's parser ----------------------------------------------------


def _mutations(seed: int, count: int) -> list[bytes]:
    """Valid PDUs of every type and broken copies of them."""
    rng = random.Random(seed)
    words = (1, 0xDEADBEEF, 7, 0)
    pdus = [
        uam_wire.Pdu(uam_wire.PduType.REQUEST, 1, 2, 0, words),
        uam_wire.Pdu(uam_wire.PduType.REPLY, 3, 4, 1, words[:2]),
        uam_wire.Pdu(uam_wire.PduType.ACK, ack=9),
        uam_wire.Pdu(uam_wire.PduType.STORE, 5, 6, 2, (), uam_wire.Bulk(1, 2, 3, 40, 8), b"x" * 9),
        uam_wire.Pdu(uam_wire.PduType.GET, 7, 8, 0, (16,), uam_wire.Bulk(1, 2, 0, 32, 16)),
        uam_wire.Pdu(uam_wire.PduType.GET_REPLY, 9, 9, 0, (), uam_wire.Bulk(1, 2, 0, 32, 0), b"y"),
        uam_wire.Pdu(uam_wire.PduType.GET_REPLY, 9, 9, 1, (), uam_wire.Bulk(1, 2, 0, 32, 0)),
    ]
    out = [uam_wire.build(pdu) for pdu in pdus]
    while len(out) < count:
        data = bytearray(rng.choice(out[: len(pdus)]))
        for _ in range(rng.randint(1, 2)):
            what = rng.randrange(3)
            if what == 0 and data:  # a byte of the header or bulk header changed
                data[rng.randrange(min(len(data), 40))] = rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 255))
            elif what == 1:
                del data[rng.randrange(len(data) + 1) :]
            else:
                data += bytes(rng.randint(1, 5))
        out.append(bytes(data))
    return out


@needs_tshark_lua
def test_the_dissector_recognises_exactly_what_stacklib_parses(tmp_path: Path) -> None:
    path = tmp_path / "guess.pcap"
    payloads = _mutations(seed=5, count=300)
    a, b = unet_eth.mac("02:00:00:00:00:01"), unet_eth.mac("02:00:00:00:00:02")
    with PcapWriter.open(path, LinkType.ETHERNET) as writer:
        for index, payload in enumerate(payloads):
            frame = unet_eth.UNetFrame(b, a, 7, payload)
            writer.write(index * 1e-6, unet_eth.build(frame))
    accepted = []
    for payload in payloads:
        try:
            uam_wire.parse(payload)
        except uam_wire.UamFormatError:
            accepted.append(False)
        else:
            accepted.append(True)
    assert 50 < sum(accepted) < 250  # both sides of the line are tested
    rows = fields(path, "frame.protocols")
    assert [row[0].endswith(":uam") for row in rows] == accepted


@needs_tshark_lua
def test_a_port_preference_forces_uam_and_flags_what_is_broken(tmp_path: Path) -> None:
    path = tmp_path / "broken.pcap"
    a, b = unet_eth.mac("02:00:00:00:00:01"), unet_eth.mac("02:00:00:00:00:02")
    good = unet_eth.build(unet_eth.UNetFrame(b, a, 7, uam_wire.build(uam_wire.Pdu(1, 1, 1))))
    unknown_type = unet_eth.build(unet_eth.UNetFrame(b, a, 7, bytes([9]) + bytes(7)))
    length_past_data = good[:14] + (200).to_bytes(2, "big") + good[16:]
    with PcapWriter.open(path, LinkType.ETHERNET) as writer:
        for index, frame in enumerate((good, unknown_type, length_past_data)):
            writer.write(index * 1e-6, frame)
    guessed = fields(path, "frame.protocols", alarms=True)
    assert [row[0] for row in guessed] == [
        "eth:ethertype:unet:uam",
        "eth:ethertype:unet:data",  # an unknown type: not taken for UAM by the guess
        "eth:ethertype:unet",
    ]
    forced = fields(
        path,
        "frame.protocols",
        "uam.type",
        "_ws.expert.message",
        alarms=True,
        options=("-o", "unet.uam_ports:3-4,7"),
    )
    assert forced == [
        ["eth:ethertype:unet:uam", "1", ""],
        ["eth:ethertype:unet:uam", "9", "Malformed UAM PDU: unknown PDU type 9"],
        ["eth:ethertype:unet", "", "Length field past the frame's data"],
    ]
