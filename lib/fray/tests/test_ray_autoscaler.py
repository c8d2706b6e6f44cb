"""Deciding between "runs now", "waits for the autoscaler" and "never", and the deadline of a wait.

No Ray cluster here: the node types are a cluster config as ``ray up`` reads it, live nodes are
dictionaries of the resources ``ray.nodes()`` reports, and the watch runs on a clock of the test's.
"""

from __future__ import annotations

import threading
import time

import pytest

from fray.cluster import ScaleUpTimeout, UnschedulableError
from fray.cluster.ray_autoscaler import (
    Autoscaler,
    ScaleUp,
    ScaleUpWatch,
    autoscaler_from_config,
    duration,
    plan_scale_up,
)

GIB = float(1 << 30)
HEAD = {"CPU": 0.0, "memory": 8 * GIB, "node:__internal_head__": 1.0}
CONFIG = {
    "max_workers": 6,
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "node_config": {}},
        "cpu": {"resources": {"CPU": 16, "memory": int(44 * GIB)}, "min_workers": 1, "max_workers": 4},
        "gpu": {"resources": {"CPU": 12, "memory": int(59 * GIB), "GPU": 1, "accelerator_type:A100": 1},
                "max_workers": 2},
        "retired": {"resources": {"CPU": 96, "GPU": 8, "accelerator_type:A100": 1}, "max_workers": 0},
    },
}
AUTOSCALER = autoscaler_from_config(CONFIG, source="cluster.yaml")
ONE_A100 = {"CPU": 1.0, "memory": 16 * GIB, "GPU": 1.0, "accelerator_type:A100": 0.001}


def plan(needed, live=(HEAD,), autoscaler=AUTOSCALER, timeout_s=900.0):
    return plan_scale_up(dict(needed), list(live), autoscaler, what="Step 'train'", asked="what it asked",
                         timeout_s=timeout_s)


def test_node_types_come_from_the_config_and_only_worker_groups_that_can_grow_are_added():
    assert [t.name for t in AUTOSCALER.node_types] == ["head", "cpu", "gpu", "retired"]
    assert [t.name for t in AUTOSCALER.addable()] == ["cpu", "gpu"]
    assert AUTOSCALER.node_types[2].declared["GPU"] == 1.0
    assert autoscaler_from_config({"max_workers": 2}).node_types is None  # a legacy file: Ray fills its types in


def test_a_request_a_live_node_holds_does_not_wait():
    assert plan({"CPU": 1.0, "memory": GIB}, live=[HEAD, {"CPU": 16.0, "memory": 44 * GIB}]) is None


def test_a_request_a_node_type_holds_waits_for_that_group_naming_what_is_missing():
    scale_up = plan(ONE_A100)
    assert scale_up.groups == ("gpu",)
    assert scale_up.waiting_line() == (
        "Step 'train': waiting for the autoscaler to add a node with GPU:1, accelerator_type:A100 "
        "(worker group 'gpu'), up to 15 min")
    # CPUs alone are missing on a head without CPUs: they are what the line names then.
    assert plan({"CPU": 2.0, "memory": GIB}).waiting_line() == (
        "Step 'train': waiting for the autoscaler to add a node with CPU:2 (worker groups 'cpu', 'gpu'), up to 15 min")


def test_a_resource_no_node_type_declares_is_refused_at_once_naming_it():
    with pytest.raises(UnschedulableError) as refused:
        plan({"CPU": 1.0, "memory": GIB, "TPU": 4.0, "TPU-v4-32-head": 1.0})
    message = str(refused.value)
    assert "\n" not in message
    assert ("neither its 1 live node(s) nor any node type of its autoscaler (cpu, gpu) has the resources "
            "'TPU', 'TPU-v4-32-head'") in message
    assert message.startswith("Step 'train' asks for what it asked, but no node of the Ray cluster can ever provide that")


def test_more_than_any_node_type_has_is_refused_naming_the_most_there_is():
    # The retired 8-GPU type would hold it, but the autoscaler may start none of it.
    with pytest.raises(UnschedulableError, match=r"has enough: GPU 8 asked, at most 1 \(node type 'gpu'\)"):
        plan({**ONE_A100, "GPU": 8.0})
    with pytest.raises(UnschedulableError, match=r"memory 100 GiB asked, at most 59 GiB \(node type 'gpu'\)"):
        plan({**ONE_A100, "memory": 100 * GIB})


def test_node_types_that_could_not_be_read_mean_waiting_without_a_group():
    scale_up = plan({"CPU": 1.0, "memory": GIB, "trainer": 1.0}, autoscaler=Autoscaler(None), timeout_s=120)
    assert scale_up.waiting_line() == "Step 'train': waiting for the autoscaler to add a node with trainer:1, up to 2 min"


def test_durations_read_as_minutes_or_seconds():
    assert [duration(s) for s in (900, 90, 150, 20, 0.5)] == ["15 min", "90 s", "2.5 min", "20 s", "0.5 s"]


class _World:
    """Live nodes and a clock the test moves."""

    def __init__(self):
        self.now = 0.0
        self.nodes = [HEAD]

    def clock(self):
        return self.now


def _wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the watch did not act in time"
        time.sleep(0.01)


def test_work_whose_node_never_joins_fails_at_its_deadline_naming_the_resource_and_the_wait():
    world = _World()
    watch = ScaleUpWatch(lambda: world.nodes, poll_s=0.01, clock=world.clock)
    failures: list[BaseException] = []
    scale_up = plan(ONE_A100, timeout_s=20)
    watch.add(scale_up, done=lambda: False, expire=failures.append)
    time.sleep(0.1)
    assert not failures and watch.waiting == 1  # before its deadline it waits
    world.now = 20.0
    _wait_until(lambda: failures)
    (error,) = failures
    assert isinstance(error, ScaleUpTimeout) and isinstance(error, UnschedulableError)
    assert str(error).startswith("Step 'train' waited 20 s for the autoscaler to add a node with GPU:1, "
                                 "accelerator_type:A100 (worker group 'gpu'), and none joined the cluster.")
    assert "scale_up_timeout_s" in str(error) and "\n" not in str(error)
    _wait_until(lambda: watch.waiting == 0)


def test_a_wait_ends_when_a_node_that_holds_it_joins_or_its_work_is_over():
    world = _World()
    watch = ScaleUpWatch(lambda: world.nodes, poll_s=0.01, clock=world.clock)
    failures: list[BaseException] = []
    over = threading.Event()
    watch.add(plan(ONE_A100, timeout_s=20), done=lambda: False, expire=failures.append)
    watch.add(plan({"CPU": 16.0, "memory": GIB}, timeout_s=20), done=over.is_set, expire=failures.append)
    world.nodes = [HEAD, {"CPU": 12.0, "memory": 59 * GIB, "GPU": 1.0, "accelerator_type:A100": 1.0}]
    _wait_until(lambda: watch.waiting == 1)  # the GPU node holds the first, not the one for 16 CPUs
    over.set()  # that one's work ended some other way (cancelled)
    _wait_until(lambda: watch.waiting == 0)
    world.now = 100.0
    time.sleep(0.1)
    assert failures == []


def test_a_scale_up_is_plain_data():
    scale_up = plan(ONE_A100)
    assert scale_up == ScaleUp("Step 'train'", tuple(sorted(ONE_A100.items())), "GPU:1, accelerator_type:A100",
                               ("gpu",), 900.0)
