"""Export measured LogP parameters to SimGrid's SMPI (a platform file and its options).

Any stack measured with :mod:`stacklib.bench.logp`, simulated or real, can be studied at
thousands of nodes in SimGrid (https://simgrid.org) from what the measurement found:

* the platform (:attr:`SimGridExport.platform_xml`): a SimGrid ``<cluster>`` of ``hosts`` hosts,
  each with its own full-duplex link (``SPLITDUPLEX``: one port out, one in) to a crossbar; a
  route crosses the sender's link and the receiver's, each with half the base latency, and the
  link bandwidth is the large-message slope of L;
* SMPI options (:attr:`SimGridExport.options`), written both into the platform's ``<config>``
  block (``smpirun -platform stacklib.xml`` applies them with nothing else) and into
  ``stacklib.cfg`` (one ``key:value`` a line, every key one SimGrid knows):
  ``network/model:SMPI``, the model under which SimGrid applies ``smpi/lat-factor`` and
  ``smpi/bw-factor`` (piecewise-constant ``threshold:factor`` lists) that make the link's time
  equal the measured L at each size; ``smpi/os``, ``smpi/or`` and ``smpi/ois`` as SMPI's
  piecewise-linear ``threshold:offset:factor`` lists through the measured points; no cross
  traffic and no TCP window bound, so SimGrid adds nothing of its own.

A node's NI takes its messages one at a time, but SMPI spends a message's L in parallel with
every other message in flight: a library whose NI does the per-message work (PM, VMMC) would
come out fast as soon as messages overlap.  The export therefore charges a send max(Os, g) and
a receive max(Or, gr) (the send and receive gaps, which SMPI spends one after another on each
rank) and takes the excess out of L, so the round trip is unchanged
(:attr:`SimGridExport.gaps`).

Negative L (FM at 4 KB, where the receiver's copy overlaps the sender's, paper 004 §4.1.5)
cannot be a link time: the export gives the link 0 there and folds the deficit into Os and Or,
each reduced in proportion, so Os + L + Or and the round trip stay the measured ones
(:attr:`SimGridExport.folded` lists what was folded).  stacklib's own metadata (the method, the
measured RTT/2, the folds) goes to the sidecar ``stacklib.json``, never to the ``.cfg``.
:mod:`stacklib.bench.smpirun` compiles and runs MPI programs on the exported files.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from stacklib.bench.result import Result

__all__ = [
    "SMPI_ENVELOPE",
    "SimGridExport",
    "evaluate",
    "export_logp",
    "factors",
    "piecewise_linear",
]

US = 1e-6
#: Bytes SMPI adds to every message on the wire (its envelope: tag, source, communicator);
#: the link's latency and bandwidth factors are looked up, and its bandwidth spent, on the
#: message size plus this.
SMPI_ENVELOPE = 16
#: Messages up to this size flow into the receiver's buffers without waiting for its
#: receive, as the NI of every paper 004 library deposits them (SMPI's default, 0, starts
#: the transfer only when the receive is posted: receivers then take messages one latency
#: at a time).  SMPI's own send-is-detached threshold.
EAGER = 65536
#: The bandwidth factor that makes a link's size term vanish (a link time of 0 for FM's
#: negative L): 1e9 times the link bandwidth leaves picoseconds.
_INSTANT = 1e9


def piecewise_linear(points: Sequence[tuple[int, float]]) -> str:
    """SMPI's ``threshold:offset:factor;...`` through ``points`` (size, seconds).

    Segment i starts at size i and follows the line through points i and i+1 (the last one
    continues the last line); a single point gives a constant.  The segments meet at the
    points, so the value there does not depend on which segment SMPI picks.
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
            # Equal values differing in the last bit are flat, not a slope of 1e-20 s/B.
            slope = 0.0 if abs(v1 - v0) <= 1e-12 * max(abs(v0), abs(v1)) else slope
        offset = value - slope * size
        threshold = 0 if i == 0 else size
        parts.append(f"{threshold}:{offset:.9g}:{slope:.9g}")
    return ";".join(parts)


def factors(points: Sequence[tuple[int, float]]) -> str:
    """SMPI's piecewise-constant ``threshold:factor;...`` that gives each point's factor to
    its size on the wire (:data:`SMPI_ENVELOPE` added): SimGrid 3.32 applies an entry to the
    sizes above its threshold up to the next one, so entry i's threshold is point i-1's wire
    size (the first is 0)."""
    pts = sorted(points)
    if not pts:
        raise ValueError("a factor list needs at least one point")
    thresholds = [0] + [s + SMPI_ENVELOPE for s, _ in pts[:-1]]
    return ";".join(f"{t}:{v:.9g}" for t, (_, v) in zip(thresholds, pts, strict=True))


