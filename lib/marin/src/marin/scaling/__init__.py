"""Scaling laws from a sweep's finished runs: collect them (:mod:`~marin.scaling.runs`), fit the
IsoFLOP and parametric laws (:mod:`~marin.scaling.fits`), and plot them (:mod:`~marin.scaling.plot`)."""
