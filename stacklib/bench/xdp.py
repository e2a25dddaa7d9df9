"""``stacklib bench xdp``: the xdp transport's targets, measured side by side in one run.

Two fresh network namespaces joined by a veth pair; each measurement is a pair of processes,
one per namespace (:mod:`stacklib.bench.peers.xdp`), each attaching stacklib's XDP program to
its own veth end.  The rows, each with its target, the measured value and whether it holds:

* raw U-Net over xdp, 40-byte ping-pong, busy-polling on two CPUs: median and p99 round trip
  against blocking kernel UDP sockets (no trio) on one CPU and on two; the target (median at
  most half the kernel's) is taken against the kernel's best placement;
* one-way streams, frames per second counted at the receiver: 64-byte messages sent with
  :meth:`~stacklib.transports.xdp.ni.XdpEndpoint.send_many` against kernel UDP ``sendto`` (at
  least 2x and at least 1,000,000 frames/s), and the same with full 1514-byte Ethernet frames
  (the NI's ``max_message``; 1472-byte UDP payloads: at least 1.5x);
* UAM over xdp (paper 000 §5): a stream at full rate must deliver every message once, in
  order; its rate is reported.

Losses are reported, never hidden: sent against received, and the receiver's socket and XDP
program counters (:meth:`~stacklib.transports.xdp.ni.XdpNI.socket_statistics`).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from stacklib.bench.peers.xdp import Role, run_pair
from stacklib.bench.result import Cell, Column, Result
from stacklib.errors import StacklibError

__all__ = ["XdpBenchError", "XdpBenchParams", "bench_xdp", "xdp_bench_problem"]

#: The veth ends' addresses (for the kernel UDP baselines; each namespace has only its end).
_ADDRESSES = ("10.99.0.1", "10.99.0.2")
#: The stream's kernel UDP payload that makes a 1514-byte Ethernet frame (1500-byte MTU,
#: 20-byte IP and 8-byte UDP headers): the same frame as the xdp NI's largest message.
_UDP_FULL_FRAME = 1472

COLUMNS = (
    Column("what", "measurement"),
    Column("xdp", "xdp", digits=2),
    Column("kernel", "kernel UDP", digits=2),
    Column("unit", "unit"),
    Column("ratio", "xdp/kernel", digits=2),
    Column("target", "target"),
    Column("holds", "holds"),
    Column("lost", "lost (xdp/kernel)"),
)


class XdpBenchError(StacklibError, RuntimeError):
    """The benchmark cannot run here (the message says what is missing)."""


@attrs.frozen
class XdpBenchParams:
    """How much each measurement of :func:`bench_xdp` does."""

    #: Timed round trips per ping-pong (after 200 untimed ones).
    iterations: int = attrs.field(default=20000, validator=attrs.validators.ge(1))
    #: Messages per raw stream (64-byte and full-frame).
    messages: int = attrs.field(default=500_000, validator=attrs.validators.ge(2))
    #: Messages of the UAM stream.
    uam_messages: int = attrs.field(default=50_000, validator=attrs.validators.ge(2))
    #: The UAM stream's go-back-N window (messages in flight).
    window: int = attrs.field(default=64, validator=attrs.validators.ge(1))


def xdp_bench_problem() -> str | None:
    """Why the benchmark cannot run here (namespaces, AF_XDP or bpf missing), or None."""
    from stacklib.netns import capability_problem
    from stacklib.transports.xdp.bpf import bpf_problem
    from stacklib.transports.xdp.xsk import xdp_problem

    return capability_problem() or xdp_problem() or bpf_problem()


@contextmanager
def _link() -> Iterator[tuple[str, str]]:
    """Two namespaces joined by a veth pair (``eth0`` on each side), removed afterwards."""
    from stacklib.netns import netns, veth_pair

    with netns("slxdp") as client, netns("slxdp") as server:
        veth_pair(
            client,
            server,
            f"{_ADDRESSES[0]}/24",
            f"{_ADDRESSES[1]}/24",
            name_a="eth0",
            name_b="eth0",
        )
        yield client, server


def _cpus() -> tuple[int | None, int | None]:
    """(client's CPU, server's CPU): two different CPUs when there are two."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) > 1 else (cpus[0], cpus[0])


def bench_xdp(params: XdpBenchParams | None = None) -> Result:
    """Run every measurement (root; creates and removes its namespaces) and return the table.

    Raises :class:`XdpBenchError` naming the problem when the machine cannot run it
    (:func:`xdp_bench_problem`), RuntimeError when a peer process fails.
    """
    params = params or XdpBenchParams()
    problem = xdp_bench_problem()
    if problem is not None:
        raise XdpBenchError(f"stacklib bench xdp cannot run here: {problem}")
    mine, theirs = _cpus()
    reports: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    with _link() as (client_ns, server_ns):

        def pair(name: str, server: str, client: str, **workload: Any) -> None:
            same = workload.pop("same_cpu", False)
            server_role = Role(server, "eth0", mine if same else theirs, **workload)
            client_role = Role(client, "eth0", mine, **workload)
            reports[name] = run_pair(
                (server_ns, attrs.evolve(server_role, address=_ADDRESSES[1])),
                (client_ns, attrs.evolve(client_role, address=_ADDRESSES[1])),
                timeout=120 + workload.get("count", 0) * 1e-3,
            )

        rounds, messages = params.iterations, params.messages
        pair("ping xdp", "xdp-echo", "xdp-ping", count=rounds, size=40)
        pair("ping udp 1cpu", "udp-echo", "udp-ping", count=rounds, size=40, same_cpu=True)
        pair("ping udp 2cpu", "udp-echo", "udp-ping", count=rounds, size=40)
        pair("stream xdp 64", "xdp-sink", "xdp-source", count=messages, size=64)
        pair("stream udp 64", "udp-sink", "udp-source", count=messages, size=64)
        pair("stream xdp full", "xdp-sink", "xdp-source", count=messages, size=0)
        pair("stream udp full", "udp-sink", "udp-source", count=messages, size=_UDP_FULL_FRAME)
        pair(
            "uam",
            "uam-sink",
            "uam-source",
            count=params.uam_messages,
            size=64,
            window=params.window,
        )
    return _table(params, reports, (mine, theirs))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _holds(ok: bool) -> str:
    return "yes" if ok else "NO"


