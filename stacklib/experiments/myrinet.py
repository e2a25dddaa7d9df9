"""Paper 004 on the simulated LANai 4.1 platform: five libraries, LogP and three bandwidths.

Every library (:mod:`stacklib.transports.sim.myrinet_libs`) runs as a datagram service on two
simulated PPro 200 nodes (:mod:`stacklib.transports.sim.lanai4`) under the generic harness: LogP
by the paper's method (:mod:`stacklib.bench.logp`, Figs 3-8; request-reply for AM) and the three
bandwidths (:mod:`stacklib.bench.bandwidth`, Figs 9-12).  BIP runs with the benchmarks'
synchronization for messages of 256 bytes and more (paper 004 §4.1).  The figures checked are
the numbers and knees the text states (§3, §4.1.1-4.1.5, §4.2, abstract); the figures' other
values are not in the text.  docs/myrinet.md has the tables and how each claim was read.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from stacklib.bench import Session
from stacklib.bench.bandwidth import BandwidthParams, run_bandwidth
from stacklib.bench.logp import LogPParams, run_logp
from stacklib.bench.result import Cell, Result
from stacklib.reporting import progress
from stacklib.reporting.figures import Experiment, ExperimentResult, Figure, register_experiment
from stacklib.sim import Simulation
from stacklib.transports.sim.lanai4 import FIG2_CURVES, Lanai4Cluster, fig2, host_ni_bandwidth
from stacklib.transports.sim.myrinet_libs import LIBRARIES
from stacklib.transports.sim.myrinet_libs.transport import open_library

__all__ = [
    "BANDWIDTH_SIZES",
    "LOGP_SIZES",
    "am_receive_overhead",
    "bandwidths",
    "logp_of",
    "myrinet_curves",
    "myrinet_figures",
    "open_session",
    "run_myrinet",
]

#: Figs 4-8 span 4 B to 4 KB; 63/64 and 255/256 bracket the VMMC and BIP knees (§4.1.1).
LOGP_SIZES = (4, 16, 63, 64, 255, 256, 1024, 2048, 4096)
#: Figs 10-12 span 4 B to 1 MB; 128 KB-1 MB bracket the cache knees (§4.2).
BANDWIDTH_SIZES = (4, 64, 255, 256, 1024, 4096, 16384, 65536, 131072, 262144, 524288, 1048576)
#: Messages per bandwidth point: fewer for the large ones (virtual time settles at once).
_SMALL_MESSAGES, _LARGE_MESSAGES, _LARGE = 40, 6, 65536
#: From 1 MB (the top size, where only the BIP/VMMC peaks and AM's cache knee are read) four.
_HUGE_MESSAGES, _HUGE = 4, 1 << 20
CITE = "paper 004"


def open_session(name: str, seed: int = 1) -> tuple[Simulation, Session]:
    """Two simulated nodes running library ``name`` (``am``, ``bip``, ``fm``, ``pm``, ``vmmc``)."""
    try:
        cls = LIBRARIES[name]
    except KeyError:
        raise ValueError(f"no library {name!r} (known: {', '.join(LIBRARIES)})") from None
    sim = Simulation(seed)
    cluster = Lanai4Cluster(sim)
    # BIP runs with the benchmarks' synchronization for >= 256 bytes (paper 004 §4.1).
    libs = open_library(cluster, cls)
    return sim, Session(sim, cluster, libs, [{1: 1}, {0: 0}])


@functools.cache
def logp_of(name: str, sizes: tuple[int, ...] = LOGP_SIZES) -> Result:
    """LogP of library ``name`` by paper 004's method (Fig 3): AM as request-reply."""
    sim, session = open_session(name)
    am = name == "am"
    # AM's Os is timed on a burst below the buffering capacity (§4.1.3): one bulk store.
    params = LogPParams(
        sizes=sizes, request_reply=am, burst=1 if am else 8, messages=60, iterations=10, warmup=2
    )
    return sim.run(run_logp, session, params)


