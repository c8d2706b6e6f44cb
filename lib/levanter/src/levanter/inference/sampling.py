"""Autoregressive sampling with a key/value cache.

The prompt is run once (prefill) to fill a preallocated cache; each new token then costs one
position's worth of compute, attending over the cached keys and values. The whole generation is
one jitted ``while_loop`` that stops early once every row has produced ``eos_id``.

Each chosen token's logits are checked to be finite: over NaNs, ``argmax`` and ``categorical``
both pick token 0, which is often the EOS id, so a broken model would otherwise look like one that
chose to say nothing. A row whose logits go non-finite stops there, and :func:`sample` raises.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from haliax import Stacked

from levanter.errors import LevanterError
from levanter.models.lm import final_logit_softcap, soft_cap


class SamplingError(LevanterError, ValueError):
    """Sampling arguments that cannot work with this model or prompt."""


class NonFiniteLogitsError(LevanterError, FloatingPointError):
    """The model produced NaN or infinite logits: its weights (or their dtype) are broken."""


class KvCache(NamedTuple):
    keys: jax.Array  # [layers, batch, max_len, kv_heads, head_dim]
    values: jax.Array


def init_cache(model: Any, batch_size: int, max_len: int, dtype: Any = None) -> KvCache:
    """An empty cache for ``max_len`` positions, in the model's compute dtype by default."""
    config = model.config
    dtype = dtype or model.embed.weight.dtype
    shape = (config.num_layers, batch_size, max_len, config.num_kv_heads, config.head_dim)
    return KvCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def decode(model: Any, tokens: jax.Array, cache: KvCache, start: jax.Array | int) -> tuple[jax.Array, KvCache]:
    """Logits [B, T, vocab] for ``tokens`` [B, T] at positions ``start .. start + T``, and the
    cache with their keys and values added. Works for every model built from the shared decoder
    layers (Llama, MoE, GPT-2)."""
    config = model.config
    start = jnp.asarray(start, jnp.int32)
    x = model.embed(tokens)
    positions = start + jnp.arange(tokens.shape[1])
    if getattr(model, "position_embed", None) is not None:  # learned absolute positions (GPT-2)
        x = x + model.position_embed(positions)
    cos, sin = config.rope_tables(positions)
    layer_tables = config.layer_rope_tables(positions)
    if layer_tables is not None and isinstance(model.layers, Stacked):  # stacked layers are all of one kind
        (cos, sin), layer_tables = layer_tables[0], None

    if isinstance(model.layers, Stacked):

        def body(x, layer_and_cache):
            layer, k, v = layer_and_cache
            x, k, v = layer.decode(x, cos, sin, k, v, start)
            return x, (k, v)

        x, (keys, values) = jax.lax.scan(body, x, (model.layers.inner, cache.keys, cache.values))
    else:
        new_keys, new_values = [], []
        for i, layer in enumerate(model.layers):
            layer_cos, layer_sin = (cos, sin) if layer_tables is None else layer_tables[i]
            x, k, v = layer.decode(x, layer_cos, layer_sin, cache.keys[i], cache.values[i], start)
            new_keys.append(k)
            new_values.append(v)
        keys, values = jnp.stack(new_keys), jnp.stack(new_values)
    x = model.final_norm(x)
    logits = jnp.einsum("bte,ev->btv", x, model.unembedding().astype(x.dtype))
    return soft_cap(logits, final_logit_softcap(model)), KvCache(keys, values)


def _choose(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array, *, greedy: bool, top_k: int | None, use_top_p: bool) -> jax.Array:
    """One token id per row of ``logits`` [B, V]."""
    logits = logits.astype(jnp.float32)
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_k is not None:
        kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
    if use_top_p:
        # Nucleus: keep the most likely tokens until their probability mass reaches top_p (the
        # token that crosses it included, so at least one survives).
        descending = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(descending, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        kept = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)
        threshold = jnp.take_along_axis(descending, kept - 1, axis=-1)
        logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("max_new_tokens", "eos_id", "greedy", "top_k", "use_top_p"))
