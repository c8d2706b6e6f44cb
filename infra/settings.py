"""A stack's settings: one YAML file per environment, read into frozen dataclasses.

The file is read with the project's own config loader (:func:`marin.experiment.config.load_config`),
so an unknown key is refused with the closest field names and a value of the wrong type names its
field. :func:`check_settings` then holds every value against what Google Cloud accepts (see
:mod:`infra.catalog`) and raises :class:`~infra.errors.StackSettingsError` naming the field, e.g.
``cluster.workers[1].gpu_count``, before the Pulumi program declares a single resource. Text
settings are held to the form of the place they end up (:mod:`infra.setting_forms`): an object
prefix, a shell word, a YAML scalar, an IAM member; no setting may hold a control character.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fray.cluster.accelerators import UnknownTpuType, tpu_slice
from marin.experiment.config import load_config

from infra import setting_forms
from infra.catalog import GPU_TYPES, MACHINE_TYPES, MachineType
from infra.errors import StackSettingsError


@dataclass(frozen=True)
class BucketSettings:
    """The bucket that holds the prefix: ``gs://<name>/<prefix>`` is every node's ``MARIN_PREFIX``."""

    name: str = ""
    location: str = "US-CENTRAL1"  # a region, dual-region or multi-region (US, EU, ASIA)
    prefix: str = "marin"
    versioning: bool = False  # keep overwritten and deleted objects as noncurrent versions
    noncurrent_days: int = 30  # with versioning: how long a noncurrent version is kept
    scratch_days: int = 7  # objects under <prefix>/.work/ older than this are deleted
    force_destroy: bool = False  # let `pulumi destroy` delete a bucket that still holds objects


@dataclass(frozen=True)
class HeadSettings:
    """The Ray head: runs the driver (the step runner) and the autoscaler, no steps of its own."""

    machine_type: str = "n2-standard-8"
    disk_gb: int = 100


@dataclass(frozen=True)
class WorkerGroup:
    """One kind of worker: a CPU or GPU machine type, or a TPU slice (``tpu_type``, no machine type).

    A TPU group's "worker" is a whole slice; the autoscaler starts Ray on each of its hosts.
    """

    name: str
    machine_type: str | None = None
    gpu_type: str | None = None
    gpu_count: int = 0
    tpu_type: str | None = None
    tpu_runtime_version: str | None = None  # default: the generation's (infra.catalog.TPU_RUNTIME_VERSIONS)
    spot: bool = False
    min_workers: int = 0
    max_workers: int = 1
    disk_gb: int = 200


@dataclass(frozen=True)
class ClusterSettings:
    """The Ray cluster ``ray up`` launches from the generated cluster file."""

    name: str = "marin"
    head: HeadSettings = field(default_factory=HeadSettings)
    workers: tuple[WorkerGroup, ...] = (WorkerGroup(name="cpu", machine_type="n2-standard-16", max_workers=4),)
    idle_timeout_minutes: int = 10
    # What every node installs: pip's requirement for the project with its ray and gcs extras, e.g.
    # "marin[ray,gcs] @ git+https://github.com/<your org>/marin.git@<commit>" (a fork, a tag, a wheel URL).
    project_requirement: str = ""
    python_version: str = "3.11"
    ssh_user: str = "ubuntu"
    cpu_image: str = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"
    # GPU nodes need NVIDIA's driver: a Deep Learning VM image installs it at first boot.
    gpu_image: str = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"


@dataclass(frozen=True)
class WebSettings:
    """``marin serve`` on Cloud Run, as the read-only identity; ``image`` empty: not deployed yet."""

    image: str = ""
    # Who may open it: IAM members ('user:...', 'group:...', 'serviceAccount:...', 'domain:...').
    invokers: tuple[str, ...] = ()
    # allUsers, allAuthenticatedUsers and consumer domains (domain:gmail.com) open it to anyone; only with this.
    allow_public_invokers: bool = False
    cpu: str = "1"
    memory: str = "1Gi"
    max_instances: int = 2


