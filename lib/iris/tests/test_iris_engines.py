"""Engine settings iris accepts, and what of a job's placement reaches its supervisor through the store."""

from __future__ import annotations

import json

import pytest
from fray.cluster import ResourceConfig

from iris.spec import InvalidJobSpec, JobSpec, engine_options


def test_the_setting_an_autoscaling_clusters_nodes_carry_is_an_engine():
    # infra's cluster sets MARIN_CLUSTER=ray:autoscaling on its nodes; iris:ray:autoscaling must run there.
    assert engine_options("ray:autoscaling") == {"backend": "ray", "ray_address": "auto"}
    assert engine_options("ray:autoscaling") == engine_options("ray") == engine_options("ray:auto")
    assert engine_options("ray:local") == {"backend": "ray", "ray_address": None}
    assert engine_options("slurm:gpu") == {"backend": "slurm", "slurm_partition": "gpu"}
    with pytest.raises(InvalidJobSpec, match=r"ray \(or ray:auto, ray:autoscaling\)"):
        engine_options("ray:autoscale")


def test_a_jobs_scale_up_deadline_reaches_its_supervisor_through_the_store():
    waits = ResourceConfig.with_gpu("H100", 8, scale_up_timeout_s=3600)
    spec = JobSpec(name="t", command=("true",), resources=waits, backend="ray", ray_address="auto")
    assert JobSpec.from_json(spec.to_json()).resources.scale_up_timeout_s == 3600
    # The default is not written, so records from before read the same.
    plain = JobSpec(name="t", command=("true",), resources=ResourceConfig.with_cpu())
    assert "scale_up_timeout_s" not in json.loads(plain.to_json())["resources"]
    assert JobSpec.from_json(plain.to_json()).resources.scale_up_timeout_s == 15 * 60


def test_the_supervisor_runs_on_the_engine_where_the_engine_can_keep_it(monkeypatch):
    from iris.placement import SupervisorPlacementError, supervised_on_engine
    from iris.spec import JobSpec

    def spec(**options):
        return JobSpec(name="j", command=("true",), **options)

    monkeypatch.delenv("IRIS_SUPERVISOR", raising=False)
    assert supervised_on_engine(spec(backend="slurm"))
    assert supervised_on_engine(spec(backend="ray", ray_address="auto"))
    assert not supervised_on_engine(spec(backend="ray", ray_address="ray://head:10001"))  # no node of its own
    assert not supervised_on_engine(spec(backend="ray", ray_address=None))  # a private cluster it starts itself
    assert not supervised_on_engine(spec(backend="local"))
    monkeypatch.setenv("IRIS_SUPERVISOR", "here")
    assert not supervised_on_engine(spec(backend="slurm"))
    monkeypatch.setenv("IRIS_SUPERVISOR", "cloud")
    with pytest.raises(SupervisorPlacementError, match="'engine'"):
        supervised_on_engine(spec(backend="slurm"))