@functools.cache
def am_receive_overhead(sizes: tuple[int, ...] = (4, 1024, 4096)) -> dict[int, float]:
    """AM's Or measured at the receiver (Fig 3(c)): the stage Table 3 charges to Or for AM."""
    sim, session = open_session("am")
    params = LogPParams(sizes=sizes, messages=60, iterations=4, warmup=1)
    return _column(sim.run(run_logp, session, params), "or_us")


@functools.cache
def bandwidths(name: str, sizes: tuple[int, ...] = BANDWIDTH_SIZES) -> dict[str, dict[int, float]]:
    """MB/s of library ``name`` per mode and size (Figs 10-12; unidirectional as delivered)."""
    out: dict[str, dict[int, float]] = {}
    for group, messages in (
        (tuple(s for s in sizes if s < _LARGE), _SMALL_MESSAGES),
        (tuple(s for s in sizes if _LARGE <= s < _HUGE), _LARGE_MESSAGES),
        (tuple(s for s in sizes if s >= _HUGE), _HUGE_MESSAGES),
    ):
        if not group:
            continue
        sim, session = open_session(name)
        params = BandwidthParams(sizes=group, messages=messages, warmup=2)
        result = sim.run(run_bandwidth, session, params)
        for row in result.rows:
            out.setdefault(str(row["mode"]), {})[_int(row["size"])] = _num(row, "mb_s")
    return out


def _int(value: Cell) -> int:
    assert isinstance(value, int | float)
    return int(value)


def _num(row: Mapping[str, Cell], key: str) -> float:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) else float("nan")


def _column(result: Result, key: str) -> dict[int, float]:
    return {_int(row["size"]): _num(row, key) for row in result.rows}


def _holds(name: str, condition: bool, cite: str) -> Figure:
    return Figure.claim(name, condition, cite)


def _flat(values: Mapping[int, float], ratio: float = 1.3) -> bool:
    lo, hi = min(values.values()), max(values.values())
    return hi <= lo * ratio + 0.2


