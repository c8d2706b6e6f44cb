"""Pieces shared by the decoder-only models: grouped-query attention with RoPE, the gated (SwiGLU)
MLP, the loop over layers (unrolled or scanned, optionally rematerialised), and the frame of a
whole model (:class:`DecoderLM`: embedding, layers, final norm, output projection).

Attention and MLP also carry the options other Llama-like families need (biases, a per-head
query/key norm, a head size of its own, a sliding window, a GELU gate); each is off by default,
and off it adds no parameter and no operation.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import warnings

from typing import Any, Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import Stacked
from haliax.axes import BATCH, EMBED, HEAD_DIM, HEADS, KV_HEADS, MLP, SEQ, VOCAB
from haliax.module import NamedModule
from haliax.nn import Embedding, Linear, RMSNorm, apply_rotary, attend, attention_mask, dot_product_attention, rotary_cos_sin
from haliax.nn.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from haliax.nn.attention_kernels import SPLASH_RESIDUALS_NAME
from haliax.partitioning import constrain

from levanter.errors import LevanterError
from levanter.models.lm import LmOutput
from levanter.recorded_fields import fields_to_record


class ConfigError(LevanterError, ValueError):
    """A model configuration that cannot describe a valid model."""


def check_attention_shape(hidden_dim: int, num_heads: int, num_kv_heads: int, head_dim: int | None = None) -> None:
    """``head_dim``: a head size of its own (Gemma, Qwen3); None means ``hidden_dim / num_heads``."""
    if head_dim is None and hidden_dim % num_heads:
        raise ConfigError(f"hidden_dim ({hidden_dim}) must be divisible by num_heads ({num_heads}).")
    if num_heads % num_kv_heads:
        raise ConfigError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}).")
    if head_dim is None and (hidden_dim // num_heads) % 2:
        raise ConfigError(f"head_dim = hidden_dim / num_heads = {hidden_dim // num_heads} must be even for RoPE.")
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2):
        raise ConfigError(f"head_dim_override must be a positive even integer (RoPE rotates pairs), got {head_dim!r}.")


# What each layer keeps for the backward pass (``remat`` in the model configs):
# - "none": every intermediate activation; the fastest step and the most memory.
# - "full": only its input [B, T, embed]; the backward pass first reruns the whole layer, about one
#   extra forward pass of compute.
# - "save_matmuls": also the outputs of its projections (matmuls without batch dimensions: q, k, v,
#   o, and the dense MLP's gate, up, down or the MoE router); norms, RoPE, activations, attention
#   (whose scores are the large [B, heads, T, T] part) and the MoE experts' grouped matmuls
#   (ragged_dot) are recomputed. Memory between the two, for much less recompute than "full".
# - "save_attention": "full", except that the splash kernel's output and softmax statistics (its
#   residuals) are kept, so the backward reruns projections, norms and the MLP but not the attention
#   kernel, the slowest part of a layer to redo on a TPU. Costs one [B, heads, T, head_dim] array
#   per layer beyond "full"; elsewhere (no splash) it is "full".
REMAT_POLICIES = ("none", "full", "save_matmuls", "save_attention")

# The name the splash kernel gives its residuals (haliax.nn.attention_kernels.SPLASH_RESIDUALS_NAME):
# what "save_attention" keeps.
ATTENTION_CHECKPOINT = SPLASH_RESIDUALS_NAME


def remat_policy(remat: str):
    """The ``jax.checkpoint`` policy of a remat setting other than "none" (None: save nothing)."""
    if remat == "save_matmuls":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    if remat == "save_attention":
        return jax.checkpoint_policies.save_only_these_names(ATTENTION_CHECKPOINT)
    return None

# The gate activations of the gated MLP, by the names model configs use. "gelu" is the exact (erf)
# GELU, "gelu_tanh" its tanh approximation (Gemma's; transformers calls it gelu_pytorch_tanh).
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
}

# Where a query/key norm takes its statistics (``qk_norm_scope``): over each head (Qwen3) or over
# the whole projection, every head together (OLMo 2).
QK_NORM_SCOPES = ("head", "projection")

# The attention kinds a layer can have, by the names of transformers' ``layer_types``.
LAYER_TYPES = ("full_attention", "sliding_attention")

class DecoderShape:
    """What every decoder config (Llama, MoE) derives from its shape fields.

    A mixin rather than a base dataclass so each config keeps its own field order and defaults;
    it expects ``hidden_dim``, ``num_heads``, ``num_kv_heads``, ``num_layers``, ``rope_theta``,
    ``tie_word_embeddings`` and ``attention``. A config that allows a head size other than
    ``hidden_dim / num_heads`` or rescaled RoPE declares ``head_dim_override`` / ``rope_scaling``
    as fields; the class attributes below are what configs without them mean.
    """

    head_dim_override: int | None = None
    rope_scaling: Any = None  # a haliax.nn.RopeScaling, or None for plain RoPE
    sliding_rope_theta: float | None = None  # see layer_rope_tables
    final_logit_softcap: float | None = None  # logits become cap * tanh(logits / cap) (Gemma 2)

    def check_shape(self, positive_fields: tuple[str, ...]) -> None:
        for name in positive_fields:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{type(self).__name__}.{name} must be positive, got {getattr(self, name)}.")
        check_attention_shape(self.hidden_dim, self.num_heads, self.num_kv_heads, self.head_dim_override)

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
        return self.head_dim_override or self.hidden_dim // self.num_heads

    def rope_tables(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """RoPE's cos and sin tables for ``positions`` (see ``haliax.nn.rotary_cos_sin``)."""
        return rotary_cos_sin(positions, self.head_dim, self.rope_theta, self.rope_scaling)

    def layer_rope_tables(self, positions: jax.Array) -> list[tuple[jax.Array, jax.Array]] | None:
        """Each layer's RoPE tables where sliding-window layers have a RoPE of their own, else None.

        With ``sliding_rope_theta`` set (Gemma 3), layers with a window (``window_of``) rotate by
        plain RoPE of that base, the others by ``rope_tables`` (``rope_theta``, ``rope_scaling``).
        """
        if self.sliding_rope_theta is None:
            return None
        full = self.rope_tables(positions)
        local = rotary_cos_sin(positions, self.head_dim, self.sliding_rope_theta)
        return [local if self.window_of(i) is not None else full for i in range(self.num_layers)]

    def to_dict(self) -> dict:
        """The fields as plain data; options marked OMIT_WHEN_DEFAULT appear only when set."""
        record = dataclasses.asdict(self)
        kept = {f.name for f in fields_to_record(self)}
        return {name: value for name, value in record.items() if name in kept}

    def attention_parameters(self) -> int:
        """q and o projections (heads) plus k and v projections (kv heads), no biases."""
        return 2 * self.hidden_dim * self.head_dim * (self.num_heads + self.num_kv_heads)

    def embedding_parameters(self, vocab_size: int) -> int:
        """Input embedding and output projection, counted once when tied."""
        return vocab_size * self.hidden_dim * (1 if self.tie_word_embeddings else 2)

    def attention_flops_per_token(self, seq_len: int) -> float:
        """Attention's two T x T products (scores, weighted values), forward + backward, full square."""
        return float(12 * self.num_layers * self.num_heads * self.head_dim * seq_len)


