"""What a job is: its command, resources, replica count, retry budgets and backend."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fray.cluster import InvalidResourceConfig, ResourceConfig
from fray.cluster.resources import DEFAULT_SCALE_UP_TIMEOUT_S, CpuDevice, GpuDevice, TpuDevice
from rigging.names import UnsafeNameError, check_relative_name, safe_name_from
from rigging.secrets import split_secrets

from iris.errors import IrisError

# EX_TEMPFAIL from sysexits.h: "temporary failure, try again later". A command exits with it to
# say it was preempted (its checkpoint is safe; run it again) rather than broken.
PREEMPTED_EXIT_CODE = 75
# EX_NOPERM from sysexits.h: "permission denied". A command exits with it when the work it was
# started for now belongs to someone else (its fencing token was superseded): running it again
# cannot help, so iris never retries it.
FENCED_OFF_EXIT_CODE = 77

BACKENDS = ("local", "ray", "slurm")


class InvalidJobSpec(IrisError, ValueError):
    """A job that cannot be run as written (empty command, negative budget, unknown backend...)."""


@dataclass(frozen=True)
class JobSpec:
    """One job. ``resources`` describe one replica; ``replicas`` copies run together, all-or-nothing.

    ``ray_address`` is only used by the Ray backend: ``"auto"`` (this machine's cluster),
    ``"ray://host:10001"``, or ``None`` for a private local cluster started for the job.
    ``slurm_partition`` is only used by the Slurm backend (``None``: the cluster's default).

    ``attempts_folder`` (any fsspec URL, e.g. a step's output folder) keeps a copy of every
    attempt's output and record there too (:mod:`iris.attempt_log`), beside the work it made.
    ``time_limit_s`` ends an attempt that runs longer, counted as a failure (TIMED_OUT): Slurm
    enforces it itself; on the other backends the supervisor does.

    ``tag`` labels every engine job of this job (its supervisor's and its replicas'), so that a
    process that knows the tag finds them again on the engine (Slurm: ``squeue``'s comment column),
    even with the job's database out of reach: ``fray.cluster.JobRequest.tag``.

    ``env`` adds variables to every replica's environment. Those that are secrets
    (:mod:`rigging.secrets`: ``WANDB_API_KEY``, ``HF_TOKEN``, any ``*_TOKEN``...) are recorded by
    name only, in ``secret_env``: :meth:`to_json` (what the job database keeps) has no secret value,
    and the job's supervisor takes the values from its own environment, which :func:`iris.submit_job`
    hands them in. ``secret_env`` may also name variables of the submitting environment to pass on.
    """

    name: str
    command: tuple[str, ...]
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    replicas: int = 1
    max_retries_failure: int = 0
    max_retries_preemption: int = 0
    backend: str = "local"
    ray_address: str | None = None
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    slurm_partition: str | None = None
    attempts_folder: str | None = None
    time_limit_s: float | None = None
    secret_env: tuple[str, ...] = ()
    tag: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.command, str):
            raise InvalidJobSpec(f"Give the command as a list of arguments, e.g. {self.command.split()!r}, not one string.")
        command = tuple(self.command)
        if not command or not all(isinstance(part, str) and part for part in command):
            raise InvalidJobSpec("A job needs a command: `iris job run -- python train.py`.")
        object.__setattr__(self, "command", command)
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in dict(self.env).items()))
        if isinstance(self.secret_env, str):
            raise InvalidJobSpec(f"Give secret_env as a list of variable names, e.g. {self.secret_env.split(',')!r}.")
        object.__setattr__(self, "secret_env", tuple(sorted({str(name) for name in self.secret_env})))
        # The name starts the job id, and the job id names the job's log folder under iris's home.
        try:
            check_relative_name(self.name, what="Job name (--name)", example="train-llama")
        except UnsafeNameError as exc:
            raise InvalidJobSpec(str(exc)) from None
        if self.replicas < 1:
            raise InvalidJobSpec(f"--replicas must be at least 1, got {self.replicas}.")
        for budget in ("max_retries_failure", "max_retries_preemption"):
            if getattr(self, budget) < 0:
                raise InvalidJobSpec(f"--{budget.replace('_', '-')} must be 0 or more, got {getattr(self, budget)}.")
        if self.backend not in BACKENDS:
            raise InvalidJobSpec(f"Unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}.")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InvalidJobSpec(f"--time-limit must be positive, got {self.time_limit_s!r} seconds.")

    def to_json(self) -> str:
        """The job as its record keeps it: secret variables by name only (see the class docstring)."""
        public, secret = split_secrets(dict(self.env))
        payload = {
            "name": self.name,
            "command": list(self.command),
            "resources": _resources_to_dict(self.resources),
            "replicas": self.replicas,
            "max_retries_failure": self.max_retries_failure,
            "max_retries_preemption": self.max_retries_preemption,
            "backend": self.backend,
            "ray_address": self.ray_address,
            "cwd": self.cwd,
            "env": public,
            "secret_env": sorted({*self.secret_env, *secret}),
            "slurm_partition": self.slurm_partition,
            "attempts_folder": self.attempts_folder,
            "time_limit_s": self.time_limit_s,
            "tag": self.tag,
        }
        return json.dumps(payload, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        payload = json.loads(text)
        payload["resources"] = _resources_from_dict(payload["resources"])
        payload["command"] = tuple(payload["command"])
        payload["env"] = tuple(payload.get("env", {}).items())
        payload["secret_env"] = tuple(payload.get("secret_env", ()))
        return cls(**payload)


def _resources_to_dict(resources: ResourceConfig) -> dict[str, Any]:
    device = resources.device
    if isinstance(device, GpuDevice):
        device_dict = {"kind": "gpu", "variant": device.variant, "count": device.count}
    elif isinstance(device, TpuDevice):
        device_dict = {"kind": "tpu", "type": device.type, "slice_count": device.slice_count}
    else:
        device_dict = {"kind": "cpu"}
    data = {"cpu": resources.cpu, "ram": resources.ram, "disk": resources.disk, "device": device_dict}
    if resources.custom:
        data["custom"] = dict(resources.custom)
    if resources.scale_up_timeout_s != DEFAULT_SCALE_UP_TIMEOUT_S:
        # The supervisor's client holds the deadline while a replica waits for an autoscaled node.
        data["scale_up_timeout_s"] = resources.scale_up_timeout_s
    return data


def _resources_from_dict(data: dict[str, Any]) -> ResourceConfig:
    device = data["device"]
    common = {"cpu": data["cpu"], "ram": data["ram"], "custom": data.get("custom", {}),
              "scale_up_timeout_s": data.get("scale_up_timeout_s", DEFAULT_SCALE_UP_TIMEOUT_S)}
    if device["kind"] == "gpu":
        return ResourceConfig.with_gpu(device["variant"], device["count"], disk=data["disk"], **common)
    if device["kind"] == "tpu":
        return ResourceConfig.with_tpu(device["type"], device["slice_count"], disk=data["disk"], **common)
    return ResourceConfig(device=CpuDevice(), disk=data["disk"], **common)


def resources_from_flags(
    *, cpu: float | None = None, memory: str | None = None, gpu: str | None = None, tpu: str | None = None
) -> ResourceConfig:
    """``--cpu/--memory/--gpu VARIANT:N/--tpu TYPE`` as a ``ResourceConfig``; bad values raise ``InvalidJobSpec``."""
    if gpu and tpu:
        raise InvalidJobSpec("Ask for either --gpu or --tpu, not both.")
    common: dict[str, Any] = {}
    if cpu is not None:
        common["cpu"] = cpu
    if memory is not None:
        common["ram"] = memory
    try:
        if gpu:
            variant, _, count = gpu.partition(":")
            try:
                gpu_count = int(count) if count else 1
            except ValueError:
                raise InvalidJobSpec(f"--gpu takes VARIANT:COUNT, e.g. H100:8; got {gpu!r}.") from None
            return ResourceConfig.with_gpu(variant or "auto", gpu_count, **common)
        if tpu:
            return ResourceConfig.with_tpu(tpu, **common)
        return ResourceConfig(**common)
    except InvalidResourceConfig as exc:
        raise InvalidJobSpec(str(exc)) from exc


ENGINE_SETTINGS = "local, ray (or ray:auto, ray:autoscaling), ray:local, ray://HOST:PORT, slurm or slurm:PARTITION"


def engine_options(setting: str) -> dict[str, Any]:
    """The ``JobSpec`` fields (backend, Ray address, Slurm partition) an engine setting names.

    The settings are fray's cluster settings (``fray.cluster.current``) for the engines iris can
    place replicas on; the thread and process flavours of ``local`` all mean child processes here.
    ``ray:autoscaling`` (what ``infra/``'s cluster sets on its nodes) is the cluster of this machine
    like ``ray``: either way the supervisor's Ray client asks the cluster's autoscaler which node
    types it can add, and a replica no live node can hold waits for one of them.
    """
    text = setting.strip()
    if text in ("", "local", "threads", "processes", "local:threads", "local:processes"):
        return {"backend": "local"}
    if text in ("ray", "ray:auto", "ray:autoscaling"):
        return {"backend": "ray", "ray_address": "auto"}
    if text == "ray:local":
        return {"backend": "ray", "ray_address": None}
    if text.startswith("ray://"):
        return {"backend": "ray", "ray_address": text}
    if text == "slurm":
        return {"backend": "slurm"}
    if text.startswith("slurm:") and text != "slurm:":
        return {"backend": "slurm", "slurm_partition": text.removeprefix("slurm:")}
    raise InvalidJobSpec(f"Unknown iris engine {setting!r}; choose one of {ENGINE_SETTINGS}.")


def default_job_name(command: Sequence[str]) -> str:
    """The name a job gets without ``--name``: its program's file name, made safe for a folder."""
    return safe_name_from(os.path.basename(command[0])) if command else "job"


def command_text(command: Sequence[str]) -> str:
    import shlex

    return shlex.join(command)
