"""The Ray cluster file a user launches with ``ray up``, built from a stack's settings.

It promises three things, each checked by a test:

* Ray's own checks accept it (:func:`validate_cluster_config` runs what ``ray up`` runs before it
  touches the cloud: the defaults merge, the JSON schema, and the GCP provider's TPU and node
  type checks);
* every node type declares the resources a ``ResourceConfig`` for its hardware asks for through
  ``RayClient`` (``GPU`` and ``accelerator_type:<variant>``; ``TPU`` chips per host and
  ``TPU-<type>-head``; ``CPU`` and ``memory``), so the autoscaler knows which group answers a
  pending step: both read the one table of hosts and chips, :mod:`fray.cluster.accelerators`, and
  the tests hold each type's numbers against the provider's published figures and Ray's own;
* every node runs as the stack's identities (the head as the autoscaler account, workers as the
  workers' account), has the project installed, and has ``MARIN_PREFIX`` and ``MARIN_CLUSTER`` set
  in the environment its Ray processes start from.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

import yaml

from fray.cluster.accelerators import tpu_slice

from infra.catalog import GPU_FAMILY_LABELS, GPU_TYPES, MACHINE_TYPES, TPU_RUNTIME_VERSIONS
from infra.settings import StackSettings, WorkerGroup

# Steps go to the Ray cluster the node belongs to, and a step no live node can hold yet (GPU and
# TPU groups start at zero workers) waits for the autoscaler instead of being refused.
MARIN_CLUSTER = "ray:autoscaling"
HEAD_NODE_TYPE = "head"
# What a node's tasks may reserve of its memory: the rest is Ray's object store and the system.
_TASK_MEMORY_SHARE = 0.7
_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
_ENV_FILE = "~/.marin-env.sh"
_VENV = "~/marin-venv"
_UV = "~/.local/bin/uv"


def node_resources(group: WorkerGroup) -> dict[str, int]:
    """What one node (one host, for a TPU slice) of ``group`` declares to Ray."""
    if group.tpu_type is not None:
        tpu = tpu_slice(group.tpu_type)  # each host of the slice is one VM of this shape
        return {
            "CPU": tpu.host.cpus,
            "memory": _task_memory(tpu.host.memory_gb),
            "TPU": tpu.host.chips,
            # Ray's GCP provider keeps this one on the slice's first host only.
            f"TPU-{tpu.name}-head": 1,
        }
    machine = MACHINE_TYPES[group.machine_type or ""]
    resources = {"CPU": machine.cpus, "memory": _task_memory(machine.memory_gb)}
    if group.gpu_type is not None:
        resources["GPU"] = group.gpu_count
        for label in (group.gpu_type, *GPU_FAMILY_LABELS.get(group.gpu_type, ())):
            resources[f"accelerator_type:{label}"] = 1
    return resources


def _task_memory(memory_gb: float) -> int:
    # Compute Engine's "GB" of machine memory are binary gigabytes.
    return int(memory_gb * _TASK_MEMORY_SHARE * (1 << 30))


def cluster_config(settings: StackSettings) -> dict[str, Any]:
    """The ``ray up`` cluster file for ``settings`` (already checked), as a mapping."""
    cluster = settings.cluster
    node_types: dict[str, Any] = {
        HEAD_NODE_TYPE: {
            # No steps on the head: it runs the driver and the autoscaler, and is the one node up while idle.
            "resources": {"CPU": 0},
            "node_config": _compute_node(settings, cluster.head.machine_type, cluster.head.disk_gb,
                                         settings.account_email("head"), cluster.cpu_image),
        }
    }
    for group in cluster.workers:
        node_types[group.name] = {
            "min_workers": group.min_workers,
            "max_workers": group.max_workers,
            "resources": node_resources(group),
            "node_config": _worker_node(settings, group),
            "worker_setup_commands": _setup_commands(settings, group),
        }
    return {
        "cluster_name": cluster.name,
        "max_workers": sum(group.max_workers for group in cluster.workers),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": cluster.idle_timeout_minutes,
        "provider": {
            "type": "gcp",
            "region": settings.region,
            "availability_zone": settings.zone,
            "project_id": settings.project,
            # Scaled-down workers are deleted, not stopped: a stopped node's disks are still billed.
            "cache_stopped_nodes": False,
        },
        "auth": {"ssh_user": cluster.ssh_user},
        "head_node_type": HEAD_NODE_TYPE,
        "available_node_types": node_types,
        "setup_commands": _setup_commands(settings, None),
        "head_start_ray_commands": [
            f". {_ENV_FILE} && ray stop",
            f". {_ENV_FILE} && ulimit -n 65536; ray start --head --port=6379 --object-manager-port=8076 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=127.0.0.1 --disable-usage-stats",
        ],
        "worker_start_ray_commands": [
            f". {_ENV_FILE} && ray stop",
            f". {_ENV_FILE} && ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076 "
            "--disable-usage-stats",
        ],
    }


def _compute_node(settings: StackSettings, machine_type: str, disk_gb: int, account: str, image: str,
                  *, spot: bool = False, gpus: bool = False) -> dict[str, Any]:
    node: dict[str, Any] = {
        "machineType": machine_type,
        "disks": [{
            "boot": True,
            "autoDelete": True,
            "type": "PERSISTENT",
            "initializeParams": {"diskSizeGb": disk_gb, "sourceImage": image},
        }],
        "serviceAccounts": [{"email": account, "scopes": list(_SCOPES)}],
        "labels": {"marin-cluster": settings.cluster.name},
    }
    scheduling: dict[str, Any] = {}
    if gpus:  # GPU machines cannot live-migrate
        scheduling.update(onHostMaintenance="TERMINATE", automaticRestart=not spot)
        node["metadata"] = {"items": [{"key": "install-nvidia-driver", "value": "True"}]}
    if spot:
        scheduling.update(provisioningModel="SPOT", instanceTerminationAction="DELETE", automaticRestart=False,
                          onHostMaintenance="TERMINATE")
    if scheduling:
        node["scheduling"] = scheduling
    return node


def _worker_node(settings: StackSettings, group: WorkerGroup) -> dict[str, Any]:
    account = settings.account_email("workers")
    if group.tpu_type is not None:
        tpu = tpu_slice(group.tpu_type)
        return {
            "acceleratorType": tpu.name,  # the TPU API's spelling, whichever the settings used
            "runtimeVersion": group.tpu_runtime_version or TPU_RUNTIME_VERSIONS[tpu.generation.name],
            "schedulingConfig": {"spot": True} if group.spot else {"preemptible": False},
            # Ray's provider turns this into the TPU API's single serviceAccount.
            "serviceAccounts": [{"email": account, "scopes": list(_SCOPES)}],
            "labels": {"marin-cluster": settings.cluster.name},
        }
    machine = MACHINE_TYPES[group.machine_type or ""]
    has_gpus = group.gpu_type is not None
    node = _compute_node(settings, machine.name, group.disk_gb, account,
                         settings.cluster.gpu_image if has_gpus else settings.cluster.cpu_image,
                         spot=group.spot, gpus=has_gpus)
    if has_gpus and not machine.gpu_count:  # N1: the GPUs are attached, not built in
        node["guestAccelerators"] = [{
            "acceleratorType": GPU_TYPES[group.gpu_type or ""].accelerator,
            "acceleratorCount": group.gpu_count,
        }]
    return node


def node_environment(settings: StackSettings) -> dict[str, str]:
    """The variables every node's Ray processes (and so every step) start with."""
    return {"MARIN_PREFIX": settings.prefix_url, "MARIN_CLUSTER": MARIN_CLUSTER}


