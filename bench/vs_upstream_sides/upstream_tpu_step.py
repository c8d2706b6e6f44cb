"""Upstream's side of the accelerator bench: its Llama trained by its own ``Trainer`` at its accelerator defaults.

Runs in an interpreter whose path holds upstream's packages only (never this repository's
``lib/*/src``) and refuses to run when ``levanter`` is not the one of the ``marin-levanter``
distribution. Upstream's defaults are kept where they decide the speed: scanned layers with per-layer
recompute, the attention it picks for the device (splash on a TPU), f32 parameters with bf16 compute
(``mp="p=f32,c=bfloat16"``, as upstream's TPU configurations set it). AdamW with global-norm
clipping at 1.0 and a constant learning rate. Its diagnostics that ours does not run are off: the
tracker (a no-op one), the parameter and gradient watch (it would compile a second step and run it every
tenth step), the jaxpr and HLO logging of the first step, checkpoints and ``jax.distributed``.

The batch is the one ``bench/tpu_step.py`` trains on, made by the same generator: seeded random tokens,
documents of random lengths packed end to end with segment ids, so attention is masked per document
(upstream's ``LmExample.causal(segment_ids=...)``); every step trains on it. Each step is timed around
the trainer's loop (``upstream_loop.py``), not in a hook.

Prints one JSON line: parameters, tokens/s and ms per step over the timed steps (each step's ms too),
initialisation seconds, compilation plus first step seconds, device kind, the runtime's
``peak_bytes_in_use``, and XLA's memory analysis of the step upstream compiled: after the timed steps
the trainer's jitted step (``Trainer._jit_train_step_fn_no_hook``, private) is lowered again for the
state and batch it ran on, which JAX's in-memory cache answers with the executable that ran.

``--count-parameters SHAPES`` prints only each shape's parameter count, from shapes alone (nothing is
allocated), so a caller can refuse unequal work before training.
"""

import argparse
import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # upstream_loop, also when run with python -I
from upstream_loop import steady_tokens_per_second, timed_steps  # noqa: E402

SHAPE_FIELDS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "seq_len")
# Printed with their versions, so a run shows which of them it imported (upstream pins some below ours).
PACKAGES = ("marin-haliax", "jax", "jaxlib", "libtpu", "equinox", "optax", "transformers", "tensorstore")


def check_upstream() -> str:
    """Upstream's levanter version; exits when the ``levanter`` imported is not upstream's distribution."""
    import levanter

    try:
        dist = importlib.metadata.distribution("marin-levanter")
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"levanter at {levanter.__file__} is not upstream's: no marin-levanter on the path")
    expected = Path(dist.locate_file("levanter/__init__.py")).resolve()
    if Path(levanter.__file__).resolve() != expected:
        raise SystemExit(f"levanter imported from {levanter.__file__}, not upstream's marin-levanter at {expected}: "
                         "put upstream's folder on this process's path, and no other levanter")
    return dist.version


def installed(names) -> dict:
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def llama_config(shape: dict, settings: list[str]):
    from levanter.models.llama import LlamaConfig

    config = LlamaConfig(max_seq_len=shape["seq_len"], hidden_dim=shape["hidden"],
                         intermediate_dim=shape["intermediate"], num_layers=shape["layers"], num_heads=shape["heads"],
                         num_kv_heads=shape["kv_heads"], tie_word_embeddings=shape.get("tied", False))
    changes = {}
    for item in settings:
        name, _, value = item.partition("=")
        changes[name] = json.loads(value)
    return dataclasses.replace(config, **changes)


def float_parameters(model) -> int:
    """Floating-point leaves' sizes summed: arrays or, from ``eval_shape``, their shapes."""
    import jax
    import jax.numpy as jnp

    return int(sum(leaf.size for leaf in jax.tree.leaves(model) if jnp.issubdtype(leaf.dtype, jnp.inexact)))


