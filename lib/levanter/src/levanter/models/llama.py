"""The Llama decoder: RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, tied or untied
embeddings. Weight layout matches Hugging Face ``LlamaForCausalLM`` up to transposition.

The same decoder, with options each off by default, is also Llama 3.1's (rescaled RoPE),
Mistral's (sliding-window attention), Qwen2's (q/k/v biases), Qwen3's (per-head query/key norm,
a head size of its own), Gemma's (embeddings scaled by sqrt(hidden_dim), GELU-gated MLP) and
OLMo 2's and 3's (norms on each sublayer's output instead of its input, a query/key norm over the
whole projection, and in OLMo 3 sliding-window attention in some layers only).

Norm placement and a per-layer attention pattern are fields here rather than a block of their own:
each changes where two existing pieces (RMSNorm, the window mask) are applied, not what the layer
is made of, so the same layer, its cached decoding and the checkpoint conversion carry over.
"""

from __future__ import annotations

import functools
import math
from dataclasses import InitVar, dataclass, field

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import Stacked
from haliax.axes import BATCH, EMBED, SEQ, VOCAB
from haliax.nn import Embedding, Linear, RMSNorm, RopeScaling
from haliax.partitioning import constrain
from haliax.nn.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from haliax.nn.attention import NO_SOFTCAP
from levanter.models.lm import LmOutput, soft_cap
from levanter.models.transformer import (
    ACTIVATIONS,
    LAYER_TYPES,
    QK_NORM_SCOPES,
    Attention,
    ConfigError,
    DecoderLM,
    DecoderShape,
    GatedMlp,
    ScaledEmbedding,
    build_layers,
    run_layers,
)
from levanter.recorded_fields import OMIT_WHEN_DEFAULT


# Where LlamaDecoderLayer puts its RMSNorms (LlamaConfig.norm_placement).
NORM_PLACEMENTS = ("pre", "post", "both")