def _generate(model, prompt, key, temperature, top_p, *, max_new_tokens, eos_id, greedy, top_k, use_top_p):
    batch, prompt_len = prompt.shape
    choose = functools.partial(_choose, greedy=greedy, top_k=top_k, use_top_p=use_top_p, temperature=temperature, top_p=top_p)
    pad = 0 if eos_id is None else eos_id

    cache = init_cache(model, batch, prompt_len + max_new_tokens)
    logits, cache = decode(model, prompt, cache, 0)
    key, sub = jax.random.split(key)
    token = choose(logits[:, -1], sub)
    broken = ~jnp.all(jnp.isfinite(logits[:, -1]), axis=-1)
    out = jnp.full((batch, max_new_tokens), pad, jnp.int32).at[:, 0].set(token)
    done = broken | (token == eos_id) if eos_id is not None else broken

    def unfinished(state):
        i, _, _, _, done, _, _ = state
        return (i < max_new_tokens) & ~jnp.all(done)

    def step(state):
        i, out, cache, token, done, broken, key = state
        logits, cache = decode(model, token[:, None], cache, prompt_len + i - 1)
        key, sub = jax.random.split(key)
        token = jnp.where(done, pad, choose(logits[:, 0], sub))
        out = jax.lax.dynamic_update_slice(out, token[:, None], (0, i))
        broken = broken | (~done & ~jnp.all(jnp.isfinite(logits[:, 0]), axis=-1))
        done = done | broken
        if eos_id is not None:
            done = done | (token == eos_id)
        return i + 1, out, cache, token, done, broken, key

    state = (jnp.asarray(1, jnp.int32), out, cache, token, done, broken, key)
    _, out, _, _, _, broken, _ = jax.lax.while_loop(unfinished, step, state)
    return jnp.concatenate([prompt, out], axis=1), broken


def sample(
    model: Any,
    prompt_ids: Any,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    key: jax.Array | None = None,
) -> jax.Array:
    """Continue ``prompt_ids`` ([T] or [B, T], equal-length rows) by up to ``max_new_tokens`` tokens.

    Returns the prompt followed by the new tokens, with the same rank as ``prompt_ids`` and
    ``max_new_tokens`` more columns; after a row emits ``eos_id`` its remaining slots hold
    ``eos_id``. ``temperature=0`` is greedy decoding; ``top_k`` keeps the k most likely tokens;
    ``top_p`` keeps the smallest set whose probability reaches ``top_p``. Raises
    :class:`NonFiniteLogitsError` if the model's logits for a token it was choosing were NaN or
    infinite (so this call waits for the result).
    """
    prompt = jnp.asarray(prompt_ids, jnp.int32)
    single = prompt.ndim == 1
    prompt = prompt[None] if single else prompt
    if prompt.ndim != 2 or prompt.shape[1] == 0:
        raise SamplingError(f"prompt_ids must be a non-empty [T] or [B, T] array, got shape {prompt.shape}.")
    if max_new_tokens < 1:
        raise SamplingError(f"max_new_tokens must be at least 1, got {max_new_tokens}.")
    total = prompt.shape[1] + max_new_tokens
    if total > model.config.max_seq_len:
        raise SamplingError(f"Prompt ({prompt.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds max_seq_len {model.config.max_seq_len}.")
    if temperature < 0 or math.isnan(temperature):
        raise SamplingError(f"temperature must be >= 0, got {temperature}.")
    if top_k is not None and not 1 <= top_k <= model.vocab_size:
        raise SamplingError(f"top_k must be between 1 and the vocabulary size {model.vocab_size}, got {top_k}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise SamplingError(f"top_p must be in (0, 1], got {top_p}.")
    greedy = temperature == 0
    if not greedy and key is None:
        raise SamplingError("Sampling with temperature > 0 needs a PRNG key (key=jax.random.PRNGKey(...)).")
    out, broken = _generate(
        model, prompt, key if key is not None else jax.random.PRNGKey(0),
        jnp.asarray(max(temperature, 1e-6), jnp.float32), jnp.asarray(top_p or 1.0, jnp.float32),
        max_new_tokens=max_new_tokens, eos_id=eos_id, greedy=greedy, top_k=top_k, use_top_p=top_p is not None,
    )
    broken_rows = [int(row) for row in jnp.flatnonzero(broken)]
    if broken_rows:
        rows = "the prompt" if single else "prompt row(s) " + ", ".join(map(str, broken_rows))
        raise NonFiniteLogitsError(
            f"The model produced NaN or infinite logits while continuing {rows}: its weights are broken "
            "(or overflow in their dtype). Check the checkpoint it was loaded from; the text it would give is meaningless."
        )
    return out[0] if single else out
