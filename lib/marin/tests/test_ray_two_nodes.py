"""A real two-node Ray cluster on this machine, and failures on it.

Two ``ray start`` processes (see ``fray.cluster.ray_nodes``): a head with the custom resource
``head_node`` and a second node with ``trainer``; each sets ``MARIN_TEST_NODE`` to its name, so
work records which node ran it. Drivers are separate processes run as a user would
(``MARIN_CLUSTER=ray:auto MARIN_PREFIX=... python script.py``), with every input and output in an
S3 bucket (the suite's S3 test server), reached by every node.

* a tokenize + train graph: tokenize shards run on both nodes, the training step (which asks for
  ``trainer``) on the second node, and every output lands in the bucket;
* the node running a tokenize shard dies: the shard runs again on the other node and the cache is
  byte for byte what a local, in-process run writes;
* the driver dies during training: a rerun on the same prefix takes the stale lease over and
  resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")

from fray.cluster.ray_nodes import LocalRayCluster  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LocalRayCluster finds its processes in /proc"),
]

NODE_VARIABLE = "MARIN_TEST_NODE"
SHARDS = 4
GRAPH = "graph"  # the graph's prefix in the module's bucket
STEPS = 100  # of the training run whose driver is killed: far more than run before its first checkpoint

# Worker-side helpers shared by the driver scripts: each piece of work writes a small record of
# where it ran (node name, Ray node id, pid) into a local folder the test reads (both nodes are on
# this machine). The wrappers change placement records only, never what the work computes.
HELPERS = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    import ray
    from marin.execution.step_spec import takes_context
    from fray.cluster.ray_client import RayClient

    RECORDS = pathlib.Path(os.environ["TEST_RECORDS"])

    def record(kind, **facts):
        facts.update(kind=kind, node=os.environ.get("MARIN_TEST_NODE"), pid=os.getpid(),
                     node_id=ray.get_runtime_context().get_node_id(), at=time.time())
        RECORDS.mkdir(parents=True, exist_ok=True)
        # Written aside and renamed, so the test's polling reader never sees a half-written record.
        name = f"{kind}-{os.getpid()}-{time.time_ns()}.json"
        (RECORDS / f".{name}.tmp").write_text(json.dumps(facts))
        os.replace(RECORDS / f".{name}.tmp", RECORDS / name)

    def records(kind):
        return [json.loads(p.read_text()) for p in RECORDS.glob(f"{kind}-*.json")]

    def wait_until(condition, what, timeout=120):
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what} after {timeout} s")
            time.sleep(0.05)

    class RecordedShard:
        \"\"\"A zephyr stage's shard task that first records where shard ``index`` runs.\"\"\"

        def __init__(self, fn, hold):
            self.fn, self.hold = fn, hold
            self.__name__ = getattr(fn, "__name__", "shard")

        def __call__(self, index):
            record("shard", shard=index)
            self.hold(index)
            return self.fn(index)

    class RecordingRayClient(RayClient):
        \"\"\"The Ray client, with every task of its ``map`` calls recorded (zephyr runs shards through ``map``).\"\"\"

        def __init__(self, hold=lambda index: None, **kwargs):
            super().__init__(**kwargs)
            self.hold = hold

        def map(self, fn, items, **kwargs):
            return super().map(RecordedShard(fn, self.hold), items, **kwargs)

    class RecordedStep:
        def __init__(self, name, fn):
            self.name, self.fn, self.__wrapped__ = name, fn, fn

        def __call__(self, ctx):
            record("step", step=self.name, output=ctx.output_path)
            return self.fn(ctx)
    """
)

