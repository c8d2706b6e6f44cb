"""``marin serve`` on Cloud Run: the read-only web view of the prefix, never public.

The service runs as the web account (``roles/storage.objectViewer`` on the bucket, nothing
else) with ``MARIN_PREFIX`` pointing at the prefix. Cloud Run checks the caller's IAM on every
request (``invoker_iam_disabled`` is false), and only the members in ``web.invokers`` get
``roles/run.invoker``; a browser reaches it through ``gcloud run services proxy``, which signs
the requests as the user. The image is built from ``infra/Dockerfile`` and pushed to the stack's
Artifact Registry repository; until ``web.image`` names it, the service is not declared.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_gcp import artifactregistry, cloudrunv2, serviceaccount

from infra.settings import StackSettings

INVOKER_ROLE = "roles/run.invoker"
PORT = 8080


@dataclass(frozen=True)
class WebView:
    repository: artifactregistry.Repository
    service: cloudrunv2.Service | None


def image_repository_url(settings: StackSettings) -> str:
    """Where ``docker push`` sends the web view's image."""
    return f"{settings.region}-docker.pkg.dev/{settings.project}/{settings.cluster.name}-images"


def web_view(settings: StackSettings, account: serviceaccount.Account,
             opts: pulumi.ResourceOptions | None = None) -> WebView:
    repository = artifactregistry.Repository(
        "images",
        repository_id=f"{settings.cluster.name}-images",
        format="DOCKER",
        location=settings.region,
        project=settings.project,
        description="Images of the Marin web view",
        opts=opts,
    )
    web = settings.web
    if not web.image:
        return WebView(repository, None)
    service = cloudrunv2.Service(
        "web",
        name=f"{settings.cluster.name}-web",
        location=settings.region,
        project=settings.project,
        ingress="INGRESS_TRAFFIC_ALL",  # reachable, but every request must carry an invoker's identity
        invoker_iam_disabled=False,
        deletion_protection=False,
        template={
            "service_account": account.email,
            "scaling": {"min_instance_count": 0, "max_instance_count": web.max_instances},
            "containers": [{
                "image": web.image,
                "envs": [{"name": "MARIN_PREFIX", "value": settings.prefix_url}],
                "ports": {"container_port": PORT},
                "resources": {"limits": {"cpu": web.cpu, "memory": web.memory}},
            }],
        },
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[repository])),
    )
    for index, member in enumerate(web.invokers):
        cloudrunv2.ServiceIamMember(f"web-invoker-{index}", name=service.name, location=settings.region,
                                    project=settings.project, role=INVOKER_ROLE, member=member, opts=opts)
    return WebView(repository, service)


__all__ = ["INVOKER_ROLE", "PORT", "WebView", "image_repository_url", "web_view"]
