"""The whole stack, from one settings file: APIs, the bucket, the identities, the web view, and
the Ray cluster file as an output.

:func:`declare_stack` is the Pulumi program (``infra/program/__main__.py`` calls it under
``pulumi up``; the tests call it under Pulumi's mocks). It checks the settings first, so a bad
value stops the run before any resource is declared. The cluster itself is launched by ``ray up``
from the ``ray_cluster_yaml`` output (or ``python -m infra.cli cluster-file``, which writes the
same text without Pulumi): Ray's launcher owns the machines and scales them, the stack owns
everything they run as and write to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pulumi
from pulumi_gcp import projects, storage

from infra.identities import Identities, identities
from infra.ray_cluster import cluster_yaml
from infra.settings import StackSettings, check_settings, load_settings
from infra.storage import prefix_bucket
from infra.web import WebView, image_repository_url, web_view

BASE_APIS = (
    "cloudresourcemanager.googleapis.com",  # ray up looks the project up
    "compute.googleapis.com",
    "iam.googleapis.com",
    "storage.googleapis.com",
    "artifactregistry.googleapis.com",
    "run.googleapis.com",
)
TPU_API = "tpu.googleapis.com"


def required_apis(settings: StackSettings) -> list[str]:
    has_tpus = any(group.tpu_type is not None for group in settings.cluster.workers)
    return list(BASE_APIS) + ([TPU_API] if has_tpus else [])


@dataclass(frozen=True)
class Stack:
    bucket: storage.Bucket
    identities: Identities
    web: WebView


def declare_stack(settings: StackSettings) -> Stack:
    """Declare every resource of ``settings`` (checked first) and export what users need."""
    check_settings(settings)
    apis = [
        projects.Service(f"api-{api.split('.')[0]}", project=settings.project, service=api,
                         disable_on_destroy=False)  # turning an API off would break what else uses it
        for api in required_apis(settings)
    ]
    after_apis = pulumi.ResourceOptions(depends_on=apis)
    bucket = prefix_bucket(settings, after_apis)
    accounts = identities(settings, bucket, after_apis)
    web = web_view(settings, accounts.web, after_apis)

    pulumi.export("marin_prefix", settings.prefix_url)
    pulumi.export("workers_account", accounts.workers.email)
    pulumi.export("head_account", accounts.head.email)
    pulumi.export("web_account", accounts.web.email)
    pulumi.export("image_repository", image_repository_url(settings))
    pulumi.export("ray_cluster_yaml", cluster_yaml(settings))
    if web.service is not None:
        pulumi.export("web_url", web.service.uri)
    return Stack(bucket, accounts, web)


def settings_path(stack_name: str, configured: str | None, project_dir: Path) -> Path:
    """The settings file of a Pulumi stack: ``pulumi config set settings FILE``, else ``stacks/<stack>.yaml``."""
    if configured:
        path = Path(configured)
        return path if path.is_absolute() else project_dir / path
    return project_dir / "stacks" / f"{stack_name}.yaml"


def run_program(project_dir: Path) -> Stack:
    """What ``pulumi up`` runs: the current stack's settings file, declared."""
    path = settings_path(pulumi.get_stack(), pulumi.Config().get("settings"), project_dir)
    return declare_stack(load_settings(str(path)))


__all__ = ["BASE_APIS", "TPU_API", "Stack", "declare_stack", "required_apis", "run_program", "settings_path"]
