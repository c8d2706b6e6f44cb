"""fray: where work runs.

Owns ``ResourceConfig`` (what a piece of work needs), the ``DistributedClient`` protocol and its
backends (local threads/processes, Ray), futures and actors. It depends only on rigging.
"""