def myrinet_figures() -> list[Figure]:
    """The numbers and shapes paper 004 states, measured on the simulated platform."""
    names = list(LIBRARIES)
    with progress.step("LogP and bandwidth runs", 2 * len(names)) as runs:
        for n in names:  # the runs are cached: the lines below read them again at no cost
            logp_of(n)
            runs.advance()
            bandwidths(n)
            runs.advance()
    logp = {n: logp_of(n) for n in names}
    rtt = {n: _column(logp[n], "rtt_half_us") for n in names}
    g = {n: _column(logp[n], "g_us") for n in names}
    os_ = {n: _column(logp[n], "os_us") for n in names}
    or_ = {n: _column(logp[n], "or_us") for n in names}
    lat = {n: _column(logp[n], "l_us") for n in names}
    am_rx = am_receive_overhead()
    bw = {n: bandwidths(n) for n in names}
    uni = {n: bw[n]["unidirectional"] for n in names}
    peak = {n: max(uni[n].values()) for n in names}
    f2 = {int(row["size"]): row for row in fig2()}
    figures = [
        _holds(
            "Fig 2: LANai-started DMA beats host-started from 32 B to 4 KB",
            all(f2[s]["dma-lanai h2n"] > f2[s]["dma-host h2n"] for s in (32, 64, 256, 1024, 4096)),
            f"{CITE} §3",
        ),
        Figure(
            "Fig 2: LANai DMA at 4 KB / 133 MB/s PCI",
            1.0,
            f2[4096]["dma-lanai h2n"] / 133.0,
            "ratio",
            f"{CITE} §3: close to the maximum even for single page transfers",
        ),
        _holds(
            "Fig 2: PIO read < PIO write < PIO write-combined; N2H DMA < H2N DMA",
            f2[4096]["pio n2h"] < f2[4096]["pio h2n"] < f2[4096]["pio-wc h2n"]
            and f2[65536]["dma-lanai n2h"] < f2[65536]["dma-lanai h2n"],
            f"{CITE} §3, §4.2",
        ),
        Figure("RTT/2 4 B: BIP", 6.0, rtt["bip"][4], "us", f"{CITE} §4.1.1: about 6 us", 0.15),
        Figure("RTT/2 4 B: FM", 9.0, rtt["fm"][4], "us", f"{CITE} §4.1.1: about 9 us", 0.15),
        Figure("RTT/2 4 B: PM", 9.0, rtt["pm"][4], "us", f"{CITE} §4.1.1: about 9 us", 0.15),
        Figure("RTT/2 4 B: VMMC", 13.0, rtt["vmmc"][4], "us", f"{CITE} §4.1.1: about 13 us", 0.15),
        _holds(
            "RTT/2 4 B: AM the highest, all five within 5-17 us",
            rtt["am"][4] == max(r[4] for r in rtt.values())
            and all(5.0 <= r[4] <= 17.0 for r in rtt.values()),
            f"{CITE} abstract, §4.1.1",
        ),
        Figure("AM RTT/2 at 4 KB", 197.9, rtt["am"][4096], "us", f"{CITE} Fig 4 caption"),
        Figure("AM g at 4 KB", 153.5, g["am"][4096], "us", f"{CITE} Fig 5 caption"),
        _holds(
            "BIP knee at 256 B: RTT/2 drops (PIO to DMA), g jumps (synchronization)",
            rtt["bip"][256] < rtt["bip"][255] and g["bip"][256] > 1.3 * g["bip"][255],
            f"{CITE} §4.1.1-4.1.2",
        ),
        _holds(
            "VMMC knee at 64 B: RTT/2 drops (PIO to DMA)",
            rtt["vmmc"][64] < rtt["vmmc"][63],
            f"{CITE} §4.1.1",
        ),
        _holds("FM's L drops at 2 KB", lat["fm"][2048] < lat["fm"][1024], f"{CITE} §4.1.5"),
        _holds(
            "Os grows with size for FM; flat for PM, and for VMMC's DMA sizes",
            os_["fm"][4096] > 5 * os_["fm"][4]
            and _flat(os_["pm"])
            and _flat({s: v for s, v in os_["vmmc"].items() if s >= 64}),
            f"{CITE} §4.1.3",
        ),
        _holds(
            "Or grows with size for FM; flat for PM, VMMC and BIP's DMA sizes",
            or_["fm"][4096] > 5 * or_["fm"][4]
            and _flat(or_["pm"])
            and _flat(or_["vmmc"])
            and _flat({s: v for s, v in or_["bip"].items() if s >= 256}),
            f"{CITE} §4.1.4",
        ),
        _holds(
            "Or grows with size for AM (receive copy, measured at the receiver)",
            am_rx[4096] > 2 * am_rx[1024] > 2 * max(am_rx[4], 0.0),
            f"{CITE} §4.1.4 and Table 3 (NI to application buffer: Or) say AM's Or grows; "
            "§4.1.4's method (Or = g(0) - Os - Idle at the sender) sees only the small reply's "
            "cost, flat in the model, so the size dependence is checked where Table 3 puts it",
        ),
        Figure("VMMC Or", 0.0, abs(max(or_["vmmc"].values())), "us", f"{CITE} §4.1.4"),
        _holds(
            "L grows with size except for BIP",
            all(lat[n][1024] > 2 * lat[n][4] for n in ("am", "pm", "vmmc"))
            and lat["bip"][4096] - lat["bip"][256] < 0.25 * (rtt["bip"][4096] - rtt["bip"][256]),
            f"{CITE} §4.1.5",
        ),
    ]
    for n, label in (("bip", "BIP"), ("pm", "PM"), ("vmmc", "VMMC")):
        figures.append(
            Figure(
                f"peak unidirectional bandwidth: {label}",
                125.0,
                peak[n],
                "MB/s",
                f"{CITE} abstract: 95-125 MB/s with DMA and no copies (top of the range: these "
                "run at the NI-to-host DMA limit)",
                tolerance=0.05,
            )
        )
    for n, label in (("am", "AM"), ("fm", "FM")):
        figures.append(
            Figure(
                f"peak unidirectional bandwidth: {label}",
                65.0,
                peak[n],
                "MB/s",
                f"{CITE} abstract: 60-70 MB/s with copies or PIO (middle of the range)",
                tolerance=0.08,
            )
        )
    figures += [
        Figure("AM / VMMC peak bandwidth", 0.5, peak["am"] / peak["vmmc"], "ratio", f"{CITE} §4.2"),
        Figure(
            "AM / BIP peak bandwidth (abstract bound)",
            60.0 / 125.0,
            peak["am"] / peak["bip"],
            "ratio",
            f"{CITE} abstract: AM >= 60 MB/s and BIP <= 125 MB/s, so >= 0.48; §4.2's 'about "
            "60%' below BIP (0.4) would put BIP at 150-175 MB/s, above the 133 MB/s PCI bus "
            "(§3), or AM below the abstract's range: the model follows the abstract",
        ),
        _holds(
            "BIP knee at 256 B in all three bandwidths",
            uni["bip"][256] < uni["bip"][255]
            and bw["bip"]["pingpong"][256] > bw["bip"]["pingpong"][255]
            and bw["bip"]["simultaneous"][256] != bw["bip"]["simultaneous"][255],
            f"{CITE} §4.2",
        ),
        _holds(
            "FM and PM beat BIP, VMMC and AM at 256 B-4 KB (unidirectional)",
            all(
                min(uni["fm"][s], uni["pm"][s]) > max(uni["bip"][s], uni["am"][s])
                for s in (256, 1024)
            ),
            f"{CITE} §4.2",
        ),
        _holds(
            "cache knees: FM after 256 KB, AM after 512 KB",
            uni["fm"][524288] < 0.9 * uni["fm"][262144]
            and uni["fm"][262144] > 0.95 * uni["fm"][131072]
            and uni["am"][1048576] < 0.9 * uni["am"][524288]
            and uni["am"][524288] > 0.95 * uni["am"][262144],
            f"{CITE} §4.2",
        ),
    ]
    return figures


