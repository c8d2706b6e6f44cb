"""A training process exits with its own status, never an abort at interpreter exit.

A thread left running when Python exits is ended the moment it next needs the interpreter; one
inside a native call (a JAX computation or device copy, an Orbax write) is then unwound through C++
code that cannot be unwound, and the process aborts after its work is done: "terminate called
after throwing an instance of ''", exit status 134. So everything the trainer starts (the batch
prefetcher, the loader's read-ahead, checkpoint writers) must be finished by the time ``train``
returns or raises.

Each test runs a small training in a fresh interpreter (this file, with ``RUN``): the real loader
over a token cache of documents, an asynchronous checkpoint mid-run and one at the end, an
evaluation. Its data source does JAX work for every batch and is slower than a training step, so
the prefetch thread is always inside a JAX call when training ends, which is when a thread that
is not waited for aborts the process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

VOCAB, SEQ, BATCH, STEPS = 128, 32, 4, 6
CHILD_TIMEOUT_S = 300


def _run_child(mode: str, workdir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, __file__, "RUN", mode, str(workdir)], check=False, env=env, capture_output=True, text=True,
        timeout=CHILD_TIMEOUT_S,
    )


def _report(done: subprocess.CompletedProcess) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report from the training process (status {done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


@pytest.mark.slow
def test_a_finished_run_with_checkpoints_and_eval_exits_zero(tmp_path):
    done = _run_child("finish", tmp_path)
    assert "terminate called" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 0, done.stderr[-4000:]
    report = _report(done)
    assert report["checkpoint_steps"] == [4, STEPS]  # keep_last=2 of the saves at 2, 4 and 6
    assert report["eval_loss"] is not None
    assert report["threads_left"] == []


@pytest.mark.slow
def test_a_preempted_run_exits_with_the_error_not_an_abort(tmp_path):
    done = _run_child("preempt", tmp_path)
    assert "terminate called" not in done.stderr, done.stderr[-4000:]
    assert done.returncode == 1, done.stderr[-4000:]  # the uncaught TrainingPreempted
    assert "TrainingPreempted" in done.stderr
    report = _report(done)
    assert report["threads_left"] == []


# -- the training process ---------------------------------------------------------------------------


def _child(mode: str, workdir: str) -> None:
    import contextlib
    import threading

    import jax
    import jax.numpy as jnp
    import numpy as np

    from levanter.data import CacheSource, build_text_data
    from levanter.models.llama import LlamaConfig
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, Trainer, TrainerConfig
    from levanter.trainer.stopping import StopAction, StopSignal, TrainingPreempted
    from zephyr.token_cache import finalize_token_cache, write_token_cache_shard

    rng = np.random.default_rng(0)
    for name, windows in (("train", (STEPS + 8) * BATCH), ("validation", 2 * BATCH)):
        documents, total = [], 0
        while total < windows * SEQ:
            documents.append(rng.integers(0, VOCAB, size=int(rng.integers(5, 40))))
            total += len(documents[-1])
        write_token_cache_shard(f"{workdir}/{name}/shard-00000", documents, np.uint16)
        finalize_token_cache(f"{workdir}/{name}", ["shard-00000"], vocab_size=VOCAB)
    data = build_text_data(
        [CacheSource("docs", f"{workdir}/train", f"{workdir}/validation")], seq_len=SEQ, batch_size=BATCH, vocab_size=VOCAB
    )

    x = jnp.ones((512, 512))
    busy = jax.jit(lambda x: jax.lax.fori_loop(0, 100, lambda i, y: jnp.tanh(y @ x / 512), x))
    busy(x).block_until_ready()

    class BusySource:
        """The real loader's batches, each after some JAX work: the prefetch thread is inside a JAX
        call whenever the training loop stops."""

        def iter_from(self, step):
            with contextlib.closing(data.train.iter_from(step)) as batches:
                for batch in batches:
                    busy(x).block_until_ready()
                    yield batch

    stop = StopSignal()

    def preempt_at_3(trainer, step, metrics):
        if mode == "preempt" and step == 3:
            stop.request(StopAction.PREEMPT, "the test asked")

    model = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
    config = TrainerConfig(num_train_steps=STEPS, batch_size=BATCH, steps_per_checkpoint=2, eval_every=3, mesh=MeshConfig(data=1))
    trainer = Trainer(config, AdamConfig(1e-3, 0.1), output_dir=f"{workdir}/run", hooks=[preempt_at_3], stop_sources=[stop])
    before = set(threading.enumerate())

    def report(**fields):
        left = [t.name for t in threading.enumerate() if t not in before and t.daemon and t.is_alive()]
        print(json.dumps({"threads_left": left, **fields}), flush=True)

    try:
        result = trainer.train(lambda key: model.build(VOCAB, key=key), BusySource(), dict(data.validation))
    except TrainingPreempted:
        report()
        raise
    report(checkpoint_steps=result.checkpoint_steps, eval_loss=result.eval_losses.get("docs"))


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "RUN":
    _child(sys.argv[2], sys.argv[3])
