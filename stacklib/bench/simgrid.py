"""Export measured LogP parameters to SimGrid (a platform file and SMPI options).

Any stack measured with :mod:`stacklib.bench.logp`, simulated or real, can be studied at
thousands of nodes in SimGrid (https://simgrid.org) from what the measurement found:

* the platform (:attr:`SimGridExport.platform_xml`): hosts joined by one link per host to a
  crossbar, whose latency is L of the smallest message and whose bandwidth is the large-message
  slope of L (the last two sizes);
* SMPI options (:attr:`SimGridExport.options`): ``smpi/os``, ``smpi/or`` and ``smpi/ois`` as
  SMPI's piecewise-linear ``threshold:offset:factor`` lists (seconds, seconds per byte) through
  the measured points, and ``smpi/lat-factor`` / ``smpi/bw-factor`` as ``threshold:factor``
  lists that make the link's time equal the measured L at each size;
* the network model settings that make SimGrid's link time exactly ``latency + size /
  bandwidth`` (CM02 without cross traffic), so the replay adds nothing of its own.

:data:`REPLAY_SCRIPT` is a self-contained SimGrid (s4u, Python) ping-pong that reads the two
files and applies the per-size factors as SMPI does; ``tests/bench/test_simgrid.py`` runs it
where SimGrid's Python module is installed and compares its RTT/2 with stacklib's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from stacklib.bench.result import Cell, Result

__all__ = [
    "REPLAY_SCRIPT",
    "SimGridExport",
    "evaluate",
    "export_logp",
    "factors",
    "piecewise_linear",
]

US = 1e-6


def piecewise_linear(points: Sequence[tuple[int, float]]) -> str:
    """SMPI's ``threshold:offset:factor;...`` through ``points`` (size, seconds).

    Segment i starts at size i and follows the line through points i and i+1 (the last one
    continues the last line); a single point gives a constant.
    """
    pts = sorted(points)
    if not pts:
        raise ValueError("a piecewise function needs at least one point")
    parts = []
    for i, (size, value) in enumerate(pts):
        if len(pts) == 1:
            slope = 0.0
        else:
            (s0, v0), (s1, v1) = (pts[i], pts[i + 1]) if i + 1 < len(pts) else (pts[i - 1], pts[i])
            slope = (v1 - v0) / (s1 - s0) if s1 != s0 else 0.0
        offset = value - slope * size
        threshold = 0 if i == 0 else size
        parts.append(f"{threshold}:{offset:.9g}:{slope:.9g}")
    return ";".join(parts)


def factors(points: Sequence[tuple[int, float]]) -> str:
    """SMPI's piecewise-constant ``threshold:factor;...`` (the first threshold is 0)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("a factor list needs at least one point")
    return ";".join(f"{0 if i == 0 else s}:{v:.9g}" for i, (s, v) in enumerate(pts))


def evaluate(spec: str, size: int) -> float:
    """Value at ``size`` of a piecewise spec (linear ``t:o:f`` or constant ``t:v``), as SMPI."""
    chosen: list[float] | None = None
    for part in spec.split(";"):
        fields = [float(x) for x in part.split(":")]
        if fields[0] <= size:
            chosen = fields
    if chosen is None:
        raise ValueError(f"{spec!r} does not cover size {size}")
    return chosen[1] + chosen[2] * size if len(chosen) == 3 else chosen[1]