#: The LogP columns of Figs 4-8.
LOGP_COLUMNS = ("rtt_half_us", "g_us", "os_us", "or_us", "l_us")


def _reference(size: int) -> float:
    """Paper 004 §4.2's solid line: N2H PIO up to 16 bytes, then N2H DMA by the LANai."""
    return host_ni_bandwidth("pio" if size <= 16 else "dma-lanai", "n2h", size)


def myrinet_curves() -> dict[str, dict[int, float]]:
    """The curves of Figs 2, 4-8 and 10-12 (:mod:`stacklib.reporting.plots.myrinet`), from
    the same cached runs as :func:`myrinet_figures`: ``fig2: <method> <direction>`` (MB/s),
    ``<LogP column>: <library label>`` (us), ``<bandwidth mode>: <library label>`` (MB/s) and
    ``limit: NI-to-host`` (MB/s)."""
    rows = fig2()
    curves: dict[str, dict[int, float]] = {}
    for method, direction in FIG2_CURVES:
        key = f"{method} {direction}"
        curves[f"fig2: {key}"] = {_int(row["size"]): _num(row, key) for row in rows}
    for column in LOGP_COLUMNS:
        for lib, cls in LIBRARIES.items():
            curves[f"{column}: {cls.LABEL}"] = _column(logp_of(lib), column)
    curves["limit: NI-to-host"] = {size: _reference(size) for size in BANDWIDTH_SIZES}
    for mode in ("pingpong", "unidirectional", "simultaneous"):
        for lib, cls in LIBRARIES.items():
            curves[f"{mode}: {cls.LABEL}"] = bandwidths(lib)[mode]
    return curves


def run_myrinet() -> ExperimentResult:
    """The experiment: :func:`myrinet_figures` and the curves of its plots, which cost no
    further runs (the runs are cached)."""
    return ExperimentResult(myrinet_figures(), myrinet_curves())


register_experiment(
    Experiment(
        "myrinet",
        "Five user-space libraries on Myrinet: LogP and bandwidth (paper 004 Figs 2-12)",
        run_myrinet,
        seconds=35.0,  # wall time, measured once on a 2-core machine (--json wall_seconds)
    )
)
