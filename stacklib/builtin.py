"""The parts that ship with stacklib, by name: the module that registers each one.

This is the one place built-ins are declared (:mod:`stacklib.registry` imports a module the
first time one of its names is asked for).  Adding a built-in part means registering it in its
module and adding its name here; tests/test_registry.py checks the two agree.  Third-party parts
are declared by their own distributions' entry points instead.
"""

from __future__ import annotations

LAYERS: dict[str, str] = {
    "arq": "stacklib.layers.arq.driver",
    "ip": "stacklib.layers.ip.driver",
    "ip-ether": "stacklib.layers.ip.driver",
    "splitc": "stacklib.layers.splitc.layer",
    "tcp": "stacklib.layers.tcp.driver",
    "uam": "stacklib.layers.uam.layer",
    "udp": "stacklib.layers.udp.driver",
}

TRANSPORTS: dict[str, str] = {
    "memory": "stacklib.transports.memory",
    "shm": "stacklib.transports.shm",
    "udp": "stacklib.transports.udp",
    "ether": "stacklib.transports.ether",
    "xdp": "stacklib.transports.xdp",
    "tap": "stacklib.transports.tap",
    "sim-atm": "stacklib.transports.sim",
    "sim-fe": "stacklib.transports.sim",
    "sim-myrinet": "stacklib.transports.sim",
    "sim-atm-mm": "stacklib.transports.sim.mm",
    "sim-fe-mm": "stacklib.transports.sim.mm",
    "sim-myrinet-am": "stacklib.transports.sim.myrinet_libs.transport",
    "sim-myrinet-bip": "stacklib.transports.sim.myrinet_libs.transport",
    "sim-myrinet-fm": "stacklib.transports.sim.myrinet_libs.transport",
    "sim-myrinet-pm": "stacklib.transports.sim.myrinet_libs.transport",
    "sim-myrinet-vmmc": "stacklib.transports.sim.myrinet_libs.transport",
}

WORKLOADS: dict[str, str] = {
    "pingpong": "stacklib.bench.pingpong",
    "bandwidth": "stacklib.bench.bandwidth",
    "logp": "stacklib.bench.logp",
    "udp-pingpong": "stacklib.bench.streams",
    "udp-stream": "stacklib.bench.streams",
    "tcp-stream": "stacklib.bench.streams",
    "mm-pingpong": "stacklib.bench.mm_pingpong",
    "splitc": "stacklib.bench.splitc.workload",
}

FORMATS: dict[str, str] = {
    "unet-eth": "stacklib.wire.unet_eth",
    "unet-send-desc": "stacklib.wire.descriptor",
    "unet-recv-desc": "stacklib.wire.descriptor",
    "unet-free-desc": "stacklib.wire.descriptor",
    "atm-cell": "stacklib.wire.atm",
    "aal5-pdu": "stacklib.wire.aal5",
    "arq": "stacklib.layers.arq.wire",
    "uam": "stacklib.layers.uam.wire",
    "ethernet": "stacklib.layers.ip.wire",
    "arp": "stacklib.layers.ip.wire",
    "ipv4": "stacklib.layers.ip.wire",
    "icmp": "stacklib.layers.ip.wire",
    "udp": "stacklib.layers.udp.wire",
    "tcp": "stacklib.layers.tcp.wire",
}

EXPERIMENTS: dict[str, str] = {  # in the order ``stacklib reproduce`` prints them
    "sba100": "stacklib.experiments.network_interfaces",
    "sba200": "stacklib.experiments.network_interfaces",
    "fore-firmware": "stacklib.experiments.network_interfaces",
    "fast-ethernet": "stacklib.experiments.network_interfaces",
    "pca200": "stacklib.experiments.network_interfaces",
    "uam": "stacklib.experiments.uam",
    "tcpip": "stacklib.experiments.tcpip",
    "splitc": "stacklib.experiments.splitc",
    "mm": "stacklib.experiments.mm",
    "mm-fig3": "stacklib.experiments.mm",
    "myrinet": "stacklib.experiments.myrinet",
}
