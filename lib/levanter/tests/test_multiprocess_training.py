"""Two CPU processes (2 devices each) train one model under jax.distributed, each feeding only its
own rows of every global batch, and match one process training on 4 devices; a tree sharded over
both is gathered whole onto process 0 (how a multi-host run writes its export).

The processes are this file run as a script (``python test_multiprocess_training.py RUN ...``), so
the worker code lives next to the test that checks it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

VOCAB = 64
SEQ = 16
BATCH = 8
STEPS = 4
WORKER_TIMEOUT_S = 400  # three processes compiling at once on a busy 2-core machine take minutes


def _train(cache_url: str, output_dir: str) -> None:
    """One process's part: the same code whether it runs alone or as one of several replicas."""
    from levanter.data.loader import DataLoader
    from levanter.data.windows import TokenWindows
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.trainer import Trainer, TrainerConfig

    config = TrainerConfig(num_train_steps=STEPS, batch_size=BATCH, log_every=1)
    # Building the trainer joins jax.distributed when the environment names a coordinator.
    trainer = Trainer(config, AdamConfig(3e-3, 0.1, warmup=1), output_dir=output_dir, asynchronous_checkpoints=False)

    import jax

    loader = DataLoader(
        [TokenWindows.over(cache_url, SEQ)],
        batch_size=BATCH,
        seed=3,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    tiny = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
    result = trainer.train(lambda key: tiny.build(VOCAB, key=key), loader)
    first_rows = next(iter(loader.iter_from(0))).tokens[:, 0].tolist()
    report = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "mesh": int(trainer.mesh.devices.size),
        "losses": [row["loss"] for row in result.history if "loss" in row],
        "first_tokens_of_local_rows": first_rows,
        "checkpoint_steps": result.checkpoint_steps,
    }
    print("RESULT " + json.dumps(report), flush=True)


