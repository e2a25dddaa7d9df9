"""The experiments ``stacklib reproduce`` runs, one module per part of the papers.

Each module registers its experiments (:func:`stacklib.reporting.figures.register_experiment`);
:mod:`stacklib.builtin` names them in the papers' order, which is the order they print in: the
network interfaces (papers 000, 001, 003), Active Messages and TCP/IP (paper 000), Split-C
(papers 000, 003), U-Net/MM (paper 002), Myrinet (paper 004).  :mod:`stacklib.reproduce` runs
them.
"""