@dataclass(frozen=True)
class LlamaConfig(DecoderShape):
    hidden_dim: int
    intermediate_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    use_scan: bool = False
    remat: str = "none"  # what each layer keeps for the backward pass: see transformer.REMAT_POLICIES
    gradient_checkpointing: InitVar[bool | None] = None  # deprecated: True means remat="full"
    attention: str = "auto"  # "auto" (by platform) or an implementation of haliax.nn.dot_product_attention
    # Options of other Llama-like families, each off by default. They came after configs of this
    # class were hashed into step identities, hence OMIT_WHEN_DEFAULT: left at their defaults they
    # change neither to_dict() nor any step's hash.
    head_dim_override: int | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)  # None: hidden_dim // num_heads
    rope_scaling: RopeScaling | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)  # None: plain RoPE
    qkv_bias: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # biases on the q, k, v projections
    o_bias: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # a bias on the attention output projection
    mlp_bias: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # biases on the MLP's three projections
    qk_norm: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # RMSNorm of each query/key head before RoPE
    sliding_window: int | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)  # None: full causal attention
    activation: str = field(default="silu", metadata=OMIT_WHEN_DEFAULT)  # the MLP gate's: a key of ACTIVATIONS
    scale_embeddings: bool = field(default=False, metadata=OMIT_WHEN_DEFAULT)  # embeddings times sqrt(hidden_dim)
    # Where each sublayer's RMSNorm goes: "pre" normalises its input (Llama); "post" its output,
    # before the residual add (OLMo 2); "both" does both, four norms a layer (Gemma 2).
    norm_placement: str = field(default="pre", metadata=OMIT_WHEN_DEFAULT)
    # With qk_norm: "head" normalises each head (Qwen3), "projection" all heads together (OLMo 2).
    qk_norm_scope: str = field(default="head", metadata=OMIT_WHEN_DEFAULT)
    # Each layer's attention, "full_attention" or "sliding_attention" (sliding_window positions);
    # None: every layer has sliding_window (if set). Layers of different kinds are not stacked,
    # so a mixed pattern needs use_scan=False.
    layer_types: tuple[str, ...] | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)
    # Gemma 2 and 3. Each is a field rather than a block of Gemma's own because it changes one
    # number or one elementwise map inside a piece every family shares (attention, the output):
    # soft-capping bounds the attention scores / output logits with cap * tanh(x / cap);
    attention_logit_softcap: float | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)
    final_logit_softcap: float | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)
    # scores are q.k / sqrt(attention_scale_dim) (query_pre_attn_scalar); None: sqrt(head_dim);
    attention_scale_dim: float | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)
    # sliding-window layers rotate by plain RoPE of this base (Gemma 3's 10,000 locally, while
    # full-attention layers keep rope_theta and rope_scaling); None: every layer alike.
    sliding_rope_theta: float | None = field(default=None, metadata=OMIT_WHEN_DEFAULT)

    def __post_init__(self, gradient_checkpointing: bool | None = None):
        self.check_shape(("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "max_seq_len"))
        self.check_remat(gradient_checkpointing)
        self.check_attention()
        self._check_options()

    def _check_options(self) -> None:
        if isinstance(self.rope_scaling, dict):  # as to_dict() writes it
            try:
                object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
            except (TypeError, ValueError) as e:
                raise ConfigError(f"LlamaConfig.rope_scaling {self.rope_scaling!r} is not valid: {e}") from None
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ConfigError(f"LlamaConfig.rope_scaling must be a haliax.nn.RopeScaling or None, got {self.rope_scaling!r}.")
        window = self.sliding_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            raise ConfigError(f"LlamaConfig.sliding_window must be a positive integer or None, got {window!r}.")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"LlamaConfig.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}.")
        if self.norm_placement not in NORM_PLACEMENTS:
            raise ConfigError(f"LlamaConfig.norm_placement must be one of {NORM_PLACEMENTS}, got {self.norm_placement!r}.")
        if self.qk_norm_scope not in QK_NORM_SCOPES:
            raise ConfigError(f"LlamaConfig.qk_norm_scope must be one of {QK_NORM_SCOPES}, got {self.qk_norm_scope!r}.")
        self._check_layer_types()
        self._check_capping_and_scales()

    def _check_capping_and_scales(self) -> None:
        for name in ("attention_logit_softcap", "final_logit_softcap", "attention_scale_dim", "sliding_rope_theta"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ConfigError(f"LlamaConfig.{name} must be a positive number or None, got {value!r}.")
        if self.attention_logit_softcap is not None and self.attention in NO_SOFTCAP:
            raise ConfigError(
                f"LlamaConfig.attention={self.attention!r} cannot soft-cap attention scores (attention_logit_softcap); "
                f"use 'auto' or one of {sorted(set(ATTENTION_IMPLEMENTATIONS) - NO_SOFTCAP - {'auto'})}."
            )
        if self.sliding_rope_theta is not None and all(self.window_of(i) is None for i in range(self.num_layers)):
            raise ConfigError("LlamaConfig.sliding_rope_theta is set but no layer has a sliding window (sliding_window, layer_types).")

    def _check_layer_types(self) -> None:
        if self.layer_types is None:
            return
        if isinstance(self.layer_types, (list, tuple)):  # to_dict() and JSON give a list
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        kinds = self.layer_types
        if not isinstance(kinds, tuple) or len(kinds) != self.num_layers or any(k not in LAYER_TYPES for k in kinds):
            raise ConfigError(
                f"LlamaConfig.layer_types must name one of {LAYER_TYPES} for each of the {self.num_layers} layers, got {kinds!r}."
            )
        if "sliding_attention" in kinds and self.sliding_window is None:
            raise ConfigError("LlamaConfig.layer_types has sliding_attention layers but sliding_window is None.")
        if self.use_scan and len(set(kinds)) > 1:
            raise ConfigError(
                "LlamaConfig.use_scan=True cannot stack layers of different attention kinds (layer_types); set use_scan=False."
            )

    def window_of(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: full causal attention)."""
        if self.layer_types is not None and self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window

    def build(self, vocab_size: int, *, key: jax.Array) -> "LlamaLMHeadModel":
        return LlamaLMHeadModel(self, vocab_size, key=key)

    # -- sizes ---------------------------------------------------------------------------------

    def mlp_parameters(self) -> int:
        return 3 * self.hidden_dim * self.intermediate_dim

    def bias_and_head_norm_parameters(self) -> int:
        """Per layer: the optional biases and query/key norms (none for plain Llama)."""
        count = 0
        if self.qkv_bias:
            count += self.head_dim * (self.num_heads + 2 * self.num_kv_heads)
        if self.o_bias:
            count += self.hidden_dim
        if self.mlp_bias:
            count += 2 * self.intermediate_dim + self.hidden_dim
        if self.qk_norm:
            count += 2 * self.head_dim if self.qk_norm_scope == "head" else self.head_dim * (self.num_heads + self.num_kv_heads)
        if self.norm_placement == "both":
            count += 2 * self.hidden_dim  # the output norms beside the input norms
        return count

    def num_parameters(self, vocab_size: int) -> int:
        """Every parameter, counting a tied embedding once."""
        per_layer = self.attention_parameters() + self.mlp_parameters() + 2 * self.hidden_dim + self.bias_and_head_norm_parameters()
        return self.num_layers * per_layer + self.embedding_parameters(vocab_size) + self.hidden_dim

    def flops_per_token(self, vocab_size: int, seq_len: int) -> float:
        """Training (forward + backward) FLOPs per token, as in the PaLM paper's MFU appendix:

        ``6 * N_matmul + 12 * num_layers * num_heads * head_dim * seq_len``

        ``N_matmul`` counts the weights used in matrix multiplies: every layer's projections plus
        the output projection (``vocab * hidden``, also when tied); the input embedding is a lookup
        and norms are negligible. The second term is attention's two ``T x T`` products (scores and
        weighted values), counted for the full square although causal masking could skip half.
        """
        matmul_params = self.num_layers * (self.attention_parameters() + self.mlp_parameters()) + vocab_size * self.hidden_dim
        return float(6 * matmul_params + self.attention_flops_per_token(seq_len))


class LlamaDecoderLayer(eqx.Module):
    """``x + attention(norm(x))``, then ``x + mlp(norm(x))``; with ``norm_placement="post"`` the
    norms move to the sublayers' outputs, ``x + norm(attention(x))``, and with ``"both"`` a layer
    has both. ``post_attention_norm`` is the MLP's input norm (the Hugging Face Llama name)."""

    input_norm: RMSNorm | None
    attention: Attention
    post_attention_norm: RMSNorm | None
    mlp: GatedMlp
    attention_output_norm: RMSNorm | None = None
    mlp_output_norm: RMSNorm | None = None

    def __init__(self, config: LlamaConfig, *, key: jax.Array, layer_index: int = 0):
        ka, km = jax.random.split(key)
        std = config.initializer_range
        inputs, outputs = config.norm_placement in ("pre", "both"), config.norm_placement in ("post", "both")
        self.input_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps) if inputs else None
        self.attention = Attention(
            config.hidden_dim, config.num_heads, config.num_kv_heads, init_std=std, key=ka, implementation=config.attention,
            head_dim=config.head_dim_override, qkv_bias=config.qkv_bias, o_bias=config.o_bias, qk_norm=config.qk_norm,
            norm_eps=config.norm_eps, sliding_window=config.window_of(layer_index), qk_norm_scope=config.qk_norm_scope,
            logit_softcap=config.attention_logit_softcap, scale_dim=config.attention_scale_dim,
        )
        self.post_attention_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps) if inputs else None
        self.mlp = GatedMlp(
            config.hidden_dim, config.intermediate_dim, init_std=std, key=km, activation=config.activation, bias=config.mlp_bias
        )
        self.attention_output_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps) if outputs else None
        self.mlp_output_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps) if outputs else None

    def __call__(self, x, cos, sin, segment_ids):
        x = x + _normed(self.attention_output_norm, self.attention(_normed(self.input_norm, x), cos, sin, segment_ids))
        x = x + _normed(self.mlp_output_norm, self.mlp(_normed(self.post_attention_norm, x)))
        x = constrain(x, (BATCH, SEQ, EMBED))
        return x, jnp.zeros((), jnp.float32)

    def decode(self, x, cos, sin, k_cache, v_cache, start):
        """As ``__call__`` for new positions over a KV cache (see ``Attention.decode``)."""
        attn, k_cache, v_cache = self.attention.decode(_normed(self.input_norm, x), cos, sin, k_cache, v_cache, start)
        x = x + _normed(self.attention_output_norm, attn)
        return x + _normed(self.mlp_output_norm, self.mlp(_normed(self.post_attention_norm, x))), k_cache, v_cache