def evaluate(spec: str, size: float) -> float:
    """Value at ``size`` of a piecewise spec (linear ``t:o:f`` or constant ``t:v``), looked up
    as SimGrid 3.32 does: the last entry whose threshold is below ``size`` (the first entry
    when none is).  SMPI looks ``smpi/os`` and ``smpi/or`` up by the message size, the factors
    by the size on the wire (message + :data:`SMPI_ENVELOPE`)."""
    entries = [[float(x) for x in part.split(":")] for part in spec.split(";")]
    chosen = entries[0]
    for fields in entries:
        if fields[0] < size:
            chosen = fields
    return chosen[1] + chosen[2] * size if len(chosen) == 3 else chosen[1]


@attrs.frozen
class SimGridExport:
    """A SimGrid platform and the SMPI options for one measured stack."""

    platform_xml: str
    options: Mapping[str, str]
    #: The measured RTT/2 per size (seconds), for comparing a replay.
    rtt_half: Mapping[int, float]
    #: Per size whose L was negative: the seconds folded into Os + Or (link time 0 there).
    folded: Mapping[int, float] = attrs.field(factory=dict)
    #: Per size: the seconds of L charged to Os and Or as the gaps g and gr (their excess).
    gaps: Mapping[int, float] = attrs.field(factory=dict)
    #: stacklib's facts about the measurement (the method), for the sidecar JSON.
    meta: Mapping[str, str] = attrs.field(factory=dict)

    def write(self, directory: str | Path, name: str = "stacklib") -> tuple[Path, Path]:
        """Write ``<name>.xml``, ``<name>.cfg`` (``key:value`` a line, for ``--cfg=``) and
        the sidecar ``<name>.json``; return the platform's and the config's paths."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        platform = folder / f"{name}.xml"
        platform.write_text(self.platform_xml)
        config = folder / f"{name}.cfg"
        config.write_text("".join(f"{k}:{v}\n" for k, v in self.options.items()))
        sidecar = {
            "rtt_half": {str(k): v for k, v in self.rtt_half.items()},
            "gaps_in_overheads": {str(k): v for k, v in self.gaps.items()},
            "folded_into_overheads": {str(k): v for k, v in self.folded.items()},
            **self.meta,
        }
        (folder / f"{name}.json").write_text(json.dumps(sidecar, indent=2) + "\n")
        return platform, config


def _column(result: Result, key: str) -> dict[int, float]:
    out = {}
    for row in result.rows:
        size, value = row.get("size"), row.get(key)
        if isinstance(size, int | float) and isinstance(value, int | float):
            out[int(size)] = float(value) * US
    return out


def _required(result: Result, key: str) -> dict[int, float]:
    points = _column(result, key)
    if not points:
        raise ValueError(f"the LogP result has no {key!r} values to export")
    return points


def _per_byte(lat: Sequence[tuple[int, float]]) -> float:
    """The link's seconds per byte: the slope of L over the last two sizes where L grows."""
    for (s0, l0), (s1, l1) in reversed(list(itertools.pairwise(lat))):
        if l1 > l0:
            return (l1 - l0) / (s1 - s0)
    return 0.0