@attrs.frozen
class SimGridExport:
    """A SimGrid platform and the SMPI options for one measured stack."""

    platform_xml: str
    options: Mapping[str, str]
    #: The measured RTT/2 per size (seconds), for comparing a replay.
    rtt_half: Mapping[int, float]

    def write(self, directory: str | Path, name: str = "stacklib") -> tuple[Path, Path]:
        """Write ``<name>.xml`` and ``<name>.cfg`` (one ``--cfg=`` option a line); their paths."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        platform = folder / f"{name}.xml"
        platform.write_text(self.platform_xml)
        config = folder / f"{name}.cfg"
        config.write_text("".join(f"{k}:{v}\n" for k, v in self.options.items()))
        (folder / f"{name}.json").write_text(
            json.dumps({"rtt_half": {str(k): v for k, v in self.rtt_half.items()}}, indent=2)
        )
        return platform, config


def _column(result: Result, key: str) -> list[tuple[int, float]]:
    out = []
    for row in result.rows:
        size, value = row.get("size"), row.get(key)
        if isinstance(size, int | float) and isinstance(value, int | float):
            out.append((int(size), float(value) * US))
    return out


def _required(result: Result, key: str) -> list[tuple[int, float]]:
    points = _column(result, key)
    if not points:
        raise ValueError(f"the LogP result has no {key!r} values to export")
    return points


def export_logp(result: Result, hosts: int = 2, name: str = "stacklib") -> SimGridExport:
    """A SimGrid platform and SMPI options from a :func:`stacklib.bench.logp.logp` result."""
    if hosts < 2:
        raise ValueError(f"a platform needs at least two hosts, not {hosts}")
    os_ = _required(result, "os_us")
    or_ = [(s, max(v, 0.0)) for s, v in _required(result, "or_us")]
    lat = _required(result, "l_us")
    if len(lat) < 2:
        raise ValueError("exporting the link needs L at two sizes at least")
    (s0, l0), (s1, l1) = lat[-2], lat[-1]
    per_byte = (l1 - l0) / (s1 - s0) if s1 > s0 and l1 > l0 else 0.0
    bandwidth = 1.0 / per_byte if per_byte > 0 else 1e12
    latency = max(lat[0][1] - lat[0][0] * per_byte, 1e-9)
    # Per size: the link's latency scaled so that latency * f + size / bandwidth = L(size).
    lat_factor = [(s, max(0.0, (v - s * per_byte) / latency)) for s, v in lat]
    rtt: dict[int, float] = dict(_column(result, "rtt_half_us"))
    hosts_xml = "\n".join(
        f'    <host id="{name}{i}" speed="1Gf"/>\n'
        f'    <link id="{name}{i}-link" bandwidth="{bandwidth:.9g}Bps" '
        f'latency="{latency:.9g}s" sharing_policy="SHARED"/>'
        for i in range(hosts)
    )
    routes = "\n".join(
        f'    <route src="{name}{i}" dst="{name}{j}">'
        f'<link_ctn id="{name}{i}-link"/><link_ctn id="{name}{j}-link"/></route>'
        for i in range(hosts)
        for j in range(i + 1, hosts)
    )
    # Two links per route: each carries half the latency so a route's latency is L.
    hosts_xml = hosts_xml.replace(f'latency="{latency:.9g}s"', f'latency="{latency / 2:.9g}s"')
    platform = (
        "<?xml version='1.0'?>\n"
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n'
        '<platform version="4.1">\n'
        f'  <zone id="{name}" routing="Full">\n{hosts_xml}\n{routes}\n  </zone>\n'
        "</platform>\n"
    )
    options: dict[str, str] = {
        "network/model": "CM02",
        "network/crosstraffic": "0",
        "network/latency-factor": "1",
        "network/bandwidth-factor": "1",
        "smpi/os": piecewise_linear(os_),
        "smpi/or": piecewise_linear(or_),
        "smpi/ois": piecewise_linear(os_),
        "smpi/lat-factor": factors(lat_factor),
        "smpi/bw-factor": factors([(s, 1.0) for s, _ in lat[:1]]),
    }
    facts: Mapping[str, Cell] = result.facts
    if "method" in facts:
        options["stacklib/method"] = str(facts["method"]).replace(":", " ")
    return SimGridExport(platform, options, rtt)


#: A standalone SimGrid ping-pong (s4u, Python; needs only ``simgrid``): ``python3 SCRIPT
#: PLATFORM CONFIG SIZE`` prints RTT/2 in seconds.  Per message size it applies the exported
#: SMPI latency factor to the link, as SMPI does, and spends ``smpi/os`` and ``smpi/or`` as
#: computation on the sending and receiving hosts (1 Gflop/s: one flop per nanosecond).
REPLAY_SCRIPT = r"""
import sys
from simgrid import Actor, Engine, Host, Mailbox, this_actor

platform, config, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = dict(line.rstrip("\n").split(":", 1) for line in open(config) if ":" in line)


def value(spec, n):
    chosen = None
    for part in spec.split(";"):
        fields = [float(x) for x in part.split(":")]
        if fields[0] <= n:
            chosen = fields
    return chosen[1] + chosen[2] * n if len(chosen) == 3 else chosen[1]


cfg = [f"--cfg={k}:{v}" for k, v in options.items() if k.startswith("network/")]
cfg = [c for c in cfg if "latency-factor" not in c]
cfg.append(f"--cfg=network/latency-factor:{value(options['smpi/lat-factor'], size)}")
cfg.append("--log=root.thres:critical")
engine = Engine([sys.argv[0], *cfg])
engine.load_platform(platform)
hosts = engine.all_hosts
os_, or_ = value(options["smpi/os"], size), value(options["smpi/or"], size)
ROUNDS = 20
result = []


def side(me, other, first):
    out, inbox = Mailbox.by_name(other), Mailbox.by_name(me)
    start = Engine.clock
    for _ in range(ROUNDS):
        if first:
            this_actor.execute(os_ * 1e9)
            out.put("m", size)
            inbox.get()
            this_actor.execute(or_ * 1e9)
        else:
            inbox.get()
            this_actor.execute(or_ * 1e9)
            this_actor.execute(os_ * 1e9)
            out.put("m", size)
    if first:
        result.append((Engine.clock - start) / (2 * ROUNDS))


Actor.create("a", hosts[0], side, "a", "b", True)
Actor.create("b", hosts[1], side, "b", "a", False)
engine.run()
print(repr(result[0]))
"""