@dataclass(frozen=True)
class StackSettings:
    """Everything one environment (dev, prod, another lab's project) provisions."""

    project: str = ""
    region: str = "us-central1"
    zone: str = "us-central1-a"
    bucket: BucketSettings = field(default_factory=BucketSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    web: WebSettings = field(default_factory=WebSettings)

    @property
    def prefix_url(self) -> str:
        """The ``MARIN_PREFIX`` every node and the web view use."""
        path = self.bucket.prefix.strip("/")
        return f"gs://{self.bucket.name}/{path}" if path else f"gs://{self.bucket.name}"

    def account_id(self, role: str) -> str:
        """The service account id of ``role`` ("workers", "head", "web") in this stack."""
        return f"{self.cluster.name}-{role}"

    def account_email(self, role: str) -> str:
        return f"{self.account_id(role)}@{self.project}.iam.gserviceaccount.com"


def load_settings(path: str) -> StackSettings:
    """The settings in the YAML file at ``path``, checked (:func:`check_settings`)."""
    settings = load_config(StackSettings, path)
    check_settings(settings)
    return settings


# -- checks -------------------------------------------------------------------------------------

# Matched with fullmatch: a pattern ending in '$' also matches before a trailing newline.
_PROJECT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]*[a-z0-9]")
_NAME = re.compile(r"[a-z]([a-z0-9-]*[a-z0-9])?")
_GROUP = re.compile(r"[a-z][a-z0-9-]{0,30}")
_LOCATION = re.compile(r"[A-Za-z]+[A-Za-z0-9-]*[A-Za-z0-9]")
# Compute Engine's persistent disks: 10 GB to 64 TB.
MIN_DISK_GB, MAX_DISK_GB = 10, 65_536


def _fail(field_path: str, message: str) -> StackSettingsError:
    return StackSettingsError(f"Stack setting {field_path}: {message}")