def _lost(xdp: tuple[dict[str, Any], dict[str, Any]], kernel: Any = None) -> str:
    def one(pair: tuple[dict[str, Any], dict[str, Any]]) -> str:
        return f"{pair[1]['sent'] - pair[0]['received']:,}"

    return one(xdp) + (f" / {one(kernel)}" if kernel is not None else "")


def _table(
    params: XdpBenchParams,
    reports: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    cpus: tuple[int | None, int | None],
) -> Result:
    ping = reports["ping xdp"][1]
    one, two = reports["ping udp 1cpu"][1], reports["ping udp 2cpu"][1]
    best = min((one, two), key=lambda r: float(r["median_us"]))
    where = "1 CPU" if best is one else "2 CPUs"
    rows: list[dict[str, Cell]] = [
        {
            "what": f"40 B round trip, median (kernel: its best, {where})",
            "xdp": ping["median_us"],
            "kernel": best["median_us"],
            "unit": "us",
            "ratio": _ratio(ping["median_us"], best["median_us"]),
            "target": "<= 0.5x",
            "holds": _holds(ping["median_us"] <= 0.5 * best["median_us"]),
        },
        {
            "what": f"40 B round trip, p99 (kernel: {where})",
            "xdp": ping["p99_us"],
            "kernel": best["p99_us"],
            "unit": "us",
            "ratio": _ratio(ping["p99_us"], best["p99_us"]),
        },
    ]
    for label, report in (("1 CPU", one), ("2 CPUs", two)):
        rows.append(
            {
                "what": f"  kernel UDP round trip on {label}, median / p99",
                "kernel": f"{report['median_us']:.2f} / {report['p99_us']:.2f}",
                "unit": "us",
            }
        )
    for size, factor in (("64", 2.0), ("full", 1.5)):
        xdp, kernel = reports[f"stream xdp {size}"], reports[f"stream udp {size}"]
        rate, base = xdp[0]["rate"], kernel[0]["rate"]
        frame = "64 B" if size == "64" else f"{xdp[0]['size']} B (1514-byte frames)"
        ratio = _ratio(rate, base)
        rows.append(
            {
                "what": f"stream of {frame}, at the receiver",
                "xdp": rate,
                "kernel": base,
                "unit": "frames/s",
                "ratio": ratio,
                "target": f">= {factor:g}x",
                "holds": _holds(ratio is not None and ratio >= factor),
                "lost": _lost(xdp, kernel),
            }
        )
        if size == "64":
            rows.append(
                {
                    "what": "stream of 64 B, absolute",
                    "xdp": rate,
                    "unit": "frames/s",
                    "target": ">= 1,000,000",
                    "holds": _holds(rate is not None and rate >= 1_000_000),
                }
            )
    sink, source = reports["uam"]
    complete = sink["received"] == sink["in_order"] == source["sent"] == params.uam_messages
    rows.append(
        {
            "what": f"UAM stream of 64 B over xdp, window {params.window}",
            "xdp": sink["rate"],
            "unit": "messages/s",
            "target": "all once, in order",
            "holds": _holds(complete),
            "lost": f"{source['sent'] - sink['in_order']:,}",
        }
    )
    facts: dict[str, Cell] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
        "cpus (client, server)": f"{cpus[0]}, {cpus[1]}",
        "round trips": params.iterations,
        "stream messages": params.messages,
        "uam messages": params.uam_messages,
        "uam delivered in order": f"{sink['in_order']:,} of {source['sent']:,}",
        "uam retransmitted": source["uam"].get("retransmitted"),
    }
    for name in ("stream xdp 64", "stream xdp full", "uam"):
        facts[f"{name}: receiver counters"] = _counters(reports[name][0]["ni"])
    return Result(
        title="xdp transport targets: raw U-Net and UAM over AF_XDP vs kernel UDP "
        "(two namespaces, one veth)",
        columns=COLUMNS,
        rows=rows,
        facts=facts,
        notes=_notes(rows),
    )


def _counters(ni: dict[str, Any]) -> str:
    """The receiver's loss counters in one line: the NI's, the socket's, the program's."""
    socket = ni["socket"]
    program = ni.get("program", {})
    parts = [f"received={ni['received']:,}", f"dropped={sum(ni['dropped'].values())}"]
    parts += [f"{key}={socket[key]}" for key in ("rx_dropped", "rx_ring_full")]
    parts += [f"{key}={socket[key]}" for key in ("rx_fill_ring_empty_descs",)]
    parts += [f"program {key}={value:,}" for key, value in program.items()]
    return ", ".join(parts)


def _notes(rows: list[dict[str, Cell]]) -> list[str]:
    notes = [
        "a veth has no zero-copy: the kernel copies every frame (into an skb when sent, "
        "into the receiver's UMEM on arrival), and the sender's wake-up call (one per batch "
        "of up to 256 frames) runs the receiving end's XDP program and both copies "
        "synchronously, on the sender's CPU",
    ]
    if any(row.get("holds") == "NO" for row in rows):
        notes.append(
            "a target that does not hold here says NO; docs/performance.md (xdp targets) "
            "explains where the time goes on this machine"
        )
    return notes
