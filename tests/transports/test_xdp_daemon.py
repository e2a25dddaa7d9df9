"""The daemon as xdp's OS service: a root daemon sets up, unprivileged processes get sockets.

Two namespaces joined by a veth with two queues; the daemon (root) runs in namespace A, the
clients run there too but drop to uid 65534 before they talk to it; the peer in namespace B is
a raw packet socket that echoes U-Net/FE frames (paper 000 §3: the OS service sets up, the
process then works alone).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import attrs
import pytest

from stacklib.daemon import DaemonClient, DaemonError
from stacklib.netns import capability_problem, netns, netns_argv
from stacklib.transports.xdp.bpf import bpf_problem
from stacklib.transports.xdp.xsk import xdp_problem
from stacklib.wire import unet_eth

pytestmark = pytest.mark.slow

NOBODY = 65534
CLIENT_PORT, ECHO_PORT, NOBODY_PORT = 5, 7, 99


def _problem() -> str | None:
    return capability_problem() or xdp_problem() or bpf_problem()


@pytest.fixture(scope="module", autouse=True)
def _needs_xdp() -> None:
    problem = _problem()
    if problem is not None:
        pytest.skip(f"needs namespaces, AF_XDP and bpf(2): {problem}")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@attrs.define
class Site:
    ns_a: str
    ns_b: str
    directory: str
    path: str
    mac_a: str
    mac_b: str
    daemon: subprocess.Popen[bytes] | None = None

    def xdp_attached(self) -> bool:
        links = json.loads(_ip("-n", self.ns_a, "-j", "link", "show", "dev", "veth0"))
        return any("xdp" in link for link in links)

    def status(self) -> dict[str, object]:
        with DaemonClient(self.path, start=False) as client:
            return client.status()


def _mac(ns: str, interface: str) -> str:
    return str(json.loads(_ip("-n", ns, "-j", "link", "show", "dev", interface))[0]["address"])


def _start_daemon(site: Site) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        netns_argv(
            site.ns_a,
            sys.executable,
            "-m",
            "stacklib.daemon",
            "--socket",
            site.path,
            "--socket-mode",
            "0666",
        ),
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            DaemonClient(site.path, start=False).close()
            return process
        except DaemonError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("the daemon did not start") from None
            time.sleep(0.05)


@pytest.fixture
def site() -> Iterator[Site]:
    with netns("slxd") as ns_a, netns("slxd") as ns_b:
        _ip(
            "link", "add", "veth0", "netns", ns_a, "numtxqueues", "2", "numrxqueues", "2",
            "type", "veth", "peer", "name", "veth1", "netns", ns_b,
            "numtxqueues", "2", "numrxqueues", "2",
        )  # fmt: skip
        for ns, name in ((ns_a, "veth0"), (ns_b, "veth1")):
            _ip("-n", ns, "link", "set", "dev", name, "up")
        directory = tempfile.mkdtemp(prefix="slxd-")
        os.chmod(directory, 0o755)  # the clients run as nobody
        site = Site(
            ns_a, ns_b, directory, f"{directory}/d.sock", _mac(ns_a, "veth0"), _mac(ns_b, "veth1")
        )
        site.daemon = _start_daemon(site)
        try:
            yield site
        finally:
            if site.daemon.poll() is None:
                site.daemon.send_signal(signal.SIGTERM)
                site.daemon.wait(10)
            subprocess.run(["rm", "-rf", directory], check=False)


# The client: imports as root, drops to nobody, then asks the daemon.  It reports each step
# as a JSON line and holds its socket until its stdin closes.
CLIENT = r"""
import errno, json, os, socket, sys, time
from stacklib.transports.ether import EtherAddress
from stacklib.transports.xdp import XdpNetwork, bpf, program
from stacklib.transports.xdp.attach import PortTaken
from stacklib.transports.xdp.service import add_daemon_node
from stacklib.transports.xdp.xsk import AF_XDP
from stacklib.daemon import DaemonError

path, queue, port, peer_mac, peer_port, exchange = sys.argv[1:7]
os.setgroups([])
os.setgid(65534)
os.setuid(65534)

def say(**fields):
    print(json.dumps(fields), flush=True)

def errno_of(call):
    try:
        call()
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
    return "allowed"

say(
    uid=os.getuid(),
    af_xdp=errno_of(lambda: socket.socket(AF_XDP, socket.SOCK_RAW, 0).close()),
    xskmap=errno_of(lambda: bpf.create_map(bpf.BPF_MAP_TYPE_XSKMAP, 4, 4, 8, "x")),
    program=errno_of(lambda: bpf.load_xdp_program(program.unet_redirect(-1, -1), "x")),
)
network = XdpNetwork("veth0", queue=int(queue))
try:
    node = add_daemon_node(network, "a", socket_path=path)
except DaemonError as error:
    say(open=str(error), code=getattr(error.code, "name", None))
    sys.exit(0)