def _closest(value: str, known: list[str]) -> str:
    # A family name ("A100") means one of its models before it means a similar-looking other name.
    close = [name for name in known if name.startswith(value + "-")] or difflib.get_close_matches(value, known, n=3,
                                                                                                  cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _text_fields(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(field path, text) of every text setting, nested ones and list items included."""
    if dataclasses.is_dataclass(value):
        for item in dataclasses.fields(value):
            yield from _text_fields(getattr(value, item.name), f"{path}.{item.name}" if path else item.name)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _text_fields(item, f"{path}[{index}]")
    elif isinstance(value, str):
        yield path, value


def _check_form(value: str, field_path: str, form: Callable[[str], str | None]) -> None:
    why = form(value)
    if why:
        raise _fail(field_path, why)


def check_settings(settings: StackSettings) -> None:
    """Raise :class:`StackSettingsError` for the first value Google Cloud or Ray would refuse."""
    for field_path, text in _text_fields(settings):
        _check_form(text, field_path, setting_forms.control_character)
    if not _PROJECT.fullmatch(settings.project):
        raise _fail("project", f"{settings.project!r} is not a Google Cloud project id (6-30 lowercase letters, "
                               "digits and dashes, starting with a letter).")
    _check_form(settings.region, "region", setting_forms.region)
    if not re.fullmatch(r"[a-z]", settings.zone.removeprefix(settings.region + "-")):
        raise _fail("zone", f"{settings.zone!r} is not a zone of region {settings.region!r} (e.g. {settings.region}-a).")
    check_bucket_name(settings.bucket.name, "bucket.name")
    if not _LOCATION.fullmatch(settings.bucket.location):
        raise _fail("bucket.location", f"{settings.bucket.location!r} is not a location such as 'US-CENTRAL1' or 'US'.")
    _check_form(settings.bucket.prefix, "bucket.prefix", setting_forms.object_prefix)
    for name in ("scratch_days", "noncurrent_days"):
        if getattr(settings.bucket, name) < 1:
            raise _fail(f"bucket.{name}", f"must be at least 1 day, got {getattr(settings.bucket, name)}.")
    _check_cluster(settings)
    _check_web(settings.web)


def check_bucket_name(name: str, field_path: str = "bucket.name") -> None:
    """Cloud Storage's naming rules for a bucket."""
    why = None
    if not name:
        why = "is empty; name the bucket that will hold the prefix (globally unique, e.g. 'mylab-marin')."
    elif not _BUCKET.fullmatch(name) or name != name.lower():
        why = ("may hold only lowercase letters, digits, dashes, underscores and dots, and must start and end "
               "with a letter or digit.")
    elif len(name) > 222 or (len(name) > 63 and "." not in name) or any(len(p) > 63 for p in name.split(".")):
        why = "is too long: at most 63 characters (222 with dots, each dot-separated part at most 63)."
    elif len(name) < 3:
        why = "is too short: at least 3 characters."
    elif name.startswith("goog") or "google" in name or "g00gle" in name:
        why = "may not start with 'goog' or contain 'google'."
    elif ".." in name or ".-" in name or "-." in name:
        why = "may not have a dot next to another dot or a dash."
    else:
        try:
            ipaddress.IPv4Address(name)
            why = "may not be an IP address."
        except ValueError:
            pass
    if why:
        raise _fail(field_path, f"bucket name {name!r} {why}")


def _check_cluster(settings: StackSettings) -> None:
    cluster = settings.cluster
    # It names the service accounts, whose ids are 6 to 30 characters: <name>-web ... <name>-workers.
    if (not _NAME.fullmatch(cluster.name) or len(settings.account_id("workers")) > 30
            or len(settings.account_id("web")) < 6):
        raise _fail("cluster.name", f"{cluster.name!r} must be 2 to 22 lowercase letters, digits and dashes, "
                                    "starting with a letter (it names the service accounts).")
    _check_form(cluster.project_requirement, "cluster.project_requirement", setting_forms.requirement)
    _check_form(cluster.python_version, "cluster.python_version", setting_forms.python_version)
    _check_form(cluster.ssh_user, "cluster.ssh_user", setting_forms.user_name)
    _check_form(cluster.cpu_image, "cluster.cpu_image", setting_forms.compute_image)
    _check_form(cluster.gpu_image, "cluster.gpu_image", setting_forms.compute_image)
    _check_disk(cluster.head.disk_gb, "cluster.head.disk_gb")
    head = _machine(cluster.head.machine_type, "cluster.head.machine_type")
    if head.gpu_count:
        raise _fail("cluster.head.machine_type", f"{head.name} has GPUs; the head runs no steps, use e.g. n2-standard-8.")
    if cluster.idle_timeout_minutes < 1:
        raise _fail("cluster.idle_timeout_minutes", f"must be at least 1, got {cluster.idle_timeout_minutes}.")
    if not cluster.workers:
        raise _fail("cluster.workers", "no worker group; add at least one (a CPU group is the smallest).")
    seen: set[str] = set()
    for index, group in enumerate(cluster.workers):
        where = f"cluster.workers[{index}]"
        if not _GROUP.fullmatch(group.name) or group.name == "head":
            raise _fail(f"{where}.name", f"{group.name!r} must be lowercase letters, digits and dashes, start with a "
                                         "letter, and not be 'head'.")
        if group.name in seen:
            raise _fail(f"{where}.name", f"{group.name!r} names two worker groups.")
        seen.add(group.name)
        check_worker_group(group, where)


def check_worker_group(group: WorkerGroup, where: str) -> None:
    """One worker group against the catalog: what the machine holds, TPU types, worker counts."""
    if group.min_workers < 0:
        raise _fail(f"{where}.min_workers", f"must not be negative, got {group.min_workers}.")
    if group.max_workers < max(1, group.min_workers):
        raise _fail(f"{where}.max_workers", f"{group.max_workers} is below min_workers ({group.min_workers}) or "
                                            "below 1; max_workers must be at least both.")
    _check_disk(group.disk_gb, f"{where}.disk_gb")
    if group.tpu_type is not None:
        _check_tpu_group(group, where)
        return
    if group.machine_type is None:
        raise _fail(f"{where}.machine_type", "is not set; a CPU or GPU group needs one (e.g. n2-standard-16), a TPU "
                                             "group sets tpu_type instead.")
    machine = _machine(group.machine_type, f"{where}.machine_type")
    _check_gpus(group, machine, where)


def _check_disk(disk_gb: int, field_path: str) -> None:
    if not MIN_DISK_GB <= disk_gb <= MAX_DISK_GB:
        raise _fail(field_path, f"must be between {MIN_DISK_GB} and {MAX_DISK_GB:,} (GB), got {disk_gb:,}.")


def _check_tpu_group(group: WorkerGroup, where: str) -> None:
    tpu_type = group.tpu_type or ""
    try:
        tpu_slice(tpu_type)  # either spelling of v5e; the cluster file writes the TPU API's
    except UnknownTpuType as error:
        raise _fail(f"{where}.tpu_type", str(error)) from None
    for name in ("machine_type", "gpu_type"):
        if getattr(group, name) is not None:
            raise _fail(f"{where}.{name}", f"a TPU group ({tpu_type}) has no {name.replace('_', ' ')}; remove it.")
    if group.gpu_count:
        raise _fail(f"{where}.gpu_count", f"a TPU group ({tpu_type}) has no GPUs; remove it.")
    if group.tpu_runtime_version is not None:
        _check_form(group.tpu_runtime_version, f"{where}.tpu_runtime_version", setting_forms.resource_name)


def _machine(name: str, field_path: str) -> MachineType:
    machine = MACHINE_TYPES.get(name)
    if machine is None:
        raise _fail(field_path, f"unknown machine type {name!r}.{_closest(name, list(MACHINE_TYPES))}")
    return machine


def _check_gpus(group: WorkerGroup, machine: MachineType, where: str) -> None:
    if group.gpu_type is None:
        if group.gpu_count:
            raise _fail(f"{where}.gpu_type", f"gpu_count is {group.gpu_count} but no gpu_type is set "
                                             f"(one of {', '.join(GPU_TYPES)}).")
        if machine.gpu_count:
            raise _fail(f"{where}.gpu_type", f"{machine.name} comes with {machine.gpu_count} {machine.gpu_type} GPU(s); "
                                             f"set gpu_type: {machine.gpu_type} and gpu_count: {machine.gpu_count}.")
        return
    gpu = GPU_TYPES.get(group.gpu_type)
    if gpu is None:
        raise _fail(f"{where}.gpu_type", f"unknown GPU type {group.gpu_type!r} (known: {', '.join(GPU_TYPES)})."
                                         f"{_closest(group.gpu_type, list(GPU_TYPES))}")
    if group.gpu_count < 1:
        raise _fail(f"{where}.gpu_count", f"must be at least 1 with gpu_type {gpu.name}, got {group.gpu_count}.")
    if machine.gpu_count:  # accelerator-optimized: the machine type fixes model and count
        if machine.gpu_type != gpu.name:
            raise _fail(f"{where}.gpu_type", f"{machine.name} comes with {machine.gpu_type} GPUs, not {gpu.name}."
                                             f"{_machines_for(gpu.name, group.gpu_count)}")
        if machine.gpu_count != group.gpu_count:
            raise _fail(f"{where}.gpu_count", f"{machine.name} holds {machine.gpu_count} {gpu.name} GPU(s), not "
                                              f"{group.gpu_count}.{_machines_for(gpu.name, group.gpu_count)}")
        return
    counts = dict(gpu.n1_counts)
    if not machine.name.startswith("n1-") or not counts:
        raise _fail(f"{where}.machine_type", f"{machine.name} cannot take {gpu.name} GPUs."
                                             f"{_machines_for(gpu.name, group.gpu_count)}")
    if group.gpu_count not in counts:
        raise _fail(f"{where}.gpu_count", f"an N1 machine takes {' or '.join(str(c) for c in counts)} {gpu.name} "
                                          f"GPUs, not {group.gpu_count}.")
    if machine.cpus > counts[group.gpu_count]:
        raise _fail(f"{where}.machine_type", f"{machine.name} has {machine.cpus} vCPUs; with {group.gpu_count} "
                                             f"{gpu.name} GPU(s) an N1 machine may have at most {counts[group.gpu_count]}.")


def _machines_for(gpu_type: str, count: int) -> str:
    """A hint naming the machine types that hold ``count`` GPUs of ``gpu_type``."""
    exact = [m.name for m in MACHINE_TYPES.values() if m.gpu_type == gpu_type and m.gpu_count == count]
    if exact:
        return f" For {count} {gpu_type} use {' or '.join(exact)}."
    if GPU_TYPES[gpu_type].n1_counts:
        return f" {gpu_type} attaches to N1 machines (e.g. n1-standard-8)."
    sizes = sorted({m.gpu_count for m in MACHINE_TYPES.values() if m.gpu_type == gpu_type})
    return f" {gpu_type} machine types hold {', '.join(map(str, sizes))} GPUs."


def _check_web(web: WebSettings) -> None:
    for index, member in enumerate(web.invokers):
        _check_form(member, f"web.invokers[{index}]",
                    lambda value: setting_forms.iam_member(value, allow_public=web.allow_public_invokers))
    _check_form(web.image, "web.image", setting_forms.container_image)
    _check_form(web.cpu, "web.cpu", setting_forms.cpu_limit)
    _check_form(web.memory, "web.memory", setting_forms.memory_limit)
    if web.max_instances < 1:
        raise _fail("web.max_instances", f"must be at least 1, got {web.max_instances}.")


__all__ = ["BucketSettings", "ClusterSettings", "HeadSettings", "StackSettings", "WebSettings", "WorkerGroup",
           "check_bucket_name", "check_settings", "check_worker_group", "load_settings"]
