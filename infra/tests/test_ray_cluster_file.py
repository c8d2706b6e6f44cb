"""The generated ``ray up`` file: Ray's own validation accepts it, and each node type declares what
fray's ``ResourceConfig`` for its hardware asks Ray for: for every TPU type and GPU machine type of
fray's accelerator table, the same hosts, chips and vCPUs, which Ray's own TPU arithmetic confirms."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from fray.cluster import ResourceConfig
from fray.cluster.accelerators import GPU_MACHINE_TYPES, TPU_GENERATIONS, tpu_slice, tpu_types
from fray.cluster.ray_client import ray_options
from ray._private.accelerators.tpu import get_num_tpu_visible_chips_per_host

from infra.catalog import TPU_RUNTIME_VERSIONS
from infra.ray_cluster import cluster_config, cluster_yaml, validate_cluster_config
from infra.settings import WorkerGroup, check_settings


def requested(resources: ResourceConfig) -> dict[str, float]:
    """What a task with ``resources`` asks a node for, in the names Ray gives node resources."""
    options = ray_options(resources)
    needed = {"CPU": float(options["num_cpus"]), "memory": float(options["memory"])}
    if "num_gpus" in options:
        needed["GPU"] = float(options["num_gpus"])
    if "accelerator_type" in options:
        needed[f"accelerator_type:{options['accelerator_type']}"] = 0.001
    needed.update({name: float(amount) for name, amount in options.get("resources", {}).items()})
    return needed


def resource_config_for(group: WorkerGroup) -> ResourceConfig:
    if group.tpu_type is not None:
        return ResourceConfig.with_tpu(group.tpu_type)
    if group.gpu_type is not None:
        return ResourceConfig.with_gpu(group.gpu_type, group.gpu_count)
    return ResourceConfig.with_cpu()


def test_rays_validation_accepts_every_stack(stack_settings):
    prepared = validate_cluster_config(cluster_config(stack_settings))
    assert set(prepared["available_node_types"]) == {"head", *(g.name for g in stack_settings.cluster.workers)}
    # The YAML text a user hands to `ray up` reads back to the same config.
    assert yaml.safe_load(cluster_yaml(stack_settings)) == cluster_config(stack_settings)


def test_rays_validation_can_fail():
    config = {"cluster_name": "x", "provider": {"type": "gcp"}, "available_node_types": {
        "head": {"resources": {"CPU": 0.5}, "node_config": {"machineType": "n2-standard-8"}}}, "head_node_type": "head"}
    with pytest.raises(jsonschema.ValidationError):  # resources must be whole numbers
        validate_cluster_config(config)
    config["available_node_types"]["head"]["resources"] = {"CPU": 0}
    config["available_node_types"]["head"]["node_config"] = {"acceleratorType": "tpu-8"}
    with pytest.raises(ValueError, match="tpu-8"):
        validate_cluster_config(config)


def test_each_node_type_declares_what_resource_config_asks_for(stack_settings):
    node_types = cluster_config(stack_settings)["available_node_types"]
    for group in stack_settings.cluster.workers:
        declared = node_types[group.name]["resources"]
        needed = requested(resource_config_for(group))
        for name, amount in needed.items():
            assert declared.get(name, 0) >= amount, (group.name, name, declared, needed)
        # Accelerators exactly: a node has as many as a request for the whole machine (or host) asks.
        for name in ("GPU", "TPU"):
            assert declared.get(name, 0) == needed.get(name, 0), (group.name, name)
        assert {n for n in declared if n.startswith("TPU-")} == {n for n in needed if n.startswith("TPU-")}


def test_node_types_and_counts_follow_the_settings(stacks):
    config = cluster_config(stacks["tpu-pod"])
    types = config["available_node_types"]
    assert config["max_workers"] == 5 and config["head_node_type"] == "head"
    assert types["head"]["resources"] == {"CPU": 0}
    assert (types["cpu"]["min_workers"], types["cpu"]["max_workers"]) == (1, 2)
    pod = types["v4-pod"]
    # v4-32: 32 TensorCores = 16 chips on 4 hosts of 4; each host declares its 4, the first also the head.
    assert pod["resources"]["TPU"] == 4 and pod["resources"]["TPU-v4-32-head"] == 1
    assert pod["node_config"]["acceleratorType"] == "v4-32"
    assert pod["node_config"]["runtimeVersion"] == "tpu-ubuntu2204-base"
    assert pod["node_config"]["schedulingConfig"] == {"preemptible": False}
    assert "machineType" not in pod["node_config"]
    assert types["v6e"]["resources"]["TPU"] == 8 and types["v6e"]["node_config"]["runtimeVersion"] == "v2-alpha-tpuv6e"

    gpu_types = cluster_config(stacks["gpus"])["available_node_types"]
    assert gpu_types["h100"]["resources"] == {"CPU": 208, "memory": int(1872 * 0.7 * 2**30), "GPU": 8,
                                              "accelerator_type:H100": 1}
    # Both A100 models answer a request written with the family name too.
    assert gpu_types["a100"]["resources"]["accelerator_type:A100"] == 1
    assert gpu_types["a100"]["resources"]["accelerator_type:A100-80G"] == 1
    assert "guestAccelerators" not in gpu_types["h100"]["node_config"]  # built into A3
    assert gpu_types["t4"]["node_config"]["guestAccelerators"] == [
        {"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 2}]
    assert gpu_types["t4"]["node_config"]["scheduling"] == {"onHostMaintenance": "TERMINATE", "automaticRestart": True}
    assert "deeplearning-platform-release" in gpu_types["l4"]["node_config"]["disks"][0]["initializeParams"]["sourceImage"]


def test_spot_groups_are_spot_machines_and_spot_slices(stacks):
    types = cluster_config(stacks["spot"])["available_node_types"]
    for name in ("spot-cpu", "spot-l4"):
        scheduling = types[name]["node_config"]["scheduling"]
        assert scheduling["provisioningModel"] == "SPOT" and scheduling["instanceTerminationAction"] == "DELETE"
        assert scheduling["automaticRestart"] is False
    assert types["spot-v5e"]["node_config"]["schedulingConfig"] == {"spot": True}
    assert "scheduling" not in cluster_config(stacks["cpu-only"])["available_node_types"]["cpu"]["node_config"]


def test_every_node_runs_as_the_stacks_accounts_with_the_project_and_its_environment(stack_settings):
    config = cluster_config(stack_settings)
    types = config["available_node_types"]
    email = {name: [a["email"] for a in node["node_config"]["serviceAccounts"]] for name, node in types.items()}
    assert email.pop("head") == ["marin-head@lab-marin-dev.iam.gserviceaccount.com"]
    assert set(map(tuple, email.values())) == {("marin-workers@lab-marin-dev.iam.gserviceaccount.com",)}
    # Per-type setup commands replace the global ones, so each list must install and configure alone.
    for commands in [config["setup_commands"], *(t["worker_setup_commands"] for n, t in types.items() if n != "head")]:
        text = "\n".join(commands)
        assert "'marin[ray,gcs] @ git+https://example.com/lab/marin.git@0123abc'" in text
        assert "export MARIN_PREFIX=gs://lab-marin-prefix/marin" in text and "export MARIN_CLUSTER=ray:autoscaling" in text
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        assert command.startswith(". ~/.marin-env.sh && ")
    tpu_or_gpu = {g.name: g for g in stack_settings.cluster.workers if g.tpu_type or g.gpu_type}
    for name, group in tpu_or_gpu.items():
        extra = "jax[tpu]" if group.tpu_type else "jax[cuda12]"
        assert any(extra in command for command in types[name]["worker_setup_commands"])


def test_the_nodes_cluster_setting_waits_for_the_autoscaler(tmp_path):
    from fray.cluster.current import client_from_spec
    from fray.cluster.ray_client import RayClient
    from iris.spec import engine_options
    from marin.execution.running.iris_steps import IrisEngine, IrisStepExecutor
    from marin.execution.step_runner import StepRunner

    from infra.ray_cluster import MARIN_CLUSTER

    client = client_from_spec(MARIN_CLUSTER)
    assert isinstance(client, RayClient)
    # It still checks every request: against the autoscaler's node types where no live node holds it.
    assert (client.address, client.autoscaling, client.check_resources) == ("auto", True, True)
    assert client_from_spec("ray:auto").autoscaling is None  # the plain setting asks the cluster
    # The same setting through iris, as the nodes' MARIN_CLUSTER or a runner's cluster=.
    assert engine_options(MARIN_CLUSTER) == {"backend": "ray", "ray_address": "auto"}
    assert IrisEngine(MARIN_CLUSTER).options == engine_options("ray")
    for setting in (MARIN_CLUSTER, f"iris:{MARIN_CLUSTER}"):
        executor = StepRunner(prefix=str(tmp_path / "prefix"), cluster=setting)._executor()
        if setting.startswith("iris:"):
            assert isinstance(executor, IrisStepExecutor) and executor.engine.setting == MARIN_CLUSTER
        else:
            assert executor.client.autoscaling is True


def test_the_autoscaler_adds_the_group_a_request_asks_for_and_refuses_what_no_group_declares(stack_settings):
    from fray.cluster import UnschedulableError
    from fray.cluster.ray_autoscaler import autoscaler_from_config
    from fray.cluster.ray_client import plan_placement

    autoscaler = autoscaler_from_config(cluster_config(stack_settings))
    head = [dict(cluster_config(stack_settings)["available_node_types"]["head"]["resources"])]  # the one live node

    def plan(resources: ResourceConfig):
        return plan_placement(resources, head, autoscaler, what="Step 'x'")

    for group in stack_settings.cluster.workers:
        scale_up = plan(resource_config_for(group))
        # Groups of the same hardware answer each other's requests; this one is always among them.
        assert scale_up is not None and group.name in scale_up.groups, (group.name, scale_up)
        assert scale_up.waiting_line().endswith("up to 15 min")
    with pytest.raises(UnschedulableError, match=r"has the resource 'trainer'\. "):
        plan(ResourceConfig.with_cpu(custom={"trainer": 1}))


def _declared(settings_with, group: WorkerGroup) -> dict:
    """The node type a stack with ``group`` declares, once the settings and Ray's own checks pass."""
    settings = settings_with(group)
    check_settings(settings)
    config = cluster_config(settings)
    validate_cluster_config(config)
    return config["available_node_types"][group.name]


