"""Stack settings the infra tests build from: the smallest valid stack and variants of it."""

from __future__ import annotations

import dataclasses

import pytest

from infra.settings import BucketSettings, ClusterSettings, StackSettings, WebSettings, WorkerGroup

REQUIREMENT = "marin[ray,gcs] @ git+https://example.com/lab/marin.git@0123abc"


def make_settings(*workers: WorkerGroup, image: str = "", invokers: tuple[str, ...] = (),
                  versioning: bool = False) -> StackSettings:
    cluster = ClusterSettings(project_requirement=REQUIREMENT)
    if workers:
        cluster = dataclasses.replace(cluster, workers=tuple(workers))
    return StackSettings(
        project="lab-marin-dev",
        bucket=BucketSettings(name="lab-marin-prefix", versioning=versioning),
        cluster=cluster,
        web=WebSettings(image=image, invokers=invokers),
    )


CPU_ONLY = make_settings()
GPUS = make_settings(
    WorkerGroup(name="cpu", machine_type="n2-standard-16", max_workers=2),
    WorkerGroup(name="h100", machine_type="a3-highgpu-8g", gpu_type="H100", gpu_count=8, max_workers=2),
    WorkerGroup(name="a100", machine_type="a2-ultragpu-4g", gpu_type="A100-80G", gpu_count=4, max_workers=1),
    WorkerGroup(name="t4", machine_type="n1-standard-16", gpu_type="T4", gpu_count=2, max_workers=3),
    WorkerGroup(name="l4", machine_type="g2-standard-24", gpu_type="L4", gpu_count=2, max_workers=1),
    image="us-central1-docker.pkg.dev/lab-marin-dev/marin-images/marin-serve:v1",
    invokers=("group:lab@example.com", "user:ada@example.com"),
    versioning=True,
)
TPU_POD = make_settings(
    WorkerGroup(name="cpu", machine_type="n2-standard-8", min_workers=1, max_workers=2),
    WorkerGroup(name="v4-pod", tpu_type="v4-32", max_workers=1),
    WorkerGroup(name="v6e", tpu_type="v6e-8", max_workers=2),
)
SPOT = make_settings(
    WorkerGroup(name="spot-cpu", machine_type="n2-highmem-32", spot=True, max_workers=8),
    WorkerGroup(name="spot-l4", machine_type="g2-standard-8", gpu_type="L4", gpu_count=1, spot=True, max_workers=4),
    WorkerGroup(name="spot-v5e", tpu_type="v5litepod-16", spot=True, max_workers=2),
)
STACKS = {"cpu-only": CPU_ONLY, "gpus": GPUS, "tpu-pod": TPU_POD, "spot": SPOT}


@pytest.fixture(params=sorted(STACKS))
def stack_settings(request) -> StackSettings:
    return STACKS[request.param]


@pytest.fixture
def stacks() -> dict[str, StackSettings]:
    return dict(STACKS)


@pytest.fixture
def settings_with():
    """Build a stack's settings from worker groups (and web and bucket options)."""
    return make_settings
