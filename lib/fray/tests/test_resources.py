import pytest

from fray.cluster import GpuDevice, InvalidResourceConfig, ResourceConfig, TpuDevice, parse_size


def test_with_cpu_defaults_to_one_cpu_replica():
    r = ResourceConfig.with_cpu()
    assert r.device_kind == "cpu" and r.replicas == 1 and r.gpu_count == 0


def test_with_gpu_records_variant_and_count():
    r = ResourceConfig.with_gpu("H100", 8)
    assert r.device == GpuDevice(variant="H100", count=8) and r.gpu_count == 8


def test_with_tpu_derives_one_replica_per_host():
    assert ResourceConfig.with_tpu("v4-8").replicas == 1  # 4 chips, one host
    assert ResourceConfig.with_tpu("v4-32").replicas == 4  # 16 chips over 4 hosts
    assert ResourceConfig.with_tpu("v5e-16", slice_count=2).replicas == 8  # 2 slices of 4 hosts of 4 chips


def test_both_spellings_of_v5e_are_one_device_in_the_tpu_apis_name():
    assert ResourceConfig.with_tpu("v5e-16") == ResourceConfig.with_tpu("v5litepod-16")
    assert ResourceConfig.with_tpu("v5e-16").device == TpuDevice(type="v5litepod-16", slice_count=1)
    assert TpuDevice(type="v5e-16").type == "v5litepod-16"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ResourceConfig.with_tpu("v9-8"), "Unknown TPU type 'v9-8'"),
        (lambda: ResourceConfig.with_tpu("v4"), "Unknown TPU type 'v4'"),
        (lambda: ResourceConfig.with_tpu("v4-12"), r"Did you mean 'v4-8' or 'v4-16'\?"),
        (lambda: ResourceConfig.with_tpu("v5e-12"), "Accepted forms: v4-N and v5p-N, where N counts TensorCores"),
        (lambda: ResourceConfig.with_tpu("v4-8", slice_count=0), "slice_count must be at least 1"),
        (lambda: ResourceConfig.with_gpu("H100", 0), "GPU count must be at least 1"),
        (lambda: ResourceConfig.with_gpu("H100", -2), "GPU count must be at least 1"),
        (lambda: ResourceConfig.with_cpu(cpu=0), "cpu must be positive"),
        (lambda: ResourceConfig.with_cpu(replicas=0), "replicas must be at least 1"),
        (lambda: ResourceConfig.with_cpu(ram="lots"), "ram 'lots' is not a size"),
    ],
)
def test_impossible_requests_are_refused_with_a_clear_message(make, message):
    with pytest.raises(InvalidResourceConfig, match=message):
        make()


def test_parse_size_understands_common_spellings():
    assert parse_size("4g") == 4 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("16GB") == 16 << 30
    assert parse_size(1024) == 1024


def test_iris_exports_the_same_class():
    from iris.cluster import ResourceConfig as IrisResourceConfig

    assert IrisResourceConfig is ResourceConfig


def test_custom_resources_are_kept_sorted_and_hashable():
    r = ResourceConfig.with_cpu(custom={"trainer": 1, "fast_disk": 0.5})
    assert r.custom == (("fast_disk", 0.5), ("trainer", 1.0)) and dict(r.custom)["trainer"] == 1
    assert hash(r) == hash(ResourceConfig.with_cpu(custom={"fast_disk": 0.5, "trainer": 1}))
    assert ResourceConfig.with_gpu("H100", 2, custom={"trainer": 1}).custom == (("trainer", 1.0),)
    assert ResourceConfig().custom == ()


@pytest.mark.parametrize(
    "custom, message",
    [
        ({"CPU": 2}, "'CPU' is built in; ask for it with cpu="),
        ({"memory": 1}, "'memory' is built in; ask for it with ram="),
        ({"GPU": 1}, r"'GPU' is built in; ask for it with with_gpu\(...\)"),
        ({"trainer": 0}, "'trainer' needs a positive amount"),
        ({"trainer": -1}, "'trainer' needs a positive amount"),
        ({"trainer": float("nan")}, "'trainer' needs a positive amount"),
        ({"trainer": "1"}, "'trainer' needs a positive amount"),
        ({"trainer": 1.5}, "amounts above 1 must be whole numbers"),
        ({"": 1}, "non-empty strings"),
        ("trainer", "custom must map resource names to amounts"),
    ],
)
def test_custom_resources_no_cluster_could_give_are_refused(custom, message):
    with pytest.raises(InvalidResourceConfig, match=message):
        ResourceConfig.with_cpu(custom=custom)


def test_a_request_in_words_names_its_custom_resources():
    from fray.cluster.client import describe_request

    assert describe_request(ResourceConfig.with_cpu(ram="1g", custom={"trainer": 1})) == "1 CPU, 1g RAM, trainer: 1"


def test_retry_budgets_and_time_limit_have_defaults_and_refuse_impossible_values():
    from fray.cluster import InvalidResourceConfig, ResourceConfig

    default = ResourceConfig.with_cpu()
    assert (default.max_retries_preemption, default.max_retries_failure, default.time_limit_s) == (10, 0, None)
    assert ResourceConfig.with_gpu("H100", 8, max_retries_failure=2, time_limit_s=3600).max_retries_failure == 2
    for bad in ({"max_retries_preemption": -1}, {"max_retries_failure": 1.5}, {"time_limit_s": 0}, {"time_limit_s": "1h"}):
        with pytest.raises(InvalidResourceConfig, match=next(iter(bad))):
            ResourceConfig.with_cpu(**bad)


def test_the_scale_up_deadline_defaults_to_15_minutes_and_refuses_impossible_values():
    from fray.cluster import InvalidResourceConfig, ResourceConfig

    assert ResourceConfig.with_cpu().scale_up_timeout_s == 15 * 60
    assert ResourceConfig.with_tpu("v5p-128", scale_up_timeout_s=3600).scale_up_timeout_s == 3600
    for bad in (0, -5, "15m", True):
        with pytest.raises(InvalidResourceConfig, match="scale_up_timeout_s must be a positive number of seconds"):
            ResourceConfig.with_cpu(scale_up_timeout_s=bad)
