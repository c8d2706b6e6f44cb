"""The prefix's bucket: private by construction, with scratch that expires.

Uniform bucket-level access turns object ACLs off (IAM on the bucket is the only way in) and
public access prevention makes a public grant impossible even by mistake. The lifecycle rule
deletes scratch under ``<prefix>/.work/`` after ``scratch_days``: Cloud Storage matches rules on
name prefixes and suffixes only, so scratch must live under one fixed prefix to be collectable
(a step's own ``.work/`` folder inside its output is removed by the step when it finishes).
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi_gcp import storage

from infra.settings import StackSettings


def scratch_prefix(settings: StackSettings) -> str:
    """Object-name prefix of the stack's scratch space (inside the bucket, no ``gs://``)."""
    path = settings.bucket.prefix.strip("/")
    return f"{path}/.work/" if path else ".work/"


def lifecycle_rules(settings: StackSettings) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = [{
        "action": {"type": "Delete"},
        "condition": {"age": settings.bucket.scratch_days, "matches_prefixes": [scratch_prefix(settings)]},
    }]
    if settings.bucket.versioning:  # overwritten and deleted objects are kept this long, then go
        rules.append({
            "action": {"type": "Delete"},
            "condition": {"days_since_noncurrent_time": settings.bucket.noncurrent_days, "with_state": "ARCHIVED"},
        })
    return rules


def prefix_bucket(settings: StackSettings, opts: pulumi.ResourceOptions | None = None) -> storage.Bucket:
    bucket = settings.bucket
    return storage.Bucket(
        "prefix-bucket",
        name=bucket.name,
        project=settings.project,
        location=bucket.location,
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        versioning={"enabled": bucket.versioning},
        lifecycle_rules=lifecycle_rules(settings),
        force_destroy=bucket.force_destroy,
        labels={"marin-cluster": settings.cluster.name},
        opts=opts,
    )


__all__ = ["lifecycle_rules", "prefix_bucket", "scratch_prefix"]
