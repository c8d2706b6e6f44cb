"""The Llama decoder: RMSNorm, grouped-query attention with RoPE, SwiGLU MLP, tied or untied
embeddings. Weight layout matches Hugging Face ``LlamaForCausalLM`` up to transposition.

The same decoder, with options each off by default, is also Llama 3.1's (rescaled RoPE),
Mistral's (sliding-window attention), Qwen2's (q/k/v biases), Qwen3's (per-head query/key norm,
a head size of its own) and Gemma's (embeddings scaled by sqrt(hidden_dim), GELU-gated MLP).
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, field

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import Stacked
from haliax.axes import BATCH, EMBED, SEQ, VOCAB
from haliax.nn import Embedding, Linear, RMSNorm, RopeScaling
from haliax.partitioning import constrain
from levanter.models.lm import LmOutput
from levanter.models.transformer import (
    ACTIVATIONS,
    OMIT_WHEN_DEFAULT,
    Attention,
    ConfigError,
    DecoderShape,
    GatedMlp,
    ScaledEmbedding,
    build_layers,
    run_layers,
)


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
            count += 2 * self.head_dim
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
    input_norm: RMSNorm
    attention: Attention
    post_attention_norm: RMSNorm
    mlp: GatedMlp

    def __init__(self, config: LlamaConfig, *, key: jax.Array):
        ka, km = jax.random.split(key)
        std = config.initializer_range
        self.input_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.attention = Attention(
            config.hidden_dim, config.num_heads, config.num_kv_heads, init_std=std, key=ka, implementation=config.attention,
            head_dim=config.head_dim_override, qkv_bias=config.qkv_bias, o_bias=config.o_bias, qk_norm=config.qk_norm,
            norm_eps=config.norm_eps, sliding_window=config.sliding_window,
        )
        self.post_attention_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.mlp = GatedMlp(
            config.hidden_dim, config.intermediate_dim, init_std=std, key=km, activation=config.activation, bias=config.mlp_bias
        )

    def __call__(self, x, cos, sin, segment_ids):
        x = x + self.attention(self.input_norm(x), cos, sin, segment_ids)
        x = x + self.mlp(self.post_attention_norm(x))
        x = constrain(x, (BATCH, SEQ, EMBED))
        return x, jnp.zeros((), jnp.float32)

    def decode(self, x, cos, sin, k_cache, v_cache, start):
        """As ``__call__`` for new positions over a KV cache (see ``Attention.decode``)."""
        attn, k_cache, v_cache = self.attention.decode(self.input_norm(x), cos, sin, k_cache, v_cache, start)
        x = x + attn
        return x + self.mlp(self.post_attention_norm(x)), k_cache, v_cache


class LlamaLMHeadModel(eqx.Module):
    """Tokens -> next-token logits. Parameters are plain arrays; dtype of the embedding table is
    the compute dtype (cast the tree to bfloat16 for mixed precision)."""

    config: LlamaConfig = eqx.field(static=True)
    embed: Embedding
    layers: tuple[LlamaDecoderLayer, ...] | Stacked
    final_norm: RMSNorm
    lm_head: Linear | None

    def __init__(self, config: LlamaConfig, vocab_size: int, *, key: jax.Array):
        if vocab_size <= 0:
            raise ConfigError(f"vocab_size must be positive, got {vocab_size}.")
        k_embed, k_layers, k_head = jax.random.split(key, 3)
        std = config.initializer_range
        self.config = config
        if config.scale_embeddings:
            self.embed = ScaledEmbedding(vocab_size, config.hidden_dim, scale=math.sqrt(config.hidden_dim), key=k_embed, init_std=std)
        else:
            self.embed = Embedding(vocab_size, config.hidden_dim, key=k_embed, init_std=std)
        self.layers = build_layers(lambda k: LlamaDecoderLayer(config, key=k), config.num_layers, use_scan=config.use_scan, key=k_layers)
        self.final_norm = RMSNorm(config.hidden_dim, eps=config.norm_eps)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            (config.hidden_dim,), (vocab_size,), in_axes=(EMBED,), out_axes=(VOCAB,), key=k_head, init_std=std
        )

    @property
    def vocab_size(self) -> int:
        return self.embed.vocab_size

    def hidden_states(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """The final-normed hidden states [B, T, embed] and the aux loss, before the output projection."""
        return _trunk(self, tokens, segment_ids)

    def unembedding(self) -> jax.Array:
        """The output projection as an [embed, vocab] matrix (the embedding table transposed if tied)."""
        return self.embed.weight.T if self.lm_head is None else self.lm_head.weight

    def forward(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> LmOutput:
        x, aux = self.hidden_states(tokens, segment_ids=segment_ids)
        logits = self.embed.unembed(x) if self.lm_head is None else self.lm_head(x)
        logits = constrain(logits, (BATCH, SEQ, VOCAB))
        return LmOutput(logits, aux)

    def __call__(self, tokens: jax.Array, *, segment_ids: jax.Array | None = None) -> jax.Array:
        return self.forward(tokens, segment_ids=segment_ids).logits


def _trunk(model, tokens: jax.Array, segment_ids: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Embedding, decoder layers and final norm, shared by every decoder-only model here."""
    config = model.config
    seq_len = tokens.shape[-1]
    if seq_len > config.max_seq_len:
        raise ConfigError(f"Sequence length {seq_len} exceeds the model's max_seq_len {config.max_seq_len}.")
    x = constrain(model.embed(tokens), (BATCH, SEQ, EMBED))
    cos, sin = config.rope_tables(jnp.arange(seq_len))
    x, aux = run_layers(model.layers, x, cos=cos, sin=sin, segment_ids=segment_ids, remat=config.remat)
    return model.final_norm(x), aux
