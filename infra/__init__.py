"""Marin's infrastructure as code: one settings file per environment provisions, with Pulumi,
the prefix's bucket, least-privilege identities and the web view, and generates the Ray cluster
file that ``ray up`` launches (see docs/infra.md).

Modules: :mod:`infra.settings` (the settings and their checks), :mod:`infra.catalog` (what Google
Cloud offers), :mod:`infra.storage`, :mod:`infra.identities`, :mod:`infra.web` (the resources),
:mod:`infra.ray_cluster` (the cluster file), :mod:`infra.stack` (the program), :mod:`infra.cli`.
"""
