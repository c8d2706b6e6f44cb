"""Optimizer-state bytes of the element-wise optimizers against AdamW's, for the tutorial's model.

Shapes only (``jax.eval_shape``): nothing is allocated, so it runs anywhere in a few seconds.
``python bench/optimizer_state_memory.py [vocab_size]`` (default: the offline tutorial tokenizer's).
"""

from __future__ import annotations

import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from experiments.llama import llama_nano
from experiments.marin_tokenizer import OFFLINE_TRAINED_VOCAB_SIZE
from haliax.module import logical_axes
from levanter.optim import (
    AdamConfig,
    AdamMiniConfig,
    AdoptConfig,
    LionConfig,
    MarsConfig,
    ScheduleFreeAdamConfig,
    SophiaConfig,
    weight_decay_mask_from_axes,
)

CONFIGS = {
    "AdamW": AdamConfig(6e-4, 0.1),
    "AdamW, cautious": AdamConfig(6e-4, 0.1, cautious=True),
    "Lion, cautious": LionConfig(2e-4, 1.0, cautious=True),
    "ADOPT": AdoptConfig(6e-4, 0.1),
    "MARS": MarsConfig(6e-4, 0.1),
    "Adam-mini": AdamMiniConfig(6e-4, 0.1),
    "Sophia-H": SophiaConfig(6e-4, 0.1),
    "schedule-free AdamW": ScheduleFreeAdamConfig(6e-4, 0.1),
}


def state_bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "shape"))


def main(vocab_size: int) -> None:
    floating = lambda x: isinstance(x, jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact)  # noqa: E731
    params = eqx.filter(eqx.filter_eval_shape(lambda k: llama_nano.build(vocab_size, key=k), jax.random.PRNGKey(0)),
                        floating)
    axes = logical_axes(params)
    mask = weight_decay_mask_from_axes(axes, params)
    print(f"llama_nano, vocabulary {vocab_size:,}: parameters {state_bytes(params) / 2**20:.2f} MiB (f32)")
    adam = None
    for name, config in CONFIGS.items():
        tx = config.build(100, weight_decay_mask=mask, param_axes=axes)
        size = state_bytes(jax.eval_shape(tx.init, params))
        adam = adam or size
        print(f"  {name:22s} optimizer state {size / 2**20:7.2f} MiB  {size / adam:5.2f}x AdamW")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else OFFLINE_TRAINED_VOCAB_SIZE)