class Bias(NamedModule):
    """A learned offset added to a projection's output (zeros at initialisation)."""

    weight: jax.Array
    axes: tuple[str, ...] = eqx.field(static=True)

    def __init__(self, shape: Sequence[int], axes: Sequence[str], dtype=jnp.float32):
        self.weight = jnp.zeros(tuple(shape), dtype=dtype)
        self.axes = tuple(axes)

    def param_axes(self):
        return {"weight": self.axes}

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.weight.astype(x.dtype)


class HeadNorm(RMSNorm):
    """RMSNorm over each head's vector (Qwen3's query/key norm): its weight is [head_dim]."""

    def param_axes(self):
        return {"weight": (HEAD_DIM,)}


class ProjectionNorm(NamedModule):
    """RMSNorm over a whole query or key projection, every head together (OLMo 2's query/key norm).

    The statistics span ``heads x head_dim`` and the weight is ``[heads, head_dim]``: one scale per
    output unit of the projection, as in a norm applied before the heads are split apart.
    """

    weight: jax.Array
    eps: float = eqx.field(static=True)
    heads_axis: str = eqx.field(static=True)

    def __init__(self, num_heads: int, head_dim: int, *, heads_axis: str, eps: float = 1e-5, dtype=jnp.float32):
        self.weight = jnp.ones((num_heads, head_dim), dtype=dtype)
        self.eps = eps
        self.heads_axis = heads_axis

    def param_axes(self):
        return {"weight": (self.heads_axis, HEAD_DIM)}

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)  # statistics in float32, as RMSNorm's
        variance = jnp.mean(jnp.square(x32), axis=(-2, -1), keepdims=True)
        normed = (x32 * jax.lax.rsqrt(variance + self.eps)).astype(x.dtype)
        return normed * self.weight.astype(x.dtype)