def count_parameters(shape: dict) -> int:
    """Parameters of upstream's Llama of ``shape``, from shapes only."""
    import equinox as eqx
    import haliax as hax
    import jax

    config = llama_config(shape, [])
    vocab = hax.Axis("vocab", shape["vocab"])
    return float_parameters(eqx.filter_eval_shape(lambda: config.build(vocab, key=jax.random.PRNGKey(0))))


def random_batch(rows: int, seq_len: int, vocab: int, doc_len: tuple[int, int], seed: int = 0):
    """Tokens and segment ids drawn exactly as ``bench/tpu_step.py``'s ``random_batch`` draws them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(rows, seq_len), dtype=np.int32)
    segments = np.zeros((rows, seq_len), np.int32)
    for row in range(rows):
        position, segment = 0, 0
        while position < seq_len:
            length = int(rng.integers(doc_len[0], doc_len[1] + 1))
            segments[row, position:position + length] = segment
            position, segment = position + length, segment + 1
    return tokens, segments


def packed_examples(args, Pos) -> list:
    """The batch's rows as upstream's examples: causal attention masked per document by segment ids."""
    import haliax as hax
    from levanter.models.lm_model import LmExample

    tokens, segments = random_batch(args.batch, args.seq_len, args.vocab, tuple(args.doc_len))
    return [LmExample.causal(hax.named(tokens[row], Pos), segment_ids=hax.named(segments[row], Pos))
            for row in range(args.batch)]


def trainer_config(args, total: int, scratch: str):
    """Upstream's trainer at its defaults, but for bf16 compute and without the diagnostics ours does not run."""
    import jmp
    from levanter.callbacks.watch import WatchConfig
    from levanter.checkpoint import CheckpointerConfig
    from levanter.distributed import DistributedConfig
    from levanter.tracker import NoopConfig
    from levanter.trainer import TrainerConfig

    return TrainerConfig(
        num_train_steps=total, train_batch_size=args.batch, mp=jmp.get_policy("p=f32,c=bfloat16"),
        tracker=NoopConfig(), id="bench", log_dir=Path(scratch) / "logs", require_accelerator=False,
        watch=WatchConfig(watch_targets=[]), log_jaxprs=False, log_xla_hlo=False,
        distributed=DistributedConfig(initialize_jax_distributed=False),
        checkpointer=CheckpointerConfig(base_path=f"{scratch}/checkpoints", save_interval=None, keep=None))


def step_memory(trainer, state, batch) -> tuple[dict | None, str | None]:
    """XLA's memory analysis of the step the trainer ran (its jitted step lowered again, for the same
    arguments: a hit in JAX's compilation cache, not a second compile), in GiB; or why there is none."""
    try:
        stats = trainer._jit_train_step_fn_no_hook.lower(state, (batch,), {}).compile().memory_analysis()
    except Exception as error:  # a missing analysis is reported, not fatal: the timing stands
        return None, f"{type(error).__name__}: {error}"[:300]
    found = {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
             "aliased": stats.alias_size_in_bytes, "temporaries": stats.temp_size_in_bytes,
             "generated_code": stats.generated_code_size_in_bytes}
    found["total"] = found["arguments"] + found["outputs"] - found["aliased"] + found["temporaries"] \
        + found["generated_code"]
    return {key: round(int(value) / 2**30, 3) for key, value in found.items()}, None


