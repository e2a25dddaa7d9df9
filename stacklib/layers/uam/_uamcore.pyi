"""Type stub of the C core of the UAM machine (``_uamcore.c``), built by ``stacklib compile``;
its attributes and methods are those of :class:`~stacklib.layers.uam.machine_core.MachineCore`."""

from stacklib.layers.uam.machine_core import MachineCore as _Reference

class MachineCore(_Reference): ...