say(open="ok", zero_copy=node.ni.xsk.zero_copy)
try:
    endpoint = node.os.create_endpoint(node.os.process("app"), port=int(port))
except PortTaken as error:
    say(grant=str(error))
    endpoint = node.os.create_endpoint(node.os.process("app"), port=int(port) + 1)
say(grant="ok", port=endpoint.port)
if exchange == "1":
    channel = node.os.create_channel(
        endpoint.owner, endpoint, EtherAddress(peer_mac, int(peer_port))
    )
    echoed = []
    for index in range(20):
        data = b"unprivileged %d" % index
        endpoint.send_nowait(channel, data)
        deadline = time.monotonic() + 5
        while (message := endpoint.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        echoed.append(message is not None and bytes(message.data) == data)
    say(echoed=sum(echoed))
sys.stdin.read()
network.close()
say(closed=True)
"""


def _client(
    site: Site, queue: int = 0, port: int = CLIENT_PORT, exchange: bool = False
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        netns_argv(
            site.ns_a,
            sys.executable,
            "-c",
            CLIENT,
            site.path,
            str(queue),
            str(port),
            site.mac_b,
            str(ECHO_PORT),
            "1" if exchange else "0",
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _lines(process: subprocess.Popen[str], count: int) -> list[dict[str, object]]:
    assert process.stdout is not None
    lines = []
    for _ in range(count):
        line = process.stdout.readline()
        assert line, f"the client exited early ({process.wait()})"
        lines.append(json.loads(line))
    return lines


# The peer: a packet socket in namespace B that answers every U-Net/FE frame for ECHO_PORT
# with the same data to CLIENT_PORT, and on request sends one frame to NOBODY_PORT.
ECHO = r"""
import socket, sys
from stacklib.wire import unet_eth
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(unet_eth.ETHERTYPE_UNET))
sock.bind(("veth1", 0))
mine = sock.getsockname()[4][:6]
print("ready", flush=True)
while True:
    frame = unet_eth.parse(sock.recv(2048))
    if frame.port == int(sys.argv[1]):
        reply = unet_eth.UNetFrame(frame.src, mine, int(sys.argv[2]), frame.payload)
        sock.send(unet_eth.build(reply))
