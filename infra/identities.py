"""The stack's identities and what each may do, nothing more.

* ``<cluster>-workers``: every Ray worker runs as it. Reads and writes objects of the prefix's
  bucket (``roles/storage.objectUser``: objects only, no bucket settings, no IAM); no other grant.
* ``<cluster>-head``: the Ray head, which runs the driver and the autoscaler. The same bucket
  access as the workers; a custom role holding only the Compute Engine (and, with TPU groups,
  TPU) calls Ray's GCP autoscaler makes to start and delete workers; and the right to start
  machines as the workers' account (``roles/iam.serviceAccountUser`` on that one account, not on
  the project).
* ``<cluster>-web``: the web view. Reads objects of the bucket (``roles/storage.objectViewer``).

No grant names a primitive role (owner, editor, viewer) or a public member; the tests check every
binding the program declares.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_gcp import projects, serviceaccount, storage

from infra.settings import StackSettings

WORKERS_BUCKET_ROLE = "roles/storage.objectUser"
WEB_BUCKET_ROLE = "roles/storage.objectViewer"
ACT_AS_ROLE = "roles/iam.serviceAccountUser"

# The calls of Ray's GCP node provider: insert/list/get/delete instances with labels, metadata,
# a service account and an external address on the default subnet, and wait on zone operations.
# Scaled-down nodes are deleted, not stopped (cache_stopped_nodes: false), so no stop/start.
AUTOSCALER_COMPUTE_PERMISSIONS = (
    "compute.disks.create",
    "compute.images.useReadOnly",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.instances.setTags",
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.zoneOperations.get",
)
AUTOSCALER_TPU_PERMISSIONS = (
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.nodes.get",
    "tpu.nodes.list",
    "tpu.nodes.update",
    "tpu.operations.get",
)


def autoscaler_permissions(settings: StackSettings) -> list[str]:
    has_tpus = any(group.tpu_type is not None for group in settings.cluster.workers)
    return sorted(AUTOSCALER_COMPUTE_PERMISSIONS + (AUTOSCALER_TPU_PERMISSIONS if has_tpus else ()))


@dataclass(frozen=True)
class Identities:
    workers: serviceaccount.Account
    head: serviceaccount.Account
    web: serviceaccount.Account


def _member(account: serviceaccount.Account) -> pulumi.Output[str]:
    return account.email.apply(lambda email: f"serviceAccount:{email}")


def identities(settings: StackSettings, bucket: storage.Bucket,
               opts: pulumi.ResourceOptions | None = None) -> Identities:
    """The three accounts and every grant they hold."""
    name = settings.cluster.name
    accounts = {
        role: serviceaccount.Account(
            f"{role}-account",
            account_id=settings.account_id(role),
            display_name=f"Marin {name}: {description}",
            project=settings.project,
            opts=opts,
        )
        for role, description in (("workers", "Ray workers (read/write the prefix)"),
                                  ("head", "Ray head and autoscaler"),
                                  ("web", "web view (read-only)"))
    }
    for role, bucket_role in (("workers", WORKERS_BUCKET_ROLE), ("head", WORKERS_BUCKET_ROLE),
                              ("web", WEB_BUCKET_ROLE)):
        storage.BucketIAMMember(f"{role}-bucket-access", bucket=bucket.name, role=bucket_role,
                                member=_member(accounts[role]), opts=opts)
    autoscaler_role = projects.IAMCustomRole(
        "autoscaler-role",
        role_id=f"{name.replace('-', '_')}_ray_autoscaler",
        title=f"Marin {name}: Ray autoscaler",
        description="Start and delete the cluster's worker machines, nothing else.",
        permissions=autoscaler_permissions(settings),
        project=settings.project,
        opts=opts,
    )
    projects.IAMMember("head-autoscaler", project=settings.project, role=autoscaler_role.name,
                       member=_member(accounts["head"]), opts=opts)
    serviceaccount.IAMMember("head-acts-as-workers", service_account_id=accounts["workers"].name,
                             role=ACT_AS_ROLE, member=_member(accounts["head"]), opts=opts)
    return Identities(**accounts)


__all__ = ["ACT_AS_ROLE", "AUTOSCALER_COMPUTE_PERMISSIONS", "AUTOSCALER_TPU_PERMISSIONS", "WEB_BUCKET_ROLE",
           "WORKERS_BUCKET_ROLE", "Identities", "autoscaler_permissions", "identities"]
