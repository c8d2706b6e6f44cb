"""``marin serve``: a local, read-only web view of a prefix (steps, lineage, curves, data, evals).

Nothing here writes to the prefix. Every location a request names is a path *relative to the
prefix*, checked by :mod:`marin.serve.paths` before anything is read.
"""