class ScaledEmbedding(Embedding):
    """An embedding whose looked-up vectors are multiplied by ``scale`` (Gemma: sqrt(hidden_dim)).

    Only the lookup is scaled; as a tied output projection (``unembed``) the table is used as is.
    """

    scale: float = eqx.field(static=True)

    def __init__(self, vocab_size: int, embed_dim: int, *, scale: float, key: jax.Array, init_std: float = 0.02):
        super().__init__(vocab_size, embed_dim, key=key, init_std=init_std)
        self.scale = scale

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = super().__call__(tokens)
        # The scale is rounded to the table's dtype first, as the reference implementation does.
        return x * jnp.asarray(self.scale, dtype=x.dtype)


def _offset(bias: Bias | None, x: jax.Array) -> jax.Array:
    return x if bias is None else bias(x)


class Attention(eqx.Module):
    """Grouped-query self-attention with rotary positions.

    Options, all off by default (plain Llama): ``head_dim`` other than ``hidden_dim / num_heads``;
    biases on the q/k/v projections (Qwen2) and on the output projection; ``qk_norm``, an RMSNorm
    of each query and key head before RoPE (Qwen3), or with ``qk_norm_scope="projection"`` of the
    whole query and key projections (OLMo 2); ``sliding_window``, each position attending only to
    itself and the ``sliding_window - 1`` positions before it (Mistral). Without ``cos``/``sin``
    (None) positions are not rotated: a model with learned absolute positions (GPT-2).
    ``logit_softcap`` bounds the scores with ``cap * tanh(scores / cap)`` and ``scale_dim`` divides
    them by ``sqrt(scale_dim)`` instead of ``sqrt(head_dim)`` (Gemma 2's ``attn_logit_softcapping``
    and ``query_pre_attn_scalar``); the scale is applied to the queries, so every attention
    implementation keeps its own ``1 / sqrt(head_dim)``.
    """

    q_proj: Linear  # embed -> (heads, head_dim)
    k_proj: Linear  # embed -> (kv_heads, head_dim)
    v_proj: Linear  # embed -> (kv_heads, head_dim)
    o_proj: Linear  # (heads, head_dim) -> embed
    implementation: str = eqx.field(static=True, default="auto")  # see haliax.nn.dot_product_attention
    q_bias: Bias | None = None
    k_bias: Bias | None = None
    v_bias: Bias | None = None
    o_bias: Bias | None = None
    q_norm: HeadNorm | ProjectionNorm | None = None
    k_norm: HeadNorm | ProjectionNorm | None = None
    sliding_window: int | None = eqx.field(static=True, default=None)
    logit_softcap: float | None = eqx.field(static=True, default=None)
    query_scale: float | None = eqx.field(static=True, default=None)  # sqrt(head_dim / scale_dim); None: 1

    def __init__(
        self, hidden_dim: int, num_heads: int, num_kv_heads: int, *, init_std: float, key: jax.Array, implementation: str = "auto",
        head_dim: int | None = None, qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False, norm_eps: float = 1e-5,
        sliding_window: int | None = None, qk_norm_scope: str = "head", logit_softcap: float | None = None,
        scale_dim: float | None = None,
    ):
        head_dim = head_dim or hidden_dim // num_heads
        kq, kk, kv, ko = jax.random.split(key, 4)
        self.q_proj = Linear((hidden_dim,), (num_heads, head_dim), in_axes=(EMBED,), out_axes=(HEADS, HEAD_DIM), key=kq, init_std=init_std)
        self.k_proj = Linear((hidden_dim,), (num_kv_heads, head_dim), in_axes=(EMBED,), out_axes=(KV_HEADS, HEAD_DIM), key=kk, init_std=init_std)
        self.v_proj = Linear((hidden_dim,), (num_kv_heads, head_dim), in_axes=(EMBED,), out_axes=(KV_HEADS, HEAD_DIM), key=kv, init_std=init_std)
        self.o_proj = Linear((num_heads, head_dim), (hidden_dim,), in_axes=(HEADS, HEAD_DIM), out_axes=(EMBED,), key=ko, init_std=init_std)
        self.implementation = implementation
        # Every field is set, absent options to None: equinox flattens a module by its instance
        # fields, so one that fell back to the class default would give a different tree structure.
        self.q_bias = Bias((num_heads, head_dim), (HEADS, HEAD_DIM)) if qkv_bias else None
        self.k_bias = Bias((num_kv_heads, head_dim), (KV_HEADS, HEAD_DIM)) if qkv_bias else None
        self.v_bias = Bias((num_kv_heads, head_dim), (KV_HEADS, HEAD_DIM)) if qkv_bias else None
        self.o_bias = Bias((hidden_dim,), (EMBED,)) if o_bias else None
        if qk_norm_scope not in QK_NORM_SCOPES:
            raise ConfigError(f"Unknown qk_norm_scope {qk_norm_scope!r}; expected one of {QK_NORM_SCOPES}.")
        if qk_norm and qk_norm_scope == "projection":
            self.q_norm = ProjectionNorm(num_heads, head_dim, heads_axis=HEADS, eps=norm_eps)
            self.k_norm = ProjectionNorm(num_kv_heads, head_dim, heads_axis=KV_HEADS, eps=norm_eps)
        else:
            self.q_norm = HeadNorm(head_dim, eps=norm_eps) if qk_norm else None
            self.k_norm = HeadNorm(head_dim, eps=norm_eps) if qk_norm else None
        self.sliding_window = sliding_window
        self.logit_softcap = logit_softcap
        self.query_scale = None if scale_dim is None else math.sqrt(head_dim / scale_dim)

    def _queries(self, x: jax.Array, cos: jax.Array | None, sin: jax.Array | None) -> jax.Array:
        q = self._rotated(self.q_proj, self.q_bias, self.q_norm, x, cos, sin)
        return q if self.query_scale is None else q * jnp.asarray(self.query_scale, q.dtype)

    def _rotated(self, proj: Linear, bias: Bias | None, norm: HeadNorm | ProjectionNorm | None, x: jax.Array,
                 cos: jax.Array | None, sin: jax.Array | None) -> jax.Array:
        """Queries or keys: projected, offset, normed, then rotated (unless there are no tables)."""
        h = _offset(bias, proj(x))
        h = h if norm is None else norm(h)
        return h if cos is None else apply_rotary(h, cos, sin)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
        q = self._queries(x, cos, sin)
        k = self._rotated(self.k_proj, self.k_bias, self.k_norm, x, cos, sin)
        v = _offset(self.v_bias, self.v_proj(x))
        q = constrain(q, (BATCH, SEQ, HEADS, HEAD_DIM))
        seq_len = x.shape[-2]
        if self.sliding_window is not None and seq_len > self.sliding_window:
            # The fused implementations mask only causally and by document; a window needs the
            # explicit [T, T] mask, so such sequences take the plain (XLA) path.
            mask = attention_mask(seq_len, segment_ids) & _window_mask(jnp.arange(seq_len), seq_len, self.sliding_window)
            out = attend(q, k, v, mask, logit_softcap=self.logit_softcap)
        else:
            out = dot_product_attention(
                q, k, v, segment_ids=segment_ids, implementation=self.implementation, logit_softcap=self.logit_softcap
            )
        return _offset(self.o_bias, self.o_proj(out))

    def decode(
        self, x: jax.Array, cos: jax.Array, sin: jax.Array, k_cache: jax.Array, v_cache: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Attention for new positions ``start .. start + T`` of ``x`` [B, T, embed] over a KV cache.

        ``k_cache``/``v_cache`` [B, max_len, kv_heads, head_dim] hold keys and values of the earlier
        positions; this call writes the new ones at ``start`` and returns the updated caches. Slots
        past the current position are masked out, so the cache can be preallocated.
        """
        q = self._queries(x, cos, sin)
        k = self._rotated(self.k_proj, self.k_bias, self.k_norm, x, cos, sin).astype(k_cache.dtype)
        v = _offset(self.v_bias, self.v_proj(x)).astype(v_cache.dtype)
        k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, start, 0, 0))
        v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, start, 0, 0))
        query_positions = start + jnp.arange(x.shape[1])
        mask = jnp.arange(k_cache.shape[1])[None, :] <= query_positions[:, None]
        if self.sliding_window is not None:
            mask = mask & _window_mask(query_positions, k_cache.shape[1], self.sliding_window)
        out = attend(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), mask[None, None, None], logit_softcap=self.logit_softcap)
        return _offset(self.o_bias, self.o_proj(out)), k_cache, v_cache


def _window_mask(query_positions: jax.Array, num_keys: int, window: int) -> jax.Array:
    """[T, S]: True where key position s is fewer than ``window`` positions before query t."""
    return jnp.arange(num_keys)[None, :] > query_positions[:, None] - window


class GatedMlp(eqx.Module):
    """``down(act(gate(x)) * up(x))``: SwiGLU with ``silu`` (Llama), GeGLU with ``gelu_tanh`` (Gemma).

    ``bias`` adds a learned offset to each of the three projections.
    """

    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear
    activation: str = eqx.field(static=True, default="silu")  # a key of ACTIVATIONS
    gate_bias: Bias | None = None
    up_bias: Bias | None = None
    down_bias: Bias | None = None

    def __init__(self, hidden_dim: int, intermediate_dim: int, *, init_std: float, key: jax.Array, activation: str = "silu",
                 bias: bool = False):
        if activation not in ACTIVATIONS:
            raise ConfigError(f"Unknown MLP activation {activation!r}; expected one of {sorted(ACTIVATIONS)}.")
        kg, ku, kd = jax.random.split(key, 3)
        self.gate_proj = Linear((hidden_dim,), (intermediate_dim,), in_axes=(EMBED,), out_axes=(MLP,), key=kg, init_std=init_std)
        self.up_proj = Linear((hidden_dim,), (intermediate_dim,), in_axes=(EMBED,), out_axes=(MLP,), key=ku, init_std=init_std)
        self.down_proj = Linear((intermediate_dim,), (hidden_dim,), in_axes=(MLP,), out_axes=(EMBED,), key=kd, init_std=init_std)
        self.activation = activation
        self.gate_bias = Bias((intermediate_dim,), (MLP,)) if bias else None  # all set: see Attention.__init__
        self.up_bias = Bias((intermediate_dim,), (MLP,)) if bias else None
        self.down_bias = Bias((hidden_dim,), (EMBED,)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = _offset(self.gate_bias, self.gate_proj(x))
        h = ACTIVATIONS[self.activation](gate) * _offset(self.up_bias, self.up_proj(x))
        h = constrain(h, (BATCH, SEQ, MLP))
        return _offset(self.down_bias, self.down_proj(h))


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
    layer_tables: Sequence[tuple[jax.Array, jax.Array]] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Apply every layer in turn; returns the hidden states and the sum of the layers' aux values.

    Each layer maps ``(x, cos, sin, segment_ids) -> (x, aux)``; ``aux`` is a scalar loss, or any
    pytree of arrays (an MoE layer's routing statistics), summed leaf by leaf. ``remat`` (one of
    ``REMAT_POLICIES``) says which of a layer's activations the backward pass recomputes instead of
    storing. ``layer_tables``: each unrolled layer's own ``(cos, sin)`` in place of ``cos``/``sin``,
    where RoPE differs between layers (``DecoderShape.layer_rope_tables``).
    """

    def apply(layer, x, tables=(cos, sin)):
        return layer(x, *tables, segment_ids)

    if remat != "none":
        # Under scan, XLA cannot merge the recomputation back into the forward pass, so CSE
        # prevention (extra barriers) is needed only for unrolled layers.
        apply = jax.checkpoint(apply, policy=remat_policy(remat), prevent_cse=not isinstance(layers, Stacked))

    if isinstance(layers, Stacked):

        def body(carry, layer):
            x, aux_total = carry
            x, aux = apply(layer, x)
            return (x, jax.tree.map(jnp.add, aux_total, aux)), None

        # The carry needs the aux's structure up front: one layer's, traced without running it.
        aux_shape = jax.eval_shape(apply, jax.tree.map(lambda w: w[0], layers.inner), x)[1]
        aux_total = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), aux_shape)
        (x, aux_total), _ = jax.lax.scan(body, (x, aux_total), layers.inner)
        return x, aux_total
    aux_total = None
    for layer, tables in zip(layers, layer_tables or [(cos, sin)] * len(layers), strict=True):
        x, aux = apply(layer, x, tables)
        aux_total = aux if aux_total is None else jax.tree.map(jnp.add, aux_total, aux)
    return x, aux_total


