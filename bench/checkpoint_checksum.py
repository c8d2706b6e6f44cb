"""What checkpoint checksums cost: save and restore with and without the manifest, side by side.

The whole train state (parameters and Adam moments, float32, filled with random values, as after
some training: fresh zeros would compress to nothing) of each model is saved by
:class:`levanter.trainer.Checkpointer` into a fresh local folder, with ``checksums=True`` (the
default: the manifest is written once Orbax has committed the step, see
``levanter.trainer.checkpoint_manifest``) and ``checksums=False``; then a fresh checkpointer of
the same kind restores it (verifying the files first, or not). The two kinds alternate
``--repeat`` times; medians are reported.

Times: ``save``: a synchronous save until committed (with the manifest written, when on);
``save_blocking``: how long an asynchronous save holds up training (the manifest is written in
the background); ``restore``: a fresh checkpointer's restore. On a busy machine the end-to-end
differences drown in the noise of the writes themselves, so the checksum work is also timed alone
on the saved folder: ``manifest_write`` (hash every file, write the manifest) and
``manifest_verify`` (what a restore adds: list the folder, check it against the manifest in both
directions, hash every file), each with its hashing rate. Models: the nano Llama of the
tutorial (vocabulary 4,096) and ``llama_150m`` (vocabulary 128,256) from ``experiments/llama.py``.

Usage: ``python bench/checkpoint_checksum.py [--models nano,llama_150m] [--repeat 3]``. The last
line is one JSON object.
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

MODELS = {"nano": ("llama_nano", 4096), "llama_150m": ("llama_150m", 128_256)}
KINDS = ("checksums", "none")


def _random_state(config, vocab: int, scratch: str):
    import jax

    from levanter.optim import AdamConfig
    from levanter.trainer import Trainer, TrainerConfig

    trainer = Trainer(TrainerConfig(num_train_steps=1, batch_size=jax.device_count()), AdamConfig(learning_rate=1e-3),
                      output_dir=os.path.join(scratch, "init"))
    state, _, _ = trainer.init_state(lambda key: config.build(vocab, key=key))
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    return jax.tree.unflatten(treedef, [
        leaf + jax.random.normal(key, leaf.shape, leaf.dtype) if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating) else leaf
        for leaf, key in zip(leaves, keys)
    ])


def _measure(state, root: str, checksums: bool) -> dict[str, float]:
    from levanter.trainer import Checkpointer
    from levanter.trainer.checkpoint_manifest import verify_manifest, write_manifest
    from levanter.trainer.checkpoint_staging import COMMIT_MARKER

    times = {}
    checkpointer = Checkpointer(os.path.join(root, "sync"), asynchronous=False, checksums=checksums)
    began = time.perf_counter()
    checkpointer.save(1, state)
    times["save"] = time.perf_counter() - began
    checkpointer.close()

    checkpointer = Checkpointer(os.path.join(root, "async"), asynchronous=True, checksums=checksums)
    began = time.perf_counter()
    checkpointer.save(1, state)
    times["save_blocking"] = time.perf_counter() - began
    checkpointer.close()

    checkpointer = Checkpointer(os.path.join(root, "sync"), checksums=checksums)
    began = time.perf_counter()
    step, _ = checkpointer.restore_latest(state)
    times["restore"] = time.perf_counter() - began
    assert step == 1
    checkpointer.close()

    if checksums:
        step_folder = os.path.join(root, "sync", "1")
        began = time.perf_counter()
        write_manifest(step_folder, exclude=(COMMIT_MARKER,))
        times["manifest_write"] = time.perf_counter() - began
        began = time.perf_counter()
        assert not verify_manifest(step_folder, exclude=(COMMIT_MARKER,)).problems
        times["manifest_verify"] = time.perf_counter() - began
    return times


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="nano,llama_150m")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every phase of every save

    import experiments.llama as sizes

    results = {}
    for model in args.models.split(","):
        attribute, vocab = MODELS[model]
        scratch = tempfile.mkdtemp(prefix="checkpoint-checksum-")
        try:
            state = _random_state(getattr(sizes, attribute), vocab, scratch)
            seconds = {kind: {"save": [], "save_blocking": [], "restore": []} for kind in KINDS}
            seconds["checksums"].update(manifest_write=[], manifest_verify=[])
            size = 0
            for i in range(args.repeat):
                for kind in KINDS:
                    root = os.path.join(scratch, f"{kind}-{i}")
                    for name, value in _measure(state, root, checksums=kind == "checksums").items():
                        seconds[kind][name].append(value)
                    size = _folder_bytes(os.path.join(root, "sync", "1"))
                    shutil.rmtree(root)
            medians = {kind: {name: statistics.median(v) for name, v in times.items()} for kind, times in seconds.items()}
            for kind in KINDS:
                medians[kind]["save+restore"] = medians[kind]["save"] + medians[kind]["restore"]
            results[model] = {"checkpoint_mb": round(size / 1e6, 1), **{k: {n: round(v, 3) for n, v in m.items()} for k, m in medians.items()}}
            print(f"\n{model}: checkpoint {size / 1e6:.1f} MB, medians of {args.repeat}")
            print(f"{'':16}{'checksums':>12}{'none':>12}{'added':>12}")
            for name in ("save", "save_blocking", "restore", "save+restore"):
                on, off = medians["checksums"][name], medians["none"][name]
                print(f"{name:16}{on:>11.3f}s{off:>11.3f}s{on - off:>+11.3f}s")
            for name in ("manifest_write", "manifest_verify"):
                alone = medians["checksums"][name]
                print(f"{name:16}{alone:>11.3f}s{'':>12}  ({size / 1e6 / max(alone, 1e-9):.0f} MB/s)")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
