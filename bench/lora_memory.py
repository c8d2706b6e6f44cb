"""Training memory of full fine-tuning versus LoRA: parameters plus Adam's state, from the pytrees.

For one Llama size of ``experiments/llama.py`` (default ``llama_150m``, with the vocabulary its name
is counted with), three ways to fine-tune it:

* ``full``: every parameter trains;
* ``lora_r8_qv``: rank-8 adapters on ``q_proj`` and ``v_proj`` (PEFT's default targets for Llama);
* ``lora_r16_all``: rank-16 adapters on all seven projections.

For each: the trainable parameter count, the bytes of all parameters (frozen base included, in
float32 as built), the bytes of the optimizer state (levanter's ``AdamConfig``: two float32
moments per trainable parameter, plus step counters) and of the gradients (one per trainable
parameter). Shapes only (``jax.eval_shape``): nothing is allocated or trained, so it runs in
seconds on a CPU. Activations, which depend on batch and sequence length, are not counted.

``--compiled``: also the XLA memory analysis of the whole compiled train step (arguments, outputs,
temporaries: activations included) for full fine-tuning and for ``lora_r8_qv``, lowered from
abstract shapes (``batch`` x ``seq_len`` tokens; nothing is allocated). ``--run``: a real training
run of ``--run-model`` (default ``llama_30m``) on this machine, both ways, reporting the bytes of
the arrays alive after a step (``jax.live_arrays()``) and the compiled step's analysis.

Usage: ``python bench/lora_memory.py [--model llama_150m] [--compiled] [--run]``. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from experiments.llama import LLAMA_SIZES
from levanter.lora import LoraConfig, apply_lora, count_trainable_parameters, lora_trainable_filter
from levanter.optim.adam import AdamConfig

VARIANTS = {
    "lora_r8_qv": LoraConfig(r=8, alpha=16, target_modules=("q_proj", "v_proj")),
    "lora_r16_all": LoraConfig(r=16, alpha=32, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
}


def is_float_parameter(x) -> bool:
    # eqx.is_inexact_array, for the abstract arrays (ShapeDtypeStruct) eval_shape returns.
    return isinstance(x, jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact)


def nbytes(tree) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(model, trainable) -> dict:
    """Figures for training the parts of ``model`` (abstract) that the filter ``trainable`` selects."""
    params, _ = eqx.partition(model, trainable)
    optimizer = AdamConfig(learning_rate=1e-4).build(num_train_steps=1000)
    state = jax.eval_shape(optimizer.init, params)
    figures = {
        "trainable_parameters": count_trainable_parameters(model, trainable),
        "parameter_bytes": nbytes(eqx.filter(model, is_float_parameter)),
        "optimizer_state_bytes": nbytes(state),
        "gradient_bytes": nbytes(params),
    }
    figures["parameters_plus_optimizer_bytes"] = figures["parameter_bytes"] + figures["optimizer_state_bytes"]
    return figures


def _step_and_state(config, vocab, lora, batch, seq_len):
    """The trainer's train step for full fine-tuning (``lora`` None) or LoRA, and a function building its state."""
    from levanter.trainer import TrainState
    from levanter.trainer.state import FrozenArrays
    from levanter.trainer.step import build_step_functions

    optimizer = AdamConfig(learning_rate=1e-4).build(num_train_steps=1000)

    def state_of(key):
        model = config.build(vocab, key=key)
        if lora is None:
            params, static = eqx.partition(model, eqx.is_inexact_array)
            frozen = None
        else:
            model = apply_lora(model, lora, key=key)
            params, rest = eqx.partition(model, lora_trainable_filter(model))
            frozen_model, static = eqx.partition(rest, eqx.is_inexact_array)
            frozen = FrozenArrays(model=frozen_model)
        state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), key=key, frozen=frozen)
        return state, static

    abstract_state, static = eqx.filter_eval_shape(state_of, jax.random.PRNGKey(0))
    steps = build_step_functions(static_model=static, optimizer=optimizer, lr_schedule=lambda s: 1e-4,
                                 compute_dtype=jnp.float32, num_microbatches=1)
    return steps.train_step, state_of, abstract_state