def _normed(norm: RMSNorm | None, x: jax.Array) -> jax.Array:
    return x if norm is None else norm(x)


class LlamaLMHeadModel(DecoderLM):
    """Tokens -> next-token logits. Parameters are plain arrays; dtype of the embedding table is
    the compute dtype (cast the tree to bfloat16 for mixed precision)."""

    config: LlamaConfig = eqx.field(static=True)
    embed: Embedding
    layers: tuple[LlamaDecoderLayer, ...] | Stacked
    final_norm: RMSNorm
    lm_head: Linear | None

    def __init__(self, config: LlamaConfig, vocab_size: int, *, key: jax.Array):
        embedding = functools.partial(ScaledEmbedding, scale=math.sqrt(config.hidden_dim)) if config.scale_embeddings else Embedding
        self._build(config, vocab_size, keys=jax.random.split(key, 3), make_layers=functools.partial(_decoder_layers, config),
                    final_norm=RMSNorm(config.hidden_dim, eps=config.norm_eps), embedding=embedding)

    def hidden_states(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """The final-normed hidden states [B, T, embed] and the aux loss, before the output projection."""
        return _trunk(self, tokens, segment_ids)

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput:
        x, aux = self.hidden_states(tokens, segment_ids=segment_ids)
        logits = constrain(soft_cap(self._logits(x), self.config.final_logit_softcap), (BATCH, SEQ, VOCAB))
        return LmOutput(logits, aux)


def _decoder_layers(config: LlamaConfig, *, key: jax.Array) -> tuple[LlamaDecoderLayer, ...] | Stacked:
    if config.layer_types is None or config.use_scan:  # (scanned layers are all of one kind)
        return build_layers(lambda k: LlamaDecoderLayer(config, key=k), config.num_layers, use_scan=config.use_scan, key=key)
    # Each layer its own window; drawn from the same keys as build_layers would draw.
    keys = jax.random.split(key, config.num_layers)
    return tuple(LlamaDecoderLayer(config, key=k, layer_index=i) for i, k in enumerate(keys))


def _trunk(model, tokens: jax.Array, segment_ids: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Embedding, decoder layers and final norm, shared by every decoder-only model here."""
    config = model.config
    seq_len = tokens.shape[-1]
    if seq_len > config.max_seq_len:
        raise ConfigError(f"Sequence length {seq_len} exceeds the model's max_seq_len {config.max_seq_len}.")
    x = constrain(model.embed(tokens), (BATCH, SEQ, EMBED))
    positions = jnp.arange(seq_len)
    cos, sin = config.rope_tables(positions)
    layer_tables = config.layer_rope_tables(positions)
    if layer_tables is not None and isinstance(model.layers, Stacked):  # stacked layers are all of one kind
        (cos, sin), layer_tables = layer_tables[0], None
    x, aux = run_layers(model.layers, x, cos=cos, sin=sin, segment_ids=segment_ids, remat=config.remat, layer_tables=layer_tables)
    return model.final_norm(x), aux