def _setup_commands(settings: StackSettings, group: WorkerGroup | None) -> list[str]:
    """The commands that install the project (and a group's accelerator runtime) on a node."""
    cluster = settings.cluster
    env_lines = ["export PATH=$HOME/marin-venv/bin:$PATH"]
    env_lines += [f"export {name}={shlex.quote(value)}" for name, value in node_environment(settings).items()]
    install = f"{_UV} pip install --python {_VENV}/bin/python"
    commands = [
        # uv brings its own Python, so images with an older system Python work as well.
        f"test -x {_UV} || (curl -LsSf https://astral.sh/uv/install.sh | sh)",
        f"{_UV} venv --allow-existing --python {cluster.python_version} {_VENV}",
        f"{install} {shlex.quote(cluster.project_requirement)}",
    ]
    jax_version = f"$({_VENV}/bin/python -c 'import jax; print(jax.__version__)')"
    if group is not None and group.tpu_type is not None:
        commands.append(f'{install} "jax[tpu]=={jax_version}"')
    elif group is not None and group.gpu_type is not None:
        commands.append(f'{install} "jax[cuda12]=={jax_version}"')
    commands += [
        f"printf '%s\\n' {' '.join(shlex.quote(line) for line in env_lines)} > {_ENV_FILE}",
        f"grep -qs marin-env.sh ~/.bashrc || echo '. {_ENV_FILE}' >> ~/.bashrc",
    ]
    return commands


def cluster_yaml(settings: StackSettings) -> str:
    """:func:`cluster_config` as the YAML text ``ray up`` reads."""
    # The settings are checked to hold no line breaks; a comment is still built so that none could end it.
    about = " ".join(f"Ray cluster for stack project {settings.project}, prefix {settings.prefix_url}.".splitlines())
    header = (f"# {about}\n"
              "# Generated from the stack settings by `python -m infra.cli cluster-file`; edit the settings, not this.\n")
    return header + yaml.safe_dump(cluster_config(settings), sort_keys=False, width=120)


def validate_cluster_config(config: dict[str, Any]) -> dict[str, Any]:
    """Run Ray's own checks of a cluster config, offline; returns the config with Ray's defaults merged.

    The steps ``ray up`` takes before it calls the cloud: merge the provider's defaults and check
    the result against Ray's schema (``prepare_config``, ``validate_config``), then check each TPU
    node's accelerator type as Ray's GCP provider does (its ``_validate_tpu_config`` asks the same
    ``TPUAcceleratorManager``; that module itself needs Google's API client, which only ``ray up``
    needs). Raises Ray's own exceptions.
    """
    from ray._private.accelerators import TPUAcceleratorManager
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    for name, node_type in prepared["available_node_types"].items():
        node = node_type["node_config"]
        if "acceleratorType" in node:
            if "machineType" in node:
                raise ValueError(f"node type {name!r} has both machineType and acceleratorType")
            if not TPUAcceleratorManager.is_valid_tpu_accelerator_type(node["acceleratorType"]):
                raise ValueError(f"node type {name!r}: Ray does not know TPU type {node['acceleratorType']!r}")
        elif "machineType" not in node:
            raise ValueError(f"node type {name!r} has neither machineType nor acceleratorType")
    return prepared


__all__ = ["HEAD_NODE_TYPE", "MARIN_CLUSTER", "cluster_config", "cluster_yaml", "node_environment", "node_resources",
           "validate_cluster_config"]