def _gather() -> None:
    """One process's part of gathering a sharded tree onto process 0 (the Hugging Face export's way)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from levanter.distributed import gathered_on_process_0, initialize_distributed, wait_for_every_process

    initialize_distributed()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    whole = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    sharded = jax.make_array_from_callback(whole.shape, NamedSharding(mesh, PartitionSpec("fsdp")), lambda i: whole[i])
    replicated = jax.device_put(np.ones(2, np.float32), NamedSharding(mesh, PartitionSpec()))
    gathered = gathered_on_process_0({"sharded": sharded, "replicated": replicated, "static": "kept"})
    wait_for_every_process("test: gathered")
    report = None if gathered is None else {"sharded": np.asarray(gathered["sharded"]).tolist(),
                                            "replicated": np.asarray(gathered["replicated"]).tolist(),
                                            "static": gathered["static"]}
    print("RESULT " + json.dumps({"process_index": jax.process_index(), "gathered": report}), flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(cache_url: str, output_dir: Path, devices: int, extra_env: dict[str, str], log: Path,
           mode: str = "RUN") -> subprocess.Popen:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("IRIS_", "JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))
    }
    # Each process simulates its own number of devices and keeps the suite's compile flags (see conftest.py).
    compile_flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
                     if not flag.startswith("--xla_force_host_platform_device_count")]
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=" ".join([f"--xla_force_host_platform_device_count={devices}", *compile_flags]),
        PYTHONUNBUFFERED="1",
        **extra_env,
    )
    # Output to a file, not a pipe: nobody reads a pipe while we wait on all processes together.
    with open(log, "w") as handle:
        return subprocess.Popen([sys.executable, __file__, mode, cache_url, str(output_dir)], env=env,
                                stdout=handle, stderr=subprocess.STDOUT)


def _collect(processes: dict[str, tuple[subprocess.Popen, Path]]) -> dict[str, dict]:
    """Wait for every process under one deadline; if one fails, stop the rest at once (a replica
    whose partner died would otherwise wait for it until jax.distributed times out)."""
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    failed = None
    try:
        while time.monotonic() < deadline:
            codes = {name: process.poll() for name, (process, _) in processes.items()}
            failed = next((name for name, code in codes.items() if code not in (None, 0)), None)
            if failed or all(code == 0 for code in codes.values()):
                break
            time.sleep(0.2)
    finally:
        for process, _ in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    results, failures = {}, []
    for name, (process, log) in processes.items():
        output = log.read_text(errors="replace")
        lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
        if process.returncode != 0 or not lines:
            failures.append(f"{name} exited with {process.returncode}; output:\n{output[-4000:]}")
        else:
            results[name] = json.loads(lines[-1][len("RESULT "):])
    if failures:
        cause = f"{failed} failed first" if failed else f"not all finished within {WORKER_TIMEOUT_S}s"
        pytest.fail(f"{cause}\n\n" + "\n\n".join(failures))
    return results


@pytest.fixture(scope="module")
def token_cache(tmp_path_factory):
    from zephyr import Dataset

    url = str(tmp_path_factory.mktemp("cache") / "ramp")
    rng = np.random.default_rng(0)
    # Ramps with random starting points: learnable in a few steps, and every window differs.
    documents = [((start + np.arange(48)) % VOCAB).tolist() for start in rng.integers(0, VOCAB, size=40)]
    Dataset.from_list(documents, num_shards=2).write_token_cache(url, vocab_size=VOCAB, backend="inline")
    return url


@pytest.mark.slow
def test_two_processes_train_together_like_one_process_on_four_devices(token_cache, tmp_path):
    port = _free_port()
    replica_env = {"IRIS_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "IRIS_NUM_REPLICAS": "2"}
    runs = {
        "single process": (tmp_path / "single", 4, {}),
        # The replicas share one output folder, as hosts share a bucket.
        "replica 0": (tmp_path / "replicas", 2, {**replica_env, "IRIS_REPLICA_INDEX": "0"}),
        "replica 1": (tmp_path / "replicas", 2, {**replica_env, "IRIS_REPLICA_INDEX": "1"}),
    }
    processes = {}
    for name, (output_dir, devices, env) in runs.items():
        log = tmp_path / f"{name.replace(' ', '-')}.log"
        processes[name] = (_spawn(token_cache, output_dir, devices, env, log), log)
    results = _collect(processes)
    single, first, second = results["single process"], results["replica 0"], results["replica 1"]

    assert (single["process_count"], single["devices"], single["mesh"]) == (1, 4, 4)
    for index, replica in enumerate((first, second)):
        assert replica["process_index"] == index
        assert (replica["process_count"], replica["devices"], replica["local_devices"], replica["mesh"]) == (2, 4, 2, 4)

    # Each replica read half of the global batch, and together exactly the single process's rows.
    assert len(first["first_tokens_of_local_rows"]) == len(second["first_tokens_of_local_rows"]) == BATCH // 2
    combined = first["first_tokens_of_local_rows"] + second["first_tokens_of_local_rows"]
    assert combined == single["first_tokens_of_local_rows"]

    assert len(single["losses"]) == STEPS
    assert single["losses"][-1] < single["losses"][0]
    np.testing.assert_allclose(first["losses"], single["losses"], rtol=1e-4)
    np.testing.assert_allclose(second["losses"], first["losses"], rtol=1e-6)

    # One checkpoint written together; metrics reported once, by process 0.
    assert first["checkpoint_steps"] == second["checkpoint_steps"] == [STEPS]
    logged = [json.loads(line) for line in (tmp_path / "replicas" / "metrics.jsonl").read_text().splitlines()]
    assert [row["loss"] for row in logged if "loss" in row] == first["losses"]
    assert (tmp_path / "replicas" / "metrics.process-1.jsonl").exists()


@pytest.mark.slow
def test_a_sharded_tree_is_gathered_whole_on_process_0_only(tmp_path):
    port = _free_port()
    replica_env = {"IRIS_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "IRIS_NUM_REPLICAS": "2"}
    processes = {}
    for index in range(2):
        log = tmp_path / f"gather-{index}.log"
        processes[f"replica {index}"] = (_spawn("-", tmp_path, 2, {**replica_env, "IRIS_REPLICA_INDEX": str(index)}, log,
                                                mode="GATHER"), log)
    results = _collect(processes)
    expected = np.arange(8 * 3, dtype=np.float32).reshape(8, 3).tolist()
    assert results["replica 0"]["gathered"] == {"sharded": expected, "replicated": [1.0, 1.0], "static": "kept"}
    assert results["replica 1"]["gathered"] is None


def test_environment_settings_are_read_and_checked():
    from levanter.distributed import DistributedConfig, DistributedConfigError, distributed_config_from_env

    assert distributed_config_from_env({}) is None
    assert distributed_config_from_env({"IRIS_NUM_REPLICAS": "1"}) is None
    iris = {"IRIS_COORDINATOR_ADDRESS": "10.0.0.2:8476", "IRIS_NUM_REPLICAS": "4", "IRIS_REPLICA_INDEX": "3"}
    assert distributed_config_from_env(iris) == DistributedConfig("10.0.0.2:8476", 4, 3)
    jax_names = {"JAX_COORDINATOR_ADDRESS": "host:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}
    assert distributed_config_from_env(jax_names) == DistributedConfig("host:1234", 2, 0)
    with pytest.raises(DistributedConfigError, match="IRIS_REPLICA_INDEX"):
        distributed_config_from_env({"IRIS_COORDINATOR_ADDRESS": "h:1", "IRIS_NUM_REPLICAS": "2"})
    with pytest.raises(DistributedConfigError, match="outside 0..1"):
        distributed_config_from_env({**iris, "IRIS_NUM_REPLICAS": "2", "IRIS_REPLICA_INDEX": "2"})
    with pytest.raises(DistributedConfigError, match="needs a port"):
        distributed_config_from_env({**iris, "IRIS_COORDINATOR_ADDRESS": "10.0.0.2"})
    with pytest.raises(DistributedConfigError, match="not an integer"):
        distributed_config_from_env({**iris, "IRIS_NUM_REPLICAS": "two"})
    with pytest.raises(DistributedConfigError, match="process count"):
        distributed_config_from_env({"IRIS_REPLICA_INDEX": "0"})


def test_joining_after_jax_started_its_devices_is_refused_with_advice(monkeypatch):
    import jax

    from levanter.distributed import DistributedConfig, DistributedConfigError, initialize_distributed

    for name in ("IRIS_NUM_REPLICAS", "JAX_NUM_PROCESSES", "IRIS_COORDINATOR_ADDRESS", "IRIS_REPLICA_INDEX",
                 "JAX_COORDINATOR_ADDRESS", "JAX_PROCESS_ID", "LEVANTER_JAX_DISTRIBUTED"):
        monkeypatch.delenv(name, raising=False)
    assert initialize_distributed() is False  # alone: nothing to join
    jax.devices()
    with pytest.raises(DistributedConfigError, match="initialize_distributed\\(\\) \\(or build the Trainer\\)"):
        initialize_distributed(DistributedConfig(f"127.0.0.1:{_free_port()}", 2, 0))
    assert jax.process_count() == 1


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "RUN":
    _train(sys.argv[2], sys.argv[3])
if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "GATHER":
    _gather()
