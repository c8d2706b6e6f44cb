"""Bad stack settings are refused before anything is declared, naming the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from marin.experiment.config import ConfigError

from infra.errors import StackSettingsError
from infra.offline import plan
from infra.settings import WorkerGroup, check_bucket_name, check_settings, load_settings

EXAMPLE = Path(__file__).resolve().parent.parent / "stacks" / "example.yaml"


def test_the_example_settings_file_loads_and_passes_its_checks():
    settings = load_settings(str(EXAMPLE))
    assert settings.prefix_url == "gs://mylab-marin-prefix/marin"
    assert [group.name for group in settings.cluster.workers] == ["cpu", "h100", "v5e"]
    assert settings.cluster.workers[1] == WorkerGroup(name="h100", machine_type="a3-highgpu-8g", gpu_type="H100",
                                                      gpu_count=8, spot=True, max_workers=2)


def test_both_spellings_of_v5e_are_accepted_and_the_cluster_file_writes_the_tpu_apis(settings_with):
    from infra.ray_cluster import cluster_config

    settings = settings_with(WorkerGroup(name="v5e", tpu_type="v5e-16"))
    check_settings(settings)
    node = cluster_config(settings)["available_node_types"]["v5e"]
    assert node["node_config"]["acceleratorType"] == "v5litepod-16"
    assert "TPU-v5litepod-16-head" in node["resources"]


@pytest.mark.parametrize("group, field, words", [
    (WorkerGroup(name="t", tpu_type="v5e-12"), "cluster.workers[0].tpu_type",
     "Did you mean 'v5litepod-8' or 'v5litepod-16'?"),
    (WorkerGroup(name="t", tpu_type="v9-8"), "cluster.workers[0].tpu_type", "Unknown TPU type 'v9-8'"),
    (WorkerGroup(name="t", tpu_type="v4-12"), "cluster.workers[0].tpu_type", "Did you mean 'v4-8' or 'v4-16'?"),
    (WorkerGroup(name="g", machine_type="n1-standard-8", gpu_type="A100", gpu_count=1),
     "cluster.workers[0].gpu_type", "'A100-40G' or 'A100-80G'"),
    (WorkerGroup(name="g", machine_type="a2-highgpu-4g", gpu_type="A100-40G", gpu_count=8),
     "cluster.workers[0].gpu_count", "a2-highgpu-4g holds 4 A100-40G GPU(s), not 8. For 8 A100-40G use a2-highgpu-8g"),
    (WorkerGroup(name="g", machine_type="a3-highgpu-8g", gpu_type="A100-80G", gpu_count=8),
     "cluster.workers[0].gpu_type", "comes with H100 GPUs"),
    (WorkerGroup(name="g", machine_type="n1-standard-8", gpu_type="T4", gpu_count=3),
     "cluster.workers[0].gpu_count", "takes 1 or 2 or 4 T4"),
    (WorkerGroup(name="g", machine_type="n1-standard-32", gpu_type="V100", gpu_count=1),
     "cluster.workers[0].machine_type", "at most 12"),
    (WorkerGroup(name="g", machine_type="n2-standard-8", gpu_type="L4", gpu_count=1),
     "cluster.workers[0].machine_type", "cannot take L4 GPUs"),
    (WorkerGroup(name="g", machine_type="a2-highgpu-1g"), "cluster.workers[0].gpu_type", "set gpu_type: A100-40G"),
    (WorkerGroup(name="c", machine_type="n2-standard-17"), "cluster.workers[0].machine_type", "Did you mean"),
    (WorkerGroup(name="c", machine_type="n2-standard-8", min_workers=3, max_workers=2),
     "cluster.workers[0].max_workers", "below min_workers (3)"),
    (WorkerGroup(name="c", machine_type="n2-standard-8", max_workers=0), "cluster.workers[0].max_workers", "at least"),
    (WorkerGroup(name="t", tpu_type="v4-8", machine_type="n2-standard-8"), "cluster.workers[0].machine_type",
     "has no machine type"),
])
def test_bad_worker_groups_are_refused_naming_the_field(settings_with, group, field, words):
    with pytest.raises(StackSettingsError) as error:
        check_settings(settings_with(group))
    message = str(error.value)
    assert message.startswith(f"Stack setting {field}:"), message
    assert words in message, message


@pytest.mark.parametrize("name, words", [
    ("", "is empty"),
    ("ab", "too short"),
    ("My-Bucket", "lowercase"),
    ("-bucket", "start and end"),
    ("bucket-", "start and end"),
    ("a" * 64, "too long"),
    ("goog-data", "'goog'"),
    ("mygooglebucket", "'google'"),
    ("192.168.1.10", "IP address"),
    ("my..bucket", "dot next to"),
    ("my bucket", "lowercase"),
])
def test_invalid_bucket_names_are_refused(name, words):
    with pytest.raises(StackSettingsError, match="bucket.name") as error:
        check_bucket_name(name)
    assert words in str(error.value)


@pytest.mark.parametrize("name", ["lab-marin", "a_b.c-d", "abc", "a" * 63, "my.bucket.example.org"])
def test_valid_bucket_names_pass(name):
    check_bucket_name(name)


def test_a_public_invoker_is_refused(settings_with):
    for member in ("allUsers", "allAuthenticatedUsers"):
        with pytest.raises(StackSettingsError, match=r"web.invokers\[1\].*public"):
            check_settings(settings_with(invokers=("group:lab@example.com", member)))
    with pytest.raises(StackSettingsError, match=r"web.invokers\[0\].*not an IAM member"):
        check_settings(settings_with(invokers=("lab@example.com",)))


def test_duplicate_group_names_and_an_empty_requirement_are_refused(settings_with):
    cpu = WorkerGroup(name="cpu", machine_type="n2-standard-8")
    with pytest.raises(StackSettingsError, match=r"cluster.workers\[1\].name.*two worker groups"):
        check_settings(settings_with(cpu, cpu))
    settings = settings_with()
    empty = dataclasses.replace(settings, cluster=dataclasses.replace(settings.cluster, project_requirement=" "))
    with pytest.raises(StackSettingsError, match="cluster.project_requirement"):
        check_settings(empty)


def test_unknown_keys_in_the_file_are_refused_with_the_closest_name(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text(EXAMPLE.read_text().replace("max_workers: 4", "max_worker: 4"))
    with pytest.raises(ConfigError, match="cluster.workers\\[0\\].*Did you mean 'max_workers'"):
        load_settings(str(path))
    path.write_text(EXAMPLE.read_text().replace("versioning: false", "versioning: maybe"))
    with pytest.raises(ConfigError, match="bucket.versioning"):
        load_settings(str(path))


def test_a_bad_setting_stops_the_program_before_any_resource_is_declared(settings_with):
    bad = settings_with(WorkerGroup(name="t", tpu_type="v5e-12"))
    with pytest.raises(StackSettingsError, match="tpu_type"):
        plan(bad)
    # The same program with good settings does declare resources: the empty list above is the check's doing.
    assert len(plan(settings_with())) > 5


@pytest.mark.parametrize("name", ["a", "x" * 23, "Marin", "1marin", "marin_"])
def test_a_cluster_name_that_cannot_name_service_accounts_is_refused(settings_with, name):
    settings = settings_with()
    settings = dataclasses.replace(settings, cluster=dataclasses.replace(settings.cluster, name=name))
    with pytest.raises(StackSettingsError, match="cluster.name.*2 to 22"):
        check_settings(settings)
    ok = dataclasses.replace(settings, cluster=dataclasses.replace(settings.cluster, name="ab"))
    check_settings(ok)
