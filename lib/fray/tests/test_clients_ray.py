"""RayClient against a real local Ray cluster of 2 CPUs (started once for this module)."""

import sys
import time

import pytest

from fray.cluster import JobRequest, JobStatus, ResourceConfig, ScaleUpTimeout, UnschedulableError, ship_by_value

# Ray starts its processes with fork+exec; JAX, if another test imported it, warns about any fork.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")

from fray.cluster.ray_autoscaler import Autoscaler, find_autoscaler  # noqa: E402
from fray.cluster.ray_client import RayClient, ray_options  # noqa: E402

ship_by_value(__name__)


class Accumulator:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)
        return len(self.items)

    def contents(self):
        return list(self.items)


@pytest.fixture(scope="module")
def client():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield RayClient()
    ray.shutdown()


def test_remote_function_runs_as_a_ray_task(client):
    futures = [client.remote(lambda x: x * x, i, resources=ResourceConfig.with_cpu(ram="64m")) for i in range(4)]
    assert [f.result(timeout=60) for f in futures] == [0, 1, 4, 9]


def test_task_error_reaches_the_caller(client):
    def broken():
        raise ValueError("bad shard 3")

    with pytest.raises(Exception, match="bad shard 3"):
        client.remote(broken).result(timeout=60)


def test_actor_keeps_state_across_calls(client):
    actor = client.create_actor(Accumulator, resources=ResourceConfig.with_cpu(ram="64m"))
    assert [actor.push.remote(x).result(timeout=60) for x in "abc"] == [1, 2, 3]
    assert actor.contents.remote().result(timeout=60) == ["a", "b", "c"]
    actor.terminate()


def test_request_larger_than_any_node_fails_at_once(client):
    with pytest.raises(UnschedulableError, match=r"asks for 64 CPUs.*largest of its 1 node\(s\) has 2 CPUs"):
        client.remote(lambda: None, resources=ResourceConfig.with_cpu(cpu=64))
    with pytest.raises(UnschedulableError, match=r"1 x H100 GPU"):
        client.create_actor(Accumulator, resources=ResourceConfig.with_gpu("H100", 1))


def test_request_for_a_custom_resource_no_node_declares_fails_at_once(client):
    with pytest.raises(UnschedulableError, match=r"asks for 1 CPU, 64m RAM, trainer: 1.*none of its 1 node\(s\) has the "
                       r"custom resource 'trainer' \(custom resources of its nodes: none; .*--resources='\{\"trainer\": 1\}'"):
        client.remote(lambda: None, resources=ResourceConfig.with_cpu(ram="64m", custom={"trainer": 1}))


def test_a_cluster_without_an_autoscaler_is_asked_once_and_refuses_even_when_told_it_autoscales(client):
    # This cluster's monitor runs without an autoscaling config: nothing will ever add a node.
    told = RayClient(autoscaling=True)
    with pytest.raises(UnschedulableError, match=r"trainer.*the cluster runs no autoscaler that could add one"):
        told.check_fits(ResourceConfig.with_cpu(ram="64m", custom={"trainer": 1}))
    assert told._autoscaler is None
    # A driver on another machine asks the head with a task: the same answer.
    assert find_autoscaler(ray, remote_driver=True) is None


def _waiting_client(poll_s=0.05):
    """A client that believes the cluster autoscales with node types it cannot read: it waits."""
    waiting = RayClient(autoscaling=True)
    waiting._autoscaler = Autoscaler(None)
    waiting._watch.poll_s = poll_s
    return waiting


def test_work_whose_node_never_joins_fails_at_its_deadline(client):
    waiting = _waiting_client()
    asks = ResourceConfig.with_cpu(ram="64m", custom={"trainer": 1}, scale_up_timeout_s=1)
    future = waiting.remote(lambda: "ran", resources=asks)
    with pytest.raises(ScaleUpTimeout, match=r"<lambda> waited 1 s for the autoscaler to add a node with trainer:1, "
                                             r"and none"):
        future.result(timeout=60)

    job = waiting.submit(JobRequest("never-placed", [sys.executable, "-c", "pass"], resources=asks), start=False)
    with pytest.raises(ScaleUpTimeout, match=r"job 'never-placed' waited 1 s"):
        job.free_address()  # where iris waits for its replicas to be placed
    assert job.status() == JobStatus.FAILED
    job.release()

    actor = waiting.create_actor(Accumulator, resources=asks)
    time.sleep(2)
    with pytest.raises(ScaleUpTimeout, match=r"actor Accumulator waited 1 s"):
        actor.push.remote(1).result(timeout=60)
    # Its pending requests were withdrawn: the cluster runs other work as before.
    assert client.remote(lambda: 2, resources=ResourceConfig.with_cpu(ram="64m")).result(timeout=60) == 2


def test_a_map_whose_node_never_joins_fails_once_without_retrying(client):
    waiting = _waiting_client()
    asks = ResourceConfig.with_cpu(ram="64m", custom={"trainer": 1}, scale_up_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(ScaleUpTimeout, match="waited 1 s"):
        waiting.map(lambda x: x, range(3), resources=asks, max_retries=5)
    assert time.monotonic() - started < 30


def test_job_runs_on_a_ray_node_with_logs(client):
    def greet(name):
        print(f"hello {name}")

    job = client.submit(JobRequest("greet", greet, args=("ray",), resources=ResourceConfig.with_cpu(ram="64m")))
    assert job.wait(timeout=60) == JobStatus.SUCCEEDED
    assert "hello ray" in job.logs()
    failing = client.submit(JobRequest("fail", [sys.executable, "-c", "raise SystemExit(3)"], resources=ResourceConfig.with_cpu(ram="64m")))
    assert failing.wait(timeout=60) == JobStatus.FAILED


def test_resource_mapping_for_accelerators():
    assert ray_options(ResourceConfig.with_gpu("H100", 8, cpu=4)) == {
        "num_cpus": 4,
        "memory": 16 << 30,
        "num_gpus": 8,
        "accelerator_type": "H100",
    }
    assert ray_options(ResourceConfig.with_tpu("v4-32"))["resources"] == {"TPU": 4, "TPU-v4-32-head": 1}
    # Ray labels a v5e slice's first host with the TPU API's name, whichever spelling the request used.
    assert ray_options(ResourceConfig.with_tpu("v5e-4"))["resources"] == {"TPU": 4, "TPU-v5litepod-4-head": 1}
    assert ray_options(ResourceConfig.with_tpu("v5e-16"))["resources"] == {"TPU": 4, "TPU-v5litepod-16-head": 1}


def test_custom_resources_become_ray_resources():
    assert ray_options(ResourceConfig.with_cpu(cpu=2, ram="1g", custom={"trainer": 1})) == {
        "num_cpus": 2,
        "memory": 1 << 30,
        "resources": {"trainer": 1.0},
    }
    tpu = ray_options(ResourceConfig.with_tpu("v4-8", custom={"big_disk": 1}))
    assert tpu["resources"] == {"TPU": 4, "TPU-v4-8-head": 1, "big_disk": 1.0}


def test_a_ray_client_travels_inside_a_shipped_function_with_its_settings():
    import cloudpickle

    from fray.cluster.ray_client import RayClient

    client = RayClient("auto", task_retries=5, autoscaling=True)
    shipped = cloudpickle.loads(cloudpickle.dumps(lambda: client))()  # as a step's closure carries its shard backend
    assert (shipped.address, shipped.task_retries, shipped.autoscaling) == ("auto", 5, True)
    with shipped._lock:  # its own, fresh
        pass
