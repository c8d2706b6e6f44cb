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

Usage: ``python bench/lora_memory.py [--model llama_150m]``. Prints one JSON object.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama_150m", choices=sorted(LLAMA_SIZES))
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
    print(json.dumps(result))


if __name__ == "__main__":
    main()