class DecoderLM(eqx.Module):
    """Tokens -> embedding -> layers -> final norm -> output projection: the frame of every
    decoder-only model here, built the same way for each.

    A family declares the fields ``config``, ``embed``, ``layers``, ``final_norm`` and ``lm_head``
    itself, with any of its own, in the order its checkpoints keep (declared here, they would come
    first in every family's tree), builds them with :meth:`_build` and says how its trunk runs
    (``hidden_states``, ``forward``). The output projection is the family's own matrix, or the
    embedding table transposed when they are tied.
    """

    def _build(
        self,
        config: Any,
        vocab_size: int,
        *,
        keys: Sequence[jax.Array],
        make_layers: Callable[..., Any],
        final_norm: eqx.Module,
        embedding: Callable[..., Embedding] = Embedding,
    ) -> None:
        """Set the fields every family has. ``keys``: one each for the embedding, the layers
        (``make_layers(key=...)``) and the output projection; every weight is drawn with the
        config's ``initializer_range``."""
        if vocab_size <= 0:
            raise ConfigError(f"vocab_size must be positive, got {vocab_size}.")
        k_embed, k_layers, k_head = keys
        std = config.initializer_range
        self.config = config
        self.embed = embedding(vocab_size, config.hidden_dim, key=k_embed, init_std=std)
        self.layers = make_layers(key=k_layers)
        self.final_norm = final_norm
        self.lm_head = None if config.tie_word_embeddings else Linear(
            (config.hidden_dim,), (vocab_size,), in_axes=(EMBED,), out_axes=(VOCAB,), key=k_head, init_std=std
        )

    @abc.abstractmethod
    def hidden_states(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """The final-normed hidden states [B, T, embed] and the aux loss, before the output projection."""

    @abc.abstractmethod
    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput:
        """Logits [B, T, vocab], the aux loss and the family's own metrics."""

    @property
    def vocab_size(self) -> int:
        return self.embed.vocab_size

    def unembedding(self) -> jax.Array:
        """The output projection as an [embed, vocab] matrix (the embedding table transposed if tied)."""
        return self.embed.weight.T if self.lm_head is None else self.lm_head.weight

    def _logits(self, x: jax.Array) -> jax.Array:
        """Final hidden states [B, T, embed] -> logits [B, T, vocab], before any soft cap."""
        return self.embed.unembed(x) if self.lm_head is None else self.lm_head(x)

    def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> jax.Array:
        return self.forward(tokens, segment_ids=segment_ids).logits
