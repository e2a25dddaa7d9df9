"""Peer programs of the real-transport benchmarks: processes that echo, sink or source
messages on the far side of a channel (:mod:`~stacklib.bench.peers.shm`,
:mod:`~stacklib.bench.peers.ether`, :mod:`~stacklib.bench.peers.udp`,
:mod:`~stacklib.bench.peers.xdp`)."""