# The graph: tokenize (on the head, shards on both nodes) then train (on the `trainer` node).
# argv: inputs URL, training steps, checkpoint interval, seed.
GRAPH_SCRIPT = HELPERS + textwrap.dedent(
    """
    import dataclasses
    from fray.cluster import ResourceConfig
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from marin.execution.lazy import lower
    from marin.execution.step_runner import StepRunner
    from marin.experiment.data import tokenized
    from marin.experiment.train import train_lm

    def hold_until_slots_are_busy(index):
        # Shards are quick; holding each until three have started (the free CPUs of the cluster
        # while the tokenize step holds one) makes the spread over both nodes certain. Only a
        # pause: after two minutes the shard goes on, and the test reports where shards ran.
        deadline = time.monotonic() + 120
        while len(records("shard")) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)

    if __name__ == "__main__":
        inputs, steps, checkpoint_every, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        data = tokenized(
            "tokenized/stories",
            source=f"{inputs}/stories-*.jsonl",
            tokenizer=f"{inputs}/tokenizer",
            num_shards=4,
            backend=RecordingRayClient(hold=hold_until_slots_are_busy),
            resources=ResourceConfig.with_cpu(ram="256m", custom={"head_node": 1}),
        )
        model = train_lm(
            name="checkpoints/two-nodes",
            model=LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=64),
            optimizer=AdamConfig(learning_rate=3e-3),
            datasets={data: 1.0},
            batch_size=8,
            seq_len=64,
            num_train_steps=steps,
            seed=seed,
            steps_per_checkpoint=checkpoint_every,
            minutes_per_checkpoint=None,
            num_samples=0,
            resources=ResourceConfig.with_cpu(ram="1g", custom={"trainer": 1}),
        )
        tokenize_spec, train_spec = lower(model)
        tokenize_spec = dataclasses.replace(tokenize_spec, fn=takes_context(RecordedStep("tokenize", tokenize_spec.fn)))
        train_spec = dataclasses.replace(train_spec, fn=takes_context(RecordedStep("train", train_spec.fn)), deps=(tokenize_spec,))
        runner = StepRunner(heartbeat_s=0.5)
        report = runner.run([train_spec])
        outputs = {spec.name: runner.output_path_for(spec) for spec in (tokenize_spec, train_spec)}
        print("REPORT " + json.dumps({"ran": report.ran, "cached": report.cached, "outputs": outputs}), flush=True)
    """
)

# A tokenize pipeline (marin's own) straight on the Ray client. Every shard's first attempt
# holds: on the second node until that node is killed, on the head until the test says go.
# argv: inputs URL, output URL; the test releases the head's shards by creating `go` in the records folder.
NODE_LOSS_SCRIPT = HELPERS + textwrap.dedent(
    """
    from marin.processing.tokenize import TokenizeConfig, TokenizeInputs, run_tokenize
    from rigging.log import setup_logging

    def hold_until_released(index):
        if os.environ.get("MARIN_TEST_NODE") == "worker":
            time.sleep(120)  # the test kills this node long before
            raise TimeoutError("the node running this shard was not killed")
        wait_until(lambda: (RECORDS / "go").exists(), "the test to release the shards")

    if __name__ == "__main__":
        setup_logging()
        inputs, output = sys.argv[1], sys.argv[2]
        files = sorted(f"{inputs}/stories-{i}.jsonl" for i in range(4))
        config = TokenizeConfig(source={"kind": "files", "test": "two-nodes"}, tokenizer=None, num_shards=4)
        backend = RecordingRayClient(hold=hold_until_released, task_retries=2)
        run_tokenize(config, TokenizeInputs({"train": files}, f"{inputs}/tokenizer"), output, backend=backend)
    """
)


@pytest.fixture(scope="module")
def bucket(s3_server):
    """A bucket of this module, with this process able to read it."""
    import fsspec

    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_server.env.items():
            patch.setenv(name, value)
        fsspec.AbstractFileSystem.clear_instance_cache()
        yield s3_server.new_bucket(f"two-nodes-{uuid.uuid4().hex[:12]}")
    fsspec.AbstractFileSystem.clear_instance_cache()


def _start_second_node(nodes: LocalRayCluster) -> None:
    nodes.add_node("worker", cpus=2, resources={"trainer": 1}, env={NODE_VARIABLE: "worker"})


@pytest.fixture(scope="module")
def two_nodes(s3_server):
    """The head (2 CPUs, ``head_node``) and a second node (2 CPUs, ``trainer``), for the whole module."""
    with LocalRayCluster(env=s3_server.env) as nodes:
        # A dead node is noticed after 3 missed health checks of 0.5 s (Ray's default: 5 of 3 s).
        nodes.start_head("head", cpus=2, resources={"head_node": 1}, env={
            NODE_VARIABLE: "head", "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"})
        _start_second_node(nodes)
        yield nodes


@pytest.fixture
def cluster(two_nodes):
    """The module's cluster with both nodes up (a test before may have killed the second one)."""
    if not two_nodes.nodes["worker"].alive:
        _start_second_node(two_nodes)
    return two_nodes


@pytest.fixture(scope="module")
def inputs(bucket, synthetic_stories):
    """Four jsonl files of stories and a small BPE tokenizer, in the bucket."""
    import fsspec

    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer

    url = f"{bucket}/inputs"
    stories = list(synthetic_stories[:200])
    for index in range(SHARDS):
        part = stories[index::SHARDS]
        with fsspec.open(f"{url}/stories-{index}.jsonl", "w") as handle:
            handle.write("".join(json.dumps({"text": text}) + "\n" for text in part))
    save_tokenizer(train_bpe_tokenizer(stories, 512), f"{url}/tokenizer")
    return url


