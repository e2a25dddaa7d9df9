"""Wire formats: construct definitions as the specification, derived struct-speed codecs.

One module per format (:mod:`~stacklib.wire.unet_eth`, :mod:`~stacklib.wire.descriptor`, ...),
each with ``parse``/``build``, one :class:`~stacklib.errors.FormatError` subclass and a
hypothesis strategy; :mod:`~stacklib.wire.codec` derives the fast codecs and
:mod:`~stacklib.wire.registry` names the formats for ``stacklib decode``.  Import the modules
you need; this package imports none of them.
"""
