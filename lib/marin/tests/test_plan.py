"""What `marin plan` compiles for (the pod a step's resources name) and the order in which it looks
for a change that fits, with the compiler replaced by a rule: nothing here compiles (the pods are
compiled for in tests/test_pod_plans.py)."""

import dataclasses
from types import SimpleNamespace

import pytest

from fray.cluster import ResourceConfig
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import MeshConfig, TrainerConfig
from levanter.trainer.ahead_of_time import DoesNotFit
from marin.experiment import plan as planning
from marin.experiment.train_step import TrainingRequest

MODEL = LlamaConfig(hidden_dim=64, intermediate_dim=128, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=512)


def test_a_slice_is_compiled_for_as_the_topology_libtpu_names():
    pod = planning.pod_of(ResourceConfig.with_tpu("v5litepod-256"))
    assert (pod.topology, pod.chips, pod.slices, pod.hbm_bytes) == ("v5e:16x16", 256, 1, 16 * 2**30)
    assert planning.pod_of(ResourceConfig.with_tpu("v5p-512")).topology == "v5p:4x8x8"
    two = planning.pod_of(ResourceConfig.with_tpu("v5litepod-256", slice_count=2))
    assert (two.topology, two.slices, two.chips, two.resources) == ("v5e:16x16", 2, 512, "with_tpu('v5litepod-256', slice_count=2)")


def test_one_chip_is_one_device_of_the_smallest_topology_libtpu_describes():
    pod = planning.pod_of(ResourceConfig.with_tpu("v6e-1"))
    assert pod.topology == "v6e:2x2" and pod.chips == 1 and "one chip" in pod.note


def test_gpus_and_cpus_are_not_a_pod():
    assert planning.pod_of(ResourceConfig.with_cpu()) is None
    assert planning.pod_of(ResourceConfig.with_gpu("H100", 8)) is None


def request_of(remat: str, batch_size: int, mesh: MeshConfig, microbatch_size: int | None = None) -> TrainingRequest:
    trainer = TrainerConfig(num_train_steps=10, batch_size=batch_size, microbatch_size=microbatch_size, mesh=mesh)
    return TrainingRequest(dataclasses.replace(MODEL, remat=remat), AdamConfig(1e-3), trainer, {}, 512, 0)


def fake_compiler(monkeypatch, fits):
    """plan_step with the compiler replaced by ``fits(request, resources)``; returns the requests it was given."""
    tried = []

    def plan_step(step, request, resources, vocab_size):
        tried.append((request, resources))
        pod = planning.pod_of(resources)
        result = SimpleNamespace(fits=True) if fits(request, resources) else \
            DoesNotFit({}, "TPU v5 lite", pod.chips, 20 * 2**30, 15 * 2**30, "RESOURCE_EXHAUSTED", 0.0)
        return planning.StepPlan(step, pod, request, vocab_size, result)

    monkeypatch.setattr(planning, "plan_step", plan_step)
    return tried


def refused(request: TrainingRequest, resources: ResourceConfig) -> planning.StepPlan:
    return planning.StepPlan("train", planning.pod_of(resources), request, 1000,
                             DoesNotFit({}, "TPU v5 lite", 4, 20 * 2**30, 15 * 2**30, "RESOURCE_EXHAUSTED", 0.0))


def test_the_search_tries_each_stronger_remat_policy_first(monkeypatch):
    tried = fake_compiler(monkeypatch, lambda request, resources: request.model.remat == "save_attention")
    resources = ResourceConfig.with_tpu("v5litepod-4")
    change = planning.find_fitting_change(refused(request_of("none", 8, MeshConfig(data=1, fsdp=4)), resources), resources)
    assert [request.model.remat for request, _ in tried] == ["save_matmuls", "save_attention"]
    assert change.settings == {"model.remat": "save_attention"}
    assert change.describe() == "model=dataclasses.replace(model, remat='save_attention')"


def test_then_microbatches_of_half_the_rows_down_to_one_row_a_chip(monkeypatch):
    tried = fake_compiler(monkeypatch, lambda request, resources: (request.trainer.microbatch_size or 64) <= 8)
    resources = ResourceConfig.with_tpu("v5litepod-4")
    change = planning.find_fitting_change(refused(request_of("full", 64, MeshConfig(data=1, fsdp=4)), resources), resources)
    assert [request.trainer.microbatch_size for request, _ in tried] == [32, 16, 8]
    assert change.settings == {"microbatch_size": 8} and change.describe() == "microbatch_size=8"


def test_then_a_slice_of_twice_the_chips_and_no_further(monkeypatch):
    tried = fake_compiler(monkeypatch, lambda request, resources: False)
    resources = ResourceConfig.with_tpu("v5litepod-128")
    change = planning.find_fitting_change(refused(request_of("full", 256, MeshConfig(data=1, fsdp=128)), resources), resources)
    assert change is None
    # 256 rows on 128 chips: halved once to one row a chip, then the v5e slice twice as large (the
    # largest), where the whole batch is one row a chip.
    assert [(request.trainer.microbatch_size, resources.device.type) for request, resources in tried] == [
        (128, "v5litepod-128"), (None, "v5litepod-256")]
    assert tried[-1][0].trainer.mesh == MeshConfig(data=1, fsdp=256)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_the_search_stops_after_so_many_compiles(monkeypatch, remat):
    tried = fake_compiler(monkeypatch, lambda request, resources: False)
    resources = ResourceConfig.with_tpu("v5litepod-4")
    planning.find_fitting_change(refused(request_of(remat, 2**12, MeshConfig(data=1, fsdp=4)), resources), resources)
    assert len(tried) == planning.MAX_CHANGES_TRIED