def _driver(script: str, args: list[str], cluster: LocalRayCluster, workdir: Path, records: Path,
            prefix: str | None = None) -> subprocess.Popen:
    """Start ``script`` as a user would, against ``cluster``; its output goes to files in ``workdir``
    (a pipe nobody reads while the test waits could fill up and stall the driver)."""
    (workdir / "driver.py").write_text(script)
    env = {**os.environ, **cluster.env, **cluster.driver_env, "MARIN_CLUSTER": "ray:auto", "TEST_RECORDS": str(records)}
    if prefix is not None:
        env["MARIN_PREFIX"] = prefix
    with open(workdir / "driver.out", "w") as out, open(workdir / "driver.err", "w") as err:
        return subprocess.Popen([sys.executable, str(workdir / "driver.py"), *args], cwd=workdir, env=env,
                                stdout=out, stderr=err)


def _errors(workdir: Path) -> str:
    return (workdir / "driver.err").read_text(errors="replace")[-6000:]


def _finish(process: subprocess.Popen, workdir: Path, timeout: float = 300) -> tuple[str, str]:
    """Wait for a driver; its (stdout, stderr), or a failure showing the end of its stderr."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
        pytest.fail(f"the driver did not finish within {timeout} s:\n{_errors(workdir)}")
    assert process.returncode == 0, f"the driver failed ({process.returncode}):\n{_errors(workdir)}"
    return (workdir / "driver.out").read_text(), (workdir / "driver.err").read_text(errors="replace")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def _report(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


def _records(folder: Path, kind: str) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in folder.glob(f"{kind}-*.json")), key=lambda r: r["at"])


def _files(url: str) -> dict[str, bytes]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    names = sorted(fs.find(root))
    return {name[len(root.rstrip("/")) + 1 :]: fs.cat_file(name) for name in names}


def _checkpoints(fs, records: Path) -> list[int]:
    """The committed checkpoint steps of the training step ``records`` saw start (none before it starts).

    On object storage a checkpoint counts once its commit marker is uploaded, after all its files.
    """
    from levanter.trainer.checkpoint_staging import COMMIT_MARKER

    train = [r for r in _records(records, "step") if r["step"] == "train"]
    if not train:
        return []
    fs.invalidate_cache()
    markers = fs.glob(f"{train[0]['output']}/checkpoints/*/{COMMIT_MARKER}")
    return sorted(int(path.rsplit("/", 2)[1]) for path in markers if path.rsplit("/", 2)[1].isdigit())


def _status(fs, folder: str) -> str | None:
    path = f"{folder}/.executor_status"
    return json.loads(fs.cat_file(path))["status"] if fs.exists(path) else None


@pytest.mark.timeout(600)
def test_tokenize_shards_spread_over_both_nodes_and_training_lands_on_the_trainer_node(cluster, bucket, inputs, tmp_path):
    import fsspec

    prefix, records = f"{bucket}/{GRAPH}", tmp_path / "records"
    out, err = _finish(_driver(GRAPH_SCRIPT, [inputs, "20", "10", "0"], cluster, tmp_path, records, prefix), tmp_path)
    report = _report(out)
    assert report["ran"] == ["tokenized/stories", "checkpoints/two-nodes"], err[-3000:]

    steps = {r["step"]: r["node"] for r in _records(records, "step")}
    assert steps == {"tokenize": "head", "train": "worker"}
    shards = _records(records, "shard")
    assert sorted(r["shard"] for r in shards) == list(range(SHARDS))
    assert {r["node"] for r in shards} == {"head", "worker"}, shards
    assert len({r["node_id"] for r in shards}) == 2

    fs, _ = fsspec.core.url_to_fs(prefix)
    tokenize_out, train_out = report["outputs"]["tokenized/stories"], report["outputs"]["checkpoints/two-nodes"]
    assert tokenize_out.startswith(prefix) and train_out.startswith(prefix)
    for folder in (tokenize_out, train_out):
        assert _status(fs, folder) == "SUCCESS"
        assert fs.exists(f"{folder}/.artifact.json") and fs.exists(f"{folder}/.executor_info")
        assert not fs.exists(f"{folder}/.executor_lock")
    ledger = json.loads(fs.cat_file(f"{tokenize_out}/train/ledger.json"))
    assert ledger  # the cache is complete (the ledger is written last)
    artifact = json.loads(fs.cat_file(f"{train_out}/.artifact.json"))
    assert artifact["result"]["final_step"] == 20
    assert fs.exists(f"{train_out}/metrics.jsonl") and fs.exists(f"{train_out}/hf/config.json")
    assert fs.exists(f"{train_out}/checkpoints/20") or fs.exists(f"{train_out}/checkpoints/10")
    # The driver's working directory holds what the test put there, nothing more: no URL became a local path.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver.err", "driver.out", "driver.py", "records"]


@pytest.mark.timeout(600)
def test_killed_driver_rerun_takes_the_lease_over_and_resumes_training_from_its_checkpoint(cluster, bucket, inputs, tmp_path):
    import fsspec

    # The same prefix as the graph above, another seed: the tokenized data is reused (or made here
    # when this test runs alone), the training run is a new one.
    prefix, records = f"{bucket}/{GRAPH}", tmp_path / "records"
    args = [inputs, str(STEPS), "10", "1"]
    driver = _driver(GRAPH_SCRIPT, args, cluster, tmp_path, records, prefix)
    fs, _ = fsspec.core.url_to_fs(prefix)
    try:
        deadline = time.monotonic() + 240
        while not (saved := _checkpoints(fs, records)):
            assert driver.poll() is None, f"the driver ended before a checkpoint:\n{_errors(tmp_path)}"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
    finally:
        _stop(driver)  # SIGKILL: the driver gets no chance to clean up
    train = next(r for r in _records(records, "step") if r["step"] == "train")
    train_folder = train["output"].split("/.staging-g")[0]  # the step wrote into <step>/.staging-g<N>
    assert _status(fs, train_folder) == "RUNNING"  # the killed driver never wrote an end
    # Ray ends the tasks of a driver that died; the trainer's process goes with them.
    deadline = time.monotonic() + 60
    while Path(f"/proc/{train['pid']}").exists():
        assert time.monotonic() < deadline, "the killed driver's training task still runs after 60 s"
        time.sleep(0.2)
    saved = _checkpoints(fs, records)
    assert saved and max(saved) < STEPS

    out, err = _finish(_driver(GRAPH_SCRIPT, args, cluster, tmp_path, records, prefix), tmp_path)
    report = _report(out)
    assert report["cached"] == ["tokenized/stories"] and report["ran"] == ["checkpoints/two-nodes"]
    assert f"Resumed from checkpoint step {max(saved)}" in err, err[-4000:]
    assert report["outputs"]["checkpoints/two-nodes"] == train_folder and _status(fs, train_folder) == "SUCCESS"
    metrics = [json.loads(line) for line in fs.cat_file(f"{train_folder}/metrics.jsonl").decode().splitlines() if line.strip()]
    assert [m["step"] for m in metrics if "loss" in m] == list(range(1, STEPS + 1))


@pytest.mark.timeout(600)
def test_a_shard_on_a_killed_node_runs_again_elsewhere_and_the_cache_matches_a_local_run(cluster, bucket, inputs, tmp_path):
    from marin.processing.tokenize import TokenizeConfig, TokenizeInputs, run_tokenize

    records = tmp_path / "records"
    output = f"{bucket}/node-loss/tokens"
    driver = _driver(NODE_LOSS_SCRIPT, [inputs, output], cluster, tmp_path, records)
    try:
        deadline = time.monotonic() + 120
        while len(_records(records, "shard")) < SHARDS:  # all four hold: two on each node
            assert driver.poll() is None, f"the driver ended early:\n{_errors(tmp_path)}"
            assert time.monotonic() < deadline, f"not every shard started within 120 s: {_records(records, 'shard')}"
            time.sleep(0.1)
        first = _records(records, "shard")
        on_worker = sorted(r["shard"] for r in first if r["node"] == "worker")
        assert len(on_worker) == 2, first
        cluster.kill("worker")
        (records / "go").touch()
        _finish(driver, tmp_path, timeout=240)
    finally:
        _stop(driver)

    attempts = _records(records, "shard")
    for shard in on_worker:
        again = [r for r in attempts if r["shard"] == shard and r["at"] > max(f["at"] for f in first)]
        assert again and again[-1]["node"] == "head", attempts

    local = tmp_path / "local"
    files = sorted(f"{inputs}/stories-{i}.jsonl" for i in range(SHARDS))
    config = TokenizeConfig(source={"kind": "files", "test": "two-nodes"}, tokenizer=None, num_shards=SHARDS)
    run_tokenize(config, TokenizeInputs({"train": files}, f"{inputs}/tokenizer"), str(local), backend="inline")
    remote_files, local_files = _files(output), _files(str(local))
    assert "train/ledger.json" in remote_files and len(remote_files) > SHARDS
    assert remote_files == local_files