def export_logp(
    result: Result, hosts: int = 2, name: str = "stacklib", *, gaps: bool = True
) -> SimGridExport:
    """A SimGrid platform of ``hosts`` hosts and SMPI options from a
    :func:`stacklib.bench.logp.logp` result (sizes with Os, Or and L all measured).

    With ``gaps`` (the default), a send costs the sender max(Os, g) and a receive the receiver
    max(Or, gr) (gr = g where the result has no gr): the NI's per-message work, which LogP puts in
    L, is then spent one message after another at each node as the NI spends it, and L shrinks
    by as much, so the round trip stays the measured one (:attr:`SimGridExport.gaps` lists
    what moved).  ``gaps=False`` exports Os and Or as measured."""
    if hosts < 2:
        raise ValueError(f"a platform needs at least two hosts, not {hosts}")
    os_all, or_all = _required(result, "os_us"), _required(result, "or_us")
    lat_all = _required(result, "l_us")
    sizes = sorted(set(os_all) & set(or_all) & set(lat_all))
    if len(sizes) < 2:
        raise ValueError("exporting the link needs Os, Or and L at two sizes at least")
    send_gap = _column(result, "g_us") if gaps else {}
    recv_gap = _column(result, "gr_us") if gaps else {}
    os_: dict[int, float] = {}
    or_: dict[int, float] = {}
    folded: dict[int, float] = {}
    moved: dict[int, float] = {}
    link: dict[int, float] = {}
    for s in sizes:
        # Or can come out a rounding error below 0 (VMMC's is 0).
        o_s, o_r, lat = max(os_all[s], 0.0), max(or_all[s], 0.0), lat_all[s]
        # A node's NI takes its messages one at a time (paper 004 §4.1.2: g is the NI's
        # per-message time where it exceeds the host's); SMPI spends L in parallel for every
        # message in flight, and a rank's Os and Or one after another.
        # LogP's one g bounds receptions too where no receive gap was measured (request-reply).
        g_s = max(send_gap.get(s, 0.0), o_s)
        g_r = max(recv_gap.get(s, send_gap.get(s, 0.0)), o_r)
        if g_s + g_r > o_s + o_r:
            moved[s] = g_s + g_r - o_s - o_r
            lat -= moved[s]
            o_s, o_r = g_s, g_r
        if lat < 0.0:
            # Fold the overlap into the overheads, in proportion, keeping Os + L + Or.
            share = o_s / (o_s + o_r) if o_s + o_r > 0 else 0.5
            o_s, o_r = o_s + lat * share, o_r + lat * (1.0 - share)
            folded[s], lat = -lat, 0.0
        os_[s], or_[s], link[s] = o_s, o_r, lat
    points = sorted(link.items())
    per_byte = _per_byte(points)
    bandwidth = 1.0 / per_byte if per_byte > 0 else 1e12
    # SMPI puts the message and its envelope on the link: L(s) = latency * lat_factor(s)
    # + (s + envelope) / (bandwidth * bw_factor(s)).  The base latency is the smallest size's.
    (s0, l0) = points[0]
    latency = max(l0 - (s0 + SMPI_ENVELOPE) * per_byte, 1e-9)
    lat_factor, bw_factor = [], []
    for s, v in points:
        serial = (s + SMPI_ENVELOPE) * per_byte
        if v >= serial:
            lat_factor.append((s, (v - serial) / latency))
            bw_factor.append((s, 1.0))
        else:  # below the bandwidth line (or 0): no latency, a faster link for this size
            lat_factor.append((s, 0.0))
            bw_factor.append((s, serial / v if v > 0 else _INSTANT))
    config: dict[str, str] = {
        "network/model": "SMPI",
        "network/crosstraffic": "0",
        "network/TCP-gamma": "0",
        "smpi/async-small-thresh": str(EAGER),
        "smpi/os": piecewise_linear(sorted(os_.items())),
        "smpi/or": piecewise_linear(sorted(or_.items())),
        "smpi/ois": piecewise_linear(sorted(os_.items())),
        "smpi/lat-factor": factors(lat_factor),
        "smpi/bw-factor": factors(bw_factor),
    }
    meta = {str(k): str(v) for k, v in result.facts.items() if k in ("method",)}
    meta["sizes"] = ",".join(map(str, sizes))
    props = "\n".join(f'    <prop id="{k}" value="{v}"/>' for k, v in config.items())
    notes = "".join(
        f"\n  <!-- stacklib: L at {s} B was {-f / US:.3f} us, folded into Os and Or -->"
        for s, f in folded.items()
    )
    if moved:
        notes += "\n  <!-- stacklib: Os = max(Os, g), Or = max(Or, gr), L reduced by as much -->"
    platform = (
        "<?xml version='1.0'?>\n"
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n'
        '<platform version="4.1">\n'
        f"  <config>\n{props}\n  </config>{notes}\n"
        f'  <cluster id="{name}" prefix="{name}" suffix="" radical="0-{hosts - 1}" '
        f'speed="1Gf" bw="{bandwidth:.9g}Bps" lat="{latency / 2:.9g}s" '
        'sharing_policy="SPLITDUPLEX"/>\n'
        "</platform>\n"
    )
    rtt = {s: v for s, v in _column(result, "rtt_half_us").items() if s in link}
    return SimGridExport(platform, config, rtt, folded, moved, meta)
