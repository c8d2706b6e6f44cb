"""Pieces shared by the decoder-only models: grouped-query attention with RoPE, the SwiGLU MLP,
and the loop over layers (unrolled or scanned, optionally rematerialised)."""

from __future__ import annotations

import dataclasses
import warnings

from typing import Any, Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import Stacked
from haliax.axes import BATCH, EMBED, HEAD_DIM, HEADS, KV_HEADS, MLP, SEQ
from haliax.nn import Linear, apply_rotary, attend, dot_product_attention
from haliax.nn.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from haliax.partitioning import constrain

from levanter.errors import LevanterError


class ConfigError(LevanterError, ValueError):
    """A model configuration that cannot describe a valid model."""


def check_attention_shape(hidden_dim: int, num_heads: int, num_kv_heads: int) -> None:
    if hidden_dim % num_heads:
        raise ConfigError(f"hidden_dim ({hidden_dim}) must be divisible by num_heads ({num_heads}).")
    if num_heads % num_kv_heads:
        raise ConfigError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}).")
    if (hidden_dim // num_heads) % 2:
        raise ConfigError(f"head_dim = hidden_dim / num_heads = {hidden_dim // num_heads} must be even for RoPE.")


# What each layer keeps for the backward pass (``remat`` in the model configs):
# - "none": every intermediate activation; the fastest step and the most memory.
# - "full": only its input [B, T, embed]; the backward pass first reruns the whole layer, about one
#   extra forward pass of compute.
# - "save_matmuls": also the outputs of its projections (matmuls without batch dimensions: q, k, v,
#   o, and the dense MLP's gate, up, down or the MoE router); norms, RoPE, activations, attention
#   (whose scores are the large [B, heads, T, T] part) and the MoE experts' grouped matmuls
#   (ragged_dot) are recomputed. Memory between the two, for much less recompute than "full".
REMAT_POLICIES = ("none", "full", "save_matmuls")


class DecoderShape:
    """What every decoder config (Llama, MoE) derives from its shape fields.

    A mixin rather than a base dataclass so each config keeps its own field order and defaults;
    it expects ``hidden_dim``, ``num_heads``, ``num_kv_heads``, ``num_layers``,
    ``tie_word_embeddings`` and ``attention``.
    """

    def check_shape(self, positive_fields: tuple[str, ...]) -> None:
        for name in positive_fields:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{type(self).__name__}.{name} must be positive, got {getattr(self, name)}.")
        check_attention_shape(self.hidden_dim, self.num_heads, self.num_kv_heads)

    def check_attention(self) -> None:
        """``attention`` names how attention runs: ``"auto"`` (by platform) or one implementation of
        ``haliax.nn.dot_product_attention``; whether it can run here is checked when tracing."""
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(
                f"{type(self).__name__}.attention must be one of {ATTENTION_IMPLEMENTATIONS}, got {self.attention!r}."
            )

    def check_remat(self, gradient_checkpointing: bool | None) -> None:
        """Validate ``remat``; the deprecated ``gradient_checkpointing=True`` means ``remat="full"``."""
        name = type(self).__name__
        if gradient_checkpointing:
            if self.remat not in ("none", "full"):
                raise ConfigError(f"{name} got gradient_checkpointing=True and remat={self.remat!r}; set only remat.")
            warnings.warn(
                f'{name}(gradient_checkpointing=True) is deprecated; write remat="full".', DeprecationWarning, stacklevel=4
            )
            object.__setattr__(self, "remat", "full")
        if not isinstance(self.remat, str) or self.remat not in REMAT_POLICIES:
            choices = ", ".join(repr(p) for p in REMAT_POLICIES)
            raise ConfigError(f"{name}.remat must be one of {choices}; got {self.remat!r}.")

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def attention_parameters(self) -> int:
        """q and o projections (heads) plus k and v projections (kv heads), no biases."""
        return 2 * self.hidden_dim * self.head_dim * (self.num_heads + self.num_kv_heads)

    def embedding_parameters(self, vocab_size: int) -> int:
        """Input embedding and output projection, counted once when tied."""
        return vocab_size * self.hidden_dim * (1 if self.tie_word_embeddings else 2)

    def attention_flops_per_token(self, seq_len: int) -> float:
        """Attention's two T x T products (scores, weighted values), forward + backward, full square."""
        return float(12 * self.num_layers * self.num_heads * self.head_dim * seq_len)


class Attention(eqx.Module):
    """Grouped-query self-attention with rotary positions (no biases, as in Llama)."""

    q_proj: Linear  # embed -> (heads, head_dim)
    k_proj: Linear  # embed -> (kv_heads, head_dim)
    v_proj: Linear  # embed -> (kv_heads, head_dim)
    o_proj: Linear  # (heads, head_dim) -> embed
    implementation: str = eqx.field(static=True, default="auto")  # see haliax.nn.dot_product_attention

    def __init__(
        self, hidden_dim: int, num_heads: int, num_kv_heads: int, *, init_std: float, key: jax.Array, implementation: str = "auto"
    ):
        head_dim = hidden_dim // num_heads
        kq, kk, kv, ko = jax.random.split(key, 4)
        self.q_proj = Linear((hidden_dim,), (num_heads, head_dim), in_axes=(EMBED,), out_axes=(HEADS, HEAD_DIM), key=kq, init_std=init_std)
        self.k_proj = Linear((hidden_dim,), (num_kv_heads, head_dim), in_axes=(EMBED,), out_axes=(KV_HEADS, HEAD_DIM), key=kk, init_std=init_std)
        self.v_proj = Linear((hidden_dim,), (num_kv_heads, head_dim), in_axes=(EMBED,), out_axes=(KV_HEADS, HEAD_DIM), key=kv, init_std=init_std)
        self.o_proj = Linear((num_heads, head_dim), (hidden_dim,), in_axes=(HEADS, HEAD_DIM), out_axes=(EMBED,), key=ko, init_std=init_std)
        self.implementation = implementation

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
        q = apply_rotary(self.q_proj(x), cos, sin)
        k = apply_rotary(self.k_proj(x), cos, sin)
        v = self.v_proj(x)
        q = constrain(q, (BATCH, SEQ, HEADS, HEAD_DIM))
        out = dot_product_attention(q, k, v, segment_ids=segment_ids, implementation=self.implementation)
        return self.o_proj(out)

    def decode(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array, k_cache: jax.Array, v_cache: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Attention for new positions ``start .. start + T`` of ``x`` [B, T, embed] over a KV cache.

        ``k_cache``/``v_cache`` [B, max_len, kv_heads, head_dim] hold keys and values of the earlier
        positions; this call writes the new ones at ``start`` and returns the updated caches. Slots
        past the current position are masked out, so the cache can be preallocated.
        """
        q = apply_rotary(self.q_proj(x), cos, sin)
        k = apply_rotary(self.k_proj(x), cos, sin).astype(k_cache.dtype)
        v = self.v_proj(x).astype(v_cache.dtype)
        k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, start, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, start, 0, 0))
        query_positions = start + jnp.arange(x.shape[1])
        mask = jnp.arange(k_cache.shape[1])[None, :] <= query_positions[:, None]
        out = attend(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), mask[None, None, None])
        return self.o_proj(out), k_cache, v_cache


class SwiGluMlp(eqx.Module):
    """``down(silu(gate(x)) * up(x))``."""

    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear

    def __init__(self, hidden_dim: int, intermediate_dim: int, *, init_std: float, key: jax.Array):
        kg, ku, kd = jax.random.split(key, 3)
        self.gate_proj = Linear((hidden_dim,), (intermediate_dim,), in_axes=(EMBED,), out_axes=(MLP,), key=kg, init_std=init_std)
        self.up_proj = Linear((hidden_dim,), (intermediate_dim,), in_axes=(EMBED,), out_axes=(MLP,), key=ku, init_std=init_std)
        self.down_proj = Linear((intermediate_dim,), (hidden_dim,), in_axes=(MLP,), out_axes=(EMBED,), key=kd, init_std=init_std)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        h = constrain(h, (BATCH, SEQ, MLP))
        return self.down_proj(h)


def build_layers(make_layer: Callable[[jax.Array], Any], num_layers: int, *, use_scan: bool, key: jax.Array):
    """``num_layers`` layers: a tuple, or one ``Stacked`` module when they will be scanned.

    Both forms draw layer ``i`` from the same key, so they hold identical weights.
    """
    keys = jax.random.split(key, num_layers)
    if use_scan:
        return Stacked(eqx.filter_vmap(make_layer)(keys), num_layers)
    return tuple(make_layer(k) for k in keys)


def run_layers(
    layers: Stacked | Sequence[Any],
    x: jax.Array,
    *,
    cos: jax.Array,
    sin: jax.Array,
    segment_ids: jax.Array | None,
    remat: str = "none",
) -> tuple[jax.Array, jax.Array]:
    """Apply every layer in turn; returns the hidden states and the sum of the layers' aux losses.

    Each layer maps ``(x, cos, sin, segment_ids) -> (x, aux)``. ``remat`` (one of
    ``REMAT_POLICIES``) says which of a layer's activations the backward pass recomputes instead of
    storing.
    """

    def apply(layer, x):
        return layer(x, cos, sin, segment_ids)

    if remat != "none":
        # Under scan, XLA cannot merge the recomputation back into the forward pass, so CSE
        # prevention (extra barriers) is needed only for unrolled layers.
        policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable if remat == "save_matmuls" else None
        apply = jax.checkpoint(apply, policy=policy, prevent_cse=not isinstance(layers, Stacked))

    aux_total = jnp.zeros((), jnp.float32)
    if isinstance(layers, Stacked):

        def body(carry, layer):
            x, aux_total = carry
            x, aux = apply(layer, x)
            return (x, aux_total + aux), None

        (x, aux_total), _ = jax.lax.scan(body, (x, aux_total), layers.inner)
        return x, aux_total
    for layer in layers:
        x, aux = apply(layer, x)
        aux_total = aux_total + aux
    return x, aux_total
