"""Checkpoint save and restore into a local folder and into an S3 bucket, side by side.

The whole train state of the nano Llama (``experiments.llama.llama_nano``, vocabulary 4,096:
parameters and Adam moments, float32, filled with random values) is saved by :class:`levanter.trainer.Checkpointer` into a
fresh local folder, which Orbax writes itself, and into a fresh bucket of a local S3 server (moto's,
started by this script), which goes through the local staging folder and an upload (see
``levanter.trainer.checkpoint_staging``). Then a fresh checkpointer restores it. Local and S3
alternate ``--repeat`` times; medians are reported.

Times: ``save`` until the checkpoint is committed (and uploaded), ``save_blocking`` how long an
asynchronous save holds up training, ``restore`` a fresh checkpointer's restore (downloading first,
for S3).

Usage: ``python bench/checkpoint_object_store.py [--vocab 4096] [--repeat 5]``. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time

from rigging.local_stores import local_s3_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every phase of every save

    import jax

    from experiments.llama import llama_nano
    from levanter.optim import AdamConfig
    from levanter.trainer import Checkpointer, Trainer, TrainerConfig
    from rigging import filesystem as fsx

    scratch = tempfile.mkdtemp(prefix="checkpoint-object-store-")
    try:
        trainer = Trainer(TrainerConfig(num_train_steps=1, batch_size=jax.device_count()), AdamConfig(learning_rate=1e-3),
                          output_dir=os.path.join(scratch, "init"))
        state, _, _ = trainer.init_state(lambda key: llama_nano.build(args.vocab, key=key))
        # Fresh Adam moments are zeros, which Orbax's compression shrinks to nothing; give every
        # floating array random contents, as after some training.
        leaves, treedef = jax.tree.flatten(state)
        keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
        state = jax.tree.unflatten(treedef, [
            leaf + jax.random.normal(key, leaf.shape, leaf.dtype) if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating) else leaf
            for leaf, key in zip(leaves, keys)
        ])
        seconds: dict[str, dict[str, list[float]]] = {w: {"save": [], "save_blocking": [], "restore": []} for w in ("local", "s3")}
        size = 0
        with local_s3_server() as store:
            os.environ.update(store.env)
            for i in range(args.repeat):
                for where in ("local", "s3"):
                    root = os.path.join(scratch, f"local-{i}") if where == "local" else store.new_bucket(f"bench-ckpt-{i}") + "/ckpt"
                    times = seconds[where]
                    checkpointer = Checkpointer(fsx.join(root, "sync"), asynchronous=False)
                    began = time.perf_counter()
                    checkpointer.save(1, state)
                    times["save"].append(time.perf_counter() - began)
                    checkpointer.close()

                    checkpointer = Checkpointer(fsx.join(root, "async"), asynchronous=True)
                    began = time.perf_counter()
                    checkpointer.save(1, state)
                    times["save_blocking"].append(time.perf_counter() - began)
                    checkpointer.close()

                    checkpointer = Checkpointer(fsx.join(root, "sync"))
                    began = time.perf_counter()
                    checkpointer.restore(1, state)
                    times["restore"].append(time.perf_counter() - began)
                    checkpointer.close()
                    fs, path = fsx.filesystem(fsx.join(root, "sync", "1"))
                    size = fs.du(path)
                    print(f"repeat {i + 1}/{args.repeat} {where}: save {times['save'][-1]:.2f}s, "
                          f"async save blocks {times['save_blocking'][-1]:.2f}s, restore {times['restore'][-1]:.2f}s",
                          flush=True)
        report = {"model": "llama_nano", "vocab": args.vocab, "checkpoint_mb": round(size / 1e6, 2), "repeats": args.repeat}
        for where, times in seconds.items():
            for what, values in times.items():
                report[f"{where}_{what}_seconds"] = round(statistics.median(values), 3)
        for what in ("save", "restore"):
            report[f"s3_over_local_{what}"] = round(report[f"s3_{what}_seconds"] / report[f"local_{what}_seconds"], 2)
        print(json.dumps(report))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