def train(args) -> dict:
    import haliax as hax
    import jax
    from levanter.data.dataset import ListAsyncDataset
    from levanter.layers.attention import default_attention_type
    from levanter.optim.config import AdamConfig
    from levanter.trainer import Trainer, initialize

    version = check_upstream()
    total = args.warmup_steps + args.steps
    model_config = llama_config({field: getattr(args, field) for field in SHAPE_FIELDS} | {"tied": args.tied}, args.set)
    config = trainer_config(args, total, tempfile.mkdtemp(prefix="upstream-tpu-step-"))
    initialize(config)
    optimizer = AdamConfig(learning_rate=3e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, epsilon=1e-8,
                           max_grad_norm=1.0, lr_schedule="constant", warmup=0.0).build(total)
    rows = packed_examples(args, model_config.max_Pos.resize(args.seq_len))
    vocab = hax.Axis("vocab", args.vocab)

    def loss_function(model, example, *, key=None):
        return model.compute_next_token_loss(example, key=key)

    last_batch = []

    def remembering(loader):  # the step is lowered again for this batch, for its memory analysis
        for batch in loader:
            last_batch[:] = [batch]
            yield batch

    with Trainer(config, optimizer, loss_function) as trainer:
        if trainer.hooks.jit_hooks:
            raise SystemExit(f"upstream's trainer has hooks inside its step ({trainer.hooks.jit_hooks}): the step "
                             "timed would not be the one analysed")
        started = time.perf_counter()
        model_key, training_key = jax.random.split(jax.random.PRNGKey(0))
        state = trainer.initial_state(training_key, model_init=lambda: model_config.build(vocab, key=model_key))
        jax.block_until_ready(state)
        init_seconds = time.perf_counter() - started
        loader = remembering(trainer.data_loader(ListAsyncDataset(rows * total)).iter_from_step(0))
        marks, info = timed_steps(trainer.training_steps(state, loader), total)
        analysed = time.perf_counter()
        memory, memory_note = step_memory(trainer, info.state, last_batch[0]) if args.memory_analysis \
            else (None, "not asked for (--no-memory-analysis)")
        analysis_seconds = time.perf_counter() - analysed
    timed = marks[args.warmup_steps:]
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "side": "upstream", "version": version, "jax": jax.__version__, "packages": installed(PACKAGES),
        "parameters": float_parameters(info.state.model), "batch": args.batch, "seq_len": args.seq_len,
        "warmup_steps": args.warmup_steps, "steps": args.steps, "loss": round(float(info.loss), 4),
        "tokens_per_s": round(steady_tokens_per_second(marks, args.warmup_steps, args.batch * args.seq_len), 1),
        "step_ms": round(1000 * (timed[-1] - timed[0]) / args.steps, 2),
        "step_ms_each": [round(1000 * (after - before), 2) for before, after in zip(timed, timed[1:])],
        "init_s": round(init_seconds, 2), "compile_and_first_step_s": round(marks[1] - marks[0], 2),
        "device_kind": jax.devices()[0].device_kind,
        "attention": str((model_config.attn_backend or default_attention_type()).value),
        "scan_layers": model_config.scan_layers, "gradient_checkpointing": str(model_config.gradient_checkpointing),
        "mp": "p=f32,c=bfloat16", "segment_ids": True,
        "peak_bytes_in_use_gib": round(stats["peak_bytes_in_use"] / 2**30, 3) if "peak_bytes_in_use" in stats else None,
        "memory_gib": memory, "memory_analysis_s": round(analysis_seconds, 2),
        **({"memory_note": memory_note} if memory_note else {}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("layers", "hidden", "intermediate", "heads", "kv-heads", "vocab", "seq-len", "batch"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--tied", action="store_true", help="tie the input and output embeddings (default: untied)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--doc-len", type=int, nargs=2, default=(100, 600), metavar=("MIN", "MAX"))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field of upstream's LlamaConfig (JSON value), e.g. --set scan_layers=false")
    parser.add_argument("--memory-analysis", action=argparse.BooleanOptionalAction, default=True,
                        help="lower the trainer's step again after the timed steps for XLA's memory analysis")
    parser.add_argument("--count-parameters", metavar="SHAPES",
                        help="a JSON list of shapes (objects with the keys " + ", ".join(SHAPE_FIELDS) +
                             "): print their parameter counts and train nothing")
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    if args.count_parameters:
        check_upstream()
        print(json.dumps({"parameters": [count_parameters(shape) for shape in json.loads(args.count_parameters)]}))
        return 0
    missing = [f"--{name.replace('_', '-')}" for name in (*SHAPE_FIELDS, "batch") if getattr(args, name) is None]
    if missing:
        parser.error(f"the shape needs {', '.join(missing)}")
    print(json.dumps(train(args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