def test_a_v5litepod_16_is_four_hosts_of_four_chips_and_112_vcpus(settings_with):
    node = _declared(settings_with, WorkerGroup(name="v5e", tpu_type="v5litepod-16"))
    assert (node["resources"]["TPU"], node["resources"]["CPU"]) == (4, 112)
    assert ResourceConfig.with_tpu("v5litepod-16").replicas == 4


@pytest.mark.parametrize("tpu_type", tpu_types() + ["v5e-1", "v5e-16", "v5e-256"])
def test_each_tpu_type_declares_per_host_what_fray_asks_each_replica_for(settings_with, tpu_type):
    node = _declared(settings_with, WorkerGroup(name="tpu", tpu_type=tpu_type))
    tpu = tpu_slice(tpu_type)
    asked = ResourceConfig.with_tpu(tpu_type)
    # Each host (Ray node) of the slice declares its chips and vCPUs; fray runs one replica per host.
    assert node["resources"]["TPU"] == ray_options(asked)["resources"]["TPU"] == tpu.host.chips
    assert node["resources"]["CPU"] == tpu.host.cpus
    assert asked.replicas == tpu.hosts
    assert f"TPU-{tpu.name}-head" in node["resources"] and f"TPU-{tpu.name}-head" in ray_options(asked)["resources"]
    # The slice the autoscaler creates is named as the TPU API names it, and Ray counts its hosts' chips alike.
    assert node["node_config"]["acceleratorType"] == tpu.name
    assert get_num_tpu_visible_chips_per_host(tpu.name) == tpu.host.chips


@pytest.mark.parametrize("machine_type", sorted(GPU_MACHINE_TYPES))
def test_each_gpu_machine_type_declares_its_gpus_and_vcpus(settings_with, machine_type):
    machine = GPU_MACHINE_TYPES[machine_type]
    node = _declared(settings_with, WorkerGroup(name="gpu", machine_type=machine_type, gpu_type=machine.gpu,
                                                gpu_count=machine.gpus))
    assert (node["resources"]["GPU"], node["resources"]["CPU"]) == (machine.gpus, machine.cpus)
    asked = requested(ResourceConfig.with_gpu(machine.gpu, machine.gpus, cpu=machine.cpus, ram="1g"))
    assert all(node["resources"].get(name, 0) >= amount for name, amount in asked.items()), (node, asked)


def test_every_tpu_generation_has_its_vm_software():
    assert set(TPU_RUNTIME_VERSIONS) == set(TPU_GENERATIONS)