def _abstract_batch(batch, seq_len):
    from levanter.trainer.step import DeviceBatch

    return DeviceBatch(tokens=jax.ShapeDtypeStruct((batch, seq_len), jnp.int32),
                       loss_mask=jax.ShapeDtypeStruct((batch, seq_len), jnp.float32), segment_ids=None)


def _analysis(compiled) -> dict:
    m = compiled.memory_analysis()
    figures = {name: int(getattr(m, f"{name}_size_in_bytes")) for name in ("argument", "output", "temp", "alias")}
    figures["peak_estimate_bytes"] = figures["argument"] + figures["output"] + figures["temp"] - figures["alias"]
    return figures


def compiled_memory(config, vocab, batch, seq_len) -> dict:
    out = {}
    for name, lora in (("full", None), ("lora_r8_qv", VARIANTS["lora_r8_qv"])):
        step, _, abstract_state = _step_and_state(config, vocab, lora, batch, seq_len)
        out[name] = _analysis(step.lower(abstract_state, _abstract_batch(batch, seq_len)).compile())
    return out


def run_memory(config, vocab, batch, seq_len, steps=3) -> dict:
    """Train for real, both ways, and measure what is alive on the device after the last step."""
    import gc

    import numpy as np

    from levanter.trainer.step import DeviceBatch

    out = {}
    for name, lora in (("full", None), ("lora_r8_qv", VARIANTS["lora_r8_qv"])):
        step, state_of, abstract_state = _step_and_state(config, vocab, lora, batch, seq_len)
        compiled = step.lower(abstract_state, _abstract_batch(batch, seq_len)).compile()
        state, _ = eqx.filter_jit(state_of)(jax.random.PRNGKey(0))
        rng = np.random.default_rng(0)
        losses = []
        for _ in range(steps):
            tokens = jnp.asarray(rng.integers(0, vocab, size=(batch, seq_len)), jnp.int32)
            state, metrics = compiled(state, DeviceBatch(tokens, jnp.ones((batch, seq_len), jnp.float32), None))
            losses.append(float(metrics["loss"]))
        gc.collect()
        out[name] = {"live_array_bytes_after_step": sum(a.nbytes for a in jax.live_arrays()),
                     "train_state_bytes": nbytes(state), "losses": losses, **_analysis(compiled)}
        del state, metrics, tokens
        gc.collect()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama_150m", choices=sorted(LLAMA_SIZES))
    parser.add_argument("--compiled", action="store_true", help="XLA memory analysis of the compiled step (abstract shapes)")
    parser.add_argument("--run", action="store_true", help="train --run-model for real, full and LoRA, and measure")
    parser.add_argument("--run-model", default="llama_30m", choices=sorted(LLAMA_SIZES))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args()
    config, vocab = LLAMA_SIZES[args.model]
    key = jax.random.PRNGKey(0)
    base = eqx.filter_eval_shape(lambda: config.build(vocab, key=key))
    result = {"model": args.model, "vocab_size": vocab, "total_parameters": config.num_parameters(vocab),
              "full": measure(base, is_float_parameter)}
    for name, lora in VARIANTS.items():
        adapted = eqx.filter_eval_shape(lambda lora=lora: apply_lora(config.build(vocab, key=key), lora, key=key))
        result[name] = {"r": lora.r, "target_modules": list(lora.target_modules), **measure(adapted, lora_trainable_filter(adapted))}
        result[name]["vs_full_parameters_plus_optimizer"] = round(
            result[name]["parameters_plus_optimizer_bytes"] / result["full"]["parameters_plus_optimizer_bytes"], 4
        )
    if args.compiled:
        result["compiled_step"] = {"batch": args.batch, "seq_len": args.seq_len,
                                   **compiled_memory(config, vocab, args.batch, args.seq_len)}
    if args.run:
        run_config, run_vocab = LLAMA_SIZES[args.run_model]
        result["run"] = {"model": args.run_model, "vocab_size": run_vocab, "batch": args.batch, "seq_len": args.seq_len,
                         **run_memory(run_config, run_vocab, args.batch, args.seq_len)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