"""


@pytest.fixture
def echo(site: Site) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        netns_argv(site.ns_b, sys.executable, "-c", ECHO, str(ECHO_PORT), str(CLIENT_PORT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    yield process
    process.kill()
    process.wait()


def _send_from_b(site: Site, port: int, data: bytes) -> None:
    script = (
        "import socket, sys; s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); "
        "s.bind(('veth1', 0)); s.send(bytes.fromhex(sys.argv[1]))"
    )
    frame = unet_eth.build(
        unet_eth.UNetFrame(unet_eth.mac(site.mac_a), unet_eth.mac(site.mac_b), port, data)
    )
    subprocess.run(
        netns_argv(site.ns_b, sys.executable, "-c", script, frame.hex()), check=True, timeout=30
    )


def _finish(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(20)


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _xdp(site: Site) -> dict[str, dict[str, object]]:
    xdp: dict[str, dict[str, object]] = site.status()["xdp"]  # type: ignore[assignment]
    return xdp


def test_unprivileged_client_exchanges_frames_but_cannot_set_up_alone(
    site: Site, echo: subprocess.Popen[str]
) -> None:
    assert not site.xdp_attached()
    client = _client(site, exchange=True)
    try:
        checks, opened, granted, exchanged = _lines(client, 4)
        # The kernel refuses the privileged half to the process itself.
        assert checks == {"uid": NOBODY, "af_xdp": "EPERM", "xskmap": "EPERM", "program": "EPERM"}
        assert opened["open"] == "ok" and granted == {"grant": "ok", "port": CLIENT_PORT}
        assert exchanged == {"echoed": 20}
        assert site.xdp_attached()  # by the daemon, on the first socket
        veth0 = _xdp(site)["veth0"]
        assert veth0["sockets"] == {"1": {"pid": client.pid, "queue": 0, "ports": [CLIENT_PORT]}}
        assert veth0["counters"]["redirected"] >= 20  # type: ignore[index]
    finally:
        _finish(client)
    assert _lines(client, 1) == [{"closed": True}]
    # The client gave its socket back: the last one, so the program is detached.
    _wait_for(lambda: not site.xdp_attached())
    assert _xdp(site) == {}


def test_a_port_or_queue_another_client_holds_is_refused(site: Site) -> None:
    first = _client(site)
    second = third = None
    try:
        assert _lines(first, 3)[1:] == [
            {"open": "ok", "zero_copy": False},
            {"grant": "ok", "port": 5},
        ]
        third = _client(site, queue=0)  # the same queue: refused at once, naming the holder
        _, refused = _lines(third, 2)
        assert refused["code"] == "IN_USE"
        assert f"queue 0 of veth0 is held by pid {first.pid}" in str(refused["open"])
        second = _client(site, queue=1)  # its own queue, but the first client's port
        _, opened, taken, fallback = _lines(second, 4)
        assert opened["open"] == "ok"
        assert f"U-Net port {CLIENT_PORT} on veth0 is held by pid {first.pid}" in str(
            taken["grant"]
        )
        assert fallback == {"grant": "ok", "port": CLIENT_PORT + 1}
        sockets = _xdp(site)["veth0"]["sockets"]
        assert sorted(s["ports"][0] for s in sockets.values()) == [5, 6]  # type: ignore[index]
        assert site.status()["counters"]["in_use"] == 2  # type: ignore[index]
    finally:
        for process in (first, second, third):
            if process is not None:
                _finish(process)


def test_unknown_port_is_dropped_and_counted_and_a_dead_client_is_revoked(site: Site) -> None:
    client = _client(site)
    try:
        _lines(client, 3)
        before = _xdp(site)["veth0"]["counters"]
        _send_from_b(site, NOBODY_PORT, b"for nobody")
        _send_from_b(site, CLIENT_PORT, b"for the client")

        def counted() -> bool:
            now = _xdp(site)["veth0"]["counters"]
            return now["no-socket"] > before["no-socket"]  # type: ignore[index,operator]

        _wait_for(counted)
        now = _xdp(site)["veth0"]["counters"]
        assert now["no-socket"] == before["no-socket"] + 1  # type: ignore[index,operator]
        assert now["redirected"] == before["redirected"] + 1  # type: ignore[index,operator]
    finally:
        client.kill()  # SIGKILL: no goodbye; the daemon reclaims on the closed connection
        client.wait()
    _wait_for(lambda: _xdp(site) == {})
    status = site.status()
    assert status["counters"]["reclaimed_xsks"] == 1  # type: ignore[index]
    assert not site.xdp_attached()
    _send_from_b(site, CLIENT_PORT, b"after")  # no program: the kernel takes it, nobody counts


def test_a_killed_daemon_leaves_no_program(site: Site) -> None:
    client = _client(site)
    try:
        _lines(client, 3)
        assert site.xdp_attached()
        assert site.daemon is not None
        site.daemon.send_signal(signal.SIGKILL)
        site.daemon.wait()
        _wait_for(lambda: not site.xdp_attached())  # the bpf_link died with the daemon
    finally:
        _finish(client)


def test_a_terminated_daemon_detaches_too(site: Site) -> None:
    client = _client(site)
    try:
        _lines(client, 3)
        assert site.daemon is not None
        site.daemon.send_signal(signal.SIGTERM)
        assert site.daemon.wait(10) == 0
        assert not site.xdp_attached()
    finally:
        _finish(client)


def test_the_client_refuses_a_daemon_in_another_namespace(site: Site) -> None:
    # This process is in the root namespace, where veth0 does not exist or is another link.
    from stacklib.transports.xdp.service import open_via_daemon

    names = [name for _, name in socket.if_nameindex()]
    if "veth0" in names:
        pytest.skip("this namespace has a veth0 of its own")
    with pytest.raises(ValueError, match="no network interface named 'veth0' here"):
        open_via_daemon("veth0", socket_path=site.path)


# The two conveniences, as nobody: the recipe parameter and the launcher's variable.
CONVENIENCES = r"""
import json, os, sys
from stacklib.daemon import DaemonClient
from stacklib.launch import bootstrap
from stacklib.sim import RealWorld
from stacklib.transports import transport_kind
from stacklib.transports.xdp import XdpParams

path, rendezvous = sys.argv[1:3]
os.setgroups([])
os.setgid(65534)
os.setuid(65534)

def sockets():
    with DaemonClient(path, start=False) as client:
        return [s["ports"] for s in client.status()["xdp"]["veth0"]["sockets"].values()]

kind = transport_kind("xdp")
network = kind.build(RealWorld(), XdpParams(interface="veth0", daemon=path), ["a"], None)
node = network.nodes["a"]
node.os.create_endpoint(node.os.process("app"), port=9)
built = sockets()
network.close()
rank = bootstrap({
    "STACKLIB_RANK": "0", "STACKLIB_SIZE": "1", "STACKLIB_RENDEZVOUS": rendezvous,
    "STACKLIB_TRANSPORT": "xdp", "STACKLIB_INTERFACE": "veth0", "STACKLIB_XDP_DAEMON": path,
})
launched = sockets()
rank.close()
print(json.dumps({"built": built, "launched": launched}))
"""


def test_the_recipe_parameter_and_the_launcher_variable_name_the_daemon(site: Site) -> None:
    rendezvous = os.path.join(site.directory, "rv")
    os.mkdir(rendezvous)
    os.chmod(rendezvous, 0o777)
    result = subprocess.run(
        netns_argv(site.ns_a, sys.executable, "-c", CONVENIENCES, site.path, rendezvous),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"built": [[9]], "launched": [[1]]}
    _wait_for(lambda: _xdp(site) == {})  # both gave their socket back on close
