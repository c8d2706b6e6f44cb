"""zephyr pipelines on a real local Ray cluster (2 CPUs): same bytes as in-process, per-shard retries."""

import json
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from fray.cluster import client_for, ship_by_value, use_client  # noqa: E402
from fray.cluster.ray_client import RayClient  # noqa: E402
from zephyr import Dataset, current_worker_context  # noqa: E402

# ray.init starts its processes with fork+exec; the child execs at once, so JAX's warning about
# forking a multithreaded process does not apply.
pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")


@pytest.fixture(scope="module")
def ray_backend():
    # Functions defined in this file travel by value: Ray workers cannot import a test module.
    ship_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield RayClient(address=None, task_retries=1)
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def stories(synthetic_stories):
    return list(synthetic_stories[:120])


def _summarise(text):
    words = text.split()
    return {"words": len(words), "first": words[0] if words else "", "chars": len(text)}


def _word_lengths(text):
    return [min(len(word), 99) for word in text.split()]


def _read_tree(root):
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(Path(root).rglob("*")) if path.is_file()}


def test_jsonl_pipeline_with_reshard_matches_local_bytes(ray_backend, stories, tmp_path):
    def pipeline():
        return Dataset.from_list(stories, num_shards=4).map(_summarise).reshard(3)

    local = pipeline().write_jsonl(str(tmp_path / "local" / "part-{shard:05d}.jsonl"), backend="inline")
    remote = pipeline().write_jsonl(str(tmp_path / "ray" / "part-{shard:05d}.jsonl"), backend=ray_backend,
                                    scratch_url=str(tmp_path / "scratch"))
    assert len(remote.outputs) == len(local.outputs) == 3
    local_files, ray_files = _read_tree(tmp_path / "local"), _read_tree(tmp_path / "ray")
    assert sorted(ray_files) == [f"part-{i:05d}.jsonl" for i in range(3)]
    assert ray_files == local_files
    assert sum(len(data.splitlines()) for data in ray_files.values()) == len(stories)


def test_token_cache_matches_local_bytes(ray_backend, stories, tmp_path):
    def pipeline():
        return Dataset.from_list(stories, num_shards=3).map(_word_lengths)

    pipeline().write_token_cache(str(tmp_path / "local"), vocab_size=100, backend="inline")
    pipeline().write_token_cache(str(tmp_path / "ray"), vocab_size=100, backend=ray_backend)
    local_files, ray_files = _read_tree(tmp_path / "local"), _read_tree(tmp_path / "ray")
    assert "ledger.json" in ray_files and len(ray_files) > 3
    assert ray_files == local_files


def _fail_first_attempt_of_shard_one(marker_dir):
    def record_and_maybe_fail(items):
        shard = current_worker_context().shard_index
        attempt_dir = Path(marker_dir) / f"shard-{shard}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        attempt = len(list(attempt_dir.iterdir())) + 1
        (attempt_dir / f"attempt-{attempt}").touch()
        if shard == 1 and attempt == 1:
            raise RuntimeError("simulated failure of shard 1")
        return list(items)

    return record_and_maybe_fail


def test_failed_shard_is_retried_without_rerunning_finished_shards(ray_backend, tmp_path):
    markers = tmp_path / "markers"
    result = (
        Dataset.from_list(list(range(40)), num_shards=4)
        .map_shard(_fail_first_attempt_of_shard_one(str(markers)))
        .write_jsonl(str(tmp_path / "out" / "part-{shard:05d}.jsonl"), backend=ray_backend)
    )
    attempts = {path.name: len(list(path.iterdir())) for path in markers.iterdir()}
    assert attempts == {"shard-0": 1, "shard-1": 2, "shard-2": 1, "shard-3": 1}
    written = [json.loads(line) for path in result.outputs for line in Path(path).read_text().splitlines()]
    assert written == list(range(40))


def test_a_shard_that_keeps_failing_fails_the_run_with_its_error(ray_backend, tmp_path):
    def always_fails(x):
        raise ValueError(f"bad element {x}")

    no_retry = RayClient(address=None, task_retries=0)
    with pytest.raises(ValueError, match="bad element"):
        Dataset.from_list([1, 2], num_shards=2).map(always_fails).collect(backend=no_retry)


def test_ray_is_a_backend_name(ray_backend):
    assert isinstance(client_for("ray"), RayClient)
    with use_client(ray_backend):
        assert client_for("ray") is ray_backend
    assert Dataset.from_list(range(6), num_shards=3).map(lambda x: x * x).collect(backend="ray") == [
        x * x for x in range(6)
    ]
    with pytest.raises(ValueError, match="max_retries"):
        ray_backend.map(abs, [1], max_retries=-1)


def test_shard_resources_that_no_node_has_are_refused_before_any_shard_runs(ray_backend, tmp_path):
    from fray.cluster import ResourceConfig, UnschedulableError

    with pytest.raises(UnschedulableError, match="100000 CPUs"):
        Dataset.from_list([1, 2], num_shards=2).write_jsonl(
            str(tmp_path / "out" / "part-{shard:05d}.jsonl"), backend=ray_backend,
            resources=ResourceConfig.with_cpu(cpu=100_000))
    assert not (tmp_path / "out").exists()
