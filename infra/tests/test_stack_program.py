"""The Pulumi program run under Pulumi's own mocks (``pulumi.runtime.set_mocks``) for several stacks:
every resource it declares, and every grant, checked property by property."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from infra.identities import AUTOSCALER_TPU_PERMISSIONS
from infra.offline import DeclaredResource, ensure_event_loop, plan

BUCKET = "gcp:storage/bucket:Bucket"
ACCOUNT = "gcp:serviceaccount/account:Account"
BUCKET_GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
PROJECT_GRANT = "gcp:projects/iAMMember:IAMMember"
ACCOUNT_GRANT = "gcp:serviceaccount/iAMMember:IAMMember"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
RUN_SERVICE = "gcp:cloudrunv2/service:Service"
RUN_GRANT = "gcp:cloudrunv2/serviceIamMember:ServiceIamMember"
API = "gcp:projects/service:Service"
REPOSITORY = "gcp:artifactregistry/repository:Repository"

PRIMITIVE_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}


def of_type(resources: list[DeclaredResource], type_token: str) -> list[DeclaredResource]:
    return [resource for resource in resources if resource.type == type_token]


def grants(resources: list[DeclaredResource]) -> set[tuple[str, str, str]]:
    """(grant type, role, member) of every IAM binding declared."""
    return {(r.type, r.inputs["role"], r.inputs["member"]) for r in resources if "member" in r.inputs}


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)


def sa(name: str) -> str:
    return f"serviceAccount:marin-{name}@lab-marin-dev.iam.gserviceaccount.com"


def test_the_bucket_is_private_and_its_scratch_expires(stacks):
    for settings in stacks.values():
        [bucket] = of_type(plan(settings), BUCKET)
        inputs = bucket.inputs
        assert inputs["name"] == "lab-marin-prefix"
        assert inputs["location"] == "US-CENTRAL1"
        assert inputs["uniformBucketLevelAccess"] is True
        assert inputs["publicAccessPrevention"] == "enforced"
        assert inputs["versioning"] == {"enabled": settings.bucket.versioning}
        rules = inputs["lifecycleRules"]
        assert rules[0] == {"action": {"type": "Delete"}, "condition": {"age": 7, "matchesPrefixes": ["marin/.work/"]}}
        if settings.bucket.versioning:
            assert rules[1] == {"action": {"type": "Delete"},
                                "condition": {"daysSinceNoncurrentTime": 30, "withState": "ARCHIVED"}}
        assert len(rules) == 1 + settings.bucket.versioning


def test_every_grant_of_the_cpu_stack_is_exactly_the_least_privilege_set(stacks):
    resources = plan(stacks["cpu-only"])
    assert grants(resources) == {
        (BUCKET_GRANT, "roles/storage.objectUser", sa("workers")),
        (BUCKET_GRANT, "roles/storage.objectUser", sa("head")),
        (BUCKET_GRANT, "roles/storage.objectViewer", sa("web")),
        (PROJECT_GRANT, "projects/lab-marin-dev/roles/marin_ray_autoscaler", sa("head")),
        (ACCOUNT_GRANT, "roles/iam.serviceAccountUser", sa("head")),
    }
    # Bucket grants are on the prefix's bucket; acting as an account is granted on the workers' account only.
    assert {r.inputs["bucket"] for r in of_type(resources, BUCKET_GRANT)} == {"lab-marin-prefix"}
    [act_as] = of_type(resources, ACCOUNT_GRANT)
    assert act_as.inputs["serviceAccountId"] == ("projects/lab-marin-dev/serviceAccounts/"
                                                 "marin-workers@lab-marin-dev.iam.gserviceaccount.com")
    assert sorted(r.inputs["accountId"] for r in of_type(resources, ACCOUNT)) == ["marin-head", "marin-web",
                                                                                  "marin-workers"]
    [role] = of_type(resources, CUSTOM_ROLE)
    permissions = role.inputs["permissions"]
    assert all(p.startswith("compute.") for p in permissions), permissions
    assert "compute.instances.create" in permissions and "compute.instances.delete" in permissions
    assert not any(p.endswith(("setIamPolicy", ".getIamPolicy")) or p.startswith("iam.") for p in permissions)


def test_tpu_groups_add_the_tpu_api_and_only_the_tpu_node_calls(stacks):
    for name, settings in stacks.items():
        resources = plan(settings)
        apis = {r.inputs["service"] for r in of_type(resources, API)}
        [role] = of_type(resources, CUSTOM_ROLE)
        has_tpus = name in ("tpu-pod", "spot")
        assert ("tpu.googleapis.com" in apis) == has_tpus
        assert set(AUTOSCALER_TPU_PERMISSIONS) <= set(role.inputs["permissions"]) if has_tpus else \
            not any(p.startswith("tpu.") for p in role.inputs["permissions"])
        assert {"compute.googleapis.com", "iam.googleapis.com", "run.googleapis.com"} <= apis
        assert all(r.inputs["disableOnDestroy"] is False for r in of_type(resources, API))


def public_or_primitive(resources: list[DeclaredResource]) -> list[tuple[str, str]]:
    """(resource, value) for every public member or primitive role anywhere in the inputs."""
    return [(r.name, value) for r in resources for value in strings(r.inputs) if value in PUBLIC_MEMBERS | PRIMITIVE_ROLES]


def test_the_scan_finds_a_public_member_or_primitive_role_nested_anywhere():
    nested = DeclaredResource("t", "policy", {"bindings": [{"role": "roles/editor", "members": ["user:a@b.c"]},
                                                           {"role": "roles/run.invoker", "members": ["allUsers"]}]})
    assert public_or_primitive([nested]) == [("policy", "roles/editor"), ("policy", "allUsers")]


def test_no_public_member_and_no_primitive_role_anywhere(stacks):
    for settings in stacks.values():
        resources = plan(settings)
        assert public_or_primitive(resources) == []
        # The scan sees grants: every declared member is a service account or a named invoker.
        members = {member for _, _, member in grants(resources)}
        assert members and all(m.startswith(("serviceAccount:", "group:", "user:")) for m in members)


def test_the_web_view_runs_read_only_and_only_named_invokers_may_call_it(stacks):
    resources = plan(stacks["gpus"])
    [service] = of_type(resources, RUN_SERVICE)
    inputs = service.inputs
    assert inputs["invokerIamDisabled"] is False
    assert inputs["ingress"] == "INGRESS_TRAFFIC_ALL"
    template = inputs["template"]
    assert template["serviceAccount"] == "marin-web@lab-marin-dev.iam.gserviceaccount.com"
    [container] = template["containers"]
    assert container["image"] == "us-central1-docker.pkg.dev/lab-marin-dev/marin-images/marin-serve:v1"
    assert container["envs"] == [{"name": "MARIN_PREFIX", "value": "gs://lab-marin-prefix/marin"}]
    assert container["ports"] == {"containerPort": 8080}
    assert {(r.inputs["role"], r.inputs["member"], r.inputs["name"]) for r in of_type(resources, RUN_GRANT)} == {
        ("roles/run.invoker", "group:lab@example.com", "marin-web"),
        ("roles/run.invoker", "user:ada@example.com", "marin-web"),
    }
    # The web account holds one grant: reading objects of the bucket.
    assert [(t, role) for t, role, member in grants(resources) if member == sa("web")] == [
        (BUCKET_GRANT, "roles/storage.objectViewer")]


def test_without_an_image_the_repository_is_made_and_no_service(stacks):
    resources = plan(stacks["cpu-only"])
    assert of_type(resources, RUN_SERVICE) == [] and of_type(resources, RUN_GRANT) == []
    [repository] = of_type(resources, REPOSITORY)
    assert repository.inputs["repositoryId"] == "marin-images" and repository.inputs["format"] == "DOCKER"


def test_the_default_stack_declares_this_list_of_resources(stacks):
    """The list docs/infra.md gives; a new resource must be added there too."""
    declared = sorted((r.type.rpartition(":")[2], r.name) for r in plan(stacks["cpu-only"]))
    assert declared == sorted([
        ("Service", "api-cloudresourcemanager"), ("Service", "api-compute"), ("Service", "api-iam"),
        ("Service", "api-storage"), ("Service", "api-artifactregistry"), ("Service", "api-run"),
        ("Bucket", "prefix-bucket"),
        ("Account", "workers-account"), ("Account", "head-account"), ("Account", "web-account"),
        ("BucketIAMMember", "workers-bucket-access"), ("BucketIAMMember", "head-bucket-access"),
        ("BucketIAMMember", "web-bucket-access"),
        ("IAMCustomRole", "autoscaler-role"), ("IAMMember", "head-autoscaler"), ("IAMMember", "head-acts-as-workers"),
        ("Repository", "images"),
    ])


def test_pulumi_runs_the_stacks_settings_file_through_the_program_entry():
    """infra/program/__main__.py as `pulumi up` runs it, under mocks: stack "example" reads stacks/example.yaml."""
    import runpy

    import pulumi

    from infra.offline import RecordingMocks

    mocks = RecordingMocks("mylab-marin")
    ensure_event_loop()
    pulumi.runtime.set_mocks(mocks, project="marin-infra", stack="example", preview=False)
    program = Path(__file__).resolve().parent.parent / "program" / "__main__.py"

    @pulumi.runtime.test
    def run():
        runpy.run_path(str(program), run_name="__main__")

    run()
    names = {(r.type, r.inputs.get("name") or r.inputs.get("accountId")) for r in mocks.resources}
    assert (BUCKET, "mylab-marin-prefix") in names and (RUN_SERVICE, "marin-web") in names
    assert (ACCOUNT, "marin-workers") in names


def test_the_settings_file_of_a_stack_is_found_by_name_or_by_config(tmp_path):
    from infra.stack import settings_path

    assert settings_path("dev", None, tmp_path) == tmp_path / "stacks" / "dev.yaml"
    assert settings_path("dev", "envs/lab.yaml", tmp_path) == tmp_path / "envs" / "lab.yaml"
    assert settings_path("dev", "/abs/lab.yaml", tmp_path) == Path("/abs/lab.yaml")
